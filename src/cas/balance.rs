//! Guarded arithmetic: add to or take from an integer balance only while it
//! stays within bounds.

use std::ops::{Bound, RangeBounds};

use redis::{aio::ConnectionLike, Value};

use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

static ADJUST: Script = embedded!("cas/adjust");

/// The outcome of [`debit`], [`credit`] and [`adjust`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused change was not applied"]
pub enum Adjustment {
    /// The change was applied.
    Applied {
        /// The balance after the change.
        balance: i64,
    },
    /// Refused: taking the amount would have left the balance below the
    /// floor (0 for [`debit`]). Nothing was written.
    Insufficient {
        /// The current balance, unchanged.
        balance: i64,
    },
    /// Refused: adding the amount would have taken the balance above the
    /// ceiling. Nothing was written.
    AboveCeiling {
        /// The current balance, unchanged.
        balance: i64,
    },
}

impl Adjustment {
    /// True for [`Adjustment::Applied`].
    pub fn is_applied(&self) -> bool {
        matches!(self, Adjustment::Applied { .. })
    }

    /// The balance after the call: the new one when applied, else the
    /// unchanged current one.
    pub fn balance(&self) -> i64 {
        match *self {
            Adjustment::Applied { balance }
            | Adjustment::Insufficient { balance }
            | Adjustment::AboveCeiling { balance } => balance,
        }
    }
}

/// Take `amount` from the balance at `key` only if at least `amount` is
/// there: the balance never goes below 0. One round trip.
///
/// The counterpart of `UPDATE ... SET bal = bal - $1 WHERE bal >= $1`. A
/// missing key is a balance of 0, so a debit from it is refused (and does not
/// create it). The key's expiry, if any, is kept. Returns
/// [`Adjustment::Applied`] or [`Adjustment::Insufficient`].
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`amount` is 0),
/// [`Error::OutOfRange`] (`amount` above `i64::MAX`). From Redis:
/// [`Error::Overflow`] (the stored balance is so far below zero that the
/// result would leave `i64`; nothing written), [`Error::Redis`] (the key
/// does not hold a decimal `i64`; it is left alone) and
/// [`Error::Indeterminate`] (the debit may have been applied; it is not
/// retried: decide from your own records, or store a request id with
/// [`set_if_absent`](super::set_if_absent) first).
///
/// # Example
///
/// ```no_run
/// use nolock::cas::{self, Adjustment};
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// match cas::debit(conn, "stock:sku-1", 3).await? {
///     Adjustment::Applied { balance } => println!("reserved 3, {balance} left"),
///     refused => println!("only {} in stock", refused.balance()),
/// }
/// # Ok(()) }
/// ```
pub async fn debit<C>(conn: &mut C, key: &str, amount: u64) -> Result<Adjustment>
where
    C: ConnectionLike + Send,
{
    run_one(&Adjust::debit(key, amount)?, conn).await
}

/// Add `amount` to the balance at `key`, only if the result stays at most
/// `ceiling` (any `i64` when `None`). One round trip.
///
/// A missing key is a balance of 0: an applied credit creates it (without
/// expiry); an existing key keeps its expiry. Returns
/// [`Adjustment::Applied`] or [`Adjustment::AboveCeiling`].
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`amount` is 0),
/// [`Error::OutOfRange`] (`amount` above `i64::MAX`). From Redis:
/// [`Error::Overflow`] (the result would pass `i64::MAX`; nothing written),
/// [`Error::Redis`] and [`Error::Indeterminate`], as for [`debit`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// // Top up, but never hold more than 10 000 credits.
/// let topped = nolock::cas::credit(conn, "credits:42", 500, Some(10_000)).await?;
/// println!("{topped:?}");
/// # Ok(()) }
/// ```
pub async fn credit<C>(
    conn: &mut C,
    key: &str,
    amount: u64,
    ceiling: Option<i64>,
) -> Result<Adjustment>
where
    C: ConnectionLike + Send,
{
    run_one(&Adjust::credit(key, amount, ceiling)?, conn).await
}

/// Add `delta` (negative: take) to the balance at `key`, only if the result
/// stays within `bounds` on the side it moves towards. One round trip.
///
/// The general form of [`debit`] and [`credit`]: `adjust(conn, key, -50,
/// -1000..)` allows an overdraft down to -1000; `adjust(conn, key, d,
/// 0..=100)` keeps a level between 0 and 100 whichever way `d` goes. Only the
/// bound in the direction of the change is checked, so a balance found
/// outside the bounds (set by other means) can still move back towards them.
/// A `delta` of 0 reads the balance and writes nothing. A missing key is a
/// balance of 0 and is created only by an applied change; an existing key
/// keeps its expiry.
///
/// A result outside `i64` is [`Error::Overflow`], whatever the bounds: the
/// arithmetic is exact 64-bit inside the script and never wraps.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::EmptyRange`] (`bounds`
/// holds no value, e.g. `5..5`). From Redis: [`Error::Overflow`],
/// [`Error::Redis`] (the key does not hold a decimal `i64`) and
/// [`Error::Indeterminate`], as for [`debit`].
///
/// # Example
///
/// ```no_run
/// use nolock::cas::{self, Adjustment};
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// // A wallet with a 1 000 credit line.
/// let paid = cas::adjust(conn, "wallet:7", -250, -1_000..).await?;
/// if let Adjustment::Insufficient { balance } = paid {
///     println!("declined at {balance}");
/// }
/// # Ok(()) }
/// ```
pub async fn adjust<C>(
    conn: &mut C,
    key: &str,
    delta: i64,
    bounds: impl RangeBounds<i64>,
) -> Result<Adjustment>
where
    C: ConnectionLike + Send,
{
    run_one(&Adjust::new(key, delta, bounds)?, conn).await
}

