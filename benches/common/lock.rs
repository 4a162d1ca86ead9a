//! A distributed lock as careful users write it today: the `lock` variants.
//!
//! * **Acquire**: `SET <lock> <random 128-bit token> NX PX <ttl>`. When the
//!   lock is held, wait a jittered exponential backoff ("full jitter": uniform
//!   in `0..=min(cap, base * 2^attempt)`) and try again, so waiters do not
//!   stampede the key. Base 1 ms and cap 16 ms are short on purpose: they give
//!   the lock its best throughput on one hot key.
//! * **Release**: delete the lock only if it still holds our token, in one
//!   script, so a late release never deletes the next holder's lock.
//!
//! What no lock can fix, and what the pause runs show: a holder paused past
//! its TTL does not know that it lost the lock, and its late write lands on
//! top of the next holder's.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::Result;

pub const BACKOFF_BASE: Duration = Duration::from_millis(1);
pub const BACKOFF_CAP: Duration = Duration::from_millis(16);
/// A waiter gives up (an error in the run's counts) after this long.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then \
           return redis.call('DEL', KEYS[1]) \
         else \
           return 0 \
         end",
    )
});

/// Cache the release script on the server, as an application would at
/// startup, so that no timed call pays the `NOSCRIPT` retry.
pub async fn prepare<C: ConnectionLike + Send>(conn: &mut C) -> Result<()> {
    RELEASE.load_async(conn).await?;
    Ok(())
}

/// Take the lock at `key` for `ttl`; returns the token that proves it is ours.
pub async fn acquire<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    ttl: Duration,
    rng: &mut fastrand::Rng,
) -> Result<String> {
    // A random token, not a process or thread id: only its holder can release it.
    let token = format!("{:032x}", rng.u128(..));
    let ttl_ms = ttl.as_millis() as u64;
    let started = Instant::now();
    for attempt in 0u32.. {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(conn)
            .await?;
        if set.is_some() {
            return Ok(token);
        }
        if started.elapsed() > ACQUIRE_TIMEOUT {
            break;
        }
        let ceiling = BACKOFF_BASE
            .saturating_mul(1 << attempt.min(16))
            .min(BACKOFF_CAP);
        let wait = rng.u64(..=ceiling.as_micros() as u64);
        tokio::time::sleep(Duration::from_micros(wait)).await;
    }
    Err(format!("lock {key} not acquired within {ACQUIRE_TIMEOUT:?}").into())
}

/// Release the lock if it is still ours. `false` means it had expired (and
/// may now be someone else's, which is left alone).
pub async fn release<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    token: &str,
) -> Result<bool> {
    let deleted: i64 = RELEASE.key(key).arg(token).invoke_async(conn).await?;
    Ok(deleted == 1)
}
