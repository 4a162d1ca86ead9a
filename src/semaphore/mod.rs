//! A semaphore with expiring permits: "at most `permits` at once", safe when
//! holders crash or stall.
//!
//! "At most 10 exports running", "at most 3 calls to the payment provider per
//! tenant": each holder takes a **permit** that expires `ttl` after it was
//! granted or last extended, on the **server clock**. A holder that crashes
//! frees its own permit at its expiry and nobody else's; a holder paused past
//! its expiry finds its [`Permit::release`] or [`Permit::extend`] answered [`PermitRelease::Lost`],
//! because its place may already be someone else's.
//!
//! Build a [`Semaphore`] once (its size, its permits' TTL, how long to wait
//! for one), then call it with the key of whatever is limited. The permits it
//! hands out are receipts: a [`Permit`] carries its key, id, weight and TTL,
//! so releasing or extending it takes no key, and it is neither `Copy` nor
//! `Clone`. A permit that crossed a process boundary is rebuilt with
//! [`Semaphore::restore`] (key, id and weight; the TTL is the semaphore's).
//! The id is a secret: no `Debug`, `Display` or error message shows it.
//!
//! | call | script | what it does |
//! |---|---|---|
//! | [`Semaphore::acquire`], [`Semaphore::acquire_weighted`] | `lua/semaphore/acquire.lua` | take 1 (or `weight`) permits if they fit, all or nothing; else when they will; waiting up to the semaphore's [`Backoff`] |
//! | [`Permit::extend`] | `lua/semaphore/extend.lua` | reset this permit's expiry, only if it has not expired |
//! | [`Permit::release`] | `lua/semaphore/release.lua` | give back this permit, and only this one |
//! | [`Semaphore::restore`] | none | rebuild a permit from its key, id and weight, with the semaphore's TTL |
//! | [`Semaphore::lease`], [`Semaphore::with_permit`] | extend + release | renew every `ttl / 3` in a background task, signal loss |
//! | [`Semaphore::peek`] | `lua/semaphore/peek.lua` | permits in use, holders, next expiry; writes nothing |
//! | [`Semaphore::fenced`]: acquire, extend | `lua/semaphore/acquire_fenced.lua`, `lua/semaphore/extend_fenced.lua` | the same, for a permit with a seat and a fence ([`PermitFence`]) |
//! | [`Semaphore::fair`]: acquire, release | `lua/semaphore/acquire_fair.lua`, `lua/semaphore/release_fair.lua` | **fair waiting**: the same permits, granted only when they fit together with every live waiter ahead in the key's line (arrival order across processes); a release wakes by name the first waiters that fit ([`crate::fence::Waiters::acquire_permit`]) |
//! | [`PermitFence::write`] | `lua/semaphore/write_fenced.lua` | store a value for the permit's seat, only while it holds the seat with its fence |
//!
//! Every call is also an operation value ([`AcquirePermit`],
//! [`ReleasePermit`], [`ExtendPermit`], [`PeekSemaphore`]) for a
//! [`crate::Batch`] or an operation id ([`crate::Operation::idempotent`]).
//! An extension's answer ([`PermitExtension`]) names the permit it is
//! about, and only that permit takes it ([`Permit::apply`]).
//!
//! # Weights
//!
//! A holder's weight is checked by the server on every write of its id
//! (acquire, extend, release): when `"<id>:1"` is unexpired, the id's
//! members must be exactly `"<id>:1"`..`"<id>:<weight>"`, all unexpired,
//! with `"<id>:<weight+1>"` absent or expired. Otherwise the id was granted
//! another weight, and the call is refused with
//! [`Error::PermitWeightMismatch`], nothing written: a permit restored with
//! a smaller weight can neither keep part of a holding alive (the rest
//! would expire and be granted again while both holders think they hold)
//! nor give part of it back.
//!
//! # State
//!
//! One key per semaphore, a sorted set, so it works unchanged on Redis
//! Cluster. Each permit held is one member, `"<id>:<i>"`: the holder's
//! [`PermitId`] (32 lowercase hex digits, 128 random bits) and `i` from 1 to
//! the holder's weight, scored with its **expiry in server milliseconds**
//! since the Unix epoch. A weighted holder of 3 permits is 3 members with
//! one expiry, so "permits in use" is the set's size less its tag (below;
//! `ZCARD`, O(1)) and a weight is capped at [`MAX_PERMITS`].
//!
//! One more member, `"by:m<permits>"` scored 0 (below every expiry), is the
//! set's **tag**: the size of the semaphore that granted last. An acquire
//! of another size is refused with [`Error::StateMismatch`], nothing
//! written, so two processes built with other sizes cannot share a key
//! unnoticed; [`Semaphore::peek`] refuses the same way (the free [`peek`],
//! which knows no size, reads any). The tag is never a permit: never
//! counted, listed, swept or ranked, and it goes with the key when the last
//! permit does. A set written before tags is read as before and tagged at
//! its next grant. Releases and extensions do not send the size: they check
//! the tag's form only, and change no count. The client's handles
//! ([`crate::Client::semaphore`]) adopt: after a size changed through
//! [`crate::config`] they read the holders of the old size and retag the
//! set at their next grant.
//!
//! Every acquire first removes the members whose expiry has passed (each
//! one by its own score: a crashed holder's permits come back at their own
//! expiry, not all at once), then admits if `in use + weight <= permits`.
//! The key itself expires (`PEXPIREAT`) with its latest permit, so an idle
//! semaphore leaves nothing behind. The size is the [`Semaphore`]'s, sent
//! with every acquire: share one `Semaphore` value (or one configuration)
//! between the callers of a key (another size is refused, above); lowering
//! it through a configuration admits nobody until enough holders are gone.
//!
//! **No queue by default.** Waiters are not served in order: whoever asks
//! when a permit is free gets it. A [`Semaphore`] that waits spreads the
//! retries with jitter and never sleeps past `retry_after`, but a holder
//! that asks again at once after releasing can win repeatedly (and a waiter
//! of weight 2 can wait behind light ones for ever). [`Semaphore::fair`]
//! serves waiting acquires in arrival order; wait with
//! [`crate::fence::Waiters::acquire_permit`] to be woken by the releases
//! (polling by place in line costs most of the throughput under
//! contention: `examples/fair_wait.rs`).
//!
//! Stored state is checked before anything is written, to this exact reach:
//! a key that is not a sorted set, or whose tag, lowest permit or highest
//! member (which bound every score) is not in the form above, is a definite
//! [`Error::Redis`] naming the key, with nothing written. Each script also
//! checks every member it reads (the expired ones it removes, the holder's
//! own), and [`Semaphore::peek`] checks all. A foreign member between the
//! lowest and highest is not read by an acquire: it counts as one permit
//! held until its score passes, so it can only make the semaphore admit
//! *fewer* holders, never more (`tests/semaphore.rs` shows it). Checking
//! every member on every acquire would cost a read of the whole set per
//! call, O(permits), for a key nolock alone should write.
//!
//! # Fenced permits
//!
//! A plain permit carries no fence: a holder paused past its expiry cannot
//! be told apart from its successor by what it writes. A
//! [`Semaphore::fenced`] semaphore gives each permit (weight 1) a **seat**
//! 1..permits and a **fence** from its cluster slot's counter
//! ([`crate::fence::slot_counter`]); per seat, fences strictly increase
//! with every grant and never repeat. [`PermitFence::write`] stores a value
//! for the seat only while the permit holds it with its fence, and a
//! database keeps a row per seat written `WHERE seat = $s AND fence <= $f`.
//! The seats live in `keys::derive(key, "seats")` beside the sorted set
//! (which stays as above, so plain and fenced holders count together);
//! why this is sound is in the source of `src/semaphore/fenced.rs` and the
//! guide (`guide::fencing`, "Fenced permits").
//!
//! # Time
//!
//! Expiries are decided by the server's clock. A [`Permit::deadline`] is a
//! conservative local bound, as for a fence grant: `ttl` after the request
//! was sent, less 1% of the TTL and 2 ms. Stop the work (or
//! [`Permit::extend`]) before it; [`PermitLease`] does that for you.
//!
//! # Example: a bounded worker pool
//!
//! ```no_run
//! use std::time::Duration;
//! use nolock::semaphore::Semaphore;
//! use nolock::{Backoff, Work};
//!
//! # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
//! // At most 10 exports at once across every replica of the service; each
//! // waits up to a minute for a permit, renewed every 10 s while it runs.
//! let exports = Semaphore::new(10, Duration::from_secs(30))?
//!     .with_wait(Backoff::new(Duration::from_secs(60)));
//! match exports.with_permit(conn, "exports:running", |_id| async { /* the export */ }).await? {
//!     Work::Done(()) => println!("exported"),
//!     Work::Busy => println!("still 10 exports running after a minute; try later"),
//!     lost => println!("the permit was lost: {:?}", lost.loss()),
//! }
//! # Ok(()) }
//! ```
//!
//! `examples/worker_pool.rs` runs twelve workers on two permits and prints
//! the peak concurrency it measured.

