//! [`Lock`]: a named lock with fences, on the client's connection, taking
//! ids ([`Client::lock`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::managed::Managed;
use super::{Client, Connection, Name};
use crate::config::{Config, Mode, Registry, Spec};
use crate::fence::{self, Advance, AdvanceAttempt, Fence, Fenced, Lease, LockAttempt, Write};
use crate::{Backoff, Error, Result, Work};

/// "One holder at a time per id, with a fence": a named [`fence::Lock`] on
/// the client's connection. Made by [`Client::lock`]; cheap to clone (it
/// shares the client's connection).
///
/// Every call takes an **id** (a tenant, a job, an account: any text of 1 to
/// [`super::MAX_ID_LEN`] bytes) and never a connection or a Redis key: the
/// lock of id `acme` in the lock named `payouts` lives under
/// `{nolock:lock:payouts:acme}` (see [the client's key layout](super#keys)), so
/// two ids never share a lock and a lock's keys share one cluster slot.
/// Holds are [`Lease`]s, renewed in the background every `ttl / 3` until
/// they are released or dropped, and told when they are lost.
///
/// What the fence is for, and when a lease alone is enough, is in
/// [`crate::fence`]. In short: pass [`Fence::as_i64`] to every conditional
/// write the lock protects (`UPDATE ... WHERE fence <= $n`), or write the
/// protected value in Redis with [`Lock::write`].
///
/// ```no_run
/// # async fn run(client: nolock::Client) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::Work;
///
/// let reports = client.lock("reports", Duration::from_secs(30))?;
/// match reports.with_lease("daily", |fence| async move { build(fence.as_i64()).await }).await? {
///     Work::Done(()) => println!("built"),
///     Work::Busy => println!("another replica is building it"),
///     lost => println!("the lease was lost: {:?}", lost.loss()),
/// }
/// # Ok(()) }
/// # async fn build(_fence: i64) {}
/// ```
#[derive(Clone, Debug)]
pub struct Lock {
    conn: Connection,
    name: Name,
    /// This process's own TTL and settings.
    lock: fence::Lock,
    /// The lock of the stored TTL, rebuilt when it changes.
    managed: Managed<fence::Lock>,
    registry: Arc<Registry>,
}

impl Client {
    /// The lock named `name`, whose holds expire `ttl` after they were taken
    /// or last renewed (a [`Lease`] renews every `ttl / 3`). An acquire
    /// makes one attempt; see [`Lock::with_wait`].
    ///
    /// Every process that locks the same ids should build it with the same
    /// name and TTL (other kinds of handle under the same name keep keys of
    /// their own).
    ///
    /// The numbers are a declaration ([`crate::config`]): the handle's
    /// first call stores them under its name unless numbers are stored
    /// already, and the handle decides by the stored ones from then on
    /// (reporting a difference; [`insist`](Lock::insist) refuses one).
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::InvalidArgument`] for a name that is not 1
    /// to [`super::MAX_NAME_LEN`] bytes of ASCII letters, digits, `_`, `-`
    /// and `.`, starting with a letter or a digit; [`Error::ZeroDuration`]
    /// (`ttl` under 1 ms) and [`Error::DurationTooLong`] (above
    /// [`crate::MAX_TTL`]).
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let payouts = client.lock("payouts", Duration::from_secs(10))?;
    /// assert_eq!(payouts.ttl(), Duration::from_secs(10));
    /// assert!(client.lock("pay outs", Duration::from_secs(10)).is_err());
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, name: &str, ttl: Duration) -> Result<Lock> {
        Ok(Lock::build(
            self.registry(),
            Name::new("lock", name)?,
            fence::Lock::new(ttl)?,
            self.connection(),
        ))
    }
}

impl Lock {
    fn build(registry: Arc<Registry>, name: Name, lock: fence::Lock, conn: Connection) -> Lock {
        let local = lock.clone();
        let own = Spec::lock(lock.ttl());
        let managed = Managed::new(
            Arc::clone(&registry),
            name.clone(),
            own,
            move |config, name| match &config.spec {
                Spec::Lock { ttl_ms } => {
                    Ok((local.with_ttl(Duration::from_millis(*ttl_ms))?, name))
                }
                other => Err(Error::InvalidArgument {
                    what: "spec",
                    reason: format!("a lock cannot decide by a {} spec", other.family()),
                }),
            },
        );
        Lock {
            conn,
            name,
            lock,
            managed,
            registry,
        }
    }

    /// The lock of the stored TTL; a blocked name refuses here (a lock is
    /// never unlimited: [`crate::config::Configs::unlimit`] refuses it).
    async fn current(&self) -> Result<fence::Lock> {
        let current = self.managed.current().await?;
        match current.mode() {
            Mode::Normal => Ok(current.engine.clone()),
            _ => Err(self.managed.blocked()),
        }
    }

    /// Declares this handle's TTL now and refuses to run by another, as
    /// [`RateLimit::insist`](super::RateLimit::insist).
    ///
    /// # Errors
    ///
    /// [`Error::ConfigMismatch`] when another TTL is stored under the name;
    /// [`Error::ForeignConfig`]; errors from Redis.
    pub async fn insist(&self) -> Result<Config> {
        self.managed.insist().await
    }

    /// The stored configuration this handle decides by.
    ///
    /// # Errors
    ///
    /// As [`Lock::insist`], without the mismatch.
    pub async fn config(&self) -> Result<Config> {
        self.managed.config().await
    }

    /// The same lock, whose acquires wait while the id is held, with `wait`:
    /// jittered exponential sleeps, never past the holder's expiry, until
    /// `wait.timeout` after the first attempt.
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::Backoff;
    /// let payouts = client
    ///     .lock("payouts", Duration::from_secs(10))?
    ///     .with_wait(Backoff::new(Duration::from_secs(2)));
    /// # let _ = payouts;
    /// # Ok(()) }
    /// ```
    pub fn with_wait(self, wait: Backoff) -> Lock {
        let lock = self.lock.with_wait(wait);
        Lock::build(self.registry, self.name, lock, self.conn)
    }

