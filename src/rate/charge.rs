//! Charges: the receipts of admitted checks, and the refunds they allow.
//!
//! A check that admits hands back a [`Charge`] (one limit) or a
//! [`MultiCharge`] (a [`super::MultiLimiter`]'s limits). It names what it was
//! taken on (algorithm, quotas, keys), when, and what it cost; a refund is
//! a call *of the charge*, so it cannot be pointed at another key or
//! limiter. It is neither `Copy` nor `Clone`, its fields are private, and
//! only a check builds one.
//!
//! The server caps what every copy of one charge can give back: each
//! charge has an id, and the first refund that gives anything back stores a
//! record in the limits' slot (`lua/lib/refund.lua`) of what is left of it;
//! every later refund of that id, from this value, a deserialized copy or
//! another process, gives back at most that. So the units credited for one
//! charge never sum above its cost.
//!
//! Why one file of over 700 lines: the receipt's fields are private to this
//! module (that is what keeps a charge from being built in code; a
//! hand-edited serialized charge is another matter, see [`Charge`]), and everything
//! that must read or lower them lives here with it: the issuer, the refund
//! operations and their replies, the validated serde form; about 130 lines
//! are unit tests.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use super::calendar::run_rebuilt;
use super::deny_cache::DenyCache;
use super::state::State;
use super::RateLimit;
use super::{Algorithm, Quota, Refund};
use crate::script::{Invocation, Operation, Reply};
use crate::{keys, validate, Error, Result};

/// What a [`Charge`] and a [`MultiCharge`] hold.
pub(super) struct Receipt {
    /// 32 lowercase hex digits, unique per check.
    id: String,
    algorithm: Algorithm,
    quotas: Vec<Quota>,
    keys: Vec<String>,
    /// The server time of the admission, microseconds since the Unix epoch.
    at_us: u64,
    /// What the check took, on every limit.
    cost: u64,
    /// Per limit: units not yet given back, as this value counts them.
    held: Vec<u64>,
    /// Per limit: the admission's `reset_after`, milliseconds.
    reset_ms: Vec<u64>,
    /// How far a settlement may push a limit past empty, in units.
    debt_cap: Option<u64>,
    /// After this server time (ms since the epoch) the charge counts as
    /// settled at its cost.
    settle_by_ms: u64,
    /// The issuing limiter's deny cache: a refund that gave anything back
    /// forgets its cached denials of these keys.
    cache: Option<Arc<DenyCache>>,
    /// Sends `adopt` with its refunds ([`Terms::adopt`]).
    adopt: bool,
}

impl Receipt {
    fn held(&self) -> u64 {
        self.held.iter().copied().max().unwrap_or(0)
    }

    /// The refund script's call for `amount`, checked before any I/O.
    fn refund_call(&self, amount: u64) -> Result<Invocation> {
        let amount = validate::positive("amount", amount)?;
        let held = self.held();
        if held == 0 {
            return Err(Error::InvalidArgument {
                what: "charge",
                reason: "holds nothing: refunded in full already".to_owned(),
            });
        }
        if amount > held {
            return Err(Error::InvalidArgument {
                what: "amount",
                reason: format!("{amount} is more than the {held} units the charge still holds"),
            });
        }
        self.call(amount, 0)
    }

    /// The settlement's call at the real cost `actual`.
    pub(super) fn settle_call(&self, actual: u64) -> Result<Invocation> {
        let actual = validate::at_most("actual", actual, crate::MAX_INTEGER)?;
        self.call(0, actual)
    }

