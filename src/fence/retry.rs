//! Waiting for a held lock: jittered exponential backoff, never past the
//! lock's expiry, up to a deadline.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{AcquireLock, Lock, LockAttempt};
use crate::backoff::{jitter, random_u64};
use crate::{timer, Backoff, Error, Result};

/// The waiting loop of a [`Lock`] built [`Lock::with_wait`], and of
/// [`Waiters::acquire`](super::Waiters::acquire): `op` (one token for every
/// attempt) sent again until it is granted or the backoff's timeout has
/// passed; with a `wake` signal, a sleep ends early when the lock is
/// released.
///
/// A held lock answers how long it has left ([`LockAttempt::Held`]'s
/// `expires_in`), so a waiter never sleeps past that: each sleep is the
/// jittered exponential backoff delay, cut to the lock's expiry (plus up to
/// 1 ms of jitter, so waiters do not all arrive in the same instant) and to
/// the deadline.
///
/// One token is drawn for all attempts, so an attempt whose reply is lost
/// cannot leave a lock behind that a later attempt does not recognise: an
/// [`Error::Indeterminate`] attempt is tried again (with backoff, within the
/// deadline), and if the lost attempt had taken the lock the next one finds
/// it held by this very token and returns the same grant and fence.
/// Definite errors are returned at once; an `Indeterminate` one only when
/// the deadline has passed (the lock, if it was taken, then expires after
/// its TTL). Returns [`LockAttempt::Held`] (from the last attempt) when the
/// deadline passes.
pub(crate) async fn wait_for<C>(
    conn: &mut C,
    lock: &Lock,
    op: &AcquireLock,
    wake: Option<&tokio::sync::Notify>,
) -> Result<LockAttempt>
where
    C: ConnectionLike + Send,
{
    let backoff = lock.wait();
    backoff.check()?;
    if !backoff.timeout.is_zero() {
        timer::check()?;
    }
    let outcome = attempts(conn, lock, op, wake).await;
    if !matches!(outcome, Ok(LockAttempt::Acquired(_))) {
        if let Some(leave) = op.leave() {
            // A fair waiter that gives up leaves its line at once, handing
            // the first place on (best effort: otherwise its ticket dies
            // within Lock::ticket_life).
            let _ = crate::script::run_one(&leave, conn).await;
        }
    }
    if let Some(wake) = wake {
        if !matches!(outcome, Ok(LockAttempt::Acquired(_))) {
            // A release wakes one waiter of this process. Leaving without the
            // lock, this one may have used up that wake-up: pass it on.
            wake.notify_one();
        }
    }
    outcome
}

async fn attempts<C>(
    conn: &mut C,
    lock: &Lock,
    op: &AcquireLock,
    wake: Option<&tokio::sync::Notify>,
) -> Result<LockAttempt>
where
    C: ConnectionLike + Send,
{
    let backoff = lock.wait();
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
        let result = lock.attempt(conn, &op.resend()).await;
        let waited = start.elapsed();
        let expires_in = match &result {
            Ok(outcome) if outcome.is_acquired() || waited >= backoff.timeout => {
                return result;
            }
            Ok(LockAttempt::Held { expires_in }) => *expires_in,
            Ok(LockAttempt::Acquired(_)) => None,
            // Same token, so a repeat cannot take a second fence.
            Err(Error::Indeterminate(_)) if waited < backoff.timeout => None,
            // Granted and released again: the replicas may catch up.
            Err(Error::Unacknowledged { .. }) if waited < backoff.timeout => None,
            Err(_) => return result,
        };
        let left = backoff.timeout - waited;
        // A fair waiter polls by its place in line: the first at the first
        // delay (only it may take the lock next), the n-th at most at the
        // n-th (it cannot be granted before those ahead of it).
        let step = op.place_in_line().map_or(attempt, |place| {
            attempt.min(u32::try_from(place - 1).unwrap_or(u32::MAX))
        });
        let sleep = match (wake, expires_in) {
            // Woken by the release; the expiry (capped by max_delay, which
            // bounds what a lost message costs) is the fallback.
            (Some(_), Some(expiry)) => expiry.min(fallback(backoff)),
            (None, Some(expiry)) => backoff.delay(step).min(expiry),
            (_, None) => backoff.delay(step),
        };
        let sleep = (sleep + jitter(MS, random_u64())).min(left);
        attempt = attempt.saturating_add(1);
        // The runtime had timers at the start; if this task has since moved
        // to one without, stop here with what the last attempt said.
        let Ok(timer) = timer::sleep(sleep) else {
            return result;
        };
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

/// The longest a waiter sleeps between attempts with a wake-up signal: the
/// cap of its backoff (which bounds the sleep when the lock has no expiry,
/// and the fallback when a release is not heard), plus the jitter.
pub(super) fn longest_sleep(backoff: &Backoff) -> Duration {
    (fallback(backoff) + MS).min(backoff.timeout)
}

/// How long a woken waiter sleeps at most when no release wakes it.
fn fallback(backoff: &Backoff) -> Duration {
    backoff.max_delay.max(backoff.initial_delay)
}

const MS: Duration = Duration::from_millis(1);