use std::fmt;
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::Backoff;
use crate::{validate, Error, Result};

mod acquire;
mod fenced;
mod handle;
mod lease;
mod peek;
mod release;
pub(crate) mod retry;

pub use acquire::AcquirePermit;
pub use fenced::{PermitFence, WritePermit};
pub use handle::Semaphore;
pub use lease::PermitLease;
pub use peek::{peek, PeekSemaphore};
pub use release::{ExtendPermit, ReleasePermit};

/// The largest semaphore (and so the largest weight): each permit held is
/// one sorted-set member, and a weighted acquire writes `weight` of them.
pub const MAX_PERMITS: u64 = 10_000;

/// The error code of `lib/permits`' `permit_weight_error`: a permit asked
/// with a weight its id does not hold ([`Error::PermitWeightMismatch`]).
pub(crate) const WEIGHT_MISMATCH: &str = "NOLOCK_WEIGHT";

/// The longest permit TTL: 2^52 ms (about 142,000 years), so that the
/// server's clock plus the TTL stays an exact integer in a Lua double.
pub const MAX_PERMIT_TTL: Duration = Duration::from_millis(1 << 52);

/// A permit holder's id: 128 bits from the OS CSPRNG, as 32 lowercase hex
/// digits. Whoever has it can extend and release that holder's permits, so
/// it is a secret: its `Debug` shows `PermitId(<redacted>)` and it has no
/// `Display`; [`PermitId::as_str`] is the one way to read it.
///
/// ```
/// let id = nolock::semaphore::PermitId::random()?;
/// assert_eq!(format!("{id:?}"), "PermitId(<redacted>)");
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PermitId(String);

