//! A semaphore with expiring permits: "at most `permits` at once", safe when
//! holders crash or stall.
//!
//! "At most 10 exports running", "at most 3 calls to the payment provider per
//! tenant": each holder takes a **permit** that expires `ttl` after it was
//! granted or last extended, on the **server clock**. A holder that crashes
//! frees its own permit at its expiry and nobody else's; a holder paused past
//! its expiry finds its [`release`] or [`extend`] answered [`Release::Lost`],
//! because its place may already be someone else's.
//!
//! | call | script | what it does |
//! |---|---|---|
//! | [`acquire`], [`acquire_weighted`] | `lua/semaphore/acquire.lua` | take 1 (or `weight`) permits if they fit, all or nothing; else when they will |
//! | [`acquire_with_retry`] | same | the same, waiting with jittered backoff, never longer than `retry_after` |
//! | [`extend`] | `lua/semaphore/extend.lua` | reset this permit's expiry, only if it has not expired |
//! | [`release`] | `lua/semaphore/release.lua` | give back this permit, and only this one |
//! | [`PermitLease`], [`with_permit`] | extend + release | renew every `ttl / 3` in a background task, signal loss |
//! | [`peek`] | `lua/semaphore/peek.lua` | permits in use, holders, next expiry; writes nothing |
//!
//! # State
//!
//! One key per semaphore, a sorted set, so it works unchanged on Redis
//! Cluster. Each permit held is one member, `"<id>:<i>"`: the holder's
//! [`PermitId`] (32 lowercase hex digits, 128 random bits) and `i` from 1 to
//! the holder's weight, scored with its **expiry in server milliseconds**
//! since the Unix epoch. A weighted holder of 3 permits is 3 members with
//! one expiry, so "permits in use" is the set's size (`ZCARD`, O(1)) and a
//! weight is capped at [`MAX_PERMITS`].
//!
//! Every acquire first removes the members whose expiry has passed (each
//! one by its own score: a crashed holder's permits come back at their own
//! expiry, not all at once), then admits if `in use + weight <= permits`.
//! The key itself expires (`PEXPIREAT`) with its latest member, so an idle
//! semaphore leaves nothing behind. The size `permits` is passed on every
//! call, like `limit` in [`crate::limits::try_increment`]: lowering it
//! admits nobody until enough holders are gone.
//!
//! **No queue.** Waiters are not served in order: whoever asks when a permit
//! is free gets it. [`acquire_with_retry`] spreads the retries with jitter
//! and never sleeps past `retry_after`, but a holder that asks again at once
//! after releasing can win repeatedly; give work a moment between permits
//! (as `examples/worker_pool.rs` does) if fairness matters.
//!
//! Stored state is checked before anything is written: a key that is not a
//! sorted set, or whose lowest or highest member (which bound every score)
//! is not in the form above, is a definite [`Error::Redis`] naming the key,
//! with nothing written. Each script also checks every member it reads
//! (the expired ones it removes, the holder's own); [`peek`] checks all.
//!
//! # Time
//!
//! Expiries are decided by the server's clock. A [`Permit::deadline`] is a
//! conservative local bound, as for a fence grant: `ttl` after the request
//! was sent, less 1% of the TTL and 2 ms. Stop the work (or [`extend`])
//! before it; [`PermitLease`] does that for you.
//!
//! # Example: a bounded worker pool
//!
//! ```no_run
//! use std::time::Duration;
//! use nolock::fence::Backoff;
//! use nolock::semaphore;
//!
//! # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
//! // At most 10 exports at once across every replica of the service; each
//! // waits up to a minute for a permit, renewed every 10 s while it runs.
//! let done = semaphore::with_permit(
//!     conn,
//!     "exports:running",
//!     10,
//!     Duration::from_secs(30),
//!     &Backoff::new(Duration::from_secs(60)),
//!     |permit| async move {
//!         println!("exporting under permit {}", permit.id);
//!         // ... the export ...
//!     },
//! )
//! .await?;
//! if done.is_none() {
//!     println!("still 10 exports running after a minute; try later");
//! }
//! # Ok(()) }
//! ```
//!
//! `examples/worker_pool.rs` runs twelve workers on two permits and prints
//! the peak concurrency it measured.

use std::fmt;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

mod lease;
mod retry;

