//! Leases with fencing tokens, for the few cases that really need mutual
//! exclusion.
//!
//! Most "we need a lock" problems are one atomic read-decide-write, and the
//! rest of nolock does those without any lock. When work really must run in
//! one place at a time (call a payment provider, rebuild a report, run a
//! migration), this module hands out a **lease**: a lock key with a TTL and a
//! random owner token, plus a **fence**, a number that only goes up, handed
//! out with each grant.
//!
//! # A lease, or a lease and a fence?
//!
//! A lease can end while its holder still works: a GC pause, a slow query, a
//! stalled VM or a network partition longer than the TTL. The holder cannot
//! notice (it was not running), the lock expires, a second holder starts, and
//! for a while two run at once. Ask what that costs:
//!
//! * **"Some work is done twice"** (a cache warmed twice, a report built twice,
//!   an idempotent sync): a plain lease is enough. [`Lease`] keeps it alive
//!   while the work runs and tells the work when it is lost.
//! * **"Someone is paid twice"** (money moves, stock is decremented, an email
//!   that must go out once, state that a stale writer would overwrite): the
//!   lease alone is not safe, whatever its TTL. Only the *resource* can stop a
//!   holder that was paused past its lease, by refusing writes that carry an
//!   older fence than one it has already seen:
//!
//! ```text
//!  A: acquire (fence 33) ... GC pause ..................... write(33) -> Stale
//!  B:                      lease expires, acquire (fence 34) write(34) -> Applied
//! ```
//!
//! Often the cleanest answer is to let the database enforce the invariant by
//! itself (a conditional `UPDATE`, `INSERT ... ON CONFLICT`, a unique index,
//! `SELECT ... FOR UPDATE SKIP LOCKED`). Fencing is the tool for when the work
//! must happen outside the database but its result lands in it.
//!
//! # The calls
//!
//! | call | script | what it does |
//! |---|---|---|
//! | [`acquire`], [`acquire_as`] | `lua/fence/acquire.lua` | take the lock if free; return the next fence, or how long it stays held |
//! | [`acquire_with_retry`] | same | the same with jittered exponential [`Backoff`](crate::Backoff), never past the lock's expiry, up to a deadline |
//! | [`extend`] | `lua/fence/extend.lua` | reset the TTL, only if the token still holds the lock |
//! | [`release`] | `lua/fence/release.lua` | delete the lock, only if the token still holds it |
//! | [`Lease`], [`with_lease`] | extend + release | renew every `ttl / 3` in a background task, signal loss |
//! | [`write()`] | `lua/fence/write.lua` | fenced write of the resource's value, checked against its fence counter: `Applied`, `Stale` or `NotGranted` |
//! | [`read`] | `lua/fence/read.lua` | read the resource's value and the fence that wrote it |
//! | [`write_unbound`], [`read_unbound`] | same | the weaker form for a value at any key: checked against the stored fence only |
//! | [`advance`] | `lua/fence/advance.lua` | raise the fence counter to a floor, after it went back |
//! | [`durability()`] | `CONFIG GET`, `INFO` | can this server's counters go back? (check at startup) |
//! | [`Waiters::acquire`] | acquire, `SUBSCRIBE` | wait for a held lock, woken when it is released |
//!
//! A resource name `r` uses keys in one cluster slot
//! ([`crate::keys::derive`], which also says how names with `{` or `}` are
//! laid out): `{r}:lock`, holding the owner token with the TTL, `{r}:fence`,
//! the counter, and `{r}:value`, the value of [`write()`]. Releases are
//! announced on the pub/sub channel `{r}:released`. The counter has **no TTL**: it must never
//! start again from zero, so it stays (about 60 bytes) for every resource name
//! ever locked. Derive resource names from a bounded set (one per account, per
//! job kind), not from unbounded input.
//!
//! Fences start at 1, are exact `u64` values (returned by the scripts as
//! strings, since Lua numbers are doubles and lose precision above 2^53) and
//! never exceed `i64::MAX`, Redis' integer limit, so they fit a PostgreSQL
//! `bigint` with `i64::try_from(fence)`.
//!
//! Owner tokens are 128 bits from the operating system's CSPRNG
//! ([`Token::random`]). Only the holder of a token can extend or release its
//! lock, so a late release never deletes someone else's lock. Calling
//! [`acquire_as`] again with the same token while the lock is still yours is
//! idempotent (same fence, TTL set again): retry with the same token after an
//! [`Error::Indeterminate`] to find out whether the first call took the lock.
//! The token plays the part an operation id plays elsewhere
//! ([`crate::Operation::idempotent`], [`crate::retry()`]), with one
//! difference: a resend answers from the lock as it is now, not from a
//! record of the first reply (once the lock has expired, the same token
//! takes it anew, with a new fence).
//!
//! # Fencing the resource
//!
//! **In Redis**, write the protected value with [`write()`]: it lives beside
//! the lock and its counter, and one script compares the writer's fence with
//! the **counter**, so only the newest grant writes. A holder paused past its
//! lease gets [`Write::Stale`] as soon as a newer grant exists, even before
//! that grant writes anything; a fence above the counter (never granted) gets
//! [`Write::NotGranted`]. The newest grant may write several times (a
//! multi-step update, or a retry after a lost reply). [`write_unbound`] keeps
//! a value at a key of your choice but only compares with the fence stored
//! there, which is weaker (see there).
//!
//! **In SQL**, store the fence next to the data and make every write
//! conditional on it, in the same statement:
//!
//! ```sql
//! UPDATE payouts SET status = $1, fence = $2 WHERE id = $3 AND fence < $2
//! ```
//!
//! One row updated: the write is in, and every older holder is now shut out.
//! Zero rows: a holder with a newer fence (or this grant itself, since `<` is
//! strict) has already written; stop, do not retry. Use `fence <= $2` instead
//! if one grant must update the same row more than once. The fence column
//! starts at 0 for new rows. The database only knows the fences that reached
//! it: a paused older holder can still write until the newer holder's first
//! write lands. When that matters, have each holder claim the row first
//! (`UPDATE ... SET fence = $2 WHERE id = $3 AND fence < $2` before the work,
//! then `fence = $2` on its writes). `examples/fenced_postgres.rs` runs this pattern
//! end to end, and `tests/fence_postgres.rs` shows a paused holder updating
//! zero rows.
//!
//! ```no_run
//! # async fn pay(conn: redis::aio::MultiplexedConnection, db: &tokio_postgres::Client)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use nolock::fence;
//! use nolock::Backoff;
//!
//! let payout_id: i64 = 42;
//! let done = fence::with_lease(
//!     conn,
//!     &format!("payout:{payout_id}"),
//!     Duration::from_secs(10),
//!     &Backoff::new(Duration::from_secs(2)),
//!     |grant| async move {
//!         // ... call the payment provider ...
//!         let fence = i64::try_from(grant.fence)?;
//!         let rows = db
//!             .execute(
//!                 "UPDATE payouts SET status = $1, fence = $2 WHERE id = $3 AND fence < $2",
//!                 &[&"paid", &fence, &payout_id],
//!             )
//!             .await?;
//!         Ok::<bool, Box<dyn std::error::Error>>(rows == 1) // false: a newer holder won
//!     },
//! )
//! .await?;
//! match done {
//!     Some(Ok(true)) => println!("paid"),
//!     Some(Ok(false)) => println!("superseded by a newer holder; nothing written"),
//!     Some(Err(e)) => return Err(e),
//!     None => println!("someone else holds the lease; try later"),
//! }
//! # Ok(()) }
//! ```
//!
//! # Time
//!
//! A grant's [`Grant::deadline`] is measured on the local monotonic clock from
//! *before* the request was sent, less a drift allowance of 1% of the TTL plus
//! 2 ms, so it is never later than the server's expiry (clocks that drift
//! apart by more than 1% are out of scope). A [`Lease`] renews every
//! `ttl / 3`, so a renewal delayed by up to two periods (a slow reply, a busy
//! runtime) still lands in time; size the TTL well above the p99 of a round
//! trip and of your runtime's scheduling delays. A renewal that fails for a
//! passing reason (`BUSY`, `LOADING`, a lost reply) is tried again until the
//! deadline; the lease is lost only when the deadline passes unconfirmed or
//! the lock is found gone (see [`Lease`]).
//!
//! # Limits of a Redis fence
//!
//! A fence is only as good as the counter's promise never to go back. Redis
//! can break that promise in two ways:
//!
//! * **Restart without (or with lagging) persistence**: the counter starts
//!   again from zero, or from where the disk last had it. Fences already
//!   handed out are handed out again. For a database that stores fences, the
//!   new holders' fences are lower than the stored one, so their writes are
//!   refused; a holder paused across the restart, whose fence is still the
//!   highest, can write over them, and once the counter catches up, two
//!   holders carry equal fences. It is not safe, and not only stuck.
//!   (Redis values written with [`write()`] went back with the counter; a
//!   fence above the counter is then refused as [`Write::NotGranted`].)
//! * **Failover to a lagging replica**: the new primary has not seen the last
//!   increments, so it hands out fences that were already given, and with them
//!   the lock itself may be lost (two holders at once, with equal or even
//!   reversed fences). Redis replication is asynchronous.
//!
//! **Recovering**: before granting again after a restart or failover, raise
//! the counter with [`advance`] to the highest fence the protected resource
//! has seen (`SELECT max(fence) ...`). Every new grant is then above every
//! fence used before, and a paused holder's writes are refused again.
//!
//! **Checking**: [`durability()`] reads the server's persistence and
//! replication settings and says whether counters can go back, so a service
//! can refuse to start (or run [`advance`] first).
//!
//! What avoids it: `appendonly yes` with `appendfsync always` on the primary
//! (every increment is on disk before the reply), so a restart keeps the
//! counter (`everysec` can lose the last second of increments); and for
//! replicated setups, confirm each grant on the replicas
//! before using its fence (`WAIT 1 <timeout>` after [`acquire`] and check that
//! at least one replica acknowledged), with `min-replicas-to-write 1` and
//! `min-replicas-max-lag` so a primary cut off from its replicas stops
//! granting. Even then, Redis is not a consensus system; when that is not
//! acceptable, take the fence from the resource itself (a PostgreSQL sequence
//! or the row's own version column) and use the Redis lease only to avoid
//! duplicate work.
//!
//! [`Error::Indeterminate`]: crate::Error::Indeterminate

