//! What a fenced lease costs next to the bare `SET NX PX` + `DEL` lock, and
//! what an acknowledged grant (`Lock::acknowledged(1, ..)`: `WAIT 1` in the
//! acquire's round trip) adds on a primary with one replica.
//!
//! ```text
//! cargo run --release --example fence_cost            # own redis-server, 5000 pairs
//! cargo run --release --example fence_cost -- 20000   # more pairs
//! REDIS_URL=redis://127.0.0.1/ cargo run --release --example fence_cost
//! ```
//!
//! Both locks are taken and released in turn on one connection, in
//! alternating blocks so that both see the same machine. Per pair it reports
//! the round trips (commands the client sent, from `INFO commandstats`), the
//! client-side time (mean, p50, p99) and the server time (`usec_per_call`).
//! The acknowledged row runs only on the example's own server, to which it
//! attaches a replica on loopback (its `WAIT` is pipelined with the script,
//! so it adds no round trip; it adds the replica's confirmation time).

#[path = "../tests/support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use nolock::fence::{LockAttempt, LockRelease};
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(30);
const BLOCK: usize = 500;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pairs: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 5_000,
    };
    let (url, server) = server::url_from_env_or_start();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    // A replica for the acknowledged grants, on the example's own server.
    let replica = match &server {
        Some(primary) => {
            let port = primary.port.to_string();
            let replica = server::RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
            let start = Instant::now();
            loop {
                let acked: i64 = redis::cmd("WAIT")
                    .arg(1)
                    .arg(100)
                    .query_async(&mut conn)
                    .await?;
                if acked == 1 {
                    break;
                }
                if start.elapsed() > Duration::from_secs(10) {
                    return Err("the replica never synced".into());
                }
            }
            Some(replica)
        }
        None => None,
    };
    let plain_lock = nolock::fence::Lock::new(TTL)?;
    let acked_lock = plain_lock
        .clone()
        .acknowledged(1, Duration::from_millis(500))?;
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .to_owned();
    nolock::Scripts::load(&mut conn).await?;

    let resource = format!("nolock-fence-cost:{}", std::process::id());
    let plain_key = format!("{resource}:plain");
    // Warm up both paths (connection, script cache, allocator).
    for _ in 0..200 {
        fenced_pair(&mut conn, &plain_lock, &resource).await?;
        plain_pair(&mut conn, &plain_key).await?;
    }

    let mut fenced = Vec::with_capacity(pairs);
    let mut acked = Vec::with_capacity(pairs);
    let mut plain = Vec::with_capacity(pairs);
    let mut fenced_stats = Stats::default();
    let mut acked_stats = Stats::default();
    let mut plain_stats = Stats::default();
    let mut done = 0;
    while done < pairs {
        let n = BLOCK.min(pairs - done);
        let before = Stats::read(&mut conn, SCRIPT_COMMANDS).await?;
        for _ in 0..n {
            let start = Instant::now();
            fenced_pair(&mut conn, &plain_lock, &resource).await?;
            fenced.push(start.elapsed());
        }
        fenced_stats.add(
            &Stats::read(&mut conn, SCRIPT_COMMANDS)
                .await?
                .minus(&before),
        );
        if replica.is_some() {
            let before = Stats::read(&mut conn, SCRIPT_COMMANDS).await?;
            for _ in 0..n {
                let start = Instant::now();
                fenced_pair(&mut conn, &acked_lock, &resource).await?;
                acked.push(start.elapsed());
            }
            acked_stats.add(
                &Stats::read(&mut conn, SCRIPT_COMMANDS)
                    .await?
                    .minus(&before),
            );
        }
        let before = Stats::read(&mut conn, PLAIN_COMMANDS).await?;
        for _ in 0..n {
            let start = Instant::now();
            plain_pair(&mut conn, &plain_key).await?;
            plain.push(start.elapsed());
        }
        plain_stats.add(&Stats::read(&mut conn, PLAIN_COMMANDS).await?.minus(&before));
        done += n;
    }
    let _: () = redis::cmd("DEL")
        .arg(nolock::keys::derive(&resource, "fence"))
        .query_async(&mut conn)
        .await?;

    println!(
        "{pairs} lock/unlock pairs on one connection, Redis {version}, {}",
        if server.is_some() {
            "own redis-server on loopback"
        } else {
            url.as_str()
        }
    );
    println!(
        "{:<34} {:>12} {:>10} {:>10} {:>10} {:>16}",
        "pair", "round trips", "mean us", "p50 us", "p99 us", "server us/pair"
    );
    report(
        "Lock::acquire + Grant::release",
        &mut fenced,
        &fenced_stats,
        pairs,
    );
    if replica.is_some() {
        report(
            "  acknowledged(1), 1 replica",
            &mut acked,
            &acked_stats,
            pairs,
        );
    } else {
        println!("  (acknowledged grants: run without REDIS_URL, which attaches a replica)");
    }
    report("SET NX PX + DEL", &mut plain, &plain_stats, pairs);
    Ok(())
}

async fn fenced_pair(
    conn: &mut MultiplexedConnection,
    lock: &nolock::fence::Lock,
    resource: &str,
) -> nolock::Result<()> {
    let LockAttempt::Acquired(grant) = lock.acquire(conn, resource).await? else {
        panic!("{resource} is held by someone else");
    };
    assert_eq!(grant.release(conn).await?, LockRelease::Released);
    Ok(())
}

async fn plain_pair(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<()> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg("token")
        .arg("NX")
        .arg("PX")
        .arg(TTL.as_millis() as u64)
        .query_async(conn)
        .await?;
    assert!(set.is_some(), "{key} is held by someone else");
    let deleted: i64 = redis::cmd("DEL").arg(key).query_async(conn).await?;
    assert_eq!(deleted, 1);
    Ok(())
}

/// The commands each pair sends. Only these are counted: commands that a
/// script runs inside (its SET, DEL, ...) also show in `INFO commandstats`,
/// but they are neither round trips nor extra server time (the script's own
/// `usec` already includes them).
const SCRIPT_COMMANDS: &[&str] = &["evalsha", "eval"];
const PLAIN_COMMANDS: &[&str] = &["set", "del"];

/// Calls and server microseconds of some commands, from `INFO commandstats`.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    calls: u64,
    usec: u64,
}

impl Stats {
    async fn read(
        conn: &mut MultiplexedConnection,
        commands: &[&str],
    ) -> redis::RedisResult<Stats> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        let mut stats = Stats::default();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if !commands.contains(&name) {
                continue;
            }
            for field in rest.split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => stats.calls += v.parse::<u64>().unwrap_or(0),
                    Some(("usec", v)) => stats.usec += v.parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
        Ok(stats)
    }

    fn minus(&self, earlier: &Stats) -> Stats {
        Stats {
            calls: self.calls - earlier.calls,
            usec: self.usec - earlier.usec,
        }
    }

    fn add(&mut self, other: &Stats) {
        self.calls += other.calls;
        self.usec += other.usec;
    }
}

fn report(name: &str, times: &mut [Duration], stats: &Stats, pairs: usize) {
    times.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = times.iter().map(|&d| us(d)).sum::<f64>() / times.len() as f64;
    let p50 = us(times[times.len() / 2]);
    let p99 = us(times[times.len() * 99 / 100]);
    println!(
        "{:<34} {:>12.2} {:>10.1} {:>10.1} {:>10.1} {:>16.2}",
        name,
        stats.calls as f64 / pairs as f64,
        mean,
        p50,
        p99,
        stats.usec as f64 / pairs as f64
    );
}
