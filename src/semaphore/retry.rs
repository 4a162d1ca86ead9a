//! Waiting for a permit: jittered backoff, capped by the server's `retry_after`.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{AcquirePermit, PermitAttempt, PermitId, Semaphore};
use crate::{timer, Error, Result};

/// [`Semaphore::acquire_weighted`]: attempts until acquired or the
/// semaphore's backoff gives up.
///
/// Each attempt that finds the semaphore full sleeps the [`crate::Backoff`]'s
/// jittered delay, never longer than the server's `retry_after` (when the
/// next permit surely expires). One id is drawn for all attempts, so an
/// attempt whose reply was lost cannot leave a second set behind: the next
/// attempt under the same id finds its permits and returns them.
pub(super) async fn acquire_waiting<C>(
    semaphore: &Semaphore,
    conn: &mut C,
    key: &str,
    weight: u64,
    id: Option<&PermitId>,
) -> Result<PermitAttempt>
where
    C: ConnectionLike + Send,
{
    let backoff = semaphore.wait();
    semaphore.check(key, weight)?;
    backoff.check()?;
    if !backoff.timeout.is_zero() {
        timer::check()?;
    }
    let id = match id {
        Some(id) => id.clone(),
        None => PermitId::random()?,
    };
    let start = Instant::now();
    let mut attempt = 0u32;
    loop {
        // Built anew per attempt: the deadline counts from this attempt.
        let op = AcquirePermit::build(semaphore, key, &id, weight)?;
        let result = semaphore.attempt(conn, &op).await;
        let waited = start.elapsed();
        let cap = match result {
            Ok(outcome) if outcome.is_acquired() || waited >= backoff.timeout => {
                return Ok(outcome)
            }
            Ok(PermitAttempt::Full { retry_after, .. }) => retry_after,
            Ok(PermitAttempt::Acquired(_)) => Duration::ZERO,
            // Same id, so a repeat cannot take a second set of permits.
            Err(Error::Indeterminate(_)) if waited < backoff.timeout => Duration::MAX,
            // Released: the replicas are behind; ask again, same id.
            Err(Error::PermitUnacknowledged { .. }) if waited < backoff.timeout => Duration::MAX,
            Err(err) => return Err(err),
        };
        let sleep = backoff
            .delay(attempt)
            .min(cap)
            .min(backoff.timeout - waited);
        attempt = attempt.saturating_add(1);
        timer::sleep(sleep)?.await;
    }
}
