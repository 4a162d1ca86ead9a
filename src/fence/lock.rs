//! [`Lock`]: one kind of lock's configuration, and the acquires on it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::{
    millis, retry, slot_counter, Fence, FenceSource, Grant, Keys, Lease, LockAttempt, Token,
};
use crate::ack::Ack;
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::{Backoff, Result, Work};

pub(super) static ACQUIRE: Script = embedded!("fence/acquire");
static ACQUIRE_SLOT: Script = embedded!("fence/acquire_slot");
static ACQUIRE_FAIR: Script = embedded!("fence/acquire_fair");

/// "One holder at a time, with a fence": the TTL of the grants and how
/// long an acquire waits. Build it once (it is cheap to clone) and call it
/// with the name of whatever is protected; every caller of one resource
/// should share it, so that they agree on its TTL.
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::fence::{Lock, LockAttempt, LockRelease};
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let reports = Lock::new(Duration::from_secs(30))?;
/// match reports.acquire(conn, "report:daily").await? {
///     LockAttempt::Acquired(grant) => {
///         // ... build the report, writing with grant.fence() ...
///         if grant.release(conn).await? == LockRelease::Lost {
///             eprintln!("the lease expired before the work finished");
///         }
///     }
///     LockAttempt::Held { expires_in } => println!("busy, free in at most {expires_in:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    ttl: Duration,
    wait: Backoff,
    ack: Option<Ack>,
    fences: FenceSource,
    fair: bool,
}

impl Lock {
    /// The same lock (its wait and acknowledgement) with another TTL (a
    /// stored configuration's).
    pub(crate) fn with_ttl(&self, ttl: Duration) -> Result<Lock> {
        let fresh = Lock::new(ttl)?;
        Ok(Lock {
            ttl: fresh.ttl,
            ..self.clone()
        })
    }