use std::fmt;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use crate::script::{embedded, Invocation, Reply, Script};
use crate::{keys, validate, Error, Result};

mod durability;
mod lease;
mod retry;
mod waiters;
mod write;

pub use durability::{durability, Durability, Restart, Source};
pub use lease::{with_lease, Lease};
pub use retry::acquire_with_retry;
pub use waiters::Waiters;
pub use write::{read, read_unbound, write, write_unbound, Fenced, Write};

static ACQUIRE: Script = embedded!("fence/acquire");
static RELEASE: Script = embedded!("fence/release");
static EXTEND: Script = embedded!("fence/extend");
static ADVANCE: Script = embedded!("fence/advance");

/// A random owner token: 128 bits from the OS CSPRNG, as 32 lowercase hex
/// digits. Whoever has it can extend and release the lock it was granted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Token(String);

impl Token {
    /// A fresh token from the operating system's random number generator.
    ///
    /// # Errors
    ///
    /// [`Error::Entropy`] when the OS generator fails (practically never on
    /// a running system).
    ///
    /// # Example
    ///
    /// ```
    /// let token = nolock::fence::Token::random()?;
    /// assert_eq!(token.as_str().len(), 32);
    /// assert_ne!(token, nolock::fence::Token::random()?);
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn random() -> Result<Token> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| Error::Entropy(e.to_string()))?;
        Ok(Token(format!("{:032x}", u128::from_be_bytes(bytes))))
    }

    /// The token as sent to Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One acquisition of a lock: its owner token, its fence and how long it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a grant holds the lock until it is released or expires"]
