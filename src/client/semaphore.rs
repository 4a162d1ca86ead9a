//! [`Semaphore`]: a named semaphore on the client's connection, taking ids
//! ([`Client::semaphore`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::managed::{Current, Managed};
use super::{Client, Connection, Name};
use crate::config::{Config, Mode, Registry, Spec};
use crate::semaphore::{self, PermitAttempt, PermitId, PermitLease, SemaphoreUsage, MAX_PERMITS};
use crate::{Backoff, Error, Result, Work};

/// "At most `permits` holders at once per id": a named
/// [`semaphore::Semaphore`] on the client's connection. Made by
/// [`Client::semaphore`]; cheap to clone.
///
/// Every call takes an **id** (a tenant, a downstream service: any text of
/// 1 to [`super::MAX_ID_LEN`] bytes), never a connection or a Redis key: the
/// semaphore of id `acme` in the one named `exports` lives under
/// `{nolock:semaphore:exports:acme}` (see [the client's key layout](super#keys)), so
/// two ids never share permits. Permits are [`PermitLease`]s, renewed in
/// the background every `ttl / 3` until released or dropped, and told when
/// they are lost.
///
/// ```no_run
/// # async fn run(client: nolock::Client) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::Work;
///
/// let exports = client.semaphore("exports", 3, Duration::from_secs(30))?;
/// match exports.with_permit("tenant-7", |_| async { export().await }).await? {
///     Work::Done(()) => {}
///     Work::Busy => println!("3 exports of tenant-7 are running; try later"),
///     lost => println!("the permit was lost: {:?}", lost.loss()),
/// }
/// # Ok(()) }
/// # async fn export() {}
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    conn: Connection,
    name: Name,
    /// This process's own numbers and settings.
    semaphore: semaphore::Semaphore,
    /// The semaphore of the stored numbers, rebuilt when they change.
    managed: Managed<semaphore::Semaphore>,
    registry: Arc<Registry>,
}