    /// A lock whose grants expire `ttl` after they were taken or last
    /// extended; an acquire makes one attempt (see [`Lock::with_wait`]).
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] (`ttl` under 1 ms) and
    /// [`Error::DurationTooLong`] (above [`crate::MAX_TTL`]).
    pub fn new(ttl: Duration) -> Result<Lock> {
        let ttl = Duration::from_millis(millis(ttl)?);
        Ok(Lock {
            ttl,
            wait: Backoff::none(),
            ack: None,
            fences: FenceSource::PerResource,
            fair: false,
        })
    }

    /// The same lock, whose grants count only once `replicas` replicas have
    /// confirmed them, within `timeout`: **acknowledged grants**.
    ///
    /// **It needs a replica.** On a server without one (a development
    /// server, a single-node cache) every acquire answers
    /// [`Error::Unacknowledged`] after `timeout`, with `connected:
    /// Some(0)` and a message that says so, and nothing stays held. Build
    /// the lock without `acknowledged` where there is no replica.
    ///
    /// Redis replicates asynchronously: a grant the primary answered but no
    /// replica received is lost in a failover, and the promoted replica
    /// hands the same fence out again, to a second holder. With this, each
    /// acquire sends `WAIT replicas timeout` in the same round trip as the
    /// script (one pipeline, on the node that owns the resource), and a grant
    /// is returned only when enough replicas have it. When they do not
    /// confirm in time the acquire answers [`Error::Unacknowledged`] and
    /// releases the lock at once; a lock that waits ([`Lock::with_wait`])
    /// tries again within its deadline. A failover can still lose a grant
    /// that `replicas` replicas confirmed only if every one of them is lost
    /// with the primary, or is not the one promoted (Redis Cluster and
    /// Sentinel promote the most up-to-date replica they can reach).
    ///
    /// What it costs: the time until the replicas confirm (about one
    /// replication round trip on a healthy link; `timeout` when one is down
    /// or lagging), on every grant. `examples/fence_cost.rs` measures it.
    /// Renewals and releases are not acknowledged (a lost extension only
    /// shortens the lease; a lost release leaves the lock to its TTL).
    ///
    /// Keep `timeout` below the connection's response timeout (redis-rs's
    /// `MultiplexedConnection`: 500 ms by default): an answer slower than
    /// that is given up by the client, and the grant counts as confirmed by
    /// none (released, [`Error::Unacknowledged`]). A server that refuses
    /// `WAIT` itself (an ACL user without it: `NOPERM`) could never confirm
    /// a grant: the acquire releases it and answers [`Error::Redis`] with
    /// the refusal.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`replicas` 0) and [`Error::ZeroDuration`]
    /// (`timeout` under 1 ms; `WAIT 0` would wait forever).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::fence::Lock;
    ///
    /// let payouts = Lock::new(Duration::from_secs(30))?
    ///     .acknowledged(1, Duration::from_millis(100))?;
    /// assert_eq!(payouts.replicas(), Some(1));
    /// assert!(Lock::new(Duration::from_secs(1))?.acknowledged(0, Duration::from_millis(1)).is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn acknowledged(self, replicas: u64, timeout: Duration) -> Result<Lock> {
        Ok(Lock {
            ack: Some(Ack::replicas(replicas, timeout)?),
            ..self
        })
    }

    /// The same lock, whose grants count only once they are in the
    /// primary's append-only file on disk (`fsync`ed) and in `replicas`
    /// replicas' (`replicas` may be 0), within `timeout`: `WAITAOF 1
    /// replicas timeout` in the same round trip as the script, as
    /// [`Lock::acknowledged`] sends `WAIT`.
    ///
    /// This closes what `appendfsync everysec` leaves open: a grant answered
    /// by a server whose machine crashes (power, kernel) within the second
    /// before the log reached the disk, and is restarted from that log.
    /// Under `everysec` the answer takes up to a second (the next `fsync`):
    /// raise the connection's response timeout above `timeout` (redis-rs:
    /// 500 ms by default; a slower answer counts as no confirmation), or
    /// run the server with `appendfsync always`, where the primary's part is
    /// immediate. A replica that has just synced confirms nothing on disk
    /// until it has rewritten its append-only file (about 5 s in
    /// `tests/acknowledged.rs`).
    /// It needs Redis 7.2 or later (or Valkey 8) with `appendonly yes`: on
    /// another server the first acquire is granted, released at once and
    /// answered [`Error::Redis`] with the server's refusal (unknown command,
    /// or `appendonly` disabled), never a grant it could not confirm.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] (`timeout` under 1 ms).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::fence::Lock;
    ///
    /// let ledger = Lock::new(Duration::from_secs(30))?
    ///     .acknowledged_on_disk(0, Duration::from_millis(50))?;
    /// assert_eq!(ledger.replicas(), Some(0));
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn acknowledged_on_disk(self, replicas: u64, timeout: Duration) -> Result<Lock> {
        Ok(Lock {
            ack: Some(Ack::on_disk(replicas, timeout)?),
            ..self
        })
    }

    /// How many replicas must confirm each grant ([`Lock::acknowledged`],
    /// [`Lock::acknowledged_on_disk`]).
    pub fn replicas(&self) -> Option<u64> {
        self.ack.map(|ack| ack.count())
    }

    /// One attempt of `op` under this lock's acknowledgement rule.
    pub(super) async fn attempt<C>(&self, conn: &mut C, op: &AcquireLock) -> Result<LockAttempt>
    where
        C: ConnectionLike + Send,
    {
        let Some(ack) = self.ack else {
            return run_one(op, conn).await;
        };
        let (reply, confirmed) = ack.run(conn, op.invocation()).await?;
        let outcome = op.decode(reply)?;
        let LockAttempt::Acquired(grant) = outcome else {
            return Ok(outcome);
        };
        let (resource, fence) = (grant.resource().to_owned(), grant.fence().number());
        let release = |grant: Grant| async move {
            let _ = grant.release(conn).await;
            crate::ack::connected_replicas(conn).await
        };
        let grant = ack
            .keep_or_give_back(confirmed, grant, release, |acknowledged, connected| {
                crate::Error::Unacknowledged {
                    resource,
                    fence,
                    asked: ack.count(),
                    acknowledged,
                    on_disk: ack.disk(),
                    connected,
                }
            })
            .await?;
        Ok(LockAttempt::Acquired(grant))
    }

    /// The same lock, whose acquires wait while it is held, with `wait`:
    /// jittered exponential sleeps, never past the holder's expiry, until
    /// `wait.timeout` after the first attempt.
    pub fn with_wait(self, wait: Backoff) -> Lock {
        Lock { wait, ..self }
    }

    /// The TTL each grant and each extension sets, in whole milliseconds.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How its acquires wait.
    pub fn wait(&self) -> &Backoff {
        &self.wait
    }

    /// The same lock, drawing its fences from `source`:
    /// [`FenceSource::PerSlot`] for **fences in bounded memory** (one
    /// counter per cluster slot, nothing per resource outliving its lock),
    /// [`FenceSource::PerResource`] (the default) for one counter per
    /// resource that never expires.
    ///
    /// Fences stay strictly increasing per resource in both modes, and
    /// switching a resource from per-resource to per-slot fences never makes
    /// its fence go back (the first slot grant is above its old counter).
    /// **Switch every process of one keyspace together**: a per-resource
    /// acquire does not see the slot counter, so a process still in the old
    /// mode could hand out a fence below one a slot grant already gave.
    /// The old counters (`keys::derive(resource, "fence")`) are only read
    /// in slot mode; once no process of the old mode runs, they may be
    /// deleted. A fence's writes follow its source
    /// ([`Fence::write`] checks a slot fence against the lock, see
    /// [`FenceSource::PerSlot`]).
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::fence::{FenceSource, Lock, LockAttempt, Write};
    ///
    /// // One lock per order id, millions of ids: no key per id outlives its lock.
    /// let orders = Lock::new(Duration::from_secs(30))?.with_fence_source(FenceSource::PerSlot);
    /// if let LockAttempt::Acquired(grant) = orders.acquire(conn, "order:81723").await? {
    ///     match grant.fence().write(conn, "shipped").await? {
    ///         Write::Applied => {}
    ///         _ => return Ok(()), // the lease ended or a newer grant exists: stop
    ///     }
    ///     grant.release(conn).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn with_fence_source(self, source: FenceSource) -> Lock {
        Lock {
            fences: source,
            ..self
        }
    }

    /// Where its grants' fences come from ([`Lock::with_fence_source`]).
    pub fn fence_source(&self) -> FenceSource {
        self.fences
    }

    /// The same lock, whose waiting acquires are served **in arrival
    /// order**, across processes: **fair waiting**.
    ///
    /// A waiting acquire ([`Lock::acquire`] or [`Lock::acquire_as`] with a
    /// [`Lock::with_wait`] backoff, [`Lock::lease`], [`Lock::with_lease`],
    /// [`super::Waiters::acquire`]) joins the resource's waiting line in
    /// Redis (`keys::derive(resource, "queue")` and `"queue:alive"`, in the
    /// lock's slot) with its token as its ticket, and is granted only when
    /// the lock is free **and** its ticket is first (`lua/fence/acquire_fair.lua`).
    /// So no waiter is passed over by one that came later. A release of a
    /// fair grant wakes the first in line by name (it `PUBLISH`es the
    /// ticket; [`super::Waiters`] routes it to that waiter alone), not
    /// whichever waiter asks first.
    ///
    /// A waiter that stops calling (its process killed, its future
    /// dropped) leaves the line at most [`Lock::ticket_life`] after its last
    /// attempt, without blocking the ones behind it longer than that; one
    /// that gives up (its timeout passes, or an error) leaves at once. One
    /// that comes back after its ticket died is queued at the back. The
    /// line's keys expire with their last deadline.
    ///
    /// An acquire that does not wait (no [`Lock::with_wait`]) does not
    /// join: it is granted only when the lock is free and nobody is in
    /// line; a free lock with waiters in line answers
    /// [`LockAttempt::Held`] with `expires_in: None` (it is theirs). The grant is the same lock value, fence and counter as
    /// without `fair` (release, extension and fenced writes are unchanged;
    /// [`FenceSource::PerSlot`] works too).
    ///
    /// As an operation value ([`AcquireLock::with_token`]), a waiting fair
    /// lock's attempt joins the line: it is the first attempt of a waiting
    /// acquire, and [`Lock::acquire_as`] or
    /// [`super::Waiters::acquire_as`] under the same token keeps its place
    /// (left alone, the ticket dies within [`Lock::ticket_life`]). An
    /// acknowledged fair lock ([`Lock::acknowledged`]) whose grant the
    /// replicas did not confirm gives it back and queues again, at the back.
    ///
    /// **Every process of a resource must use the fair mode**: a plain
    /// acquire does not look at the line and takes a free lock ahead of it,
    /// and a plain grant's release does not wake the first in line by name
    /// (the line then moves on at its waiters' fallback timers, within
    /// [`crate::Backoff::max_delay`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::fence::Lock;
    /// use nolock::Backoff;
    ///
    /// let exports = Lock::new(Duration::from_secs(30))?
    ///     .with_wait(Backoff::new(Duration::from_secs(10)))
    ///     .fair();
    /// assert!(exports.is_fair());
    /// // Sleeps of at most 500 ms (+1 ms jitter): a silent waiter leaves the line within 2.002 s.
    /// assert_eq!(exports.ticket_life(), Duration::from_millis(2002));
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn fair(self) -> Lock {
        Lock { fair: true, ..self }
    }

    /// Whether waiting acquires queue in arrival order ([`Lock::fair`]).
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// How long a fair waiter's ticket lives after each of its attempts
    /// ([`Lock::fair`]): twice its longest sleep between attempts (its
    /// backoff's `max_delay`, at least `initial_delay`, plus 1 ms of
    /// jitter, at most its timeout) plus 1 s for the attempt's round trip.
    /// A waiter that stops calling leaves the line within this bound.
    pub fn ticket_life(&self) -> Duration {
        retry::longest_sleep(&self.wait) * 2 + Duration::from_secs(1)
    }

    /// Take the lock on `resource` if it is free, with a fresh random owner
    /// token, and get the next fence (waiting as [`Lock::with_wait`] says).
    ///
    /// One round trip per attempt. A held lock is not an error: it returns
    /// [`LockAttempt::Held`] with the time until it expires, and writes
    /// nothing. A waiting lock draws one token for all its attempts, so an
    /// attempt whose reply was lost is recognised by the next (same grant,
    /// same fence) instead of leaving a lock behind.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`], [`Error::Entropy`],
    /// [`Error::ZeroDuration`] (a backoff's `initial_delay` under 1 ms),
    /// [`Error::NoTimer`] (a lock that waits, on a runtime without timers).
    /// From Redis: [`Error::Redis`] (e.g. `OOM` on a full server,
    /// `WRONGTYPE`, or a fence counter that is not an integer; nothing was
    /// written) and [`Error::Indeterminate`] (the lock may have been taken
    /// with a token you never saw; it expires after the TTL. Use
    /// [`Lock::acquire_as`] to be able to retry; a lock that waits retries
    /// with its token within its deadline).
    pub async fn acquire<C>(&self, conn: &mut C, resource: &str) -> Result<LockAttempt>
    where
        C: ConnectionLike + Send,
    {
        Keys::of(resource)?;
        let token = Token::random()?;
        self.acquire_as(conn, resource, &token).await
    }

    /// [`Lock::acquire`] with a token you chose (from [`Token::random`]).
    ///
    /// While the lock still holds `token`, calling this again answers the
    /// same grant: the fence stored with the lock (never a newer one, and
    /// never the counter: after [`super::advance`] the grant keeps its own,
    /// now stale, fence), with the TTL set again. After an
    /// [`Error::Indeterminate`] you can retry with the same token and learn
    /// whether the first call took the lock, instead of waiting out its TTL.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`] (without [`Error::Entropy`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::fence::{Lock, Token};
    ///
    /// let jobs = Lock::new(Duration::from_secs(30))?;
    /// let token = Token::random()?;
    /// let outcome = match jobs.acquire_as(conn, "job:42", &token).await {
    ///     Err(e) if !e.is_definite() => jobs.acquire_as(conn, "job:42", &token).await?,
    ///     other => other?,
    /// };
    /// println!("{outcome:?}");
    /// # Ok(()) }
    /// ```
    pub async fn acquire_as<C>(
        &self,
        conn: &mut C,
        resource: &str,
        token: &Token,
    ) -> Result<LockAttempt>
    where
        C: ConnectionLike + Send,
    {
        let op = AcquireLock::build(self, resource, token)?;
        if self.wait.timeout.is_zero() {
            return self.attempt(conn, &op).await;
        }
        retry::wait_for(conn, self, &op, None).await
    }

    /// [`Lock::acquire`], then keep the grant renewed every `ttl / 3` in a
    /// background task on `conn` ([`Lease`]).
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`], and [`Error::NoTimer`] (the renewals need a
    /// runtime with timers), before any I/O.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::fence::{Lock, LockAttempt};
    ///
    /// let reindex = Lock::new(Duration::from_secs(10))?;
    /// let LockAttempt::Acquired(lease) = reindex.lease(conn.clone(), "reindex").await? else {
    ///     return Ok(()); // someone else is reindexing
    /// };
    /// tokio::select! {
    ///     _ = rebuild(lease.fence().as_i64()) => {}
    ///     loss = lease.lost() => eprintln!("stopped reindexing: {loss}"),
    /// }
    /// lease.release().await?;
    /// # Ok(()) }
    /// # async fn rebuild(_fence: i64) {}
    /// ```
    pub async fn lease<C>(&self, mut conn: C, resource: &str) -> Result<LockAttempt<Lease>>
    where
        C: ConnectionLike + Send + 'static,
    {
        // The renewals sleep: refuse before taking a lock nobody would renew.
        crate::timer::check()?;
        Ok(match self.acquire(&mut conn, resource).await? {
            LockAttempt::Acquired(grant) => LockAttempt::Acquired(Lease::start(conn, grant)?),
            LockAttempt::Held { expires_in } => LockAttempt::Held { expires_in },
        })
    }

    /// Run `work` under a renewed lease on `resource` ([`Lock::lease`]),
    /// then release it.
    ///
    /// `work` gets the grant's [`Fence`]: pass it to every write the lock
    /// protects ([`Fence::write`], or `fence.as_i64()` in a conditional SQL
    /// write). The answer says what became of the hold, in its type
    /// ([`Work`]): [`Work::Done`] when the lease was held from start to end;
    /// [`Work::Overran`] when the work finished but the lease had ended
    /// first (a stall past the TTL: another holder may have run meanwhile,
    /// and only the fence checks tell whether the writes landed first);
    /// [`Work::Stopped`] when the lease was lost while the work ran (its
    /// future is dropped at that moment; work it spawned keeps running: use
    /// [`Lease::cancellation_token`] for that); [`Work::Busy`] when the lock
    /// stayed held by someone else for the whole wait.
    ///
    /// # Errors
    ///
    /// As [`Lock::lease`].
    ///
    /// # Example
    ///
    /// ```
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("REDIS_URL") else { return Ok(()) };
    /// # let conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
    /// # let account = format!("doc-balance:{}", std::process::id());
    /// use std::time::Duration;
    /// use nolock::fence::{self, Lock};
    /// use nolock::{Backoff, Work};
    ///
    /// let balances = Lock::new(Duration::from_secs(5))?.with_wait(Backoff::new(Duration::from_secs(1)));
    /// let mut writer = conn.clone();
    /// let outcome = balances
    ///     .with_lease(conn.clone(), &account, |fence| async move {
    ///         fence.write(&mut writer, "1700").await
    ///     })
    ///     .await?;
    /// match outcome {
    ///     Work::Done(write) => assert!(write?.is_applied()),
    ///     other => println!("not written under a held lease: {:?}", other.loss()),
    /// }
    /// let stored = fence::read(&mut conn.clone(), &account).await?.expect("written");
    /// assert_eq!(stored.value, b"1700");
    /// # Ok(()) }
    /// ```
    pub async fn with_lease<C, F, Fut, T>(
        &self,
        conn: C,
        resource: &str,
        work: F,
    ) -> Result<Work<T>>
    where
        C: ConnectionLike + Send + 'static,
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = match self.lease(conn, resource).await? {
            LockAttempt::Acquired(lease) => lease,
            LockAttempt::Held { .. } => return Ok(Work::Busy),
        };
        Ok(lease.run(work).await)
    }
}

