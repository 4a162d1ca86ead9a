//! `nolock`: the operator's command line for the named configurations of
//! [`nolock::config`] (list, show, set, block, unblock, unlimit, inspect
//! one id's state) and for what a server offers acknowledged grants
//! (`durability`). Built with the `cli` feature:
//!
//! ```text
//! cargo install nolock --features cli
//! nolock set rate-limit api --algorithm gcra --rate 100 --per 1m --burst 100
//! nolock list
//! nolock inspect rate-limit api alice --json
//! ```
//!
//! Output is a readable table by default and JSON with `--json` (`list`
//! and `show` print an array of configurations, `set`, `block`,
//! `unblock` and `unlimit` the configuration written, `inspect` one
//! inspection, `durability` an array of reports, one per primary).
//! Durations are written `500ms`, `10s`, `1m` (or `1min`), `1h`, `1d`.
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | Redis or the connection failed |
//! | 2 | usage or bad input (clap's own usage errors too); nothing was written |
//! | 3 | not found: no configuration of that family and name |
//! | 4 | foreign data in the registry (`{nolock:config}`), or a mismatch |
//!
//! Errors go to stderr, one line each.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use nolock::config::{Change, Config, Configs, Family, LimitSpec, Per, Spec};
use nolock::rate::Algorithm;
use nolock::redis::IntoConnectionInfo;
use nolock::{BatchConnection, Client, Error};
use serde::Serialize;

const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  Redis or the connection failed
  2  usage or bad input; nothing was written
  3  not found: no configuration of that family and name
  4  foreign data in the registry ({nolock:config}), or a mismatch

Durations: 500ms, 10s, 1m (or 1min), 1h, 1d.";

/// How long connecting may take before the command gives up (exit 1).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// List, change and inspect the named configurations nolock keeps in Redis.
#[derive(Debug, Parser)]
#[command(name = "nolock", version, after_help = EXIT_CODES)]
struct Cli {
    /// Redis URL; with --cluster, seed nodes (repeat the option or separate with commas).
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379/",
        value_delimiter = ',',
        global = true
    )]
    url: Vec<String>,
    /// Treat the URL(s) as Redis Cluster seed nodes.
    #[arg(long, global = true)]
    cluster: bool,
    /// Machine output (JSON) instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every stored configuration, by family and name.
    List,
    /// The configurations named NAME (every family, or the one given).
    Show {
        /// The configuration's name.
        name: String,
        /// Only this family.
        #[arg(long, value_parser = parse_family)]
        family: Option<Family>,
    },
    /// Store new numbers (creating the configuration when missing).
    Set(SetArgs),
    /// Refuse everything for FAMILY NAME.
    Block(Target),
    /// Decide FAMILY NAME by its numbers again.
    Unblock(Target),
    /// Admit everything for FAMILY NAME (not a lock).
    Unlimit(Target),
    /// The current state of one id, read-only.
    Inspect {
        /// rate-limit, rate-limits, counter, semaphore or lock.
        #[arg(value_parser = parse_family)]
        family: Family,
        /// The configuration's name.
        name: String,
        /// The id (for rate-limits: the scope).
        id: String,
        /// For rate-limits: the member of the scope (every limit is read;
        /// without it, the limits per scope only).
        #[arg(long)]
        member: Option<String>,
    },
    /// What the server offers acknowledged grants: role, replicas, persistence.
    Durability,
}

#[derive(Debug, Args)]
struct Target {
    /// rate-limit, rate-limits, counter, semaphore or lock.
    #[arg(value_parser = parse_family)]
    family: Family,
    /// The configuration's name.
    name: String,
}

