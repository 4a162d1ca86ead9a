//! nolock beside the Rust peers on crates.io, on one throwaway redis-server.
//!
//! ```text
//! cd benches/peers && cargo run --release            # 6400 calls per row, 5 rounds
//! cd benches/peers && cargo run --release -- 20000 7 # more calls, more rounds
//! cd benches/peers && cargo run --release -- --svg ../../docs/charts # and charts
//! ```
//!
//! Prints, as Markdown tables:
//!
//! 1. the same 12 quick calls (GCRA 10/s, burst 10, fresh key) through each
//!    limiter: what it decides and what it reports;
//! 2. the GCRA check on one hot key, 64 tasks sharing one multiplexed
//!    connection per library: throughput, client p50/p99, and the server time
//!    per call from `INFO commandstats` (`CONFIG RESETSTAT` before each row),
//!    in an "admit" regime (a quota no call reaches) and a "deny" one (10/s,
//!    burst 10, exhausted), nolock's `rate::Reservoir` beside its one-call
//!    limiter; with `--svg DIR`, drawn as two charts (`charts.rs`);
//! 3. the issue-10 cost targets: `limits::try_increment` against the design
//!    card's GET/compare/INCR/EXPIRE script, and `Lock::acquire` + `Grant::release`
//!    against `SET NX PX` + `INCR` and a token-checked release (one minimal
//!    script each, in `subjects.rs`) and against rslock's lock + unlock.
//!
//! 4. a contended lock: 64 waiters take it in turn (hold 1 ms), with
//!    `Lock::with_wait` and with rslock's retrying `acquire`.
//!
//! Rows are measured in turn and the whole set repeated, so that a load change
//! on a shared machine hits every row alike; server time is given as minimum
//! and median over the rounds, the other figures as medians. Ratios compare
//! medians from this one run on this one server.

#[path = "../../../tests/support/server.rs"]
mod server;

mod charts;
mod handoff;
mod measure;
mod subjects;

use std::time::Duration;

use measure::{measure, summarize, Call, Decision, Error, Keys, Sample, Summary};
use subjects::{Conns, Regime, GCRA};

const TASKS: usize = 64;

/// One line of a table, measured once per round.
struct Row {
    label: String,
    op: Call,
    key: String,
    /// A new key each round, so that an "admit" quota is never used up.
    fresh_key: bool,
    keys: Keys,
    /// The commands `op` sends (see [`measure::SCRIPT`]).
    sent: &'static [&'static str],
    samples: Vec<Sample>,
}

impl Row {
    fn new(label: impl Into<String>, op: Call, key: impl Into<String>, fresh_key: bool) -> Row {
        Row {
            label: label.into(),
            op,
            key: key.into(),
            fresh_key,
            keys: Keys::Shared,
            sent: measure::SCRIPT,
            samples: Vec::new(),
        }
    }

    fn key(&self, round: usize) -> String {
        if self.fresh_key {
            format!("{}:{round}", self.key)
        } else {
            self.key.clone()
        }
    }

    fn summary(&self) -> Summary {
        summarize(&self.samples)
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let usage =
        || format!("usage: cargo run --release -- [calls >= {TASKS}] [rounds >= 1] [--svg DIR]");
    let mut svg = None;
    let mut numbers = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--svg" {
            svg = Some(std::path::PathBuf::from(args.next().ok_or_else(usage)?));
        } else {
            numbers.push(arg.parse::<usize>().map_err(|_| usage())?);
        }
    }
    let calls = numbers.first().copied().unwrap_or(6400);
    let rounds = numbers.get(1).copied().unwrap_or(5);
    if calls < TASKS || rounds == 0 || numbers.len() > 2 {
        return Err(usage().into());
    }

    let server = server::RedisServer::start();
    let conns = Conns::open(&server.url()).await?;
    let admin = conns.nolock.clone();
    nolock::Scripts::load(&mut admin.clone()).await?;
    print_setting(&admin, calls, rounds).await?;

    sequence(&conns).await?;

    let mut gcra = Vec::new();
    for regime in [Regime::Admit, Regime::Deny] {
        for peer in &GCRA {
            let (label, fresh) = match regime {
                Regime::Admit => ("admit", true),
                Regime::Deny => ("deny", false),
            };
            let (op, key) = (
                (peer.check)(&conns, regime)?,
                format!("peers:{}:{label}", peer.name),
            );
            gcra.push(Row::new(peer.name, op, key, fresh));
        }
    }
    let mut targets: Vec<Row> = [
        (
            "limits::try_increment, admit",
            subjects::nolock_counter(&conns, true),
        ),
        (
            "design card script, admit",
            subjects::card_counter(&conns, true),
        ),
        (
            "limits::try_increment, deny",
            subjects::nolock_counter(&conns, false),
        ),
        (
            "design card script, deny",
            subjects::card_counter(&conns, false),
        ),
        (
            "Lock::acquire + Grant::release",
            subjects::nolock_fence(&conns),
        ),
        (
            "SET NX PX + INCR script, release script",
            subjects::reference_fence(&conns),
        ),
        ("rslock lock + unlock", subjects::rslock_pair(&conns)),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (label, op))| Row::new(label, op, format!("peers:target:{i}"), false))
    .collect();
    for row in &mut targets[4..] {
        row.keys = Keys::PerTask;
    }
    // rslock locks with a plain SET NX PX, and unlocks with a script.
    targets[6].sent = &["set", "evalsha", "eval"];

    // Warm up (connections, script caches) and use up the "deny" quotas.
    for row in gcra.iter().chain(&targets) {
        for _ in 0..12 {
            (row.op)(row.key(0)).await?;
        }
        if row.keys == Keys::PerTask {
            (row.op)(format!("{}:0", row.key)).await?;
        }
    }
    for round in 1..=rounds {
        for row in gcra.iter_mut().chain(&mut targets) {
            let key = row.key(round);
            let sample = measure(&admin, &row.op, row.sent, &key, row.keys, calls, TASKS).await?;
            row.samples.push(sample);
        }
    }

    print_gcra(&gcra);
    if let Some(dir) = &svg {
        draw_gcra(dir, &gcra, calls, rounds)?;
    }
    print_targets(&targets);
    contended(&conns, rounds.min(3)).await?;
    print_load("after");
    Ok(())
}

