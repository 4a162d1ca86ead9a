//! An abusive client with and without [`Limiter::with_local_deny_cache`]:
//! how many decisions reach Redis at exactly 10x the quota.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nolock::rate::{Algorithm, Limiter, Quota};
use tokio::time::MissedTickBehavior;

use super::conn::{connect, Counted};
use super::Result;

/// The quota: 20 per second, burst 1 (one unit every 50 ms).
pub const RATE: u64 = 20;
/// One check every `PACE`: exactly 10x the quota.
pub const PACE: Duration = Duration::from_millis(5);
/// How long each limiter is hammered.
pub const LENGTH: Duration = Duration::from_millis(1500);

/// One limiter's run.
#[derive(Debug, Clone, PartialEq)]
pub struct DenyRun {
    pub label: &'static str,
    pub decisions: u64,
    pub admitted: u64,
    /// Round trips to Redis (one per decision the server made).
    pub redis_calls: u64,
}

impl DenyRun {
    pub fn calls_per_decision(&self) -> f64 {
        self.redis_calls as f64 / self.decisions.max(1) as f64
    }
}

/// The same client (a check every [`PACE`] for [`LENGTH`]) against a GCRA
/// limiter without and with the local deny cache, each on its own key.
pub async fn abusive_client(client: &redis::Client) -> Result<Vec<DenyRun>> {
    let quota = Quota::per_second(RATE)?.with_burst(1)?;
    let plain = Limiter::new(Algorithm::Gcra, quota)?;
    let cached = plain.clone().with_local_deny_cache(1_000);
    let stamp = std::process::id();
    let mut runs = Vec::new();
    for (label, limiter) in [
        ("without deny cache", plain),
        ("with_local_deny_cache", cached),
    ] {
        let round_trips = Arc::new(AtomicU64::new(0));
        let mut conn = Counted::new(connect(client).await?, Arc::clone(&round_trips));
        let key = format!("compare:deny_cache:{stamp}:{label}");
        let mut tick = tokio::time::interval(PACE);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (mut decisions, mut admitted) = (0, 0);
        let start = Instant::now();
        while start.elapsed() < LENGTH {
            tick.tick().await;
            let d = limiter.check(&mut conn, &key, 1).await?;
            decisions += 1;
            admitted += u64::from(d.allowed);
        }
        runs.push(DenyRun {
            label,
            decisions,
            admitted,
            redis_calls: round_trips.load(Relaxed),
        });
    }
    Ok(runs)
}
