//! Server time per call of each hot script, beside a bare `INCR` and beside
//! minimal reference scripts written for this table.
//!
//! Each row is measured as: `CONFIG RESETSTAT`, 10 000 calls (16 tasks on one
//! multiplexed connection), then `usec_per_call` of its command from
//! `INFO commandstats`: the time Redis spent running it, network excluded.
//! The rows are measured in turn, and the whole table `ROUNDS` times, so that
//! a load change on a shared machine hits every row alike; the minimum and the
//! median over the rounds are printed.
//!
//! ```text
//! cargo run --release --example rate_cost            # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --example rate_cost
//! ```
//!
//! "admit" rows use a quota no call reaches (every call writes); "deny" rows
//! use an exhausted limiter (every call reads and decides, writes nothing).
//!
//! The second table holds nolock to its server-cost targets, each as a ratio
//! to a reference script measured in the same run. The references do the
//! least that gives the same decision, and no more: no argument checks, no
//! check of what is stored, a two-field reply (see [`REF_GCRA`],
//! [`REF_COUNTER`], [`REF_ACQUIRE`], [`REF_RELEASE`]). A fence "pair" row is
//! one acquire and one release, and its figure is the server time per pair.

#[path = "../tests/support/server.rs"]
mod server;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nolock::fence;
use nolock::rate::{Algorithm, Limiter, MultiLimiter, Quota};
use redis::aio::MultiplexedConnection;

const CALLS: usize = 10_000;
const TASKS: usize = 16;
const ROUNDS: usize = 5;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Call = Arc<
    dyn Fn(MultiplexedConnection, usize) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>
        + Send
        + Sync,
>;

/// One line of the table: what is measured, the command it shows up as in
/// `INFO commandstats`, how many of those one call sends, and one call of it
/// (given the task that makes it).
struct Row {
    label: String,
    command: &'static str,
    per_call: usize,
    call: Call,
}

fn row<F, Fut>(label: impl Into<String>, command: &'static str, call: F) -> Row
where
    F: Fn(MultiplexedConnection) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    pair(label, command, 1, move |conn, _| call(conn))
}

