//! Limits that live on the server: every named handle of a
//! [`Client`](crate::Client) (a rate limit, several rate limits decided
//! together, a counter, a semaphore, a lock) keeps its numbers in a registry
//! in Redis, so that every process decides by the same numbers, an operator
//! can list and change them at run time, and a switch can block a name or
//! let it through.
//!
//! # How it works
//!
//! * **Declared by the first process.** A handle's first call stores the
//!   numbers it was built with under its name, unless the name is already
//!   stored; then it decides by the stored numbers. A process built with
//!   other numbers reports it (a `tracing` warning and the metric
//!   `nolock_config_differs_total`), or, when it asks with
//!   [`insist`](crate::client::RateLimit::insist) at startup, gets
//!   [`Error::ConfigMismatch`]. Never a silent disagreement.
//! * **Changed at run time.** [`Configs::set`] stores new numbers, keeping
//!   every id's current state ([`Change::Keep`]) or starting every id afresh
//!   ([`Change::Reset`]); [`Configs::block`], [`Configs::unlimit`] and
//!   [`Configs::unblock`] switch a name off or on.
//! * **Learned by polling one key.** Every write to the registry takes the
//!   next number of one epoch key. Each [`Client`](crate::Client) reads that
//!   key every 250 ms ([`Client::config_poll`](crate::Client::config_poll))
//!   and reads the registry again only when it moved; a handle rebuilds its
//!   limiter once per change. A decision reads the cached numbers: no round
//!   trip on the hot path. So every process decides by new numbers at most
//!   one poll interval plus one registry read after the change returned
//!   (measured by `examples/config_change.rs`, see the README).
//!
//! # Why a poll and not a check in every script
//!
//! On Redis Cluster the registry is one hash, on one slot, and a script that
//! decides for an id runs on that id's slot: it cannot read the registry.
//! The numbers therefore travel with the call, as before, and the registry
//! decides which numbers a process sends. Between a change and the next
//! poll a process may still send the old numbers; that window is the bound
//! the README gives.
//!
//! # What "keep" keeps
//!
//! [`Change::Keep`] leaves every id's stored state as it is and decides it
//! by the new numbers from then on:
//!
//! * GCRA and the token bucket keep the time at which the id is full again
//!   (the TAT; the bucket's full-at time): the *time* the used units take to
//!   drain is kept, so the used fraction of the burst is kept when the
//!   period (burst × interval) is unchanged, and an id in debt stays in
//!   debt for the same time.
//! * The fixed and sliding windows keep the count of the current (and the
//!   previous) window; the new limit applies to it.
//! * A counter keeps its count and its window's end; the new window applies
//!   from the next window.
//! * A semaphore keeps its holders; the new size applies to the next
//!   acquire (holders above a smaller size keep their permits until they
//!   release them or they expire: nothing is taken back).
//! * A lock keeps its holder and fence; the new TTL applies from the next
//!   acquire or renewal.
//!
//! [`Change::Reset`] (rate limits and counters only) starts a new
//! *generation*: every id's key gets the generation in its name, so every id
//! starts full, at once, without a scan; the old keys expire by themselves.
//! A semaphore or a lock cannot be reset: their holders would keep running
//! on the old keys.
//!
//! # Example
//!
//! ```no_run
//! use nolock::config::{Change, Spec};
//! use nolock::rate::Quota;
//!
//! # async fn run() -> nolock::Result<()> {
//! let client = nolock::Client::connect("redis://127.0.0.1/").await?;
//! let api = client.rate_limit("api", Quota::per_minute(100)?)?;
//! api.check("alice").await.ok(); // declares "api" at 100/min if it was not stored
//!
//! // An operator raises it, keeping what every user used so far.
//! let configs = client.configs();
//! let spec = Spec::rate_limit(nolock::rate::Algorithm::Gcra, Quota::per_minute(200)?);
//! configs.set("api", spec, Change::Keep).await?;
//! for config in configs.list().await? {
//!     println!("{} {} {}", config.family, config.name, config.spec);
//! }
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;
use serde::{Deserialize, Serialize};