    /// `lua/rate/<algorithm>/refund.lua` for a refund of `amount`, or (with
    /// `amount` 0) a settlement at `actual` (see `lua/lib/refund`). Both
    /// carry the charge's deadline and read the limits' reset markers:
    /// after either, the charge can change nothing.
    fn call(&self, amount: u64, actual: u64) -> Result<Invocation> {
        let record = keys::derive(&self.keys[0], &format!("charge#{}", self.id));
        let markers: Vec<String> = self.keys.iter().map(|k| super::reset_marker(k)).collect();
        let mut keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        keys.push(&record);
        keys.extend(markers.iter().map(String::as_str));
        let script = &self.algorithm.scripts().refund;
        let mut call = Invocation::new(script, &keys)
            .arg(amount)
            .arg(actual)
            .arg(self.at_us)
            .arg(self.cost)
            .arg(self.settle_by_ms.max(1))
            .arg(self.debt_cap.unwrap_or(crate::MAX_INTEGER));
        for ((quota, held), reset) in self.quotas.iter().zip(&self.held).zip(&self.reset_ms) {
            for value in self.algorithm.params(quota)?.as_slice() {
                call = call.arg(*value);
            }
            call = call.arg(*held).arg(*reset);
        }
        if self.adopt {
            call = call.arg(super::ADOPT);
        }
        Ok(call)
    }

    pub(super) fn reading(&self) -> Reading {
        Reading {
            algorithm: self.algorithm,
            quotas: self.quotas.clone(),
            cache: self.cache.clone().map(|c| (c, self.keys.clone())),
        }
    }

    fn apply(&mut self, refunds: &[Refund]) {
        for (held, refund) in self.held.iter_mut().zip(refunds) {
            *held = held.saturating_sub(refund.credited);
        }
    }
}

/// Two receipts are equal when they are copies of one charge in the same
/// state (the deny cache they would notify is not compared).
impl PartialEq for Receipt {
    fn eq(&self, other: &Self) -> bool {
        Wire::from(self) == Wire::from(other)
    }
}

impl Eq for Receipt {}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Charge")
            .field("algorithm", &self.algorithm)
            .field("keys", &self.keys)
            .field("at", &self.at())
            .field("cost", &self.cost)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl Receipt {
    fn at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.at_us)
    }
}

/// A fresh charge id: a random 64-bit prefix drawn once per process, then a
/// counter. Unique per check without a system call per check.
pub(super) fn next_id() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        getrandom::u64().unwrap_or_else(|_| {
            // No OS randomness: the clock and the process id still differ
            // between processes.
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nanos ^ u64::from(std::process::id()).rotate_left(32)
        })
    });
    format!("{prefix:016x}{:016x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// What a check needs to issue charges: everything but the reply.
#[derive(Clone)]
pub(super) struct Issuer {
    pub(super) id: String,
    pub(super) algorithm: Algorithm,
    pub(super) quotas: Vec<Quota>,
    pub(super) keys: Vec<String>,
    pub(super) cost: u64,
    pub(super) terms: Terms,
    pub(super) cache: Option<Arc<DenyCache>>,
}

impl fmt::Debug for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issuer")
            .field("keys", &self.keys)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// The receipt of an admission decided at `at` whose limits answered
    /// `reset` (one per limit).
    fn receipt(&self, held: u64, at: SystemTime, reset: &[Duration]) -> Receipt {
        let at_us = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let within = u64::try_from(self.terms.settle_within.as_millis()).unwrap_or(u64::MAX);
        Receipt {
            id: self.id.clone(),
            algorithm: self.algorithm,
            quotas: self.quotas.clone(),
            keys: self.keys.clone(),
            at_us,
            cost: held,
            held: vec![held; self.quotas.len()],
            reset_ms: reset
                .iter()
                .map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX))
                .collect(),
            debt_cap: self.terms.debt_cap,
            settle_by_ms: (at_us / 1000)
                .saturating_add(within)
                .min(crate::MAX_INTEGER),
            cache: self.cache.clone(),
            adopt: self.terms.adopt,
        }
    }

    pub(super) fn charge(&self, held: u64, at: SystemTime, reset: Duration) -> Charge {
        Charge(self.receipt(held, at, &[reset]))
    }

    pub(super) fn multi_charge(&self, at: SystemTime, reset: &[Duration]) -> MultiCharge {
        MultiCharge(self.receipt(self.cost, at, reset))
    }
}

