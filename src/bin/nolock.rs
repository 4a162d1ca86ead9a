//! `nolock`: the operator's command line for the named configurations of
//! [`nolock::config`] (list, show, set, block, unblock, unlimit, inspect
//! one id's state) and for what a server offers acknowledged grants
//! (`durability`). Built with the `cli` feature:
//!
//! ```text
//! cargo install nolock --features cli,tz   # tz: IANA zones of calendar quotas
//! nolock set rate-limit api --algorithm gcra --rate 100 --per 1m --burst 100
//! nolock set rate-limit plan --rate 10000 --calendar month --zone Europe/Berlin
//! nolock list
//! nolock inspect rate-limit api alice --json
//! ```
//!
//! A calendar quota (`--calendar UNIT`, algorithm `calendar`) admits
//! `--rate` per calendar period: `--every N` units of `second`, `minute`,
//! `hour`, `day`, `week`, `month` or `year`, on the wall clock of `--zone`
//! (UTC, an offset such as `+05:30`, an IANA name with the `tz` feature,
//! or a POSIX TZ rule; a binary built without `tz` cannot read a stored
//! IANA zone, and answers exit 4), from `--day-start HH:MM` and, for weeks,
//! `--week-start DAY`. A limit of `rate-limits` takes a calendar period as
//! `NAME=RATE/[N]UNIT` (`user=10/second`, `tenant=100000/month`); the zone
//! options apply to every such limit. `show` and `list` print the period
//! (`calendar 10000 per 1 month in Europe/Berlin from 00:00`).
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
//! | 4 | foreign data in the registry (`{nolock:config}`), a mismatch, or (`inspect`) a state another limit wrote |
//!
//! Errors go to stderr, one line each.

use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use nolock::config::{Change, Config, Configs, Family, Spec};
use nolock::rate::{Algorithm, Unit, Weekday, Zone};
use nolock::redis::IntoConnectionInfo;
use nolock::{Client, Error};

// Beside this file (a `mod` of a binary's root would be looked for in
// src/bin/, where cargo takes every file for a binary of its own).
#[path = "nolock/output.rs"]
mod output;
#[path = "nolock/parse.rs"]
mod parse;

use output::{config_out, configs_out, durability, json};
use parse::{
    parse_algorithm, parse_day_start, parse_duration, parse_family, parse_limit, parse_unit,
    parse_weekday, parse_zone, DayStart, LimitArg,
};

const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  Redis or the connection failed
  2  usage or bad input; nothing was written
  3  not found: no configuration of that family and name
  4  foreign data in the registry ({nolock:config}), a mismatch, or
     (inspect) a state another limit wrote

Durations: 500ms, 10s, 1m (or 1min), 1h, 1d.
Calendar periods: second, minute, hour, day, week, month, year.";