use crate::client::Connection;
use crate::rate::{Algorithm, Quota};
use crate::script::{embedded, Invocation, Script};
use crate::{Error, Result};

/// The registry: one hash, one field per named configuration.
pub const REGISTRY_KEY: &str = "{nolock:config}";
/// The registry's epoch: the number of the latest write to the registry.
pub const EPOCH_KEY: &str = "{nolock:config}:epoch";
/// How often a [`Client`](crate::Client) reads the epoch by default.
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);

static PUT: Script = embedded!("config/put");
static READ: Script = embedded!("config/read");

/// The kind of handle a configuration is for. A name is unique within a
/// family: a rate limit and a counter may both be called `api`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// [`client::RateLimit`](crate::client::RateLimit).
    RateLimit,
    /// [`client::RateLimits`](crate::client::RateLimits).
    RateLimits,
    /// [`client::Counter`](crate::client::Counter).
    Counter,
    /// [`client::Semaphore`](crate::client::Semaphore).
    Semaphore,
    /// [`client::Lock`](crate::client::Lock).
    Lock,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 5] = [
        Family::RateLimit,
        Family::RateLimits,
        Family::Counter,
        Family::Semaphore,
        Family::Lock,
    ];

    /// Its name in the registry and on the command line: `rate-limit`,
    /// `rate-limits`, `counter`, `semaphore`, `lock`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Family::RateLimit => "rate-limit",
            Family::RateLimits => "rate-limits",
            Family::Counter => "counter",
            Family::Semaphore => "semaphore",
            Family::Lock => "lock",
        }
    }

    /// Whether [`Change::Reset`] applies (rate limits and counters).
    pub const fn can_reset(self) -> bool {
        matches!(
            self,
            Family::RateLimit | Family::RateLimits | Family::Counter
        )
    }

    /// Whether [`Mode::Unlimited`] applies: every family but locks (a lock
    /// that lets everyone in is no lock).
    pub const fn can_unlimit(self) -> bool {
        !matches!(self, Family::Lock)
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Family {
    type Err = Error;

    fn from_str(s: &str) -> Result<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| Error::InvalidArgument {
                what: "family",
                reason: format!("{s:?}: one of rate-limit, rate-limits, counter, semaphore, lock"),
            })
    }
}

/// Whether a limit of a [`Spec::RateLimits`] is kept per member or per
/// scope (see [`client::Scope`](crate::client::Scope)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    /// One state per member of a scope (a user of a tenant).
    Member,
    /// One state per scope, shared by its members (a tenant).
    Scope,
}

/// One limit of a [`Spec::RateLimits`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSpec {
    /// The limit's name (the policy name of its headers).
    pub name: String,
    /// Per member or per scope.
    pub per: Per,
    /// Units per period.
    pub rate: u64,
    /// The period, in milliseconds.
    pub period_ms: u64,
    /// The burst.
    pub burst: u64,
}

impl LimitSpec {
    /// The limit's quota.
    ///
    /// # Errors
    ///
    /// Those of [`Quota::per`] and [`Quota::with_burst`].
    pub fn quota(&self) -> Result<Quota> {
        Quota::per(self.rate, Duration::from_millis(self.period_ms))?.with_burst(self.burst)
    }
}

