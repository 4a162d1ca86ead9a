//! The receipts of a lock: [`Grant`] (the power to extend and release) and
//! [`Fence`] (the number that goes with every protected write), and the
//! calls on a grant as values: [`ReleaseLock`], [`ExtendLock`].

use std::fmt;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{deadline, FenceSource, Keys, LockExtend, LockRelease, Token, MAX_FENCE};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

static RELEASE: Script = embedded!("fence/release");
/// A fair grant's release: wakes the first in line by name.
static RELEASE_FAIR: Script = embedded!("fence/release_fair");
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
    /// When the extension behind the deadline was built (the acquire's
    /// `sent` until one is applied): an older answer is not taken.
    answered: Instant,
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
    source: FenceSource,
}

impl Fence {
    /// The fence of a grant, as the server answered it.
    pub(super) fn granted(resource: &str, number: u64) -> Fence {
        Fence {
            resource: resource.to_owned(),
            number,
            source: FenceSource::PerResource,
        }
    }

    /// The same fence, as drawn from `source`: it decides what
    /// [`Fence::write`] checks it against. A fence from a grant already
    /// knows its source; set it on one rebuilt with [`Fence::from_message`]
    /// from a lock with [`FenceSource::PerSlot`].
    ///
    /// ```
    /// use nolock::fence::{Fence, FenceSource};
    ///
    /// let fence = Fence::from_message("order:7", 3)?.with_source(FenceSource::PerSlot);
    /// assert_eq!(fence.source(), FenceSource::PerSlot);
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn with_source(self, source: FenceSource) -> Fence {
        Fence { source, ..self }
    }

    /// Where the fence was drawn from ([`super::Lock::with_fence_source`]).
    pub fn source(&self) -> FenceSource {
        self.source
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
            answered: sent,
        }
    }

    /// The resource the lock was taken on.
    pub fn resource(&self) -> &str {
        self.fence.resource()
    }

    /// The owner token (to take the lock again with
    /// [`super::Lock::acquire_as`] while it is held). A secret: the grant's
    /// `Debug` leaves it out.
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
    pub fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The old name of [`Grant::time_left`].
    #[deprecated(
        since = "0.2.0",
        note = "renamed `time_left`: `remaining` counts units in the rate limiters"
    )]
    pub fn remaining(&self) -> Duration {
        self.time_left()
    }

    /// When the acquire request was sent.
    pub(super) fn sent(&self) -> Instant {
        self.sent
    }

    /// What the renewal task needs to extend and release this grant.
    pub(super) fn holder(&self) -> Holder {
        Holder {
            keys: self.keys.clone(),
            value: format!("{}:{}", self.fence.number, self.token.as_str()),
            ttl: self.ttl,
        }
    }

    /// Delete the lock, only if it still holds this grant: one round trip.
    /// Consumes the grant.
    ///
    /// Never deletes a lock that expired and was taken by someone else.
    /// Declared `allow-oom`, so it works on a full server. While a
    /// [`super::Waiters`] waits for the lock (its flag
    /// `keys::derive(resource, "waiting")` exists), a release is announced
    /// with `PUBLISH` on the channel `keys::derive(resource, "released")`,
    /// which wakes them in every process; without waiters nothing is
    /// published.
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
    /// assert!(grant.time_left() > grant.ttl() / 2);
    /// # Ok(()) }
    /// ```
    pub async fn extend<C>(&mut self, conn: &mut C) -> Result<LockExtend>
    where
        C: ConnectionLike + Send,
    {
        let answer = run_one(&ExtendLock::new(self), conn).await?;
        self.apply(&answer)?;
        Ok(answer.outcome())
    }

    /// Take in the answer of an [`ExtendLock`] of this grant, run yourself
    /// (in a [`crate::Batch`], or with an operation id through
    /// [`crate::retry()`]): [`Grant::extend`] does it. An extension moves
    /// [`Grant::deadline`] to its own; a lost grant's deadline is now.
    ///
    /// Only answers about this grant are taken: its lock, owner token, fence
    /// and TTL. An answer to an extension built before the one this
    /// grant's deadline comes from (or before the acquire) is older news and
    /// changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignAnswer`] for an answer about another grant (another
    /// resource, or the same one under another token or fence): nothing
    /// changes. Without this check, another holder's extension would move
    /// this grant's deadline past an expiry the server has already reached.
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, mut a: nolock::fence::Grant,
    /// #     b: nolock::fence::Grant) -> nolock::Result<()> {
    /// use nolock::fence::ExtendLock;
    /// use nolock::Batch;
    ///
    /// let batch = Batch::from_iter([ExtendLock::new(&a), ExtendLock::new(&b)]);
    /// let mut answers = batch.run(conn).await.into_iter();
    /// let (of_a, of_b) = (answers.next().expect("2 answers")?, answers.next().expect("2 answers")?);
    /// a.apply(&of_a)?;
    /// assert!(matches!(a.apply(&of_b), Err(nolock::Error::ForeignAnswer { .. }))); // b's, not a's
    /// # Ok(()) }
    /// ```
    pub fn apply(&mut self, answer: &LockExtension) -> Result<()> {
        if answer.about != self.holder() {
            return Err(Error::ForeignAnswer { receipt: "grant" });
        }
        if answer.built < self.answered {
            return Ok(());
        }
        self.answered = answer.built;
        self.deadline = match answer.outcome {
            LockExtend::Extended { deadline } => deadline,
            LockExtend::Lost => Instant::now(),
        };
        Ok(())
    }
}