impl PermitId {
    /// A fresh id from the operating system's random number generator.
    ///
    /// # Errors
    ///
    /// [`Error::Entropy`] when the OS generator fails.
    ///
    /// ```
    /// let id = nolock::semaphore::PermitId::random()?;
    /// assert_eq!(id.as_str().len(), 32);
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn random() -> Result<PermitId> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| Error::Entropy(e.to_string()))?;
        Ok(PermitId(format!("{:032x}", u128::from_be_bytes(bytes))))
    }

    /// An id you stored (e.g. to release after a restart): exactly 32
    /// lowercase hex digits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for anything else; its message gives the
    /// length of what was passed, never the text (a near-miss may be a
    /// real id with a stray character).
    ///
    /// ```
    /// use nolock::semaphore::PermitId;
    /// assert!(PermitId::parse("0123456789abcdef0123456789abcdef").is_ok());
    /// assert!(PermitId::parse("0123456789ABCDEF0123456789ABCDEF").is_err());
    /// assert!(PermitId::parse("42").is_err());
    /// ```
    pub fn parse(id: &str) -> Result<PermitId> {
        if id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(PermitId(id.to_owned()))
        } else {
            Err(Error::InvalidArgument {
                what: "permit id",
                reason: format!("{} bytes that are not 32 lowercase hex digits", id.len()),
            })
        }
    }

    /// The id as stored in Redis: keep it out of logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PermitId")
            .field(&crate::observe::Redacted)
            .finish()
    }
}

/// What names a holding on the server: the key, the holder's id, how many
/// permits, and their TTL. Shared by a [`Permit`] and the renewal task of a
/// [`PermitLease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    pub(crate) key: String,
    pub(crate) id: PermitId,
    pub(crate) weight: u64,
    pub(crate) ttl: Duration,
    /// A fenced permit's seat and fence ([`Semaphore::fenced`]).
    pub(crate) seat: Option<fenced::Seat>,
    /// Granted by a fair semaphore ([`Semaphore::fair`]): its release wakes
    /// the waiters in line that fit.
    pub(crate) fair: bool,
}

