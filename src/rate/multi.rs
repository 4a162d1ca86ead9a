//! [`MultiLimiter`]: several limits checked and charged together, all or nothing.
//!
//! Over 700 lines only with its unit tests (the code is about 600).

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::calendar::run_rebuilt;
use crate::script::{Invocation, Operation};

use super::charge::Terms;
use super::charge::{next_id, Issuer};
use super::limiter::valid_name;
use super::{headers, Algorithm, Headers, MultiCharge, Quota, RateLimit};
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
/// A call names one *user key* ([`MultiKey`]). Each limit added with
/// [`MultiLimiter::limit`] lives at [`keys::derive(key, name)`](crate::keys::derive),
/// which keeps the user key's hash tag (or makes the whole key the tag), so
/// all of them share one cluster slot. Limits added with
/// [`MultiLimiter::shared_limit`] live at keys the caller names with each
/// call, by the limit's name ([`MultiKey::shared`]: a tenant's key, say);
/// those must be in the same slot, or the call fails before anything is
/// sent with [`Error::CrossSlot`]. Put the shared part in a hash tag: user
/// key `{tenant:7}:user:42` and shared key `{tenant:7}:all`.
///
/// # Example
///
/// ```no_run
/// use nolock::rate::{Algorithm, MultiKey, MultiLimiter, Quota};
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let limits = MultiLimiter::new(Algorithm::SlidingWindow)
///     .limit("second", Quota::per_second(10)?)?
///     .limit("hour", Quota::per_hour(1000)?)?
///     .shared_limit("tenant", Quota::per_hour(50_000)?)?;
///
/// let key = MultiKey::new("{tenant:7}:user:42").shared("tenant", "{tenant:7}:all");
/// let d = limits.check(conn, key, 1).await?;
/// if let Some(i) = d.denied_by {
///     println!("denied by {:?}; retry in {:?}", limits.name(i), d.retry_after());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiLimiter {
    algorithm: Algorithm,
    /// What its charges may do when settled.
    terms: Terms,
    names: Vec<String>,
    quotas: Vec<Quota>,
    /// Per limit: true when its key is passed by the caller.
    shared: Vec<bool>,
}

/// The keys of one [`MultiLimiter`] call: the user key, and the key of each
/// shared limit, named.
///
/// A limiter without shared limits takes a plain `&str` (it converts); one
/// with shared limits needs each of them named exactly once, so keys can
/// never be matched to the wrong limit by their order.
///
/// ```
/// use nolock::rate::{Algorithm, MultiKey, MultiLimiter, Quota};
///
/// let limits = MultiLimiter::new(Algorithm::Gcra)
///     .limit("second", Quota::per_second(10)?)?
///     .shared_limit("tenant", Quota::per_second(100)?)?;
/// let key = MultiKey::new("{t7}:u42").shared("tenant", "{t7}:all");
/// assert_eq!(limits.keys(&key)?, ["{t7}#8:{t7}:u42:second", "{t7}:all"]);
/// assert!(limits.keys(&MultiKey::new("{t7}:u42")).is_err()); // "tenant" not named
/// assert!(limits.keys(&key.clone().shared("region", "{t7}:eu")).is_err()); // no such limit
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiKey {
    key: String,
    shared: Vec<(String, String)>,
}

impl MultiKey {
    /// The user key: every limit added with [`MultiLimiter::limit`] derives
    /// its key from it.
    pub fn new(key: &str) -> MultiKey {
        MultiKey {
            key: key.to_owned(),
            shared: Vec::new(),
        }
    }

    /// The key of the shared limit named `limit` (added with
    /// [`MultiLimiter::shared_limit`]) for this call.
    pub fn shared(mut self, limit: &str, key: &str) -> MultiKey {
        self.shared.push((limit.to_owned(), key.to_owned()));
        self
    }

    /// The user key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl From<&str> for MultiKey {
    fn from(key: &str) -> MultiKey {
        MultiKey::new(key)
    }
}

impl From<&String> for MultiKey {
    fn from(key: &String) -> MultiKey {
        MultiKey::new(key)
    }
}

