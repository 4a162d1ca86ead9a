//! [`MultiLimiter`]: several limits checked and charged together, all or nothing.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::script::{run_one, Invocation, Operation};

use super::limiter::valid_name;
use super::{headers, Algorithm, Headers, Quota, RateLimit, Refund};
use crate::{keys, validate, Error, Result};

/// Several limits of one [`Algorithm`], checked in **one** script call: either
/// every limit takes the cost or none does, and the answer says which limit
/// denied.
///
/// Typical use: "10 per second *and* 1000 per hour per user, *and* 50 000 per
/// hour per tenant". Checking them one by one with separate calls would charge
/// the per-second limit for a request the hourly limit then refuses.
///
/// # Keys
///
/// A call names one *user key*. Each limit added with [`MultiLimiter::limit`]
/// lives at [`keys::derive(key, name)`](crate::keys::derive), which keeps the
/// user key's hash tag (or makes the whole key the tag), so all of them share
/// one cluster slot. Limits added with [`MultiLimiter::shared_limit`] live at
/// keys the caller passes with each call (a tenant's key, say), in the order
/// they were added; those must be in the same slot, or the call fails before
/// anything is sent with [`Error::CrossSlot`]. Put the shared part in a hash
/// tag: user key `{tenant:7}:user:42` and shared key `{tenant:7}:all`.
///
/// # Example
///
/// ```no_run
/// use nolock::rate::{Algorithm, MultiLimiter, Quota};
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let limits = MultiLimiter::new(Algorithm::SlidingWindow)
///     .limit("second", Quota::per_second(10)?)?
///     .limit("hour", Quota::per_hour(1000)?)?
///     .shared_limit("tenant", Quota::per_hour(50_000)?)?;
///
/// let d = limits.check(conn, "{tenant:7}:user:42", &["{tenant:7}:all"], 1).await?;
/// if let Some(i) = d.denied_by {
///     println!("denied by {:?}; retry in {:?}", limits.name(i), d.retry_after());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiLimiter {
    algorithm: Algorithm,
    names: Vec<String>,
    quotas: Vec<Quota>,
    /// Per limit: true when its key is passed by the caller.
    shared: Vec<bool>,
}

/// [`MultiLimiter::check`] as a value: for a [`crate::Batch`], or to carry
/// an operation id ([`Operation::idempotent`]) so that a resend after a lost
/// reply charges the limits once. Checked when built.
///
/// ```
/// use nolock::rate::{Algorithm, MultiCheck, MultiLimiter, Quota};
/// use nolock::Operation;
///
/// let limits = MultiLimiter::new(Algorithm::Gcra)
///     .limit("second", Quota::per_second(10)?)?
///     .shared_limit("tenant", Quota::per_second(100)?)?;
/// let op = MultiCheck::new(&limits, "{t7}:u42", &["{t7}:all"], 1)?.idempotent("req-9")?;
/// assert!(MultiCheck::new(&limits, "u42", &["{t7}:all"], 1).is_err()); // two slots
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct MultiCheck {
    call: Invocation,
    quotas: Vec<Quota>,
    cost: u64,
}

impl MultiCheck {
    /// Take `cost` from every limit of `limits` at `key` (and
    /// `shared_keys`) if each has room; otherwise take nothing.
    ///
    /// # Errors
    ///
    /// As [`MultiLimiter::check`] before any I/O.
    pub fn new(
        limits: &MultiLimiter,
        key: &str,
        shared_keys: &[&str],
        cost: u64,
    ) -> Result<MultiCheck> {
        let keys = limits.keys(key, shared_keys)?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let call = super::decide_call(limits.algorithm, false, &keys, &limits.quotas, cost)?;
        Ok(MultiCheck {
            call,
            quotas: limits.quotas.clone(),
            cost,
        })
    }
}

impl Operation for MultiCheck {
    type Output = MultiRateLimit;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<MultiRateLimit> {
        let script = self.call.script().name();
        super::decode_decision(script, reply, &self.quotas, self.cost)
    }
}