/// The numbers of one named handle, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Spec {
    /// A [`client::RateLimit`](crate::client::RateLimit).
    RateLimit {
        /// How it decides.
        algorithm: Algorithm,
        /// Units per period.
        rate: u64,
        /// The period, in milliseconds.
        period_ms: u64,
        /// The burst.
        burst: u64,
    },
    /// A [`client::RateLimits`](crate::client::RateLimits).
    RateLimits {
        /// How every limit decides.
        algorithm: Algorithm,
        /// The limits, in order.
        limits: Vec<LimitSpec>,
    },
    /// A [`client::Counter`](crate::client::Counter).
    Counter {
        /// At most this many per window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// A [`client::Semaphore`](crate::client::Semaphore).
    Semaphore {
        /// Permits per id.
        permits: u64,
        /// A permit's time to live, in milliseconds.
        ttl_ms: u64,
    },
    /// A [`client::Lock`](crate::client::Lock).
    Lock {
        /// A lease's time to live, in milliseconds.
        ttl_ms: u64,
    },
}

impl Spec {
    /// A rate limit's numbers.
    pub fn rate_limit(algorithm: Algorithm, quota: Quota) -> Spec {
        Spec::RateLimit {
            algorithm,
            rate: quota.rate(),
            period_ms: quota.period().as_millis() as u64,
            burst: quota.burst(),
        }
    }

    /// A counter's numbers (the window in whole milliseconds).
    pub fn counter(limit: u64, window: Duration) -> Spec {
        Spec::Counter {
            limit,
            window_ms: window.as_millis() as u64,
        }
    }

    /// A semaphore's numbers.
    pub fn semaphore(permits: u64, ttl: Duration) -> Spec {
        Spec::Semaphore {
            permits,
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    /// A lock's numbers.
    pub fn lock(ttl: Duration) -> Spec {
        Spec::Lock {
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    /// The family these numbers are for.
    pub fn family(&self) -> Family {
        match self {
            Spec::RateLimit { .. } => Family::RateLimit,
            Spec::RateLimits { .. } => Family::RateLimits,
            Spec::Counter { .. } => Family::Counter,
            Spec::Semaphore { .. } => Family::Semaphore,
            Spec::Lock { .. } => Family::Lock,
        }
    }

    /// A rate limit's quota.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for another family; those of
    /// [`Quota::per`] and [`Quota::with_burst`].
    pub fn quota(&self) -> Result<Quota> {
        match self {
            Spec::RateLimit {
                rate,
                period_ms,
                burst,
                ..
            } => Quota::per(*rate, Duration::from_millis(*period_ms))?.with_burst(*burst),
            other => Err(Error::InvalidArgument {
                what: "spec",
                reason: format!("a {} has no quota", other.family()),
            }),
        }
    }

    /// Checks the numbers as the handle would, before anything is written.
    ///
    /// # Errors
    ///
    /// Those of the handle's constructor ([`Quota::per`], [`Limiter::new`]
    /// for a window algorithm whose burst differs from its rate,
    /// [`crate::limits::Counter::new`], [`crate::semaphore::Semaphore::new`],
    /// [`crate::fence::Lock::new`]); [`Error::InvalidArgument`] for a
    /// multi-limit without limits or with two limits of one name.
    ///
    /// [`Limiter::new`]: crate::rate::Limiter::new
    pub fn validate(&self) -> Result<()> {
        match self {
            Spec::RateLimit { algorithm, .. } => {
                crate::rate::Limiter::new(*algorithm, self.quota()?)?;
            }
            Spec::RateLimits { algorithm, limits } => {
                if limits.is_empty() {
                    return Err(Error::InvalidArgument {
                        what: "spec",
                        reason: "rate limits need at least one limit".into(),
                    });
                }
                // The multi-limiter checks each name and refuses a repeated one.
                let mut multi = crate::rate::MultiLimiter::new(*algorithm);
                for limit in limits {
                    multi = multi.shared_limit(&limit.name, limit.quota()?)?;
                }
            }
            Spec::Counter { limit, window_ms } => {
                crate::limits::Counter::new(*limit, Duration::from_millis(*window_ms))?;
            }
            Spec::Semaphore { permits, ttl_ms } => {
                crate::semaphore::Semaphore::new(*permits, Duration::from_millis(*ttl_ms))?;
            }
            Spec::Lock { ttl_ms } => {
                crate::fence::Lock::new(Duration::from_millis(*ttl_ms))?;
            }
        }
        Ok(())
    }
}

fn millis(ms: u64) -> String {
    let d = Duration::from_millis(ms);
    match ms {
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}min", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{d:?}"),
    }
}

/// `gcra 100/1min burst 100`, `counter 100/1min`, `semaphore 3 ttl 30s`,
/// `lock ttl 10s`.
impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::RateLimit {
                algorithm,
                rate,
                period_ms,
                burst,
            } => write!(f, "{algorithm} {rate}/{} burst {burst}", millis(*period_ms)),
            Spec::RateLimits { algorithm, limits } => {
                write!(f, "{algorithm}")?;
                for (i, l) in limits.iter().enumerate() {
                    let sep = if i == 0 { " " } else { ", " };
                    let per = match l.per {
                        Per::Member => "member",
                        Per::Scope => "scope",
                    };
                    write!(
                        f,
                        "{sep}{} per {per} {}/{} burst {}",
                        l.name,
                        l.rate,
                        millis(l.period_ms),
                        l.burst
                    )?;
                }
                Ok(())
            }
            Spec::Counter { limit, window_ms } => {
                write!(f, "counter {limit}/{}", millis(*window_ms))
            }
            Spec::Semaphore { permits, ttl_ms } => {
                write!(f, "semaphore {permits} ttl {}", millis(*ttl_ms))
            }
            Spec::Lock { ttl_ms } => write!(f, "lock ttl {}", millis(*ttl_ms)),
        }
    }
}

