//! A bounded worker pool across processes: twelve workers, two permits.
//!
//! ```text
//! cargo run --release --example worker_pool            # own redis-server
//! REDIS_URL=redis://127.0.0.1/ cargo run --release --example worker_pool
//! ```
//!
//! Each worker loops for 5 s: it waits for a permit of the semaphore
//! `pool:exports` (2 permits, 1 s ttl, renewed every ~333 ms while the job
//! runs), runs a 600 ms job, gives the permit back, and takes 50-150 ms to
//! fetch its next job. The workers could as
//! well be twelve processes on twelve machines: the semaphore lives in Redis.
//! The example counts running jobs as it goes and prints the peak, which
//! never passes 2, and how many jobs ran.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nolock::semaphore::Semaphore;
use nolock::Backoff;

const WORKERS: usize = 12;
const PERMITS: u64 = 2;
const JOB: Duration = Duration::from_millis(600);
const TTL: Duration = Duration::from_secs(1);
const RUN: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = server::url_from_env_or_start();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    nolock::Scripts::load(&mut conn).await?;
    let key = format!("pool:exports:{}", std::process::id());

    let running = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let jobs = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (conn, key) = (conn.clone(), key.clone());
        let (running, peak, jobs) = (running.clone(), peak.clone(), jobs.clone());
        workers.push(tokio::spawn(async move {
            while start.elapsed() < RUN {
                // Wait up to the end of the run; retries are jittered and
                // never sleep past the moment a permit surely frees.
                let wait = Backoff {
                    max_delay: Duration::from_millis(100),
                    ..Backoff::new(RUN.saturating_sub(start.elapsed()))
                };
                let pool = Semaphore::new(PERMITS, TTL)?.with_wait(wait);
                let done = pool.with_permit(conn.clone(), &key, |id| {
                    let (running, peak) = (running.clone(), peak.clone());
                    async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        println!("{:>6} ms  worker {worker:>2} runs a job ({now} running, permit {})",
                            start.elapsed().as_millis(), &id.as_str()[..8]);
                        tokio::time::sleep(JOB).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .await?;
                match done {
                    nolock::Work::Done(()) => {
                        jobs.fetch_add(1, Ordering::Relaxed);
                    }
                    nolock::Work::Busy => {}
                    lost => eprintln!("worker {worker}: permit lost: {:?}", lost.loss()),
                }
                // Fetching the next job takes a moment; meanwhile the others
                // get their chance (waiters are not queued: see the docs).
                tokio::time::sleep(Duration::from_millis(fastrand::u64(50..150))).await;
            }
            Ok::<(), nolock::Error>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    println!(
        "\n{WORKERS} workers, {PERMITS} permits, {JOB:?} jobs, {RUN:?}: {} jobs ran, peak {} at once",
        jobs.load(Ordering::Relaxed),
        peak.load(Ordering::SeqCst)
    );
    Ok(())
}