pub struct Grant {
    /// The owner token: pass it to [`extend`] and [`release`].
    pub token: Token,
    /// The fencing token of this grant: greater than every earlier grant's
    /// fence for the same resource (see the module docs for when that can
    /// fail). Pass it to every write the lock protects.
    pub fence: u64,
    /// The TTL the lock was set with, in whole milliseconds.
    pub ttl: Duration,
    /// A conservative local bound on the lock's expiry as granted (before any
    /// extension): `ttl` after the request was sent, less the drift allowance.
    pub deadline: Instant,
    /// When the acquire request was sent.
    sent: Instant,
}

impl Grant {
    /// The time left until [`Grant::deadline`] (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// The outcome of [`acquire`]: a grant (or a lease, for [`Lease::acquire`]),
/// or the lock is held by someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "the lock may be held by someone else"]
pub enum Acquire<G = Grant> {
    /// The lock is yours.
    Acquired(G),
    /// Another token holds the lock. Nothing was written.
    Held {
        /// Time until the lock expires unless its holder extends or releases
        /// it; `None` when it has no expiry (set by something other than nolock).
        expires_in: Option<Duration>,
    },
}

impl<G> Acquire<G> {
    /// True for [`Acquire::Acquired`].
    pub fn is_acquired(&self) -> bool {
        matches!(self, Acquire::Acquired(_))
    }