/// The receipt of an admitted [`super::Limiter::check`]: the power to give
/// its units back.
///
/// It names the limiter (algorithm and quota) and the key it was taken on,
/// so [`Charge::refund`] takes no key; it is neither `Copy` nor `Clone`, and
/// only a check builds one. Take it out of the decision with
/// [`super::Decision::into_charge`] (or use it in place with
/// [`super::Decision::charge_mut`]).
///
/// **Copies.** A charge can cross a process boundary with serde
/// (`Serialize`/`Deserialize`, e.g. as JSON in a job's payload). A
/// deserialized charge is a copy, and so is a resend of a refund after a
/// lost reply: the server keeps a record per charge id of what is left of
/// it, so all refunds of one charge together give back at most its cost,
/// whichever copy sends them. Deserializing checks the form, not the
/// truth: whoever can write a charge by hand can refund units of the key it
/// names, as whoever can write to Redis can. Keep charges where your
/// requests are.
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, limiter: nolock::rate::Limiter) -> nolock::Result<()> {
/// let charge = limiter.check(conn, "rl:user:a", 5).await?.into_charge().unwrap();
/// let copy = charge.clone(); // a charge is not Clone: one value, one power to refund
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, limiter: nolock::rate::Limiter) -> nolock::Result<()> {
/// let mut charge = limiter.check(conn, "rl:user:a", 5).await?.into_charge().unwrap();
/// charge.refund(conn, "rl:user:b", 5).await?; // no key: a refund goes where the charge was taken
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, limiter: nolock::rate::Limiter) -> nolock::Result<()> {
/// let charge = limiter.check(conn, "rl:user:a", 5).await?.into_charge().unwrap();
/// charge.refund(conn, 5).await?; // refunding needs the charge by `&mut`: it keeps count
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// // Only a check builds a charge: its one field is private.
/// let forged = nolock::rate::Charge(todo!());
/// ```
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, limits: nolock::rate::MultiLimiter) -> nolock::Result<()> {
/// let charge = limits.check(conn, "{t}:u", 5).await?.into_charge().unwrap();
/// let copy = charge.clone(); // a multi-limit charge is not Clone either
/// # Ok(()) }
/// ```
#[derive(PartialEq, Eq)]
#[must_use = "a charge is the only way to give its units back"]
pub struct Charge(Receipt);

/// The receipt of an admitted [`super::MultiLimiter::check`]: like
/// [`Charge`], for all its limits at once.
#[derive(PartialEq, Eq)]
#[must_use = "a charge is the only way to give its units back"]
pub struct MultiCharge(Receipt);

macro_rules! receipt_accessors {
    ($ty:ident) => {
        impl $ty {
            /// The charge's id: 32 lowercase hex digits, unique per check.
            /// The server's record of its refunds is keyed by it.
            pub fn id(&self) -> &str {
                &self.0.id
            }

            /// The algorithm of the limiter that took it.
            pub fn algorithm(&self) -> Algorithm {
                self.0.algorithm
            }

            /// What the check took (on every limit).
            pub fn cost(&self) -> u64 {
                self.0.cost
            }

            /// The units not yet given back, as this value counts them (the
            /// most on any limit). The server's record may know of fewer.
            pub fn held(&self) -> u64 {
                self.0.held()
            }

            /// When the check admitted it, by the Redis server's clock.
            pub fn at(&self) -> SystemTime {
                self.0.at()
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

receipt_accessors!(Charge);

impl Charge {
    pub(super) fn receipt(&self) -> &Receipt {
        &self.0
    }
}

impl MultiCharge {
    pub(super) fn receipt(&self) -> &Receipt {
        &self.0
    }
}
receipt_accessors!(MultiCharge);

impl Charge {
    /// The key the charge was taken on.
    pub fn key(&self) -> &str {
        &self.0.keys[0]
    }

    /// The quota of the limiter that took it.
    pub fn quota(&self) -> &Quota {
        &self.0.quotas[0]
    }

    /// Give back `amount` of the charge's units, for example when the work
    /// they paid for was not done. Returns what was given back and what
    /// fits now, and keeps count, so a later refund of this charge can give
    /// back only the rest.
    ///
    /// A refund undoes only what the charge still holds of the limit, so it
    /// never leaves more room than there would be had the refunded units
    /// never been charged, however refunds and checks interleave:
    ///
    /// * GCRA and token bucket: a charge of `c` units drains one unit per
    ///   emission interval from its own arrival; only the part not yet
    ///   drained comes back (`min(amount, c - elapsed / T)`). A refund after
    ///   the limiter would have refilled anyway gives back nothing.
    /// * Fixed window: only while the charge's window is still the current
    ///   one; a refund after that window ended gives back nothing (it never
    ///   lands in the next window).
    /// * Sliding window: from the window that counted the charge (current
    ///   or previous), while it still counts.
    ///
    /// A refund after the charge's settle deadline
    /// ([`super::Limiter::settle_within`]), or after one of its limits was
    /// reset ([`super::Limiter::reset`]), gives nothing back: the charge
    /// counts as settled at its cost then.
    ///
    /// All refunds of one charge, from this value and from any copy of it
    /// (serialized, resent after a lost reply), give back at most its cost:
    /// the server records what is left of each charge (see [`Charge`]). A
    /// refund that gave anything back forgets the issuing limiter's cached
    /// denials of the key ([`super::Limiter::with_local_deny_cache`]); a
    /// refund made by another process cannot reach this process's cache.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`amount` 0), [`Error::InvalidArgument`] (the
    /// charge holds nothing any more, or less than `amount`), before any
    /// I/O; [`Error::Redis`] (also when the key or the charge's record holds
    /// data nolock did not write; nothing is changed then) and
    /// [`Error::Indeterminate`] from Redis. After `Indeterminate`, refunding
    /// again gives back at most what is left of the charge; to give back
    /// *exactly once* a partial amount, send a [`RefundCharge`] with an
    /// operation id.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, limiter: &nolock::rate::Limiter)
    /// #     -> nolock::Result<()> {
    /// let mut d = limiter.check(conn, "rl:user:42", 5).await?;
    /// if let Some(charge) = d.charge_mut() {
    ///     let upstream_failed = true; // the work was not done
    ///     if upstream_failed {
    ///         let r = charge.refund(conn, 5).await?;
    ///         println!("{} units back, {} fit now", r.credited, r.remaining);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn refund<C>(&mut self, conn: &mut C, amount: u64) -> Result<Refund>
    where
        C: ConnectionLike + Send,
    {
        let refund = run_rebuilt(|| RefundCharge::new(self, amount), conn).await?;
        refund.apply_to(self);
        Ok(refund)
    }
}

impl MultiCharge {
    /// The keys it was taken on, one per limit, in the limiter's order.
    pub fn keys(&self) -> &[String] {
        &self.0.keys
    }

    /// The quotas of the limiter that took it, in order.
    pub fn quotas(&self) -> &[Quota] {
        &self.0.quotas
    }

    /// Give back `amount` on every limit: [`Charge::refund`] for each, in
    /// one script call. Returns one [`Refund`] per limit, in order.
    ///
    /// # Errors
    ///
    /// As [`Charge::refund`].
    pub async fn refund<C>(&mut self, conn: &mut C, amount: u64) -> Result<Vec<Refund>>
    where
        C: ConnectionLike + Send,
    {
        let refunds = run_rebuilt(|| MultiRefundCharge::new(self, amount), conn).await?;
        self.apply_refunds(&refunds);
        Ok(refunds)
    }

    /// Take what `refunds` gave back off this charge's count, after running
    /// a [`MultiRefundCharge`] yourself.
    pub fn apply_refunds(&mut self, refunds: &[Refund]) {
        self.0.apply(refunds);
    }
}

impl Refund {
    /// Take what this refund gave back off `charge`'s count, after running
    /// a [`RefundCharge`] yourself ([`Charge::refund`] does it). Applying a
    /// refund to another charge only makes that one hold less.
    pub fn apply_to(&self, charge: &mut Charge) {
        charge.0.apply(std::slice::from_ref(self));
    }
}

/// A refund of a [`Charge`], as an operation value: for a
/// [`Batch`](crate::Batch), or to give it an operation id
/// ([`Operation::idempotent`]) so that a partial refund whose reply was
/// lost can be sent again ([`crate::retry()`]) and be applied once.
///
/// It gives back what [`Charge::refund`] would, but it cannot lower the
/// charge it was built from: apply each answer with [`Refund::apply_to`].
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::rate::{Algorithm, Limiter, Quota, RefundCharge};
/// use nolock::retry::{retry, RetryPolicy};
/// use nolock::Operation;
///
/// # async fn run(conn: &mut redis::aio::ConnectionManager) -> nolock::Result<()> {
/// let exports = Limiter::new(Algorithm::Gcra, Quota::per_minute(10)?)?;
/// if let Some(mut charge) = exports.check(conn, "rl:exports:7", 3).await?.into_charge() {
///     // The export failed half way: give 2 of the 3 units back, once.
///     let refund = RefundCharge::new(&charge, 2)?.idempotent("export-81f2:refund")?;
///     let given = retry(&RetryPolicy::new(Duration::from_secs(2)), conn, &refund).await?;
///     given.apply_to(&mut charge);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RefundCharge {
    call: Invocation,
    reading: Reading,
}

impl RefundCharge {
    /// Give back `amount` of `charge`.
    ///
    /// # Errors
    ///
    /// As [`Charge::refund`] before any I/O: [`Error::ZeroLimit`] (`amount`
    /// 0), [`Error::InvalidArgument`] (the charge holds nothing, or less
    /// than `amount`).
    pub fn new(charge: &Charge, amount: u64) -> Result<RefundCharge> {
        Ok(RefundCharge {
            call: charge.0.refund_call(amount)?,
            reading: charge.0.reading(),
        })
    }
}

impl Operation for RefundCharge {
    type Output = Refund;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Refund> {
        let script = self.call.script().name();
        let (_, mut limits) = self.reading.decode(script, reply)?;
        limits
            .pop()
            .map(|l| l.refund())
            .ok_or_else(|| Error::UnexpectedReply {
                script,
                detail: "no limit in the reply".to_owned(),
            })
    }
}

/// A refund of a [`MultiCharge`], as an operation value (see
/// [`RefundCharge`]); apply its answer with [`MultiCharge::apply_refunds`].
#[derive(Debug, Clone)]
pub struct MultiRefundCharge {
    call: Invocation,
    reading: Reading,
}

impl MultiRefundCharge {
    /// Give back `amount` of `charge` on every limit.
    ///
    /// # Errors
    ///
    /// As [`RefundCharge::new`].
    pub fn new(charge: &MultiCharge, amount: u64) -> Result<MultiRefundCharge> {
        Ok(MultiRefundCharge {
            call: charge.0.refund_call(amount)?,
            reading: charge.0.reading(),
        })
    }
}

impl Operation for MultiRefundCharge {
    type Output = Vec<Refund>;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Vec<Refund>> {
        let (_, limits) = self.reading.decode(self.call.script().name(), reply)?;
        Ok(limits.iter().map(Adjusted::refund).collect())
    }
}

/// What reading the refund script's reply takes: the charge's algorithm
/// and quotas, and the deny cache its refunds clear.
#[derive(Clone)]
pub(super) struct Reading {
    algorithm: Algorithm,
    quotas: Vec<Quota>,
    cache: Option<(Arc<DenyCache>, Vec<String>)>,
}

impl fmt::Debug for Reading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reading")
            .field("algorithm", &self.algorithm)
            .field("quotas", &self.quotas)
            .finish_non_exhaustive()
    }
}

/// One limit's part of a refund or settlement.
#[derive(Debug, Clone, Copy)]
pub(super) struct Adjusted {
    /// Units of the charge given back.
    pub(super) credited: u64,
    /// Units charged beyond the charge (a settlement above it).
    pub(super) charged: u64,
    /// Units the settlement asked to charge beyond the charge.
    pub(super) excess: u64,
    /// The limit afterwards, as a check of one unit would see it.
    pub(super) state: RateLimit,
}

impl Adjusted {
    fn refund(&self) -> Refund {
        Refund {
            credited: self.credited,
            remaining: self.state.remaining,
        }
    }
}

/// What the refund script answered: applied, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Applied,
    Settled,
    Expired,
}

impl Reading {
    /// Reads `{status, now, (credited, charged, excess, state...)...}`, and
    /// forgets the cached denials of the keys when anything came back.
    pub(super) fn decode(
        &self,
        script: &'static str,
        value: redis::Value,
    ) -> Result<(Status, Vec<Adjusted>)> {
        let bad = |detail: String| Error::UnexpectedReply { script, detail };
        let mut reply = Reply::new(script, value)?;
        let status = match reply.uint()? {
            0 => Status::Applied,
            1 => Status::Settled,
            2 => Status::Expired,
            other => return Err(bad(format!("status {other}"))),
        };
        let now = reply.uint()?;
        let mut limits = Vec::with_capacity(self.quotas.len());
        for quota in &self.quotas {
            let (credited, charged, excess) = (reply.uint()?, reply.uint()?, reply.uint()?);
            let state = State::read(self.algorithm, &mut reply)?;
            let answer = state
                .answer(quota, now, 1, false)
                .ok_or_else(|| bad(format!("{state:?} at {now}")))?;
            if charged > excess || (status != Status::Applied && credited + charged > 0) {
                return Err(bad(format!(
                    "{status:?}: credited {credited}, charged {charged} of {excess}"
                )));
            }
            limits.push(Adjusted {
                credited,
                charged,
                excess,
                state: answer,
            });
        }
        reply.finish()?;
        if let Some((cache, keys)) = &self.cache {
            if limits.iter().any(|l| l.credited > 0) {
                for key in keys {
                    cache.forget(key);
                }
            }
        }
        Ok((status, limits))
    }
}

/// A charge as serde sees it; checked on the way in.
#[derive(Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Wire {
    id: String,
    algorithm: Algorithm,
    quotas: Vec<Quota>,
    keys: Vec<String>,
    at_us: u64,
    cost: u64,
    held: Vec<u64>,
    reset_ms: Vec<u64>,
    #[serde(default)]
    debt_cap: Option<u64>,
    settle_by_ms: u64,
    /// Taken by a handle of a stored configuration: its refunds adopt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    adopt: bool,
}