/// Redis version, machine, load, and the run's parameters.
async fn print_setting(
    admin: &redis::aio::MultiplexedConnection,
    calls: usize,
    rounds: usize,
) -> Result<(), Error> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut admin.clone())
        .await?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            Some(
                l.strip_prefix("model name")?
                    .trim_start_matches([' ', '\t', ':'])
                    .to_owned(),
            )
        })
        .unwrap_or_default();
    let (date, os) = (shell("date", &["-u"]), shell("uname", &["-sr"]));
    println!("{date}; {os}; {cpu}, {cores} cores");
    println!(
        "redis-server {version} on loopback; {TASKS} tasks, {calls} calls per row, {rounds} rounds"
    );
    print_load("before");
    Ok(())
}

/// The first line a command prints, or "" when it cannot run.
fn shell(command: &str, args: &[&str]) -> String {
    std::process::Command::new(command)
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default()
}

fn print_load(when: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("load average {when}: {}", load.join(" "));
}

/// Table 1: 12 quick calls on a fresh key, 10/s burst 10.
async fn sequence(conns: &Conns) -> Result<(), Error> {
    let mut columns = Vec::new();
    for peer in &GCRA {
        let check = (peer.check)(conns, Regime::Deny)?;
        let key = format!("peers:{}:sequence", peer.name);
        let mut column = Vec::new();
        for _ in 0..12 {
            column.push(check(key.clone()).await?);
        }
        columns.push(column);
    }
    println!("\n### The same 12 quick calls, GCRA 10/s burst 10, fresh key\n");
    println!("Each cell: decision, remaining, retry_after (— where the library reports none).\n");
    let names: Vec<&str> = GCRA.iter().map(|p| p.name).collect();
    println!("| call | {} |", names.join(" | "));
    println!("|---|{}", "---|".repeat(names.len()));
    for i in 0..12 {
        let cells: Vec<String> = columns.iter().map(|c| cell(&c[i])).collect();
        println!("| {} | {} |", i + 1, cells.join(" | "));
    }
    println!();
    for peer in &GCRA {
        println!("- {}: {}", peer.name, peer.how);
    }
    Ok(())
}

fn cell(d: &Decision) -> String {
    let remaining = d.remaining.map_or("—".to_owned(), |r| r.to_string());
    let retry = d.retry_after.map_or("—".to_owned(), |r| format!("{r:?}"));
    let verdict = if d.allowed { "admit" } else { "deny" };
    format!("{verdict}, {remaining}, {retry}")
}

