//! Fair (FIFO) waiting against today's wake-up, side by side in one run:
//! how often a waiter is passed over, the handoff latency and the
//! throughput, with 16 and 64 waiters on one lock.
//!
//! ```text
//! cargo run --release --example fair_wait            # own redis-server, 3 s per cell
//! cargo run --release --example fair_wait -- 5       # 5 s per cell
//! REDIS_URL=redis://127.0.0.1/ cargo run --release --example fair_wait
//! ```
//!
//! Each waiter loops for the cell's duration: it wants the lock (a fresh
//! token), holds it about 1 ms (a 1 ms sleep), releases it and wants it
//! again at once. A request **arrives** when its first attempt returns
//! (the lock was held, so from then on it waits); it is **passed over**
//! once for every request that was sent after it arrived and was granted
//! before it. A **handoff** is the time from the release being sent to
//! the next grant being answered (both on this machine's clock).
//! Throughput counts grants per second. The ways of waiting:
//!
//! * `Waiters::acquire` (today): woken by the release's `PUBLISH`, one
//!   waiter per process, whoever asks first gets the lock.
//! * `Waiters::acquire`, `Lock::fair`: the release names the first in line,
//!   only that waiter is woken, and only it can be granted.
//! * `Lock::with_wait` and the same `.fair()`: no pub/sub, backoff polling
//!   (jittered, 10 ms doubling to 100 ms here).
//!
//! Then the same for a semaphore of 3 (`Semaphore::with_wait`, today and
//! `.fair()`, polling; and `Waiters::acquire_permit` with `.fair()`, woken
//! by name by the releases), whose
//! waiters want 1 or 2 permits (every third waiter 2). There, a request is
//! passed over once for every request sent after it arrived whose grant
//! was answered before its own: with `.fair()` such a later request only
//! ever took permits left over beside everyone ahead of it (the checker of
//! `tests/semaphore_fair.rs` proves that on the server's times), so those
//! counts are grants answered in another order, not permits taken; today
//! they include real overtakes. A handoff is the time from the last
//! release sent before a waiting request's grant to that grant.
//!
//! Script calls per grant (attempts, releases) come from `nolock::stats()`.
//! Timings are printed, never asserted.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{AcquireLock, Lock, LockAttempt, Token, Waiters};
use nolock::semaphore::{AcquirePermit, PermitAttempt, PermitId, Semaphore};
use nolock::{Backoff, Batch};
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(10);
const HOLD: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    Waiters,
    WaitersFair,
    Polling,
    PollingFair,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Waiters => "Waiters::acquire (today)",
            Way::WaitersFair => "Waiters::acquire, fair",
            Way::Polling => "Lock::with_wait (today)",
            Way::PollingFair => "Lock::with_wait, fair",
        }
    }

    fn lock(self) -> Lock {
        let lock = Lock::new(TTL).expect("a valid ttl").with_wait(Backoff {
            max_delay: Duration::from_millis(100),
            ..Backoff::new(Duration::from_secs(120))
        });
        match self {
            Way::WaitersFair | Way::PollingFair => lock.fair(),
            Way::Waiters | Way::Polling => lock,
        }
    }
}

/// One request, as its waiter saw it.
#[derive(Clone, Copy, Debug)]
struct Request {
    sent: Instant,
    arrived: Instant,
    fence: u64,
    granted: Instant,
    released: Instant,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args().nth(1).map_or(Ok(3), |n| n.parse())?;
    let (url, _server) = server::url_from_env_or_start();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _ = nolock::Scripts::load(&mut conn).await?;
    let wake = Waiters::new(&client).await?;
    println!(
        "one lock, each holder holds ~{HOLD:?} and wants it again at once; {seconds} s per row"
    );
    println!(
        "| way of waiting | waiters | grants/s | max passed over | requests passed over | handoff p50 | handoff p99 | script calls per grant |\n|---|---|---|---|---|---|---|---|"
    );
    for waiters in [16, 64] {
        for way in [
            Way::Waiters,
            Way::WaitersFair,
            Way::Polling,
            Way::PollingFair,
        ] {
            let calls_before = nolock::stats().calls;
            let started = Instant::now();
            let requests = run(&client, &wake, way, waiters, Duration::from_secs(seconds)).await?;
            let elapsed = started.elapsed();
            let calls = nolock::stats().calls - calls_before;
            report(way, waiters, &requests, elapsed, calls);
        }
    }
    println!();
    println!(
        "one semaphore of 3, weights 1 and 2, each holder holds ~{HOLD:?}; {seconds} s per row"
    );
    println!(
        "| way of waiting | waiters | grants/s | max passed over | requests passed over | handoff p50 | handoff p99 | script calls per grant |\n|---|---|---|---|---|---|---|---|"
    );
    for waiters in [16, 64] {
        for (fair, woken) in [(false, false), (true, false), (true, true)] {
            let calls_before = nolock::stats().calls;
            let started = Instant::now();
            let woken = woken.then_some(&wake);
            let requests =
                run_semaphore(&client, woken, fair, waiters, Duration::from_secs(seconds)).await?;
            let elapsed = started.elapsed();
            let calls = nolock::stats().calls - calls_before;
            report_semaphore(fair, woken.is_some(), waiters, &requests, elapsed, calls);
        }
    }
    Ok(())
}