/// One holder's permits: a receipt of [`Semaphore::acquire`], naming the
/// key, the holder's id, how many permits and until when.
///
/// It is the only way to release or extend them ([`Permit::release`],
/// [`Permit::extend`]): neither takes a key, so a permit of one semaphore
/// can never touch another. It is neither `Copy` nor `Clone`; releasing it
/// consumes it. A permit that crossed a process boundary is rebuilt with
/// [`Semaphore::restore`]. Its `Debug` leaves out the id.
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit) -> nolock::Result<()> {
/// permit.release(conn, "another:key").await?; // no key: a permit releases where it was taken
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(permit: nolock::semaphore::Permit) {
/// let copy = permit.clone(); // one value, one holding
/// # }
/// ```
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit) -> nolock::Result<()> {
/// let _ = permit.release(conn).await?;
/// let _ = permit.release(conn).await?; // released: the value is gone
/// # Ok(()) }
/// ```
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a permit holds its place until it is released or expires"]
pub struct Permit {
    holding: Holding,
    /// A conservative local bound on the permits' expiry.
    deadline: Instant,
    /// When the acquire was built (single calls: sent).
    sent: Instant,
    /// When the extension behind the deadline was built (`sent` until one
    /// is applied): an older answer is not taken.
    answered: Instant,
}

impl Permit {
    /// The permits of `holding`, granted (or restored) by a request built
    /// at `sent`, valid until `deadline`.
    pub(super) fn granted(holding: Holding, sent: Instant, deadline: Instant) -> Permit {
        Permit {
            holding,
            deadline,
            sent,
            answered: sent,
        }
    }

    /// The semaphore's key.
    pub fn key(&self) -> &str {
        &self.holding.key
    }

    /// The holder's id: store it (with the key and weight) to
    /// [`Semaphore::restore`] the permit elsewhere. A secret: the permit's
    /// `Debug` leaves it out.
    pub fn id(&self) -> &PermitId {
        &self.holding.id
    }

    /// How many permits this holder took at once (1 unless weighted).
    pub fn weight(&self) -> u64 {
        self.holding.weight
    }

    /// The TTL the permits are set with, in whole milliseconds.
    pub fn ttl(&self) -> Duration {
        self.holding.ttl
    }

    /// A conservative local bound on the permits' expiry: when granted, then
    /// as each [`Permit::extend`] moved it.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The time left until [`Permit::deadline`] (zero once it has passed).
    pub fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The old name of [`Permit::time_left`].
    #[deprecated(
        since = "0.2.0",
        note = "renamed `time_left`: `remaining` counts units in the rate limiters"
    )]
    pub fn remaining(&self) -> Duration {
        self.time_left()
    }

    /// Take in the answer of an [`ExtendPermit`] of this permit, run
    /// yourself (in a [`crate::Batch`], or with an operation id):
    /// [`Permit::extend`] does it. An extension moves [`Permit::deadline`]
    /// to its own; a lost permit's deadline is now.
    ///
    /// Only answers about this permit are taken: its key, id, weight and
    /// TTL. An answer to an extension built before the one this permit's
    /// deadline comes from (or before it was acquired or restored) is older
    /// news and changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignAnswer`] for an answer about another permit (another
    /// key or id, or the same id with another weight or TTL): nothing
    /// changes.
    pub fn apply(&mut self, answer: &PermitExtension) -> Result<()> {
        if answer.about != self.holding {
            return Err(Error::ForeignAnswer { receipt: "permit" });
        }
        if answer.built < self.answered {
            return Ok(());
        }
        self.answered = answer.built;
        self.deadline = match answer.outcome {
            PermitExtend::Extended { deadline } => deadline,
            PermitExtend::Lost => Instant::now(),
        };
        Ok(())
    }
}

/// What an [`ExtendPermit`] answers: the outcome of one extension, with the
/// permit it is about. Only that permit takes it ([`Permit::apply`]), and
/// only an extension makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a lost permit means the work must stop"]
pub struct PermitExtension {
    about: Holding,
    /// When the extension was built: its deadline counts from then.
    built: Instant,
    outcome: PermitExtend,
}

