//! Waiting for a permit: jittered backoff, capped by the server's `retry_after`.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{Acquire, PermitId, TryAcquire};
use crate::script::run_one;
use crate::Backoff;
use crate::{Error, Result};

/// [`super::acquire`], retried while the semaphore is full, until
/// `backoff.timeout` has passed.
///
/// Each attempt that finds the semaphore full sleeps the [`Backoff`]'s
/// jittered delay, but **never longer than the `retry_after`** the server
/// gave (when the permit that blocks this request expires), and never past
/// the deadline; one last attempt is made at the deadline. Releases usually
/// free a permit before `retry_after`, which is why the jittered backoff
/// keeps polling below it; the jitter keeps many waiters from arriving
/// together.
///
/// One [`PermitId`] is used for every attempt, so an attempt whose reply was
/// lost ([`Error::Indeterminate`]) is simply tried again: if it had taken
/// the permit, the next attempt finds it held by this id and returns it
/// (no second permit). Definite errors are returned at once.
///
/// # Errors
///
/// As [`super::acquire`], plus [`Error::ZeroDuration`] for an
/// `initial_delay` under 1 ms, before any I/O.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::Backoff;
/// use nolock::semaphore::{self, Acquire};
///
/// let wait = Backoff::new(Duration::from_secs(5));
/// match semaphore::acquire_with_retry(conn, "exports", 10, Duration::from_secs(30), &wait).await? {
///     Acquire::Acquired(permit) => {
///         // ... work, then release ...
///         let _ = semaphore::release(conn, "exports", &permit).await?;
///     }
///     Acquire::Full { .. } => println!("still full after 5 s"),
/// }
/// # Ok(()) }
/// ```
pub async fn acquire_with_retry<C>(
    conn: &mut C,
    key: &str,
    permits: u64,
    ttl: Duration,
    backoff: &Backoff,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    acquire_weighted_with_retry(conn, key, permits, 1, ttl, backoff).await
}

/// [`acquire_with_retry`] for `weight` permits at once, all or nothing.
///
/// # Errors
///
/// As [`super::acquire_weighted`], plus [`Error::ZeroDuration`] for an
/// `initial_delay` under 1 ms.
pub async fn acquire_weighted_with_retry<C>(
    conn: &mut C,
    key: &str,
    permits: u64,
    weight: u64,
    ttl: Duration,
    backoff: &Backoff,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    TryAcquire::check(key, permits, weight, ttl)?;
    backoff.check()?;
    let id = PermitId::random()?;
    let start = Instant::now();
    let mut attempt = 0u32;
    loop {
        // Built anew per attempt: the deadline counts from this attempt.
        let op = TryAcquire::with_id(key, &id, permits, weight, ttl)?;
        let result = run_one(&op, conn).await;
        let waited = start.elapsed();
        let cap = match result {
            Ok(outcome) if outcome.is_acquired() || waited >= backoff.timeout => {
                return Ok(outcome)
            }
            Ok(Acquire::Full { retry_after, .. }) => retry_after,
            Ok(Acquire::Acquired(_)) => Duration::ZERO,
            // Same id, so a repeat cannot take a second set of permits.
            Err(Error::Indeterminate(_)) if waited < backoff.timeout => Duration::MAX,
            Err(err) => return Err(err),
        };
        let sleep = backoff
            .delay(attempt)
            .min(cap)
            .min(backoff.timeout - waited);
        attempt = attempt.saturating_add(1);
        tokio::time::sleep(sleep).await;
    }
}