/// [`Lock::acquire_as`]'s single attempt as a value: for a
/// [`crate::Batch`] (many resources in one round trip), or run again with
/// the same token after a lost reply. Its grant's deadline counts from when
/// the value was built.
#[derive(Debug, Clone)]
pub struct AcquireLock {
    call: Invocation,
    keys: Keys,
    resource: String,
    token: Token,
    ttl: Duration,
    built: Instant,
    fences: FenceSource,
    /// A fair waiter's "leave" call ([`Lock::fair`]).
    leave: Option<Box<Invocation>>,
    /// A fair waiter's place in line as its last attempt answered (1 =
    /// first; 0 = not in line), shared by the attempts it resends.
    place: Option<Arc<AtomicU64>>,
}

impl AcquireLock {
    /// One attempt at `resource` under a fresh random token.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`] and [`Error::Entropy`], before any I/O; and
    /// [`Error::InvalidArgument`] for an acknowledged lock
    /// ([`Lock::acknowledged`]), whose grants only its own acquires confirm:
    /// a value run in a batch would hand out a grant no replica confirmed.
    pub fn new(lock: &Lock, resource: &str) -> Result<Self> {
        Keys::of(resource)?;
        AcquireLock::with_token(lock, resource, &Token::random()?)
    }

    /// One attempt at `resource` under `token`.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`], before any I/O; [`Error::InvalidArgument`] for
    /// an acknowledged lock, as [`AcquireLock::new`].
    pub fn with_token(lock: &Lock, resource: &str, token: &Token) -> Result<Self> {
        if lock.ack.is_some() {
            return Err(crate::Error::InvalidArgument {
                what: "lock",
                reason: "an acknowledged lock's grants are confirmed only by its own acquire \
                         (Lock::acquire, acquire_as, lease, with_lease), not as an operation value"
                    .to_owned(),
            });
        }
        AcquireLock::build(lock, resource, token)
    }

