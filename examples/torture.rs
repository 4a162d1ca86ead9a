//! Long randomised runs of every nolock module under random faults, judged
//! by the history checkers (see `tests/support/history.rs` for each
//! invariant).
//!
//! ```text
//! cargo run --release --example torture -- --seconds 600 [--seed S] [--cluster | --clock] [--clients N]
//! ```
//!
//! Prints the seed first (pass it back with `--seed` to replay the same
//! operations and faults), then a summary table: operations by outcome,
//! faults injected by kind, engine counters and each checker's verdict.
//! Exits with status 1 when a checker fails. Needs `redis-server` (and
//! `redis-cli` for `--cluster`) on the PATH. `--clock` (one server) runs it
//! under libfaketime (Debian package `faketime`) and steps its clock forward
//! among the faults.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::torture::{run, Config};

fn main() {
    let mut config = Config {
        seed: fastrand::u64(..),
        duration: Duration::from_secs(60),
        clients: 8,
        cluster: false,
        clock: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage(&format!("{name} needs a number")))
        };
        match arg.as_str() {
            "--seconds" => config.duration = Duration::from_secs(value("--seconds")),
            "--seed" => config.seed = value("--seed"),
            "--clients" => config.clients = value("--clients").max(1) as usize,
            "--cluster" => config.cluster = true,
            "--clock" => config.clock = true,
            "--help" | "-h" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    println!(
        "torture: seed {} for {} s on {} with {} clients",
        config.seed,
        config.duration.as_secs(),
        if config.cluster {
            "the cluster"
        } else if config.clock {
            "one server whose clock steps forward"
        } else {
            "one server"
        },
        config.clients
    );
    if config.cluster && config.clock {
        usage("--clock runs on one server; the cluster has no stepped clock");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| usage(&format!("tokio runtime: {e}")));
    let report = runtime.block_on(run(config));
    println!("{}", report.table());
    if !report.passed() {
        println!("FAILED: replay with --seed {}", report.seed);
        std::process::exit(1);
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("torture: {problem}");
    }
    eprintln!("usage: torture [--seconds N] [--seed S] [--cluster | --clock] [--clients N]");
    std::process::exit(2)
}