    /// The same lock, whose grants count only once `replicas` replicas
    /// have confirmed them within `timeout` (`WAIT`, in the acquire's round
    /// trip): a failover to a replica cannot hand the same fence out again.
    ///
    /// **It needs a replica.** On a server with fewer than `replicas`
    /// replicas connected (a development server has none) every acquire
    /// fails, after about `timeout`, with [`Error::Unacknowledged`], and the
    /// grant it took is released at once: nothing stays held. Build the
    /// lock without it where no replica runs, and with it where the
    /// primary has `replicas` replicas (see [`fence::Lock::acknowledged`]
    /// for what it costs and what it still cannot cover).
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`replicas` 0) and [`Error::ZeroDuration`]
    /// (`timeout` under 1 ms).
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// // Production, one replica per primary:
    /// let payouts = client
    ///     .lock("payouts", Duration::from_secs(10))?
    ///     .acknowledged(1, Duration::from_millis(100))?;
    /// assert_eq!(payouts.replicas(), Some(1));
    /// # Ok(()) }
    /// ```
    pub fn acknowledged(self, replicas: u64, timeout: Duration) -> Result<Lock> {
        let lock = self.lock.acknowledged(replicas, timeout)?;
        Ok(Lock::build(self.registry, self.name, lock, self.conn))
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The TTL each grant and each renewal sets, in whole milliseconds.
    pub fn ttl(&self) -> Duration {
        self.managed
            .latest()
            .map_or(self.lock.ttl(), |c| c.engine.ttl())
    }

    /// How many replicas confirm each grant ([`Lock::acknowledged`]).
    pub fn replicas(&self) -> Option<u64> {
        self.lock.replicas()
    }

    /// Take the lock of `id` if it is free (waiting as [`Lock::with_wait`]
    /// says), with the next fence, and keep it renewed until the [`Lease`]
    /// is released ([`Lease::release`], no connection needed) or dropped.
    ///
    /// A held lock is not an error: [`LockAttempt::Held`] says how long it
    /// stays held, and nothing was written.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::InvalidArgument`] (an id of 0 or more than
    /// [`super::MAX_ID_LEN`] bytes), [`Error::NoTimer`] (the renewals need a
    /// Tokio runtime with timers), [`Error::Entropy`]. From Redis: as
    /// [`fence::Lock::acquire`], and [`Error::Unacknowledged`] for an
    /// acknowledged lock whose grant no replica confirmed.
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::fence::LockAttempt;
    ///
    /// let reindex = client.lock("reindex", Duration::from_secs(10))?;
    /// let LockAttempt::Acquired(lease) = reindex.acquire("catalog").await? else {
    ///     return Ok(()); // another replica is reindexing
    /// };
    /// tokio::select! {
    ///     _ = rebuild(lease.fence().as_i64()) => {}
    ///     loss = lease.lost() => eprintln!("stopped: {loss}"),
    /// }
    /// let _ = lease.release().await?;
    /// # Ok(()) }
    /// # async fn rebuild(_fence: i64) {}
    /// ```
    pub async fn acquire(&self, id: &str) -> Result<LockAttempt<Lease>> {
        let resource = self.name.key(id)?;
        let lock = self.current().await?;
        lock.lease(self.conn.clone(), &resource).await
    }

    /// Run `work` under a renewed lease on `id`, then release it.
    ///
    /// `work` gets the grant's [`Fence`]: `fence.as_i64()` for a
    /// conditional SQL write, or [`Lock::write`] for a value kept in Redis.
    /// The answer says what became of the hold ([`Work`]): [`Work::Done`]
    /// when the lease was held from start to end; [`Work::Overran`] when the
    /// work finished after the lease had ended; [`Work::Stopped`] when the
    /// lease was lost while the work ran (its future is dropped at that
    /// moment; only the fence checks say whether what it wrote landed
    /// first); [`Work::Busy`] when the id stayed held for the whole wait.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`].
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client, db: &tokio_postgres::Client)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use nolock::Work;
    ///
    /// let payouts = client.lock("payouts", Duration::from_secs(10))?;
    /// let paid = payouts
    ///     .with_lease("tenant-7", |fence| async move {
    ///         db.execute(
    ///             "UPDATE payouts SET paid = true, fence = $1 WHERE tenant = 7 AND fence <= $1",
    ///             &[&fence.as_i64()],
    ///         )
    ///         .await
    ///     })
    ///     .await?;
    /// if let Work::Done(rows) = paid {
    ///     println!("{} row(s) paid", rows?);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn with_lease<F, Fut, T>(&self, id: &str, work: F) -> Result<Work<T>>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = T>,
    {
        let resource = self.name.key(id)?;
        let lock = self.current().await?;
        lock.with_lease(self.conn.clone(), &resource, work).await
    }

    /// Store `value` as the protected value of the fence's id, only under
    /// the newest grant of its lock ([`Fence::write`], on the lock's
    /// connection): [`Write::Applied`], or [`Write::Stale`] once a newer
    /// grant exists (a holder paused past its lease cannot write), or
    /// [`Write::NotGranted`].
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::InvalidArgument`] when `fence` was not
    /// granted by a lock of this name; [`Error::ValueTooLarge`]. From Redis:
    /// as [`Fence::write`].
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::Work;
    ///
    /// let balances = client.lock("balances", Duration::from_secs(5))?;
    /// let writer = balances.clone();
    /// let out = balances
    ///     .with_lease("acct-9", |fence| async move { writer.write(&fence, "1700").await })
    ///     .await?;
    /// if let Work::Done(write) = out {
    ///     assert!(write?.is_applied());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, fence: &Fence, value: impl AsRef<[u8]>) -> Result<Write> {
        self.check_own(fence)?;
        fence.write(&mut self.conn.clone(), value).await
    }

    /// The value [`Lock::write`] stored for `id`, with the fence that wrote
    /// it; `None` when nothing was written.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad id, before any I/O; from Redis,
    /// as [`fence::read`].
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let balances = client.lock("balances", Duration::from_secs(5))?;
    /// if let Some(stored) = balances.read("acct-9").await? {
    ///     println!("{:?} written under fence {}", stored.value, stored.fence);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn read(&self, id: &str) -> Result<Option<Fenced>> {
        let resource = self.name.key(id)?;
        fence::read(&mut self.conn.clone(), &resource).await
    }

    /// Raise the fence counter of `id` above `floor` (the highest fence
    /// the protected resource has seen), **unless the lock is held**: the
    /// startup step every replica of a fleet may run, which never turns a
    /// live holder's work stale. [`AdvanceAttempt::Advanced`] says the
    /// counter is above `floor`; [`AdvanceAttempt::Held`] that a holder
    /// exists and nothing was written. See [`fence::advance`] for exactly
    /// what each answer lets you assume.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::InvalidArgument`] (bad id),
    /// [`Error::ZeroLimit`] (`floor` 0), [`Error::OutOfRange`] (`floor` at
    /// or above `i64::MAX`). From Redis: as [`fence::advance`].
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client, highest_seen: u64) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::fence::AdvanceAttempt;
    ///
    /// let payouts = client.lock("payouts", Duration::from_secs(10))?;
    /// match payouts.advance("tenant-7", highest_seen).await? {
    ///     AdvanceAttempt::Advanced(_) => {}
    ///     // A live holder took the newest grant; the next one is above the floor.
    ///     AdvanceAttempt::Held { counter, .. } if counter >= highest_seen => {}
    ///     // The counter went back: the holder's fence is below the floor.
    ///     AdvanceAttempt::Held { .. } => {
    ///         let _ = payouts.force_advance("tenant-7", highest_seen).await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn advance(&self, id: &str, floor: u64) -> Result<AdvanceAttempt> {
        let resource = self.name.key(id)?;
        fence::advance(&mut self.conn.clone(), &resource, floor).await
    }

    /// Raise the fence counter of `id` above `floor` **whether or not the
    /// lock is held** ([`fence::force_advance`]): the operator's recovery
    /// step after the counter went back. A live holder's Redis-side writes
    /// are refused from then on. Do not run it from every replica at
    /// startup: use [`Lock::advance`].
    ///
    /// # Errors
    ///
    /// As [`Lock::advance`].
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let payouts = client.lock("payouts", Duration::from_secs(10))?;
    /// let advanced = payouts.force_advance("tenant-7", 1041).await?;
    /// assert!(advanced.counter > 1041);
    /// # Ok(()) }
    /// ```
    pub async fn force_advance(&self, id: &str, floor: u64) -> Result<Advance> {
        let resource = self.name.key(id)?;
        fence::force_advance(&mut self.conn.clone(), &resource, floor).await
    }

    /// [`Error::InvalidArgument`] unless `fence` was granted by a lock of
    /// this name (its resource is one of this name's keys).
    fn check_own(&self, fence: &Fence) -> Result<()> {
        if self.name.owns(fence.resource()) {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            what: "fence",
            reason: format!(
                "the fence was granted on {:?}, not by the lock named {:?}",
                fence.resource(),
                self.name.as_str()
            ),
        })
    }
}
