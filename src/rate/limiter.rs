//! [`Limiter`]: one limit, one key.

use redis::aio::ConnectionLike;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deny_cache::DenyCache;
use super::{headers, Algorithm, Headers, Quota, RateLimit, Refund};
use crate::script::{run_one, Invocation, Operation};
use crate::{validate, Error, Result};

/// One rate limit: an [`Algorithm`], a [`Quota`] and a name for the HTTP
/// headers. Build it once (it is cheap to clone) and call it with the key of
/// whatever is limited: a user, an API key, an IP address.
///
/// The key is used as given: it is the Redis key that holds the limiter's
/// state. Use one key with one algorithm only; the algorithms store different
/// shapes.
///
/// # Example
///
/// ```no_run
/// use nolock::rate::{Algorithm, Limiter, Quota};
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let limiter = Limiter::new(Algorithm::SlidingWindow, Quota::per_hour(1000)?)?.named("hourly")?;
/// let decision = limiter.check(conn, "rl:hourly:user:42", 1).await?;
/// if !decision.allowed {
///     let wait = decision.retry_after.unwrap_or_default();
///     println!("over the hourly limit; try again in {} ms", wait.as_millis());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limiter {
    algorithm: Algorithm,
    quota: Quota,
    name: String,
    /// Opt-in local memory of denials, shared by clones.
    denials: Option<Denials>,
}

/// The deny cache of a limiter and its clones; limiters compare equal when
/// their caches have the same capacity (the cache is state, not setting).
#[derive(Debug, Clone)]
struct Denials(Arc<DenyCache>);

impl PartialEq for Denials {
    fn eq(&self, other: &Self) -> bool {
        self.0.capacity() == other.0.capacity()
    }
}

impl Eq for Denials {}

impl Limiter {
    /// A limiter named `"default"`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when a window algorithm gets a quota whose
    /// burst differs from its rate; [`Error::OutOfRange`] when a sliding
    /// window's `rate × period in ms` passes 2^53 - 1.
    pub fn new(algorithm: Algorithm, quota: Quota) -> Result<Limiter> {
        algorithm.accept(&quota)?;
        Ok(Limiter {
            algorithm,
            quota,
            name: "default".to_owned(),
            denials: None,
        })
    }

    /// The same limiter, remembering up to `capacity` recent denials in this
    /// process: after the server denies `cost` units at a key with
    /// `retry_after = r`, checks of that key for `cost` or more units within
    /// `r` are denied here, without a round trip. Likewise after an
    /// admission that left nothing (`remaining == 0`) on a GCRA, token-bucket
    /// or fixed-window limiter: until one unit fits again (computed from the
    /// reply and the quota), checks are denied here. A client far above its
    /// quota then costs Redis about one call per admission, instead of one
    /// per request.
    ///
    /// The cache never admits, and never outlives the server's answer: `r`
    /// counts from when the denied request was *sent*, before the server
    /// decided. What it gives up: a refund (or a `reset`) elsewhere cannot
    /// shorten a cached denial. Each entry expires on its own; when the
    /// cache is full, the denial closest to its end makes room. Clones share
    /// the cache. [`Limiter::peek`], refunds and batched [`Check`]s do not
    /// use it.
    ///
    /// ```
    /// use nolock::rate::{Algorithm, Limiter, Quota};
    ///
    /// let api = Limiter::new(Algorithm::Gcra, Quota::per_second(10)?)?.with_local_deny_cache(10_000);
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn with_local_deny_cache(self, capacity: usize) -> Limiter {
        Limiter {
            denials: Some(Denials(Arc::new(DenyCache::new(capacity)))),
            ..self
        }
    }