#[derive(Debug, Args)]
struct SetArgs {
    /// rate-limit, rate-limits, counter, semaphore or lock.
    #[arg(value_parser = parse_family)]
    family: Family,
    /// The configuration's name.
    name: String,
    /// rate-limit(s): gcra, token_bucket, sliding_window or fixed_window.
    #[arg(long, value_parser = parse_algorithm, default_value = "gcra")]
    algorithm: Algorithm,
    /// rate-limit: units per period.
    #[arg(long)]
    rate: Option<u64>,
    /// rate-limit: the period.
    #[arg(long, value_parser = parse_duration)]
    per: Option<Duration>,
    /// rate-limit: the burst (default: the rate).
    #[arg(long)]
    burst: Option<u64>,
    /// rate-limits: a limit kept per member, NAME=RATE/PERIOD[:BURST]; repeatable.
    #[arg(long, value_parser = parse_limit)]
    member_limit: Vec<LimitArg>,
    /// rate-limits: a limit shared by a scope, NAME=RATE/PERIOD[:BURST]; repeatable.
    #[arg(long, value_parser = parse_limit)]
    scope_limit: Vec<LimitArg>,
    /// counter: at most this many per window.
    #[arg(long)]
    limit: Option<u64>,
    /// counter: the window.
    #[arg(long, value_parser = parse_duration)]
    window: Option<Duration>,
    /// semaphore: permits per id.
    #[arg(long)]
    permits: Option<u64>,
    /// semaphore, lock: a permit's or a lease's time to live.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// Start every id afresh (rate limits and counters) instead of keeping its state.
    #[arg(long)]
    reset: bool,
}

/// One `--member-limit` or `--scope-limit`.
#[derive(Debug, Clone)]
struct LimitArg {
    name: String,
    rate: u64,
    period: Duration,
    burst: Option<u64>,
}

/// A failure, with the exit code it maps to.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Failure {
        Failure {
            code: exit_code(&err),
            message: err.to_string(),
        }
    }
}

/// The exit code of a library error (see the module docs).
fn exit_code(err: &Error) -> u8 {
    match err {
        Error::UnknownConfig { .. } => 3,
        Error::ForeignConfig { .. } | Error::ConfigMismatch { .. } => 4,
        Error::InvalidArgument { .. }
        | Error::EmptyKey
        | Error::ZeroLimit { .. }
        | Error::ZeroDuration { .. }
        | Error::DurationTooLong { .. }
        | Error::OutOfRange { .. }
        | Error::InsufficientCapacity { .. } => 2,
        _ => 1,
    }
}

fn parse_family(s: &str) -> Result<Family, String> {
    s.parse::<Family>().map_err(|e| e.to_string())
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    let wanted = s.replace('-', "_");
    Algorithm::ALL
        .into_iter()
        .find(|a| a.name() == wanted)
        .ok_or_else(|| format!("{s:?}: one of gcra, token_bucket, sliding_window, fixed_window"))
}

/// `500ms`, `10s`, `1m` or `1min`, `1h`, `1d`: a whole number and a unit.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let bad = || format!("{s:?}: a duration is a whole number and a unit (500ms, 10s, 1m, 1h, 1d)");
    let n: u64 = number.parse().map_err(|_| bad())?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?}: too long"))
}