/// A refund of an admitted [`MultiLimiter::check`], as an operation value:
/// for a [`Batch`](crate::Batch), or to give it an operation id
/// ([`Operation::idempotent`]) so that a refund whose reply was lost can be
/// sent again ([`crate::retry::retry`]) without giving the units back
/// twice. The multi-limit form of [`RefundCharge`](super::RefundCharge):
/// apply its answer with [`MultiRateLimit::apply_refunds`].
///
/// ```
/// use nolock::rate::{Algorithm, MultiLimiter, MultiRefundCharge, Quota};
///
/// let limits = MultiLimiter::new(Algorithm::Gcra)
///     .limit("user", Quota::per_minute(10)?)?
///     .shared_limit("tenant", Quota::per_minute(100)?)?;
/// # let charge = nolock::rate::MultiRateLimit { allowed: false, denied_by: None, limits: vec![] };
/// // A charge that holds nothing (here: built by hand) is refused before any I/O.
/// assert!(MultiRefundCharge::new(&limits, "{t7}:u42", &["{t7}:all"], &charge, 1).is_err());
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct MultiRefundCharge {
    call: Invocation,
    limits: usize,
}

impl MultiRefundCharge {
    /// Give back `amount` of `charge`, the decision `limits.check` returned
    /// at `key` and `shared_keys`.
    ///
    /// # Errors
    ///
    /// As [`MultiLimiter::refund`] before any I/O.
    pub fn new(
        limits: &MultiLimiter,
        key: &str,
        shared_keys: &[&str],
        charge: &MultiRateLimit,
        amount: u64,
    ) -> Result<MultiRefundCharge> {
        let keys = limits.keys(key, shared_keys)?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let call = super::refund_call(
            limits.algorithm,
            &keys,
            &limits.quotas,
            &charge.limits,
            amount,
        )?;
        Ok(MultiRefundCharge {
            call,
            limits: limits.quotas.len(),
        })
    }
}

impl Operation for MultiRefundCharge {
    type Output = Vec<Refund>;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Vec<Refund>> {
        super::decode_refunds(self.call.script().name(), reply, self.limits)
    }
}

/// The answer of a [`MultiLimiter`]: one [`RateLimit`] per limit, in the order
/// the limits were added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a denied request must be turned away"]
pub struct MultiRateLimit {
    /// True when every limit had room and each took the cost. When false,
    /// **no** limit took anything, including those whose own entry says
    /// `allowed`.
    pub allowed: bool,
    /// The first limit (index into `limits`) that had no room; `None` when
    /// admitted.
    pub denied_by: Option<usize>,
    /// Per limit: `allowed` says whether that limit alone had room;
    /// `remaining` and `reset_after` describe its state after the call
    /// (unchanged when the call was denied); `retry_after` is set on the limits
    /// that had no room.
    pub limits: Vec<RateLimit>,
}

impl MultiRateLimit {
    /// How long until this same request would be admitted by every limit, if
    /// nothing else arrives: the longest `retry_after`. `None` when admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        self.limits.iter().filter_map(|l| l.retry_after).max()
    }

    /// The units that fit on every limit right now: the smallest `remaining`.
    pub fn remaining(&self) -> u64 {
        self.limits.iter().map(|l| l.remaining).min().unwrap_or(0)
    }

    /// Take what each refund gave back off its limit's `charged` (one
    /// [`Refund`] per limit, in order, as a [`MultiRefundCharge`] answers).
    /// [`MultiLimiter::refund`] does this itself.
    pub fn apply_refunds(&mut self, refunds: &[Refund]) {
        for (limit, refund) in self.limits.iter_mut().zip(refunds) {
            refund.apply_to(limit);
        }
    }
}

impl MultiLimiter {
    /// An empty set of limits of `algorithm`; add them with
    /// [`MultiLimiter::limit`] and [`MultiLimiter::shared_limit`].
    pub fn new(algorithm: Algorithm) -> MultiLimiter {
        MultiLimiter {
            algorithm,
            names: Vec::new(),
            quotas: Vec::new(),
            shared: Vec::new(),
        }
    }

    /// Add a limit kept per user key, at `keys::derive(key, name)`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad or repeated name (see
    /// [`Limiter::named`](super::Limiter::named)) or a quota the algorithm
    /// cannot honour (see [`Limiter::new`](super::Limiter::new)).
    pub fn limit(self, name: &str, quota: Quota) -> Result<MultiLimiter> {
        self.push(name, quota, false)
    }

    /// Add a limit whose key the caller passes with each call (in
    /// `shared_keys`, in the order shared limits were added): a per-tenant or
    /// global limit that several user keys draw from.
    ///
    /// # Errors
    ///
    /// As [`MultiLimiter::limit`].
    pub fn shared_limit(self, name: &str, quota: Quota) -> Result<MultiLimiter> {
        self.push(name, quota, true)
    }

