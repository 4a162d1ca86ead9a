//! The full comparison: every operation written every way, at 1, 16, 64 and
//! 256 tasks, on one hot key and on keys spread over 1,000 names; then the
//! pause runs (correctness under faults) and the library-overhead runs
//! (`try_increment` against a raw `EVALSHA` of the same script, alternated).
//!
//! ```sh
//! cargo bench --bench versus_locks                 # everything, about 4 minutes on 2 cores
//! cargo bench --bench versus_locks -- debit        # only comparisons whose label contains "debit"
//! cargo bench --bench versus_locks -- overhead     # only try_increment against raw EVALSHA
//! cargo bench --bench versus_locks -- --json       # the rows as JSON on stdout ({"rows": [..], "hot_key": []})
//! ```
//!
//! Uses `$REDIS_URL` when set, otherwise a throwaway `redis-server`. Progress
//! goes to stderr, results to stdout. Without cargo bench's `--bench` flag
//! (as under `cargo test --all-targets`) it only says how to run it: it is a
//! measurement, not a test. `examples/compare.rs` is the short version.

#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::time::Duration;

use common::ops::{Operation, Variant};
use common::report;
use common::run::{self, Comparison, Measured, Scenario};

const TASKS: [usize; 4] = [1, 16, 64, 256];
const KEYS: [usize; 2] = [1, 1000];
const RUN_TIME: Duration = Duration::from_secs(2);
/// Library overhead: script and raw alternate this many times, 250 ms each.
/// Short rounds, many of them: on a shared machine the load changes from one
/// second to the next, and the median of many pairs shrugs off bursts.
const OVERHEAD_ROUNDS: usize = 20;

/// Alternated rounds per comparison (see `run::alternated`).
const ROUNDS: usize = 4;

fn matrix(filters: &[String]) -> Vec<Comparison> {
    let mut plan = Vec::new();
    for operation in Operation::ALL {
        for keys in KEYS {
            for tasks in TASKS {
                plan.push(Comparison::throughput(
                    operation, tasks, keys, RUN_TIME, ROUNDS,
                ));
            }
        }
    }
    for operation in Operation::ALL {
        plan.push(Comparison::with_pauses(operation, 16, 25));
    }
    plan.retain(|c| filters.is_empty() || filters.iter().any(|f| c.label().contains(f.as_str())));
    plan
}

// One client thread: on a 2-core machine the server gets the other core.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("versus_locks is a benchmark: run it with `cargo bench --bench versus_locks`");
        return ExitCode::SUCCESS;
    }
    let json = args.iter().any(|a| a == "--json");
    let filters: Vec<String> = args.into_iter().filter(|a| !a.starts_with("--")).collect();
    match bench(json, &filters).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(json: bool, filters: &[String]) -> common::Result<()> {
    let target = common::Target::from_env();
    eprintln!("versus_locks: {}", target.describe());
    let client = redis::Client::open(target.url.as_str())?;

    let plan = matrix(filters);
    let mut measured: Vec<Measured> = Vec::new();
    for (i, comparison) in plan.iter().enumerate() {
        eprint!("[{:>2}/{}] {:<36} ", i + 1, plan.len(), comparison.label());
        let results = comparison.run(&client, |_| eprint!(".")).await?;
        eprintln!();
        for m in &results {
            eprintln!(
                "        {:<6} {:>9} ops/s, p50 {}, p99 {}, {:.2} round trips{}",
                m.row.variant.name(),
                report::thousands(m.row.ops_per_sec),
                report::duration(m.row.p50_us),
                report::duration(m.row.p99_us),
                m.round_trips_per_call(),
                if m.errors > 0 {
                    format!(", {} errors: {:?}", m.errors, m.first_error)
                } else {
                    String::new()
                }
            );
        }
        measured.extend(results);
    }

    if json {
        println!("{}", report::json(measured.iter().map(|m| &m.row), &[])?);
        return Ok(());
    }
    if !measured.is_empty() {
        print!("\n{}", report::table(&measured));
        println!();
        for line in report::targets(&measured, None) {
            println!("{line}");
        }
    }
    if filters.is_empty() || filters.iter().any(|f| f == "overhead") {
        println!();
        for line in overhead(&client).await? {
            println!("{line}");
        }
    }
    Ok(())
}

/// `try_increment` against the same script by raw `EVALSHA`, on one
/// multiplexed connection, alternated so that both see the same machine:
/// the median of the per-round ratios. Then the same two code paths without
/// I/O (`common::overhead`), which a noisy machine disturbs far less.
async fn overhead(client: &redis::Client) -> common::Result<Vec<String>> {
    let mut lines = Vec::new();
    let mut script_ops = Vec::new();
    for tasks in [1, 64] {
        let (mut throughput, mut p50) = (Vec::new(), Vec::new());
        for round in 0..OVERHEAD_ROUNDS {
            eprint!(
                "overhead, {tasks} tasks, round {}/{OVERHEAD_ROUNDS} ... ",
                round + 1
            );
            // Who goes first alternates too.
            let order = if round % 2 == 0 {
                [Variant::Script, Variant::Raw]
            } else {
                [Variant::Raw, Variant::Script]
            };
            let mut pair = Vec::new();
            for variant in order {
                let s = Scenario::throughput(
                    Operation::Counter,
                    variant,
                    tasks,
                    1,
                    Duration::from_millis(250),
                );
                pair.push(run::run(client, &s).await?.row);
            }
            if order[0] == Variant::Raw {
                pair.swap(0, 1);
            }
            throughput.push(pair[0].ops_per_sec / pair[1].ops_per_sec.max(1.0));
            if tasks == 64 {
                script_ops.push(pair[0].ops_per_sec);
            }
            p50.push(pair[0].p50_us / pair[1].p50_us.max(0.1));
            eprintln!("{:.3}x", throughput[round]);
        }
        lines.push(format!(
            "library overhead, counter, 1 key, {tasks} task(s), one connection, median of {OVERHEAD_ROUNDS} \
             alternated rounds: try_increment throughput {:.3}x raw EVALSHA's, p50 latency {:.3}x",
            median(&mut throughput),
            median(&mut p50),
        ));
    }
    eprintln!("overhead without I/O ...");
    let cpu = common::overhead::cpu_cost(200_000, 7).await?;
    let per_call_ns = 1e9 / median(&mut script_ops).max(1.0);
    lines.push(format!(
        "library's own cost per call without I/O (best of 7 x 200,000): try_increment {} ns, \
         raw EVALSHA {} ns: {:+.0} ns, {:.1}% of the {:.1} µs per call at 64 tasks",
        cpu.script.as_nanos(),
        cpu.raw.as_nanos(),
        cpu.added_ns(),
        100.0 * cpu.added_ns() / per_call_ns,
        per_call_ns / 1000.0,
    ));
    Ok(lines)
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}
