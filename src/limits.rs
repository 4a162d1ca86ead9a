//! Bounded counters: "at most `limit` per `window`".
//!
//! A counter is one Redis key holding an integer whose TTL is the window. Each
//! call is one Lua script, so reading the count, deciding and writing happen
//! in one atomic step on the server, in one round trip, with no lock:
//!
//! | call | script | what it does |
//! |---|---|---|
//! | [`try_increment`] | `lua/limits/try_increment.lua` | add 1 if the count stays `<= limit` |
//! | [`try_increment_by`] | same | add `n`, all or nothing |
//! | [`peek`] | `lua/limits/peek.lua` | read the count and time left; writes nothing |
//! | [`release`] (deprecated) | `lua/limits/release.lua` | take `n` back, never below zero |
//!
//! **As a fixed-window limit** ("100 requests per minute per user"): call
//! [`try_increment`] per request. The first admitted increment starts the
//! window (sets the key's expiry); when it expires the count starts again
//! from zero. Like every fixed window it allows up to `2 × limit` across a
//! window boundary; [`crate::rate`] offers smoother algorithms.
//!
//! **Not for "at most `limit` at once"** ("at most 10 exports running"): use
//! [`crate::semaphore`]. Counting running work with [`try_increment`] when it
//! starts and [`release`] when it ends over-admits: the counter expires one
//! window after its *first* holder while later holders still run, and their
//! releases then decrement the fresh counter. With a limit of 2, a 1 s window
//! and 600 ms jobs, 12 workers reached 8 running at once within 5 s
//! (`tests/semaphore.rs` runs both). The semaphore tracks each holder's own
//! expiry instead.
//!
//! A denied call changes nothing, so a client that keeps retrying while denied
//! does not push its own reset further away.
//!
//! **Many counters at once**: each call also exists as a value
//! ([`TryIncrement`], [`Release`], [`Peek`]) that checks its input when built;
//! put many in a [`crate::Batch`] to send them in one round trip per server.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn handler(conn: &mut redis::aio::MultiplexedConnection, user: &str)
//! #     -> Result<(), nolock::Error> {
//! let key = format!("limit:{user}");
//! let admission = nolock::limits::try_increment(conn, &key, 100, Duration::from_secs(60)).await?;
//! if !admission.admitted {
//!     let wait = admission.reset_after.unwrap_or_default();
//!     println!("429 Too Many Requests, retry in {} ms", wait.as_millis());
//!     return Ok(());
//! }
//! println!("200 OK; {} left in this window", admission.remaining);
//! # Ok(()) }
//! ```

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

static TRY_INCREMENT: Script = embedded!("limits/try_increment");
static RELEASE: Script = embedded!("limits/release");
static PEEK: Script = embedded!("limits/peek");

/// The outcome of [`try_increment`]: admitted or not, with the counter's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a denied request must be turned away"]
pub struct Admission {
    /// True when the increment was applied.
    pub admitted: bool,
    /// The counter after the call (unchanged when denied).
    pub count: u64,
    /// The limit the call was checked against.
    pub limit: u64,
    /// How much more fits before the limit: `limit - count` (0 when the
    /// counter is at or above the limit, e.g. after the limit was lowered).
    pub remaining: u64,
    /// Time until the window resets: the key's PTTL + 1 ms, the first moment
    /// the counter is gone (at most `window + 1 ms`). `None` only if the
    /// counter has no expiry, which nolock never leaves behind.
    pub reset_after: Option<Duration>,
}

/// A counter read by [`peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Usage {
    /// The current count (0 when the key does not exist).
    pub count: u64,
    /// Time until the window resets; `None` when there is no counter.
    pub reset_after: Option<Duration>,
}

impl Usage {
    /// How much more fits under `limit`.
    pub fn remaining(&self, limit: u64) -> u64 {
        limit.saturating_sub(self.count)
    }
}

/// The outcome of [`release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The counter after the call.
    pub count: u64,
    /// How much was taken off: `n`, or less when the counter held less.
    pub released: u64,
}

/// Add 1 to the counter at `key` if that keeps it at most `limit`.
///
/// The first admitted increment sets the key to expire after `window`
/// (millisecond precision). A denied call consumes nothing (the one write it
/// can make: giving `window` to a counter found without any expiry, which
/// would otherwise deny forever). One round trip.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`],
/// [`Error::OutOfRange`] (limit above 2^53 - 1), [`Error::ZeroDuration`],
/// [`Error::DurationTooLong`]. From Redis: [`Error::Redis`] (for example
/// `WRONGTYPE` when the key holds something else; nothing was written) and
/// [`Error::Indeterminate`] (the increment may have been applied; it is not
/// retried).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// let a = nolock::limits::try_increment(conn, "api:user:42", 100, Duration::from_secs(60)).await?;
/// assert!(a.count <= 100);
/// # Ok(()) }
/// ```
pub async fn try_increment<C>(
    conn: &mut C,
    key: &str,
    limit: u64,
    window: Duration,
) -> Result<Admission>
where
    C: ConnectionLike + Send,
{
    try_increment_by(conn, key, 1, limit, window).await
}

