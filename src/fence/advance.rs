//! Raising a fence counter after it went back: [`advance`] (never under a
//! live lock), [`force_advance`], [`AdvanceFence`], [`ForceAdvanceFence`].

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{Keys, MAX_FENCE};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::Result;

static ADVANCE: Script = embedded!("fence/advance");

/// The counter was raised, or did not need to be: the answer of
/// [`force_advance`], and [`AdvanceAttempt::Advanced`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "check that the counter is where the resource needs it"]
pub struct Advance {
    /// True when the counter was at or below the floor (or missing) and was
    /// raised to one above it; false when it was already above the floor
    /// and nothing was written.
    pub raised: bool,
    /// The counter afterwards: always above the floor. The next grant's
    /// fence is `counter + 1`.
    pub counter: u64,
}

/// The outcome of [`advance`]: the counter is above the floor, or a lock is
/// held and the counter was left alone.
///
/// ```
/// use std::time::Duration;
/// use nolock::fence::{Advance, AdvanceAttempt};
///
/// let done = AdvanceAttempt::Advanced(Advance { raised: true, counter: 42 });
/// assert_eq!((done.is_advanced(), done.counter()), (true, 42));
/// let held = AdvanceAttempt::Held { counter: 41, expires_in: Some(Duration::from_secs(3)) };
/// assert_eq!((held.is_advanced(), held.advanced()), (false, None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "Held means the counter is not above the floor yet"]
pub enum AdvanceAttempt {
    /// The counter is above the floor: it was raised while no lock was
    /// held, or it was above the floor already (held lock or not; nothing
    /// was written then).
    Advanced(Advance),
    /// The counter was at or below the floor and a lock on the resource is
    /// held (unexpired): nothing was written, and the holder's fenced writes
    /// go on applying. See [`advance`] for what to do next.
    Held {
        /// The counter as it is (0 when it does not exist): at most the
        /// floor. The live holder's fence is at most this.
        counter: u64,
        /// Time until the lock expires unless its holder extends or
        /// releases it; `None` when it has no expiry (a key nolock did not
        /// write).
        expires_in: Option<Duration>,
    },
}

impl AdvanceAttempt {
    /// True for [`AdvanceAttempt::Advanced`]: the counter is above the floor.
    pub fn is_advanced(&self) -> bool {
        matches!(self, AdvanceAttempt::Advanced(_))
    }

    /// The advance, unless a holder kept the counter where it was.
    pub fn advanced(self) -> Option<Advance> {
        match self {
            AdvanceAttempt::Advanced(advance) => Some(advance),
            AdvanceAttempt::Held { .. } => None,
        }
    }

    /// The counter after the call, in either case.
    pub fn counter(&self) -> u64 {
        match self {
            AdvanceAttempt::Advanced(advance) => advance.counter,
            AdvanceAttempt::Held { counter, .. } => *counter,
        }
    }
}

