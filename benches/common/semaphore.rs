//! "At most `PERMITS` at once", two ways: `nolock::semaphore` (one script
//! to take a permit, one to give it back, each holder's permit expiring on
//! its own) against a counter of running holders kept under a `SET NX`
//! lock (lock, `GET`, decide, `SET` count + 1, unlock; work; lock, `GET`,
//! `SET` count - 1, unlock).
//!
//! A holder that is admitted runs for [`HOLD`]. The fault (`pauses`) stalls
//! a call where the client is exposed: inside the lock's first critical
//! section (between the decision and the write, past the lock's short TTL),
//! and for the semaphore while it holds its permit (whose TTL, like any
//! permit's, is sized above the work). Every admission is counted on a gauge
//! of running holders per key: each one that makes it pass `PERMITS` is an
//! **over-admission**. After the run every holder has given its slot back,
//! so whatever the server still counts is **drift** (reported as lost
//! updates): a counter that lost increments or decrements, or permits left
//! behind.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use nolock::semaphore::{PermitAttempt, Semaphore};
use redis::aio::ConnectionLike;

use super::lock;
use super::subject::{Call, Key, Variant};
use super::Result;

/// The semaphore's size in every run (the scenario's capacity is for counters).
pub const PERMITS: u64 = 4;
/// How long an admitted holder works.
pub const HOLD: Duration = Duration::from_millis(5);
/// The semaphore's permit TTL: above the work and any pause, as its docs ask.
pub const PERMIT_TTL: Duration = Duration::from_secs(1);

/// Running holders per key, and the admissions that passed `PERMITS`.
#[derive(Default)]
struct Gauge {
    running: AtomicU64,
    over: AtomicU64,
}

static GAUGES: LazyLock<Mutex<HashMap<String, Arc<Gauge>>>> = LazyLock::new(Default::default);

fn gauge(key: &str) -> Arc<Gauge> {
    let mut gauges = GAUGES.lock().unwrap_or_else(PoisonError::into_inner);
    gauges.entry(key.to_owned()).or_default().clone()
}

/// Work as an admitted holder: counted on the key's gauge while it runs.
async fn hold(key: &str, pause: Option<Duration>) {
    let gauge = gauge(key);
    if gauge.running.fetch_add(1, SeqCst) + 1 > PERMITS {
        gauge.over.fetch_add(1, SeqCst);
    }
    tokio::time::sleep(HOLD + pause.unwrap_or_default()).await;
    gauge.running.fetch_sub(1, SeqCst);
}

/// One call: try to become a holder; if admitted, work and give the slot back.
pub async fn call<C: ConnectionLike + Send>(
    variant: Variant,
    call: Call<'_>,
    conn: &mut C,
    rng: &mut fastrand::Rng,
) -> Result<bool> {
    let key = call.key.data.as_str();
    match variant {
        Variant::Script => {
            let PermitAttempt::Acquired(permit) = Semaphore::new(PERMITS, PERMIT_TTL)?
                .acquire(conn, key)
                .await?
            else {
                return Ok(false);
            };
            hold(key, call.pause).await;
            let _ = permit.release(conn).await?;
            Ok(true)
        }
        Variant::Lock => {
            let token = lock::acquire(conn, &call.key.lock, call.lock_ttl, rng).await?;
            let running: Option<i64> = redis::cmd("GET").arg(key).query_async(conn).await?;
            let running = running.unwrap_or(0);
            let admit = running < PERMITS as i64;
            // The lease can run out right here; the write then lands late.
            if let Some(pause) = call.pause {
                tokio::time::sleep(pause).await;
            }
            if admit {
                redis::cmd("SET")
                    .arg(key)
                    .arg(running + 1)
                    .exec_async(conn)
                    .await?;
            }
            lock::release(conn, &call.key.lock, &token).await?;
            if !admit {
                return Ok(false);
            }
            hold(key, None).await;
            let token = lock::acquire(conn, &call.key.lock, call.lock_ttl, rng).await?;
            let running: Option<i64> = redis::cmd("GET").arg(key).query_async(conn).await?;
            redis::cmd("SET")
                .arg(key)
                .arg(running.unwrap_or(0) - 1)
                .exec_async(conn)
                .await?;
            lock::release(conn, &call.key.lock, &token).await?;
            Ok(true)
        }
        other => Err(format!("no {} variant for the semaphore", other.name()).into()),
    }
}

/// Over-admissions and drift of a finished run, per key summed.
pub async fn faults<C: ConnectionLike + Send>(
    variant: Variant,
    conn: &mut C,
    keys: &[Key],
) -> Result<(u64, u64)> {
    let (mut over, mut drift) = (0, 0);
    for key in keys {
        let gauge = GAUGES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key.data);
        over += gauge.map_or(0, |g| g.over.load(SeqCst));
        drift += match variant {
            // Permits left behind: members scored as expiries (>= 1); the
            // tag `by:m<P>` (score 0) is not a permit.
            Variant::Script => {
                redis::cmd("ZCOUNT")
                    .arg(&key.data)
                    .arg(1)
                    .arg("+inf")
                    .query_async::<u64>(conn)
                    .await?
            }
            _ => {
                let left: Option<i64> = redis::cmd("GET").arg(&key.data).query_async(conn).await?;
                left.unwrap_or(0).unsigned_abs()
            }
        };
    }
    Ok((over, drift))
}
