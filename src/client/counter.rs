//! [`Counter`]: a named bounded counter, "at most `limit` per `window`" for
//! each id, built from a [`Client`]. It is [`crate::limits::Counter`] with
//! the connection and the keys taken care of.

use std::time::Duration;

use super::managed::Managed;
use super::{Admitted, Client, Connection, Limited, Name, Rejection};
use crate::config::{Config, Mode, Spec};
use crate::limits::{self, Admission, CounterUsage};
use crate::Result;

/// A named bounded counter: each id may be counted at most `limit` times per
/// `window`, a fixed window that starts with the id's first admitted
/// increment (see [`crate::limits`] for what a fixed window allows at its
/// boundary). Made by [`Client::counter`]; cheap to clone, and clones share
/// the client's connection.
///
/// The state of the id `alice` on the counter named `api` is one key,
/// `{nolock:counter:api:alice}`, holding the count tagged with the numbers
/// that wrote it (`c100x60000:42`, [`crate::limits`]); the counter's name is
/// also the policy name in its headers. After a `Keep` change of the stored
/// numbers ([`crate::config`]) the handle takes each id's count over and
/// tags it with the new numbers at its next increment.
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::client::Rejection;
///
/// # async fn run() -> nolock::Result<()> {
/// let client = nolock::Client::connect("redis://127.0.0.1/").await?;
/// let api = client.counter("api", 100, Duration::from_secs(60))?; // once, at startup
/// match api.increment("alice").await {
///     Ok(admitted) => println!("200 OK, {} left", admitted.remaining),
///     Err(Rejection::Limited(limited)) => {
///         println!("429, retry in {:?}", limited.retry_after);
///     }
///     Err(failed) => println!("503: {failed}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Counter {
    name: Name,
    /// The counter of the stored numbers, rebuilt when they change.
    managed: Managed<limits::Counter>,
    /// This process's own numbers.
    counter: limits::Counter,
    conn: Connection,
}

impl Client {
    /// A bounded counter named `name`: at most `limit` per `window`
    /// (millisecond precision) for each id. Nothing is sent to Redis.
    ///
    /// The numbers are a declaration ([`crate::config`]): the handle's
    /// first call stores them under its name unless numbers are stored
    /// already, and the handle decides by the stored ones from then on
    /// (reporting a difference; [`insist`](Counter::insist) refuses one).
    ///
    /// # Errors
    ///
    /// [`crate::Error::InvalidArgument`] for a bad name (see
    /// [`Client`]'s rules: 1 to 64 bytes of ASCII letters, digits, `_`, `-`
    /// and `.`, starting with a letter or a digit); those of
    /// [`limits::Counter::new`] ([`crate::Error::ZeroLimit`],
    /// [`crate::Error::OutOfRange`], [`crate::Error::ZeroDuration`],
    /// [`crate::Error::DurationTooLong`]).
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn run() -> nolock::Result<()> {
    /// let client = nolock::Client::connect("redis://127.0.0.1/").await?;
    /// let api = client.counter("api", 100, Duration::from_secs(60))?;
    /// assert!(client.counter("api", 0, Duration::from_secs(60)).is_err());
    /// assert!(client.counter("a b", 100, Duration::from_secs(60)).is_err());
    /// # let _ = api;
    /// # Ok(()) }
    /// ```
    pub fn counter(&self, name: &str, limit: u64, window: Duration) -> Result<Counter> {
        let name = Name::new("counter", name)?;
        let counter = limits::Counter::new(limit, window)?.named(name.as_str())?;
        let own = Spec::counter(counter.limit(), counter.window());
        let managed = Managed::new(
            self.registry(),
            name.clone(),
            own,
            |config, name| match &config.spec {
                Spec::Counter { limit, window_ms } => {
                    // Adopting: the stored numbers changed on purpose, so
                    // the counts the numbers before wrote are taken over.
                    let counter = limits::Counter::new(*limit, Duration::from_millis(*window_ms))?
                        .named(name.as_str())?
                        .adopting();
                    Ok((counter, name))
                }
                other => Err(crate::Error::InvalidArgument {
                    what: "spec",
                    reason: format!("a counter cannot decide by a {} spec", other.family()),
                }),
            },
        );
        Ok(Counter {
            name,
            managed,
            counter,
            conn: self.connection(),
        })
    }
}

impl Counter {
    /// The counter's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The most admitted per window, for each id.
    pub fn limit(&self) -> u64 {
        self.managed
            .latest()
            .map_or(self.counter.limit(), |c| c.engine.limit())
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.managed
            .latest()
            .map_or(self.counter.window(), |c| c.engine.window())
    }

    /// Declares this handle's numbers now and refuses to run by others, as
    /// [`RateLimit::insist`](super::RateLimit::insist).
    ///
    /// # Errors
    ///
    /// [`crate::Error::ConfigMismatch`] when other numbers are stored under
    /// the name; [`crate::Error::ForeignConfig`]; errors from Redis.
    pub async fn insist(&self) -> Result<Config> {
        self.managed.insist().await
    }

