//! Waiting for a permit: jittered backoff, capped by the server's `retry_after`.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{AcquirePermit, PermitAttempt, PermitId, Semaphore};
use crate::{timer, Backoff, Error, Result};

/// [`Semaphore::acquire_weighted`]: attempts until acquired or the
/// semaphore's backoff gives up.
///
/// Each attempt that finds the semaphore full sleeps the [`crate::Backoff`]'s
/// jittered delay, never longer than the server's `retry_after` (when the
/// next permit surely expires). One id is drawn for all attempts, so an
/// attempt whose reply was lost cannot leave a second set behind: the next
/// attempt under the same id finds its permits and returns them.
pub(crate) async fn acquire_waiting<C>(
    semaphore: &Semaphore,
    conn: &mut C,
    key: &str,
    weight: u64,
    id: Option<&PermitId>,
    wake: Option<&tokio::sync::Notify>,
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
    let op = AcquirePermit::build(semaphore, key, &id, weight)?;
    let outcome = attempts(semaphore, conn, key, weight, &id, wake).await;
    if !matches!(outcome, Ok(PermitAttempt::Acquired(_))) {
        if let Some(leave) = op.leave() {
            // A fair waiter that gives up leaves its line at once (best
            // effort: otherwise its ticket dies within its life).
            let _ = crate::script::run_one(&leave, conn).await;
        }
    }
    outcome
}

async fn attempts<C>(
    semaphore: &Semaphore,
    conn: &mut C,
    key: &str,
    weight: u64,
    id: &PermitId,
    wake: Option<&tokio::sync::Notify>,
) -> Result<PermitAttempt>
where
    C: ConnectionLike + Send,
{
    let backoff = semaphore.wait();
    let start = Instant::now();
    let mut attempt = 0u32;
    loop {
        // Registered before the attempt, so a release that lands between the
        // reply and the sleep still wakes this waiter.
        let notified = wake.map(|n| n.notified());
        let mut notified = std::pin::pin!(notified);
        if let Some(n) = notified.as_mut().as_pin_mut() {
            n.enable();
        }
        // Built anew per attempt: the deadline counts from this attempt.
        let op = AcquirePermit::build(semaphore, key, id, weight)?;
        let result = semaphore.attempt(conn, &op).await;
        let waited = start.elapsed();
        // A fair waiter polls by its place in line: the first at the first
        // delay, the n-th at most at the n-th (it cannot be granted before
        // those ahead of it), never capped to zero by a line that holds
        // the free permits (retry_after 0).
        let place = op.place_in_line();
        let cap = match result {
            Ok(outcome) if outcome.is_acquired() || waited >= backoff.timeout => {
                return Ok(outcome)
            }
            Ok(PermitAttempt::Full { retry_after, .. }) if place.is_some() => {
                if retry_after.is_zero() {
                    Duration::MAX
                } else {
                    retry_after + MS
                }
            }
            Ok(PermitAttempt::Full { retry_after, .. }) => retry_after,
            Ok(PermitAttempt::Acquired(_)) => Duration::ZERO,
            // Same id, so a repeat cannot take a second set of permits.
            Err(Error::Indeterminate(_)) if waited < backoff.timeout => Duration::MAX,
            // Released: the replicas are behind; ask again, same id.
            Err(Error::PermitUnacknowledged { .. }) if waited < backoff.timeout => Duration::MAX,
            Err(err) => return Err(err),
        };
        let step = place.map_or(attempt, |place| {
            attempt.min(u32::try_from(place - 1).unwrap_or(u32::MAX))
        });
        let sleep = match wake {
            // Woken by name by the release (semaphore/release_fair); the
            // expiry of the permits it needs, capped by max_delay, is the
            // fallback.
            Some(_) => cap.min(backoff.max_delay.max(backoff.initial_delay)),
            None => backoff.delay(step).min(cap),
        }
        .min(backoff.timeout - waited);
        attempt = attempt.saturating_add(1);
        let timer = timer::sleep(sleep)?;
        match notified.as_mut().as_pin_mut() {
            Some(n) => {
                tokio::select! {
                    _ = n => {}
                    _ = timer => {}
                }
            }
            None => timer.await,
        }
    }
}

/// The longest a waiter sleeps between attempts: its backoff's cap (at
/// least the first delay), plus 1 ms, at most its timeout.
pub(super) fn longest_sleep(backoff: &Backoff) -> Duration {
    (backoff.max_delay.max(backoff.initial_delay) + MS).min(backoff.timeout)
}

const MS: Duration = Duration::from_millis(1);