    fn push(mut self, name: &str, quota: Quota, shared: bool) -> Result<MultiLimiter> {
        let name = valid_name(name)?;
        if self.names.contains(&name) {
            return Err(Error::InvalidArgument {
                what: "name",
                reason: format!("{name:?} is already a limit of this MultiLimiter"),
            });
        }
        self.algorithm.accept(&quota)?;
        self.names.push(name);
        self.quotas.push(quota);
        self.shared.push(shared);
        Ok(self)
    }

    /// The algorithm of every limit.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The number of limits.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when no limit was added.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The name of limit `index` (as in [`MultiRateLimit::denied_by`]).
    pub fn name(&self, index: usize) -> Option<&str> {
        self.names.get(index).map(String::as_str)
    }

    /// The quotas, in the order the limits were added.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// The Redis keys a call with `key` and `shared_keys` touches, one per
    /// limit in order, after every check a call makes before sending anything.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`]; [`Error::InvalidArgument`] when there are no
    /// limits, when `shared_keys` does not hold one key per shared limit, or
    /// when two limits would share a key; [`Error::CrossSlot`] when the keys
    /// are not all in one cluster slot.
    ///
    /// ```
    /// use nolock::rate::{Algorithm, MultiLimiter, Quota};
    ///
    /// # fn main() -> nolock::Result<()> {
    /// let limits = MultiLimiter::new(Algorithm::Gcra)
    ///     .limit("second", Quota::per_second(10)?)?
    ///     .shared_limit("tenant", Quota::per_second(100)?)?;
    /// assert_eq!(
    ///     limits.keys("{t7}:u42", &["{t7}:all"])?,
    ///     ["{t7}#8:{t7}:u42:second", "{t7}:all"]
    /// );
    /// assert!(limits.keys("u42", &["{t7}:all"]).is_err()); // different slots
    /// # Ok(()) }
    /// ```
    pub fn keys(&self, key: &str, shared_keys: &[&str]) -> Result<Vec<String>> {
        validate::key(key)?;
        if self.is_empty() {
            return Err(Error::InvalidArgument {
                what: "limits",
                reason: "a MultiLimiter needs at least one limit".to_owned(),
            });
        }
        let wanted = self.shared.iter().filter(|&&s| s).count();
        if shared_keys.len() != wanted {
            return Err(Error::InvalidArgument {
                what: "shared keys",
                reason: format!(
                    "{} given, but the limiter has {wanted} shared limit(s)",
                    shared_keys.len()
                ),
            });
        }
        let mut shared = shared_keys.iter();
        let mut out: Vec<String> = Vec::with_capacity(self.len());
        for (name, &is_shared) in self.names.iter().zip(&self.shared) {
            let k = if is_shared {
                // The count was checked above, so `next` always has a key.
                let k = shared.next().copied().unwrap_or_default();
                validate::key(k)?;
                k.to_owned()
            } else {
                keys::derive(key, name)
            };
            if out.contains(&k) {
                return Err(Error::InvalidArgument {
                    what: "shared keys",
                    reason: format!("{k:?} would hold two limits; give each limit its own key"),
                });
            }
            out.push(k);
        }
        let refs: Vec<&str> = out.iter().map(String::as_str).collect();
        keys::same_slot(&refs)?;
        Ok(out)
    }

    /// Take `cost` from every limit if each has room; otherwise take nothing.
    /// One script call, one round trip.
    ///
    /// # Errors
    ///
    /// Before any I/O: those of [`MultiLimiter::keys`], [`Error::ZeroLimit`]
    /// (`cost` 0), [`Error::OutOfRange`], [`Error::InsufficientCapacity`] (`cost`
    /// above some limit). From Redis: [`Error::Redis`] (nothing was written)
    /// and [`Error::Indeterminate`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limits: &nolock::rate::MultiLimiter)
    /// #     -> nolock::Result<()> {
    /// let d = limits.check(conn, "{tenant:7}:user:42", &["{tenant:7}:all"], 1).await?;
    /// println!("allowed: {}, {} left on the tightest limit", d.allowed, d.remaining());
    /// # Ok(()) }
    /// ```
    pub async fn check<C>(
        &self,
        conn: &mut C,
        key: &str,
        shared_keys: &[&str],
        cost: u64,
    ) -> Result<MultiRateLimit>
    where
        C: ConnectionLike + Send,
    {
        self.decide(conn, key, shared_keys, cost, false).await
    }

