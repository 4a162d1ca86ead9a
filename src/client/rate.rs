//! Named rate limits on a [`Client`]: [`RateLimit`], one limit per id. It
//! takes ids, builds the keys, and answers `Result<Admitted, Rejection>`,
//! so a handler turns a denial away with `?`. Several limits decided
//! together are [`RateLimits`](super::RateLimits) (`rate_limits.rs`).
//!
//! It wraps [`rate::Limiter`]; everything that does stays reachable
//! ([`RateLimit::decide`] hands out the full [`rate::Decision`] with its
//! [`rate::Charge`], for refunds and settlements).

use std::time::Duration;

use std::sync::Arc;
use std::time::SystemTime;

use super::managed::{Current, Managed};
use super::{Admitted, Client, Connection, Limited, Name, Rejection};
use crate::config::{Config, Mode, Registry, Spec};
use crate::rate::{self, Algorithm, Decision, Limiter, Quota};
use crate::{Error, Result};

impl Client {
    /// A rate limit named `name`, admitting `quota` per id, decided with
    /// [`Algorithm::Gcra`] (change it with [`RateLimit::with_algorithm`]),
    /// or with [`Algorithm::Calendar`] for a [`Quota::calendar`].
    /// The name is the policy name of the `RateLimit-Policy` and
    /// `RateLimit` headers, and part of every key (`{nolock:<name>:<id>}`):
    /// two handles with one name share their state, so give each limit its
    /// own name.
    ///
    /// The numbers are a declaration ([`crate::config`]): the handle's
    /// first call stores them under its name unless numbers are stored
    /// already, and the handle decides by the stored ones from then on
    /// (reporting a difference; [`insist`](RateLimit::insist) refuses one).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name: 1 to
    /// [`MAX_NAME_LEN`](super::MAX_NAME_LEN) ASCII letters, digits, `_`,
    /// `-` and `.`, starting with a letter or a digit.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    ///
    /// # async fn run() -> nolock::Result<()> {
    /// let client = nolock::Client::connect("redis://127.0.0.1/").await?;
    /// let per_user = client.rate_limit("per-user", Quota::per_minute(100)?)?;
    /// match per_user.check("alice").await {
    ///     Ok(admitted) => println!("{} left", admitted.remaining),
    ///     Err(rejection) => println!("{rejection}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn rate_limit(&self, name: &str, quota: Quota) -> Result<RateLimit> {
        // A calendar quota is for the calendar algorithm alone.
        let algorithm = match quota.calendar_period() {
            Some(_) => Algorithm::Calendar,
            None => Algorithm::Gcra,
        };
        let name = Name::new(kind(algorithm), name)?;
        let settings = Settings {
            algorithm,
            quota,
            settle_within: None,
            debt_cap: None,
            deny_cache: None,
        };
        RateLimit::build(self.registry(), name, settings, self.connection())
    }
}

/// A named rate limit, one state per id; made by [`Client::rate_limit`].
/// Cheap to clone: clones share the connection (and the local deny cache,
/// when there is one).
///
/// Ids are any text of 1 to [`MAX_ID_LEN`](super::MAX_ID_LEN) bytes (a user
/// id, an API key, an IP address); two different ids never share state.
#[derive(Clone, Debug)]
pub struct RateLimit {
    pub(crate) name: Name,
    /// The limiter of the stored numbers, rebuilt when they change.
    pub(crate) managed: Managed<Limiter>,
    /// The limiter of this process's own numbers (before the first call).
    limiter: Limiter,
    pub(crate) conn: Connection,
    /// What this process built the handle with: its own numbers (declared
    /// when none are stored) and its local settings (kept whatever the
    /// stored numbers).
    settings: Settings,
    registry: Arc<Registry>,
}

/// The kind of handle of a rate limit, in its keys: one per algorithm,
/// since each stores its state its own way.
pub(crate) fn kind(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Gcra => "gcra",
        Algorithm::TokenBucket => "bucket",
        Algorithm::SlidingWindow => "sliding",
        Algorithm::FixedWindow => "fixed",
        Algorithm::Calendar => "calendar",
    }
}