pub use crate::renew::Loss;
pub use lease::{with_permit, PermitLease};
pub use retry::{acquire_weighted_with_retry, acquire_with_retry};

static ACQUIRE: Script = embedded!("semaphore/acquire");
static RELEASE: Script = embedded!("semaphore/release");
static EXTEND: Script = embedded!("semaphore/extend");
static PEEK: Script = embedded!("semaphore/peek");

/// The largest semaphore (and so the largest weight): each permit held is
/// one sorted-set member, and a weighted acquire writes `weight` of them.
pub const MAX_PERMITS: u64 = 10_000;

/// The longest permit TTL: 2^52 ms (about 142,000 years), so that the
/// server's clock plus the TTL stays an exact integer in a Lua double.
pub const MAX_PERMIT_TTL: Duration = Duration::from_millis(1 << 52);

/// A permit holder's id: 128 bits from the OS CSPRNG, as 32 lowercase hex
/// digits. Whoever has it can extend and release that holder's permits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// [`Error::InvalidArgument`] for anything else.
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
                reason: format!("{id:?} is not 32 lowercase hex digits"),
            })
        }
    }

    /// The id as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One holder's permits: its id, how many, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// The holder's id: pass the permit to [`extend`] and [`release`].
    pub id: PermitId,
    /// How many permits this holder took at once (1 unless weighted).
    pub weight: u64,
    /// The TTL the permits were set with, in whole milliseconds.
    pub ttl: Duration,
    /// A conservative local bound on the permits' expiry as granted (before
    /// any extension).
    pub deadline: Instant,
    /// When the acquire was built (single calls: sent).
    sent: Instant,
}

impl Permit {
    /// The time left until [`Permit::deadline`] (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// The outcome of [`acquire`]: permits, or the semaphore is full.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a full semaphore must be waited for or turned away"]
pub enum Acquire<P = Permit> {
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

impl<P> Acquire<P> {
    /// True for [`Acquire::Acquired`].
    pub fn is_acquired(&self) -> bool {
        matches!(self, Acquire::Acquired(_))
    }