    /// The stored configuration this handle decides by.
    ///
    /// # Errors
    ///
    /// As [`Counter::insist`], without the mismatch.
    pub async fn config(&self) -> Result<Config> {
        self.managed.config().await
    }

    /// Count 1 for `id` if that keeps it at most the limit in this window.
    /// A denied call counts nothing. One round trip.
    ///
    /// # Errors
    ///
    /// [`Rejection::Limited`] when the id's window is full: its
    /// `retry_after` is the time until the window resets (a denied
    /// increment fits again only in the next window), and its headers carry
    /// `Retry-After` rounded up. [`Rejection::Failed`] with
    /// [`crate::Error::InvalidArgument`] for an empty id or one above
    /// [`super::MAX_ID_LEN`] bytes (before any I/O), and with the errors of
    /// [`limits::Counter::try_increment`] from Redis
    /// ([`crate::Error::Indeterminate`]: the increment may have been
    /// counted; it is not retried).
    ///
    /// ```no_run
    /// # async fn run(api: nolock::client::Counter) -> Result<(), nolock::client::Rejection> {
    /// let admitted = api.increment("alice").await?;
    /// for (name, value) in admitted.headers().iter() {
    ///     println!("{name}: {value}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn increment(&self, id: &str) -> std::result::Result<Admitted, Rejection> {
        self.increment_by(id, 1).await
    }

    /// Count `n` for `id` if that keeps it at most the limit in this window;
    /// all or nothing.
    ///
    /// # Errors
    ///
    /// As [`Counter::increment`]; before any I/O also
    /// [`Rejection::Failed`] with [`crate::Error::ZeroLimit`] (`n` is 0) or
    /// [`crate::Error::InsufficientCapacity`] (`n` is above the limit: it
    /// could never be admitted, which is different from "not now").
    ///
    /// ```no_run
    /// # async fn run(api: nolock::client::Counter) -> Result<(), nolock::client::Rejection> {
    /// let batch = api.increment_by("alice", 20).await?; // a batch of 20 costs 20
    /// assert!(batch.remaining <= batch.limit - 20);
    /// # Ok(()) }
    /// ```
    pub async fn increment_by(&self, id: &str, n: u64) -> std::result::Result<Admitted, Rejection> {
        super::check_id(id)?;
        crate::validate::positive("n", n)?;
        let current = self.managed.current().await?;
        let counter = &current.engine;
        let key = current.name.key(id)?;
        let limit = counter.limit();
        let switched = |admitted: bool| Admission {
            admitted,
            count: if admitted { 0 } else { limit },
            limit,
            remaining: if admitted { limit } else { 0 },
            reset_after: Some(Duration::ZERO),
        };
        let admission = match current.mode() {
            Mode::Normal => {
                let op = limits::TryIncrement::by(counter, &key, n)?;
                let mut conn = self.conn.clone();
                crate::script::run_one(&op, &mut conn).await?
            }
            Mode::Blocked => {
                let headers = counter.headers(&switched(false));
                return Err(Rejection::Limited(Limited {
                    limit,
                    retry_after: None,
                    reset_after: Duration::ZERO,
                    headers,
                }));
            }
            Mode::Unlimited => {
                crate::validate::positive("n", n)?;
                self.managed.count_unlimited();
                switched(true)
            }
        };
        let headers = counter.headers(&admission);
        // nolock's scripts never leave a counter without expiry; were one
        // found, it would be "no window to wait for".
        let reset_after = admission.reset_after.unwrap_or_default();
        if admission.admitted {
            Ok(Admitted {
                limit: admission.limit,
                remaining: admission.remaining,
                reset_after,
                headers,
            })
        } else {
            Err(Rejection::Limited(Limited {
                limit: admission.limit,
                retry_after: Some(reset_after),
                reset_after,
                headers,
            }))
        }
    }

    /// Read the count of `id` and the time left in its window, without
    /// changing it ([`limits::Counter::peek`]: `EVALSHA_RO`, which a cluster
    /// connection with a replica read strategy may send to a replica).
    ///
    /// # Errors
    ///
    /// [`crate::Error::InvalidArgument`] for an empty or too long id, before
    /// any I/O; those of [`limits::peek`] from Redis. A read is safe to retry.
    ///
    /// ```no_run
    /// # async fn run(api: nolock::client::Counter) -> nolock::Result<()> {
    /// let usage = api.peek("alice").await?;
    /// println!("{} left", usage.remaining(api.limit()));
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, id: &str) -> Result<CounterUsage> {
        super::check_id(id)?;
        let current = self.managed.current().await?;
        let key = current.name.key(id)?;
        let mut conn = self.conn.clone();
        current.engine.peek(&mut conn, &key).await
    }
}