    /// [`AcquireLock::with_token`] for the lock's own acquires, which
    /// confirm acknowledged grants themselves.
    pub(super) fn build(lock: &Lock, resource: &str, token: &Token) -> Result<Self> {
        AcquireLock::build_waiting(lock, resource, token, None)
    }

    /// [`AcquireLock::build`] for a waiter of [`super::Waiters`] that sleeps
    /// at most `sleep_ms` between attempts: each attempt that finds the lock
    /// held keeps the resource's waiting flag at least that long, so that a
    /// release meanwhile is announced.
    pub(super) fn build_waiting(
        lock: &Lock,
        resource: &str,
        token: &Token,
        sleep_ms: Option<u64>,
    ) -> Result<Self> {
        if lock.fair {
            return AcquireLock::build_fair(lock, resource, token);
        }
        let keys = Keys::of(resource)?;
        let ttl_ms = millis(lock.ttl)?;
        let slot = slot_counter(crate::keys::slot(&keys.lock));
        let (script, mut names): (_, Vec<&str>) = match lock.fences {
            FenceSource::PerResource => (&ACQUIRE, vec![&keys.lock, &keys.fence]),
            FenceSource::PerSlot => (&ACQUIRE_SLOT, vec![&keys.lock, slot, &keys.fence]),
        };
        if sleep_ms.is_some() {
            names.push(&keys.waiting);
        }
        let mut call = Invocation::new(script, &names)
            .arg(token.as_str())
            .arg(ttl_ms);
        if let Some(ms) = sleep_ms {
            call = call.arg(ms);
        }
        Ok(AcquireLock {
            call,
            keys,
            resource: resource.to_owned(),
            token: token.clone(),
            ttl: lock.ttl,
            built: Instant::now(),
            fences: lock.fences,
            leave: None,
            place: None,
        })
    }