/// Add `n` to the counter at `key` if that keeps it at most `limit`; all or
/// nothing.
///
/// Use it for weighted requests (a batch of 20 items costs 20).
///
/// # Errors
///
/// As [`try_increment`], plus [`Error::ZeroLimit`] for `n == 0` and
/// [`Error::InsufficientCapacity`] when `n > limit` (it could never be
/// admitted, which is different from "not now").
pub async fn try_increment_by<C>(
    conn: &mut C,
    key: &str,
    n: u64,
    limit: u64,
    window: Duration,
) -> Result<Admission>
where
    C: ConnectionLike + Send,
{
    run_one(&TryIncrement::by(key, n, limit, window)?, conn).await
}

/// [`try_increment`] and [`try_increment_by`] as a value, for a
/// [`crate::Batch`]. The input is checked when it is built.
///
/// ```
/// use std::time::Duration;
/// use nolock::limits::TryIncrement;
///
/// let op = TryIncrement::new("api:user:42", 100, Duration::from_secs(60))?;
/// assert!(TryIncrement::new("api:user:42", 0, Duration::from_secs(60)).is_err());
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TryIncrement {
    call: Invocation,
    limit: u64,
}

impl TryIncrement {
    /// Add 1 to the counter at `key` if that keeps it at most `limit`.
    ///
    /// # Errors
    ///
    /// As [`try_increment`] before any I/O.
    pub fn new(key: &str, limit: u64, window: Duration) -> Result<Self> {
        Self::by(key, 1, limit, window)
    }

    /// Add `n` to the counter at `key` if that keeps it at most `limit`; all
    /// or nothing.
    ///
    /// # Errors
    ///
    /// As [`try_increment_by`] before any I/O.
    pub fn by(key: &str, n: u64, limit: u64, window: Duration) -> Result<Self> {
        validate::key(key)?;
        let limit = validate::positive("limit", limit)?;
        let n = validate::positive("n", n)?;
        if n > limit {
            return Err(Error::InsufficientCapacity {
                requested: n,
                limit,
            });
        }
        let window = validate::millis("window", window)?;
        let call = Invocation::new(&TRY_INCREMENT, &[key])
            .arg(limit)
            .arg(window)
            .arg(n);
        Ok(TryIncrement { call, limit })
    }
}

impl Operation for TryIncrement {
    type Output = Admission;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Admission> {
        let mut reply = Reply::new(TRY_INCREMENT.name(), reply)?;
        let admitted = reply.flag()?;
        let count = reply.uint()?;
        let reset_after = pttl(reply.int()?);
        reply.finish()?;
        Ok(Admission {
            admitted,
            count,
            limit: self.limit,
            remaining: self.limit.saturating_sub(count),
            reset_after,
        })
    }
}

/// Take up to `n` back from the counter at `key`, never going below zero.
///
/// The window (TTL) is kept; a missing key stays missing. Retrying a release
/// after [`Error::Indeterminate`] may release twice, but never below zero.
///
/// **Deprecated** as the end of a concurrency limit: a counter shared by
/// holders that started at different times cannot tell whose slot it gives
/// back, and over-admits once the window rolls over (see the module docs).
/// Use [`crate::semaphore`]: [`crate::semaphore::Semaphore::acquire`] when work starts,
/// [`crate::semaphore::Permit::release`] when it ends.
///
/// # Errors
///
/// [`Error::EmptyKey`], [`Error::ZeroLimit`] (`n == 0`), [`Error::OutOfRange`]
/// before any I/O; [`Error::Redis`] / [`Error::Indeterminate`] from Redis.
///
/// # Example
///
/// ```no_run
/// # #![allow(deprecated)]
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use nolock::limits;
/// // Give back 5 units of a quota charged in advance for a request that failed.
/// let r = limits::release(conn, "quota:user:42", 5).await?;
/// println!("{} taken back, {} left counted", r.released, r.count);
/// # Ok(()) }
/// ```
#[deprecated(
    since = "0.1.0",
    note = "counting running work with a window over-admits; use nolock::semaphore (acquire/release) for \"at most N at once\""
)]
pub async fn release<C>(conn: &mut C, key: &str, n: u64) -> Result<Released>
where
    C: ConnectionLike + Send,
{
    run_one(&Release::new(key, n)?, conn).await
}

