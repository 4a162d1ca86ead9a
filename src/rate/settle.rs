//! [`Charge::settle`]: reserve now, settle the real cost later (see the
//! `rate` module docs, "Reserve now, settle later").

use std::fmt;

use redis::aio::ConnectionLike;

use super::calendar::run_rebuilt;
use super::charge::{Adjusted, Reading, Status};
#[cfg(doc)]
use super::DEFAULT_SETTLE_WITHIN;
use super::{Charge, MultiCharge, RateLimit};
#[cfg(doc)]
use super::{Limiter, MultiLimiter};
use crate::script::{Invocation, Operation};
use crate::{Error, Result};

/// What settling a charge did ([`Charge::settle`]): one [`Settlement`] (or,
/// for a [`MultiCharge`], one per limit), or why nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a settlement may have put the limit into debt, or found the charge settled already"]
#[non_exhaustive]
pub enum Settle<S = Settlement> {
    /// Settled now.
    Settled(S),
    /// The charge was settled already (by a copy of it, or by this same
    /// settlement whose reply was lost): nothing changed.
    AlreadySettled,
    /// The charge's power had ended: its settle deadline had passed, or one
    /// of its limits was reset ([`Limiter::reset`]) since it was taken. It
    /// counts as settled at its reservation, and nothing changed.
    Expired,
}

impl<S> Settle<S> {
    /// The settlement, when this call settled the charge.
    pub fn settled(self) -> Option<S> {
        match self {
            Settle::Settled(s) => Some(s),
            Settle::AlreadySettled | Settle::Expired => None,
        }
    }
}

/// One limit's settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settlement {
    /// Units given back (the real cost was below what the charge held),
    /// under the rules of a refund: only what the charge still held of the
    /// limit.
    pub credited: u64,
    /// Units charged beyond the reservation (the real cost was above it),
    /// even past empty.
    pub charged: u64,
    /// Units of the excess not charged, because the limiter's debt cap
    /// ([`Limiter::with_debt_cap`]) would have been passed.
    pub uncharged: u64,
    /// The limit afterwards, as a check of one unit would see it: its
    /// `remaining`, `debt`, `retry_after` (when one unit does not fit) and
    /// `reset_after`.
    pub state: RateLimit,
}

impl Settlement {
    fn from(a: &Adjusted) -> Settlement {
        Settlement {
            credited: a.credited,
            charged: a.charged,
            uncharged: a.excess - a.charged,
            state: a.state,
        }
    }
}

fn settle_of<S>(
    status: Status,
    limits: Vec<Adjusted>,
    one: impl FnOnce(Vec<Adjusted>) -> Result<S>,
) -> Result<Settle<S>> {
    Ok(match status {
        Status::Applied => Settle::Settled(one(limits)?),
        Status::Settled => Settle::AlreadySettled,
        Status::Expired => Settle::Expired,
    })
}

impl Charge {
    /// Settle the charge at its real cost `actual`, once the work it
    /// reserved for is done: give back what it reserved beyond `actual`,
    /// or charge the excess above it even if it does not fit (the limit
    /// then goes into debt). See the [module docs](super#reserve-now-settle-later) for the rules.
    ///
    /// Takes the charge: a charge is settled once. The server records the
    /// settlement, so a copy of the charge settles nothing more
    /// ([`Settle::AlreadySettled`]), and after the limiter's settle deadline
    /// nothing changes ([`Settle::Expired`]).
    ///
    /// # Errors
    ///
    /// [`Error::OutOfRange`] (`actual` above 2^53 - 1) before any I/O;
    /// [`Error::Redis`] (also when a key or the charge's record holds data
    /// nolock did not write; nothing is changed then) and
    /// [`Error::Indeterminate`] from Redis. After `Indeterminate`, send the
    /// same settlement again as a [`SettleCharge`] (built before the first
    /// send, or from a copy): it applies once either way, and an operation
    /// id makes the resend answer with the first reply.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use nolock::rate::{Algorithm, Limiter, Quota, Settle};
    ///
    /// # async fn model_call(_: &str) -> u64 { 800 }
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// // 100 000 tokens per minute for one API key.
    /// let tokens = Limiter::new(Algorithm::Gcra, Quota::per_minute(100_000)?)?;
    /// let estimate = 1_000;
    /// let decision = tokens.check(conn, "tpm:key:7", estimate).await?;
    /// let Some(charge) = decision.into_charge() else {
    ///     return Ok(()); // 429: over the budget
    /// };
    /// let used = model_call("prompt").await; // usage.total_tokens
    /// if let Settle::Settled(s) = charge.settle(conn, used).await? {
    ///     println!("{} back, {} more, debt {}", s.credited, s.charged, s.state.debt);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn settle<C>(self, conn: &mut C, actual: u64) -> Result<Settle>
    where
        C: ConnectionLike + Send,
    {
        run_rebuilt(|| SettleCharge::new(&self, actual), conn).await
    }
}