    /// The grant (or lease), if acquired.
    pub fn acquired(self) -> Option<G> {
        match self {
            Acquire::Acquired(grant) => Some(grant),
            Acquire::Held { .. } => None,
        }
    }
}

/// The outcome of [`release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "Lost means the work may have overlapped with another holder"]
pub enum Release {
    /// The lock still held the token and is now deleted.
    Released,
    /// The lock had already expired (or was deleted) and may now belong to
    /// someone else, who was left alone. If the work under it wrote to a
    /// resource, only the fence check there tells whether those writes landed
    /// before a newer holder's.
    Lost,
}

/// The outcome of [`extend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "Lost means the lock is gone: stop the work"]
pub enum Extend {
    /// The lock still held the token; its TTL starts again from now.
    Extended {
        /// The new conservative local bound on the lock's expiry.
        deadline: Instant,
    },
    /// The lock had expired (or was deleted); it was not brought back. Stop
    /// the work: another holder may be running.
    Lost,
}

/// The two keys of a resource: the lock and its fence counter.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) lock: String,
    pub(crate) fence: String,
    /// The protected value of [`write()`] and [`read`].
    pub(crate) value: String,
    /// The pub/sub channel on which [`release`] announces a release.
    pub(crate) released: String,
}

impl Keys {
    pub(crate) fn of(resource: &str) -> Result<Keys> {
        validate::key(resource)?;
        Ok(Keys {
            lock: keys::derive(resource, "lock"),
            fence: keys::derive(resource, "fence"),
            value: keys::derive(resource, "value"),
            released: keys::derive(resource, "released"),
        })
    }
}

/// Drift allowance between the local clock and the server's: 1% of the TTL
/// plus 2 ms, the margin the Redis documentation suggests for lock validity.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The conservative local expiry of a lock set with `ttl` by a request sent at `sent`.
pub(crate) fn deadline(sent: Instant, ttl: Duration) -> Instant {
    // A TTL too long for this platform's Instant falls back to "already
    // expired": conservative, and unreachable on Linux (2^53 ms fits).
    sent.checked_add(ttl.saturating_sub(drift(ttl)))
        .unwrap_or(sent)
}

/// Take the lock on `resource` for `ttl` if it is free, with a fresh random
/// owner token, and get the next fence.
///
/// One round trip. When the lock is held by someone else this is not an
/// error: it returns [`Acquire::Held`] with the time until it expires, and
/// writes nothing. Use [`acquire_with_retry`] to wait for it, or [`Lease`] to
/// keep it renewed while you work.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroDuration`] and
/// [`Error::DurationTooLong`] (`ttl`), [`Error::Entropy`]. From Redis:
/// [`Error::Redis`] (e.g. `OOM` on a full server, `WRONGTYPE`, or a fence
/// counter that is not an integer; nothing was written) and
/// [`Error::Indeterminate`] (the lock may have been taken with a token you
/// never saw; it expires after `ttl`. Use [`acquire_as`] to be able to retry).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::fence::{self, Acquire, Release};
///
/// match fence::acquire(conn, "report:daily", Duration::from_secs(30)).await? {
///     Acquire::Acquired(grant) => {
///         // ... build the report, writing with grant.fence ...
///         if fence::release(conn, "report:daily", &grant.token).await? == Release::Lost {
///             eprintln!("the lease expired before the work finished");
///         }
///     }
///     Acquire::Held { expires_in } => println!("busy, free in at most {expires_in:?}"),
/// }
/// # Ok(()) }
/// ```
pub async fn acquire<C>(conn: &mut C, resource: &str, ttl: Duration) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    // Check the input before drawing a token; acquire_as checks it again (cheap).
    Keys::of(resource)?;
    millis(ttl)?;
    let token = Token::random()?;
    acquire_as(conn, resource, &token, ttl).await
}

