//! Fenced permits: [`Semaphore::fenced`], [`PermitFence`], [`WritePermit`].
//!
//! A fenced semaphore of `P` permits has **seats** 1..P. A fenced acquire
//! (`lua/semaphore/acquire_fenced.lua`, weight 1) takes the lowest seat
//! whose holder is gone or expired and draws the permit's **fence** from the
//! fence counter of the semaphore key's cluster slot
//! ([`crate::fence::slot_counter`], shared with slot-fenced locks), in the
//! same atomic script. The permit is the same sorted-set member a plain
//! acquire writes (so plain and fenced calls count the same permits); the
//! seat and fence live in a hash `keys::derive(key, "seats")`, seat ->
//! `"<fence>:<id>"`, which expires with the semaphore.
//!
//! **Why it is sound.** The slot counter only grows and never expires, and
//! every grant of a seat draws from it: per seat (indeed per slot), fences
//! strictly increase and never repeat, even after the semaphore and its
//! seats expired. A seat is held while its entry's id holds an unexpired
//! permit, and admission is the plain semaphore's (never more than `P`
//! permits), so never more than `P` seats are held and no two live permits
//! share a seat. A fenced write ([`PermitFence::write`],
//! `lua/semaphore/write_fenced.lua`) applies only while the seat holds this
//! permit's `"<fence>:<id>"` and the permit is unexpired, checked atomically
//! with the write; a store outside Redis keeps a watermark per (resource,
//! seat) and refuses a fence below it (`UPDATE ... WHERE seat = $s AND
//! fence <= $f`), so a holder paused past its expiry is refused once its
//! seat's next holder wrote.
//!
//! A per-semaphore counter would also be sound, but it could never expire:
//! one key for every semaphore key ever used (per tenant, per job). The
//! slot counters are at most 16384 keys.

use redis::aio::ConnectionLike;

use super::{Permit, PermitId};
use crate::fence::Write;
use crate::script::{embedded, run_one, Invocation, Operation, Script};
use crate::{keys, validate, Result};
#[cfg(doc)]
use crate::{semaphore::Semaphore, Error};

pub(super) static ACQUIRE_FENCED: Script = embedded!("semaphore/acquire_fenced");
pub(super) static EXTEND_FENCED: Script = embedded!("semaphore/extend_fenced");
pub(super) static WRITE_FENCED: Script = embedded!("semaphore/write_fenced");

/// A fenced permit's seat and fence, as its acquire answered them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Seat {
    pub(crate) seat: u64,
    pub(crate) fence: u64,
}

/// The seats hash of the semaphore at `key`.
pub(super) fn seats_key(key: &str) -> String {
    keys::derive(key, "seats")
}

/// The fence of a permit of a fenced semaphore ([`Semaphore::fenced`]): its
/// **seat** (1..permits) and its **fence** number, with the semaphore's key
/// and the holder's id. Pass it to every write the permit protects, as a
/// lock's [`crate::fence::Fence`]: [`PermitFence::write`] in Redis, or
/// `(seat, fence)` in a conditional SQL write:
///
/// ```sql
/// UPDATE exports SET cursor = $1, fence = $3
///  WHERE semaphore = 'exports' AND seat = $2 AND fence <= $3
/// ```
///
/// (one row per seat; `0 rows` means a newer holder of the seat wrote:
/// stop). Fences of one seat strictly increase with every grant of it and
/// never repeat. It holds the permit's id, a secret: its `Debug` leaves the
/// id out.
///
/// ```
/// use std::time::Duration;
/// use nolock::semaphore::{PermitId, Semaphore};
///
/// let exports = Semaphore::new(3, Duration::from_secs(30))?.fenced();
/// let id = PermitId::random()?;
/// let permit = exports.restore_fenced("exports", id, 2, 41)?;
/// let fence = permit.fence().expect("a fenced permit");
/// assert_eq!((fence.seat(), fence.number(), fence.as_i64()), (2, 41, 41));
/// assert!(!format!("{fence:?}").contains(permit.id().as_str()));
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PermitFence {
    key: String,
    id: PermitId,
    seat: Seat,
}

impl std::fmt::Debug for PermitFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermitFence")
            .field("key", &self.key)
            .field("seat", &self.seat.seat)
            .field("number", &self.seat.fence)
            .finish_non_exhaustive()
    }
}