async fn run_semaphore(
    client: &redis::Client,
    woken: Option<&Waiters>,
    fair: bool,
    waiters: usize,
    duration: Duration,
) -> Result<Vec<Request>, Box<dyn std::error::Error>> {
    let key = format!(
        "nolock-fair-wait:{}:sem:{fair}:{waiters}",
        std::process::id()
    );
    let semaphore = Semaphore::new(3, TTL)?.with_wait(Backoff {
        max_delay: Duration::from_millis(100),
        ..Backoff::new(Duration::from_secs(120))
    });
    let semaphore = if fair { semaphore.fair() } else { semaphore };
    let mut conns: Vec<MultiplexedConnection> = Vec::new();
    for _ in 0..4 {
        conns.push(client.get_multiplexed_async_connection().await?);
    }
    let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for w in 0..waiters {
        let (semaphore, key, requests) = (semaphore.clone(), key.clone(), requests.clone());
        let woken = woken.cloned();
        let weight = if w % 3 == 0 { 2 } else { 1 };
        let mut conn = conns[w % conns.len()].clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let id = PermitId::random()?;
                let sent = Instant::now();
                let mut batch = Batch::new();
                batch.push(AcquirePermit::with_id(&semaphore, &key, &id, weight)?);
                let first = batch.run(&mut conn).await.pop().expect("one reply")?;
                let arrived = Instant::now();
                let permit = match first {
                    PermitAttempt::Acquired(permit) => permit,
                    PermitAttempt::Full { .. } => {
                        let outcome = match &woken {
                            Some(wake) => {
                                wake.acquire_permit(&mut conn, &semaphore, &key, &id, weight)
                                    .await?
                            }
                            None => semaphore.acquire_as(&mut conn, &key, &id, weight).await?,
                        };
                        match outcome {
                            PermitAttempt::Acquired(permit) => permit,
                            PermitAttempt::Full { .. } => continue, // gave up (not expected)
                        }
                    }
                };
                let granted = Instant::now();
                tokio::time::sleep(HOLD).await;
                let released = Instant::now();
                let _ = permit.release(&mut conn).await?;
                requests.lock().expect("not poisoned").push(Request {
                    sent,
                    arrived,
                    fence: 0,
                    granted,
                    released,
                });
            }
            Ok::<(), nolock::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let mut requests = std::mem::take(&mut *requests.lock().expect("not poisoned"));
    requests.sort_by_key(|r| r.granted);
    Ok(requests)
}

