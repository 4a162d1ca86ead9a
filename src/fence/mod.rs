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
//! A [`Lock`] is the configured object (the TTL of its grants, how long an
//! acquire waits); it hands out [`Grant`]s, receipts that carry their
//! resource, owner token and [`Fence`]. Release, extension and fenced writes
//! go through the grant or its fence, never through a resource name and a
//! bare number passed again.
//!
//! | call | script | what it does |
//! |---|---|---|
//! | [`Lock::acquire`], [`Lock::acquire_as`] | `lua/fence/acquire.lua` | take the lock if free (waiting per [`Lock::with_wait`]); a [`Grant`] with the next fence, or how long it stays held |
//! | [`Grant::extend`] | `lua/fence/extend.lua` | reset the TTL, only if the grant still holds the lock; moves [`Grant::deadline`] |
//! | [`Grant::release`] | `lua/fence/release.lua` | delete the lock, only if the grant still holds it |
//! | [`Lock::lease`], [`Lock::with_lease`] | extend + release | renew every `ttl / 3` in a background task, signal loss; [`Work`] says what became of the hold |
//! | [`Fence::write`] | `lua/fence/write.lua` | fenced write of the resource's value, checked against its fence counter: `Applied`, `Stale` or `NotGranted` |
//! | [`Lock::with_fence_source`]`(`[`FenceSource::PerSlot`]`)` | `lua/fence/acquire_slot.lua`, `lua/fence/write_held.lua` | **fences in bounded memory**: one counter per cluster slot ([`slot_counter`]), none per resource; a slot fence writes while its lock holds it |
//! | [`read`] | `lua/fence/read.lua` | read the resource's value and the fence that wrote it |
//! | [`Fence::write_unbound`], [`read_unbound`] | same | the weaker form for a value at any key: checked against the stored fence only |
//! | [`advance`] | `lua/fence/advance.lua` | raise the fence counter above a floor after it went back, unless a lock is held (safe in a fleet) |
//! | [`force_advance`] | same | the same, held lock or not: the recovery step that also refuses a live holder |
//! | [`durability()`] | `CONFIG GET`, `INFO` | can this server's counters go back? (check at startup) |
//! | [`Leader::campaign`], [`Leader::run`] | acquire, extend, release | leader election: one [`Term`] at a time per role, its fence strictly increasing; transitions on a watch ([`Role`]); [`Campaign::step_down`] hands over at once |
//! | [`Waiters::acquire`] | acquire, `SUBSCRIBE` | wait for a held lock, woken when it is released |
//! | [`Lock::fair`] | `lua/fence/acquire_fair.lua`, `lua/fence/release_fair.lua` | **fair waiting**: waiting acquires served in arrival order across processes (a line in Redis); a release wakes the first in line by name |
//!
//! Every call is also an operation value ([`AcquireLock`], [`ReleaseLock`],
//! [`ExtendLock`], [`WriteFenced`], [`ReadFenced`], [`AdvanceFence`],
//! [`ForceAdvanceFence`]): put
//! them in a [`crate::Batch`], or give one an operation id
//! ([`crate::Operation::idempotent`]) so that a release resent after a lost
//! reply answers `Released` again instead of `Lost`.
//!
//! A resource name `r` uses keys in one cluster slot
//! ([`crate::keys::derive`], which also says how names with `{` or `}` are
//! laid out): `{r}:lock`, holding the grant's fence and owner token
//! (`"<fence>:<token>"`) with the TTL, `{r}:fence`, the counter, and
//! `{r}:value`, the value of [`Fence::write`], and `{r}:waiting`, a flag with
//! a short TTL that [`Waiters`] set while they wait (and, for a fair lock,
//! `{r}:queue` and `{r}:queue:alive`, its waiting line, which expire with
//! their last waiter: [`Lock::fair`]). A release is announced
//! on the pub/sub channel `{r}:released` only while that flag exists. The counter has **no TTL**: it must never
//! start again from zero, so it stays (about 60 bytes) for every resource name
//! ever locked. Derive resource names from a bounded set (one per account, per
//! job kind), not from unbounded input.
//!
//! Fences start at 1, are exact `u64` values (returned by the scripts as
//! strings, since Lua numbers are doubles and lose precision above 2^53) and
//! never exceed `i64::MAX`, Redis' integer limit, so they fit a PostgreSQL
//! `bigint` ([`Fence::as_i64`]).
//!
//! Owner tokens are 128 bits from the operating system's CSPRNG
//! ([`Token::random`]). Only the holder of a grant can extend or release its
//! lock, so a late release never deletes someone else's lock. Calling
//! [`Lock::acquire_as`] again with the same token while the lock is still
//! yours is idempotent: it answers the grant's own fence, as stored in the
//! lock, and sets the TTL again. Retry with the same token after an
//! [`Error::Indeterminate`] to find out whether the first call took the lock.
//! The token plays the part an operation id plays elsewhere
//! ([`crate::Operation::idempotent`], [`crate::retry()`]), with one
//! difference: a resend answers from the lock as it is now, not from a
//! record of the first reply (once the lock has expired, the same token
//! takes it anew, with a new fence). A re-entry after [`advance`] keeps the
//! grant's own fence, which the advance has made stale: it is never handed
//! the floor as if it were a fresh grant.
//!
//! # Fencing the resource
//!
//! **In Redis**, write the protected value with [`Fence::write`]: it lives
//! beside the lock and its counter, and one script compares the writer's
//! fence with the **counter**, so only the newest grant writes. A holder
//! paused past its lease gets [`Write::Stale`] as soon as a newer grant
//! exists, even before that grant writes anything; a fence above the counter
//! (never granted) gets [`Write::NotGranted`]. The newest grant may write
//! several times (a multi-step update, or a retry after a lost reply).
//! [`Fence::write_unbound`] keeps a value at a key of your choice but only
//! compares with the fence stored there, which is weaker (see there).
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
//! use nolock::fence::Lock;
//! use nolock::{Backoff, Work};
//!
//! let payouts = Lock::new(Duration::from_secs(10))?.with_wait(Backoff::new(Duration::from_secs(2)));
//! let payout_id: i64 = 42;
//! let done = payouts
//!     .with_lease(conn, &format!("payout:{payout_id}"), |fence| async move {
//!         // ... call the payment provider ...
//!         db.execute(
//!             "UPDATE payouts SET status = $1, fence = $2 WHERE id = $3 AND fence < $2",
//!             &[&"paid", &fence.as_i64(), &payout_id],
//!         )
//!         .await
//!     })
//!     .await?;
//! match done {
//!     Work::Done(Ok(1)) => println!("paid"),
//!     Work::Done(Ok(_)) => println!("superseded by a newer holder; nothing written"),
//!     Work::Done(Err(e)) => return Err(e.into()),
//!     Work::Busy => println!("someone else holds the lease; try later"),
//!     // The lease ended before the work did: only the fence check in the
//!     // UPDATE says whether the write landed before a newer holder's.
//!     lost => println!("lease lost: {:?}", lost.loss()),
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
//!   (Redis values written with [`Fence::write`] went back with the counter; a
//!   fence above the counter is then refused as [`Write::NotGranted`].)
//! * **Failover to a lagging replica**: the new primary has not seen the last
//!   increments, so it hands out fences that were already given, and with them
//!   the lock itself may be lost (two holders at once, with equal or even
//!   reversed fences). Redis replication is asynchronous.
//!
//! **Recovering**: before granting again after a restart or failover, raise
//! the counter past the highest fence the protected resource has seen
//! (`SELECT max(fence) ...`). The counter ends strictly above that floor, so
//! every new grant is above every fence used before, and a paused holder's
//! writes are refused again, including two holders that a failover gave the
//! same fence. Two forms: [`advance`] raises only while no lock is held, so
//! every replica of a fleet may run it at startup without turning another
//! replica's live work stale (it answers [`AdvanceAttempt::Held`] instead);
//! [`force_advance`] raises in any case, for an operator who knows the
//! counter went back (see [`advance`] for what each answer lets you assume).
//!
//! **Checking**: [`durability()`] reads the server's persistence and
//! replication settings and says whether counters can go back, so a service
//! can refuse to start (or run [`advance`] first).
//!
//! What avoids it: `appendonly yes` with `appendfsync always` on the primary
//! (every increment is on disk before the reply), so a restart keeps the
//! counter (`everysec` loses the last second only if the machine itself
//! crashes: a killed process loses nothing it answered; or build the lock
//! [`Lock::acknowledged_on_disk`], which waits for the `fsync`); and for
//! replicated setups, build the lock [`Lock::acknowledged`]`(1, timeout)`:
//! each grant is confirmed by a replica in the acquire's round trip, and
//! one that is not is released and never handed out. Add
//! `min-replicas-to-write 1` and `min-replicas-max-lag` so a primary cut off
//! from its replicas stops granting. Even then, Redis is not a consensus system; when that is not
//! acceptable, take the fence from the resource itself (a PostgreSQL sequence
//! or the row's own version column) and use the Redis lease only to avoid
//! duplicate work.
//!
//! [`Error::Indeterminate`]: crate::Error::Indeterminate

