//! The receipts of a lock: [`Grant`] (the power to extend and release) and
//! [`Fence`] (the number that goes with every protected write), and the
//! calls on a grant as values: [`ReleaseLock`], [`ExtendLock`].

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{deadline, Keys, LockExtend, LockRelease, Token, MAX_FENCE};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

static RELEASE: Script = embedded!("fence/release");
static EXTEND: Script = embedded!("fence/extend");

/// One acquisition of a lock ([`super::Lock::acquire`]): its resource,
/// owner token, fence and deadline. Release and extend it through itself.
///
/// A grant is a receipt: only an acquire makes one, it is not `Clone`, and
/// [`Grant::release`] consumes it. It cannot be pointed at another resource:
/// the calls on it carry the resource it was taken on. Its [`Fence`] may be
/// cloned and handed to the code that writes.
///
/// ```compile_fail
/// # fn f(grant: nolock::fence::Grant) {
/// let copy = grant.clone(); // a grant is not Clone
/// # }
/// ```
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant) {
/// let _ = grant.release(conn).await;
/// let _ = grant.release(conn).await; // release consumed it
/// # }
/// ```
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant) {
/// let _ = grant.release(conn, "another:resource").await; // no resource: it releases its own
/// # }
/// ```
///
/// ```compile_fail
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant) {
/// // No resource: a fence writes only where it was granted.
/// let _ = grant.fence().write(conn, "another:resource", "v").await;
/// # }
/// ```
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a grant holds the lock until it is released or expires"]
pub struct Grant {
    keys: Keys,
    token: Token,
    ttl: Duration,
    fence: Fence,
    deadline: Instant,
    sent: Instant,
}

/// The number that orders a lock's grants, with the resource it was granted
/// on: pass it to every write the lock protects ([`Fence::write`], or
/// [`Fence::as_i64`] in a conditional SQL write).
///
/// Fences are greater for every later grant of the same resource (see the
/// module docs for when Redis can break that). A fence writes only to its
/// own resource's value; it may be cloned freely, since the server checks
/// it on every write: a fence older than the newest grant is refused as
/// [`super::Write::Stale`], one above every grant as
/// [`super::Write::NotGranted`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    resource: String,
    number: u64,
}

impl Fence {
    /// The fence of a grant, as the server answered it.
    pub(super) fn granted(resource: &str, number: u64) -> Fence {
        Fence {
            resource: resource.to_owned(),
            number,
        }
    }

    /// **The escape hatch** for a fence that crossed a process boundary:
    /// the holder sent `resource` and `number` in a message (a job queue, an
    /// RPC), and the process that writes builds the fence from them.
    ///
    /// Nothing here proves that a grant carried this number: the server's
    /// checks still hold (a number older than the newest grant is refused as
    /// stale, one above every grant as not granted), but a made-up number
    /// equal to the newest grant's writes as that grant would. Carry fences
    /// in messages only between parts of one system.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`]; [`Error::ZeroLimit`] (`number`
    /// 0: no grant has it); [`Error::OutOfRange`] (above `i64::MAX`, which
    /// no counter reaches).
    ///
    /// ```
    /// use nolock::fence::Fence;
    ///
    /// let fence = Fence::from_message("payout:42", 17)?;
    /// assert_eq!((fence.resource(), fence.number(), fence.as_i64()), ("payout:42", 17, 17));
    /// assert!(Fence::from_message("payout:42", 0).is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn from_message(resource: &str, number: u64) -> Result<Fence> {
        validate::key(resource)?;
        if number == 0 {
            return Err(Error::ZeroLimit { what: "fence" });
        }
        if number > MAX_FENCE {
            return Err(Error::OutOfRange {
                what: "fence",
                given: number,
                max: MAX_FENCE,
            });
        }
        Ok(Fence::granted(resource, number))
    }

    /// The resource the fence was granted on.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The fence itself: at least 1, at most `i64::MAX`.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The fence as an `i64`, exact (fences never pass `i64::MAX`, Redis'
    /// integer limit): for a PostgreSQL `bigint` column.
    pub fn as_i64(&self) -> i64 {
        i64::try_from(self.number).unwrap_or(i64::MAX)
    }
}

impl Grant {
    pub(super) fn granted(
        keys: Keys,
        token: Token,
        ttl: Duration,
        fence: Fence,
        sent: Instant,
    ) -> Grant {
        Grant {
            keys,
            token,
            ttl,
            fence,
            deadline: deadline(sent, ttl),
            sent,
        }
    }