    /// A fair lock's attempt (`fence/acquire_fair`): joins the line when
    /// the lock waits, tries without joining when it does not.
    fn build_fair(lock: &Lock, resource: &str, token: &Token) -> Result<Self> {
        let keys = Keys::fair(resource)?;
        let ttl_ms = millis(lock.ttl)?;
        let life_ms = millis(lock.ticket_life())?;
        let slot = slot_counter(crate::keys::slot(&keys.lock));
        let (call, leave) = {
            let line = keys.line.as_deref().map_or(["", ""], |l| [&l[0], &l[1]]);
            let names: Vec<&str> = match lock.fences {
                FenceSource::PerResource => vec![&keys.lock, line[0], line[1], &keys.fence],
                FenceSource::PerSlot => vec![&keys.lock, line[0], line[1], slot, &keys.fence],
            };
            let joins = !lock.wait.timeout.is_zero();
            let call = Invocation::new(&ACQUIRE_FAIR, &names)
                .arg(token.as_str())
                .arg(ttl_ms)
                .arg(if joins { "join" } else { "try" });
            if joins {
                let leave = Invocation::new(&ACQUIRE_FAIR, &names)
                    .arg(token.as_str())
                    .arg(ttl_ms)
                    .arg("leave");
                (call.arg(life_ms), Some(Box::new(leave)))
            } else {
                (call, None)
            }
        };
        Ok(AcquireLock {
            call,
            keys,
            resource: resource.to_owned(),
            token: token.clone(),
            ttl: lock.ttl,
            built: Instant::now(),
            fences: lock.fences,
            place: leave.as_ref().map(|_| Arc::default()),
            leave,
        })
    }