/// [`acquire`] with a token you chose (from [`Token::random`]).
///
/// While the lock still holds `token`, calling this again returns the same
/// fence and sets the TTL again, without a new increment: after an
/// [`Error::Indeterminate`] you can retry with the same token and learn
/// whether the first call took the lock, instead of waiting out its TTL.
///
/// # Errors
///
/// As [`acquire`] (without [`Error::Entropy`]).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::fence::{self, Token};
///
/// let token = Token::random()?;
/// let ttl = Duration::from_secs(30);
/// let outcome = match fence::acquire_as(conn, "job:42", &token, ttl).await {
///     Err(e) if !e.is_definite() => fence::acquire_as(conn, "job:42", &token, ttl).await?,
///     other => other?,
/// };
/// println!("{outcome:?}");
/// # Ok(()) }
/// ```
pub async fn acquire_as<C>(
    conn: &mut C,
    resource: &str,
    token: &Token,
    ttl: Duration,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    let call = acquire_call(resource, token, ttl)?;
    let ttl = Duration::from_millis(millis(ttl)?);
    let sent = Instant::now();
    let value = call.run(conn).await?;
    decode_acquire(value, token.clone(), ttl, sent)
}

fn acquire_call(resource: &str, token: &Token, ttl: Duration) -> Result<Invocation> {
    let keys = Keys::of(resource)?;
    let ttl_ms = millis(ttl)?;
    Ok(Invocation::new(&ACQUIRE, &[&keys.lock, &keys.fence])
        .arg(token.as_str())
        .arg(ttl_ms))
}

fn millis(ttl: Duration) -> Result<u64> {
    validate::millis("ttl", ttl)
}

fn decode_acquire(
    value: redis::Value,
    token: Token,
    ttl: Duration,
    sent: Instant,
) -> Result<Acquire> {
    let mut reply = Reply::new(ACQUIRE.name(), value)?;
    let outcome = if reply.flag()? {
        Acquire::Acquired(Grant {
            token,
            fence: reply.uint()?,
            ttl,
            deadline: deadline(sent, ttl),
            sent,
        })
    } else {
        Acquire::Held {
            expires_in: u64::try_from(reply.int()?).ok().map(Duration::from_millis),
        }
    };
    reply.finish()?;
    Ok(outcome)
}

/// Delete the lock on `resource`, only if it still holds `token`.
///
/// Never deletes a lock that expired and was taken by someone else. Declared
/// `allow-oom`, so it works on a full server. A release is announced with
/// `PUBLISH` on the channel `keys::derive(resource, "released")`, which
/// wakes the [`Waiters`] of every process waiting for the lock. Safe to retry after
/// [`Error::Indeterminate`]: a repeat finds the lock gone and returns
/// [`Release::Lost`].
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] and
/// [`Error::Indeterminate`] from Redis.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant)
/// #     -> nolock::Result<()> {
/// use nolock::fence::{self, Release};
/// match fence::release(conn, "report:daily", &grant.token).await? {
///     Release::Released => {}
///     Release::Lost => eprintln!("lease expired while working; check the fenced writes"),
/// }
/// # Ok(()) }
/// ```
pub async fn release<C>(conn: &mut C, resource: &str, token: &Token) -> Result<Release>
where
    C: ConnectionLike + Send,
{
    let keys = Keys::of(resource)?;
    let value = Invocation::new(&RELEASE, &[&keys.lock])
        .arg(token.as_str())
        .arg(&keys.released)
        .run(conn)
        .await?;
    let mut reply = Reply::new(RELEASE.name(), value)?;
    let released = reply.flag()?;
    reply.finish()?;
    Ok(if released {
        Release::Released
    } else {
        Release::Lost
    })
}

