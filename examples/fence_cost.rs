//! What a fenced lease costs next to the bare `SET NX PX` + `DEL` lock, and
//! what an acknowledged grant (`Lock::acknowledged(1, ..)`,
//! `Semaphore::acknowledged(1, ..)`: `WAIT 1` in the acquire's round trip)
//! adds on a primary with one replica, to a lock and to a semaphore.
//!
//! ```text
//! cargo run --release --example fence_cost            # own redis-server, 5000 pairs
//! cargo run --release --example fence_cost -- 20000   # more pairs
//! REDIS_URL=redis://127.0.0.1/ cargo run --release --example fence_cost
//! ```
//!
//! Each row is taken and given back in turn on one connection, in
//! alternating blocks so that all see the same machine. Per pair it reports
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
    let plain_semaphore = nolock::semaphore::Semaphore::new(1, TTL)?;
    let acked_semaphore = plain_semaphore
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
    let mut rows = vec![
        Row::new("Lock::acquire + Grant::release", Pair::Fenced(&plain_lock)),
        Row::new("  acknowledged(1), 1 replica", Pair::Fenced(&acked_lock)),
        Row::new(
            "Semaphore::acquire + release",
            Pair::Permit(&plain_semaphore),
        ),
        Row::new(
            "  acknowledged(1), 1 replica",
            Pair::Permit(&acked_semaphore),
        ),
        Row::new("SET NX PX + DEL", Pair::Plain),
    ];
    if replica.is_none() {
        rows.retain(|row| !row.name.contains("acknowledged"));
    }
    // Warm up every path (connection, script cache, allocator).
    for row in &rows {
        for _ in 0..200 {
            row.pair.run(&mut conn, &resource).await?;
        }
    }
    // In alternating blocks, so that every row sees the same machine.
    let mut done = 0;
    while done < pairs {
        let n = BLOCK.min(pairs - done);
        for row in &mut rows {
            let commands = row.pair.commands();
            let before = Stats::read(&mut conn, commands).await?;
            for _ in 0..n {
                let start = Instant::now();
                row.pair.run(&mut conn, &resource).await?;
                row.times.push(start.elapsed());
            }
            let after = Stats::read(&mut conn, commands).await?;
            row.stats.add(&after.minus(&before));
        }
        done += n;
    }
    let _: () = redis::cmd("DEL")
        .arg(nolock::keys::derive(&resource, "fence"))
        .query_async(&mut conn)
        .await?;

    println!(
        "{pairs} take/give-back pairs on one connection, Redis {version}, {}",
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
    for row in &mut rows {
        report(row.name, &mut row.times, &row.stats, pairs);
    }
    if replica.is_none() {
        println!("  (acknowledged grants: run without REDIS_URL, which attaches a replica)");
    }
    Ok(())
}

/// One measured row: what it runs, and what it measured.
struct Row<'a> {
    name: &'static str,
    pair: Pair<'a>,
    times: Vec<Duration>,
    stats: Stats,
}

impl<'a> Row<'a> {
    fn new(name: &'static str, pair: Pair<'a>) -> Self {
        Row {
            name,
            pair,
            times: Vec::new(),
            stats: Stats::default(),
        }
    }
}

/// A take and a give-back.
enum Pair<'a> {
    Fenced(&'a nolock::fence::Lock),
    Permit(&'a nolock::semaphore::Semaphore),
    Plain,
}

impl Pair<'_> {
    async fn run(
        &self,
        conn: &mut MultiplexedConnection,
        resource: &str,
    ) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Pair::Fenced(lock) => fenced_pair(conn, lock, resource).await?,
            Pair::Permit(semaphore) => {
                let key = format!("{resource}:permits");
                permit_pair(conn, semaphore, &key).await?
            }
            Pair::Plain => plain_pair(conn, &format!("{resource}:plain")).await?,
        }
        Ok(())
    }

    fn commands(&self) -> &'static [&'static str] {
        match self {
            Pair::Plain => PLAIN_COMMANDS,
            _ => SCRIPT_COMMANDS,
        }
    }
}

async fn permit_pair(
    conn: &mut MultiplexedConnection,
    semaphore: &nolock::semaphore::Semaphore,
    key: &str,
) -> nolock::Result<()> {
    let nolock::semaphore::PermitAttempt::Acquired(permit) = semaphore.acquire(conn, key).await?
    else {
        panic!("{key} is full");
    };
    assert_eq!(
        permit.release(conn).await?,
        nolock::semaphore::PermitRelease::Released
    );
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