/// A switch an operator sets per name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Decided by the numbers.
    #[default]
    Normal,
    /// Everything is refused, without a call to Redis: a rate limit or a
    /// counter answers [`Rejection::Limited`](crate::client::Rejection)
    /// with no `retry_after`; a semaphore or a lock answers
    /// [`Error::Blocked`].
    Blocked,
    /// Everything is admitted, without a call to Redis, and counted in the
    /// metric `nolock_unlimited_total` (rate limits, counters and
    /// semaphores; never a lock).
    Unlimited,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Normal => "normal",
            Mode::Blocked => "blocked",
            Mode::Unlimited => "unlimited",
        })
    }
}

/// What [`Configs::set`] does to the state every id already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Keep it, and decide it by the new numbers (see the module docs for
    /// what that means per algorithm).
    Keep,
    /// Start every id afresh (rate limits and counters only).
    Reset,
}

/// One named configuration, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    /// Its family.
    pub family: Family,
    /// Its name.
    pub name: String,
    /// Its numbers.
    pub spec: Spec,
    /// Its switch.
    pub mode: Mode,
    /// How many times it was reset ([`Change::Reset`]); part of every key
    /// when above 0.
    pub generation: u64,
    /// The registry epoch of its latest change.
    pub epoch: u64,
    /// When it was last changed, milliseconds since the Unix epoch by the
    /// server's clock.
    pub changed_at_ms: u64,
}

impl Config {
    /// When it was last changed, by the server's clock.
    pub fn changed_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.changed_at_ms)
    }
}

/// What the registry field holds after `<epoch> <ms> `.
#[derive(Serialize, Deserialize)]
struct Body {
    spec: Spec,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    generation: u64,
}

fn field(family: Family, name: &str) -> String {
    format!("{}:{name}", family.as_str())
}