    /// The same limiter under another name: the policy name in the
    /// `RateLimit-Policy` and `RateLimit` headers.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `name` is 1 to 64 characters of
    /// ASCII letters, digits, `_`, `-`, `.` and `:`.
    pub fn named(self, name: &str) -> Result<Limiter> {
        Ok(Limiter {
            name: valid_name(name)?,
            ..self
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The policy name used in the headers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Take `cost` units for `key` if they fit; a denied call takes nothing.
    ///
    /// One round trip, decided by the server's clock.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`cost` 0),
    /// [`Error::OutOfRange`] (`cost` above 2^53 - 1),
    /// [`Error::InsufficientCapacity`] (`cost` above the limit: it could never
    /// be admitted, which is different from a denial). From Redis:
    /// [`Error::Redis`] (e.g. the key holds something else; nothing was
    /// written) and [`Error::Indeterminate`] (the units may have been taken;
    /// nolock does not retry).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use nolock::rate::{Algorithm, Limiter, Quota};
    ///
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let uploads = Limiter::new(Algorithm::TokenBucket, Quota::per_minute(100)?)?;
    /// // A batch of 20 items costs 20.
    /// let d = uploads.check(conn, "rl:uploads:tenant:7", 20).await?;
    /// assert!(d.remaining <= 100);
    /// # Ok(()) }
    /// ```
    pub async fn check<C>(&self, conn: &mut C, key: &str, cost: u64) -> Result<RateLimit>
    where
        C: ConnectionLike + Send,
    {
        let Some(Denials(cache)) = &self.denials else {
            return self.decide(conn, key, cost, false).await;
        };
        // Input errors come first, as without the cache.
        let check = Check::build(self, key, cost, false)?;
        let sent = Instant::now();
        if let Some(local) = cache.denied(key, cost, sent) {
            return Ok(local);
        }
        let decision = run_one(&check, conn).await?;
        crate::observe::decision(&self.name, decision.allowed);
        cache.record(key, cost, &decision, sent, self.empty_for(&decision));
        Ok(decision)
    }

    /// After an admission that left nothing (`remaining == 0`): how long,
    /// from the server's decision, a check of even one unit is sure to be
    /// denied unless something is refunded. `reset_after` is rounded up to
    /// the millisecond, so one millisecond comes off to end no later than
    /// the server would.
    ///
    /// GCRA and token bucket: one unit fits again `(burst - 1) × T` before
    /// the limiter is full again. Fixed window: at the window's end. Sliding
    /// window: `None` (the previous window's weight makes it a curve).
    fn empty_for(&self, decision: &RateLimit) -> Option<Duration> {
        if !decision.allowed || decision.remaining > 0 {
            return None;
        }
        let reset = decision.reset_after.checked_sub(Duration::from_millis(1))?;
        let wait = match self.algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => {
                let rest = (self.quota.burst() - 1).checked_mul(self.quota.interval_us())?;
                reset.checked_sub(Duration::from_micros(rest))?
            }
            Algorithm::FixedWindow => reset,
            _ => return None,
        };
        Some(wait).filter(|w| !w.is_zero())
    }

    /// What [`Limiter::check`] would answer for `cost` now, without taking
    /// anything. Runs with `EVALSHA_RO` (a replica can serve it; Redis refuses
    /// any write from it).
    ///
    /// # Errors
    ///
    /// As [`Limiter::check`]. A read is safe to retry.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limiter: &nolock::rate::Limiter)
    /// #     -> nolock::Result<()> {
    /// let would = limiter.peek(conn, "rl:user:42", 1).await?;
    /// println!("{} left, full again in {:?}", would.remaining, would.reset_after);
    /// # Ok(()) }
    /// ```
    pub async fn peek<C>(&self, conn: &mut C, key: &str, cost: u64) -> Result<RateLimit>
    where
        C: ConnectionLike + Send,
    {
        self.decide(conn, key, cost, true).await
    }

    async fn decide<C>(&self, conn: &mut C, key: &str, cost: u64, peek: bool) -> Result<RateLimit>
    where
        C: ConnectionLike + Send,
    {
        let decision = run_one(&Check::build(self, key, cost, peek)?, conn).await?;
        if !peek {
            crate::observe::decision(&self.name, decision.allowed);
        }
        Ok(decision)
    }

    /// Give back `amount` units of an admitted check (`charge`, the
    /// decision it returned), for example when the work they paid for was
    /// not done. Returns what was given back and what fits now, and lowers
    /// `charge.charged` by what was given back, so a later refund of the
    /// same decision can only give back the rest.
    ///
    /// After [`Error::Indeterminate`] a second refund may give the units
    /// back twice: to send it again safely, use the operation value
    /// [`RefundCharge`] with an operation id.
    ///
    /// A refund undoes only what the charge still holds, so it can never
    /// leave more room than there would be had the refunded units never been
    /// charged, however refunds and checks interleave:
    ///
    /// * GCRA and token bucket: a charge of `c` units drains one unit per
    ///   emission interval from its own arrival; only the part not yet
    ///   drained comes back (`min(amount, c - elapsed / T)`). A refund after
    ///   the limiter would have refilled anyway gives back nothing.
    /// * Fixed window: only while the charge's window is still the current
    ///   one; a refund after that window ended gives back nothing (it never
    ///   lands in the next window).
    /// * Sliding window: from the window that counted the charge (current or
    ///   previous), while it still counts.
    ///
    /// The server does not remember refunds: a copy of the decision taken
    /// before a refund (`RateLimit` is `Copy`) can be refunded again. Keep
    /// one decision per charge and refund through it.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`], [`Error::ZeroLimit`] (`amount` 0),
    /// [`Error::InvalidArgument`] (the charge was denied, a peek, or
    /// refunded in full; or `amount` is above what it holds), before any
    /// I/O; [`Error::Redis`]
    /// (also when the key holds data nolock did not write; nothing is
    /// changed then) and [`Error::Indeterminate`] from Redis. Retrying after
    /// [`Error::Indeterminate`] may refund twice.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limiter: &nolock::rate::Limiter)
    /// #     -> nolock::Result<()> {
    /// let mut d = limiter.check(conn, "rl:user:42", 5).await?;
    /// if d.allowed {
    ///     let upstream_failed = true; // the work was not done
    ///     if upstream_failed {
    ///         let r = limiter.refund(conn, "rl:user:42", &mut d, 5).await?;
    ///         println!("{} units back, {} fit now", r.credited, r.remaining);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn refund<C>(
        &self,
        conn: &mut C,
        key: &str,
        charge: &mut RateLimit,
        amount: u64,
    ) -> Result<Refund>
    where
        C: ConnectionLike + Send,
    {
        let refund = run_one(&RefundCharge::new(self, key, charge, amount)?, conn).await?;
        refund.apply_to(charge);
        Ok(refund)
    }

    /// Forget the state at `key`: the limiter is full again. Idempotent.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] and
    /// [`Error::Indeterminate`] from Redis (safe to retry).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limiter: &nolock::rate::Limiter)
    /// #     -> nolock::Result<()> {
    /// limiter.reset(conn, "rl:user:42").await?; // e.g. after a plan upgrade
    /// # Ok(()) }
    /// ```
    pub async fn reset<C>(&self, conn: &mut C, key: &str) -> Result<()>
    where
        C: ConnectionLike + Send,
    {
        validate::key(key)?;
        super::reset(conn, &[key]).await
    }

    /// The `RateLimit-Policy`, `RateLimit` and `Retry-After` header values for
    /// a decision of this limiter. See [`headers`](super::headers).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use nolock::rate::{Algorithm, Limiter, Quota, RateLimit};
    ///
    /// # fn main() -> nolock::Result<()> {
    /// let limiter = Limiter::new(Algorithm::FixedWindow, Quota::per_minute(100)?)?;
    /// let denied = RateLimit {
    ///     allowed: false,
    ///     limit: 100,
    ///     remaining: 0,
    ///     retry_after: Some(Duration::from_millis(29_001)),
    ///     reset_after: Duration::from_millis(29_001),
    ///     at: UNIX_EPOCH,
    ///     charged: 0,
    /// };
    /// let h = limiter.headers(&denied);
    /// assert_eq!(h.policy, r#""default";q=100;w=60"#);
    /// assert_eq!(h.rate_limit, r#""default";r=0;t=30"#);
    /// assert_eq!(h.retry_after.as_deref(), Some("30"));
    /// # Ok(()) }
    /// ```
    pub fn headers(&self, decision: &RateLimit) -> Headers {
        Headers {
            policy: headers::policy_item(&self.name, &self.quota),
            rate_limit: headers::rate_limit_item(&self.name, decision),
            retry_after: decision.retry_after.map(headers::retry_after_value),
        }
    }
}

/// [`Limiter::check`] as a value, for a [`crate::Batch`]: a thousand rate
/// checks on different keys in one round trip per server. The input is
/// checked when it is built.
///
/// ```no_run
/// use nolock::rate::{Algorithm, Check, Limiter, Quota};
/// use nolock::Batch;
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, users: &[&str]) -> nolock::Result<()> {
/// let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10)?)?;
/// let mut batch = Batch::new();
/// for user in users {
///     batch.push(Check::new(&limiter, &format!("rl:{user}"), 1)?);
/// }
/// for (user, decision) in users.iter().zip(batch.run(conn).await) {
///     println!("{user}: allowed {}", decision?.allowed);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Check {
    call: Invocation,
    quota: Quota,
    /// What an admitted call takes (0 for a peek).
    cost: u64,
}