/// Set the lock on `resource` to expire `ttl` from now, only if it still
/// holds `token`.
///
/// An expired lock is not brought back (that would need a new fence). Declared
/// `allow-oom`, so a holder keeps its lock on a full server. [`Lease`] calls
/// this every `ttl / 3` for you.
///
/// # Errors
///
/// [`Error::EmptyKey`], [`Error::ZeroDuration`], [`Error::DurationTooLong`]
/// before any I/O; [`Error::Redis`] and [`Error::Indeterminate`] from Redis
/// (an extension is idempotent: retrying is safe).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant)
/// #     -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::fence::{self, Extend};
/// if let Extend::Lost = fence::extend(conn, "report:daily", &grant.token, grant.ttl).await? {
///     return Ok(()); // stop: someone else may hold it now
/// }
/// # Ok(()) }
/// ```
pub async fn extend<C>(conn: &mut C, resource: &str, token: &Token, ttl: Duration) -> Result<Extend>
where
    C: ConnectionLike + Send,
{
    let keys = Keys::of(resource)?;
    let ttl_ms = millis(ttl)?;
    let ttl = Duration::from_millis(ttl_ms);
    let sent = Instant::now();
    let value = Invocation::new(&EXTEND, &[&keys.lock])
        .arg(token.as_str())
        .arg(ttl_ms)
        .run(conn)
        .await?;
    let mut reply = Reply::new(EXTEND.name(), value)?;
    let extended = reply.flag()?;
    reply.finish()?;
    Ok(if extended {
        Extend::Extended {
            deadline: deadline(sent, ttl),
        }
    } else {
        Extend::Lost
    })
}

/// The outcome of [`advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "check that the counter is where the resource needs it"]
pub struct Advance {
    /// True when the counter was below the floor (or missing) and was raised.
    pub raised: bool,
    /// The counter afterwards: the floor, or the greater value it held. The
    /// next grant's fence is `counter + 1`.
    pub counter: u64,
}

/// Raise the fence counter of `resource` to at least `at_least`; never
/// lower it.
///
/// The recovery step after the counter went back (a restart without
/// persistence, a failover to a replica that had not seen the last grants;
/// [`durability`] tells whether your server can do that): pass the highest
/// fence the protected resource has seen (`SELECT max(fence) FROM ...`, or
/// the fence of [`read`]), and every later grant is above it, so the
/// resource accepts the new holder's writes and still refuses the old ones.
/// Run it before taking new grants. A holder whose fence is now below the
/// counter sees its [`write()`]s refused as [`Write::Stale`].
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`at_least` 0),
/// [`Error::OutOfRange`] (above `i64::MAX`, Redis' integer limit). From
/// Redis: [`Error::Redis`] (the counter holds something nolock did not
/// write; nothing was written) and [`Error::Indeterminate`] (safe to retry:
/// raising to the same floor twice is the same as once).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, db: &tokio_postgres::Client)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// // At startup: the database has seen fences up to max(fence).
/// let row = db.query_one("SELECT coalesce(max(fence), 0) FROM payouts", &[]).await?;
/// let highest = u64::try_from(row.get::<_, i64>(0))?;
/// if highest > 0 {
///     let advanced = nolock::fence::advance(conn, "payouts", highest).await?;
///     assert!(advanced.counter >= highest);
/// }
/// # Ok(()) }
/// ```
pub async fn advance<C>(conn: &mut C, resource: &str, at_least: u64) -> Result<Advance>
where
    C: ConnectionLike + Send,
{
    let call = advance_call(resource, at_least)?;
    let value = call.run(conn).await?;
    let mut reply = Reply::new(ADVANCE.name(), value)?;
    let raised = reply.flag()?;
    let counter = reply.uint()?;
    reply.finish()?;
    Ok(Advance { raised, counter })
}