impl PermitFence {
    /// The semaphore's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The seat, 1..permits: which row of a per-seat resource the permit
    /// may write.
    pub fn seat(&self) -> u64 {
        self.seat.seat
    }

    /// The fence itself: at least 1, greater for every later grant of the
    /// seat.
    pub fn number(&self) -> u64 {
        self.seat.fence
    }

    /// The fence as an `i64`, exact (the slot counter stops below
    /// `i64::MAX`): for a PostgreSQL `bigint` column.
    pub fn as_i64(&self) -> i64 {
        i64::try_from(self.seat.fence).unwrap_or(i64::MAX)
    }

    /// The key of this seat's value in Redis ([`PermitFence::write`]),
    /// `keys::derive(key, "value:<seat>")`: read it with
    /// [`crate::fence::read_unbound`].
    pub fn value_key(&self) -> String {
        keys::derive(&self.key, &format!("value:{}", self.seat.seat))
    }

    /// Store `value` as this seat's value ([`PermitFence::value_key`]),
    /// only while the permit is unexpired and its seat still holds this
    /// fence: one atomic script (`lua/semaphore/write_fenced.lua`).
    ///
    /// * [`Write::Applied`]: stored with this fence (also a repeat);
    /// * [`Write::Stale`]: the seat was granted again (a newer fence), or
    ///   its value was written under a newer one: the permit is over;
    /// * [`Write::NotGranted`]: the seat holds a smaller fence, or this
    ///   fence under another id: no grant gave this permit that seat;
    /// * [`Write::Ended`]: the permit expired or was released (its seat may
    ///   not have been granted again yet).
    ///
    /// Nothing is stored unless [`Write::Applied`]; stop the work on
    /// anything else.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::ValueTooLarge`]. From Redis:
    /// [`Error::Redis`] (a key holds data nolock did not write; nothing was
    /// written) and [`Error::Indeterminate`] (safe to resend: a repeat
    /// under the same fence is harmless).
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit)
    /// #     -> nolock::Result<()> {
    /// let Some(fence) = permit.fence() else { return Ok(()) };
    /// if !fence.write(conn, "cursor=1700").await?.is_applied() {
    ///     return Ok(()); // the seat is someone else's now: stop
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn write<C>(&self, conn: &mut C, value: impl AsRef<[u8]>) -> Result<Write>
    where
        C: ConnectionLike + Send,
    {
        run_one(&WritePermit::new(self, value)?, conn).await
    }
}

impl Permit {
    /// This permit's seat and fence, when its semaphore is fenced
    /// ([`Semaphore::fenced`]); `None` for a plain permit (or one restored
    /// with [`Semaphore::restore`]).
    pub fn fence(&self) -> Option<PermitFence> {
        self.holding.seat.map(|seat| PermitFence {
            key: self.holding.key.clone(),
            id: self.holding.id.clone(),
            seat,
        })
    }

    /// [`PermitFence::write`] under this permit's fence.
    ///
    /// # Errors
    ///
    /// As [`PermitFence::write`]; [`Error::InvalidArgument`] before any I/O
    /// for a permit without a fence.
    pub async fn write<C>(&self, conn: &mut C, value: impl AsRef<[u8]>) -> Result<Write>
    where
        C: ConnectionLike + Send,
    {
        let fence = self.fence().ok_or_else(unfenced)?;
        fence.write(conn, value).await
    }
}

pub(super) fn unfenced() -> crate::Error {
    crate::Error::InvalidArgument {
        what: "permit",
        reason: "this permit has no fence: acquire it from a fenced semaphore \
                 (Semaphore::fenced)"
            .to_owned(),
    }
}

/// [`PermitFence::write`] as a value: for a [`crate::Batch`], or with an
/// operation id.
///
/// ```
/// use std::time::Duration;
/// use nolock::semaphore::{PermitId, Semaphore, WritePermit};
///
/// let sem = Semaphore::new(3, Duration::from_secs(30))?.fenced();
/// let permit = sem.restore_fenced("exports", PermitId::random()?, 1, 7)?;
/// let op = WritePermit::new(&permit.fence().expect("fenced"), "v")?;
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct WritePermit {
    call: Invocation,
}