/// [`MultiLimiter::check`] as a value: for a [`crate::Batch`], or to carry
/// an operation id ([`Operation::idempotent`]) so that a resend after a lost
/// reply charges the limits once. Checked when built. Like a
/// [`Check`](super::Check), each value is one charge.
///
/// ```
/// use nolock::rate::{Algorithm, MultiCheck, MultiKey, MultiLimiter, Quota};
/// use nolock::Operation;
///
/// let limits = MultiLimiter::new(Algorithm::Gcra)
///     .limit("second", Quota::per_second(10)?)?
///     .shared_limit("tenant", Quota::per_second(100)?)?;
/// let key = MultiKey::new("{t7}:u42").shared("tenant", "{t7}:all");
/// let op = MultiCheck::new(&limits, key, 1)?.idempotent("req-9")?;
/// let two_slots = MultiKey::new("u42").shared("tenant", "{t7}:all");
/// assert!(MultiCheck::new(&limits, two_slots, 1).is_err());
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct MultiCheck {
    call: Invocation,
    algorithm: Algorithm,
    quotas: Vec<Quota>,
    cost: u64,
    names: Vec<String>,
    /// `None` for a peek: it charges nothing.
    issuer: Option<Issuer>,
}

impl MultiCheck {
    /// Take `cost` from every limit of `limits` at `key` if each has room;
    /// otherwise take nothing.
    ///
    /// # Errors
    ///
    /// As [`MultiLimiter::check`] before any I/O.
    pub fn new(limits: &MultiLimiter, key: impl Into<MultiKey>, cost: u64) -> Result<MultiCheck> {
        MultiCheck::build(limits, &key.into(), cost, false)
    }

    fn build(limits: &MultiLimiter, key: &MultiKey, cost: u64, peek: bool) -> Result<MultiCheck> {
        let keys = limits.keys(key)?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let call = super::decide_call(
            limits.algorithm,
            peek,
            &refs,
            &limits.quotas,
            cost,
            limits.terms.adopt,
        )?;
        let issuer = (!peek).then(|| Issuer {
            id: next_id(),
            algorithm: limits.algorithm,
            quotas: limits.quotas.clone(),
            keys,
            cost,
            terms: limits.terms,
            cache: None,
        });
        Ok(MultiCheck {
            call,
            algorithm: limits.algorithm,
            quotas: limits.quotas.clone(),
            cost,
            names: limits.names.clone(),
            issuer,
        })
    }

    /// Decodes the reply of this check (or peek).
    fn decided(&self, reply: redis::Value) -> Result<super::Decided> {
        let script = self.call.script().name();
        let peek = self.issuer.is_none();
        super::decode_decision(script, reply, self.algorithm, &self.quotas, self.cost, peek)
    }
}

impl Operation for MultiCheck {
    type Output = MultiRateLimit;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<MultiRateLimit> {
        let decided = self.decided(reply)?;
        let charge = match &self.issuer {
            Some(issuer) => {
                // Each limit is counted under its own name: which one denied shows.
                for (name, limit) in self.names.iter().zip(&decided.limits) {
                    crate::observe::decision(name, limit.allowed && decided.allowed);
                }
                decided
                    .allowed
                    .then(|| issuer.multi_charge(decided.at(), &decided.resets()))
            }
            None => None,
        };
        Ok(MultiRateLimit {
            allowed: decided.allowed,
            denied_by: decided.denied_by,
            limits: decided.limits,
            charge,
        })
    }
}

/// The answer of a [`MultiLimiter`]: one [`RateLimit`] per limit, in the
/// order the limits were added, and when admitted the [`MultiCharge`] that
/// can give the units back. Not `Clone`: it carries the charge.
#[derive(PartialEq, Eq)]
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
    charge: Option<MultiCharge>,
}

impl MultiRateLimit {
    /// A decision that charged nothing (a peek, a local fallback).
    pub(crate) fn uncharged(allowed: bool, limits: Vec<RateLimit>) -> MultiRateLimit {
        MultiRateLimit {
            allowed,
            denied_by: limits.iter().position(|l| !l.allowed),
            limits,
            charge: None,
        }
    }