fn foreign(field: &str, reason: impl Into<String>) -> Error {
    Error::ForeignConfig {
        key: REGISTRY_KEY.to_owned(),
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// The registry scripts' refusals of foreign data, as the typed error
/// naming the key (and field) they name.
fn typed(err: Error) -> Error {
    let Error::Redis(redis_err) = &err else {
        return err;
    };
    let text = redis_err.to_string();
    if !text.contains("nolock config/") {
        return err;
    }
    let key = [EPOCH_KEY, REGISTRY_KEY]
        .into_iter()
        .find(|k| text.contains(&format!("key {k} ")));
    let field = text
        .split("field ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("");
    match key {
        Some(key) => Error::ForeignConfig {
            key: key.to_owned(),
            field: field.to_owned(),
            reason: text,
        },
        None => err,
    }
}

/// Reads one registry field's value.
fn parse(field_name: &str, value: &[u8]) -> Result<Config> {
    let text = std::str::from_utf8(value).map_err(|_| foreign(field_name, "not UTF-8"))?;
    let (family, name) = field_name
        .split_once(':')
        .ok_or_else(|| foreign(field_name, "the field is not <family>:<name>"))?;
    let family: Family = family
        .parse()
        .map_err(|_| foreign(field_name, "an unknown family"))?;
    let mut parts = text.splitn(3, ' ');
    let (Some(epoch), Some(ms), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(foreign(field_name, "not \"<epoch> <ms> <body>\""));
    };
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| foreign(field_name, format!("{s:?} is not a number")))
    };
    let (epoch, changed_at_ms) = (number(epoch)?, number(ms)?);
    let body: Body = serde_json::from_str(body)
        .map_err(|e| foreign(field_name, format!("the body does not parse: {e}")))?;
    if body.spec.family() != family {
        return Err(foreign(
            field_name,
            format!("holds a {} spec", body.spec.family()),
        ));
    }
    body.spec
        .validate()
        .map_err(|e| foreign(field_name, format!("bad numbers: {e}")))?;
    Ok(Config {
        family,
        name: name.to_owned(),
        spec: body.spec,
        mode: body.mode,
        generation: body.generation,
        epoch,
        changed_at_ms,
    })
}

/// The registry as a process sees it: a cache of every configuration,
/// refreshed when the epoch moved.
pub(crate) struct Registry {
    conn: Connection,
    entries: RwLock<HashMap<String, Arc<Config>>>,
    /// The epoch the cache reflects; `u64::MAX` before the first read.
    seen: AtomicU64,
    poll: Duration,
    watching: AtomicBool,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("seen", &self.seen.load(Ordering::Relaxed))
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(crate) fn new(conn: Connection, poll: Duration) -> Registry {
        Registry {
            conn,
            entries: RwLock::new(HashMap::new()),
            seen: AtomicU64::new(u64::MAX),
            poll,
            watching: AtomicBool::new(false),
        }
    }

    /// The cached configuration of a field, if any.
    pub(crate) fn cached(&self, field: &str) -> Option<Arc<Config>> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(field)
            .cloned()
    }

    /// Keeps the newer of the cached and `config`.
    fn remember(&self, config: Config) -> Arc<Config> {
        let key = field(config.family, &config.name);
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        match entries.get(&key) {
            Some(old) if old.epoch >= config.epoch => Arc::clone(old),
            _ => {
                let config = Arc::new(config);
                entries.insert(key, Arc::clone(&config));
                config
            }
        }
    }

    async fn put(
        &self,
        field_name: &str,
        body: &Body,
        when: &str,
    ) -> Result<(bool, Option<Config>)> {
        let body = serde_json::to_string(body).map_err(Error::Encode)?;
        let call = Invocation::new(&PUT, &[REGISTRY_KEY, EPOCH_KEY])
            .arg(field_name)
            .arg(body)
            .arg(when);
        let mut conn = self.conn.clone();
        let reply = call.run(&mut conn).await.map_err(typed)?;
        let unexpected = |detail: &str| Error::UnexpectedReply {
            script: PUT.name(),
            detail: detail.to_owned(),
        };
        let Value::Array(items) = reply else {
            return Err(unexpected("not an array"));
        };
        let written = matches!(items.first(), Some(Value::Int(1)));
        let config = match items.get(1) {
            Some(Value::BulkString(v)) => Some(parse(field_name, v)?),
            Some(Value::Nil) | Some(Value::Boolean(false)) | None => None,
            Some(_) => return Err(unexpected("the value is not a string")),
        };
        Ok((written, config))
    }

    /// The stored configuration of `family`/`name`, created from `spec` when
    /// there is none. Starts the watcher.
    pub(crate) async fn declare(
        self: &Arc<Self>,
        family: Family,
        name: &str,
        spec: &Spec,
    ) -> Result<Arc<Config>> {
        self.watch();
        let f = field(family, name);
        let body = Body {
            spec: spec.clone(),
            mode: Mode::Normal,
            generation: 0,
        };
        let (_, config) = self.put(&f, &body, "create").await?;
        let config = config.ok_or_else(|| Error::UnexpectedReply {
            script: PUT.name(),
            detail: "no value after a create".into(),
        })?;
        Ok(self.remember(config))
    }

    /// Reads the epoch, and the registry when it moved: one read-only
    /// script call.
    pub(crate) async fn refresh(&self) -> Result<()> {
        let seen = self.seen.load(Ordering::Acquire);
        let what = if seen == u64::MAX {
            "all".to_owned()
        } else {
            format!("since:{seen}")
        };
        let (epoch, fields) = self.read(&what).await?;
        if epoch == seen {
            return Ok(());
        }
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        for (f, value) in &fields {
            // A foreign field is left out of the cache: the handle of that
            // name declares, and meets the error there.
            if let Ok(config) = parse(f, value) {
                let key = field(config.family, &config.name);
                if entries.get(&key).is_none_or(|old| old.epoch < config.epoch) {
                    entries.insert(key, Arc::new(config));
                }
            }
        }
        self.seen.store(epoch, Ordering::Release);
        Ok(())
    }

    /// The epoch and the fields `what` asks for (see `lua/config/read.lua`).
    async fn read(&self, what: &str) -> Result<(u64, Vec<(String, Vec<u8>)>)> {
        let call = Invocation::new(&READ, &[REGISTRY_KEY, EPOCH_KEY]).arg(what);
        let reply = call.run(&mut self.conn.clone()).await.map_err(typed)?;
        let unexpected = |detail: &str| Error::UnexpectedReply {
            script: READ.name(),
            detail: detail.to_owned(),
        };
        let Value::Array(items) = reply else {
            return Err(unexpected("not an array"));
        };
        let mut items = items.into_iter();
        let epoch = match items.next() {
            Some(Value::Int(e)) if e >= 0 => e as u64,
            _ => return Err(unexpected("no epoch")),
        };
        let mut fields = Vec::new();
        while let Some(f) = items.next() {
            match (f, items.next()) {
                (Value::BulkString(f), Some(Value::BulkString(v))) => {
                    let f = String::from_utf8(f)
                        .map_err(|_| foreign("?", "a field that is not UTF-8"))?;
                    fields.push((f, v));
                }
                _ => return Err(unexpected("fields and values do not pair")),
            }
        }
        Ok((epoch, fields))
    }

    /// Every field of the registry, each parsed or the error naming it.
    async fn read_all(&self) -> Result<Vec<Result<Config>>> {
        let (_, fields) = self.read("all").await?;
        Ok(fields.iter().map(|(f, v)| parse(f, v)).collect())
    }

    /// Starts the task that polls the epoch, once, when a runtime is there.
    fn watch(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.watching.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Registry> = Arc::downgrade(self);
        let poll = self.poll;
        runtime.spawn(async move {
            // A fixed period, whatever a read takes (a late tick is not
            // made up in a burst).
            let mut ticks = tokio::time::interval(poll);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(registry) = weak.upgrade() else {
                    return;
                };
                if let Err(err) = registry.refresh().await {
                    crate::observe::config_poll_failed(&err);
                }
            }
        });
    }
}