impl From<&Receipt> for Wire {
    fn from(r: &Receipt) -> Self {
        Wire {
            id: r.id.clone(),
            algorithm: r.algorithm,
            quotas: r.quotas.clone(),
            keys: r.keys.clone(),
            at_us: r.at_us,
            cost: r.cost,
            held: r.held.clone(),
            reset_ms: r.reset_ms.clone(),
            debt_cap: r.debt_cap,
            settle_by_ms: r.settle_by_ms,
            adopt: r.adopt,
        }
    }
}

impl TryFrom<Wire> for Receipt {
    type Error = Error;

    fn try_from(w: Wire) -> Result<Receipt> {
        let bad = |reason: String| Error::InvalidArgument {
            what: "charge",
            reason,
        };
        if w.id.len() != 32 || !w.id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad(format!("id {:?} is not 32 lowercase hex digits", w.id)));
        }
        let n = w.quotas.len();
        if n == 0 || w.keys.len() != n || w.held.len() != n || w.reset_ms.len() != n {
            return Err(bad(
                "needs one key, held count and reset per quota".to_owned()
            ));
        }
        for quota in &w.quotas {
            w.algorithm.accept(quota)?;
            if w.cost > quota.burst() {
                return Err(bad(format!(
                    "cost {} above a burst of {}",
                    w.cost,
                    quota.burst()
                )));
            }
        }
        for key in &w.keys {
            validate::key(key)?;
        }
        let refs: Vec<&str> = w.keys.iter().map(String::as_str).collect();
        keys::same_slot(&refs)?;
        validate::positive("cost", w.cost)?;
        validate::at_most("charge time", w.at_us, crate::MAX_INTEGER)?;
        if w.held.iter().any(|&h| h > w.cost) {
            return Err(bad("holds more than it cost".to_owned()));
        }
        for &reset in &w.reset_ms {
            validate::at_most("reset_after", reset, crate::MAX_INTEGER)?;
        }
        validate::at_most("settle deadline", w.settle_by_ms, crate::MAX_INTEGER)?;
        if let Some(cap) = w.debt_cap {
            validate::at_most("debt cap", cap, crate::MAX_INTEGER)?;
        }
        Ok(Receipt {
            id: w.id,
            algorithm: w.algorithm,
            quotas: w.quotas,
            keys: w.keys,
            at_us: w.at_us,
            cost: w.cost,
            held: w.held,
            reset_ms: w.reset_ms,
            debt_cap: w.debt_cap,
            settle_by_ms: w.settle_by_ms,
            cache: None,
            adopt: w.adopt,
        })
    }
}