    /// The resource the lock was taken on.
    pub fn resource(&self) -> &str {
        self.fence.resource()
    }

    /// The owner token (to take the lock again with
    /// [`super::Lock::acquire_as`] while it is held).
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The grant's fence: pass it to every write the lock protects.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The TTL the lock was set with, in whole milliseconds.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A conservative local bound on the lock's expiry: the TTL after the
    /// acquire (or the last confirmed [`Grant::extend`]) was sent, less the
    /// drift allowance.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The time left until [`Grant::deadline`] (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// When the acquire request was sent.
    pub(super) fn sent(&self) -> Instant {
        self.sent
    }

    /// What the renewal task needs to extend and release this grant.
    pub(super) fn holder(&self) -> Holder {
        Holder {
            keys: self.keys.clone(),
            value: format!("{}:{}", self.fence.number, self.token),
            ttl: self.ttl,
        }
    }

    /// Delete the lock, only if it still holds this grant: one round trip.
    /// Consumes the grant.
    ///
    /// Never deletes a lock that expired and was taken by someone else.
    /// Declared `allow-oom`, so it works on a full server. A release is
    /// announced with `PUBLISH` on the channel
    /// `keys::derive(resource, "released")`, which wakes the
    /// [`super::Waiters`] of every process waiting for the lock.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] and [`Error::Indeterminate`] from Redis. This call
    /// consumes the grant, so after a lost reply there is nothing to resend
    /// and the lock expires at its TTL (a later holder waits at most that).
    /// To be able to resend, release with
    /// `ReleaseLock::new(&grant).idempotent(id)` through [`crate::retry()`]
    /// instead: its resend answers with the first reply, where a plain
    /// resend would answer [`LockRelease::Lost`] for its own success.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant)
    /// #     -> nolock::Result<()> {
    /// use nolock::fence::LockRelease;
    /// if grant.release(conn).await? == LockRelease::Lost {
    ///     eprintln!("lease expired while working; check the fenced writes");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release<C>(self, conn: &mut C) -> Result<LockRelease>
    where
        C: ConnectionLike + Send,
    {
        run_one(&ReleaseLock::new(&self), conn).await
    }

    /// Set the lock to expire its TTL from now, only if it still holds this
    /// grant: one round trip. Moves [`Grant::deadline`].
    ///
    /// An expired lock is not brought back (that would need a new fence).
    /// Declared `allow-oom`, so a holder keeps its lock on a full server.
    /// [`super::Lease`] calls this every `ttl / 3` for you.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] and [`Error::Indeterminate`] from Redis (an
    /// extension is idempotent: retrying is safe).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, mut grant: nolock::fence::Grant)
    /// #     -> nolock::Result<()> {
    /// use nolock::fence::LockExtend;
    /// if let LockExtend::Lost = grant.extend(conn).await? {
    ///     return Ok(()); // stop: someone else may hold it now
    /// }
    /// assert!(grant.remaining() > grant.ttl() / 2);
    /// # Ok(()) }
    /// ```
    pub async fn extend<C>(&mut self, conn: &mut C) -> Result<LockExtend>
    where
        C: ConnectionLike + Send,
    {
        let outcome = run_one(&ExtendLock::new(self), conn).await?;
        self.apply(&outcome);
        Ok(outcome)
    }

    /// Take in an extension's answer ([`ExtendLock`] run yourself):
    /// [`Grant::extend`] does it. A lost grant's deadline is now.
    pub fn apply(&mut self, extend: &LockExtend) {
        self.deadline = match extend {
            LockExtend::Extended { deadline } => *deadline,
            LockExtend::Lost => Instant::now(),
        };
    }
}

/// The lock value of a grant, and what extending and releasing it send.
#[derive(Debug, Clone)]
pub(super) struct Holder {
    keys: Keys,
    /// `"<fence>:<token>"`, as the acquire script stored it.
    value: String,
    ttl: Duration,
}

impl Holder {
    fn release_call(&self) -> Invocation {
        Invocation::new(&RELEASE, &[self.keys.lock.as_str()])
            .arg(self.value.as_str())
            .arg(self.keys.released.as_str())
    }