const SET_EXAMPLES: &str = "\
Examples:
  nolock set rate-limit api --algorithm gcra --rate 100 --per 1m --burst 100
  nolock set rate-limits api --member-limit user=10/1s --scope-limit tenant=1000/1m:2000
  nolock set rate-limit plan --algorithm calendar --rate 10000 --calendar month --zone +01:00
  nolock set rate-limit daily --rate 500 --calendar day --day-start 06:00
  nolock set rate-limits quota --scope-limit burst=10/second --scope-limit month=100000/month
  nolock set counter api --limit 100 --window 60s
  nolock set semaphore jobs --permits 3 --ttl 30s
  nolock set lock payout --ttl 10s
  nolock set counter api --limit 200 --window 60s --reset   # every id starts afresh";

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
        // A URL may carry a password: --help does not show the variable's value.
        hide_env_values = true,
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
    #[command(after_help = SET_EXAMPLES)]
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
    /// rate-limit(s): gcra, token_bucket, sliding_window, fixed_window or
    /// calendar (default: calendar with a calendar period, else the stored
    /// one, else gcra).
    #[arg(long, value_parser = parse_algorithm, default_value = "gcra")]
    algorithm: Algorithm,
    /// rate-limit: a calendar period of second, minute, hour, day, week,
    /// month or year: --rate per period, restarting at its end (algorithm
    /// calendar).
    #[arg(long, value_parser = parse_unit, value_name = "UNIT")]
    calendar: Option<Unit>,
    /// rate-limit: how many units one calendar period lasts (default 1;
    /// --calendar month --every 3 is a quarter).
    #[arg(long, value_name = "N")]
    every: Option<u32>,
    /// rate-limit(s): the calendar's time zone: UTC (default), an offset
    /// (+05:30), an IANA name (Europe/Berlin) or a POSIX TZ rule.
    #[arg(long, value_parser = parse_zone)]
    zone: Option<Zone>,
    /// rate-limit(s): when a calendar day starts on the zone's clock
    /// (default 00:00).
    #[arg(long, value_parser = parse_day_start, value_name = "HH:MM")]
    day_start: Option<DayStart>,
    /// rate-limit(s): the first day of a calendar week (default monday).
    #[arg(long, value_parser = parse_weekday, value_name = "DAY")]
    week_start: Option<Weekday>,
    /// rate-limit: units per period.
    #[arg(long)]
    rate: Option<u64>,
    /// rate-limit: the period.
    #[arg(long, value_parser = parse_duration)]
    per: Option<Duration>,
    /// rate-limit: the burst (default: the rate).
    #[arg(long)]
    burst: Option<u64>,
    /// rate-limits: a limit kept per member, NAME=RATE/PERIOD[:BURST] or,
    /// calendar, NAME=RATE/[N]UNIT; repeatable.
    #[arg(long, value_parser = parse_limit)]
    member_limit: Vec<LimitArg>,
    /// rate-limits: a limit shared by a scope, NAME=RATE/PERIOD[:BURST] or,
    /// calendar, NAME=RATE/[N]UNIT; repeatable.
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
        Error::ForeignConfig { .. }
        | Error::ConfigMismatch { .. }
        | Error::StateMismatch { .. } => 4,
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
    // URLs may carry passwords: errors name a URL by its place, never its text.
    for (i, url) in cli.url.iter().enumerate() {
        if let Err(err) = url.as_str().into_connection_info() {
            return Err(Failure::usage(format!("--url number {}: {err}", i + 1)));
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
        Ok(Err(Error::Redis(err) | Error::Indeterminate(err))) => Err(Failure {
            code: 1,
            message: format!("cannot connect (or load nolock's scripts): {err}"),
        }),
        Ok(client) => Ok(client?),
        Err(_) => Err(Failure {
            code: 1,
            message: format!("could not connect within {CONNECT_TIMEOUT:?}"),
        }),
    }
}

/// A command whose input was checked, ready to run: bad input is refused
/// before connecting, so it writes nothing.
enum Plan<'a> {
    List,
    Show {
        name: &'a str,
        family: Option<Family>,
    },
    Set {
        name: &'a str,
        spec: Spec,
        change: Change,
        /// `--algorithm` was given: without it, a stored rate limit keeps
        /// its algorithm (changing it would start every id afresh).
        algorithm_given: bool,
    },
    Block(&'a Target),
    Unblock(&'a Target),
    Unlimit(&'a Target),
    Inspect {
        family: Family,
        name: &'a str,
        id: &'a str,
        member: Option<&'a str>,
    },
    Durability,
}

/// Checks the input of `command` (`set_matches`: the `set` subcommand's
/// matches, for the order of its limits).
/// A rate limit set without `--algorithm` keeps the stored one, unless it
/// has a calendar period, which only the calendar algorithm takes.
fn keep_algorithm(spec: &mut Spec, stored: Option<&Spec>) {
    let calendar = match spec {
        Spec::RateLimit { calendar, .. } => calendar.is_some(),
        Spec::RateLimits { limits, .. } => limits.iter().any(|l| l.calendar.is_some()),
        _ => false,
    };
    if calendar {
        return;
    }
    let stored = match stored {
        Some(Spec::RateLimit { algorithm, .. } | Spec::RateLimits { algorithm, .. }) => *algorithm,
        _ => return,
    };
    match spec {
        Spec::RateLimit { algorithm, .. } | Spec::RateLimits { algorithm, .. } => {
            *algorithm = stored
        }
        _ => {}
    }
}

fn plan<'a>(command: &'a Command, set_matches: Option<&ArgMatches>) -> Result<Plan<'a>, Failure> {
    Ok(match command {
        Command::List => Plan::List,
        Command::Show { name, family } => Plan::Show {
            name,
            family: *family,
        },
        Command::Set(args) => {
            if args.reset && !args.family.can_reset() {
                return Err(Failure::usage(format!(
                    "a {} cannot be reset: its holders would keep running",
                    args.family
                )));
            }
            Plan::Set {
                name: &args.name,
                spec: args.spec(set_matches)?,
                algorithm_given: set_matches
                    .and_then(|m| m.value_source("algorithm"))
                    .is_some_and(|source| source == clap::parser::ValueSource::CommandLine),
                change: if args.reset {
                    Change::Reset
                } else {
                    Change::Keep
                },
            }
        }
        Command::Block(t) => Plan::Block(t),
        Command::Unblock(t) => Plan::Unblock(t),
        Command::Unlimit(t) => Plan::Unlimit(t),
        Command::Inspect {
            family,
            name,
            id,
            member,
        } => {
            if member.is_some() && *family != Family::RateLimits {
                return Err(Failure::usage(format!(
                    "--member applies to rate-limits, not to a {family}"
                )));
            }
            Plan::Inspect {
                family: *family,
                name,
                id,
                member: member.as_deref(),
            }
        }
        Command::Durability => Plan::Durability,
    })
}

