//! How long a released lock stays idle while waiters sleep: the handoff time
//! from one holder's release to the next grant, with 64 waiters, for four
//! ways of waiting, in one run.
//!
//! ```text
//! cargo run --release --example handoff              # own redis-server, 64 waiters, 5 rounds
//! cargo run --release --example handoff -- 128 3     # 128 waiters, 3 rounds
//! REDIS_URL=redis://127.0.0.1/ cargo run --release --example handoff
//! ```
//!
//! In each round, every waiter wants the lock once (TTL 10 s, so no lock
//! expires), holds it 2 ms and releases it. A handoff is the time from a
//! release to the next grant, both taken on this machine's clock. The ways
//! of waiting, all taking the lock with `Lock::acquire`:
//!
//! * `backoff (before)`: what waiting acquires did before: a sleep
//!   uniform in `[0, min(10 ms × 2^n, 500 ms)]` after the n-th attempt.
//! * `fixed (rslock)`: a sleep uniform in `[0, 200 ms)` after every attempt,
//!   the default retry of the rslock crate (`retry_delay` 200 ms).
//! * `Lock::with_wait`: today's: the same backoff, never past the lock's
//!   expiry (here the expiry is far, so it should match `before`).
//! * `Waiters::acquire`: woken by the release's `PUBLISH`, one waiter per
//!   process; the expiry (capped at 500 ms) only as a fallback.
//!
//! Attempts per grant counts script calls (acquire attempts and the one
//! release) per grant, from `nolock::stats()`: the load the waiting puts on
//! Redis. Timings are printed, never asserted.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{Grant, Lock, LockAttempt, LockRelease, Waiters};
use nolock::Backoff;
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(10);
const HOLD: Duration = Duration::from_millis(2);
const PATIENCE: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug)]
enum Way {
    BackoffBefore,
    FixedRslock,
    AcquireWithRetry,
    Waiters,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::BackoffBefore => "backoff (before)",
            Way::FixedRslock => "fixed 0-200 ms (rslock)",
            Way::AcquireWithRetry => "Lock::with_wait",
            Way::Waiters => "Waiters::acquire",
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let waiters: usize = args.next().map_or(Ok(64), |n| n.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |n| n.parse())?;
    let (url, _server) = server::url_from_env_or_start();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _ = nolock::Scripts::load(&mut conn).await?;
    let wake = Waiters::new(&client).await?;

    println!(
        "{waiters} waiters, {rounds} rounds, hold {HOLD:?}, ttl {TTL:?}; handoff = release -> next grant"
    );
    println!(
        "| way of waiting | handoffs | p50 | p99 | max | script calls per grant |\n|---|---|---|---|---|---|"
    );
    for way in [
        Way::BackoffBefore,
        Way::FixedRslock,
        Way::AcquireWithRetry,
        Way::Waiters,
    ] {
        let mut handoffs = Vec::new();
        let calls_before = nolock::stats().calls;
        for round in 0..rounds {
            let resource = format!("nolock-handoff:{}:{way:?}:{round}", std::process::id());
            handoffs.extend(run_round(&client, &wake, &resource, waiters, way).await?);
        }
        let calls = nolock::stats().calls - calls_before;
        handoffs.sort_unstable();
        let pct = |p: f64| handoffs[((handoffs.len() - 1) as f64 * p).round() as usize];
        println!(
            "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} |",
            way.name(),
            handoffs.len(),
            ms(pct(0.50)),
            ms(pct(0.99)),
            ms(*handoffs.last().unwrap_or(&Duration::ZERO)),
            calls as f64 / (waiters * rounds) as f64,
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One round: every waiter takes the lock once. Returns the handoff times.
async fn run_round(
    client: &redis::Client,
    wake: &Waiters,
    resource: &str,
    waiters: usize,
    way: Way,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    // (granted, released) per holder, on the local clock.
    let spans: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let conn = client.get_multiplexed_async_connection().await?;
    let mut tasks = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        let (mut conn, wake, spans) = (conn.clone(), wake.clone(), Arc::clone(&spans));
        let resource = resource.to_owned();
        tasks.push(tokio::spawn(async move {
            let grant = wait(&mut conn, &wake, &resource, way).await?;
            let granted = Instant::now();
            tokio::time::sleep(HOLD).await;
            let released = Instant::now();
            if grant.release(&mut conn).await? != LockRelease::Released {
                return Err(nolock::Error::InvalidArgument {
                    what: "hold",
                    reason: "lock lost while held".into(),
                });
            }
            spans.lock().unwrap().push((granted, released));
            Ok::<(), nolock::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let mut spans = spans.lock().unwrap().clone();
    spans.sort_unstable();
    Ok(spans
        .windows(2)
        .map(|w| w[1].0.saturating_duration_since(w[0].1))
        .collect())
}

async fn wait(
    conn: &mut MultiplexedConnection,
    wake: &Waiters,
    resource: &str,
    way: Way,
) -> nolock::Result<Grant> {
    let held = || nolock::Error::InvalidArgument {
        what: "patience",
        reason: "still held after 120 s".into(),
    };
    let once = Lock::new(TTL)?;
    let waiting = once.clone().with_wait(Backoff::new(PATIENCE));
    match way {
        Way::AcquireWithRetry => waiting
            .acquire(conn, resource)
            .await?
            .acquired()
            .ok_or_else(held),
        Way::Waiters => wake
            .acquire(conn, &waiting, resource)
            .await?
            .acquired()
            .ok_or_else(held),
        Way::BackoffBefore | Way::FixedRslock => {
            let start = Instant::now();
            for attempt in 0u32.. {
                if let LockAttempt::Acquired(grant) = once.acquire(conn, resource).await? {
                    return Ok(grant);
                }
                if start.elapsed() > PATIENCE {
                    break;
                }
                let cap = match way {
                    Way::BackoffBefore => Duration::from_millis(10)
                        .saturating_mul(1 << attempt.min(20))
                        .min(Duration::from_millis(500)),
                    _ => Duration::from_millis(200),
                };
                let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
                tokio::time::sleep(Duration::from_nanos(fastrand::u64(0..=nanos))).await;
            }
            Err(held())
        }
    }
}
