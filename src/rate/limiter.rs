//! [`Limiter`]: one limit, one key.

use redis::aio::ConnectionLike;

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::calendar::run_rebuilt;
use super::charge::Terms;
use super::charge::{next_id, Issuer};
use super::deny_cache::DenyCache;
use super::{headers, Algorithm, Charge, Headers, Quota, RateLimit};
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
    /// What its charges may do when settled.
    terms: Terms,
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
            terms: Terms::default(),
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
    /// The cache never admits, and never outlives the server's answer: a
    /// denial is kept for `r` less 1 ms (the server rounds `r` up) from
    /// when the denied request was *sent*, before the server decided. A
    /// refund through one of this limiter's charges ([`Charge::refund`])
    /// and [`Limiter::reset`] forget the key's entry, so the next check
    /// asks the server; a refund or reset made by another process cannot
    /// reach this cache, and its denial then lasts at most `r`. Each entry
    /// expires on its own; when the cache is full, the denial closest to
    /// its end makes room. Clones share the cache. [`Limiter::peek`] and
    /// batched [`Check`]s do not use it.
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

    /// The same limiter, with a cap on how far a settlement of its charges
    /// ([`Charge::settle`]) may push the limit past empty: the debt a
    /// settlement leaves is at most `units`, counting the debt already
    /// there (a limit already `units` in debt takes no more). An excess
    /// beyond it is not charged, and the settlement says so
    /// ([`super::Settlement::uncharged`]). Default: no cap.
    ///
    /// ```
    /// use nolock::rate::{Algorithm, Limiter, Quota};
    /// // Tokens per minute; settlements may leave a minute's worth of debt at most.
    /// let tpm = Limiter::new(Algorithm::Gcra, Quota::per_minute(100_000)?)?.with_debt_cap(100_000);
    /// # let _ = tpm;
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn with_debt_cap(self, units: u64) -> Limiter {
        Limiter {
            terms: Terms {
                debt_cap: Some(units.min(crate::MAX_INTEGER)),
                ..self.terms
            },
            ..self
        }
    }

    /// The same limiter, whose calls adopt a state tagged with other numbers
    /// of its algorithm (`lua/lib/tag.lua`) and retag it: for the handles of
    /// stored configurations, whose numbers change only by a declared
    /// change ([`crate::config::Configs::set`]).
    pub(crate) fn adopting(self) -> Limiter {
        Limiter {
            terms: Terms {
                adopt: true,
                ..self.terms
            },
            ..self
        }
    }

    /// True for a limiter built by [`Limiter::adopting`].
    pub(crate) fn adopts(&self) -> bool {
        self.terms.adopt
    }

    /// The same limiter, whose charges can be settled ([`Charge::settle`])
    /// for `within` after their check; after that a charge counts as settled
    /// at its reservation. Default [`super::DEFAULT_SETTLE_WITHIN`] (an
    /// hour). A settled charge's record is kept that long.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] under 1 ms; [`Error::DurationTooLong`] above
    /// [`crate::MAX_TTL`].
    pub fn settle_within(self, within: Duration) -> Result<Limiter> {
        let ms = validate::millis("settle_within", within)?;
        Ok(Limiter {
            terms: Terms {
                settle_within: Duration::from_millis(ms),
                ..self.terms
            },
            ..self
        })
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

    /// What a check of `cost` at `key` needs to hand out its charge.
    pub(super) fn issuer(&self, key: &str, cost: u64) -> Issuer {
        Issuer {
            id: next_id(),
            algorithm: self.algorithm,
            quotas: vec![self.quota],
            keys: vec![key.to_owned()],
            cost,
            terms: self.terms,
            cache: self.denials.as_ref().map(|d| Arc::clone(&d.0)),
        }
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
    pub async fn check<C>(&self, conn: &mut C, key: &str, cost: u64) -> Result<Decision>
    where
        C: ConnectionLike + Send,
    {
        let Some(Denials(cache)) = &self.denials else {
            return run_rebuilt(|| Check::new(self, key, cost), conn).await;
        };
        // Input errors come first, as without the cache.
        let check = Check::new(self, key, cost)?;
        let sent = Instant::now();
        if let Some(local) = cache.denied(key, cost, sent) {
            crate::observe::decision(&self.name, false);
            return Ok(Decision::uncharged(local));
        }
        let decision = match run_one(&check, conn).await {
            Err(err @ Error::PeriodMismatch { .. }) => {
                let again = super::calendar::rebuild(err, || Check::new(self, key, cost))?;
                run_one(&again, conn).await?
            }
            other => other?,
        };
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
            Algorithm::FixedWindow | Algorithm::Calendar => reset,
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
        Ok(run_rebuilt(|| Check::build(self, key, cost, true), conn)
            .await?
            .rate)
    }

    /// Forget the state at `key`: the limiter is full again. Idempotent.
    ///
    /// Every charge taken on `key` before the reset loses its power: its
    /// refunds give nothing back and its settlements answer
    /// [`Settle::Expired`](super::Settle::Expired), since the units it took
    /// were forgiven here and later checks may have used them. The reset
    /// leaves a marker beside the key for that (`lua/rate/reset.lua`), kept
    /// as long as such a charge could act: until it drained (for GCRA and
    /// the token bucket `burst × T`, one window for the fixed window, two for
    /// the sliding window) or until this limiter's settle deadline
    /// ([`Limiter::settle_within`], an hour by default), whichever is later.
    ///
    /// This limiter's cached denials of `key` are forgotten too
    /// ([`Limiter::with_local_deny_cache`]); a reset made by another process
    /// cannot reach this process's cache.
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
        if let Some(Denials(cache)) = &self.denials {
            cache.forget(key);
        }
        super::reset(conn, self.algorithm, &[self.quota], &self.terms, &[key]).await?;
        // A check that was in flight during the reset may have cached a
        // denial the reset has since made stale.
        if let Some(Denials(cache)) = &self.denials {
            cache.forget(key);
        }
        Ok(())
    }

    /// The `RateLimit-Policy`, `RateLimit` and `Retry-After` header values for
    /// a decision of this limiter. See [`headers`](super::headers).
    ///
    /// ```no_run
    /// use nolock::rate::{Algorithm, Limiter, Quota};
    ///
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let limiter = Limiter::new(Algorithm::FixedWindow, Quota::per_minute(100)?)?;
    /// let decision = limiter.check(conn, "rl:user:42", 1).await?;
    /// let h = limiter.headers(&decision);
    /// assert_eq!(h.policy, r#""default";q=100;w=60"#);
    /// // e.g. `"default";r=99;t=60`, and after a denial `"default";r=0;t=30`
    /// // with `Retry-After: 30`.
    /// println!("{} / {} / {:?}", h.policy, h.rate_limit, h.retry_after);
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
///
/// Each `Check` value is one charge: an admission it answers carries a
/// [`Charge`] with the id drawn when the value was built. Build one value
/// per request; running one value twice (without an operation id) takes
/// its cost twice, but both admissions share one charge id, so refunds of
/// the two give back at most one cost in total.
#[derive(Debug, Clone)]
pub struct Check {
    call: Invocation,
    algorithm: Algorithm,
    quota: Quota,
    cost: u64,
    name: String,
    /// `None` for a peek: it charges nothing.
    issuer: Option<Issuer>,
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
        let call = super::decide_call(
            limiter.algorithm,
            peek,
            &[key],
            &quotas,
            cost,
            limiter.terms.adopt,
        )?;
        let issuer = (!peek).then(|| limiter.issuer(key, cost));
        Ok(Check {
            call,
            algorithm: limiter.algorithm,
            quota: limiter.quota,
            cost,
            name: limiter.name.clone(),
            issuer,
        })
    }
}

