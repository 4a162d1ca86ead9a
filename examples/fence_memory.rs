//! What fences cost in server memory when every resource is locked once:
//! per-resource counters (`FenceSource::PerResource`, the default: one key
//! per resource, forever) against one counter per cluster slot
//! (`FenceSource::PerSlot`: at most 16384 keys, nothing per resource after
//! its lock).
//!
//! ```text
//! cargo run --release --example fence_memory             # 1_000_000 resources per mode
//! cargo run --release --example fence_memory -- 100000   # fewer
//! ```
//!
//! Each mode gets a throwaway `redis-server` of its own on a free port,
//! locks and releases N distinct resources (`order:<i>`) once each, with 64
//! acquire/release loops in flight over 4 multiplexed connections, and
//! prints the number of keys (`DBSIZE`) and `INFO memory`'s `used_memory`
//! before and after.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use nolock::fence::{FenceSource, Lock, LockAttempt, LockRelease};
use redis::aio::MultiplexedConnection;

const TASKS: usize = 64;
const CONNS: usize = 4;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(n) => n.replace('_', "").parse()?,
        None => 1_000_000,
    };
    println!("{n} resources locked and released once each, own redis-server per mode");
    println!(
        "{:<12} {:>10} {:>10} {:>14} {:>14} {:>12} {:>8}",
        "fences", "keys before", "keys after", "used before", "used after", "bytes/res", "seconds"
    );
    for source in [FenceSource::PerResource, FenceSource::PerSlot] {
        let server = server::RedisServer::start();
        let client = redis::Client::open(server.url().as_str())?;
        let mut conns = Vec::new();
        for _ in 0..CONNS {
            conns.push(client.get_multiplexed_async_connection().await?);
        }
        nolock::Scripts::load(&mut conns[0]).await?;
        let lock = Lock::new(Duration::from_secs(30))?.with_fence_source(source);
        let (keys_before, used_before) = memory(&mut conns[0]).await?;
        let start = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let mut conn = conns[t % CONNS].clone();
            let lock = lock.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = t;
                while i < n {
                    let resource = format!("order:{i}");
                    let LockAttempt::Acquired(grant) = lock.acquire(&mut conn, &resource).await?
                    else {
                        return Err(format!("{resource} was held").into());
                    };
                    if grant.release(&mut conn).await? != LockRelease::Released {
                        return Err(format!("{resource}: lease lost").into());
                    }
                    i += TASKS;
                }
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }));
        }
        for task in tasks {
            task.await?.map_err(|e| e.to_string())?;
        }
        let seconds = start.elapsed().as_secs_f64();
        let (keys_after, used_after) = memory(&mut conns[0]).await?;
        let per = (used_after as f64 - used_before as f64) / n as f64;
        println!(
            "{:<12} {:>10} {:>10} {:>14} {:>14} {:>12.1} {:>8.1}",
            match source {
                FenceSource::PerSlot => "per slot",
                _ => "per resource",
            },
            keys_before,
            keys_after,
            used_before,
            used_after,
            per,
            seconds
        );
    }
    Ok(())
}

/// `DBSIZE` and `used_memory` (bytes).
async fn memory(conn: &mut MultiplexedConnection) -> redis::RedisResult<(u64, u64)> {
    let keys: u64 = redis::cmd("DBSIZE").query_async(conn).await?;
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Ok((keys, used))
}