/// [`debit`], [`credit`] and [`adjust`] as a value, for a [`crate::Batch`]:
/// many balances changed in one round trip per server, each change atomic
/// and all-or-nothing on its own. The input is checked when it is built.
///
/// ```no_run
/// use nolock::cas::Adjust;
/// use nolock::Batch;
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// // Reserve one of each item of an order; each line succeeds or fails alone.
/// let order = ["stock:sku-1", "stock:sku-2", "stock:sku-3"];
/// let batch: Batch<Adjust> = order
///     .iter()
///     .map(|sku| Adjust::debit(sku, 1))
///     .collect::<nolock::Result<_>>()?;
/// for (sku, line) in order.iter().zip(batch.run(conn).await) {
///     println!("{sku}: {:?}", line?);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Adjust {
    call: Invocation,
    delta: i64,
}

impl Adjust {
    /// As [`debit`]: take `amount` only if the balance stays at least 0.
    ///
    /// # Errors
    ///
    /// As [`debit`] before any I/O.
    ///
    /// ```
    /// use nolock::cas::Adjust;
    /// assert!(Adjust::debit("stock:sku-1", 3).is_ok());
    /// assert!(Adjust::debit("stock:sku-1", 0).is_err());
    /// ```
    pub fn debit(key: &str, amount: u64) -> Result<Adjust> {
        let amount = amount_arg(amount)?;
        Adjust::new(key, -amount, 0..)
    }

    /// As [`credit`]: add `amount` only if the balance stays at most
    /// `ceiling` (any `i64` when `None`).
    ///
    /// # Errors
    ///
    /// As [`credit`] before any I/O.
    pub fn credit(key: &str, amount: u64, ceiling: Option<i64>) -> Result<Adjust> {
        let amount = amount_arg(amount)?;
        Adjust::new(key, amount, ..=ceiling.unwrap_or(i64::MAX))
    }

    /// As [`adjust`]: add `delta` only if the result stays within `bounds`
    /// on the side it moves towards.
    ///
    /// # Errors
    ///
    /// As [`adjust`] before any I/O.
    pub fn new(key: &str, delta: i64, bounds: impl RangeBounds<i64>) -> Result<Adjust> {
        let call = adjust_call(key, delta, &bounds)?;
        Ok(Adjust { call, delta })
    }
}

impl Operation for Adjust {
    type Output = Adjustment;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<Adjustment> {
        decode_adjustment(self.delta, reply)
    }
}

pub(super) fn adjust_call(
    key: &str,
    delta: i64,
    bounds: &impl RangeBounds<i64>,
) -> Result<Invocation> {
    validate::key(key)?;
    let (floor, ceiling) = inclusive(bounds).ok_or(Error::EmptyRange { what: "bounds" })?;
    Ok(Invocation::new(&ADJUST, &[key])
        .arg(delta)
        .arg(floor)
        .arg(ceiling))
}

/// An amount for debit or credit: 1 ..= i64::MAX.
fn amount_arg(amount: u64) -> Result<i64> {
    match i64::try_from(amount) {
        Ok(0) => Err(Error::ZeroLimit { what: "amount" }),
        Ok(amount) => Ok(amount),
        Err(_) => Err(Error::OutOfRange {
            what: "amount",
            given: amount,
            max: i64::MAX as u64,
        }),
    }
}

/// `bounds` as `(floor, ceiling)`, both included; `None` when it is empty.
fn inclusive(bounds: &impl RangeBounds<i64>) -> Option<(i64, i64)> {
    let floor = match bounds.start_bound() {
        Bound::Included(&x) => x,
        Bound::Excluded(&x) => x.checked_add(1)?,
        Bound::Unbounded => i64::MIN,
    };
    let ceiling = match bounds.end_bound() {
        Bound::Included(&x) => x,
        Bound::Excluded(&x) => x.checked_sub(1)?,
        Bound::Unbounded => i64::MAX,
    };
    (floor <= ceiling).then_some((floor, ceiling))
}