impl Operation for Check {
    type Output = Decision;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Decision> {
        let script = self.call.script().name();
        let peek = self.issuer.is_none();
        let decided = super::decode_decision(
            script,
            reply,
            self.algorithm,
            &[self.quota],
            self.cost,
            peek,
        )?;
        let rate = *decided
            .limits
            .first()
            .ok_or_else(|| Error::UnexpectedReply {
                script,
                detail: "no limit in the reply".to_owned(),
            })?;
        let charge = match &self.issuer {
            Some(issuer) => {
                crate::observe::decision(&self.name, rate.allowed);
                rate.allowed
                    .then(|| issuer.charge(issuer.cost, rate.at, rate.reset_after))
            }
            None => None,
        };
        Ok(Decision { rate, charge })
    }
}

/// The answer of [`Limiter::check`] (and of a [`Check`]): what the limiter
/// said ([`RateLimit`], which this dereferences to: `decision.allowed`,
/// `decision.remaining`, ...) and, when it admitted, the [`Charge`] that can
/// give the units back.
///
/// Not `Copy` and not `Clone`: it carries the charge. Copy out the
/// information with `*decision` (a [`RateLimit`]); take the charge with
/// [`Decision::into_charge`].
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limiter: &nolock::rate::Limiter)
/// #     -> nolock::Result<()> {
/// let decision = limiter.check(conn, "rl:user:42", 1).await?;
/// if !decision.allowed {
///     println!("429, retry in {:?}", decision.retry_after);
/// }
/// let info: nolock::rate::RateLimit = *decision; // the information, Copy
/// # let _ = info;
/// # Ok(()) }
/// ```
#[derive(PartialEq, Eq)]
#[must_use = "a denied request must be turned away"]
pub struct Decision {
    rate: RateLimit,
    charge: Option<Charge>,
}

impl Decision {
    /// A decision that charged nothing (a cached or local denial).
    pub(crate) fn uncharged(rate: RateLimit) -> Decision {
        Decision { rate, charge: None }
    }

    /// The charge, when the check admitted.
    pub fn charge(&self) -> Option<&Charge> {
        self.charge.as_ref()
    }

    /// The charge, to refund in place ([`Charge::refund`]).
    pub fn charge_mut(&mut self) -> Option<&mut Charge> {
        self.charge.as_mut()
    }

    /// The charge, to keep beyond the decision (a job's payload, a guard
    /// that refunds on failure).
    pub fn into_charge(self) -> Option<Charge> {
        self.charge
    }

    /// The information and the charge, apart.
    pub fn into_parts(self) -> (RateLimit, Option<Charge>) {
        (self.rate, self.charge)
    }
}

impl Deref for Decision {
    type Target = RateLimit;

    fn deref(&self) -> &RateLimit {
        &self.rate
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("rate", &self.rate)
            .field("charge", &self.charge)
            .finish()
    }
}

/// A policy name: 1 to 64 ASCII letters, digits, `_ - . :`. It is written
/// into headers (as a structured-field string) and into derived keys.
pub(crate) fn valid_name(name: &str) -> Result<String> {
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
        let call =
            super::super::decide_call(Algorithm::Gcra, false, &["k"], &[limiter.quota], 2, false);
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