    fn extend_call(&self) -> Invocation {
        Invocation::new(&EXTEND, &[self.keys.lock.as_str()])
            .arg(self.value.as_str())
            .arg(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX))
    }

    /// The renewal task's extension (no [`Grant`] there: the lease keeps it).
    pub(super) async fn extend<C>(&self, conn: &mut C) -> Result<LockExtend>
    where
        C: ConnectionLike + Send,
    {
        run_one(&ExtendLock::of(self), conn).await
    }

    /// The renewal task's release.
    pub(super) async fn release<C>(&self, conn: &mut C) -> Result<LockRelease>
    where
        C: ConnectionLike + Send,
    {
        run_one(
            &ReleaseLock {
                call: self.release_call(),
            },
            conn,
        )
        .await
    }
}

/// [`Grant::release`] as a value: for a [`crate::Batch`], or with an
/// operation id so that a release resent after a lost reply answers with
/// the first reply ([`LockRelease::Released`]) instead of `Lost`.
#[derive(Debug, Clone)]
pub struct ReleaseLock {
    call: Invocation,
}

impl ReleaseLock {
    /// Release `grant`'s lock.
    pub fn new(grant: &Grant) -> Self {
        ReleaseLock {
            call: grant.holder().release_call(),
        }
    }
}

impl Operation for ReleaseLock {
    type Output = LockRelease;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<LockRelease> {
        let mut reply = Reply::new(RELEASE.name(), reply)?;
        let released = reply.flag()?;
        reply.finish()?;
        Ok(if released {
            LockRelease::Released
        } else {
            LockRelease::Lost
        })
    }
}

/// [`Grant::extend`] as a value; apply its answer with [`Grant::apply`].
/// The local deadline it answers counts from when the value was built.
#[derive(Debug, Clone)]
pub struct ExtendLock {
    call: Invocation,
    ttl: Duration,
    built: Instant,
}

impl ExtendLock {
    /// Extend `grant`'s lock by its TTL.
    pub fn new(grant: &Grant) -> Self {
        ExtendLock::of(&grant.holder())
    }

    fn of(holder: &Holder) -> Self {
        ExtendLock {
            call: holder.extend_call(),
            ttl: holder.ttl,
            built: Instant::now(),
        }
    }
}

impl Operation for ExtendLock {
    type Output = LockExtend;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<LockExtend> {
        let mut reply = Reply::new(EXTEND.name(), reply)?;
        let extended = reply.flag()?;
        reply.finish()?;
        Ok(if extended {
            LockExtend::Extended {
                deadline: deadline(self.built, self.ttl),
            }
        } else {
            LockExtend::Lost
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;

    fn grant(resource: &str, fence: u64) -> Grant {
        Grant::granted(
            Keys::of(resource).unwrap(),
            Token("t0k".into()),
            Duration::from_secs(2),
            Fence::granted(resource, fence),
            Instant::now(),
        )
    }

    #[test]
    fn release_and_extend_name_the_grants_own_lock_and_value() {
        let g = grant("r", 7);
        assert_eq!(
            words(ReleaseLock::new(&g).invocation().command()),
            [
                "EVALSHA",
                RELEASE.sha1(),
                "1",
                "{r}:lock",
                "7:t0k",
                "{r}:released"
            ]
        );
        assert_eq!(
            words(ExtendLock::new(&g).invocation().command()),
            ["EVALSHA", EXTEND.sha1(), "1", "{r}:lock", "7:t0k", "2000"]
        );
    }

    #[test]
    fn an_applied_extension_moves_the_deadline() {
        let mut g = grant("r", 1);
        let later = g.deadline() + Duration::from_secs(1);
        g.apply(&LockExtend::Extended { deadline: later });
        assert_eq!(g.deadline(), later);
        g.apply(&LockExtend::Lost);
        assert!(g.deadline() <= Instant::now());
    }

    #[test]
    fn a_fence_from_a_message_is_checked() {
        assert!(matches!(Fence::from_message("", 1), Err(Error::EmptyKey)));
        assert!(matches!(
            Fence::from_message("r", 0),
            Err(Error::ZeroLimit { what: "fence" })
        ));
        assert!(matches!(
            Fence::from_message("r", MAX_FENCE + 1),
            Err(Error::OutOfRange { what: "fence", .. })
        ));
        assert_eq!(
            Fence::from_message("r", MAX_FENCE).unwrap().as_i64(),
            i64::MAX
        );
    }
}