/// `a / b` by minimum and by median server time, as "min / median".
fn ratio(a: &Summary, b: &Summary) -> String {
    format!(
        "{:.2} / {:.2}",
        a.server_us_min / b.server_us_min,
        a.server_us_median / b.server_us_median
    )
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

/// Table 2: the GCRA check, both regimes, ratios against nolock and tower.
fn print_gcra(rows: &[Row]) {
    println!("\n### GCRA check, one hot key, {TASKS} tasks on one multiplexed connection\n");
    println!(
        "| library | regime | ops/s | p50 µs | p99 µs | server µs/call min | median | round trips/call \
         | ops/s vs nolock | server µs nolock / this (min / median) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (regime, rows) in ["admit", "deny"].iter().zip(rows.chunks(GCRA.len())) {
        let nolock = rows[0].summary();
        for row in rows {
            let s = row.summary();
            println!(
                "| {} | {regime} | {:.0} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                row.label,
                s.ops_per_s,
                us(s.p50),
                us(s.p99),
                s.server_us_min,
                s.server_us_median,
                s.commands,
                s.ops_per_s / nolock.ops_per_s,
                ratio(&nolock, &s),
            );
        }
    }
}

/// The GCRA table as two charts in `dir`: decisions per second and server
/// time per decision, by regime and library.
fn draw_gcra(
    dir: &std::path::Path,
    rows: &[Row],
    calls: usize,
    rounds: usize,
) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let libraries: Vec<String> = GCRA.iter().map(|p| p.name.to_owned()).collect();
    let bars = |value: fn(&Summary) -> f64| -> Vec<charts::Bar> {
        ["admit", "deny"]
            .iter()
            .zip(rows.chunks(GCRA.len()))
            .flat_map(|(regime, rows)| {
                rows.iter().map(move |row| charts::Bar {
                    library: row.label.clone(),
                    regime,
                    value: value(&row.summary()),
                })
            })
            .collect()
    };
    let stamp = format!(
        "{}, {TASKS} tasks on one hot key, {calls} calls x {rounds} rounds",
        shell("date", &["-u", "+%Y-%m-%d"])
    );
    for (file, title, y_label, value) in [
        (
            "peers_throughput.svg",
            "GCRA decisions per second, one hot key (log scale)",
            "decisions per second (median of rounds)",
            (|s: &Summary| s.ops_per_s) as fn(&Summary) -> f64,
        ),
        (
            "peers_server_us.svg",
            "Redis time per GCRA decision (lower is better; log scale)",
            "server µs per decision (median of rounds)",
            |s: &Summary| s.server_us_median,
        ),
    ] {
        let path = dir.join(file);
        let title = format!("{title} - {stamp}");
        charts::draw(&path, &title, y_label, &libraries, &bars(value))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Table 3: the server-cost targets, with their ratios.
fn print_targets(rows: &[Row]) {
    println!("\n### Cost targets (server time per call or per lock/unlock pair)\n");
    println!("| operation | ops/s | p50 µs | p99 µs | server µs min | median | round trips |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let s = row.summary();
        println!(
            "| {} | {:.0} | {} | {} | {:.2} | {:.2} | {:.2} |",
            row.label,
            s.ops_per_s,
            us(s.p50),
            us(s.p99),
            s.server_us_min,
            s.server_us_median,
            s.commands
        );
    }
    let s = |i: usize| rows[i].summary();
    println!();
    println!("| ratio of server time (min / median) | value | target |");
    println!("|---|---:|---:|");
    for (label, a, b, target) in [
        ("try_increment / design card, admit", 0, 1, "≤ 1.3"),
        ("try_increment / design card, deny", 2, 3, "≤ 1.3"),
        (
            "fence pair / SET NX PX + INCR + release scripts",
            4,
            5,
            "≤ 1.5",
        ),
        ("fence pair / rslock lock + unlock", 4, 6, "—"),
    ] {
        println!("| {label} | {} | {target} |", ratio(&s(a), &s(b)));
    }
}

/// Table 4: handoff of a contended lock, the lockers alternating per round.
async fn contended(conns: &Conns, rounds: usize) -> Result<(), Error> {
    let lockers = handoff::Locker::all(conns);
    let mut results = vec![Vec::new(); lockers.len()];
    for round in 0..rounds {
        for (i, (_, locker)) in lockers.iter().enumerate() {
            let key = format!("peers:handoff:{i}:{round}");
            results[i].push(handoff::run(locker, &key, Duration::from_millis(1500)).await?);
        }
    }
    println!(
        "\n### Contended lock: {} waiters, hold {:?}, {rounds} rounds of 1.5 s\n",
        handoff::WAITERS,
        handoff::HOLD
    );
    println!(
        "Handoff: from a holder sending its release to the next grant to another waiter. \
         Each cell: the rounds' median.\n"
    );
    println!("| waiting acquire | grants/s | re-taken by the releaser | handoff p50 ms | handoff p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for ((label, _), mut runs) in lockers.iter().zip(results) {
        let mid = runs.len() / 2;
        runs.sort_by(|a, b| a.grants_per_s.total_cmp(&b.grants_per_s));
        let grants = runs[mid].grants_per_s;
        runs.sort_by(|a, b| a.retaken.total_cmp(&b.retaken));
        let retaken = runs[mid].retaken * 100.0;
        runs.sort_by_key(|r| r.p50);
        let p50 = runs[mid].p50;
        runs.sort_by_key(|r| r.p99);
        let p99 = runs[mid].p99;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {label} | {grants:.0} | {retaken:.0}% | {:.1} | {:.1} |",
            ms(p50),
            ms(p99)
        );
    }
    Ok(())
}