/// The registry of named configurations, from [`Client::configs`]: list,
/// read and change them. Cheap to clone.
///
/// [`Client::configs`]: crate::Client::configs
#[derive(Clone, Debug)]
pub struct Configs {
    pub(crate) registry: Arc<Registry>,
}

impl Configs {
    /// Every named configuration, sorted by family and name, read from the
    /// server now.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignConfig`] naming the key and field when the registry
    /// holds something nolock did not write; [`Error::Redis`] and
    /// [`Error::Indeterminate`] from Redis.
    pub async fn list(&self) -> Result<Vec<Config>> {
        let mut all = self
            .registry
            .read_all()
            .await?
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        all.sort_by(|a, b| (a.family, &a.name).cmp(&(b.family, &b.name)));
        Ok(all)
    }

    /// The stored configuration of `family`/`name`, read from the server
    /// now; `None` when no process declared it yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name, before any I/O;
    /// [`Error::ForeignConfig`]; errors from Redis.
    pub async fn get(&self, family: Family, name: &str) -> Result<Option<Config>> {
        crate::client::check_name(name)?;
        let f = field(family, name);
        let (_, fields) = self.registry.read(&format!("field:{f}")).await?;
        fields.first().map(|(_, v)| parse(&f, v)).transpose()
    }