/// Raise the fence counter of `resource` **above** `floor`, unless a lock
/// on it is held; never lower it. Safe to run from every process of a fleet
/// at startup.
///
/// The recovery step after the counter went back (a restart without
/// persistence, a failover to a replica that had not seen the last grants;
/// [`super::durability`] tells whether your server can do that): pass the
/// highest fence the protected resource has seen (`SELECT max(fence) FROM
/// ...`, or the fence of [`super::read`]). One script reads the counter and
/// the lock and decides, so no grant slips in between. What you may assume
/// from each answer:
///
/// * [`AdvanceAttempt::Advanced`]: the counter is above `floor` (raised to
///   `floor + 1`, or above it already), so every later grant is above every
///   fence the resource has seen. If it was raised (`raised: true`), no lock
///   was held at that moment: no holder whose lock was still alive was made
///   stale. A holder whose lock had already **expired** (paused past its
///   TTL, cut off) has a fence at or below the old counter, and its
///   [`super::Fence::write`]s are now refused as [`super::Write::Stale`],
///   which is right: its lock is gone and a new grant may come any moment.
///   Raising the counter changes nothing for a database that checks fences
///   itself (`WHERE fence < $n`): it compares with the fences it stored.
/// * [`AdvanceAttempt::Held`]: the counter is still at or below `floor` and
///   a lock is held; nothing was written, the holder's writes keep
///   applying. The holder's fence is at most `counter`. When `counter ==
///   floor` (the usual case in a fleet: a live holder took the newest grant
///   and the resource has seen its fence), the next grant is `floor + 1`
///   anyway and nothing needs doing. When `counter < floor`, the counter
///   **went back** (it once granted the floor) and a holder took a grant
///   from it: grants would stay at or below fences the resource has seen
///   until the counter passes `floor`. Then run [`force_advance`]: the
///   holder's fence is below `floor`, so a resource that checks fences
///   (`WHERE fence <= $n` against a stored `floor`) refuses it already, and
///   forcing only makes its Redis-side writes stale too. (Or call
///   `advance` again after `expires_in`; the holder's lease may be renewed,
///   so bound the retries.)
///
/// The counter is never raised past a live holder, so a process that runs
/// this while another works under the lock does not turn that work stale
/// (the hazard of the unconditional form, [`force_advance`]).
///
/// Anything at the lock key (of any type, with or without a TTL) counts as
/// a held lock; nothing here deletes it.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`floor` 0),
/// [`Error::OutOfRange`] (at or above `i64::MAX`: the counter, one above,
/// must fit Redis' integer limit). From Redis: [`Error::Redis`] (the counter
/// holds something nolock did not write; nothing was written) and
/// [`Error::Indeterminate`] (safe to retry: advancing past the same floor
/// twice is the same as once).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, db: &tokio_postgres::Client)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use nolock::fence::{self, AdvanceAttempt};
///
/// // At startup, in every replica: the database has seen fences up to max(fence).
/// let row = db.query_one("SELECT coalesce(max(fence), 0) FROM payouts", &[]).await?;
/// let highest = u64::try_from(row.get::<_, i64>(0))?;
/// if highest > 0 {
///     match fence::advance(conn, "payouts", highest).await? {
///         AdvanceAttempt::Advanced(advance) => assert!(advance.counter > highest),
///         // Another replica holds the lock under the newest grant: the next is above.
///         AdvanceAttempt::Held { counter, .. } if counter >= highest => {}
///         // The counter went back: the holder's fence is below what the database has seen.
///         AdvanceAttempt::Held { .. } => {
///             fence::force_advance(conn, "payouts", highest).await?;
///         }
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn advance<C>(conn: &mut C, resource: &str, floor: u64) -> Result<AdvanceAttempt>
where
    C: ConnectionLike + Send,
{
    run_one(&AdvanceFence::new(resource, floor)?, conn).await
}

/// Raise the fence counter of `resource` above `floor` **whether or not a
/// lock is held**; never lower it. The unconditional recovery step.
///
/// Use it when you know the counter went back (after a restart without
/// persistence or a failover, before the fleet takes new grants), or after
/// [`advance`] answered [`AdvanceAttempt::Held`] with a counter below the
/// floor. The counter ends at `floor + 1` or above, so:
///
/// * every later grant is above every fence the resource has seen, and the
///   resource accepts the new holder's writes;
/// * every holder of a fence at or below the floor is refused as
///   [`super::Write::Stale`], **including a live holder** (its lease still
///   renews; its Redis-side fenced writes fail) and two holders a failover
///   gave the same fence (a counter left *at* the floor would still accept
///   both: a write equal to the counter is the newest grant's);
/// * a holder that takes its lock again with the same token keeps its own
///   fence (now stale), never the floor.
///
/// Do not run it from every replica at startup: one replica's raise would
/// turn another's live work stale. That is what [`advance`] is for.
///
/// # Errors
///
/// As [`advance`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// // Recovery after a failover: the database has seen fences up to 1041.
/// let advanced = nolock::fence::force_advance(conn, "payouts", 1041).await?;
/// assert!(advanced.counter > 1041);
/// # Ok(()) }
/// ```
pub async fn force_advance<C>(conn: &mut C, resource: &str, floor: u64) -> Result<Advance>
where
    C: ConnectionLike + Send,
{
    run_one(&ForceAdvanceFence::new(resource, floor)?, conn).await
}

/// [`advance`] as a value, for a [`crate::Batch`] (many resources at
/// startup) or an operation id.
///
/// ```
/// use nolock::fence::AdvanceFence;
/// assert!(AdvanceFence::new("payouts", 41).is_ok());
/// assert!(AdvanceFence::new("payouts", 0).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct AdvanceFence {
    call: Invocation,
}

impl AdvanceFence {
    /// Raise `resource`'s counter above `floor`, unless its lock is held.
    ///
    /// # Errors
    ///
    /// As [`advance`], before any I/O.
    pub fn new(resource: &str, floor: u64) -> Result<Self> {
        Ok(AdvanceFence {
            call: invocation(resource, floor, "free")?,
        })
    }
}