    /// A fair waiter's way out of the line (`None` for other attempts):
    /// one that gives up leaves at once instead of at its ticket's death.
    pub(super) fn leave(&self) -> Option<LeaveLine> {
        self.leave
            .as_deref()
            .map(|call| LeaveLine { call: call.clone() })
    }

    /// A fair waiter's place in line as its last attempt answered (1 =
    /// first), if it is in one.
    pub(super) fn place_in_line(&self) -> Option<u64> {
        self.place
            .as_ref()
            .map(|place| place.load(Ordering::Relaxed))
            .filter(|&place| place > 0)
    }

    /// The ticket this attempt waits under, if it joins a fair line.
    pub(super) fn ticket(&self) -> Option<&str> {
        self.leave.as_ref().map(|_| self.token.as_str())
    }

    /// The owner token this attempt takes the lock under.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The same attempt, sent again now (its deadline counts from now).
    pub(super) fn resend(&self) -> AcquireLock {
        AcquireLock {
            built: Instant::now(),
            ..self.clone()
        }
    }

    pub(super) fn released_channel(&self) -> &str {
        &self.keys.released
    }
}

impl Operation for AcquireLock {
    type Output = LockAttempt;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<LockAttempt> {
        let script = match (self.keys.line.is_some(), self.fences) {
            (true, _) => &ACQUIRE_FAIR,
            (false, FenceSource::PerResource) => &ACQUIRE,
            (false, FenceSource::PerSlot) => &ACQUIRE_SLOT,
        };
        let mut reply = Reply::new(script.name(), value)?;
        let outcome = if reply.flag()? {
            let number = reply.uint()?;
            LockAttempt::Acquired(Grant::granted(
                self.keys.clone(),
                self.token.clone(),
                self.ttl,
                Fence::granted(&self.resource, number).with_source(self.fences),
                self.built,
            ))
        } else {
            let expires_in = u64::try_from(reply.int()?).ok().map(Duration::from_millis);
            if self.keys.line.is_some() {
                let position = reply.uint()?;
                if let Some(place) = &self.place {
                    place.store(position, Ordering::Relaxed);
                }
            }
            LockAttempt::Held { expires_in }
        };
        reply.finish()?;
        Ok(outcome)
    }
}