impl Check {
    /// Take `cost` units for `key` from `limiter` if they fit.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check`] before any I/O.
    ///
    /// ```
    /// use nolock::rate::{Algorithm, Check, Limiter, Quota};
    ///
    /// let limiter = Limiter::new(Algorithm::TokenBucket, Quota::per_minute(100)?)?;
    /// assert!(Check::new(&limiter, "rl:user:42", 20).is_ok());
    /// assert!(Check::new(&limiter, "rl:user:42", 101).is_err()); // could never fit
    /// assert!(Check::new(&limiter, "", 1).is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn new(limiter: &Limiter, key: &str, cost: u64) -> Result<Check> {
        Check::build(limiter, key, cost, false)
    }

    /// The check, or with `peek` the read-only peek, of `limiter` at `key`.
    fn build(limiter: &Limiter, key: &str, cost: u64, peek: bool) -> Result<Check> {
        validate::key(key)?;
        let quotas = [limiter.quota];
        let call = super::decide_call(limiter.algorithm, peek, &[key], &quotas, cost)?;
        Ok(Check {
            call,
            quota: limiter.quota,
            cost: if peek { 0 } else { cost },
        })
    }
}

impl Operation for Check {
    type Output = RateLimit;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<RateLimit> {
        let script = self.call.script().name();
        let decision = super::decode_decision(script, reply, &[self.quota], self.cost)?;
        decision
            .limits
            .into_iter()
            .next()
            .ok_or_else(|| Error::UnexpectedReply {
                script,
                detail: "no limit in the reply".to_owned(),
            })
    }
}