/// `{status, balance}`: 1 applied, 0 refused by the bound, -1 overflow.
fn decode_adjustment(delta: i64, value: Value) -> Result<Adjustment> {
    let mut reply = Reply::new(ADJUST.name(), value)?;
    let status = reply.int()?;
    let balance = reply.int()?;
    reply.finish()?;
    match status {
        1 => Ok(Adjustment::Applied { balance }),
        0 if delta < 0 => Ok(Adjustment::Insufficient { balance }),
        0 if delta > 0 => Ok(Adjustment::AboveCeiling { balance }),
        -1 => Err(Error::Overflow {
            what: "balance",
            value: balance,
            delta,
        }),
        other => Err(Error::UnexpectedReply {
            script: ADJUST.name(),
            detail: format!("status {other} for delta {delta}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn bounds_become_inclusive_floor_and_ceiling() {
        assert_eq!(inclusive(&(0..)), Some((0, i64::MAX)));
        assert_eq!(inclusive(&(..)), Some((i64::MIN, i64::MAX)));
        assert_eq!(inclusive(&(..=100)), Some((i64::MIN, 100)));
        assert_eq!(inclusive(&(-5..10)), Some((-5, 9)));
        assert_eq!(inclusive(&(3..=3)), Some((3, 3)));
        assert_eq!(inclusive(&(5..5)), None);
        assert_eq!(inclusive(&(..i64::MIN)), None);
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 10..=0;
        assert_eq!(inclusive(&reversed), None);
        assert_eq!(
            inclusive(&(Bound::Excluded(i64::MAX), Bound::Unbounded)),
            None
        );
    }

    #[test]
    fn the_command_carries_delta_floor_and_ceiling() {
        let call = adjust_call("k", -7, &(0..)).unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                ADJUST.sha1(),
                "1",
                "k",
                "-7",
                "0",
                "9223372036854775807"
            ]
        );
    }

    #[test]
    fn adjust_values_carry_the_calls_of_debit_credit_and_adjust() {
        let sent = |op: Adjust| words(op.invocation().command())[4..].to_vec();
        let max = i64::MAX.to_string();
        let min = i64::MIN.to_string();
        assert_eq!(sent(Adjust::debit("k", 7).unwrap()), ["-7", "0", &max]);
        assert_eq!(
            sent(Adjust::credit("k", 7, None).unwrap()),
            ["7", &min, &max]
        );
        assert_eq!(
            sent(Adjust::credit("k", 7, Some(9)).unwrap()),
            ["7", &min, "9"]
        );
        assert_eq!(
            sent(Adjust::new("k", -2, -5..).unwrap()),
            ["-2", "-5", &max]
        );
        assert!(matches!(
            Adjust::debit("k", 0),
            Err(Error::ZeroLimit { .. })
        ));
        assert!(matches!(Adjust::credit("", 1, None), Err(Error::EmptyKey)));
        assert!(matches!(
            Adjust::new("k", 1, 5..5),
            Err(Error::EmptyRange { .. })
        ));
        let refused = Array(vec![Int(0), BulkString(b"3".to_vec())]);
        let debit = Adjust::debit("k", 7).unwrap();
        assert_eq!(
            debit.decode(refused).unwrap(),
            Adjustment::Insufficient { balance: 3 }
        );
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        assert!(matches!(adjust_call("", 1, &(..)), Err(Error::EmptyKey)));
        let err = adjust_call("k", 1, &(5..5)).unwrap_err();
        assert!(matches!(err, Error::EmptyRange { what: "bounds" }));
        assert!(err.is_invalid_input());
        assert!(matches!(
            amount_arg(0),
            Err(Error::ZeroLimit { what: "amount" })
        ));
        assert!(matches!(
            amount_arg(1 << 63),
            Err(Error::OutOfRange { what: "amount", .. })
        ));
        assert_eq!(amount_arg(i64::MAX as u64).unwrap(), i64::MAX);
    }

    #[test]
    fn adjustments_decode_by_status_and_direction() {
        let reply = |status, balance: &str| {
            Array(vec![Int(status), BulkString(balance.as_bytes().to_vec())])
        };
        assert_eq!(
            decode_adjustment(-7, reply(1, "3")).unwrap(),
            Adjustment::Applied { balance: 3 }
        );
        assert_eq!(
            decode_adjustment(-7, reply(0, "3")).unwrap(),
            Adjustment::Insufficient { balance: 3 }
        );
        assert_eq!(
            decode_adjustment(7, reply(0, "-9223372036854775808")).unwrap(),
            Adjustment::AboveCeiling { balance: i64::MIN }
        );
        assert!(matches!(
            decode_adjustment(10, reply(-1, "9223372036854775800")),
            Err(Error::Overflow {
                what: "balance",
                value: 9_223_372_036_854_775_800,
                delta: 10
            })
        ));
        assert!(
            decode_adjustment(0, reply(0, "1")).is_err(),
            "0 is never refused"
        );
        assert!(decode_adjustment(1, reply(2, "1")).is_err());
    }
}