/// A fair waiter leaving its line (`fence/acquire_fair`, mode "leave").
#[derive(Debug)]
pub(super) struct LeaveLine {
    call: Invocation,
}

impl Operation for LeaveLine {
    type Output = ();

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<()> {
        let mut reply = Reply::new(ACQUIRE_FAIR.name(), value)?;
        let _ = reply.flag()?;
        let _ = reply.int()?;
        let _ = reply.uint()?;
        reply.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use crate::Error;
    use redis::Value::{Array, BulkString, Int};

    fn lock(ms: u64) -> Lock {
        Lock::new(Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn the_acquire_command_carries_both_keys_the_token_and_the_ttl() {
        let token = Token("t0k".into());
        let lock = Lock::new(Duration::from_micros(1_500_900)).unwrap();
        assert_eq!(lock.ttl(), Duration::from_millis(1500));
        let op = AcquireLock::with_token(&lock, "r", &token).unwrap();
        assert_eq!(
            words(op.invocation().command()),
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
    fn a_waiters_acquire_also_names_the_waiting_flag_and_its_sleep() {
        let token = Token("t0k".into());
        let op = AcquireLock::build_waiting(&lock(1500), "r", &token, Some(502)).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                ACQUIRE.sha1(),
                "3",
                "{r}:lock",
                "{r}:fence",
                "{r}:waiting",
                "t0k",
                "1500",
                "502"
            ]
        );
    }

    #[test]
    fn a_fair_acquire_names_the_line_and_joins_only_when_it_waits() {
        let token = Token("t0k".into());
        let waiting = lock(1500)
            .with_wait(crate::Backoff::new(Duration::from_secs(5)))
            .fair();
        let life = waiting.ticket_life().as_millis().to_string();
        assert_eq!(life, "2002");
        let op = AcquireLock::build_waiting(&waiting, "r", &token, Some(502)).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                ACQUIRE_FAIR.sha1(),
                "4",
                "{r}:lock",
                "{r}:queue",
                "{r}:queue:alive",
                "{r}:fence",
                "t0k",
                "1500",
                "join",
                &life
            ]
        );
        assert_eq!(op.ticket(), Some("t0k"));
        assert_eq!(
            words(op.leave().unwrap().invocation().command())[7..],
            ["t0k", "1500", "leave"]
        );
        // Not waiting: one try, no place in line.
        let once = lock(1500).fair();
        let op = AcquireLock::with_token(&once, "r", &token).unwrap();
        assert_eq!(
            words(op.invocation().command())[7..],
            ["t0k", "1500", "try"]
        );
        assert!(op.leave().is_none() && op.ticket().is_none());
        // Slot fences: the slot counter written, the resource's read.
        let slot = waiting.with_fence_source(FenceSource::PerSlot);
        let op = AcquireLock::with_token(&slot, "r", &token).unwrap();
        let counter = slot_counter(crate::keys::slot("{r}:lock"));
        assert_eq!(
            words(op.invocation().command())[2..8],
            [
                "5",
                "{r}:lock",
                "{r}:queue",
                "{r}:queue:alive",
                counter,
                "{r}:fence"
            ]
        );
        // Held: the PTTL (-2: free, not this ticket's turn) and the place.
        assert_eq!(
            op.decode(Array(vec![Int(0), Int(-2), Int(3)])).unwrap(),
            LockAttempt::Held { expires_in: None }
        );
        assert_eq!(op.place_in_line(), Some(3));
        let _ = op.resend().decode(Array(vec![Int(0), Int(900), Int(1)]));
        assert_eq!(
            op.place_in_line(),
            Some(1),
            "the resent attempts share the place"
        );
        match op
            .decode(Array(vec![Int(1), BulkString(b"7".to_vec())]))
            .unwrap()
        {
            LockAttempt::Acquired(grant) => {
                assert_eq!(grant.fence().number(), 7);
                // Its release names the line, to wake the first in it.
                let release = super::super::ReleaseLock::new(&grant);
                assert_eq!(
                    words(release.invocation().command())[2..7],
                    [
                        "4",
                        "{r}:lock",
                        "{r}:waiting",
                        "{r}:queue",
                        "{r}:queue:alive"
                    ]
                );
                std::mem::forget(grant);
            }
            held => panic!("{held:?}"),
        }
    }

    #[test]
    fn a_slot_fenced_acquire_names_the_slot_counter_and_the_old_counter() {
        let token = Token("t0k".into());
        let slot_lock = lock(1500).with_fence_source(FenceSource::PerSlot);
        let counter = slot_counter(crate::keys::slot("{r}:lock"));
        let op = AcquireLock::with_token(&slot_lock, "r", &token).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                ACQUIRE_SLOT.sha1(),
                "3",
                "{r}:lock",
                counter,
                "{r}:fence",
                "t0k",
                "1500"
            ]
        );
        let op = AcquireLock::build_waiting(&slot_lock, "r", &token, Some(502)).unwrap();
        assert_eq!(
            words(op.invocation().command())[2..7],
            ["4", "{r}:lock", counter, "{r}:fence", "{r}:waiting"]
        );
        let value = Array(vec![Int(1), BulkString(b"12".to_vec())]);
        match op.decode(value).unwrap() {
            LockAttempt::Acquired(grant) => {
                assert_eq!(grant.fence().source(), FenceSource::PerSlot);
                assert_eq!(grant.fence().number(), 12);
            }
            held => panic!("{held:?}"),
        }
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        assert!(matches!(
            Lock::new(Duration::ZERO),
            Err(Error::ZeroDuration { what: "ttl" })
        ));
        assert!(matches!(
            Lock::new(crate::MAX_TTL + Duration::from_millis(1)),
            Err(Error::DurationTooLong { what: "ttl", .. })
        ));
        assert!(matches!(
            AcquireLock::new(&lock(1000), ""),
            Err(Error::EmptyKey)
        ));
    }

    #[test]
    fn fences_decode_exactly_above_2_pow_53() {
        let op = AcquireLock::with_token(&lock(1000), "r", &Token("t".into())).unwrap();
        let value = Array(vec![Int(1), BulkString(b"9007199254740993".to_vec())]);
        match op.decode(value).unwrap() {
            LockAttempt::Acquired(grant) => {
                assert_eq!(grant.fence().number(), (1 << 53) + 1);
                assert_eq!(grant.fence().resource(), "r");
                assert_eq!(
                    grant.deadline(),
                    op.built + Duration::from_secs(1) - Duration::from_millis(12)
                );
            }
            held => panic!("{held:?}"),
        }
        assert_eq!(
            op.decode(Array(vec![Int(0), Int(250)])).unwrap(),
            LockAttempt::Held {
                expires_in: Some(Duration::from_millis(250))
            }
        );
        assert_eq!(
            op.decode(Array(vec![Int(0), Int(-1)])).unwrap(),
            LockAttempt::Held { expires_in: None }
        );
    }
}