#[derive(Clone, Copy, Debug)]
struct Settings {
    algorithm: Algorithm,
    quota: Quota,
    settle_within: Option<Duration>,
    debt_cap: Option<u64>,
    deny_cache: Option<usize>,
}

impl Settings {
    /// The same local settings with stored numbers.
    fn with_spec(self, spec: &Spec) -> Result<Settings> {
        match spec {
            Spec::RateLimit { algorithm, .. } => Ok(Settings {
                algorithm: *algorithm,
                quota: spec.quota()?,
                ..self
            }),
            other => Err(Error::InvalidArgument {
                what: "spec",
                reason: format!("a rate limit cannot decide by a {} spec", other.family()),
            }),
        }
    }

    fn limiter(&self, name: &Name) -> Result<Limiter> {
        // A handle's numbers change only by a declared change: it adopts
        // the state the numbers before wrote (lua/lib/tag.lua).
        let mut limiter = Limiter::new(self.algorithm, self.quota)?
            .named(name.as_str())?
            .adopting();
        if let Some(within) = self.settle_within {
            limiter = limiter.settle_within(within)?;
        }
        if let Some(units) = self.debt_cap {
            limiter = limiter.with_debt_cap(units);
        }
        if let Some(capacity) = self.deny_cache {
            limiter = limiter.with_local_deny_cache(capacity);
        }
        Ok(limiter)
    }
}

impl RateLimit {
    fn build(
        registry: Arc<Registry>,
        name: Name,
        settings: Settings,
        conn: Connection,
    ) -> Result<RateLimit> {
        let limiter = settings.limiter(&name)?;
        Ok(RateLimit::assemble(registry, name, settings, limiter, conn))
    }

    fn assemble(
        registry: Arc<Registry>,
        name: Name,
        settings: Settings,
        limiter: Limiter,
        conn: Connection,
    ) -> RateLimit {
        let own = Spec::rate_limit(settings.algorithm, settings.quota);
        let managed = Managed::new(
            Arc::clone(&registry),
            name.clone(),
            own,
            move |config, name| {
                let settings = settings.with_spec(&config.spec)?;
                let name = name.with_kind(kind(settings.algorithm));
                Ok((settings.limiter(&name)?, name))
            },
        );
        RateLimit {
            name,
            limiter,
            managed,
            conn,
            settings,
            registry,
        }
    }

    fn rebuild(self, settings: Settings) -> Result<RateLimit> {
        let name = self.name.with_kind(kind(settings.algorithm));
        RateLimit::build(self.registry, name, settings, self.conn)
    }

    /// Declares this handle's numbers now, at startup, and refuses to run
    /// by others: when the server holds other numbers under its name, the
    /// answer is [`Error::ConfigMismatch`] (without `insist`, the handle
    /// decides by the stored numbers and reports the difference; see
    /// [`crate::config`]).
    ///
    /// # Errors
    ///
    /// [`Error::ConfigMismatch`]; [`Error::ForeignConfig`] when the
    /// registry holds something nolock did not write; errors from Redis.
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let api = client.rate_limit("api", Quota::per_minute(100)?)?;
    /// api.insist().await?; // fails at startup if "api" is stored with other numbers
    /// # Ok(()) }
    /// ```
    pub async fn insist(&self) -> Result<Config> {
        self.managed.insist().await
    }

    /// The stored configuration this handle decides by (declared from its
    /// own numbers on the first call).
    ///
    /// # Errors
    ///
    /// As [`RateLimit::insist`], without the mismatch.
    pub async fn config(&self) -> Result<Config> {
        self.managed.config().await
    }