fn advance_call(resource: &str, at_least: u64) -> Result<Invocation> {
    let keys = Keys::of(resource)?;
    if at_least == 0 {
        return Err(Error::ZeroLimit { what: "at_least" });
    }
    const MAX: u64 = i64::MAX as u64;
    if at_least > MAX {
        return Err(Error::OutOfRange {
            what: "at_least",
            given: at_least,
            max: MAX,
        });
    }
    Ok(Invocation::new(&ADVANCE, &[&keys.fence]).arg(at_least.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn keys_share_a_slot_and_the_resource_name() {
        let keys = Keys::of("payout:42").unwrap();
        assert_eq!(keys.lock, "{payout:42}:lock");
        assert_eq!(keys.fence, "{payout:42}:fence");
        assert_eq!(keys.value, "{payout:42}:value");
        assert_eq!(
            crate::keys::slot(&keys.value),
            crate::keys::slot("payout:42")
        );
        assert_eq!(
            crate::keys::slot(&keys.lock),
            crate::keys::slot(&keys.fence)
        );
        assert!(matches!(Keys::of(""), Err(Error::EmptyKey)));
    }

    #[test]
    fn tokens_are_128_random_bits_in_hex() {
        let a = Token::random().unwrap();
        let b = Token::random().unwrap();
        assert_ne!(a, b);
        for t in [&a, &b] {
            assert_eq!(t.as_str().len(), 32);
            assert!(t
                .as_str()
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        }
        assert_eq!(a.to_string(), a.as_str());
    }

    #[test]
    fn the_acquire_command_carries_both_keys_the_token_and_the_ttl() {
        let token = Token("t0k".into());
        let call = acquire_call("r", &token, Duration::from_micros(1_500_900)).unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                ACQUIRE.sha1(),
                "2",
                "{r}:lock",
                "{r}:fence",
                "t0k",
                "1500"
            ]
        );
    }

    #[test]
    fn bad_ttls_are_rejected_before_a_command_is_built() {
        let t = Token("t".into());
        assert!(matches!(
            acquire_call("r", &t, Duration::ZERO),
            Err(Error::ZeroDuration { what: "ttl" })
        ));
        assert!(matches!(
            acquire_call("r", &t, crate::MAX_TTL + Duration::from_millis(1)),
            Err(Error::DurationTooLong { what: "ttl", .. })
        ));
        assert!(matches!(
            acquire_call("", &t, Duration::from_secs(1)),
            Err(Error::EmptyKey)
        ));
    }

    #[test]
    fn fences_decode_exactly_above_2_pow_53() {
        let sent = Instant::now();
        let value = Array(vec![Int(1), BulkString(b"9007199254740993".to_vec())]);
        let token = Token("t".into());
        let ttl = Duration::from_secs(1);
        match decode_acquire(value, token, ttl, sent).unwrap() {
            Acquire::Acquired(grant) => {
                assert_eq!(grant.fence, (1 << 53) + 1);
                assert_eq!(grant.deadline, sent + ttl - Duration::from_millis(12));
            }
            held => panic!("{held:?}"),
        }
        let held = decode_acquire(Array(vec![Int(0), Int(250)]), Token("t".into()), ttl, sent);
        assert_eq!(
            held.unwrap(),
            Acquire::Held {
                expires_in: Some(Duration::from_millis(250))
            }
        );
        let forever = decode_acquire(Array(vec![Int(0), Int(-1)]), Token("t".into()), ttl, sent);
        assert_eq!(forever.unwrap(), Acquire::Held { expires_in: None });
    }

    #[test]
    fn advance_takes_a_floor_redis_can_store() {
        let call = advance_call("r", 9).unwrap();
        assert_eq!(
            words(call.command()),
            ["EVALSHA", ADVANCE.sha1(), "1", "{r}:fence", "9"]
        );
        assert!(advance_call("r", i64::MAX as u64).is_ok());
        assert!(matches!(
            advance_call("r", i64::MAX as u64 + 1),
            Err(Error::OutOfRange {
                what: "at_least",
                ..
            })
        ));
        assert!(matches!(
            advance_call("r", 0),
            Err(Error::ZeroLimit { what: "at_least" })
        ));
        assert!(matches!(advance_call("", 1), Err(Error::EmptyKey)));
    }

    #[test]
    fn deadlines_are_conservative_and_never_overflow() {
        let now = Instant::now();
        assert_eq!(deadline(now, Duration::from_millis(1)), now);
        assert_eq!(
            deadline(now, Duration::from_secs(10)),
            now + Duration::from_millis(9_898)
        );
        assert!(deadline(now, crate::MAX_TTL) >= now);
    }
}
