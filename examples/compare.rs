//! Atomic scripts against locks, measured side by side: nolock's main job.
//!
//! ```sh
//! cargo run --release --example compare             # a table, in under a minute
//! cargo run --release --example compare -- --json   # the rows and hot-key runs as JSON
//! ```
//!
//! It starts a throwaway `redis-server` on a free port (or uses `$REDIS_URL`),
//! then runs each operation written several ways (see `benches/common/ops.rs`):
//!
//! * `script`: the nolock call: one Lua script, one round trip, nothing held;
//! * `raw`: the same script as a hand-written redis-rs `EVALSHA` (what the
//!   library itself costs);
//! * `lock`: as careful users write it today: `SET lock <token> NX PX ttl`
//!   with jittered backoff, then `GET`, decide, `SET`, then a token-checked
//!   release (`benches/common/lock.rs`);
//! * `watch`: optimistic `WATCH`, `GET`, `MULTI`/`SET`/`EXEC`, retried.
//!
//! First for speed (every call admitted, no faults), then for correctness:
//! holders that now and then pause past the lock's TTL, against a key that
//! allows 100 admissions. A script has no lease to lose, so it over-admits
//! nothing; the lock's late writes land on top of the next holder's.
//!
//! The full matrix (1, 16, 64, 256 tasks, one key or 1,000) is
//! `cargo bench --bench versus_locks`.

#[path = "../benches/common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::time::Duration;

use common::ops::Operation;
use common::report;
use common::run::{self, Comparison, Measured};

/// The pause runs: tasks, and calls per task (4 x the key's capacity in all).
const PAUSE_TASKS: usize = 16;
const PAUSE_CALLS: usize = 25;

/// The short comparison: about 30 s on a 2-core machine. The variants of
/// each line alternate in 3 rounds, so that the machine's load falls on all
/// of them alike.
fn plan() -> Vec<Comparison> {
    let ms = Duration::from_millis;
    let mut plan = vec![
        Comparison::throughput(Operation::Counter, 1, 1, ms(600), 3),
        Comparison::throughput(Operation::Counter, 64, 1, ms(1500), 3),
        Comparison::throughput(Operation::Counter, 64, 1000, ms(900), 3),
        Comparison::throughput(Operation::RateLimit, 1, 1, ms(600), 3),
        Comparison::throughput(Operation::RateLimit, 64, 1, ms(900), 3),
        Comparison::throughput(Operation::Debit, 1, 1, ms(600), 3),
        Comparison::throughput(Operation::Debit, 64, 1, ms(900), 3),
        Comparison::throughput(Operation::Semaphore, 1, 1, ms(600), 3),
        Comparison::throughput(Operation::Semaphore, 16, 1, ms(900), 3),
    ];
    for operation in Operation::ALL {
        plan.push(Comparison::with_pauses(operation, PAUSE_TASKS, PAUSE_CALLS));
    }
    plan
}

const USAGE: &str = "usage: cargo run --release --example compare [-- --json] [-- --svg DIR]

Runs nolock's scripts against lock-based and WATCH-based versions of the same
operations and prints a table (or, with --json, the same rows and the hot-key
runs as JSON; the deny-cache lines and the library's own cost print only in
the table). With
--svg DIR it also draws the results as SVG charts in DIR.
Uses $REDIS_URL when set; otherwise starts redis-server on a free port.";