    /// The same limit, decided by `algorithm` (see [`rate`]'s "Choosing an
    /// algorithm"). Keeps the settle deadline, debt cap and deny cache set
    /// so far. Each algorithm keeps its state under keys of its own (the
    /// algorithm is part of the key), so changing it starts every id afresh
    /// and never reads another algorithm's state.
    ///
    /// # Errors
    ///
    /// As [`Limiter::new`]: a window algorithm refuses a quota whose burst
    /// differs from its rate.
    ///
    /// ```no_run
    /// use nolock::rate::{Algorithm, Quota};
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let hourly = client
    ///     .rate_limit("hourly", Quota::per_hour(1000)?)?
    ///     .with_algorithm(Algorithm::SlidingWindow)?;
    /// # let _ = hourly;
    /// # Ok(()) }
    /// ```
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<RateLimit> {
        let settings = Settings {
            algorithm,
            ..self.settings
        };
        // Another algorithm reads the state differently: another key.
        self.rebuild(settings)
    }

    /// The same limit, whose charges can be settled for `within` after
    /// their check ([`Limiter::settle_within`]; default an hour).
    ///
    /// # Errors
    ///
    /// As [`Limiter::settle_within`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let tokens = client
    ///     .rate_limit("tokens", Quota::per_minute(100_000)?)?
    ///     .settle_within(Duration::from_secs(600))?;
    /// # let _ = tokens;
    /// # Ok(()) }
    /// ```
    pub fn settle_within(self, within: Duration) -> Result<RateLimit> {
        let settings = Settings {
            settle_within: Some(within),
            ..self.settings
        };
        self.rebuild(settings)
    }

    /// The same limit, with a cap on the debt a settlement may leave
    /// ([`Limiter::with_debt_cap`]; default no cap).
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let tokens = client
    ///     .rate_limit("tokens", Quota::per_minute(100_000)?)?
    ///     .with_debt_cap(100_000);
    /// # let _ = tokens;
    /// # Ok(()) }
    /// ```
    pub fn with_debt_cap(self, units: u64) -> RateLimit {
        let settings = Settings {
            debt_cap: Some(units),
            ..self.settings
        };
        let limiter = self.limiter.with_debt_cap(units);
        RateLimit::assemble(self.registry, self.name, settings, limiter, self.conn)
    }

    /// The same limit, remembering up to `capacity` recent denials in this
    /// process, so a client far above its quota costs Redis about one call
    /// per admission ([`Limiter::with_local_deny_cache`]: it never admits,
    /// and never outlives the server's answer). Clones share the cache.
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let api = client
    ///     .rate_limit("api", Quota::per_second(10)?)?
    ///     .with_local_deny_cache(10_000);
    /// # let _ = api;
    /// # Ok(()) }
    /// ```
    pub fn with_local_deny_cache(self, capacity: usize) -> RateLimit {
        let settings = Settings {
            deny_cache: Some(capacity),
            ..self.settings
        };
        let limiter = self.limiter.with_local_deny_cache(capacity);
        RateLimit::assemble(self.registry, self.name, settings, limiter, self.conn)
    }