/// What an [`ExtendLock`] answers: the outcome of one extension, with the
/// grant it is about. Only that grant takes it ([`Grant::apply`]), and only
/// an extension makes one.
///
/// ```compile_fail
/// # fn f(grant: &mut nolock::fence::Grant) {
/// // An answer is not built by hand: a deadline cannot be handed to a grant.
/// let forged = nolock::fence::LockExtension { outcome: nolock::fence::LockExtend::Lost };
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a lost grant means the work must stop"]
pub struct LockExtension {
    about: Holder,
    /// When the extension was built: its deadline counts from then.
    built: Instant,
    outcome: LockExtend,
}

impl LockExtension {
    /// What the server answered (an extension's deadline counts from when
    /// the [`ExtendLock`] was built).
    pub fn outcome(&self) -> LockExtend {
        self.outcome
    }

    /// True when the grant still held the lock and was extended.
    pub fn is_extended(&self) -> bool {
        matches!(self.outcome, LockExtend::Extended { .. })
    }
}

/// The lock value of a grant, and what extending and releasing it send:
/// also what an extension's answer is about.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Holder {
    keys: Keys,
    /// `"<fence>:<token>"`, as the acquire script stored it.
    value: String,
    ttl: Duration,
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holder")
            .field("lock", &self.keys.lock)
            .field("value", &crate::observe::Redacted)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Holder {
    fn release_call(&self) -> Invocation {
        // The script derives the channel (`keys.released`) from the flag's name.
        let call = match &self.keys.line {
            None => Invocation::new(&RELEASE, &[self.keys.lock.as_str(), &self.keys.waiting]),
            Some(line) => Invocation::new(
                &RELEASE_FAIR,
                &[
                    self.keys.lock.as_str(),
                    &self.keys.waiting,
                    &line[0],
                    &line[1],
                ],
            ),
        };
        call.arg(self.value.as_str())
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
        Ok(run_one(&ExtendLock::of(self), conn).await?.outcome())
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
        let mut reply = Reply::new(self.call.script().name(), reply)?;
        let released = reply.flag()?;
        reply.finish()?;
        Ok(if released {
            LockRelease::Released
        } else {
            LockRelease::Lost
        })
    }
}

/// [`Grant::extend`] as a value; its answer, a [`LockExtension`], is
/// applied with [`Grant::apply`] (to this grant only). The local deadline
/// it answers counts from when the value was built.
#[derive(Debug, Clone)]
pub struct ExtendLock {
    call: Invocation,
    about: Holder,
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
            about: holder.clone(),
            built: Instant::now(),
        }
    }
}

impl Operation for ExtendLock {
    type Output = LockExtension;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<LockExtension> {
        let mut reply = Reply::new(EXTEND.name(), reply)?;
        let extended = reply.flag()?;
        reply.finish()?;
        let outcome = if extended {
            LockExtend::Extended {
                deadline: deadline(self.built, self.about.ttl),
            }
        } else {
            LockExtend::Lost
        };
        Ok(LockExtension {
            about: self.about.clone(),
            built: self.built,
            outcome,
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
                "2",
                "{r}:lock",
                "{r}:waiting",
                "7:t0k"
            ]
        );
        assert_eq!(
            words(ExtendLock::new(&g).invocation().command()),
            ["EVALSHA", EXTEND.sha1(), "1", "{r}:lock", "7:t0k", "2000"]
        );
    }

    fn answer(g: &Grant, extended: bool) -> LockExtension {
        let reply = redis::Value::Array(vec![redis::Value::Int(extended.into())]);
        ExtendLock::new(g).decode(reply).unwrap()
    }

    #[test]
    fn an_applied_extension_moves_the_deadline() {
        let mut g = grant("r", 1);
        let before = g.deadline();
        let extended = answer(&g, true);
        g.apply(&extended).unwrap();
        assert!(g.deadline() >= before);
        assert_eq!(
            Some(g.deadline()),
            match extended.outcome() {
                LockExtend::Extended { deadline } => Some(deadline),
                LockExtend::Lost => None,
            }
        );
        let lost = answer(&g, false);
        g.apply(&lost).unwrap();
        assert!(g.deadline() <= Instant::now());
        // Older news: the earlier extension does not undo the loss.
        g.apply(&extended).unwrap();
        assert!(g.deadline() <= Instant::now());
    }

    #[test]
    fn a_grant_takes_no_answer_about_another_grant() {
        let mut g = grant("r", 1);
        let before = g.deadline();
        for other in [grant("r", 2), grant("s", 1)] {
            let err = g.apply(&answer(&other, true)).unwrap_err();
            assert!(
                matches!(err, Error::ForeignAnswer { receipt: "grant" }),
                "{err}"
            );
            assert_eq!(g.deadline(), before);
        }
        let longer = Grant::granted(
            Keys::of("r").unwrap(),
            Token("t0k".into()),
            Duration::from_secs(30),
            Fence::granted("r", 1),
            Instant::now(),
        );
        assert!(g.apply(&answer(&longer, true)).is_err(), "another TTL");
        assert!(g.apply(&answer(&g, true)).is_ok());
    }

    #[test]
    fn debug_shows_no_token() {
        let g = grant("r", 7);
        for text in [
            format!("{g:?}"),
            format!("{:?}", ReleaseLock::new(&g)),
            format!("{:?}", ExtendLock::new(&g)),
            format!("{:?}", answer(&g, true)),
        ] {
            assert!(!text.contains("t0k"), "{text}");
        }
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