// One client thread for every variant: on a 2-core machine the server gets
// the other core, instead of three busy threads sharing two.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut json = false;
    let mut svg: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--svg" => match args.next() {
                Some(dir) => svg = Some(dir.into()),
                None => {
                    eprintln!("--svg needs a directory\n\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    match compare(json, svg.as_deref()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn compare(json: bool, svg: Option<&std::path::Path>) -> common::Result<()> {
    let target = common::Target::from_env();
    eprintln!("nolock compare: {}", target.describe());
    if cfg!(debug_assertions) {
        eprintln!(
            "note: a debug build; use `cargo run --release --example compare` for real figures"
        );
    }
    let client = redis::Client::open(target.url.as_str())?;
    let plan = plan();
    let mut measured: Vec<Measured> = Vec::new();
    for (i, comparison) in plan.iter().enumerate() {
        eprint!("[{}/{}] {:<34} ", i + 1, plan.len(), comparison.label());
        let results = comparison.run(&client, |_| eprint!(".")).await?;
        let speeds: Vec<String> = results
            .iter()
            .map(|m| {
                format!(
                    "{} {}",
                    m.row.variant.name(),
                    report::thousands(m.row.ops_per_sec)
                )
            })
            .collect();
        eprintln!(" {} ops/s", speeds.join(", "));
        for m in &results {
            if let Some(trouble) = trouble(m) {
                eprintln!("        {}: {trouble}", m.row.variant.name());
            }
        }
        measured.extend(results);
    }
    if json {
        eprint!("one hot limit, one call per decision against reservoirs ... ");
        let hot = common::hot_key::runs(&client).await?;
        eprintln!("done");
        println!("{}", report::json(measured.iter().map(|m| &m.row), &hot)?);
        return Ok(());
    }
    eprint!("library cost per call without I/O ... ");
    let cpu = common::overhead::cpu_cost(50_000, 5).await?;
    eprintln!("{:+.0} ns", cpu.added_ns());
    println!();
    print!("{}", report::table(&measured));
    println!();
    for line in report::targets(&measured, Some(&cpu)) {
        println!("{line}");
    }
    eprint!("abusive client, with and without the deny cache ... ");
    let denials = common::deny_cache::abusive_client(&client).await?;
    eprintln!("done");
    println!(
        "\nAn abusive client at exactly 10x its quota (GCRA {}/s, burst 1, a check every {:?} for {:?}):\n",
        common::deny_cache::RATE,
        common::deny_cache::PACE,
        common::deny_cache::LENGTH,
    );
    println!("| limiter | decisions | admitted | Redis calls | calls per decision |");
    println!("|---|---:|---:|---:|---:|");
    for run in &denials {
        println!(
            "| {} | {} | {} | {} | {:.2} |",
            run.label,
            run.decisions,
            run.admitted,
            run.redis_calls,
            run.calls_per_decision()
        );
    }
    eprint!("one hot limit, one call per decision against reservoirs ... ");
    let hot = common::hot_key::runs(&client).await?;
    eprintln!("done");
    println!(
        "\nOne limit for every task ({} tasks, {:?} each run; a Reservoir takes batches of up to {} units and gives back what it held unused for {:?}):\n",
        common::hot_key::TASKS,
        common::hot_key::LENGTH,
        common::hot_key::MAX_BATCH,
        common::hot_key::HOLD,
    );
    println!("| limiter | decisions/s | admitted | bound (server clock) | over-admitted | Redis calls per decision |");
    println!("|---|---:|---:|---:|---:|---:|");
    for run in &hot {
        println!(
            "| {} | {} | {} | {} | {} | {:.3} |",
            run.label,
            report::thousands(run.per_second()),
            run.admitted,
            run.bound,
            run.over_admitted(),
            run.calls_per_decision()
        );
    }
    if let Some(dir) = svg {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned();
        let stamp = format!("{}, Redis {version}, `compare -- --svg`", utc_now());
        for file in common::charts::draw(dir, &stamp, &measured, &hot)? {
            eprintln!("wrote {file}");
        }
    }
    println!(
        "\nround trips: requests sent per call. vs lock: throughput over the lock's, same operation and tasks.\n\
         pauses: {} tasks x {} calls on one key that allows {}; one call in {} pauses {:?} \
         (the lock's TTL there: {:?}; elsewhere {:?}).\n\
         rate limit: GCRA (nolock::rate::Limiter on the server clock; lock and watch on the client's). \
         debit: take 7 if the balance covers it (nolock::cas::debit).\n\
         semaphore: {} permits, each admitted holder works {:?}; script = nolock::semaphore (permit ttl {:?}), \
         lock = a count of running holders under the SET NX lock; over-admitted = holders that ran beyond the permits, \
         lost updates = slots the server still counts after every holder left.",
        PAUSE_TASKS,
        PAUSE_CALLS,
        run::PAUSE_CAPACITY,
        run::PAUSES.every,
        run::PAUSES.length,
        run::PAUSES.lock_ttl,
        run::LOCK_TTL,
        common::semaphore::PERMITS,
        common::semaphore::HOLD,
        common::semaphore::PERMIT_TTL,
    );
    Ok(())
}

/// The time now as `YYYY-MM-DD HH:MM UTC` (days to a civil date: Howard
/// Hinnant's algorithm; no date crate for one caption).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}

/// What went wrong in a run, if anything, for the progress output.
fn trouble(m: &Measured) -> Option<String> {
    let mut notes = Vec::new();
    if m.over_admissions + m.lost_updates > 0 {
        notes.push(format!(
            "{} over-admitted, {} updates lost",
            m.over_admissions, m.lost_updates
        ));
    }
    if m.errors > 0 {
        notes.push(format!(
            "{} calls failed (first: {})",
            m.errors,
            m.first_error.as_deref().unwrap_or("?")
        ));
    }
    if m.unexplained > 0 {
        notes.push(format!(
            "{} admissions recorded but not reported",
            m.unexplained
        ));
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::ops::Variant;
    use common::run::Row;
    use common::run::Scenario;

    fn row(variant: Variant) -> Row {
        Row {
            operation: "counter, 1 key".to_owned(),
            variant,
            tasks: 64,
            ops_per_sec: 12345.0,
            p50_us: 61.5,
            p99_us: 250.0,
            over_admissions: 0,
            lost_updates: 3,
        }
    }

    #[test]
    fn json_rows_have_exactly_the_documented_fields() {
        let variants = [Variant::Script, Variant::Lock, Variant::Watch, Variant::Raw];
        let rows: Vec<Row> = variants.iter().map(|&v| row(v)).collect();
        let hot = [common::hot_key::HotRun {
            label: "Reservoir, 4 processes".to_owned(),
            decisions: 6_000,
            admitted: 2_990,
            redis_calls: 6,
            seconds: 1.5,
            bound: 3_001,
        }];
        let text = report::json(&rows, &hot).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let object = value.as_object().expect("a JSON object");
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["hot_key", "rows"]);
        let run = &value["hot_key"][0];
        assert_eq!(run["limiter"], "Reservoir, 4 processes");
        assert_eq!(run["decisions_per_second"], 4000.0);
        assert_eq!(run["over_admitted"], 0);
        assert_eq!(run["calls_per_decision"], 0.001);
        let array = value["rows"].as_array().expect("a JSON array of rows");
        assert_eq!(array.len(), 4);
        for (object, name) in array.iter().zip(["script", "lock", "watch", "raw"]) {
            let object = object.as_object().expect("each row is an object");
            let mut fields: Vec<&str> = object.keys().map(String::as_str).collect();
            fields.sort_unstable();
            assert_eq!(
                fields,
                [
                    "lost_updates",
                    "operation",
                    "ops_per_sec",
                    "over_admissions",
                    "p50_us",
                    "p99_us",
                    "tasks",
                    "variant"
                ]
            );
            assert_eq!(object["variant"], name);
            assert_eq!(object["operation"], "counter, 1 key");
            assert_eq!(object["tasks"], 64);
            assert_eq!(object["ops_per_sec"], 12345.0);
            assert_eq!(object["p50_us"], 61.5);
            assert_eq!(object["p99_us"], 250.0);
            assert_eq!(object["over_admissions"], 0);
            assert_eq!(object["lost_updates"], 3);
        }
        let back: Vec<Row> = serde_json::from_value(value["rows"].clone()).unwrap();
        assert_eq!(back, rows, "the rows read back unchanged");
    }

    #[test]
    fn table_numbers_read_at_a_glance() {
        assert_eq!(report::thousands(1234567.4), "1,234,567");
        assert_eq!(report::thousands(999.0), "999");
        assert_eq!(report::duration(85.2), "85 µs");
        assert_eq!(report::duration(1520.0), "1.5 ms");
        assert_eq!(report::duration(2_500_000.0), "2.50 s");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        use common::latency::Latencies;
        let l = Latencies::new((1..=100).rev().collect());
        assert_eq!(l.percentile(0.5), Duration::from_nanos(50));
        assert_eq!(l.percentile(0.99), Duration::from_nanos(99));
        assert_eq!(l.percentile(1.0), Duration::from_nanos(100));
        assert_eq!(Latencies::new(vec![]).percentile(0.5), Duration::ZERO);
    }

    fn words(cmd: Option<redis::Cmd>) -> Vec<String> {
        cmd.map(|cmd| {
            cmd.args_iter()
                .map(|arg| match arg {
                    redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    _ => "<cursor>".to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
    }

    /// The lock and watch variants decide on the client what the scripts
    /// decide in Redis.
    #[test]
    fn client_side_decisions_match_the_scripts() {
        let c = Operation::Counter;
        assert_eq!(
            words(c.decide("k", None, 2)),
            ["SET", "k", "1", "PX", "3600000"]
        );
        assert_eq!(
            words(c.decide("k", Some(1), 2)),
            ["SET", "k", "2", "KEEPTTL"]
        );
        assert!(c.decide("k", Some(2), 2).is_none());

        let d = Operation::Debit;
        assert_eq!(words(d.decide("b", Some(7), 1)), ["SET", "b", "0"]);
        assert!(d.decide("b", Some(6), 1).is_none());

        // GCRA: a TAT 9 intervals ahead leaves room for a 10th within a
        // burst of 10, none within a burst of 5.
        let r = Operation::RateLimit;
        let interval = common::ops::RATE_INTERVAL.as_micros() as i64;
        let ahead = common::ops::now_micros() + 9 * interval;
        assert!(r.decide("r", Some(ahead), 10).is_some());
        assert!(r.decide("r", Some(ahead), 5).is_none());
        assert_eq!(words(r.decide("r", None, 1))[3], "PX");
    }

    #[test]
    fn the_plan_runs_every_variant_that_exists() {
        let plan: Vec<Scenario> = plan().into_iter().flat_map(|c| c.scenarios).collect();
        for operation in Operation::ALL {
            for &variant in operation.variants() {
                assert!(plan.iter().any(|s| s.operation == operation
                    && s.variant == variant
                    && s.pauses.is_none()));
            }
        }
        assert!(plan
            .iter()
            .any(|s| s.variant == Variant::Lock && s.pauses.is_some()));
    }

    /// Correctness of the comparison itself, against a real server: the
    /// atomic variants never over-admit or lose an update, with or without
    /// pauses, and every variant runs without errors. Nothing here depends
    /// on speed; the lock's failures are timing-dependent, so they are shown
    /// by the example rather than asserted.
    #[tokio::test]
    async fn atomic_variants_stay_exact_under_pauses() {
        let target = common::Target::from_env();
        let client = redis::Client::open(target.url.as_str()).unwrap();
        for operation in Operation::ALL {
            for &variant in operation.variants() {
                let runs = [
                    Scenario::with_pauses(operation, variant, 8, 20),
                    Scenario::throughput(operation, variant, 4, 50, Duration::from_millis(50)),
                ];
                for scenario in runs {
                    let m = run::run(&client, &scenario).await.unwrap();
                    let what = format!("{} {}", scenario.label(), variant.name());
                    assert_eq!(m.errors, 0, "{what}: {:?}", m.first_error);
                    assert_eq!(m.unexplained, 0, "{what}");
                    if variant == Variant::Lock {
                        continue;
                    }
                    assert_eq!(m.row.over_admissions, 0, "{what}");
                    assert_eq!(m.row.lost_updates, 0, "{what}");
                    // Semaphore holders give their slots back: no fixed total.
                    if scenario.pauses.is_some() && operation != Operation::Semaphore {
                        assert_eq!(m.calls, 160, "{what}");
                        // 160 calls fill 100; a run longer than the rate
                        // limit's interval (a loaded machine) earns one more.
                        let allowance = operation.allowance(run::PAUSE_CAPACITY, m.elapsed);
                        assert!(
                            (run::PAUSE_CAPACITY..=allowance).contains(&m.admitted),
                            "{what}: {} admitted, allowance {allowance}",
                            m.admitted
                        );
                    }
                }
            }
        }
    }
}