macro_rules! receipt_serde {
    ($ty:ident, $limits:expr) => {
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(
                &self,
                s: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                Wire::from(&self.0).serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<Self, D::Error> {
                let receipt =
                    Receipt::try_from(Wire::deserialize(d)?).map_err(serde::de::Error::custom)?;
                let limits: fn(usize) -> bool = $limits;
                if !limits(receipt.quotas.len()) {
                    return Err(serde::de::Error::custom(concat!(
                        "a ",
                        stringify!($ty),
                        " of another number of limits"
                    )));
                }
                Ok($ty(receipt))
            }
        }
    };
}

receipt_serde!(Charge, |n| n == 1);
receipt_serde!(MultiCharge, |n| n >= 1);

/// How long after its check a charge can still be settled unless
/// [`super::Limiter::settle_within`] says otherwise: one hour.
pub const DEFAULT_SETTLE_WITHIN: Duration = Duration::from_secs(3600);

/// A limiter's settlement terms, handed to every charge it issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Terms {
    /// How far one settlement may push a limit past empty, in units.
    pub(super) debt_cap: Option<u64>,
    /// How long after the check a settlement is still accepted.
    pub(super) settle_within: Duration,
    /// True for a handle of a stored configuration ([`crate::config`]):
    /// its calls send `adopt` (`lua/lib/tag.lua`), so a state tagged with
    /// the numbers before a declared change is read, not refused.
    pub(super) adopt: bool,
}

