//! [`Limiter::until_ready`]: wait for the server's `retry_after`, then ask
//! again, until admitted or a deadline.

use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::time::Instant;

#[cfg(doc)]
use super::RateLimit;
use super::{Decision, Limiter};
use crate::{timer, Result};

/// The most jitter added to a wait: a tenth of it, at most this much. Many
/// callers told the same `retry_after` would otherwise all ask at once.
const MAX_JITTER: Duration = Duration::from_millis(50);

impl Limiter {
    /// [`Limiter::check`] until admitted, sleeping between tries for the
    /// server's [`RateLimit::retry_after`] plus a little jitter (governor's
    /// `until_ready`). Never busy-polls: each try follows a sleep of at least
    /// the time the server named, so a wait costs one call, plus one per
    /// time someone else took the freed units first.
    ///
    /// Gives up without sleeping when the next try could only come after
    /// `deadline`, and returns that last (denied) answer: check
    /// [`RateLimit::allowed`].
    ///
    /// # Errors
    ///
    /// As [`Limiter::check`], from whichever try failed. Nothing is retried
    /// after an error. [`crate::Error::NoTimer`] when it must sleep on a
    /// runtime without timers (never a panic).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limiter: &nolock::rate::Limiter)
    /// #     -> nolock::Result<()> {
    /// let deadline = Instant::now() + Duration::from_secs(2);
    /// let d = limiter.until_ready(conn, "rl:crawler:example.com", 1, deadline).await?;
    /// if !d.allowed {
    ///     println!("not within 2 s; next chance in {:?}", d.retry_after);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn until_ready<C>(
        &self,
        conn: &mut C,
        key: &str,
        cost: u64,
        deadline: Instant,
    ) -> Result<Decision>
    where
        C: ConnectionLike + Send,
    {
        loop {
            let decision = self.check(conn, key, cost).await?;
            let Some(wait) = decision.retry_after else {
                return Ok(decision);
            };
            // retry_after is rounded up to the millisecond, but never zero
            // for a denial: even a 0 would not make this loop spin.
            let wait = wait.max(Duration::from_millis(1));
            let wake = Instant::now() + wait + jitter(wait);
            if wake > deadline {
                return Ok(decision);
            }
            timer::sleep_until(wake)?.await;
        }
    }
}

/// Up to a tenth of `wait`, at most [`MAX_JITTER`], from the OS generator
/// (none if it fails: still correct, only more herd-prone).
fn jitter(wait: Duration) -> Duration {
    let cap = (wait / 10).min(MAX_JITTER);
    let cap_ns = u64::try_from(cap.as_nanos()).unwrap_or(0);
    let r = getrandom::u64().unwrap_or(0);
    let ns = (u128::from(r) * (u128::from(cap_ns) + 1)) >> 64;
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_bounded() {
        for ms in [0, 1, 10, 100, 10_000] {
            let wait = Duration::from_millis(ms);
            for _ in 0..100 {
                let j = jitter(wait);
                assert!(j <= wait / 10 && j <= MAX_JITTER, "{j:?} for {wait:?}");
            }
        }
    }
}