impl PermitExtension {
    pub(super) fn answer(about: Holding, built: Instant, outcome: PermitExtend) -> Self {
        PermitExtension {
            about,
            built,
            outcome,
        }
    }

    /// What the server answered (an extension's deadline counts from when
    /// the [`ExtendPermit`] was built).
    pub fn outcome(&self) -> PermitExtend {
        self.outcome
    }

    /// True when the permits were still held and were extended.
    pub fn is_extended(&self) -> bool {
        matches!(self.outcome, PermitExtend::Extended { .. })
    }
}

/// The outcome of [`Semaphore::acquire`]: permits, or the semaphore is full.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a full semaphore must be waited for or turned away"]
pub enum PermitAttempt<P = Permit> {
    /// The permits are yours until their deadline.
    Acquired(P),
    /// Not enough permits are free. Expired permits were reclaimed; nothing
    /// else was written.
    Full {
        /// When enough of the current permits expire for this request to
        /// fit, on the server's clock, if none is released or extended first
        /// (releases usually come sooner).
        retry_after: Duration,
        /// Permits in use (unexpired) when the call was decided.
        in_use: u64,
    },
}

impl<P> PermitAttempt<P> {
    /// True for [`PermitAttempt::Acquired`].
    pub fn is_acquired(&self) -> bool {
        matches!(self, PermitAttempt::Acquired(_))
    }

    /// The permit (or lease), if acquired.
    pub fn acquired(self) -> Option<P> {
        match self {
            PermitAttempt::Acquired(permit) => Some(permit),
            PermitAttempt::Full { .. } => None,
        }
    }
}

/// The outcome of [`Permit::release`].
///
/// A release resent after a lost reply finds the permits gone and answers
/// `Lost` for its own success: send releases that may be resent as a
/// [`ReleasePermit`] with an operation id ([`crate::Operation::idempotent`]),
/// whose resend answers with the first reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a lost permit means another holder may have run alongside"]
pub enum PermitRelease {
    /// The permits were still held (unexpired) and are given back.
    Released,
    /// Some had expired (and may have been reclaimed and granted to someone
    /// else): the work under them may have run beside one more holder than
    /// the semaphore allows. What was left of them is removed.
    Lost,
}

/// The outcome of [`Permit::extend`] (and of an [`ExtendPermit`], in its
/// [`PermitExtension`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a lost permit means the work must stop"]
pub enum PermitExtend {
    /// The permits were still held; they now expire `ttl` from now.
    Extended {
        /// The new conservative local bound on their expiry.
        deadline: Instant,
    },
    /// They had expired; they were not brought back. Stop the work.
    Lost,
}

/// A semaphore read by [`Semaphore::peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct SemaphoreUsage {
    /// Permits in use (unexpired).
    pub in_use: u64,
    /// Holders among them (a weighted holder counts once).
    pub holders: u64,
    /// Time until the earliest permit expires; `None` when none is held.
    pub next_expiry: Option<Duration>,
}

impl SemaphoreUsage {
    /// How many permits are free in a semaphore of `permits`.
    pub fn free(&self, permits: u64) -> u64 {
        permits.saturating_sub(self.in_use)
    }
}

pub(crate) fn check_permits(permits: u64, weight: u64) -> Result<()> {
    let permits = validate::positive("permits", permits)?;
    if permits > MAX_PERMITS {
        return Err(Error::OutOfRange {
            what: "permits",
            given: permits,
            max: MAX_PERMITS,
        });
    }
    let weight = validate::positive("weight", weight)?;
    if weight > permits {
        return Err(Error::InsufficientCapacity {
            requested: weight,
            limit: permits,
        });
    }
    Ok(())
}

pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64> {
    if ttl > MAX_PERMIT_TTL {
        return Err(Error::DurationTooLong {
            what: "ttl",
            given: ttl,
            max: MAX_PERMIT_TTL,
        });
    }
    validate::millis("ttl", ttl)
}

