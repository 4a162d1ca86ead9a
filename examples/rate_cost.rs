//! Server time per call of each rate script, beside a bare `INCR`.
//!
//! For each row: `CONFIG RESETSTAT`, 10 000 calls (16 tasks on one
//! multiplexed connection), then `usec_per_call` of the command from
//! `INFO commandstats`: the time Redis spent running it, network excluded.
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
use std::time::Duration;

use nolock::rate::{Algorithm, Limiter, MultiLimiter, Quota};
use redis::aio::MultiplexedConnection;

const CALLS: usize = 10_000;
const TASKS: usize = 16;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Runs `call` CALLS times over TASKS tasks, then reads `usec_per_call` of `cmd`.
async fn measure<F, Fut>(conn: &MultiplexedConnection, cmd: &str, call: F) -> Result<f64, Error>
where
    F: Fn(MultiplexedConnection) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), Error>> + Send,
{
    let mut admin = conn.clone();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut admin)
        .await?;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (conn, call) = (conn.clone(), call.clone());
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
    let needle = format!("cmdstat_{cmd}:");
    let line = info
        .lines()
        .find(|l| l.starts_with(&needle))
        .ok_or_else(|| format!("no {cmd} in INFO commandstats"))?;
    let calls: usize = field(line, "calls=").parse()?;
    if calls != CALLS / TASKS * TASKS {
        return Err(format!("{cmd}: {calls} calls counted").into());
    }
    Ok(field(line, "usec_per_call=").parse()?)
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split([':', ','])
        .find_map(|part| part.strip_prefix(name))
        .unwrap_or("")
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
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn.clone())
        .await?;
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .to_owned();

    println!("redis {version}, {CALLS} calls per row, server time per call (INFO commandstats usec_per_call)");
    println!("{:<52} {:>8}", "operation", "µs/call");

    let incr = measure(&conn, "incr", |mut c| async move {
        redis::cmd("INCR")
            .arg("rate_cost:incr")
            .query_async::<i64>(&mut c)
            .await?;
        Ok(())
    })
    .await?;
    println!("{:<52} {incr:>8.2}", "INCR (baseline)");

    // The foundation's bounded counter, for comparison with DESIGN.md's figures.
    let counter = measure(&conn, "evalsha", |mut c| async move {
        let _ = nolock::limits::try_increment(
            &mut c,
            "rate_cost:counter",
            u64::MAX >> 11,
            Duration::from_secs(3600),
        )
        .await?;
        Ok(())
    })
    .await?;
    println!(
        "{:<52} {counter:>8.2}",
        "limits::try_increment (bounded counter)"
    );

    // Nothing is ever denied: 10^6 per second with a burst of 10^6.
    let roomy = Quota::per_second(1_000_000)?;
    // Exhausted after the first call.
    let tight = Quota::per_hour(1)?;
    for algorithm in Algorithm::ALL {
        for (label, quota) in [("admit", roomy), ("deny", tight)] {
            let limiter = Limiter::new(algorithm, quota)?;
            let key = format!("rate_cost:{algorithm}:{label}");
            let _ = limiter.check(&mut conn.clone(), &key, 1).await?;
            let usec = measure(&conn, "evalsha", move |mut c| {
                let (limiter, key) = (limiter.clone(), key.clone());
                async move {
                    let _ = limiter.check(&mut c, &key, 1).await?;
                    Ok(())
                }
            })
            .await?;
            println!("{:<52} {usec:>8.2}", format!("{algorithm} check, {label}"));
        }
    }

    let limiter = Limiter::new(Algorithm::Gcra, roomy)?;
    let usec = measure(&conn, "evalsha_ro", move |mut c| {
        let limiter = limiter.clone();
        async move {
            let _ = limiter.peek(&mut c, "rate_cost:peek", 1).await?;
            Ok(())
        }
    })
    .await?;
    println!("{:<52} {usec:>8.2}", "gcra peek");

    for algorithm in [Algorithm::Gcra, Algorithm::SlidingWindow] {
        let limits = MultiLimiter::new(algorithm)
            .limit("second", Quota::per(1_000_000, Duration::from_secs(1))?)?
            .limit("minute", Quota::per(10_000_000, Duration::from_secs(60))?)?
            .limit("hour", Quota::per(100_000_000, Duration::from_secs(3600))?)?;
        let usec = measure(&conn, "evalsha", move |mut c| {
            let limits = limits.clone();
            async move {
                let key = format!("rate_cost:multi:{}", limits.algorithm());
                let _ = limits.check(&mut c, &key, &[], 1).await?;
                Ok(())
            }
        })
        .await?;
        println!(
            "{:<52} {usec:>8.2}",
            format!("{algorithm} multi-limit check, 3 limits, admit")
        );
    }
    Ok(())
}