impl Default for Terms {
    fn default() -> Self {
        Terms {
            debt_cap: None,
            settle_within: DEFAULT_SETTLE_WITHIN,
            adopt: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;

    fn issuer(alg: Algorithm, quotas: Vec<Quota>, keys: &[&str]) -> Issuer {
        Issuer {
            id: next_id(),
            algorithm: alg,
            quotas,
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            cost: 3,
            terms: Terms::default(),
            cache: None,
        }
    }

    #[test]
    fn ids_are_unique_hex() {
        let a = next_id();
        let b = next_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert_eq!(a[..16], b[..16], "one prefix per process");
    }

    #[test]
    fn a_refund_names_the_charges_keys_record_cost_and_held_counts() {
        let q = Quota::per_second(10).unwrap();
        let i = issuer(Algorithm::Gcra, vec![q], &["rl:a"]);
        let at = UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_001);
        let mut charge = i.charge(3, at, Duration::from_millis(300));
        let call = RefundCharge::new(&charge, 2).unwrap();
        let record = keys::derive("rl:a", &format!("charge#{}", charge.id()));
        // The limit, the charge's record, the limit's reset marker; the
        // deadline (an hour after the charge by default) goes with a refund
        // too: past it, or after a reset, a refund gives nothing back.
        assert_eq!(
            words(call.invocation().command()),
            [
                "EVALSHA",
                Algorithm::Gcra.scripts().refund.sha1(),
                "3",
                "rl:a",
                record.as_str(),
                "{rl:a}:reset",
                "2",
                "0",
                "1700000000000001",
                "3",
                "1700003600000",
                "9007199254740991",
                "100000",
                "10",
                "3",
                "300"
            ]
        );
        // A settlement at 5: no amount, the actual cost, the deadline (an
        // hour after the charge by default) and no debt cap.
        let settle = charge.0.settle_call(5).unwrap();
        let words = words(settle.command());
        assert_eq!(
            words[6..12],
            [
                "0",
                "5",
                "1700000000000001",
                "3",
                "1700003600000",
                "9007199254740991"
            ]
        );
        Refund {
            credited: 3,
            remaining: 10,
        }
        .apply_to(&mut charge);
        assert_eq!(charge.held(), 0);
        assert!(matches!(
            RefundCharge::new(&charge, 1),
            Err(Error::InvalidArgument { what: "charge", .. })
        ));
    }

    #[test]
    fn amounts_are_checked_before_io() {
        let q = Quota::per_second(10).unwrap();
        let charge =
            issuer(Algorithm::TokenBucket, vec![q], &["k"]).charge(3, UNIX_EPOCH, Duration::ZERO);
        assert!(matches!(
            RefundCharge::new(&charge, 0),
            Err(Error::ZeroLimit { what: "amount" })
        ));
        assert!(matches!(
            RefundCharge::new(&charge, 4),
            Err(Error::InvalidArgument { what: "amount", .. })
        ));
    }

    #[test]
    fn charges_round_trip_through_serde_and_forged_ones_are_refused() {
        let q = Quota::per_second(10).unwrap();
        let charge = issuer(Algorithm::Gcra, vec![q], &["rl:a"]).charge(
            3,
            UNIX_EPOCH + Duration::from_secs(5),
            Duration::from_millis(300),
        );
        let json = serde_json::to_string(&charge).unwrap();
        let copy: Charge = serde_json::from_str(&json).unwrap();
        assert_eq!(copy.id(), charge.id());
        assert_eq!(copy.key(), "rl:a");
        assert_eq!((copy.cost(), copy.held(), copy.at()), (3, 3, charge.at()));
        assert!(serde_json::from_str::<MultiCharge>(&json).is_ok());
        let forge = |from: &str, to: &str| {
            let forged = json.replace(from, to);
            assert_ne!(forged, json, "{from}");
            serde_json::from_str::<Charge>(&forged).is_err()
        };
        assert!(forge("\"cost\":3", "\"cost\":11"), "above the burst");
        assert!(
            forge("\"held\":[3]", "\"held\":[4]"),
            "holds more than it cost"
        );
        assert!(forge("\"keys\":[\"rl:a\"]", "\"keys\":[\"\"]"), "empty key");
        assert!(
            forge("\"keys\":[\"rl:a\"]", "\"keys\":[\"a\",\"b\"]"),
            "two keys, one quota"
        );
        assert!(forge(charge.id(), "xyz"), "id");
        assert!(forge("\"gcra\"", "\"leaky\""), "algorithm");
    }
}