    /// The permit (or lease), if acquired.
    pub fn acquired(self) -> Option<P> {
        match self {
            Acquire::Acquired(permit) => Some(permit),
            Acquire::Full { .. } => None,
        }
    }
}

/// The outcome of [`release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a lost permit means another holder may have run alongside"]
pub enum Release {
    /// The permits were still held (unexpired) and are given back.
    Released,
    /// Some had expired (and may have been reclaimed and granted to someone
    /// else): the work under them may have run beside one more holder than
    /// the semaphore allows. What was left of them is removed.
    Lost,
}

/// The outcome of [`extend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a lost permit means the work must stop"]
pub enum Extend {
    /// The permits were still held; they now expire `ttl` from now.
    Extended {
        /// The new conservative local bound on their expiry.
        deadline: Instant,
    },
    /// They had expired; they were not brought back. Stop the work.
    Lost,
}

/// A semaphore read by [`peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Permits in use (unexpired).
    pub in_use: u64,
    /// Holders among them (a weighted holder counts once).
    pub holders: u64,
    /// Time until the earliest permit expires; `None` when none is held.
    pub next_expiry: Option<Duration>,
}

impl Usage {
    /// How many permits are free in a semaphore of `permits`.
    pub fn free(&self, permits: u64) -> u64 {
        permits.saturating_sub(self.in_use)
    }
}

fn check_permits(permits: u64, weight: u64) -> Result<()> {
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

fn ttl_millis(ttl: Duration) -> Result<u64> {
    if ttl > MAX_PERMIT_TTL {
        return Err(Error::DurationTooLong {
            what: "ttl",
            given: ttl,
            max: MAX_PERMIT_TTL,
        });
    }
    validate::millis("ttl", ttl)
}

/// Take one permit of the semaphore at `key` (of size `permits`) for `ttl`,
/// if one is free.
///
/// One round trip. A full semaphore is not an error: it returns
/// [`Acquire::Full`] with when a permit will surely come back. Expired
/// permits are reclaimed first.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] and
/// [`Error::OutOfRange`] (`permits` 0 or above [`MAX_PERMITS`]),
/// [`Error::ZeroDuration`], [`Error::DurationTooLong`] (`ttl` above
/// [`MAX_PERMIT_TTL`]), [`Error::Entropy`]. From Redis: [`Error::Redis`]
/// (`OOM`, or the key holds something that is not a semaphore; nothing was
/// written) and [`Error::Indeterminate`] (the permit may have been taken
/// under an id you never saw; it expires after `ttl`. [`acquire_with_retry`]
/// retries with the same id).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::semaphore::{self, Acquire, Release};
///
/// match semaphore::acquire(conn, "payments:tenant:7", 3, Duration::from_secs(10)).await? {
///     Acquire::Acquired(permit) => {
///         // ... call the payment provider ...
///         if semaphore::release(conn, "payments:tenant:7", &permit).await? == Release::Lost {
///             eprintln!("the permit expired while working");
///         }
///     }
///     Acquire::Full { retry_after, .. } => println!("3 calls running; retry in {retry_after:?}"),
/// }
/// # Ok(()) }
/// ```
pub async fn acquire<C>(conn: &mut C, key: &str, permits: u64, ttl: Duration) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    run_one(&TryAcquire::new(key, permits, ttl)?, conn).await
}

/// Take `weight` permits at once, all or nothing (a big job that counts as
/// three small ones).
///
/// # Errors
///
/// As [`acquire`], plus [`Error::ZeroLimit`] for `weight == 0` and
/// [`Error::InsufficientCapacity`] when `weight > permits` (never possible,
/// unlike "not now").
pub async fn acquire_weighted<C>(
    conn: &mut C,
    key: &str,
    permits: u64,
    weight: u64,
    ttl: Duration,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    run_one(&TryAcquire::weighted(key, permits, weight, ttl)?, conn).await
}

/// [`acquire`] and [`acquire_weighted`] as a value, for a [`crate::Batch`],
/// or with an id of your own ([`TryAcquire::with_id`]). The input is checked
/// when it is built.
///
/// The permit's deadline counts from when the value was **built**, so build
/// it just before running it (an earlier build only makes the deadline more
/// conservative).
///
/// ```
/// use std::time::Duration;
/// use nolock::semaphore::TryAcquire;
///
/// let op = TryAcquire::new("exports", 10, Duration::from_secs(30))?;
/// assert!(TryAcquire::weighted("exports", 10, 11, Duration::from_secs(30)).is_err());
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TryAcquire {
    call: Invocation,
    id: PermitId,
    weight: u64,
    ttl: Duration,
    built: Instant,
}

impl TryAcquire {
    /// One permit of `permits`, for `ttl`, under a fresh random id.
    ///
    /// # Errors
    ///
    /// As [`acquire`] before any I/O.
    pub fn new(key: &str, permits: u64, ttl: Duration) -> Result<Self> {
        Self::weighted(key, permits, 1, ttl)
    }

    /// `weight` permits of `permits` at once, for `ttl`, under a fresh id.
    ///
    /// # Errors
    ///
    /// As [`acquire_weighted`] before any I/O.
    pub fn weighted(key: &str, permits: u64, weight: u64, ttl: Duration) -> Result<Self> {
        Self::check(key, permits, weight, ttl)?;
        Self::with_id(key, &PermitId::random()?, permits, weight, ttl)
    }

    /// As [`TryAcquire::weighted`], under `id`. While `id` still holds its
    /// permits unexpired, running this again grants them again with a fresh
    /// expiry (no second set): after an [`Error::Indeterminate`], retry with
    /// the same id to learn whether the first call took them.
    ///
    /// # Errors
    ///
    /// As [`acquire_weighted`] before any I/O (without [`Error::Entropy`]).
    pub fn with_id(
        key: &str,
        id: &PermitId,
        permits: u64,
        weight: u64,
        ttl: Duration,
    ) -> Result<Self> {
        let ttl_ms = Self::check(key, permits, weight, ttl)?;
        let call = Invocation::new(&ACQUIRE, &[key])
            .arg(id.as_str())
            .arg(permits)
            .arg(weight)
            .arg(ttl_ms);
        Ok(TryAcquire {
            call,
            id: id.clone(),
            weight,
            ttl: Duration::from_millis(ttl_ms),
            built: Instant::now(),
        })
    }