use std::fmt;
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::Work;
use crate::{keys, validate, Error, Result};

mod advance;
mod durability;
mod grant;
mod leader;
mod lease;
mod lock;
mod retry;
mod slot;
mod waiters;
mod write;

pub use advance::{
    advance, force_advance, Advance, AdvanceAttempt, AdvanceFence, ForceAdvanceFence,
};
pub use durability::{cluster_durability, durability, ConfigSource, Durability, Restart};
pub use grant::{ExtendLock, Fence, Grant, LockExtension, ReleaseLock};
pub use leader::{Campaign, Leader, Role, Term};
pub use lease::Lease;
pub use lock::{AcquireLock, Lock};
pub use slot::{slot_counter, FenceSource};
pub use waiters::Waiters;
pub(crate) use write::decode_status;
pub use write::{read, read_unbound, Fenced, ReadFenced, Write, WriteFenced};

/// A random owner token: 128 bits from the OS CSPRNG, as 32 lowercase hex
/// digits. Whoever has it can take the lock again while it is held under it
/// ([`Lock::acquire_as`]), with the grant's fence, and so extend and release
/// it: it is a secret. Its `Debug` shows `Token(<redacted>)` and it has no
/// `Display`; [`Token::as_str`] is the one way to read it.
///
/// ```
/// let token = nolock::fence::Token::random()?;
/// assert_eq!(format!("{token:?}"), "Token(<redacted>)");
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
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

    /// The token as sent to Redis: keep it out of logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Token")
            .field(&crate::observe::Redacted)
            .finish()
    }
}

