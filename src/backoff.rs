//! [`Backoff`]: jittered exponential waits, shared by every call that waits
//! for something held (a lock, a permit) and by [`crate::retry()`].

use std::time::Duration;

use crate::{Error, Result};

/// How the calls that wait for something held ([`crate::fence::Lock::with_wait`],
/// [`crate::semaphore::Semaphore::with_wait`], the leases' `acquire`) and
/// [`crate::retry()`] space their attempts.
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
/// use nolock::Backoff;
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
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().unwrap_or(u64::MAX)
}

/// `r` scaled from `[0, 2^64)` onto `[0, cap]` without modulo bias worth
/// mentioning (caps are far below 2^64 ns).
pub(crate) fn jitter(cap: Duration, r: u64) -> Duration {
    let cap_ns = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
    let ns = (u128::from(r) * (u128::from(cap_ns) + 1)) >> 64;
    Duration::from_nanos(u64::try_from(ns).unwrap_or(cap_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
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
