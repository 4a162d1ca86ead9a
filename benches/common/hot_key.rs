//! One limit shared by every task (and by four "processes", each with its
//! own connection): one script call per decision ([`Limiter::check`])
//! against [`Reservoir`] batches, for decisions per second, Redis calls
//! per decision, and over-admission counted against the server clock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nolock::rate::{Algorithm, Limiter, Quota, Reservoir};

use super::conn::{connect, Counted};
use super::Result;

/// Tasks drawing from the limit, in all.
pub const TASKS: usize = 64;
/// How long each run lasts.
pub const LENGTH: Duration = Duration::from_millis(1000);
/// A reservoir's largest batch and how long it holds unused units.
pub const MAX_BATCH: u64 = 1_000;
pub const HOLD: Duration = Duration::from_millis(100);

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct HotRun {
    pub label: String,
    pub decisions: u64,
    pub admitted: u64,
    pub redis_calls: u64,
    pub seconds: f64,
    /// The limit's bound over the run by the server clock: burst +
    /// elapsed / T.
    pub bound: u64,
}

impl HotRun {
    pub fn per_second(&self) -> f64 {
        self.decisions as f64 / self.seconds
    }

    pub fn calls_per_decision(&self) -> f64 {
        self.redis_calls as f64 / self.decisions.max(1) as f64
    }

    pub fn over_admitted(&self) -> u64 {
        self.admitted.saturating_sub(self.bound)
    }
}

async fn server_micros(client: &redis::Client) -> Result<u64> {
    let mut conn = connect(client).await?;
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    Ok(s * 1_000_000 + us)
}

/// The runs: an ample limit (throughput) and a saturated one (2 000 per
/// second, burst 1 000: over-admission), each as one call per decision, one
/// reservoir for every task, and four reservoirs on four connections.
///
/// The ample limit is the fastest rate a GCRA quota has (1 M per second:
/// its emission interval is counted in whole microseconds) with a burst of
/// 10 M, so that no run can use it up and the figure is the limiter's own
/// speed; with a burst of 100 000 the reservoirs stopped at the quota.
pub async fn runs(client: &redis::Client) -> Result<Vec<HotRun>> {
    let ample = Quota::per_second(1_000_000)?.with_burst(10_000_000)?;
    let tight = Quota::per_second(2_000)?.with_burst(1_000)?;
    let mut out = Vec::new();
    for (name, quota) in [("ample", ample), ("2 000/s", tight)] {
        let limiter = Limiter::new(Algorithm::Gcra, quota)?;
        for processes in [0usize, 1, 4] {
            let label = match processes {
                0 => format!("{name}: Limiter::check, one call per decision"),
                1 => format!("{name}: Reservoir, 1 process"),
                n => format!("{name}: Reservoir, {n} processes"),
            };
            out.push(run(client, &limiter, processes, label, quota).await?);
        }
    }
    Ok(out)
}

async fn run(
    client: &redis::Client,
    limiter: &Limiter,
    processes: usize,
    label: String,
    quota: Quota,
) -> Result<HotRun> {
    let key = format!(
        "compare:hot:{}:{}",
        std::process::id(),
        label.len() + processes
    );
    let calls = Arc::new(AtomicU64::new(0));
    let decisions = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let start_us = server_micros(client).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    if processes == 0 {
        let conn = Counted::new(connect(client).await?, Arc::clone(&calls));
        for _ in 0..TASKS {
            let (mut conn, limiter, key) = (conn.clone(), limiter.clone(), key.clone());
            let (decisions, admitted) = (Arc::clone(&decisions), Arc::clone(&admitted));
            tasks.push(tokio::spawn(async move {
                while start.elapsed() < LENGTH {
                    let d = limiter.check(&mut conn, &key, 1).await?;
                    decisions.fetch_add(1, Relaxed);
                    admitted.fetch_add(u64::from(d.allowed), Relaxed);
                }
                Ok::<_, super::BoxError>(())
            }));
        }
    } else {
        let mut reservoirs = Vec::new();
        for _ in 0..processes {
            let conn = Counted::new(connect(client).await?, Arc::clone(&calls));
            reservoirs.push(Arc::new(Reservoir::new(
                conn,
                limiter.clone(),
                &key,
                MAX_BATCH,
                HOLD,
            )?));
        }
        for t in 0..TASKS {
            let r = Arc::clone(&reservoirs[t % processes]);
            let (decisions, admitted) = (Arc::clone(&decisions), Arc::clone(&admitted));
            tasks.push(tokio::spawn(async move {
                while start.elapsed() < LENGTH {
                    let d = r.check(1).await?;
                    decisions.fetch_add(1, Relaxed);
                    admitted.fetch_add(u64::from(d.allowed), Relaxed);
                    // Local decisions need no I/O: let the other tasks run.
                    tokio::task::yield_now().await;
                }
                Ok::<_, super::BoxError>(())
            }));
        }
    }
    for task in tasks {
        task.await??;
    }
    let seconds = start.elapsed().as_secs_f64();
    let end_us = server_micros(client).await?;
    let interval = quota.emission_interval().as_micros() as u64;
    Ok(HotRun {
        label,
        decisions: decisions.load(Relaxed),
        admitted: admitted.load(Relaxed),
        redis_calls: calls.load(Relaxed),
        seconds,
        bound: quota.burst() + (end_us - start_us) / interval.max(1),
    })
}