/// A row whose call sends `per_call` commands; its figure is per call.
fn pair<F, Fut>(label: impl Into<String>, command: &'static str, per_call: usize, call: F) -> Row
where
    F: Fn(MultiplexedConnection, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    Row {
        label: label.into(),
        command,
        per_call,
        call: Arc::new(move |conn, task| Box::pin(call(conn, task))),
    }
}

/// Runs a row CALLS times over TASKS tasks, then reads `usec_per_call`.
async fn measure(conn: &MultiplexedConnection, row: &Row) -> Result<f64, Error> {
    let mut admin = conn.clone();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut admin)
        .await?;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (conn, call) = (conn.clone(), row.call.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..CALLS / TASKS {
                call(conn.clone(), task).await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await?;
    let needle = format!("cmdstat_{}:", row.command);
    let line = info
        .lines()
        .find(|l| l.starts_with(&needle))
        .ok_or_else(|| format!("no {} in INFO commandstats", row.command))?;
    let calls: usize = field(line, "calls=").parse()?;
    if calls != CALLS / TASKS * TASKS * row.per_call {
        return Err(format!("{}: {calls} calls counted", row.label).into());
    }
    let usec: f64 = field(line, "usec_per_call=").parse()?;
    Ok(usec * row.per_call as f64)
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split([':', ','])
        .find_map(|part| part.strip_prefix(name))
        .unwrap_or("")
}

fn rows() -> Result<Vec<Row>, Error> {
    let mut rows = vec![
        row("INCR (baseline)", "incr", |mut c| async move {
            redis::cmd("INCR")
                .arg("rate_cost:incr")
                .query_async::<i64>(&mut c)
                .await?;
            Ok(())
        }),
        // The foundation's bounded counter, for comparison with DESIGN.md.
        row(
            "limits::try_increment (bounded counter)",
            "evalsha",
            |mut c| async move {
                let hour = Duration::from_secs(3600);
                let _ = nolock::limits::try_increment(&mut c, "rate_cost:counter", 1 << 50, hour)
                    .await?;
                Ok(())
            },
        ),
    ];
    // Nothing is ever denied: 10^6 per second with a burst of 10^6.
    let roomy = Quota::per_second(1_000_000)?;
    // Exhausted after the first call.
    let tight = Quota::per_hour(1)?;
    for algorithm in Algorithm::ALL {
        for (label, quota) in [("admit", roomy), ("deny", tight)] {
            let limiter = Limiter::new(algorithm, quota)?;
            let key = format!("rate_cost:{algorithm}:{label}");
            rows.push(row(
                format!("{algorithm} check, {label}"),
                "evalsha",
                move |mut c| {
                    let (limiter, key) = (limiter.clone(), key.clone());
                    async move {
                        let _ = limiter.check(&mut c, &key, 1).await?;
                        Ok(())
                    }
                },
            ));
        }
    }
    let limiter = Limiter::new(Algorithm::Gcra, roomy)?;
    rows.push(row("gcra peek", "evalsha_ro", move |mut c| {
        let limiter = limiter.clone();
        async move {
            let _ = limiter.peek(&mut c, "rate_cost:peek", 1).await?;
            Ok(())
        }
    }));
    // A refund's cost: a check and a refund of what it charged, per pair
    // (the refund stores its charge's record), beside the check alone above.
    // A charge of 2 at one unit a second, refunded by 1: a refund gives back
    // only whole units the charge has not drained yet.
    let limiter = Limiter::new(
        Algorithm::Gcra,
        Quota::per_second(1)?.with_burst(1_000_000)?,
    )?;
    rows.push(pair(
        "gcra check of 2 + refund of 1, per pair",
        "evalsha",
        2,
        move |mut c, task| {
            let limiter = limiter.clone();
            async move {
                let key = format!("rate_cost:refund:{task}");
                let mut decision = limiter.check(&mut c, &key, 2).await?;
                let charge = decision.charge_mut().ok_or("not admitted")?;
                if charge.refund(&mut c, 1).await?.credited != 1 {
                    return Err(format!("{key}: the refund gave nothing back").into());
                }
                Ok(())
            }
        },
    ));
    rows.extend(reference_rows());
    rows.extend(fence_rows());
    for algorithm in [Algorithm::Gcra, Algorithm::SlidingWindow] {
        let limits = MultiLimiter::new(algorithm)
            .limit("second", Quota::per(1_000_000, Duration::from_secs(1))?)?
            .limit("minute", Quota::per(10_000_000, Duration::from_secs(60))?)?
            .limit("hour", Quota::per(100_000_000, Duration::from_secs(3600))?)?;
        let key = format!("rate_cost:multi:{algorithm}");
        rows.push(row(
            format!("{algorithm} multi-limit check, 3 limits, admit"),
            "evalsha",
            move |mut c| {
                let (limits, key) = (limits.clone(), key.clone());
                async move {
                    let _ = limits.check(&mut c, &key, 1).await?;
                    Ok(())
                }
            },
        ));
    }
    Ok(rows)
}

/// Reference: a minimal GCRA, as a user would first write it. It reads the
/// server clock, decides with the same arithmetic as `rate/gcra/check` and
/// stores the TAT with its expiry in one `SET ... PXAT`, but checks nothing
/// and answers only `{allowed, retry_after_ms}`.
const REF_GCRA: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local cost, step, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local after = tat + cost * step
if after - now > burst * step then
  return {0, math.ceil((after - now - burst * step) / 1000)}
end
redis.call('SET', KEYS[1], after, 'PXAT', math.ceil(after / 1000))
return {1, -1}
";

/// Reference: the ten-line bounded counter (GET, compare, INCRBY, and
/// PEXPIRE when the increment created the key), answering `{admitted, count}`.
const REF_COUNTER: &str = r"
local limit, window, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count + n > limit then
  return {0, count}
end
count = redis.call('INCRBY', KEYS[1], n)
if count == n then
  redis.call('PEXPIRE', KEYS[1], window)
end
return {1, count}
";

/// Reference: a lock taken with `SET NX PX` and a counter bumped with `INCR`
/// (the fence), in one script.
const REF_ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// Reference: the token-checked release (GET, compare, DEL).
const REF_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Labels of the rows the targets compare.
const GCRA_ADMIT: &str = "gcra check, admit";
const GCRA_DENY: &str = "gcra check, deny";
const REF_GCRA_ADMIT: &str = "reference: minimal GCRA script, admit";
const REF_GCRA_DENY: &str = "reference: minimal GCRA script, deny";
const TRY_INCREMENT: &str = "limits::try_increment (bounded counter)";
const REF_BOUNDED: &str = "reference: 10-line bounded counter script";
const FENCE_PAIR: &str = "Lock::acquire + Grant::release (per pair)";
const REF_PAIR: &str = "reference: SET NX PX + INCR, token-checked release (per pair)";

fn reference_rows() -> Vec<Row> {
    let gcra = redis::Script::new(REF_GCRA);
    let counter = redis::Script::new(REF_COUNTER);
    let mut rows = Vec::new();
    // The arguments nolock sends for the roomy and the exhausted quota.
    for (label, interval, burst) in [
        (REF_GCRA_ADMIT, 1u64, 1_000_000u64),
        (REF_GCRA_DENY, 3_600_000_000, 1),
    ] {
        let (gcra, key) = (gcra.clone(), format!("rate_cost:{label}"));
        rows.push(row(label, "evalsha", move |mut c| {
            let (gcra, key) = (gcra.clone(), key.clone());
            async move {
                let _: (i64, i64) = gcra
                    .key(key)
                    .arg(1)
                    .arg(interval)
                    .arg(burst)
                    .invoke_async(&mut c)
                    .await?;
                Ok(())
            }
        }));
    }
    rows.push(row(REF_BOUNDED, "evalsha", move |mut c| {
        let counter = counter.clone();
        async move {
            let _: (i64, i64) = counter
                .key("rate_cost:ref_counter")
                .arg(1u64 << 50)
                .arg(3_600_000)
                .arg(1)
                .invoke_async(&mut c)
                .await?;
            Ok(())
        }
    }));
    rows
}

/// One acquire and one release per call, on a lock of the calling task's own
/// (so every acquire is granted).
fn fence_rows() -> Vec<Row> {
    let lock = fence::Lock::new(Duration::from_secs(30)).expect("a valid TTL");
    let nolock = pair(FENCE_PAIR, "evalsha", 2, move |mut c, task| {
        let lock = lock.clone();
        async move {
            let resource = format!("rate_cost:fence:{task}");
            match lock.acquire(&mut c, &resource).await? {
                fence::LockAttempt::Acquired(grant) => match grant.release(&mut c).await? {
                    fence::LockRelease::Released => Ok(()),
                    lost => Err(format!("{resource}: {lost:?}").into()),
                },
                held => Err(format!("{resource}: {held:?}").into()),
            }
        }
    });
    let (acquire, release) = (
        redis::Script::new(REF_ACQUIRE),
        redis::Script::new(REF_RELEASE),
    );
    let reference = pair(REF_PAIR, "evalsha", 2, move |mut c, task| {
        let (acquire, release) = (acquire.clone(), release.clone());
        async move {
            let (lock, token) = (format!("{{rate_cost:ref:{task}}}"), format!("{task:032x}"));
            let (granted, _fence): (i64, i64) = acquire
                .key(&lock)
                .key(format!("{lock}:fence"))
                .arg(&token)
                .arg(30_000)
                .invoke_async(&mut c)
                .await?;
            let released: i64 = release.key(&lock).arg(&token).invoke_async(&mut c).await?;
            if (granted, released) != (1, 1) {
                return Err(format!("{lock}: granted {granted}, released {released}").into());
            }
            Ok(())
        }
    });
    vec![nolock, reference]
}

/// The server-cost targets: (what, ours, reference, at most this ratio).
const TARGETS: [(&str, &str, &str, f64); 9] = [
    ("GCRA check, admit", GCRA_ADMIT, REF_GCRA_ADMIT, 1.0),
    ("GCRA check, deny", GCRA_DENY, REF_GCRA_DENY, 1.0),
    (
        "token-bucket check, admit",
        "token_bucket check, admit",
        REF_GCRA_ADMIT,
        1.0,
    ),
    (
        "token-bucket check, deny",
        "token_bucket check, deny",
        REF_GCRA_DENY,
        1.0,
    ),
    (
        "sliding-window check, admit",
        "sliding_window check, admit",
        REF_GCRA_ADMIT,
        1.0,
    ),
    (
        "sliding-window check, deny",
        "sliding_window check, deny",
        REF_GCRA_DENY,
        1.0,
    ),
    (
        "fixed-window check, admit (no target)",
        "fixed_window check, admit",
        REF_GCRA_ADMIT,
        f64::NAN,
    ),
    ("try_increment", TRY_INCREMENT, REF_BOUNDED, 1.3),
    ("fenced acquire + release", FENCE_PAIR, REF_PAIR, 1.5),
];

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (url, _server) = server::url_from_env_or_start();
    let client = redis::Client::open(url.as_str())?;
    let conn = client.get_multiplexed_async_connection().await?;
    nolock::Scripts::load(&mut conn.clone()).await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn.clone())
        .await?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .to_owned();

    let rows = rows()?;
    // Warm up: create the limiters' state (and exhaust the "deny" ones).
    for row in &rows {
        (row.call)(conn.clone(), 0).await?;
    }
    let mut samples = vec![Vec::new(); rows.len()];
    for _ in 0..ROUNDS {
        for (row, samples) in rows.iter().zip(&mut samples) {
            samples.push(measure(&conn, row).await?);
        }
    }

    println!(
        "redis {version}; {CALLS} calls per row per round, {ROUNDS} rounds; \
         server time per call (INFO commandstats usec_per_call)"
    );
    println!("| operation | min µs/call | median µs/call |");
    println!("|---|---:|---:|");
    let mut medians = std::collections::HashMap::new();
    for (row, mut samples) in rows.iter().zip(samples) {
        samples.sort_by(f64::total_cmp);
        let median = samples[samples.len() / 2];
        println!("| {} | {:.2} | {median:.2} |", row.label, samples[0]);
        medians.insert(row.label.clone(), median);
    }

    println!();
    println!("| target | nolock µs | reference µs | ratio | at most | met |");
    println!("|---|---:|---:|---:|---:|---|");
    for (what, ours, reference, most) in TARGETS {
        let (ours, reference) = (medians[ours], medians[reference]);
        let ratio = ours / reference;
        let (most, met) = if most.is_nan() {
            ("—".to_owned(), "—")
        } else {
            (
                format!("{most:.1}"),
                if ratio <= most { "yes" } else { "no" },
            )
        };
        println!("| {what} | {ours:.2} | {reference:.2} | {ratio:.2} | {most} | {met} |");
    }
    Ok(())
}