/// A refund of an admitted [`Limiter::check`], as an operation value: for a
/// [`Batch`](crate::Batch), or to give it an operation id
/// ([`Operation::idempotent`]) so that a refund whose reply was lost can be
/// sent again ([`crate::retry::retry`]) without giving the units back twice.
///
/// It gives back what [`Limiter::refund`] would, but it cannot lower the
/// charge it was built from: apply each answer with [`Refund::apply_to`].
/// The charge's state when the operation was built is part of its
/// arguments, so resends of one operation value (with one id) are answered
/// from the first run's record.
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::rate::{Algorithm, Limiter, Quota, RefundCharge};
/// use nolock::retry::{retry, RetryPolicy};
/// use nolock::Operation;
///
/// # async fn run(conn: &mut redis::aio::ConnectionManager) -> nolock::Result<()> {
/// let exports = Limiter::new(Algorithm::Gcra, Quota::per_minute(10)?)?;
/// let mut charge = exports.check(conn, "rl:exports:7", 1).await?;
/// if charge.allowed {
///     // The export failed before doing anything: give the unit back, once.
///     let refund = RefundCharge::new(&exports, "rl:exports:7", &charge, 1)?
///         .idempotent("export-81f2:refund")?;
///     let given = retry(&RetryPolicy::new(Duration::from_secs(2)), conn, &refund).await?;
///     given.apply_to(&mut charge);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RefundCharge {
    call: Invocation,
}