    /// What [`MultiLimiter::check`] would answer, without taking anything
    /// (read-only script, `EVALSHA_RO`).
    ///
    /// # Errors
    ///
    /// As [`MultiLimiter::check`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limits: &nolock::rate::MultiLimiter)
    /// #     -> nolock::Result<()> {
    /// let d = limits.peek(conn, "{tenant:7}:user:42", &["{tenant:7}:all"], 1).await?;
    /// assert_eq!(d.limits.len(), limits.len());
    /// # Ok(()) }
    /// ```
    pub async fn peek<C>(
        &self,
        conn: &mut C,
        key: &str,
        shared_keys: &[&str],
        cost: u64,
    ) -> Result<MultiRateLimit>
    where
        C: ConnectionLike + Send,
    {
        self.decide(conn, key, shared_keys, cost, true).await
    }

    async fn decide<C>(
        &self,
        conn: &mut C,
        key: &str,
        shared_keys: &[&str],
        cost: u64,
        peek: bool,
    ) -> Result<MultiRateLimit>
    where
        C: ConnectionLike + Send,
    {
        let keys = self.keys(key, shared_keys)?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let decision = super::decide(conn, self.algorithm, peek, &keys, &self.quotas, cost).await?;
        if !peek {
            // Each limit is counted under its own name: which one denied shows.
            for (name, limit) in self.names.iter().zip(&decision.limits) {
                crate::observe::decision(name, limit.allowed && decision.allowed);
            }
        }
        Ok(decision)
    }