impl WritePermit {
    /// Write `value` to `fence`'s seat under it.
    ///
    /// # Errors
    ///
    /// As [`PermitFence::write`], before any I/O.
    pub fn new(fence: &PermitFence, value: impl AsRef<[u8]>) -> Result<Self> {
        let value = validate::value("value", value.as_ref())?;
        let value_key = fence.value_key();
        let seats = seats_key(&fence.key);
        Ok(WritePermit {
            call: Invocation::new(&WRITE_FENCED, &[&value_key, &fence.key, &seats])
                .arg(fence.seat.fence.to_string())
                .arg(value)
                .arg(fence.id.as_str())
                .arg(fence.seat.seat),
        })
    }
}

impl Operation for WritePermit {
    type Output = Write;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<Write> {
        decode_write(value)
    }
}

fn decode_write(value: redis::Value) -> Result<Write> {
    crate::fence::decode_status(&WRITE_FENCED, value, 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn replies_decode_as_a_lock_write_does() {
        let reply = |status, fence: &str| Array(vec![Int(status), BulkString(fence.into())]);
        assert_eq!(decode_write(reply(1, "7")).unwrap(), Write::Applied);
        assert_eq!(
            decode_write(reply(0, "9")).unwrap(),
            Write::Stale { current_fence: 9 }
        );
        assert_eq!(
            decode_write(reply(2, "5")).unwrap(),
            Write::NotGranted { counter: 5 }
        );
        assert_eq!(decode_write(reply(3, "0")).unwrap(), Write::Ended);
        assert!(decode_write(reply(4, "0")).is_err());
    }

    #[test]
    fn a_fenced_semaphore_sends_its_seats_and_slot_counter_and_decodes_the_seat() {
        use super::super::{AcquirePermit, ExtendPermit, PermitAttempt, Semaphore};
        let id = PermitId::parse("0123456789abcdef0123456789abcdef").unwrap();
        let sem = Semaphore::new(3, std::time::Duration::from_secs(1))
            .unwrap()
            .fenced();
        let op = AcquirePermit::with_id(&sem, "exports", &id, 1).unwrap();
        let counter = crate::fence::slot_counter(crate::keys::slot("exports"));
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                ACQUIRE_FENCED.sha1(),
                "3",
                "exports",
                "{exports}:seats",
                counter,
                id.as_str(),
                "3",
                "1000"
            ]
        );
        let reply = Array(vec![Int(1), Int(2), Int(3), BulkString(b"41".to_vec())]);
        let PermitAttempt::Acquired(permit) = op.decode(reply).unwrap() else {
            panic!("acquired");
        };
        let fence = permit.fence().unwrap();
        assert_eq!(
            (fence.seat(), fence.number(), fence.key()),
            (3, 41, "exports")
        );
        assert!(op.decode(Array(vec![Int(1), Int(2)])).is_err(), "no seat");
        assert_eq!(
            words(ExtendPermit::new(&permit).invocation().command()),
            [
                "EVALSHA",
                EXTEND_FENCED.sha1(),
                "2",
                "exports",
                "{exports}:seats",
                id.as_str(),
                "3",
                "41",
                "1000"
            ]
        );
        // A plain semaphore's acquire is unchanged, and its permits have no fence.
        let plain = Semaphore::new(3, std::time::Duration::from_secs(1)).unwrap();
        let op = AcquirePermit::with_id(&plain, "exports", &id, 1).unwrap();
        let PermitAttempt::Acquired(permit) = op.decode(Array(vec![Int(1), Int(1)])).unwrap()
        else {
            panic!("acquired");
        };
        assert!(permit.fence().is_none());
    }

    #[test]
    fn a_write_carries_its_seat_fence_and_id() {
        let id = PermitId::parse("0123456789abcdef0123456789abcdef").unwrap();
        let fence = PermitFence {
            key: "exports".to_owned(),
            id: id.clone(),
            seat: Seat { seat: 2, fence: 41 },
        };
        let op = WritePermit::new(&fence, "v").unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                WRITE_FENCED.sha1(),
                "3",
                "{exports}:value:2",
                "exports",
                "{exports}:seats",
                "41",
                "v",
                id.as_str(),
                "2"
            ]
        );
        assert!(!format!("{op:?}").contains(id.as_str()));
        let big = vec![0u8; crate::MAX_VALUE_LEN + 1];
        assert!(matches!(
            WritePermit::new(&fence, &big),
            Err(crate::Error::ValueTooLarge { .. })
        ));
    }
}