impl MultiCharge {
    /// [`Charge::settle`] on every limit, in one script call: one
    /// [`Settlement`] per limit, in order.
    ///
    /// # Errors
    ///
    /// As [`Charge::settle`].
    pub async fn settle<C>(self, conn: &mut C, actual: u64) -> Result<Settle<Vec<Settlement>>>
    where
        C: ConnectionLike + Send,
    {
        run_rebuilt(|| MultiSettleCharge::new(&self, actual), conn).await
    }
}

/// A settlement of a [`Charge`], as an operation value: for a
/// [`Batch`](crate::Batch), or to carry an operation id
/// ([`Operation::idempotent`]) so that a resend after a lost reply
/// answers with the first reply. Without an id a resend is still applied
/// at most once (the server records the settlement), but answers
/// [`Settle::AlreadySettled`].
///
/// ```
/// use nolock::rate::{Algorithm, Limiter, Quota, SettleCharge};
/// # fn doc(charge: nolock::rate::Charge) -> nolock::Result<()> {
/// use nolock::Operation;
/// let op = SettleCharge::new(&charge, 1_250)?.idempotent("req-81f2:settle")?;
/// # let _ = op; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SettleCharge {
    call: Invocation,
    reading: Reading,
}

impl SettleCharge {
    /// Settle `charge` at `actual`.
    ///
    /// # Errors
    ///
    /// As [`Charge::settle`] before any I/O.
    pub fn new(charge: &Charge, actual: u64) -> Result<SettleCharge> {
        Ok(SettleCharge {
            call: charge.receipt().settle_call(actual)?,
            reading: charge.receipt().reading(),
        })
    }
}

impl Operation for SettleCharge {
    type Output = Settle;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Settle> {
        let script = self.call.script().name();
        let (status, limits) = self.reading.decode(script, reply)?;
        settle_of(status, limits, |limits| {
            limits
                .first()
                .map(Settlement::from)
                .ok_or_else(|| Error::UnexpectedReply {
                    script,
                    detail: "no limit in the reply".to_owned(),
                })
        })
    }
}

/// A settlement of a [`MultiCharge`], as an operation value (see
/// [`SettleCharge`]).
#[derive(Clone)]
pub struct MultiSettleCharge {
    call: Invocation,
    reading: Reading,
}

impl fmt::Debug for MultiSettleCharge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiSettleCharge")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

impl MultiSettleCharge {
    /// Settle `charge` at `actual` on every limit.
    ///
    /// # Errors
    ///
    /// As [`Charge::settle`] before any I/O.
    pub fn new(charge: &MultiCharge, actual: u64) -> Result<MultiSettleCharge> {
        Ok(MultiSettleCharge {
            call: charge.receipt().settle_call(actual)?,
            reading: charge.receipt().reading(),
        })
    }
}

impl Operation for MultiSettleCharge {
    type Output = Settle<Vec<Settlement>>;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Settle<Vec<Settlement>>> {
        let (status, limits) = self.reading.decode(self.call.script().name(), reply)?;
        settle_of(status, limits, |limits| {
            Ok(limits.iter().map(Settlement::from).collect())
        })
    }
}
