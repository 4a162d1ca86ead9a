//! [`Semaphore`]: one semaphore's configuration, and the calls on it.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{
    acquire, retry, AcquirePermit, Holding, PeekSemaphore, Permit, PermitAttempt, PermitId,
    PermitLease, SemaphoreUsage,
};
#[cfg(doc)]
use super::{PermitExtend, PermitFence, PermitRelease, MAX_PERMITS, MAX_PERMIT_TTL};
use crate::ack::Ack;
use crate::script::{run_one, Operation};
use crate::{validate, Backoff, Error, Result, Work};

/// "At most `permits` at once": a semaphore's size, the TTL of its permits
/// and how long an acquire waits for one. Build it once (it is cheap to
/// clone) and call it with the key of whatever is limited; every caller of
/// one key should share it, so that they agree on its size.
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::semaphore::{PermitAttempt, PermitRelease, Semaphore};
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let payments = Semaphore::new(3, Duration::from_secs(10))?;
/// match payments.acquire(conn, "payments:tenant:7").await? {
///     PermitAttempt::Acquired(permit) => {
///         // ... call the payment provider ...
///         if permit.release(conn).await? == PermitRelease::Lost {
///             eprintln!("the permit expired while working");
///         }
///     }
///     PermitAttempt::Full { retry_after, .. } => println!("3 calls running; retry in {retry_after:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Semaphore {
    permits: u64,
    ttl: Duration,
    wait: Backoff,
    ack: Option<Ack>,
    /// Sends "adopt": a state of another size is read and retagged (a
    /// managed handle's, whose size was changed on purpose).
    adopt: bool,
    /// Permits carry a seat and a fence ([`Semaphore::fenced`]).
    fenced: bool,
    /// Waiting acquires queue in arrival order ([`Semaphore::fair`]).
    fair: bool,
}

impl Semaphore {
    /// The same semaphore, whose calls adopt a state another size wrote
    /// (`lua/lib/tag.lua`): for the client's handles, whose stored size
    /// may be changed under them.
    pub(crate) fn adopting(mut self) -> Self {
        self.adopt = true;
        self
    }

    /// True when its acquires and peeks send "adopt".
    pub(super) fn adopts(&self) -> bool {
        self.adopt
    }

    /// The same semaphore (its wait and acknowledgement) with other numbers
    /// (a stored configuration's).
    pub(crate) fn with_numbers(&self, permits: u64, ttl: Duration) -> Result<Semaphore> {
        let fresh = Semaphore::new(permits, ttl)?;
        Ok(Semaphore {
            permits: fresh.permits,
            ttl: fresh.ttl,
            ..self.clone()
        })
    }