/// `NAME=RATE/PERIOD[:BURST]`, e.g. `user=10/1s` or `tenant=1000/1m:2000`.
fn parse_limit(s: &str) -> Result<LimitArg, String> {
    let bad = |why: &str| format!("{s:?}: {why} (NAME=RATE/PERIOD[:BURST], e.g. user=10/1s:20)");
    let (name, rest) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
    let (rate, rest) = rest.split_once('/').ok_or_else(|| bad("no '/'"))?;
    let (period, burst) = match rest.split_once(':') {
        Some((period, burst)) => (period, Some(burst)),
        None => (rest, None),
    };
    Ok(LimitArg {
        name: name.to_owned(),
        rate: rate
            .parse()
            .map_err(|_| bad("the rate is not a whole number"))?,
        period: parse_duration(period)?,
        burst: burst
            .map(|b| {
                b.parse()
                    .map_err(|_| bad("the burst is not a whole number"))
            })
            .transpose()?,
    })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl SetArgs {
    /// The spec these options describe, refusing options of another family.
    fn spec(&self, matches: Option<&ArgMatches>) -> Result<Spec, Failure> {
        let family = self.family;
        let given: [(&str, bool); 9] = [
            ("--rate", self.rate.is_some()),
            ("--per", self.per.is_some()),
            ("--burst", self.burst.is_some()),
            ("--member-limit", !self.member_limit.is_empty()),
            ("--scope-limit", !self.scope_limit.is_empty()),
            ("--limit", self.limit.is_some()),
            ("--window", self.window.is_some()),
            ("--permits", self.permits.is_some()),
            ("--ttl", self.ttl.is_some()),
        ];
        let allowed: &[&str] = match family {
            Family::RateLimit => &["--rate", "--per", "--burst"],
            Family::RateLimits => &["--member-limit", "--scope-limit"],
            Family::Counter => &["--limit", "--window"],
            Family::Semaphore => &["--permits", "--ttl"],
            Family::Lock => &["--ttl"],
        };
        let algorithm_given = matches
            .and_then(|m| m.value_source("algorithm"))
            .is_some_and(|source| source == ValueSource::CommandLine);
        if algorithm_given && !matches!(family, Family::RateLimit | Family::RateLimits) {
            return Err(Failure::usage(format!(
                "--algorithm does not apply to a {family} (it takes {})",
                allowed.join(", ")
            )));
        }
        if let Some((option, _)) = given
            .iter()
            .find(|(option, set)| *set && !allowed.contains(option))
        {
            return Err(Failure::usage(format!(
                "{option} does not apply to a {family} (it takes {})",
                allowed.join(", ")
            )));
        }
        let need = |option: &str| Failure::usage(format!("a {family} needs {option}"));
        let spec = match family {
            Family::RateLimit => {
                let rate = self.rate.ok_or_else(|| need("--rate"))?;
                Spec::RateLimit {
                    algorithm: self.algorithm,
                    rate,
                    period_ms: ms(self.per.ok_or_else(|| need("--per"))?),
                    burst: self.burst.unwrap_or(rate),
                }
            }
            Family::RateLimits => Spec::RateLimits {
                algorithm: self.algorithm,
                limits: self.limits_in_order(matches)?,
            },
            Family::Counter => Spec::Counter {
                limit: self.limit.ok_or_else(|| need("--limit"))?,
                window_ms: ms(self.window.ok_or_else(|| need("--window"))?),
            },
            Family::Semaphore => Spec::Semaphore {
                permits: self.permits.ok_or_else(|| need("--permits"))?,
                ttl_ms: ms(self.ttl.ok_or_else(|| need("--ttl"))?),
            },
            Family::Lock => Spec::Lock {
                ttl_ms: ms(self.ttl.ok_or_else(|| need("--ttl"))?),
            },
        };
        // Checked as the handle checks it, before connecting.
        spec.validate()?;
        Ok(spec)
    }

    /// The limits in the order given on the command line: handles compare
    /// the stored limits with their own in order.
    fn limits_in_order(&self, matches: Option<&ArgMatches>) -> Result<Vec<LimitSpec>, Failure> {
        let indices = |id: &str, n: usize| -> Vec<usize> {
            matches
                .and_then(|m| m.indices_of(id))
                .map(|i| i.collect())
                .unwrap_or_else(|| (0..n).collect())
        };
        let mut all: Vec<(usize, Per, &LimitArg)> = Vec::new();
        for (per, id, limits) in [
            (Per::Member, "member_limit", &self.member_limit),
            (Per::Scope, "scope_limit", &self.scope_limit),
        ] {
            let at = indices(id, limits.len());
            all.extend(limits.iter().enumerate().map(|(i, l)| {
                // Without indices, members first, then scopes.
                let place = at.get(i).copied().unwrap_or(i);
                (place, per, l)
            }));
        }
        if all.is_empty() {
            return Err(Failure::usage(
                "rate-limits need --member-limit or --scope-limit (NAME=RATE/PERIOD[:BURST])",
            ));
        }
        all.sort_by_key(|(place, per, _)| (*place, *per == Per::Scope));
        Ok(all
            .into_iter()
            .map(|(_, per, l)| LimitSpec {
                name: l.name.clone(),
                per,
                rate: l.rate,
                period_ms: ms(l.period),
                burst: l.burst.unwrap_or(l.rate),
            })
            .collect())
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("nolock: cannot start the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let set_matches = matches.subcommand_matches("set");
    match runtime.block_on(run(cli, set_matches)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("nolock: {}", one_line(&failure.message));
            ExitCode::from(failure.code)
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn connect(cli: &Cli) -> Result<Client, Failure> {
    for url in &cli.url {
        if let Err(err) = url.as_str().into_connection_info() {
            return Err(Failure::usage(format!("--url {url:?}: {err}")));
        }
    }
    let connecting = async {
        if cli.cluster {
            Client::connect_cluster(cli.url.iter().map(String::as_str)).await
        } else {
            match cli.url.as_slice() {
                // One command, one connection: a plain multiplexed
                // connection fails at once where a reconnecting one retries.
                [url] => {
                    let client = nolock::redis::Client::open(url.as_str()).map_err(Error::Redis)?;
                    let conn = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(Error::Redis)?;
                    Client::from_connection(conn).await
                }
                _ => Err(Error::InvalidArgument {
                    what: "url",
                    reason: "several URLs are seed nodes of a cluster: add --cluster".into(),
                }),
            }
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(client) => Ok(client?),
        Err(_) => Err(Failure {
            code: 1,
            message: format!(
                "could not connect to {} within {CONNECT_TIMEOUT:?}",
                cli.url.join(",")
            ),
        }),
    }
}

/// Runs the command; its standard output on success.
async fn run(cli: Cli, set_matches: Option<&ArgMatches>) -> Result<String, Failure> {
    // Input is checked before connecting: bad input writes nothing.
    let set = match &cli.command {
        Command::Set(args) => {
            let change = if args.reset {
                Change::Reset
            } else {
                Change::Keep
            };
            if args.reset && !args.family.can_reset() {
                return Err(Failure::usage(format!(
                    "a {} cannot be reset: its holders would keep running",
                    args.family
                )));
            }
            Some((args.spec(set_matches)?, change))
        }
        _ => None,
    };
    let client = connect(&cli).await?;
    let configs = client.configs();
    match &cli.command {
        Command::List => configs_out(&cli, &configs.list().await?),
        Command::Show { name, family } => {
            let found = show(&configs, name, *family).await?;
            if found.is_empty() {
                return Err(Error::UnknownConfig {
                    family: family.map_or("configuration", Family::as_str),
                    name: name.clone(),
                }
                .into());
            }
            configs_out(&cli, &found)
        }
        Command::Set(args) => {
            let Some((spec, change)) = set else {
                return Err(Failure::usage("set: no spec"));
            };
            let config = configs.set(&args.name, spec, change).await?;
            config_out(&cli, &config)
        }
        Command::Block(t) => config_out(&cli, &configs.block(t.family, &t.name).await?),
        Command::Unblock(t) => config_out(&cli, &configs.unblock(t.family, &t.name).await?),
        Command::Unlimit(t) => config_out(&cli, &configs.unlimit(t.family, &t.name).await?),
        Command::Inspect {
            family,
            name,
            id,
            member,
        } => {
            let seen = match member {
                Some(member) if *family == Family::RateLimits => {
                    configs.inspect_member(name, id, member).await?
                }
                Some(_) => {
                    return Err(Failure::usage(format!(
                        "--member applies to rate-limits, not to a {family}"
                    )))
                }
                None => configs.inspect(*family, name, id).await?,
            };
            if cli.json {
                json(&seen)
            } else {
                Ok(seen.to_string())
            }
        }
        Command::Durability => durability(&cli, &client).await,
    }
}

async fn show(configs: &Configs, name: &str, family: Option<Family>) -> Result<Vec<Config>, Error> {
    match family {
        Some(family) => Ok(configs.get(family, name).await?.into_iter().collect()),
        None => {
            let all = configs.list().await?;
            if all.iter().all(|c| c.name != name) {
                // A bad name is a usage error, not "not found": `get`
                // checks it (and finds nothing otherwise).
                configs.get(Family::Counter, name).await?;
            }
            Ok(all.into_iter().filter(|c| c.name == name).collect())
        }
    }
}

fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, Failure> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| Failure {
            code: 1,
            message: format!("cannot encode the output: {e}"),
        })
}

fn config_out(cli: &Cli, config: &Config) -> Result<String, Failure> {
    if cli.json {
        json(config)
    } else {
        Ok(table(std::slice::from_ref(config)))
    }
}

fn configs_out(cli: &Cli, configs: &[Config]) -> Result<String, Failure> {
    if cli.json {
        json(configs)
    } else if configs.is_empty() {
        Ok("no configurations stored\n".to_owned())
    } else {
        Ok(table(configs))
    }
}

/// A table: FAMILY NAME MODE GEN CHANGED SPEC, columns padded.
fn table(configs: &[Config]) -> String {
    let mut rows = vec![[
        "FAMILY".to_owned(),
        "NAME".to_owned(),
        "MODE".to_owned(),
        "GEN".to_owned(),
        "CHANGED".to_owned(),
        "SPEC".to_owned(),
    ]];
    rows.extend(configs.iter().map(|c| {
        [
            c.family.to_string(),
            c.name.clone(),
            c.mode.to_string(),
            c.generation.to_string(),
            utc(c.changed_at_ms),
            c.spec.to_string(),
        ]
    }));
    render(&rows)
}

fn render<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm), for days since 1970.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// One server's report, as printed.
#[derive(Debug, Serialize)]
struct DurabilityOut {
    node: String,
    role: String,
    connected_replicas: u64,
    appendonly: bool,
    appendfsync: Option<String>,
    no_appendfsync_on_rewrite: Option<bool>,
    save: Option<String>,
    min_replicas_to_write: Option<u64>,
    /// `config` (CONFIG GET answered) or `info` (it was refused).
    source: &'static str,
    /// What a restart does to fence counters.
    restart: String,
    fences_can_go_back: bool,
    reasons: Vec<String>,
}

async fn durability(cli: &Cli, client: &Client) -> Result<String, Failure> {
    let mut conn = client.connection();
    let reports = match conn.as_cluster() {
        Some(cluster) => nolock::fence::cluster_durability(cluster).await?,
        None => {
            let node = cli.url.first().cloned().unwrap_or_default();
            vec![(node, nolock::fence::durability(&mut conn).await?)]
        }
    };
    let out: Vec<DurabilityOut> = reports
        .into_iter()
        .map(|(node, d)| DurabilityOut {
            node,
            source: match d.source {
                nolock::fence::ConfigSource::Config => "config",
                _ => "info",
            },
            restart: format!("{:?}", d.restart),
            fences_can_go_back: d.fences_can_go_back(),
            reasons: d.reasons(),
            role: d.role,
            connected_replicas: d.connected_replicas,
            appendonly: d.appendonly,
            appendfsync: d.appendfsync,
            no_appendfsync_on_rewrite: d.no_appendfsync_on_rewrite,
            save: d.save,
            min_replicas_to_write: d.min_replicas_to_write,
        })
        .collect();
    if cli.json {
        return json(&out);
    }
    let unknown = || "?".to_owned();
    let mut rows = vec![[
        "NODE".to_owned(),
        "ROLE".to_owned(),
        "REPLICAS".to_owned(),
        "APPENDONLY".to_owned(),
        "APPENDFSYNC".to_owned(),
        "RESTART".to_owned(),
    ]];
    let mut reasons = BTreeMap::new();
    for r in &out {
        rows.push([
            r.node.clone(),
            r.role.clone(),
            r.connected_replicas.to_string(),
            if r.appendonly { "yes" } else { "no" }.to_owned(),
            r.appendfsync.clone().unwrap_or_else(unknown),
            r.restart.clone(),
        ]);
        reasons.insert(r.node.clone(), r.reasons.clone());
    }
    let mut text = render(&rows);
    for (node, why) in reasons {
        for reason in why {
            text.push_str(&format!("{node}: {reason}\n"));
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_whole_number_and_a_unit() {
        let ok = [
            ("500ms", 500),
            ("10s", 10_000),
            ("1m", 60_000),
            ("1min", 60_000),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            ("0s", 0),
        ];
        for (text, ms) in ok {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for bad in [
            "",
            "10",
            "s",
            "1.5s",
            "-1s",
            "10 s",
            "10S",
            "1w",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_duration("18446744073709551615d").is_err());
    }

    #[test]
    fn limits_parse_with_an_optional_burst() {
        let l = parse_limit("user=10/1s:20").unwrap();
        assert_eq!((l.name.as_str(), l.rate, l.burst), ("user", 10, Some(20)));
        assert_eq!(l.period, Duration::from_secs(1));
        assert_eq!(parse_limit("tenant=1000/1m").unwrap().burst, None);
        for bad in ["user", "user=10", "user=x/1s", "user=10/1s:x", "user=10/1x"] {
            assert!(parse_limit(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn times_print_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_459_999_999), "2026-12-05T08:39:59Z");
    }

    #[test]
    fn errors_map_to_exit_codes() {
        let unknown = Error::UnknownConfig {
            family: "counter",
            name: "x".into(),
        };
        assert_eq!(exit_code(&unknown), 3);
        let foreign = Error::ForeignConfig {
            key: "k".into(),
            field: "f".into(),
            reason: "r".into(),
        };
        assert_eq!(exit_code(&foreign), 4);
        assert_eq!(exit_code(&Error::ZeroLimit { what: "limit" }), 2);
        assert_eq!(exit_code(&Error::Contended { what: "x" }), 1);
        Cli::command().debug_assert();
    }
}