    /// Give back `amount` units of an admitted check (`charge`, the
    /// decision it returned) to every limit, each only as far as the charge
    /// still holds it (see [`Limiter::refund`](super::Limiter::refund)).
    /// Returns one [`Refund`] per limit, and lowers each limit's `charged`
    /// in `charge` by what it gave back. After [`Error::Indeterminate`] a
    /// second refund may give the units back twice: to send it again
    /// safely, use the operation value [`MultiRefundCharge`] with an
    /// operation id.
    ///
    /// # Errors
    ///
    /// Those of [`MultiLimiter::keys`], [`Error::ZeroLimit`] (`amount` 0),
    /// [`Error::InvalidArgument`] (a denied charge, or `amount` above what
    /// it took) before any I/O; [`Error::Redis`] and
    /// [`Error::Indeterminate`] from Redis.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limits: &nolock::rate::MultiLimiter)
    /// #     -> nolock::Result<()> {
    /// let mut d = limits.check(conn, "{tenant:7}:user:42", &["{tenant:7}:all"], 1).await?;
    /// if d.allowed {
    ///     let back = limits.refund(conn, "{tenant:7}:user:42", &["{tenant:7}:all"], &mut d, 1).await?;
    ///     assert_eq!(back.len(), limits.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn refund<C>(
        &self,
        conn: &mut C,
        key: &str,
        shared_keys: &[&str],
        charge: &mut MultiRateLimit,
        amount: u64,
    ) -> Result<Vec<Refund>>
    where
        C: ConnectionLike + Send,
    {
        let op = MultiRefundCharge::new(self, key, shared_keys, charge, amount)?;
        let refunds = run_one(&op, conn).await?;
        charge.apply_refunds(&refunds);
        Ok(refunds)
    }

    /// Forget every limit's state, shared ones included: all are full again.
    ///
    /// # Errors
    ///
    /// Those of [`MultiLimiter::keys`] before any I/O; [`Error::Redis`] and
    /// [`Error::Indeterminate`] from Redis (safe to retry).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limits: &nolock::rate::MultiLimiter)
    /// #     -> nolock::Result<()> {
    /// limits.reset(conn, "{tenant:7}:user:42", &["{tenant:7}:all"]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset<C>(&self, conn: &mut C, key: &str, shared_keys: &[&str]) -> Result<()>
    where
        C: ConnectionLike + Send,
    {
        let keys = self.keys(key, shared_keys)?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        super::reset(conn, &keys).await
    }

    /// The header values for a decision: every policy in `RateLimit-Policy`,
    /// every limit's state in `RateLimit`, and `Retry-After` from
    /// [`MultiRateLimit::retry_after`].
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use nolock::rate::{Algorithm, MultiLimiter, MultiRateLimit, Quota, RateLimit};
    ///
    /// # fn main() -> nolock::Result<()> {
    /// let limits = MultiLimiter::new(Algorithm::FixedWindow)
    ///     .limit("hour", Quota::per_hour(1000)?)?
    ///     .limit("day", Quota::per(5000, Duration::from_secs(86_400))?)?;
    /// let state = |remaining, reset_s| RateLimit {
    ///     allowed: true,
    ///     limit: 0,
    ///     remaining,
    ///     retry_after: None,
    ///     reset_after: Duration::from_secs(reset_s),
    ///     at: UNIX_EPOCH,
    ///     charged: 0,
    /// };
    /// let d = MultiRateLimit {
    ///     allowed: true,
    ///     denied_by: None,
    ///     limits: vec![state(900, 1200), state(100, 36_000)],
    /// };
    /// let h = limits.headers(&d);
    /// assert_eq!(h.policy, r#""hour";q=1000;w=3600, "day";q=5000;w=86400"#);
    /// assert_eq!(h.rate_limit, r#""hour";r=900;t=1200, "day";r=100;t=36000"#);
    /// assert_eq!(h.retry_after, None);
    /// # Ok(()) }
    /// ```
    pub fn headers(&self, decision: &MultiRateLimit) -> Headers {
        let policy = self
            .names
            .iter()
            .zip(&self.quotas)
            .map(|(name, quota)| headers::policy_item(name, quota))
            .collect::<Vec<_>>()
            .join(", ");
        let rate_limit = self
            .names
            .iter()
            .zip(&decision.limits)
            .map(|(name, limit)| headers::rate_limit_item(name, limit))
            .collect::<Vec<_>>()
            .join(", ");
        Headers {
            policy,
            rate_limit,
            retry_after: decision.retry_after().map(headers::retry_after_value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> MultiLimiter {
        MultiLimiter::new(Algorithm::Gcra)
            .limit("second", Quota::per_second(10).unwrap())
            .unwrap()
            .shared_limit("tenant", Quota::per_second(100).unwrap())
            .unwrap()
    }

    #[test]
    fn keys_are_derived_then_shared_in_order() {
        let limits = two().limit("hour", Quota::per_hour(1000).unwrap()).unwrap();
        assert_eq!(
            limits.keys("{t}:u", &["{t}:all"]).unwrap(),
            ["{t}#5:{t}:u:second", "{t}:all", "{t}#5:{t}:u:hour"]
        );
        let plain = MultiLimiter::new(Algorithm::FixedWindow)
            .limit("a", Quota::per_second(1).unwrap())
            .unwrap();
        assert_eq!(plain.keys("user:1", &[]).unwrap(), ["{user:1}:a"]);
    }

    #[test]
    fn cross_slot_keys_are_refused_with_a_hint() {
        let err = two().keys("u42", &["{t7}:all"]).unwrap_err();
        let Error::CrossSlot {
            first,
            second,
            first_slot,
            second_slot,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(
            (first.as_str(), second.as_str()),
            ("{u42}:second", "{t7}:all")
        );
        assert_eq!(*first_slot, keys::slot("u42"));
        assert_eq!(*second_slot, keys::slot("t7"));
        assert!(err.to_string().contains("hash tag"), "{err}");
        assert!(err.is_invalid_input());
    }

    #[test]
    fn bad_calls_are_refused() {
        let limits = two();
        let invalid = |r: Result<Vec<String>>, what: &str| {
            assert!(
                matches!(&r, Err(Error::InvalidArgument { what: w, .. }) if *w == what),
                "{r:?}"
            )
        };
        invalid(limits.keys("{t}:u", &[]), "shared keys");
        invalid(limits.keys("{t}:u", &["{t}:a", "{t}:b"]), "shared keys");
        invalid(limits.keys("{t}:u", &["{t}#5:{t}:u:second"]), "shared keys");
        invalid(MultiLimiter::new(Algorithm::Gcra).keys("k", &[]), "limits");
        assert!(matches!(limits.keys("", &["{t}:a"]), Err(Error::EmptyKey)));
        assert!(matches!(limits.keys("{t}:u", &[""]), Err(Error::EmptyKey)));
        assert!(matches!(
            two().limit("second", Quota::per_second(1).unwrap()),
            Err(Error::InvalidArgument { what: "name", .. })
        ));
    }
}