/// Runs the command; its standard output on success.
async fn run(cli: Cli, set_matches: Option<&ArgMatches>) -> Result<String, Failure> {
    let plan = plan(&cli.command, set_matches)?;
    let client = connect(&cli).await?;
    let configs = client.configs();
    match plan {
        Plan::List => configs_out(&cli, &configs.list().await?),
        Plan::Show { name, family } => {
            let found = show(&configs, name, family).await?;
            if found.is_empty() {
                return Err(Error::UnknownConfig {
                    family: family.map_or("configuration", Family::as_str),
                    name: name.to_owned(),
                }
                .into());
            }
            configs_out(&cli, &found)
        }
        Plan::Set {
            name,
            mut spec,
            change,
            algorithm_given,
        } => {
            if !algorithm_given {
                let stored = configs.get(spec.family(), name).await?;
                keep_algorithm(&mut spec, stored.as_ref().map(|c| &c.spec));
            }
            config_out(&cli, &configs.set(name, spec, change).await?)
        }
        Plan::Block(t) => config_out(&cli, &configs.block(t.family, &t.name).await?),
        Plan::Unblock(t) => config_out(&cli, &configs.unblock(t.family, &t.name).await?),
        Plan::Unlimit(t) => config_out(&cli, &configs.unlimit(t.family, &t.name).await?),
        Plan::Inspect {
            family,
            name,
            id,
            member,
        } => {
            let seen = match member {
                Some(member) => configs.inspect_member(name, id, member).await?,
                None => configs.inspect(family, name, id).await?,
            };
            if cli.json {
                json(&seen)
            } else {
                Ok(seen.to_string())
            }
        }
        Plan::Durability => durability(&cli, &client).await,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_examples_parse_into_valid_specs() {
        let examples: Vec<&str> = SET_EXAMPLES
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nolock "))
            .collect();
        assert_eq!(examples.len(), 9);
        for example in examples {
            let words = example.split('#').next().unwrap_or_default();
            let cli =
                Cli::try_parse_from(std::iter::once("nolock").chain(words.split_whitespace()))
                    .unwrap_or_else(|e| panic!("{example}: {e}"));
            let Command::Set(args) = &cli.command else {
                panic!("{example}: not a set");
            };
            let spec = args
                .spec(None)
                .unwrap_or_else(|e| panic!("{example}: {}", e.message));
            assert_eq!(spec.family(), args.family, "{example}");
        }
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
        let tagged = Error::StateMismatch {
            detail: "k holds state written by g1x1, not f1x1".to_owned(),
        };
        assert_eq!(exit_code(&tagged), 4);
        assert_eq!(exit_code(&Error::ZeroLimit { what: "limit" }), 2);
        assert_eq!(exit_code(&Error::Contended { what: "x" }), 1);
        Cli::command().debug_assert();
    }
}