/// The outcome of [`Lock::acquire`]: a grant (or a lease, for
/// [`Lock::lease`]), or the lock is held by someone else.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "the lock may be held by someone else"]
pub enum LockAttempt<G = Grant> {
    /// The lock is yours.
    Acquired(G),
    /// Another token holds the lock. Nothing was written.
    Held {
        /// Time until the lock expires unless its holder extends or releases
        /// it; `None` when it has no expiry (set by something other than nolock).
        expires_in: Option<Duration>,
    },
}

impl<G> LockAttempt<G> {
    /// True for [`LockAttempt::Acquired`].
    pub fn is_acquired(&self) -> bool {
        matches!(self, LockAttempt::Acquired(_))
    }

    /// The grant (or lease), if acquired.
    pub fn acquired(self) -> Option<G> {
        match self {
            LockAttempt::Acquired(grant) => Some(grant),
            LockAttempt::Held { .. } => None,
        }
    }
}

/// The outcome of [`Grant::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "Lost means the work may have overlapped with another holder"]
pub enum LockRelease {
    /// The lock still held the grant and is now deleted.
    Released,
    /// The lock had already expired (or was deleted) and may now belong to
    /// someone else, who was left alone. If the work under it wrote to a
    /// resource, only the fence check there tells whether those writes landed
    /// before a newer holder's. A plain release resent after a lost reply
    /// also answers this (its first send deleted the lock): send a
    /// [`ReleaseLock`] with an operation id to be told `Released` again.
    Lost,
}

/// The outcome of [`Grant::extend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "Lost means the lock is gone: stop the work"]
pub enum LockExtend {
    /// The lock still held the grant; its TTL starts again from now.
    Extended {
        /// The new conservative local bound on the lock's expiry.
        deadline: Instant,
    },
    /// The lock had expired (or was deleted); it was not brought back. Stop
    /// the work: another holder may be running.
    Lost,
}

/// The keys of a resource: the lock, its fence counter, its value, its
/// release channel and its waiting flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    pub(crate) lock: String,
    pub(crate) fence: String,
    /// The protected value of [`Fence::write`] and [`read`].
    pub(crate) value: String,
    /// The pub/sub channel on which a release is announced.
    pub(crate) released: String,
    /// The flag of [`Waiters`]: while it exists, a release is announced.
    pub(crate) waiting: String,
    /// A fair lock's waiting line and its deadlines ([`Lock::fair`]): its
    /// grants' releases wake the first in line.
    pub(crate) line: Option<Box<[String; 2]>>,
}

impl Keys {
    pub(crate) fn of(resource: &str) -> Result<Keys> {
        validate::key(resource)?;
        Ok(Keys {
            lock: keys::derive(resource, "lock"),
            fence: keys::derive(resource, "fence"),
            value: keys::derive(resource, "value"),
            released: keys::derive(resource, "released"),
            waiting: keys::derive(resource, "waiting"),
            line: None,
        })
    }

    /// [`Keys::of`] for a fair lock: with its waiting line.
    pub(crate) fn fair(resource: &str) -> Result<Keys> {
        Ok(Keys {
            line: Some(Box::new([
                keys::derive(resource, "queue"),
                keys::derive(resource, "queue:alive"),
            ])),
            ..Keys::of(resource)?
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

fn millis(ttl: Duration) -> Result<u64> {
    validate::millis("ttl", ttl)
}

/// The largest fence Redis can count to (its integer limit).
const MAX_FENCE: u64 = i64::MAX as u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_slot_and_the_resource_name() {
        let keys = Keys::of("payout:42").unwrap();
        assert_eq!(keys.lock, "{payout:42}:lock");
        assert_eq!(keys.fence, "{payout:42}:fence");
        assert_eq!(keys.value, "{payout:42}:value");
        assert_eq!(keys.waiting, "{payout:42}:waiting");
        // fence/release names the channel after the flag.
        for resource in ["payout:42", "{u1}:job", "a}b"] {
            let keys = Keys::of(resource).unwrap();
            let stem = keys.waiting.strip_suffix(":waiting").unwrap();
            assert_eq!(keys.released, format!("{stem}:released"));
        }
        assert_eq!(
            crate::keys::slot(&keys.waiting),
            crate::keys::slot(&keys.lock)
        );
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
        assert!(!format!("{a:?}").contains(a.as_str()));
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
