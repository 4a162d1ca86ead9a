//! Waiting for a held lock: jittered exponential backoff, never past the
//! lock's expiry, up to a deadline.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{acquire_as, millis, Acquire, Keys, Token};
use crate::{timer, Error, Result};

/// How [`acquire_with_retry`] waits for a held lock.
///
/// Attempt `n` (from 0) that finds the lock held sleeps a random time in
/// `[0, min(max_delay, initial_delay × 2^n)]` ("full jitter"), never past the
/// deadline `timeout` after the first attempt; one last attempt is made at
/// the deadline. Spreading the retries at random keeps hundreds of waiters
/// from hitting one key in lockstep (a thundering herd), and the doubling
/// keeps a long wait cheap: about `log2(max/initial) + 2 × timeout / max`
/// attempts per waiter.
///
/// ```
/// use std::time::Duration;
/// use nolock::fence::Backoff;
///
/// let patient = Backoff::new(Duration::from_secs(5));
/// let fast = Backoff { max_delay: Duration::from_millis(50), ..Backoff::new(Duration::from_secs(1)) };
/// assert_eq!(Backoff::none().timeout, Duration::ZERO);
/// # let _ = (patient, fast);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// How long to keep trying after the first attempt. Zero: one attempt.
    pub timeout: Duration,
    /// The cap of the first sleep (at least 1 ms). Default 10 ms.
    pub initial_delay: Duration,
    /// The largest cap a sleep doubles up to (raised to `initial_delay` if
    /// lower). Default 500 ms.
    pub max_delay: Duration,
}

impl Backoff {
    /// Keep trying for `timeout`, with sleeps from 10 ms doubling up to 500 ms.
    pub const fn new(timeout: Duration) -> Self {
        Backoff {
            timeout,
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(500),
        }
    }

    /// One attempt, no waiting.
    pub const fn none() -> Self {
        Backoff::new(Duration::ZERO)
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.initial_delay < Duration::from_millis(1) {
            return Err(Error::ZeroDuration {
                what: "initial_delay",
            });
        }
        Ok(())
    }

    /// The upper bound of the sleep after attempt `n`.
    fn cap(&self, attempt: u32) -> Duration {
        let max = self.max_delay.max(self.initial_delay);
        // 2^20 × 1 ms is already 17 minutes; beyond that only `max` matters.
        self.initial_delay
            .saturating_mul(1 << attempt.min(20))
            .min(max)
    }

    /// The sleep after attempt `n`: uniform in `[0, cap(n)]`.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        jitter(self.cap(attempt), random_u64())
    }
}

impl Default for Backoff {
    /// [`Backoff::none`]: one attempt.
    fn default() -> Self {
        Backoff::none()
    }
}

/// A random u64 from the OS. If the OS generator fails, no jitter (the full
/// cap) is still a correct, if herd-prone, backoff.
fn random_u64() -> u64 {
    getrandom::u64().unwrap_or(u64::MAX)
}

/// `r` scaled from `[0, 2^64)` onto `[0, cap]` without modulo bias worth
/// mentioning (caps are far below 2^64 ns).
fn jitter(cap: Duration, r: u64) -> Duration {
    let cap_ns = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
    let ns = (u128::from(r) * (u128::from(cap_ns) + 1)) >> 64;
    Duration::from_nanos(u64::try_from(ns).unwrap_or(cap_ns))
}

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
/// use nolock::fence::{self, Acquire, Backoff};
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_double_from_initial_up_to_max() {
        let b = Backoff {
            timeout: Duration::from_secs(1),
            initial_delay: 10 * MS,
            max_delay: 100 * MS,
        };
        let caps: Vec<_> = (0..6).map(|n| b.cap(n).as_millis()).collect();
        assert_eq!(caps, [10, 20, 40, 80, 100, 100]);
        assert_eq!(b.cap(u32::MAX), 100 * MS);
        let low_max = Backoff { max_delay: MS, ..b };
        assert_eq!(low_max.cap(3), 10 * MS, "max raised to initial");
    }

    #[test]
    fn jitter_spans_zero_to_the_cap() {
        let cap = 100 * MS;
        assert_eq!(jitter(cap, 0), Duration::ZERO);
        assert_eq!(jitter(cap, u64::MAX), cap);
        assert_eq!(jitter(cap, 1 << 63), cap / 2);
        assert_eq!(
            jitter(Duration::MAX, u64::MAX),
            Duration::from_nanos(u64::MAX)
        );
        for _ in 0..1000 {
            assert!(Backoff::new(MS).delay(0) <= 10 * MS);
        }
    }

    #[test]
    fn delays_are_spread_out() {
        let b = Backoff::new(Duration::from_secs(1));
        let delays: std::collections::BTreeSet<_> = (0..100).map(|_| b.delay(3)).collect();
        assert!(delays.len() > 90, "random, not lockstep: {}", delays.len());
    }

    #[test]
    fn a_zero_initial_delay_is_rejected() {
        let b = Backoff {
            initial_delay: Duration::ZERO,
            ..Backoff::new(MS)
        };
        assert!(matches!(
            b.check(),
            Err(Error::ZeroDuration {
                what: "initial_delay"
            })
        ));
        assert!(Backoff::none().check().is_ok());
    }
}