    /// Take one unit for `id` if it fits. See [`RateLimit::check_cost`].
    ///
    /// # Errors
    ///
    /// As [`RateLimit::check_cost`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(per_user: nolock::client::RateLimit) -> Result<(), nolock::client::Rejection> {
    /// let admitted = per_user.check("alice").await?;
    /// for (name, value) in admitted.headers().iter() {
    ///     println!("{name}: {value}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, id: &str) -> Result<Admitted, Rejection> {
        self.check_cost(id, 1).await
    }

    /// Take `cost` units for `id` if they fit; a denied call takes nothing.
    /// One round trip, decided by the server's clock.
    ///
    /// # Errors
    ///
    /// [`Rejection::Limited`] when the units do not fit now, with
    /// `retry_after`; when `cost` is above the burst it never fits, and
    /// `retry_after` is `None` (the state is read, read-only, for the
    /// headers). [`Rejection::Failed`] with [`Error::InvalidArgument`] (an
    /// empty or too long id), [`Error::ZeroLimit`] (`cost` 0) or
    /// [`Error::OutOfRange`] (`cost` above 2^53 - 1) before any I/O; with
    /// [`Error::Redis`] or [`Error::Indeterminate`] from Redis (see
    /// [`Limiter::check`]).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(uploads: nolock::client::RateLimit) -> Result<(), nolock::client::Rejection> {
    /// // A batch of 20 items costs 20.
    /// let admitted = uploads.check_cost("tenant-7", 20).await?;
    /// # let _ = admitted;
    /// # Ok(()) }
    /// ```
    pub async fn check_cost(&self, id: &str, cost: u64) -> Result<Admitted, Rejection> {
        checked(id, cost)?;
        let current = self.managed.current().await?;
        let limiter = &current.engine;
        let key = current.name.key(id)?;
        if let Some(decision) = switched(&current, cost)? {
            return answer(&decision, limiter.headers(&decision));
        }
        let mut conn = self.conn.clone();
        match limiter.check(&mut conn, &key, cost).await {
            Ok(decision) => answer(&decision, limiter.headers(&decision)),
            Err(Error::InsufficientCapacity { .. }) => {
                let state = limiter.peek(&mut conn, &key, 1).await?;
                Err(never_fits(state, limiter.headers(&state)))
            }
            Err(err) => Err(Rejection::Failed(err)),
        }
    }

    /// What a check of one unit for `id` would answer now, without taking
    /// anything: `remaining` is what is left *before* a check. Read-only
    /// (`EVALSHA_RO`: a replica can serve it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad id, before any I/O;
    /// [`Error::Redis`] and [`Error::Indeterminate`] from Redis (safe to
    /// retry).
    ///
    /// ```no_run
    /// # async fn run(per_user: nolock::client::RateLimit) -> nolock::Result<()> {
    /// let now = per_user.peek("alice").await?;
    /// println!("{} of {} left, full again in {:?}", now.remaining, now.limit, now.reset_after);
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, id: &str) -> Result<rate::RateLimit> {
        super::check_id(id)?;
        let current = self.managed.current().await?;
        let key = current.name.key(id)?;
        current.engine.peek(&mut self.conn.clone(), &key, 1).await
    }

    /// Forget the state of `id`: its limit is full again, and the charges
    /// taken before lose their power to refund or settle
    /// ([`Limiter::reset`]). Idempotent.
    ///
    /// # Errors
    ///
    /// As [`RateLimit::peek`].
    ///
    /// ```no_run
    /// # async fn run(per_user: nolock::client::RateLimit) -> nolock::Result<()> {
    /// per_user.reset("alice").await?; // e.g. after a plan upgrade
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, id: &str) -> Result<()> {
        super::check_id(id)?;
        let current = self.managed.current().await?;
        let key = current.name.key(id)?;
        current.engine.reset(&mut self.conn.clone(), &key).await
    }

    /// [`RateLimit::check_cost`] with the whole [`Decision`]: an admission
    /// carries the [`rate::Charge`] that can give units back
    /// ([`rate::Charge::refund`]) or settle the real cost later
    /// ([`rate::Charge::settle`]). [`RateLimit::answer`] turns it into the
    /// handle's answer, headers included.
    ///
    /// # Errors
    ///
    /// Those of [`Limiter::check`] (a cost above the burst is
    /// [`Error::InsufficientCapacity`] here), and [`Error::InvalidArgument`]
    /// for a bad id.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(per_user: nolock::client::RateLimit) -> Result<(), nolock::client::Rejection> {
    /// let mut decision = per_user.decide("alice", 1).await?;
    /// let admitted = per_user.answer(&decision)?; // Limited → Err, as `check`
    /// if let Some(charge) = decision.charge_mut() {
    ///     // The work failed before it started: give the unit back.
    ///     let back = charge.refund(&mut per_user.connection(), 1).await?;
    ///     assert!(back.credited <= 1);
    /// }
    /// # let _ = admitted;
    /// # Ok(()) }
    /// ```
    pub async fn decide(&self, id: &str, cost: u64) -> Result<Decision> {
        checked(id, cost)?;
        let current = self.managed.current().await?;
        let key = current.name.key(id)?;
        if let Some(decision) = switched(&current, cost)? {
            return Ok(Decision::uncharged(decision));
        }
        current
            .engine
            .check(&mut self.conn.clone(), &key, cost)
            .await
    }

    /// The handle's answer for a decision of this limit: [`Admitted`], or
    /// [`Rejection::Limited`], with this limit's headers.
    ///
    /// # Errors
    ///
    /// [`Rejection::Limited`] when the decision did not admit.
    ///
    /// ```no_run
    /// # async fn run(per_user: nolock::client::RateLimit) -> Result<(), nolock::client::Rejection> {
    /// let decision = per_user.decide("alice", 1).await?;
    /// let admitted = per_user.answer(&decision)?;
    /// # let _ = admitted;
    /// # Ok(()) }
    /// ```
    pub fn answer(&self, decision: &rate::RateLimit) -> Result<Admitted, Rejection> {
        answer(decision, self.limiter().headers(decision))
    }

    /// The handle's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The limiter underneath, for the operation-level API
    /// ([`rate::Check`] values in a [`crate::Batch`],
    /// [`Limiter::check_at_most`], [`Limiter::until_ready`]) on the keys of
    /// [`RateLimit::key`].
    pub fn limiter(&self) -> Limiter {
        match self.managed.latest() {
            Some(current) => current.engine.clone(),
            None => self.limiter.clone(),
        }
    }

    /// The connection the handle uses (a clone), for the operation-level
    /// API: refunds and settlements of the charges [`RateLimit::decide`]
    /// hands out.
    pub fn connection(&self) -> Connection {
        self.conn.clone()
    }

    /// The Redis key that holds the state of `id`:
    /// `{nolock:<name>:<id>}`, the id escaped (see [`super`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty or too long id.
    ///
    /// ```no_run
    /// # fn run(per_user: nolock::client::RateLimit) -> nolock::Result<()> {
    /// assert_eq!(per_user.key("a}b")?, format!("{{nolock:gcra:{}:a%7Db}}", per_user.name()));
    /// # Ok(()) }
    /// ```
    pub fn key(&self, id: &str) -> Result<String> {
        match self.managed.latest() {
            Some(current) => current.name.key(id),
            None => self.name.key(id),
        }
    }
}

