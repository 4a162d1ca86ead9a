//! What a server killed with `kill -9` loses of what it had acknowledged,
//! with `appendfsync everysec` (the default of most managed Redis and of
//! `redis.conf` with AOF on) against `appendfsync always`, measured per
//! module: increments of a bounded counter (`limits::try_increment`, as
//! every rate limiter's state is a write of the same kind) and fences
//! (`fence::Lock`, whose counter going back hands a fence out twice).
//!
//! ```text
//! cargo run --release --example everysec_loss          # 6 kills per setting
//! cargo run --release --example everysec_loss -- 12    # more kills
//! ```
//!
//! Each round: 4 tasks increment one counter and 2 take and release one
//! fenced lock, as fast as they can, on the example's own `redis-server`
//! (AOF on, the fsync policy under test); after 300 to 1,300 ms the server
//! is killed with SIGKILL and restarted from its AOF. Lost increments are
//! those acknowledged (`admitted`) beyond the counter read after the
//! restart; fences went back by how far the first fence granted after the
//! restart is not above the highest fence acknowledged before. Each loss is
//! also given in milliseconds of that round's acknowledged write rate.
//!
//! What it found (2026-12-04, Redis 7.0.15): nothing, under either policy,
//! in 6 kills each. Redis appends each write to the AOF with `write(2)`
//! before it sends the reply, so a killed process leaves it in the kernel's
//! page cache, which the restart reads; `everysec` only decides when the
//! page cache is forced to disk, so what it risks is the machine itself
//! going down (kernel, VM, power), which a process cannot do to its own
//! host. That loss (up to about a second, two if an fsync stalls) is what
//! `fence::durability` reports and `guide::survives` lists as not covered.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nolock::fence::{Lock, LockAttempt};
use nolock::limits;

const LIMIT: u64 = 1 << 50;
const WINDOW: Duration = Duration::from_secs(3600);

/// What one round acknowledged and what survived it.
struct Round {
    ran: Duration,
    acked_increments: u64,
    stored: u64,
    acked_fence: u64,
    next_fence: u64,
}

impl Round {
    fn lost_increments(&self) -> u64 {
        self.acked_increments.saturating_sub(self.stored)
    }

    /// How far fences went back: 0 when the next grant is above every
    /// acknowledged one.
    fn fences_back(&self) -> u64 {
        (self.acked_fence + 1).saturating_sub(self.next_fence)
    }

    /// A loss in milliseconds of this round's acknowledged rate.
    fn ms(&self, lost: u64, acked: u64) -> f64 {
        if acked == 0 {
            return 0.0;
        }
        lost as f64 * self.ran.as_secs_f64() * 1e3 / acked as f64
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kills: u64 = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 6,
    };
    println!(
        "kill -9 while 4 tasks increment a counter and 2 take a fenced lock; {kills} kills per setting"
    );
    println!();
    println!("| appendfsync | round | ran ms | increments acknowledged | lost | lost as ms of writes | fences acknowledged (highest) | fences went back by | as ms of grants |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for policy in ["everysec", "always"] {
        let mut server =
            server::RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", policy]);
        let mut worst = (0u64, 0.0f64, 0u64);
        for round in 0..kills {
            let r = one_round(&mut server, round).await?;
            let (lost, back) = (r.lost_increments(), r.fences_back());
            let (lost_ms, back_ms) = (r.ms(lost, r.acked_increments), r.ms(back, r.acked_fence));
            println!(
                "| {policy} | {} | {} | {} | {lost} | {lost_ms:.0} | {} | {back} | {back_ms:.0} |",
                round + 1,
                r.ran.as_millis(),
                r.acked_increments,
                r.acked_fence,
            );
            worst = (worst.0.max(lost), worst.1.max(lost_ms), worst.2.max(back));
        }
        println!(
            "| {policy} | worst | | | {} | {:.0} | | {} | |",
            worst.0, worst.1, worst.2
        );
    }
    Ok(())
}

/// One round on `server`: load, write for a while, kill, restart, read back.
async fn one_round(
    server: &mut server::RedisServer,
    round: u64,
) -> Result<Round, Box<dyn std::error::Error>> {
    let mut conn = server.conn().await;
    nolock::Scripts::load(&mut conn).await?;
    let counter = format!("loss:{round}:counter");
    let resource = format!("loss:{round}:job");
    let lock = Lock::new(Duration::from_millis(200))?;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let fence = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (mut conn, counter, stop, acked) =
            (conn.clone(), counter.clone(), stop.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                match limits::try_increment(&mut conn, &counter, LIMIT, WINDOW).await {
                    Ok(a) if a.admitted => {
                        acked.fetch_add(1, Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => break, // the server is gone
                }
            }
        }));
    }
    for _ in 0..2 {
        let (mut conn, resource, stop, fence, lock) = (
            conn.clone(),
            resource.clone(),
            stop.clone(),
            fence.clone(),
            lock.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                match lock.acquire(&mut conn, &resource).await {
                    Ok(LockAttempt::Acquired(grant)) => {
                        fence.fetch_max(grant.fence().number(), Relaxed);
                        if grant.release(&mut conn).await.is_err() {
                            break;
                        }
                    }
                    Ok(_) => tokio::task::yield_now().await,
                    Err(_) => break,
                }
            }
        }));
    }
    // A spread of kill times, so the kill falls anywhere in the fsync second.
    let ran = Duration::from_millis(300 + (round * 373) % 1_000);
    let start = Instant::now();
    tokio::time::sleep(ran).await;
    // What was acknowledged before the kill; replies that arrive after it
    // are not counted (they may or may not have been written).
    let (acked_increments, acked_fence) = (acked.load(Relaxed), fence.load(Relaxed));
    server.kill();
    let ran = start.elapsed();
    stop.store(true, Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    server.restart();
    let mut conn = server.conn().await;
    // The count, read as nolock stores it (tagged with the counter's numbers).
    let stored = limits::peek(&mut conn, &counter).await?.count;
    // A grant made just before the kill may have survived with its lock:
    // wait out its TTL.
    let waiting = lock
        .clone()
        .with_wait(nolock::Backoff::new(Duration::from_secs(3)));
    let next_fence = match waiting.acquire(&mut conn, &resource).await? {
        LockAttempt::Acquired(grant) => {
            let n = grant.fence().number();
            let _ = grant.release(&mut conn).await?;
            n
        }
        LockAttempt::Held { .. } => return Err("the lock stayed held after the restart".into()),
    };
    Ok(Round {
        ran,
        acked_increments,
        stored,
        acked_fence,
        next_fence,
    })
}