    /// Stores `spec` for `spec.family()`/`name` if nothing is stored, and
    /// answers what is stored (this process's numbers or another's).
    ///
    /// # Errors
    ///
    /// As [`Configs::set`].
    pub async fn declare(&self, name: &str, spec: Spec) -> Result<Config> {
        crate::client::check_name(name)?;
        spec.validate()?;
        let config = self.registry.declare(spec.family(), name, &spec).await?;
        Ok((*config).clone())
    }

    /// Stores new numbers for `spec.family()`/`name` (creating it when
    /// missing), keeping or resetting every id's state. Every process
    /// decides by them within one poll interval (see the module docs). The
    /// switch ([`Mode`]) is kept.
    ///
    /// # Errors
    ///
    /// Before anything is written: [`Error::InvalidArgument`] for a bad
    /// name, for [`Change::Reset`] on a semaphore or a lock; the errors of
    /// [`Spec::validate`]. [`Error::ForeignConfig`] when the stored value is
    /// not nolock's; errors from Redis.
    pub async fn set(&self, name: &str, spec: Spec, change: Change) -> Result<Config> {
        crate::client::check_name(name)?;
        spec.validate()?;
        let family = spec.family();
        if change == Change::Reset && !family.can_reset() {
            return Err(Error::InvalidArgument {
                what: "change",
                reason: format!("a {family} cannot be reset: its holders would keep running"),
            });
        }
        self.update(family, name, |old| {
            let generation = match (old, change) {
                (Some(old), Change::Reset) => old.generation + 1,
                (Some(old), Change::Keep) => old.generation,
                (None, _) => 0,
            };
            Ok(Body {
                spec: spec.clone(),
                mode: old.map_or(Mode::Normal, |o| o.mode),
                generation,
            })
        })
        .await
    }

    /// Refuses everything for `family`/`name` (see [`Mode::Blocked`]).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownConfig`] when nothing is stored under the name;
    /// otherwise as [`Configs::set`].
    pub async fn block(&self, family: Family, name: &str) -> Result<Config> {
        self.switch(family, name, Mode::Blocked).await
    }

    /// Admits everything for `family`/`name` (see [`Mode::Unlimited`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lock; otherwise as
    /// [`Configs::block`].
    pub async fn unlimit(&self, family: Family, name: &str) -> Result<Config> {
        if !family.can_unlimit() {
            return Err(Error::InvalidArgument {
                what: "family",
                reason: "a lock cannot be made unlimited".into(),
            });
        }
        self.switch(family, name, Mode::Unlimited).await
    }

    /// Decides `family`/`name` by its numbers again.
    ///
    /// # Errors
    ///
    /// As [`Configs::block`].
    pub async fn unblock(&self, family: Family, name: &str) -> Result<Config> {
        self.switch(family, name, Mode::Normal).await
    }