/// Checks an id and a cost before anything is sent (the first call of a
/// handle reads the registry).
fn checked(id: &str, cost: u64) -> Result<()> {
    super::check_id(id)?;
    crate::validate::positive("cost", cost)?;
    if cost > crate::MAX_INTEGER {
        return Err(Error::OutOfRange {
            what: "cost",
            given: cost,
            max: crate::MAX_INTEGER,
        });
    }
    Ok(())
}

/// The answer of an operator's switch ([`Mode`]), decided without Redis:
/// `None` when the numbers decide.
pub(crate) fn switched(current: &Current<Limiter>, cost: u64) -> Result<Option<rate::RateLimit>> {
    let limit = current.engine.quota().burst();
    let (allowed, remaining) = match current.mode() {
        Mode::Normal => return Ok(None),
        Mode::Blocked => (false, 0),
        Mode::Unlimited => {
            crate::observe::unlimited("rate-limit", current.name.as_str());
            (true, limit)
        }
    };
    crate::validate::positive("cost", cost)?;
    Ok(Some(rate::RateLimit {
        allowed,
        limit,
        remaining,
        retry_after: None,
        reset_after: Duration::ZERO,
        at: SystemTime::now(),
        debt: 0,
        period_end: None,
    }))
}

/// The admitted or limited answer of a decision, with its headers.
pub(super) fn answer(
    decision: &rate::RateLimit,
    headers: rate::Headers,
) -> Result<Admitted, Rejection> {
    if decision.allowed {
        Ok(Admitted {
            limit: decision.limit,
            remaining: decision.remaining,
            reset_after: decision.reset_after,
            headers,
        })
    } else {
        Err(Rejection::Limited(Limited {
            limit: decision.limit,
            retry_after: decision.retry_after,
            reset_after: decision.reset_after,
            headers,
        }))
    }
}

/// The answer to a cost above the burst: limited for good, so no
/// `Retry-After`; the rest of the headers describe the limit's state.
pub(super) fn never_fits(state: rate::RateLimit, mut headers: rate::Headers) -> Rejection {
    headers.retry_after = None;
    Rejection::Limited(Limited {
        limit: state.limit,
        retry_after: None,
        reset_after: state.reset_after,
        headers,
    })
}