/// [`release`] as a value, for a [`crate::Batch`].
#[derive(Debug, Clone)]
pub struct Release {
    call: Invocation,
}

impl Release {
    /// Take up to `n` back from the counter at `key`, never below zero.
    ///
    /// # Errors
    ///
    /// As [`release`] before any I/O.
    pub fn new(key: &str, n: u64) -> Result<Self> {
        validate::key(key)?;
        let n = validate::positive("n", n)?;
        Ok(Release {
            call: Invocation::new(&RELEASE, &[key]).arg(n),
        })
    }
}

impl Operation for Release {
    type Output = Released;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Released> {
        let mut reply = Reply::new(RELEASE.name(), reply)?;
        let released = Released {
            count: reply.uint()?,
            released: reply.uint()?,
        };
        reply.finish()?;
        Ok(released)
    }
}

/// Read the counter at `key` without changing it.
///
/// Runs with `EVALSHA_RO`, so it can be served by a replica: on a cluster
/// connection built with a replica read strategy (redis-rs
/// `ClusterClientBuilder::read_routing_strategy`), it is. A replica may lag
/// its primary by a few writes.
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] (e.g. `WRONGTYPE`) and
/// [`Error::Indeterminate`] from Redis. A read is safe to retry.
pub async fn peek<C>(conn: &mut C, key: &str) -> Result<Usage>
where
    C: ConnectionLike + Send,
{
    run_one(&Peek::new(key)?, conn).await
}

/// [`peek`] as a value, for a [`crate::Batch`]. In a batch on a cluster it is
/// sent to the key's primary, with the batch's other operations.
#[derive(Debug, Clone)]
pub struct Peek {
    call: Invocation,
}

impl Peek {
    /// Read the counter at `key` without changing it.
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
            count: reply.uint()?,
            reset_after: pttl(reply.int()?),
        };
        reply.finish()?;
        Ok(usage)
    }
}

/// The time until a key with this PTTL is gone; `None` for "no key" (-2) or
/// "no expiry" (-1).
///
/// Redis keeps a key through the very millisecond its expiry names (it expires
/// once the clock is *past* it), so the key is gone PTTL + 1 ms from now: a
/// caller that waits exactly `reset_after` finds a fresh window.
fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .map(|ms| Duration::from_millis(ms.saturating_add(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        let w = Duration::from_secs(1);
        assert!(matches!(
            TryIncrement::by("", 1, 1, w),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            TryIncrement::by("k", 1, 0, w),
            Err(Error::ZeroLimit { what: "limit" })
        ));
        assert!(matches!(
            TryIncrement::by("k", 0, 1, w),
            Err(Error::ZeroLimit { what: "n" })
        ));
        assert!(matches!(
            TryIncrement::by("k", 3, 2, w),
            Err(Error::InsufficientCapacity {
                requested: 3,
                limit: 2
            })
        ));
        assert!(matches!(
            TryIncrement::by("k", 1, 1, Duration::ZERO),
            Err(Error::ZeroDuration { what: "window" })
        ));
        assert!(matches!(
            TryIncrement::by("k", 1, 1, Duration::MAX),
            Err(Error::DurationTooLong { what: "window", .. })
        ));
        assert!(matches!(
            Release::new("k", 0),
            Err(Error::ZeroLimit { what: "n" })
        ));
        assert!(matches!(Release::new("", 1), Err(Error::EmptyKey)));
        assert!(matches!(Peek::new(""), Err(Error::EmptyKey)));
    }

    #[test]
    fn the_commands_carry_their_arguments() {
        let op = TryIncrement::by("k", 2, 5, Duration::from_millis(1500)).unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            ["EVALSHA", TRY_INCREMENT.sha1(), "1", "k", "5", "1500", "2"]
        );
        let op = TryIncrement::new("k", 5, Duration::from_millis(1500)).unwrap();
        assert_eq!(crate::script::words(op.invocation().command())[6], "1");
        let op = Release::new("k", 3).unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            ["EVALSHA", RELEASE.sha1(), "1", "k", "3"]
        );
        let op = Peek::new("k").unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k"]
        );
    }

    #[test]
    fn admissions_decode_with_saturating_remaining() {
        use redis::Value::Int;
        let op = TryIncrement::new("k", 3, Duration::from_secs(1)).unwrap();
        let a = op
            .decode(redis::Value::Array(vec![Int(0), Int(5), Int(10)]))
            .unwrap();
        assert_eq!(
            a,
            Admission {
                admitted: false,
                count: 5,
                limit: 3,
                remaining: 0,
                reset_after: Some(Duration::from_millis(11))
            }
        );
    }
}