impl RefundCharge {
    /// Give back `amount` of `charge`, the decision `limiter.check` returned
    /// at `key`.
    ///
    /// # Errors
    ///
    /// As [`Limiter::refund`] before any I/O: [`Error::EmptyKey`],
    /// [`Error::ZeroLimit`] (`amount` 0), [`Error::InvalidArgument`] (the
    /// charge holds nothing, or less than `amount`).
    pub fn new(
        limiter: &Limiter,
        key: &str,
        charge: &RateLimit,
        amount: u64,
    ) -> Result<RefundCharge> {
        validate::key(key)?;
        let call = super::refund_call(
            limiter.algorithm,
            &[key],
            &[limiter.quota],
            std::slice::from_ref(charge),
            amount,
        )?;
        Ok(RefundCharge { call })
    }
}

impl Operation for RefundCharge {
    type Output = Refund;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Refund> {
        let script = self.call.script().name();
        super::decode_refunds(script, reply, 1)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::UnexpectedReply {
                script,
                detail: "no limit in the reply".to_owned(),
            })
    }
}

/// A policy name: 1 to 64 ASCII letters, digits, `_ - . :`. It is written
/// into headers (as a structured-field string) and into derived keys.
pub(super) fn valid_name(name: &str) -> Result<String> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(name.to_owned())
    } else {
        Err(Error::InvalidArgument {
            what: "name",
            reason: format!(
                "{name:?} must be 1 to 64 characters of ASCII letters, digits, '_', '-', '.', ':'"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names_are_checked() {
        for good in ["default", "per_second", "a", "tenant:7.hour-1"] {
            assert_eq!(valid_name(good).unwrap(), good);
        }
        for bad in ["", "has space", "quote\"", "é", &"x".repeat(65)] {
            assert!(
                matches!(
                    valid_name(bad),
                    Err(Error::InvalidArgument { what: "name", .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_check_is_the_limiters_call_checked_when_built() {
        use crate::script::words;
        let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
        let check = Check::new(&limiter, "k", 2).unwrap();
        let call = super::super::decide_call(Algorithm::Gcra, false, &["k"], &[limiter.quota], 2);
        assert_eq!(
            words(check.invocation().command()),
            words(call.unwrap().command())
        );
        assert!(matches!(Check::new(&limiter, "", 1), Err(Error::EmptyKey)));
        assert!(matches!(
            Check::new(&limiter, "k", 0),
            Err(Error::ZeroLimit { what: "cost" })
        ));
        assert!(matches!(
            Check::new(&limiter, "k", 11),
            Err(Error::InsufficientCapacity {
                requested: 11,
                limit: 10
            })
        ));
        let peek = Check::build(&limiter, "k", 1, true).unwrap();
        assert_eq!(words(peek.invocation().command())[0], "EVALSHA_RO");
    }

    #[test]
    fn windows_refuse_a_burst_and_huge_products() {
        let bursty = Quota::per_second(10).unwrap().with_burst(20).unwrap();
        assert!(Limiter::new(Algorithm::Gcra, bursty).is_ok());
        assert!(Limiter::new(Algorithm::TokenBucket, bursty).is_ok());
        for alg in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
            assert!(matches!(
                Limiter::new(alg, bursty),
                Err(Error::InvalidArgument { what: "quota", .. })
            ));
        }
        // 10^9 per day: 10^9 × 86 400 000 ms passes 2^53.
        let daily = Quota::per(1_000_000_000, Duration::from_secs(86_400)).unwrap();
        assert!(matches!(
            Limiter::new(Algorithm::SlidingWindow, daily),
            Err(Error::OutOfRange { .. })
        ));
        assert!(Limiter::new(Algorithm::FixedWindow, daily).is_ok());
        assert!(Limiter::new(Algorithm::Gcra, daily).is_ok());
    }
}