    /// How long until this same request would be admitted by every limit, if
    /// nothing else arrives: the longest `retry_after`. `None` when admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        self.limits.iter().filter_map(|l| l.retry_after).max()
    }

    /// The units that fit on every limit right now: the smallest `remaining`.
    pub fn remaining(&self) -> u64 {
        self.limits.iter().map(|l| l.remaining).min().unwrap_or(0)
    }

    /// The charge, when the check admitted.
    pub fn charge(&self) -> Option<&MultiCharge> {
        self.charge.as_ref()
    }

    /// The charge, to refund in place ([`MultiCharge::refund`]).
    pub fn charge_mut(&mut self) -> Option<&mut MultiCharge> {
        self.charge.as_mut()
    }

    /// The charge, to keep beyond the decision.
    pub fn into_charge(self) -> Option<MultiCharge> {
        self.charge
    }
}

impl fmt::Debug for MultiRateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiRateLimit")
            .field("allowed", &self.allowed)
            .field("denied_by", &self.denied_by)
            .field("limits", &self.limits)
            .field("charge", &self.charge)
            .finish()
    }
}

impl MultiLimiter {
    /// An empty set of limits of `algorithm`; add them with
    /// [`MultiLimiter::limit`] and [`MultiLimiter::shared_limit`].
    pub fn new(algorithm: Algorithm) -> MultiLimiter {
        MultiLimiter {
            algorithm,
            terms: Terms::default(),
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

    /// Add a limit whose key the caller names with each call
    /// ([`MultiKey::shared`], by this limit's name): a per-tenant or global
    /// limit that several user keys draw from.
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

    /// The same limits, whose calls adopt a state tagged with other numbers
    /// of their algorithm (as [`super::Limiter`]'s, for the handles of
    /// stored configurations).
    pub(crate) fn adopting(self) -> MultiLimiter {
        MultiLimiter {
            terms: Terms {
                adopt: true,
                ..self.terms
            },
            ..self
        }
    }

    /// [`Limiter::with_debt_cap`](super::Limiter::with_debt_cap) for every
    /// limit: how far one settlement may push each past empty.
    pub fn with_debt_cap(self, units: u64) -> MultiLimiter {
        MultiLimiter {
            terms: Terms {
                debt_cap: Some(units.min(crate::MAX_INTEGER)),
                ..self.terms
            },
            ..self
        }
    }

    /// [`Limiter::settle_within`](super::Limiter::settle_within) for this
    /// limiter's charges.
    ///
    /// # Errors
    ///
    /// As [`Limiter::settle_within`](super::Limiter::settle_within).
    pub fn settle_within(self, within: Duration) -> Result<MultiLimiter> {
        let ms = validate::millis("settle_within", within)?;
        Ok(MultiLimiter {
            terms: Terms {
                settle_within: Duration::from_millis(ms),
                ..self.terms
            },
            ..self
        })
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

    /// The Redis keys a call with `key` touches, one per limit in order,
    /// after every check a call makes before sending anything.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`]; [`Error::InvalidArgument`] when there are no
    /// limits, when `key` does not name each shared limit exactly once (or
    /// names one the limiter does not have), or when two limits would share
    /// a key; [`Error::CrossSlot`] when the keys are not all in one cluster
    /// slot.
    pub fn keys(&self, key: &MultiKey) -> Result<Vec<String>> {
        validate::key(&key.key)?;
        if self.is_empty() {
            return Err(Error::InvalidArgument {
                what: "limits",
                reason: "a MultiLimiter needs at least one limit".to_owned(),
            });
        }
        for (i, (name, _)) in key.shared.iter().enumerate() {
            let known = self
                .names
                .iter()
                .zip(&self.shared)
                .any(|(n, &s)| s && n == name);
            let repeated = key.shared[..i].iter().any(|(n, _)| n == name);
            if !known || repeated {
                return Err(Error::InvalidArgument {
                    what: "shared keys",
                    reason: format!(
                        "{name:?} is {} shared limit of this MultiLimiter",
                        if repeated {
                            "named twice as a"
                        } else {
                            "not a"
                        }
                    ),
                });
            }
        }
        let mut out: Vec<String> = Vec::with_capacity(self.len());
        for (name, &is_shared) in self.names.iter().zip(&self.shared) {
            let k = if is_shared {
                let Some((_, k)) = key.shared.iter().find(|(n, _)| n == name) else {
                    return Err(Error::InvalidArgument {
                        what: "shared keys",
                        reason: format!("no key for the shared limit {name:?}"),
                    });
                };
                validate::key(k)?;
                k.clone()
            } else {
                keys::derive(&key.key, name)
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
    /// One script call, one round trip. An admission carries a
    /// [`MultiCharge`] that can give the units back.
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
    /// use nolock::rate::MultiKey;
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limits: &nolock::rate::MultiLimiter)
    /// #     -> nolock::Result<()> {
    /// let key = MultiKey::new("{tenant:7}:user:42").shared("tenant", "{tenant:7}:all");
    /// let mut d = limits.check(conn, key, 1).await?;
    /// println!("allowed: {}, {} left on the tightest limit", d.allowed, d.remaining());
    /// if let Some(charge) = d.charge_mut() {
    ///     // The work failed: give the unit back to every limit.
    ///     let back = charge.refund(conn, 1).await?;
    ///     assert_eq!(back.len(), limits.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check<C>(
        &self,
        conn: &mut C,
        key: impl Into<MultiKey>,
        cost: u64,
    ) -> Result<MultiRateLimit>
    where
        C: ConnectionLike + Send,
    {
        let key = key.into();
        run_rebuilt(|| MultiCheck::new(self, key.clone(), cost), conn).await
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
    /// use nolock::rate::MultiKey;
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limits: &nolock::rate::MultiLimiter)
    /// #     -> nolock::Result<()> {
    /// let key = MultiKey::new("{tenant:7}:user:42").shared("tenant", "{tenant:7}:all");
    /// let d = limits.peek(conn, key, 1).await?;
    /// assert_eq!(d.limits.len(), limits.len());
    /// # Ok(()) }
    /// ```
    pub async fn peek<C>(
        &self,
        conn: &mut C,
        key: impl Into<MultiKey>,
        cost: u64,
    ) -> Result<MultiRateLimit>
    where
        C: ConnectionLike + Send,
    {
        let key = key.into();
        run_rebuilt(|| MultiCheck::build(self, &key, cost, true), conn).await
    }

    /// Forget every limit's state, shared ones included: all are full again,
    /// and every charge taken on them before loses its power to refund or
    /// settle (see [`Limiter::reset`](super::Limiter::reset)).
    ///
    /// # Errors
    ///
    /// Those of [`MultiLimiter::keys`] before any I/O; [`Error::Redis`] and
    /// [`Error::Indeterminate`] from Redis (safe to retry).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use nolock::rate::MultiKey;
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limits: &nolock::rate::MultiLimiter)
    /// #     -> nolock::Result<()> {
    /// limits.reset(conn, MultiKey::new("{tenant:7}:user:42").shared("tenant", "{tenant:7}:all")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset<C>(&self, conn: &mut C, key: impl Into<MultiKey>) -> Result<()>
    where
        C: ConnectionLike + Send,
    {
        let keys = self.keys(&key.into())?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        super::reset(conn, self.algorithm, &self.quotas, &self.terms, &keys).await
    }

    /// The header values for a decision: every policy in `RateLimit-Policy`,
    /// every limit's state in `RateLimit`, and `Retry-After` from
    /// [`MultiRateLimit::retry_after`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use nolock::rate::{Algorithm, MultiLimiter, Quota};
    ///
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let limits = MultiLimiter::new(Algorithm::FixedWindow)
    ///     .limit("hour", Quota::per_hour(1000)?)?
    ///     .limit("day", Quota::per(5000, Duration::from_secs(86_400))?)?;
    /// let d = limits.check(conn, "user:42", 1).await?;
    /// let h = limits.headers(&d);
    /// assert_eq!(h.policy, r#""hour";q=1000;w=3600, "day";q=5000;w=86400"#);
    /// // e.g. `"hour";r=999;t=3600, "day";r=4999;t=86400`
    /// println!("{}", h.rate_limit);
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
    use std::time::UNIX_EPOCH;

    fn two() -> MultiLimiter {
        MultiLimiter::new(Algorithm::Gcra)
            .limit("second", Quota::per_second(10).unwrap())
            .unwrap()
            .shared_limit("tenant", Quota::per_second(100).unwrap())
            .unwrap()
    }

    fn tenant(key: &str, shared: &str) -> MultiKey {
        MultiKey::new(key).shared("tenant", shared)
    }

    #[test]
    fn keys_are_derived_or_named() {
        let limits = two().limit("hour", Quota::per_hour(1000).unwrap()).unwrap();
        assert_eq!(
            limits.keys(&tenant("{t}:u", "{t}:all")).unwrap(),
            ["{t}#5:{t}:u:second", "{t}:all", "{t}#5:{t}:u:hour"]
        );
        let plain = MultiLimiter::new(Algorithm::FixedWindow)
            .limit("a", Quota::per_second(1).unwrap())
            .unwrap();
        assert_eq!(plain.keys(&"user:1".into()).unwrap(), ["{user:1}:a"]);
    }

    #[test]
    fn shared_keys_go_to_their_named_limit_whatever_the_order() {
        let limits = MultiLimiter::new(Algorithm::Gcra)
            .shared_limit("tenant", Quota::per_second(100).unwrap())
            .unwrap()
            .shared_limit("global", Quota::per_second(1000).unwrap())
            .unwrap();
        let a = MultiKey::new("{t}:u")
            .shared("global", "{t}:g")
            .shared("tenant", "{t}:t");
        let b = MultiKey::new("{t}:u")
            .shared("tenant", "{t}:t")
            .shared("global", "{t}:g");
        assert_eq!(limits.keys(&a).unwrap(), ["{t}:t", "{t}:g"]);
        assert_eq!(limits.keys(&a).unwrap(), limits.keys(&b).unwrap());
    }

    #[test]
    fn cross_slot_keys_are_refused_with_a_hint() {
        let err = two().keys(&tenant("u42", "{t7}:all")).unwrap_err();
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
        invalid(limits.keys(&"{t}:u".into()), "shared keys");
        invalid(
            limits.keys(&tenant("{t}:u", "{t}:a").shared("tenant", "{t}:b")),
            "shared keys",
        );
        invalid(
            limits.keys(&tenant("{t}:u", "{t}:a").shared("second", "{t}:b")),
            "shared keys",
        );
        invalid(
            limits.keys(&tenant("{t}:u", "{t}#5:{t}:u:second")),
            "shared keys",
        );
        invalid(
            MultiLimiter::new(Algorithm::Gcra).keys(&"k".into()),
            "limits",
        );
        assert!(matches!(
            limits.keys(&tenant("", "{t}:a")),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            limits.keys(&tenant("{t}:u", "")),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            two().limit("second", Quota::per_second(1).unwrap()),
            Err(Error::InvalidArgument { what: "name", .. })
        ));
    }

    #[test]
    fn headers_list_every_limit() {
        let limits = MultiLimiter::new(Algorithm::FixedWindow)
            .limit("hour", Quota::per_hour(1000).unwrap())
            .unwrap()
            .limit(
                "day",
                Quota::per(5000, Duration::from_secs(86_400)).unwrap(),
            )
            .unwrap();
        let state = |remaining, reset_s| RateLimit {
            allowed: true,
            limit: 0,
            remaining,
            retry_after: None,
            reset_after: Duration::from_secs(reset_s),
            at: UNIX_EPOCH,
            debt: 0,
            period_end: None,
        };
        let d = MultiRateLimit::uncharged(true, vec![state(900, 1200), state(100, 36_000)]);
        let h = limits.headers(&d);
        assert_eq!(h.policy, r#""hour";q=1000;w=3600, "day";q=5000;w=86400"#);
        assert_eq!(h.rate_limit, r#""hour";r=900;t=1200, "day";r=100;t=36000"#);
        assert_eq!(h.retry_after, None);
    }
}