    fn check(key: &str, permits: u64, weight: u64, ttl: Duration) -> Result<u64> {
        validate::key(key)?;
        check_permits(permits, weight)?;
        ttl_millis(ttl)
    }

    /// The id the permit is (or would be) held under.
    pub fn id(&self) -> &PermitId {
        &self.id
    }
}

impl Operation for TryAcquire {
    type Output = Acquire;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Acquire> {
        let mut reply = Reply::new(ACQUIRE.name(), reply)?;
        let outcome = if reply.flag()? {
            let _in_use = reply.uint()?;
            Acquire::Acquired(Permit {
                id: self.id.clone(),
                weight: self.weight,
                ttl: self.ttl,
                deadline: crate::fence::deadline(self.built, self.ttl),
                sent: self.built,
            })
        } else {
            Acquire::Full {
                retry_after: Duration::from_millis(reply.uint()?),
                in_use: reply.uint()?,
            }
        };
        reply.finish()?;
        Ok(outcome)
    }
}

/// Give back `permit`'s permits of the semaphore at `key`, and only those.
///
/// Never removes another holder's permit, however late it arrives. Declared
/// `allow-oom`, so it works on a full server. Safe to retry after
/// [`Error::Indeterminate`] (a repeat answers [`Release::Lost`]).
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] (the key holds
/// something that is not a semaphore) and [`Error::Indeterminate`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit)
/// #     -> nolock::Result<()> {
/// use nolock::semaphore::{self, Release};
/// if semaphore::release(conn, "exports", &permit).await? == Release::Lost {
///     eprintln!("ran past the permit's ttl: another export may have run alongside");
/// }
/// # Ok(()) }
/// ```
pub async fn release<C>(conn: &mut C, key: &str, permit: &Permit) -> Result<Release>
where
    C: ConnectionLike + Send,
{
    run_one(&ReleasePermit::new(key, permit)?, conn).await
}

/// [`release`] as a value, for a [`crate::Batch`].
#[derive(Debug, Clone)]
pub struct ReleasePermit {
    call: Invocation,
}

impl ReleasePermit {
    /// Give back `permit`'s permits of the semaphore at `key`.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`].
    pub fn new(key: &str, permit: &Permit) -> Result<Self> {
        validate::key(key)?;
        Ok(ReleasePermit {
            call: Invocation::new(&RELEASE, &[key])
                .arg(permit.id.as_str())
                .arg(permit.weight),
        })
    }
}

impl Operation for ReleasePermit {
    type Output = Release;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Release> {
        let mut reply = Reply::new(RELEASE.name(), reply)?;
        let released = reply.flag()?;
        reply.finish()?;
        Ok(if released {
            Release::Released
        } else {
            Release::Lost
        })
    }
}

/// Set `permit`'s permits to expire `ttl` from now, only if none has expired.
///
/// An expired permit is not brought back (its place may be someone else's).
/// Declared `allow-oom`. [`PermitLease`] calls this every `ttl / 3`.
///
/// # Errors
///
/// [`Error::EmptyKey`], [`Error::ZeroDuration`], [`Error::DurationTooLong`]
/// before any I/O; [`Error::Redis`] and [`Error::Indeterminate`] (an
/// extension is idempotent: retrying is safe).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit)
/// #     -> nolock::Result<()> {
/// use nolock::semaphore::{self, Extend};
/// if let Extend::Lost = semaphore::extend(conn, "exports", &permit, permit.ttl).await? {
///     return Ok(()); // stop: the permit expired
/// }
/// # Ok(()) }
/// ```
pub async fn extend<C>(conn: &mut C, key: &str, permit: &Permit, ttl: Duration) -> Result<Extend>
where
    C: ConnectionLike + Send,
{
    validate::key(key)?;
    let ttl_ms = ttl_millis(ttl)?;
    let sent = Instant::now();
    let value = Invocation::new(&EXTEND, &[key])
        .arg(permit.id.as_str())
        .arg(permit.weight)
        .arg(ttl_ms)
        .run(conn)
        .await?;
    let mut reply = Reply::new(EXTEND.name(), value)?;
    let extended = reply.flag()?;
    reply.finish()?;
    Ok(if extended {
        Extend::Extended {
            deadline: crate::fence::deadline(sent, Duration::from_millis(ttl_ms)),
        }
    } else {
        Extend::Lost
    })
}

/// Read the semaphore at `key` without changing it (expired permits are
/// counted out, not removed).
///
/// Runs with `EVALSHA_RO` (replicas may serve it, and may lag). It reads
/// every permit held: O(permits in use).
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] (not a semaphore)
/// and [`Error::Indeterminate`]. A read is safe to retry.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let usage = nolock::semaphore::peek(conn, "exports").await?;
/// println!("{} running, {} free", usage.holders, usage.free(10));
/// # Ok(()) }
/// ```
pub async fn peek<C>(conn: &mut C, key: &str) -> Result<Usage>
where
    C: ConnectionLike + Send,
{
    run_one(&Peek::new(key)?, conn).await
}