fn report_semaphore(
    fair: bool,
    woken: bool,
    waiters: usize,
    requests: &[Request],
    elapsed: Duration,
    calls: u64,
) {
    let mut max_passed = 0usize;
    let mut passed_requests = 0usize;
    for (i, a) in requests.iter().enumerate() {
        let passed = requests[..i].iter().filter(|b| b.sent > a.arrived).count();
        max_passed = max_passed.max(passed);
        if passed > 0 {
            passed_requests += 1;
        }
    }
    let mut releases: Vec<Instant> = requests.iter().map(|r| r.released).collect();
    releases.sort_unstable();
    let mut handoffs: Vec<Duration> = requests
        .iter()
        .filter(|r| r.granted > r.arrived)
        .filter_map(|r| {
            let before = releases.partition_point(|&t| t < r.granted);
            let last = *releases.get(before.checked_sub(1)?)?;
            (last > r.arrived).then(|| r.granted - last)
        })
        .collect();
    handoffs.sort_unstable();
    let pct = |p: f64| {
        handoffs
            .get(((handoffs.len().saturating_sub(1)) as f64 * p).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "| {}{} | {waiters} | {:.0} | {max_passed} | {passed_requests} of {} | {:.2} ms | {:.2} ms | {:.1} |",
        if woken { "Waiters::acquire_permit" } else { "Semaphore::with_wait" },
        if fair { ", fair" } else { " (today)" },
        requests.len() as f64 / elapsed.as_secs_f64(),
        requests.len(),
        pct(0.5),
        pct(0.99),
        calls as f64 / requests.len().max(1) as f64,
    );
}

async fn run(
    client: &redis::Client,
    wake: &Waiters,
    way: Way,
    waiters: usize,
    duration: Duration,
) -> Result<Vec<Request>, Box<dyn std::error::Error>> {
    let resource = format!("nolock-fair-wait:{}:{way:?}:{waiters}", std::process::id());
    let lock = way.lock();
    let mut conns: Vec<MultiplexedConnection> = Vec::new();
    for _ in 0..4 {
        conns.push(client.get_multiplexed_async_connection().await?);
    }
    let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for w in 0..waiters {
        let (lock, wake, resource, requests) = (
            lock.clone(),
            wake.clone(),
            resource.clone(),
            requests.clone(),
        );
        let mut conn = conns[w % conns.len()].clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let token = Token::random()?;
                let sent = Instant::now();
                let mut batch = Batch::new();
                batch.push(AcquireLock::with_token(&lock, &resource, &token)?);
                let first = batch.run(&mut conn).await.pop().expect("one reply")?;
                let arrived = Instant::now();
                let grant = match first {
                    LockAttempt::Acquired(grant) => grant,
                    LockAttempt::Held { .. } => {
                        let outcome = match way {
                            Way::Waiters | Way::WaitersFair => {
                                wake.acquire_as(&mut conn, &lock, &resource, &token).await?
                            }
                            Way::Polling | Way::PollingFair => {
                                lock.acquire_as(&mut conn, &resource, &token).await?
                            }
                        };
                        match outcome {
                            LockAttempt::Acquired(grant) => grant,
                            LockAttempt::Held { .. } => continue, // gave up (not expected)
                        }
                    }
                };
                let granted = Instant::now();
                tokio::time::sleep(HOLD).await;
                let released = Instant::now();
                let fence = grant.fence().number();
                let _ = grant.release(&mut conn).await?;
                requests.lock().expect("not poisoned").push(Request {
                    sent,
                    arrived,
                    fence,
                    granted,
                    released,
                });
            }
            Ok::<(), nolock::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let mut requests = std::mem::take(&mut *requests.lock().expect("not poisoned"));
    requests.sort_by_key(|r| r.fence);
    Ok(requests)
}

fn report(way: Way, waiters: usize, requests: &[Request], elapsed: Duration, calls: u64) {
    // Passed over: requests sent after this one arrived and granted before
    // it (a smaller fence: grants of one lock are ordered by their fences).
    let mut max_passed = 0usize;
    let mut passed_requests = 0usize;
    for (i, a) in requests.iter().enumerate() {
        let passed = requests[..i].iter().filter(|b| b.sent > a.arrived).count();
        max_passed = max_passed.max(passed);
        if passed > 0 {
            passed_requests += 1;
        }
    }
    let mut handoffs: Vec<Duration> = requests
        .windows(2)
        .filter(|w| w[1].granted > w[0].released)
        .map(|w| w[1].granted - w[0].released)
        .collect();
    handoffs.sort_unstable();
    let pct = |p: f64| {
        handoffs
            .get(((handoffs.len().saturating_sub(1)) as f64 * p).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "| {} | {waiters} | {:.0} | {max_passed} | {passed_requests} of {} | {:.2} ms | {:.2} ms | {:.1} |",
        way.name(),
        requests.len() as f64 / elapsed.as_secs_f64(),
        requests.len(),
        pct(0.5),
        pct(0.99),
        calls as f64 / requests.len().max(1) as f64,
    );
}