/// [`force_advance`] as a value, for a [`crate::Batch`] (many resources
/// after a failover) or an operation id.
///
/// ```
/// use nolock::fence::ForceAdvanceFence;
/// assert!(ForceAdvanceFence::new("payouts", 41).is_ok());
/// assert!(ForceAdvanceFence::new("", 41).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct ForceAdvanceFence {
    call: Invocation,
}

impl ForceAdvanceFence {
    /// Raise `resource`'s counter above `floor`, held lock or not.
    ///
    /// # Errors
    ///
    /// As [`advance`], before any I/O.
    pub fn new(resource: &str, floor: u64) -> Result<Self> {
        Ok(ForceAdvanceFence {
            call: invocation(resource, floor, "force")?,
        })
    }
}

fn invocation(resource: &str, floor: u64, mode: &str) -> Result<Invocation> {
    let keys = Keys::of(resource)?;
    if floor == 0 {
        return Err(crate::Error::ZeroLimit { what: "floor" });
    }
    if floor >= MAX_FENCE {
        return Err(crate::Error::OutOfRange {
            what: "floor",
            given: floor,
            max: MAX_FENCE - 1,
        });
    }
    Ok(Invocation::new(&ADVANCE, &[&keys.lock, &keys.fence])
        .arg(floor.to_string())
        .arg(mode))
}

/// The reply `{outcome, counter, pttl}` of `fence/advance`.
fn decode(value: redis::Value) -> Result<AdvanceAttempt> {
    let mut reply = Reply::new(ADVANCE.name(), value)?;
    let outcome = reply.code(3)?;
    let counter = reply.uint()?;
    let pttl = reply.int()?;
    reply.finish()?;
    Ok(match outcome {
        2 => AdvanceAttempt::Held {
            counter,
            expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
        },
        raised => AdvanceAttempt::Advanced(Advance {
            raised: raised == 1,
            counter,
        }),
    })
}

impl Operation for AdvanceFence {
    type Output = AdvanceAttempt;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<AdvanceAttempt> {
        decode(value)
    }
}

impl Operation for ForceAdvanceFence {
    type Output = Advance;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<Advance> {
        match decode(value)? {
            AdvanceAttempt::Advanced(advance) => Ok(advance),
            AdvanceAttempt::Held { .. } => Err(crate::Error::UnexpectedReply {
                script: ADVANCE.name(),
                detail: "a forced advance answered that a lock is held".to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use crate::Error;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn advance_takes_a_floor_whose_successor_redis_can_store() {
        let op = AdvanceFence::new("r", 9).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                ADVANCE.sha1(),
                "2",
                "{r}:lock",
                "{r}:fence",
                "9",
                "free"
            ]
        );
        let forced = ForceAdvanceFence::new("r", 9).unwrap();
        assert_eq!(
            words(forced.invocation().command()),
            [
                "EVALSHA",
                ADVANCE.sha1(),
                "2",
                "{r}:lock",
                "{r}:fence",
                "9",
                "force"
            ]
        );
        assert!(AdvanceFence::new("r", MAX_FENCE - 1).is_ok());
        assert!(matches!(
            AdvanceFence::new("r", MAX_FENCE),
            Err(Error::OutOfRange { what: "floor", .. })
        ));
        assert!(matches!(
            ForceAdvanceFence::new("r", 0),
            Err(Error::ZeroLimit { what: "floor" })
        ));
        assert!(matches!(AdvanceFence::new("", 1), Err(Error::EmptyKey)));
    }

    #[test]
    fn replies_decode_into_the_three_answers() {
        let op = AdvanceFence::new("r", 9).unwrap();
        let reply = |code, counter: &str, pttl| {
            Array(vec![Int(code), BulkString(counter.into()), Int(pttl)])
        };
        assert_eq!(
            op.decode(reply(1, "10", 0)).unwrap(),
            AdvanceAttempt::Advanced(Advance {
                raised: true,
                counter: 10
            })
        );
        assert_eq!(
            op.decode(reply(0, "9007199254740993", 0))
                .unwrap()
                .counter(),
            (1 << 53) + 1
        );
        assert_eq!(
            op.decode(reply(2, "9", 1500)).unwrap(),
            AdvanceAttempt::Held {
                counter: 9,
                expires_in: Some(Duration::from_millis(1500))
            }
        );
        assert_eq!(
            op.decode(reply(2, "0", -1)).unwrap(),
            AdvanceAttempt::Held {
                counter: 0,
                expires_in: None
            }
        );
        assert!(op.decode(reply(3, "9", 0)).is_err());
        let forced = ForceAdvanceFence::new("r", 9).unwrap();
        assert!(forced.decode(reply(2, "9", 10)).is_err());
    }
}
