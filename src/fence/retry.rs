//! Waiting for a held lock: jittered exponential backoff, never past the
//! lock's expiry, up to a deadline.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{acquire_as, millis, Acquire, Keys, Token};
use crate::backoff::{jitter, random_u64};
use crate::{timer, Backoff, Error, Result};

/// [`super::acquire`], retried with [`Backoff`] while the lock is held, until
/// `backoff.timeout` has passed.
///
/// A held lock answers how long it has left ([`Acquire::Held`]'s
/// `expires_in`), so a waiter never sleeps past that: each sleep is the
/// jittered exponential [`Backoff`] delay, cut to the lock's expiry (plus up
/// to 1 ms of jitter, so waiters do not all arrive in the same instant) and
/// to the deadline. A lock released early is only noticed at the next
/// attempt; [`Waiters::acquire`](super::Waiters::acquire) is woken by the
/// release itself.
///
/// One token is drawn for all attempts, so an attempt whose reply is lost
/// cannot leave a lock behind that a later attempt does not recognise: an
/// [`Error::Indeterminate`] attempt is tried again (with backoff, within the
/// deadline), and if the lost attempt had taken the lock the next one finds
/// it held by this very token and returns the same grant and fence
/// ([`super::acquire_as`] is idempotent for the holder). Definite errors are
/// returned at once; an `Indeterminate` one only when the deadline has passed
/// (the lock, if it was taken, then expires after `ttl`).
///
/// Returns [`Acquire::Held`] (from the last attempt) when the deadline
/// passes.
///
/// # Errors
///
/// As [`super::acquire`], plus, before any I/O, [`Error::ZeroDuration`] for
/// an `initial_delay` under 1 ms and [`Error::NoTimer`] when the backoff
/// would have to sleep on a runtime built without timers (or outside one).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::fence::{self, Acquire};
/// use nolock::Backoff;
///
/// let wait = Backoff::new(Duration::from_secs(3));
/// match fence::acquire_with_retry(conn, "migrate:v42", Duration::from_secs(60), &wait).await? {
///     Acquire::Acquired(grant) => println!("migrating under fence {}", grant.fence),
///     Acquire::Held { .. } => println!("another instance is migrating"),
/// }
/// # Ok(()) }
/// ```
pub async fn acquire_with_retry<C>(
    conn: &mut C,
    resource: &str,
    ttl: Duration,
    backoff: &Backoff,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    wait_for(conn, resource, ttl, backoff, None).await
}

/// The waiting loop of [`acquire_with_retry`] and
/// [`Waiters::acquire`](super::Waiters::acquire): with a `wake` signal, a
/// sleep ends early when the lock is released.
pub(crate) async fn wait_for<C>(
    conn: &mut C,
    resource: &str,
    ttl: Duration,
    backoff: &Backoff,
    wake: Option<&tokio::sync::Notify>,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    Keys::of(resource)?;
    millis(ttl)?;
    backoff.check()?;
    if !backoff.timeout.is_zero() {
        timer::check()?;
    }
    let token = Token::random()?;
    let outcome = attempts(conn, resource, &token, ttl, backoff, wake).await;
    if let Some(wake) = wake {
        if !matches!(outcome, Ok(Acquire::Acquired(_))) {
            // A release wakes one waiter of this process. Leaving without the
            // lock, this one may have used up that wake-up: pass it on.
            wake.notify_one();
        }
    }
    outcome
}

async fn attempts<C>(
    conn: &mut C,
    resource: &str,
    token: &Token,
    ttl: Duration,
    backoff: &Backoff,
    wake: Option<&tokio::sync::Notify>,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
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
        let result = acquire_as(conn, resource, token, ttl).await;
        let waited = start.elapsed();
        let expires_in = match &result {
            Ok(outcome) if outcome.is_acquired() || waited >= backoff.timeout => {
                return result;
            }
            Ok(Acquire::Held { expires_in }) => *expires_in,
            Ok(Acquire::Acquired(_)) => None,
            // Same token, so a repeat cannot take a second fence.
            Err(Error::Indeterminate(_)) if waited < backoff.timeout => None,
            Err(_) => return result,
        };
        let left = backoff.timeout - waited;
        let sleep = match (wake, expires_in) {
            // Woken by the release; the expiry (capped by max_delay, which
            // bounds what a lost message costs) is the fallback.
            (Some(_), Some(expiry)) => expiry.min(backoff.max_delay.max(backoff.initial_delay)),
            (None, Some(expiry)) => backoff.delay(attempt).min(expiry),
            (_, None) => backoff.delay(attempt),
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

const MS: Duration = Duration::from_millis(1);