/// [`peek`] as a value, for a [`crate::Batch`].
#[derive(Debug, Clone)]
pub struct Peek {
    call: Invocation,
}

impl Peek {
    /// Read the semaphore at `key`.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`].
    pub fn new(key: &str) -> Result<Self> {
        validate::key(key)?;
        Ok(Peek {
            call: Invocation::new(&PEEK, &[key]),
        })
    }
}

impl Operation for Peek {
    type Output = Usage;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Usage> {
        let mut reply = Reply::new(PEEK.name(), reply)?;
        let usage = Usage {
            in_use: reply.uint()?,
            holders: reply.uint()?,
            next_expiry: u64::try_from(reply.int()?).ok().map(Duration::from_millis),
        };
        reply.finish()?;
        Ok(usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, Int};

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        assert!(matches!(TryAcquire::new("", 1, S), Err(Error::EmptyKey)));
        assert!(matches!(
            TryAcquire::new("k", 0, S),
            Err(Error::ZeroLimit { what: "permits" })
        ));
        assert!(matches!(
            TryAcquire::new("k", MAX_PERMITS + 1, S),
            Err(Error::OutOfRange {
                what: "permits",
                ..
            })
        ));
        assert!(matches!(
            TryAcquire::weighted("k", 2, 0, S),
            Err(Error::ZeroLimit { what: "weight" })
        ));
        assert!(matches!(
            TryAcquire::weighted("k", 2, 3, S),
            Err(Error::InsufficientCapacity {
                requested: 3,
                limit: 2
            })
        ));
        assert!(matches!(
            TryAcquire::new("k", 1, Duration::from_micros(999)),
            Err(Error::ZeroDuration { what: "ttl" })
        ));
        assert!(matches!(
            TryAcquire::new("k", 1, MAX_PERMIT_TTL + Duration::from_millis(1)),
            Err(Error::DurationTooLong { what: "ttl", .. })
        ));
        assert!(TryAcquire::new("k", 1, MAX_PERMIT_TTL).is_ok());
        assert!(matches!(Peek::new(""), Err(Error::EmptyKey)));
    }

    #[test]
    fn the_commands_carry_their_arguments() {
        let id = PermitId::parse("0123456789abcdef0123456789abcdef").unwrap();
        let op = TryAcquire::with_id("k", &id, 5, 2, Duration::from_micros(1_500_900)).unwrap();
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
        let permit = Permit {
            id: id.clone(),
            weight: 2,
            ttl: S,
            deadline: Instant::now(),
            sent: Instant::now(),
        };
        let op = ReleasePermit::new("k", &permit).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            ["EVALSHA", RELEASE.sha1(), "1", "k", id.as_str(), "2"]
        );
        assert_eq!(
            words(Peek::new("k").unwrap().invocation().command()),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k"]
        );
    }

    #[test]
    fn replies_decode() {
        let op = TryAcquire::new("k", 2, S).unwrap();
        match op.decode(Array(vec![Int(1), Int(1)])).unwrap() {
            Acquire::Acquired(p) => {
                assert_eq!((&p.id, p.weight, p.ttl), (op.id(), 1, S));
                assert_eq!(p.deadline, op.built + S - Duration::from_millis(12));
            }
            full => panic!("{full:?}"),
        }
        assert_eq!(
            op.decode(Array(vec![Int(0), Int(250), Int(2)])).unwrap(),
            Acquire::Full {
                retry_after: Duration::from_millis(250),
                in_use: 2
            }
        );
        assert!(op.decode(Array(vec![Int(1)])).is_err());
        let usage = Peek::new("k")
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