#[cfg(test)]
mod tests {
    use super::acquire::ACQUIRE;
    use super::peek::PEEK;
    use super::release::{EXTEND, RELEASE};
    use super::*;
    use crate::script::{words, Operation};
    use redis::Value::{Array, Int};

    const S: Duration = Duration::from_secs(1);

    fn sem(permits: u64) -> Result<Semaphore> {
        Semaphore::new(permits, S)
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        let two = sem(2).unwrap();
        assert!(matches!(AcquirePermit::new(&two, ""), Err(Error::EmptyKey)));
        assert!(matches!(sem(0), Err(Error::ZeroLimit { what: "permits" })));
        assert!(matches!(
            sem(MAX_PERMITS + 1),
            Err(Error::OutOfRange {
                what: "permits",
                ..
            })
        ));
        assert!(matches!(
            AcquirePermit::weighted(&two, "k", 0),
            Err(Error::ZeroLimit { what: "weight" })
        ));
        assert!(matches!(
            AcquirePermit::weighted(&two, "k", 3),
            Err(Error::InsufficientCapacity {
                requested: 3,
                limit: 2
            })
        ));
        assert!(matches!(
            Semaphore::new(1, Duration::from_micros(999)),
            Err(Error::ZeroDuration { what: "ttl" })
        ));
        assert!(matches!(
            Semaphore::new(1, MAX_PERMIT_TTL + Duration::from_millis(1)),
            Err(Error::DurationTooLong { what: "ttl", .. })
        ));
        assert!(Semaphore::new(1, MAX_PERMIT_TTL).is_ok());
        assert!(matches!(PeekSemaphore::new(""), Err(Error::EmptyKey)));
        let two = sem(2).unwrap();
        assert!(matches!(
            two.restore("", PermitId::random().unwrap(), 1),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            two.restore("k", PermitId::random().unwrap(), 0),
            Err(Error::ZeroLimit { what: "weight" })
        ));
        assert!(matches!(
            two.restore("k", PermitId::random().unwrap(), 3),
            Err(Error::InsufficientCapacity { .. })
        ));
    }

