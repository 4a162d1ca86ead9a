//! Server time per call of each rate script, beside a bare `INCR`.
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

#[path = "../tests/support/server.rs"]
mod server;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nolock::rate::{Algorithm, Limiter, MultiLimiter, Quota};
use redis::aio::MultiplexedConnection;

const CALLS: usize = 10_000;
const TASKS: usize = 16;
const ROUNDS: usize = 5;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Call = Arc<
    dyn Fn(MultiplexedConnection) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>
        + Send
        + Sync,
>;

/// One line of the table: what is measured, the command it shows up as in
/// `INFO commandstats`, and one call of it.
struct Row {
    label: String,
    command: &'static str,
    call: Call,
}

fn row<F, Fut>(label: impl Into<String>, command: &'static str, call: F) -> Row
where
    F: Fn(MultiplexedConnection) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    Row {
        label: label.into(),
        command,
        call: Arc::new(move |conn| Box::pin(call(conn))),
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
    for _ in 0..TASKS {
        let (conn, call) = (conn.clone(), row.call.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..CALLS / TASKS {
                call(conn.clone()).await?;
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
    if calls != CALLS / TASKS * TASKS {
        return Err(format!("{}: {calls} calls counted", row.label).into());
    }
    Ok(field(line, "usec_per_call=").parse()?)
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
                    let _ = limits.check(&mut c, &key, &[], 1).await?;
                    Ok(())
                }
            },
        ));
    }
    Ok(rows)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (None, url),
        _ => {
            let server = server::RedisServer::start();
            let url = server.url();
            (Some(server), url)
        }
    };
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
        (row.call)(conn.clone()).await?;
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
    for (row, mut samples) in rows.iter().zip(samples) {
        samples.sort_by(f64::total_cmp);
        println!(
            "| {} | {:.2} | {:.2} |",
            row.label,
            samples[0],
            samples[samples.len() / 2]
        );
    }
    Ok(())
}