    /// A semaphore of `permits` whose permits expire `ttl` after they were
    /// granted or last extended; an acquire makes one attempt (see
    /// [`Semaphore::with_wait`]).
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] and [`Error::OutOfRange`] (`permits` 0 or above
    /// [`MAX_PERMITS`]); [`Error::ZeroDuration`] (`ttl` under 1 ms) and
    /// [`Error::DurationTooLong`] (above [`MAX_PERMIT_TTL`]).
    pub fn new(permits: u64, ttl: Duration) -> Result<Semaphore> {
        super::check_permits(permits, 1)?;
        let ttl = Duration::from_millis(super::ttl_millis(ttl)?);
        Ok(Semaphore {
            permits,
            ttl,
            wait: Backoff::none(),
            ack: None,
            adopt: false,
            fenced: false,
            fair: false,
        })
    }

    /// The same semaphore, whose acquires wait for a permit with `wait`:
    /// jittered exponential sleeps, each capped by the server's
    /// `retry_after`, until `wait.timeout` after the first attempt.
    pub fn with_wait(self, wait: Backoff) -> Semaphore {
        Semaphore { wait, ..self }
    }

    /// The same semaphore, whose permits count only once `replicas`
    /// replicas have confirmed them, within `timeout`: **acknowledged
    /// permits**, as [`crate::fence::Lock::acknowledged`] for a lock.
    ///
    /// **It needs a replica**: without one every acquire answers
    /// [`Error::PermitUnacknowledged`] with `connected: Some(0)` after
    /// `timeout`, and nothing stays held.
    ///
    /// A permit the primary granted but no replica received is lost in a
    /// failover: the promoted replica does not know its holder, and lets one
    /// more in than the semaphore allows (a plain semaphore has no fence to
    /// refuse the extra holder's writes; a [`Semaphore::fenced`] one's seats
    /// and slot counter can be set back by the failover too). With this,
    /// each acquire sends `WAIT replicas timeout` in the same round trip as
    /// the script, and permits
    /// are returned only when enough replicas have them. When they do not
    /// confirm in time the acquire answers [`Error::PermitUnacknowledged`]
    /// and releases them at once; a semaphore that waits
    /// ([`Semaphore::with_wait`]) tries again, under the same id, within its
    /// deadline. Extensions and releases are not acknowledged (a lost
    /// extension only shortens the hold; a lost release leaves the permits
    /// to their TTL). Keep `timeout` below the connection's response
    /// timeout (redis-rs: 500 ms by default), as for a lock.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`replicas` 0) and [`Error::ZeroDuration`]
    /// (`timeout` under 1 ms; `WAIT 0` would wait forever).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::semaphore::Semaphore;
    ///
    /// let payouts = Semaphore::new(3, Duration::from_secs(30))?
    ///     .acknowledged(1, Duration::from_millis(100))?;
    /// assert_eq!(payouts.replicas(), Some(1));
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn acknowledged(self, replicas: u64, timeout: Duration) -> Result<Semaphore> {
        Ok(Semaphore {
            ack: Some(Ack::replicas(replicas, timeout)?),
            ..self
        })
    }

    /// The same semaphore, whose permits count only once they are in the
    /// primary's append-only file on disk and in `replicas` replicas' (`0`
    /// allowed), within `timeout` (`WAITAOF`; Redis 7.2 or later, or Valkey
    /// 8, with `appendonly yes`), as
    /// [`crate::fence::Lock::acknowledged_on_disk`] for a lock (whose
    /// notes on `appendfsync everysec` and response timeouts apply). Elsewhere the
    /// first acquire is granted, released at once and answered
    /// [`Error::Redis`] with the server's refusal.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] (`timeout` under 1 ms).
    pub fn acknowledged_on_disk(self, replicas: u64, timeout: Duration) -> Result<Semaphore> {
        Ok(Semaphore {
            ack: Some(Ack::on_disk(replicas, timeout)?),
            ..self
        })
    }

    /// How many replicas must confirm each acquire
    /// ([`Semaphore::acknowledged`], [`Semaphore::acknowledged_on_disk`]).
    pub fn replicas(&self) -> Option<u64> {
        self.ack.map(|ack| ack.count())
    }

    /// True when its acquires are confirmed by replicas or the disk, so its
    /// operation values cannot be built.
    pub(super) fn is_acknowledged(&self) -> bool {
        self.ack.is_some()
    }

    /// One attempt of `op` under this semaphore's acknowledgement rule.
    pub(super) async fn attempt<C>(&self, conn: &mut C, op: &AcquirePermit) -> Result<PermitAttempt>
    where
        C: ConnectionLike + Send,
    {
        let Some(ack) = self.ack else {
            return run_one(op, conn).await;
        };
        let (reply, confirmed) = ack.run(conn, op.invocation()).await?;
        let outcome = op.decode(reply)?;
        let PermitAttempt::Acquired(permit) = outcome else {
            return Ok(outcome);
        };
        let key = permit.key().to_owned();
        let release = |permit: super::Permit| async move {
            let _ = permit.release(conn).await;
            crate::ack::connected_replicas(conn).await
        };
        let permit = ack
            .keep_or_give_back(confirmed, permit, release, |acknowledged, connected| {
                Error::PermitUnacknowledged {
                    key,
                    asked: ack.count(),
                    acknowledged,
                    on_disk: ack.disk(),
                    connected,
                }
            })
            .await?;
        Ok(PermitAttempt::Acquired(permit))
    }

    /// The same semaphore, whose permits carry a **fence**: a seat
    /// 1..permits and a fence number that grows with every grant of the
    /// seat ([`Permit::fence`], [`PermitFence::write`]), so a holder paused
    /// past its permit's expiry is refused once its seat was granted again
    /// and written. One permit per holder: an acquire or restore of weight
    /// above 1 is refused with [`Error::InvalidArgument`] before any I/O.
    ///
    /// Its acquires run `lua/semaphore/acquire_fenced.lua` (one round
    /// trip, as a plain acquire): the permit is the same sorted-set member
    /// a plain acquire writes, so plain and fenced holders of a key count
    /// together; the seat and fence are kept in
    /// `keys::derive(key, "seats")` (expiring with the permits) and the
    /// fence is drawn from the slot's counter
    /// ([`crate::fence::slot_counter`]; grant its key pattern to an ACL
    /// user). Its extensions check the seat too
    /// (`lua/semaphore/extend_fenced.lua`); a release frees the seat with
    /// the permit. It never adopts another size's state. The cost: an
    /// acquire reads every seat, O(permits).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::semaphore::Semaphore;
    ///
    /// // At most 3 exporters, each writing under its seat's fence.
    /// let exporters = Semaphore::new(3, Duration::from_secs(30))?.fenced();
    /// assert!(exporters.is_fenced());
    /// assert!(nolock::semaphore::AcquirePermit::weighted(&exporters, "exports", 2).is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn fenced(self) -> Semaphore {
        Semaphore {
            fenced: true,
            ..self
        }
    }

    /// True when its permits carry fences ([`Semaphore::fenced`]).
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// A permit of this fenced semaphore known by its key, id, seat and
    /// fence (a [`PermitFence`] that crossed a process boundary), to write,
    /// extend or release with: [`Semaphore::restore`] with a fence. The
    /// server checks what it says: a wrong seat or fence writes nothing
    /// ([`crate::fence::Write::NotGranted`] or
    /// [`crate::fence::Write::Stale`]) and extends nothing.
    ///
    /// # Errors
    ///
    /// Before any I/O: as [`Semaphore::restore`] with weight 1;
    /// [`Error::InvalidArgument`] when the semaphore is not fenced;
    /// [`Error::ZeroLimit`] / [`Error::OutOfRange`] for a seat of 0 or
    /// above the size, or a fence of 0 or above `i64::MAX`.
    pub fn restore_fenced(&self, key: &str, id: PermitId, seat: u64, fence: u64) -> Result<Permit> {
        if !self.fenced {
            return Err(super::fenced::unfenced());
        }
        let mut permit = self.restore(key, id, 1)?;
        validate::positive("seat", seat)?;
        if seat > self.permits {
            return Err(Error::OutOfRange {
                what: "seat",
                given: seat,
                max: self.permits,
            });
        }
        validate::positive("fence", fence)?;
        let max = u64::try_from(i64::MAX).unwrap_or(u64::MAX);
        if fence > max {
            return Err(Error::OutOfRange {
                what: "fence",
                given: fence,
                max,
            });
        }
        permit.holding.seat = Some(super::fenced::Seat { seat, fence });
        Ok(permit)
    }

    /// The same semaphore, whose waiting acquires are served **in arrival
    /// order**, across processes: **fair waiting**, as [`crate::fence::Lock::fair`]
    /// for a lock.
    ///
    /// A waiting acquire ([`Semaphore::acquire`], [`Semaphore::acquire_weighted`]
    /// or [`Semaphore::acquire_as`] with a [`Semaphore::with_wait`]
    /// backoff, [`Semaphore::lease`], [`Semaphore::with_permit`]) joins the
    /// key's waiting line in Redis (`keys::derive(key, "queue")` and
    /// `"queue:alive"`, in the key's slot) with a ticket naming its id and
    /// weight, and is granted only when its weight **and the weights of
    /// every live waiter ahead of it** fit in the free permits
    /// (`lua/semaphore/acquire_fair.lua`). So no waiter is passed over by
    /// one that came later, and a heavy waiter is not starved by light ones
    /// behind it; when a release frees several permits, the first waiters
    /// whose weights fit together are all granted at their next attempt.
    /// A release of a fair permit (`lua/semaphore/release_fair.lua`)
    /// `PUBLISH`es the tickets at the head of the line whose weights fit
    /// what it left free; [`crate::fence::Waiters::acquire_permit`] routes
    /// each to its waiter, which tries at once. Waiters of
    /// [`Semaphore::acquire`] and the others poll by their place in line
    /// instead (the first ones at the backoff's first delay, the n-th at
    /// most at the n-th), which costs throughput under contention
    /// (`examples/fair_wait.rs`).
    ///
    /// A waiter that stops calling (its process killed, its future
    /// dropped) leaves the line at most [`Semaphore::ticket_life`] after its
    /// last attempt; one that gives up (its timeout passes, or an error)
    /// leaves at once. One that comes back after its ticket died is queued
    /// at the back. The line's keys expire with their last deadline.
    ///
    /// An acquire that does not wait (no [`Semaphore::with_wait`]) does not
    /// join: it is granted only when its weight fits together with the
    /// whole line's; otherwise it answers [`PermitAttempt::Full`] (with
    /// `retry_after` zero when the free permits are promised to waiters).
    /// The grant is the same permits as without `fair` (members, tag and
    /// expiry), so extension and peek are unchanged, and a release by a
    /// plain semaphore's handle frees them all the same (it only wakes
    /// nobody). An
    /// acknowledged fair semaphore whose grant the replicas did not confirm
    /// gives it back and queues again, at the back.
    ///
    /// **Every process of a key must use the fair mode**: a plain acquire
    /// does not look at the line and takes free permits ahead of it. Not
    /// combined with [`Semaphore::fenced`]: every acquire of a fair fenced
    /// semaphore is refused with [`Error::InvalidArgument`] before any I/O.
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::semaphore::Semaphore;
    /// use nolock::Backoff;
    ///
    /// let exports = Semaphore::new(3, Duration::from_secs(30))?
    ///     .with_wait(Backoff::new(Duration::from_secs(10)))
    ///     .fair();
    /// assert!(exports.is_fair());
    /// // Sleeps of at most 500 ms (+1 ms jitter): a silent waiter leaves the line within 2.002 s.
    /// assert_eq!(exports.ticket_life(), Duration::from_millis(2002));
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn fair(self) -> Semaphore {
        Semaphore { fair: true, ..self }
    }

    /// Whether waiting acquires queue in arrival order ([`Semaphore::fair`]).
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// How long a fair waiter's ticket lives after each of its attempts
    /// ([`Semaphore::fair`]): twice its longest sleep between attempts (its
    /// backoff's `max_delay`, at least `initial_delay`, plus 1 ms of
    /// jitter, at most its timeout) plus 1 s for the attempt's round trip.
    /// A waiter that stops calling leaves the line within this bound.
    pub fn ticket_life(&self) -> Duration {
        retry::longest_sleep(&self.wait) * 2 + Duration::from_secs(1)
    }

    /// How many permits it has.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// Its permits' TTL, in whole milliseconds.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How its acquires wait.
    pub fn wait(&self) -> &Backoff {
        &self.wait
    }

    /// The checks every acquire makes before I/O: the TTL in ms.
    pub(crate) fn check(&self, key: &str, weight: u64) -> Result<u64> {
        let ttl = acquire::check(key, self.permits, weight, self.ttl)?;
        if self.fenced && self.fair {
            return Err(Error::InvalidArgument {
                what: "semaphore",
                reason: "a fenced semaphore cannot be fair (Semaphore::fenced with \
                         Semaphore::fair)"
                    .to_owned(),
            });
        }
        if self.fenced && weight != 1 {
            return Err(Error::InvalidArgument {
                what: "weight",
                reason: format!("a fenced semaphore's permit is one seat: weight 1, not {weight}"),
            });
        }
        Ok(ttl)
    }

    /// Take one permit at `key`, if one is free (waiting as
    /// [`Semaphore::with_wait`] says).
    ///
    /// One round trip per attempt. A full semaphore is not an error: it
    /// returns [`PermitAttempt::Full`] with when a permit will surely come
    /// back. Expired permits are reclaimed first.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`], [`Error::Entropy`],
    /// [`Error::ZeroDuration`] (a backoff's `initial_delay` under 1 ms),
    /// [`Error::NoTimer`] (a semaphore that waits, on a runtime without
    /// timers). From Redis: [`Error::Redis`] (`OOM`, or the key holds
    /// something that is not a semaphore; nothing was written),
    /// [`Error::StateMismatch`] (a semaphore of another size holds the key;
    /// nothing was written) and [`Error::Indeterminate`] (the permit may have been taken under an id
    /// you never saw; it expires after `ttl`; a semaphore that waits tries
    /// again with the same id within its deadline).
    pub async fn acquire<C>(&self, conn: &mut C, key: &str) -> Result<PermitAttempt>
    where
        C: ConnectionLike + Send,
    {
        self.acquire_weighted(conn, key, 1).await
    }

    /// Take `weight` permits at once at `key`, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`], and [`Error::ZeroLimit`] /
    /// [`Error::InsufficientCapacity`] for a weight of 0 or above the
    /// semaphore's size (it could never fit).
    pub async fn acquire_weighted<C>(
        &self,
        conn: &mut C,
        key: &str,
        weight: u64,
    ) -> Result<PermitAttempt>
    where
        C: ConnectionLike + Send,
    {
        if self.wait.timeout.is_zero() {
            self.check(key, weight)?;
            let op = AcquirePermit::build(self, key, &PermitId::random()?, weight)?;
            return self.attempt(conn, &op).await;
        }
        retry::acquire_waiting(self, conn, key, weight, None, None).await
    }

    /// [`Semaphore::acquire_weighted`] under an id chosen by the caller:
    /// known before anything is sent, so a caller whose call timed out can
    /// release what it may have taken. Running it again while the id still
    /// holds its permits grants them again (no second set).
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire_weighted`].
    pub async fn acquire_as<C>(
        &self,
        conn: &mut C,
        key: &str,
        id: &PermitId,
        weight: u64,
    ) -> Result<PermitAttempt>
    where
        C: ConnectionLike + Send,
    {
        retry::acquire_waiting(self, conn, key, weight, Some(id), None).await
    }

    /// A permit of this semaphore known only by its key, id and weight
    /// (stored by a process that has since restarted), to release or extend
    /// it: the escape hatch for a permit that crossed a process boundary.
    /// Its TTL is this semaphore's, never the caller's, so an extension sets
    /// what every holder of the key is configured with; build it from the
    /// same configuration as the semaphore that acquired it.
    ///
    /// The server checks what it says: a release or extension of permits
    /// this id does not hold answers [`PermitRelease::Lost`] /
    /// [`PermitExtend::Lost`], and one whose weight is not the one the id
    /// was granted is refused ([`Error::PermitWeightMismatch`]; nothing is
    /// written, and the holding keeps all its permits). Its local deadline
    /// is unknown, so it is set to now: [`Permit::extend`] it to learn
    /// whether it still holds.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`]; [`Error::ZeroLimit`] /
    /// [`Error::InsufficientCapacity`] for a weight of 0 or above the
    /// semaphore's size (no acquire of it could have granted that).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::semaphore::{PermitId, Semaphore};
    ///
    /// let exports = Semaphore::new(10, Duration::from_secs(30))?;
    /// let id = PermitId::parse("0123456789abcdef0123456789abcdef")?;
    /// let permit = exports.restore("exports:running", id.clone(), 2)?;
    /// assert_eq!((permit.key(), permit.weight(), permit.ttl()), ("exports:running", 2, exports.ttl()));
    /// assert!(exports.restore("exports:running", id, 11).is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn restore(&self, key: &str, id: PermitId, weight: u64) -> Result<Permit> {
        let ttl_ms = self.check(key, weight)?;
        let now = Instant::now();
        let holding = Holding {
            key: key.to_owned(),
            id,
            weight,
            ttl: Duration::from_millis(ttl_ms),
            seat: None,
            fair: self.fair,
        };
        Ok(Permit::granted(holding, now, now))
    }

    /// Permits in use, holders and the next expiry at `key`; writes nothing
    /// (`EVALSHA_RO`). Unlike the free [`super::peek`], it sends its size:
    /// a semaphore of another size at `key` is refused.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] when the key
    /// holds something that is not a semaphore (every member is checked);
    /// [`Error::StateMismatch`] when a semaphore of another size wrote it.
    pub async fn peek<C>(&self, conn: &mut C, key: &str) -> Result<SemaphoreUsage>
    where
        C: ConnectionLike + Send,
    {
        run_one(&PeekSemaphore::sized(self, key)?, conn).await
    }

    /// [`Semaphore::acquire`], then keep the permit renewed every `ttl / 3`
    /// in a background task on `conn` ([`PermitLease`]).
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`], and [`Error::NoTimer`] (the renewals need
    /// a runtime with timers), before any I/O.
    pub async fn lease<C>(&self, mut conn: C, key: &str) -> Result<PermitAttempt<PermitLease>>
    where
        C: ConnectionLike + Send + 'static,
    {
        crate::timer::check()?;
        Ok(match self.acquire(&mut conn, key).await? {
            PermitAttempt::Acquired(permit) => {
                PermitAttempt::Acquired(PermitLease::start(conn, permit)?)
            }
            PermitAttempt::Full {
                retry_after,
                in_use,
            } => PermitAttempt::Full {
                retry_after,
                in_use,
            },
        })
    }

    /// Run `work` under a renewed permit at `key` ([`Semaphore::lease`]),
    /// then release it.
    ///
    /// The answer says what became of the hold, in its type
    /// ([`Work`]): [`Work::Done`] when the permit was held from start to
    /// end; [`Work::Overran`] when the work finished but the release found
    /// the permit expired (it may have run beside one more holder than the
    /// semaphore allows); [`Work::Stopped`] when the permit was lost while
    /// it ran (its future is dropped at that moment); [`Work::Busy`] when no
    /// permit came within the semaphore's wait. `work` gets the holder's id.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::lease`].
    ///
    /// ```no_run
    /// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::semaphore::Semaphore;
    /// use nolock::{Backoff, Work};
    ///
    /// let payments = Semaphore::new(3, Duration::from_secs(10))?
    ///     .with_wait(Backoff::new(Duration::from_secs(2)));
    /// let out = payments.with_permit(conn, "payments:tenant:7", |_id| async { 42 }).await?;
    /// assert!(matches!(out, Work::Done(42) | Work::Busy) || out.loss().is_some());
    /// # Ok(()) }
    /// ```
    pub async fn with_permit<C, F, Fut, T>(&self, conn: C, key: &str, work: F) -> Result<Work<T>>
    where
        C: ConnectionLike + Send + 'static,
        F: FnOnce(PermitId) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = match self.lease(conn, key).await? {
            PermitAttempt::Acquired(lease) => lease,
            PermitAttempt::Full { .. } => return Ok(Work::Busy),
        };
        Ok(lease.run(work).await)
    }
}