    #[test]
    fn the_commands_carry_their_arguments() {
        let id = PermitId::parse("0123456789abcdef0123456789abcdef").unwrap();
        let five = Semaphore::new(5, Duration::from_micros(1_500_900)).unwrap();
        let op = AcquirePermit::with_id(&five, "k", &id, 2).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                ACQUIRE.sha1(),
                "1",
                "k",
                id.as_str(),
                "5",
                "2",
                "1500"
            ]
        );
        let permit = sem(5).unwrap().restore("k", id.clone(), 2).unwrap();
        let op = ReleasePermit::new(&permit);
        assert_eq!(
            words(op.invocation().command()),
            ["EVALSHA", RELEASE.sha1(), "1", "k", id.as_str(), "2"]
        );
        let op = ExtendPermit::new(&permit);
        assert_eq!(
            words(op.invocation().command()),
            ["EVALSHA", EXTEND.sha1(), "1", "k", id.as_str(), "2", "1000"]
        );
        assert_eq!(
            words(PeekSemaphore::new("k").unwrap().invocation().command()),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k"]
        );
        assert_eq!(
            words(
                PeekSemaphore::sized(&five, "k")
                    .unwrap()
                    .invocation()
                    .command()
            ),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k", "5"]
        );
    }

    #[test]
    fn an_adopting_semaphore_sends_adopt_last_on_acquire_and_peek_only() {
        let id = PermitId::parse("0123456789abcdef0123456789abcdef").unwrap();
        let five = sem(5).unwrap().adopting();
        let five = five.with_numbers(5, S).unwrap();
        let op = AcquirePermit::with_id(&five, "k", &id, 2).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                ACQUIRE.sha1(),
                "1",
                "k",
                id.as_str(),
                "5",
                "2",
                "1000",
                "adopt"
            ]
        );
        assert_eq!(
            words(
                PeekSemaphore::sized(&five, "k")
                    .unwrap()
                    .invocation()
                    .command()
            ),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k", "5", "adopt"]
        );
        // Releases and extensions carry no size, so nothing to adopt.
        let permit = five.restore("k", id.clone(), 2).unwrap();
        assert_eq!(
            words(ReleasePermit::new(&permit).invocation().command()),
            ["EVALSHA", RELEASE.sha1(), "1", "k", id.as_str(), "2"]
        );
        assert_eq!(
            words(ExtendPermit::new(&permit).invocation().command()),
            ["EVALSHA", EXTEND.sha1(), "1", "k", id.as_str(), "2", "1000"]
        );
    }

    #[test]
    fn replies_decode() {
        let op = AcquirePermit::new(&sem(2).unwrap(), "k").unwrap();
        match op.decode(Array(vec![Int(1), Int(1)])).unwrap() {
            PermitAttempt::Acquired(p) => {
                assert_eq!((p.id(), p.weight(), p.ttl(), p.key()), (op.id(), 1, S, "k"));
                assert_eq!(p.deadline(), op.built + S - Duration::from_millis(12));
            }
            full => panic!("{full:?}"),
        }
        assert_eq!(
            op.decode(Array(vec![Int(0), Int(250), Int(2)])).unwrap(),
            PermitAttempt::Full {
                retry_after: Duration::from_millis(250),
                in_use: 2
            }
        );
        assert!(op.decode(Array(vec![Int(1)])).is_err());
        let usage = PeekSemaphore::new("k")
            .unwrap()
            .decode(Array(vec![Int(3), Int(2), Int(-1)]))
            .unwrap();
        assert_eq!(
            (usage.in_use, usage.holders, usage.next_expiry),
            (3, 2, None)
        );
        assert_eq!(usage.free(10), 7);
        assert_eq!(usage.free(2), 0);
    }

    fn answer(permit: &Permit, extended: bool) -> PermitExtension {
        ExtendPermit::new(permit)
            .decode(Array(vec![Int(extended.into())]))
            .unwrap()
    }

    #[test]
    fn a_permit_takes_only_answers_about_itself() {
        let id = PermitId::random().unwrap();
        let five = sem(5).unwrap();
        let mut p = five.restore("k", id.clone(), 2).unwrap();
        let before = p.deadline();
        let others = [
            five.restore("k", PermitId::random().unwrap(), 2).unwrap(),
            five.restore("j", id.clone(), 2).unwrap(),
            five.restore("k", id.clone(), 1).unwrap(),
            Semaphore::new(5, 30 * S)
                .unwrap()
                .restore("k", id.clone(), 2)
                .unwrap(),
        ];
        for other in &others {
            let err = p.apply(&answer(other, true)).unwrap_err();
            assert!(
                matches!(err, Error::ForeignAnswer { receipt: "permit" }),
                "{err}"
            );
            assert_eq!(p.deadline(), before);
        }
        let extended = answer(&p, true);
        p.apply(&extended).unwrap();
        assert!(p.deadline() > before);
        p.apply(&answer(&p, false)).unwrap();
        assert!(p.deadline() <= Instant::now());
        p.apply(&extended).unwrap();
        assert!(p.deadline() <= Instant::now(), "older news changes nothing");
    }

    #[test]
    fn debug_shows_no_permit_id() {
        let id = PermitId::random().unwrap();
        let p = sem(5).unwrap().restore("k", id.clone(), 2).unwrap();
        for text in [
            format!("{id:?}"),
            format!("{p:?}"),
            format!("{:?}", ReleasePermit::new(&p)),
            format!("{:?}", ExtendPermit::new(&p)),
            format!("{:?}", answer(&p, true)),
            format!(
                "{:?}",
                AcquirePermit::with_id(&sem(5).unwrap(), "k", &id, 1).unwrap()
            ),
        ] {
            assert!(!text.contains(id.as_str()), "{text}");
        }
        let near_miss = id.as_str().to_uppercase();
        let err = PermitId::parse(&near_miss).unwrap_err().to_string();
        assert!(!err.to_lowercase().contains(id.as_str()), "{err}");
    }

    #[test]
    fn ids_are_random_and_validated() {
        let a = PermitId::random().unwrap();
        assert_ne!(a, PermitId::random().unwrap());
        assert_eq!(PermitId::parse(a.as_str()).unwrap(), a);
        for bad in [
            "",
            "g123456789abcdef0123456789abcdef",
            "0123456789abcdef0123456789abcde",
        ] {
            assert!(PermitId::parse(bad).is_err(), "{bad}");
        }
    }
}