    /// Reads the registry now into this client's cache (the poll does it on
    /// its own every interval).
    ///
    /// # Errors
    ///
    /// Errors from Redis.
    pub async fn refresh(&self) -> Result<()> {
        self.registry.refresh().await
    }

    async fn switch(&self, family: Family, name: &str, mode: Mode) -> Result<Config> {
        crate::client::check_name(name)?;
        self.update(family, name, |old| match old {
            None => Err(Error::UnknownConfig {
                family: family.as_str(),
                name: name.to_owned(),
            }),
            Some(old) => Ok(Body {
                spec: old.spec.clone(),
                mode,
                generation: old.generation,
            }),
        })
        .await
    }

    /// Read, change, write when nobody wrote in between; again otherwise.
    async fn update(
        &self,
        family: Family,
        name: &str,
        change: impl Fn(Option<&Config>) -> Result<Body>,
    ) -> Result<Config> {
        let f = field(family, name);
        for _ in 0..16 {
            let old = self.get(family, name).await?;
            let body = change(old.as_ref())?;
            let when = old.as_ref().map_or(0, |o| o.epoch).to_string();
            let (written, config) = self.registry.put(&f, &body, &when).await?;
            if written {
                let config = config.ok_or_else(|| Error::UnexpectedReply {
                    script: PUT.name(),
                    detail: "no value after a write".into(),
                })?;
                self.registry.remember(config.clone());
                return Ok(config);
            }
        }
        Err(Error::Contended {
            what: "configuration",
        })
    }
}

mod inspect;
pub use inspect::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_parses_back_and_foreign_values_are_named() {
        let body = Body {
            spec: Spec::counter(100, Duration::from_secs(60)),
            mode: Mode::Blocked,
            generation: 2,
        };
        let text = format!("7 1000 {}", serde_json::to_string(&body).unwrap());
        let config = parse("counter:api", text.as_bytes()).unwrap();
        assert_eq!(config.epoch, 7);
        assert_eq!(config.mode, Mode::Blocked);
        assert_eq!(config.generation, 2);
        assert_eq!(config.spec.to_string(), "counter 100/1min");
        for (field, value) in [
            ("counter:api", "7 1000"),
            ("counter:api", "x 1000 {}"),
            ("counter:api", "7 1000 {\"spec\":1}"),
            ("lock:api", text.as_str()),
            ("nope:api", text.as_str()),
            ("api", text.as_str()),
            (
                "counter:api",
                "7 1000 {\"spec\":{\"kind\":\"counter\",\"limit\":0,\"window_ms\":1}}",
            ),
        ] {
            match parse(field, value.as_bytes()) {
                Err(Error::ForeignConfig { key, field: f, .. }) => {
                    assert_eq!((key.as_str(), f.as_str()), (REGISTRY_KEY, field));
                }
                other => panic!("{field} {value}: {other:?}"),
            }
        }
    }

    #[test]
    fn specs_read_as_an_operator_writes_them() {
        let quota = Quota::per_minute(100).unwrap();
        assert_eq!(
            Spec::rate_limit(Algorithm::Gcra, quota).to_string(),
            "gcra 100/1min burst 100"
        );
        assert_eq!(
            Spec::semaphore(3, Duration::from_secs(30)).to_string(),
            "semaphore 3 ttl 30s"
        );
        assert_eq!(
            Spec::lock(Duration::from_millis(1500)).to_string(),
            "lock ttl 1.5s"
        );
        assert!(Spec::counter(0, Duration::from_secs(1)).validate().is_err());
        assert!(Spec::RateLimits {
            algorithm: Algorithm::Gcra,
            limits: vec![]
        }
        .validate()
        .is_err());
        assert_eq!("semaphore".parse::<Family>().unwrap(), Family::Semaphore);
        assert!("semaphores".parse::<Family>().is_err());
    }
}