impl Client {
    /// The semaphore named `name`: at most `permits` holders at once per
    /// id, each permit expiring `ttl` after it was granted or last renewed.
    /// An acquire makes one attempt; see [`Semaphore::with_wait`].
    ///
    /// Every process that uses the same ids should build it with the same
    /// name, size and TTL (other kinds of handle under the same name keep
    /// keys of their own).
    ///
    /// The numbers are a declaration ([`crate::config`]): the handle's
    /// first call stores them under its name unless numbers are stored
    /// already, and the handle decides by the stored ones from then on
    /// (reporting a difference; [`insist`](Semaphore::insist) refuses one).
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::InvalidArgument`] for a bad name (see
    /// [`Client::lock`]); [`Error::ZeroLimit`] and [`Error::OutOfRange`]
    /// (`permits` 0 or above [`semaphore::MAX_PERMITS`]);
    /// [`Error::ZeroDuration`] and [`Error::DurationTooLong`] (`ttl` under
    /// 1 ms or above [`semaphore::MAX_PERMIT_TTL`]).
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let exports = client.semaphore("exports", 3, Duration::from_secs(30))?;
    /// assert_eq!(exports.permits(), 3);
    /// assert!(client.semaphore("exports", 0, Duration::from_secs(30)).is_err());
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: &str, permits: u64, ttl: Duration) -> Result<Semaphore> {
        Ok(Semaphore::build(
            self.registry(),
            Name::new("semaphore", name)?,
            semaphore::Semaphore::new(permits, ttl)?,
            self.connection(),
        ))
    }
}

impl Semaphore {
    fn build(
        registry: Arc<Registry>,
        name: Name,
        semaphore: semaphore::Semaphore,
        conn: Connection,
    ) -> Semaphore {
        let own = Spec::semaphore(semaphore.permits(), semaphore.ttl());
        let local = semaphore.clone();
        let managed = Managed::new(
            Arc::clone(&registry),
            name.clone(),
            own,
            move |config, name| {
                match (&config.spec, config.mode) {
                    // Unlimited: every acquire is granted, and still counted
                    // as a holder (peek and inspect show them).
                    // The semaphore then tags its state with MAX_PERMITS
                    // (adopting: the holders stay, and a later size
                    // adopts it back).
                    (Spec::Semaphore { ttl_ms, .. }, Mode::Unlimited) => Ok((
                        local
                            .with_numbers(MAX_PERMITS, Duration::from_millis(*ttl_ms))?
                            .adopting(),
                        name,
                    )),
                    // Adopting: a stored size changed with `Keep` reads the
                    // holders of the old one and retags the set.
                    (Spec::Semaphore { permits, ttl_ms }, _) => Ok((
                        local
                            .with_numbers(*permits, Duration::from_millis(*ttl_ms))?
                            .adopting(),
                        name,
                    )),
                    (other, _) => Err(Error::InvalidArgument {
                        what: "spec",
                        reason: format!("a semaphore cannot decide by a {} spec", other.family()),
                    }),
                }
            },
        );
        Semaphore {
            conn,
            name,
            semaphore,
            managed,
            registry,
        }
    }

    /// What decides now; a blocked name refuses here.
    async fn current(&self) -> Result<Arc<Current<semaphore::Semaphore>>> {
        let current = self.managed.current().await?;
        match current.mode() {
            Mode::Blocked => Err(self.managed.blocked()),
            Mode::Unlimited => {
                self.managed.count_unlimited();
                Ok(current)
            }
            Mode::Normal => Ok(current),
        }
    }

    /// Declares this handle's numbers now and refuses to run by others, as
    /// [`RateLimit::insist`](super::RateLimit::insist).
    ///
    /// # Errors
    ///
    /// [`Error::ConfigMismatch`] when other numbers are stored under the
    /// name; [`Error::ForeignConfig`]; errors from Redis.
    pub async fn insist(&self) -> Result<Config> {
        self.managed.insist().await
    }

    /// The stored configuration this handle decides by.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::insist`], without the mismatch.
    pub async fn config(&self) -> Result<Config> {
        self.managed.config().await
    }

    /// The same semaphore, whose acquires wait while it is full, with
    /// `wait`, until `wait.timeout` after the first attempt.
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::Backoff;
    /// let exports = client
    ///     .semaphore("exports", 3, Duration::from_secs(30))?
    ///     .with_wait(Backoff::new(Duration::from_secs(5)));
    /// # let _ = exports;
    /// # Ok(()) }
    /// ```
    pub fn with_wait(self, wait: Backoff) -> Semaphore {
        let semaphore = self.semaphore.with_wait(wait);
        Semaphore::build(self.registry, self.name, semaphore, self.conn)
    }

    /// The same semaphore, whose permits count only once `replicas`
    /// replicas have confirmed them within `timeout` (`WAIT`, in the
    /// acquire's round trip).
    ///
    /// **It needs a replica.** On a server with fewer than `replicas`
    /// replicas connected (a development server has none) every acquire
    /// fails, after about `timeout`, with [`Error::PermitUnacknowledged`],
    /// and the permit it took is given back at once. See
    /// [`semaphore::Semaphore::acknowledged`].
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`replicas` 0) and [`Error::ZeroDuration`]
    /// (`timeout` under 1 ms).
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let exports = client
    ///     .semaphore("exports", 3, Duration::from_secs(30))?
    ///     .acknowledged(1, Duration::from_millis(100))?;
    /// assert_eq!(exports.replicas(), Some(1));
    /// # Ok(()) }
    /// ```
    pub fn acknowledged(self, replicas: u64, timeout: Duration) -> Result<Semaphore> {
        let semaphore = self.semaphore.acknowledged(replicas, timeout)?;
        Ok(Semaphore::build(
            self.registry,
            self.name,
            semaphore,
            self.conn,
        ))
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// How many holders one id admits at once.
    pub fn permits(&self) -> u64 {
        self.managed
            .latest()
            .map_or(self.semaphore.permits(), |c| c.engine.permits())
    }

    /// The TTL each permit and each renewal sets.
    pub fn ttl(&self) -> Duration {
        self.managed
            .latest()
            .map_or(self.semaphore.ttl(), |c| c.engine.ttl())
    }

    /// How many replicas confirm each permit ([`Semaphore::acknowledged`]).
    pub fn replicas(&self) -> Option<u64> {
        self.semaphore.replicas()
    }

    /// Take one permit of `id` if one is free (waiting as
    /// [`Semaphore::with_wait`] says), and keep it renewed until the
    /// [`PermitLease`] is released ([`PermitLease::release`], no connection
    /// needed) or dropped. A full semaphore is not an error:
    /// [`PermitAttempt::Full`] says when a permit surely comes back.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::InvalidArgument`] (an id of 0 or more than
    /// [`super::MAX_ID_LEN`] bytes), [`Error::NoTimer`], [`Error::Entropy`].
    /// From Redis: as [`semaphore::Semaphore::acquire`], and
    /// [`Error::PermitUnacknowledged`] for an acknowledged semaphore.
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::semaphore::PermitAttempt;
    ///
    /// let exports = client.semaphore("exports", 3, Duration::from_secs(30))?;
    /// match exports.acquire("tenant-7").await? {
    ///     PermitAttempt::Acquired(permit) => {
    ///         // ... export ...
    ///         let _ = permit.release().await?;
    ///     }
    ///     PermitAttempt::Full { retry_after, .. } => println!("full; retry in {retry_after:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, id: &str) -> Result<PermitAttempt<PermitLease>> {
        super::check_id(id)?;
        let current = self.current().await?;
        let key = current.name.key(id)?;
        current.engine.lease(self.conn.clone(), &key).await
    }

    /// Run `work` under a renewed permit of `id`, then give it back. `work`
    /// gets the holder's [`PermitId`]. The answer says what became of the
    /// hold ([`Work`]): [`Work::Done`], [`Work::Overran`] (the permit had
    /// expired before the work finished: it may have run beside one holder
    /// too many), [`Work::Stopped`] (lost while running; the future is
    /// dropped then), [`Work::Busy`] (no permit within the wait).
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`].
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let exports = client.semaphore("exports", 3, Duration::from_secs(30))?;
    /// let out = exports.with_permit("tenant-7", |_| async { 42 }).await?;
    /// println!("{:?}", out.done());
    /// # Ok(()) }
    /// ```
    pub async fn with_permit<F, Fut, T>(&self, id: &str, work: F) -> Result<Work<T>>
    where
        F: FnOnce(PermitId) -> Fut,
        Fut: Future<Output = T>,
    {
        super::check_id(id)?;
        let current = self.current().await?;
        let key = current.name.key(id)?;
        current
            .engine
            .with_permit(self.conn.clone(), &key, work)
            .await
    }

    /// Permits in use, holders and the next expiry of `id`; writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad id, before any I/O; from Redis,
    /// as [`semaphore::Semaphore::peek`].
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let exports = client.semaphore("exports", 3, Duration::from_secs(30))?;
    /// let usage = exports.peek("tenant-7").await?;
    /// println!("{} of 3 in use", usage.in_use);
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, id: &str) -> Result<SemaphoreUsage> {
        super::check_id(id)?;
        let current = self.managed.current().await?;
        let key = current.name.key(id)?;
        current.engine.peek(&mut self.conn.clone(), &key).await
    }
}
