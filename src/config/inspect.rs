//! [`Configs::inspect`]: the current state of one id of a named
//! configuration, read by the stored numbers and generation, writing
//! nothing. What an operator asks before and after a change ("how much
//! does alice have left on `api`?", "who holds `payout` for tenant 7?").
//!
//! | family | what is read | how |
//! |---|---|---|
//! | rate limit | remaining, limit, reset after, retry after, debt | the algorithm's peek script ([`Limiter::peek`]) |
//! | rate limits | the same per limit | [`MultiLimiter::peek`] over the handle's keys |
//! | counter | count, limit, reset after | `lua/limits/peek.lua` ([`crate::limits::peek`]) |
//! | semaphore | permits in use, each holder's weight and time left | `lua/semaphore/peek.lua`, then `lua/config/inspect_semaphore.lua` |
//! | lock | held or free, the holder's fence and time left, the fence counter | `lua/config/inspect_lock.lua` |
//!
//! Every script is read-only (`EVALSHA_RO`). Secrets stay on the server: a
//! lock's owner token and a semaphore holder's permit id are never read
//! back, so an inspection can be shown and logged as it is.
//!
//! # Rate limits decided together
//!
//! A [`Spec::RateLimits`] keeps limits per scope (a tenant) and per member
//! of a scope (a user of that tenant). [`Configs::inspect`] takes the id as
//! the scope and reports the limits per scope only;
//! [`Configs::inspect_member`] takes a scope and a member and reports every
//! limit, as a check for that member would see them.
//!
//! Over 500 lines only with its `Display` and unit tests (the reads are
//! about 200).

use std::fmt;
use std::time::Duration;

use serde::{Serialize, Serializer};

use super::spec::millis;
use super::{Config, Configs, Family, LimitSpec, Mode, Per, Spec};
use crate::client::rate::kind;
use crate::client::rate_limits::multi_kind;
use crate::client::Name;
use crate::rate::{Algorithm, Limiter, MultiKey, MultiLimiter};
use crate::script::{embedded, Invocation, Reply, Script};
use crate::{keys, Error, Result};

static INSPECT_SEMAPHORE: Script = embedded!("config/inspect_semaphore");
static INSPECT_LOCK: Script = embedded!("config/inspect_lock");

/// What [`Configs::inspect`] found: the stored configuration and the state
/// of one id under it. Its types are `#[non_exhaustive]`: an inspection
/// may learn to show more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Inspection {
    /// The configuration's family.
    pub family: Family,
    /// The configuration's name.
    pub name: String,
    /// The id inspected (the scope, for rate limits decided together).
    pub id: String,
    /// The member of the scope, for [`Configs::inspect_member`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The numbers the state was read by.
    pub spec: Spec,
    /// The switch: a blocked or unlimited name is decided without reading
    /// this state, which is shown all the same.
    pub mode: Mode,
    /// The generation whose keys were read.
    pub generation: u64,
    /// The state.
    pub state: State,
}

/// The state of one id, by family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum State {
    /// A rate limit's state.
    RateLimit(LimitState),
    /// Each limit's state, in the order of the spec.
    RateLimits {
        /// One per limit read.
        limits: Vec<LimitState>,
    },
    /// A counter's state.
    Counter(CounterState),
    /// A semaphore's state.
    Semaphore(SemaphoreState),
    /// A lock's state.
    Lock(LockState),
}

/// One rate limit's state, as a check of one unit would see it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LimitState {
    /// The limit's name, for rate limits decided together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_name: Option<String>,
    /// Per member or per scope, for rate limits decided together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per: Option<Per>,
    /// The Redis key read.
    pub key: String,
    /// The most admitted at once (the burst).
    pub limit: u64,
    /// Units that fit now.
    pub remaining: u64,
    /// Until the limit is full again.
    #[serde(rename = "reset_after_ms", serialize_with = "as_ms")]
    pub reset_after: Duration,
    /// Until one unit fits; `None` when it fits now.
    #[serde(rename = "retry_after_ms", serialize_with = "as_opt_ms")]
    pub retry_after: Option<Duration>,
    /// Units charged beyond empty by settlements (see
    /// [`crate::rate::RateLimit::debt`]).
    pub debt: u64,
    /// A calendar limit's period end, ms since the Unix epoch by the
    /// server's clock (see [`crate::rate::RateLimit::period_end`]); `None`
    /// (and left out of the JSON) for every other algorithm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_end_ms: Option<u64>,
}

/// A counter's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CounterState {
    /// The Redis key read.
    pub key: String,
    /// The count in the current window.
    pub count: u64,
    /// The most counted per window.
    pub limit: u64,
    /// How much more fits in this window.
    pub remaining: u64,
    /// Until the window ends; `None` when no window is open.
    #[serde(rename = "reset_after_ms", serialize_with = "as_opt_ms")]
    pub reset_after: Option<Duration>,
}

/// A semaphore's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SemaphoreState {
    /// The Redis key read.
    pub key: String,
    /// Permits in use.
    pub in_use: u64,
    /// Permits per id (the configured size).
    pub permits: u64,
    /// Each holder, soonest to expire first.
    pub holders: Vec<Holder>,
}

/// One holder of a semaphore's permits, without its permit id (a secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Holder {
    /// How many permits it holds.
    pub weight: u64,
    /// Until its permits expire, unless renewed.
    #[serde(rename = "expires_in_ms", serialize_with = "as_ms")]
    pub expires_in: Duration,
}

/// A lock's state, without the holder's owner token (a secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LockState {
    /// The lock's resource name (its keys are derived from it, see
    /// [`crate::fence`]).
    pub resource: String,
    /// True when someone holds the lock.
    pub held: bool,
    /// The holder's fence; `None` when free, or held by a value nolock did
    /// not write.
    pub fence: Option<u64>,
    /// Until the hold expires unless renewed; `None` when free or held
    /// without an expiry.
    #[serde(rename = "expires_in_ms", serialize_with = "as_opt_ms")]
    pub expires_in: Option<Duration>,
    /// The highest fence granted so far (0 before the first grant).
    pub counter: u64,
}

fn as_ms<S: Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

fn as_opt_ms<S: Serializer>(d: &Option<Duration>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => as_ms(d, s),
        None => s.serialize_none(),
    }
}

/// A time left as an operator reads it (`0s`, `250ms`, `1.5s`, `1min`).
fn duration(d: Duration) -> String {
    match d.as_millis() as u64 {
        0 => "0s".to_owned(),
        ms => millis(ms),
    }
}

impl Configs {
    /// The state of `id` under the stored configuration of `family`/`name`,
    /// read by its numbers and generation; writes nothing. For
    /// [`Family::RateLimits`] the id is the scope, and only the limits per
    /// scope are read (see [`Configs::inspect_member`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name or id, or rate limits that
    /// have limits per member only, before the state is read;
    /// [`Error::UnknownConfig`] when nothing is stored under the name;
    /// [`Error::ForeignConfig`] when the registry holds something nolock
    /// did not write; [`Error::Redis`] when the state's key holds something
    /// else (the script names the key) and [`Error::Indeterminate`] from
    /// Redis (a read: safe to retry).
    ///
    /// ```no_run
    /// use nolock::config::Family;
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let seen = client.configs().inspect(Family::RateLimit, "api", "alice").await?;
    /// println!("{seen}");
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, family: Family, name: &str, id: &str) -> Result<Inspection> {
        let config = self.stored(family, name).await?;
        self.read_state(config, id, None).await
    }

    /// The state of `member` of `scope` under the stored rate limits
    /// decided together named `name`: every limit, per member and per
    /// scope, as a check for that member reads them.
    ///
    /// # Errors
    ///
    /// As [`Configs::inspect`]; [`Error::InvalidArgument`] when the limits
    /// have no limit per member.
    ///
    /// ```no_run
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let seen = client.configs().inspect_member("api", "acme", "alice").await?;
    /// println!("{seen}");
    /// # Ok(()) }
    /// ```
    pub async fn inspect_member(
        &self,
        name: &str,
        scope: &str,
        member: &str,
    ) -> Result<Inspection> {
        let config = self.stored(Family::RateLimits, name).await?;
        self.read_state(config, scope, Some(member)).await
    }

    async fn stored(&self, family: Family, name: &str) -> Result<Config> {
        self.get(family, name)
            .await?
            .ok_or_else(|| Error::UnknownConfig {
                family: family.as_str(),
                name: name.to_owned(),
            })
    }

    async fn read_state(
        &self,
        config: Config,
        id: &str,
        member: Option<&str>,
    ) -> Result<Inspection> {
        let mut conn = self.registry.conn.clone();
        let g = config.generation;
        let state = match &config.spec {
            Spec::RateLimit { algorithm, .. } => {
                let key = Name::new(kind(*algorithm), &config.name)?
                    .generation(g)
                    .key(id)?;
                // As the handles read it: the state may still carry the
                // numbers before a `Keep` change (lua/lib/tag.lua).
                let limiter = Limiter::new(*algorithm, config.spec.quota()?)?.adopting();
                let now = limiter.peek(&mut conn, &key, 1).await?;
                State::RateLimit(LimitState {
                    limit_name: None,
                    per: None,
                    key,
                    limit: now.limit,
                    remaining: now.remaining,
                    reset_after: now.reset_after,
                    retry_after: now.retry_after,
                    debt: now.debt,
                    period_end_ms: calendar_end(*algorithm, &now),
                })
            }
            Spec::RateLimits { algorithm, limits } => {
                let name = Name::new(multi_kind(*algorithm), &config.name)?.generation(g);
                let read = limits_read(&name, limits, id, member)?;
                let scope_key = name.key(id)?;
                let mut multi = MultiLimiter::new(*algorithm);
                let mut key = MultiKey::new(&scope_key);
                for (limit, limit_key) in &read {
                    multi = multi.shared_limit(&limit.name, limit.quota()?)?;
                    key = key.shared(&limit.name, limit_key);
                }
                let now = multi.adopting().peek(&mut conn, key, 1).await?;
                let limits = read
                    .into_iter()
                    .zip(now.limits)
                    .map(|((limit, key), now)| LimitState {
                        limit_name: Some(limit.name.clone()),
                        per: Some(limit.per),
                        key,
                        limit: now.limit,
                        remaining: now.remaining,
                        reset_after: now.reset_after,
                        retry_after: now.retry_after,
                        debt: now.debt,
                        period_end_ms: calendar_end(*algorithm, &now),
                    })
                    .collect();
                State::RateLimits { limits }
            }
            Spec::Counter { limit, .. } => {
                let key = Name::new("counter", &config.name)?.generation(g).key(id)?;
                // Any counter's numbers, as the handles read it (adopting):
                // the count may still carry the numbers before a `Keep`
                // change; another limit's state is refused.
                let usage = crate::limits::peek(&mut conn, &key).await?;
                State::Counter(CounterState {
                    key,
                    count: usage.count,
                    limit: *limit,
                    remaining: usage.remaining(*limit),
                    reset_after: usage.reset_after,
                })
            }
            Spec::Semaphore { permits, .. } => {
                let key = Name::new("semaphore", &config.name)?
                    .generation(g)
                    .key(id)?;
                // The peek checks every member and score is nolock's.
                let usage = crate::semaphore::peek(&mut conn, &key).await?;
                let reply = Invocation::new(&INSPECT_SEMAPHORE, &[&key])
                    .run(&mut conn)
                    .await?;
                let mut reply = Reply::new(INSPECT_SEMAPHORE.name(), reply)?;
                let n = reply.uint()?;
                let mut holders = Vec::new();
                for _ in 0..n {
                    holders.push(Holder {
                        weight: reply.uint()?,
                        expires_in: Duration::from_millis(reply.uint()?),
                    });
                }
                reply.finish()?;
                State::Semaphore(SemaphoreState {
                    key,
                    in_use: usage.in_use,
                    permits: *permits,
                    holders,
                })
            }
            Spec::Lock { .. } => {
                let resource = Name::new("lock", &config.name)?.generation(g).key(id)?;
                let lock = keys::derive(&resource, "lock");
                let counter = keys::derive(&resource, "fence");
                let reply = Invocation::new(&INSPECT_LOCK, &[&lock, &counter])
                    .run(&mut conn)
                    .await?;
                let mut reply = Reply::new(INSPECT_LOCK.name(), reply)?;
                let held = reply.flag()?;
                let fence = reply.uint()?;
                let ttl = reply.int()?;
                let counter = reply.uint()?;
                reply.finish()?;
                State::Lock(LockState {
                    resource,
                    held,
                    fence: (held && fence > 0).then_some(fence),
                    expires_in: u64::try_from(ttl).ok().map(Duration::from_millis),
                    counter,
                })
            }
        };
        Ok(Inspection {
            family: config.family,
            name: config.name,
            id: id.to_owned(),
            member: member.map(str::to_owned),
            spec: config.spec,
            mode: config.mode,
            generation: g,
            state,
        })
    }
}

/// The limits an inspection of `scope` (and `member`) reads, each with its
/// key, as the handle builds them ([`crate::client::RateLimits`]).
fn limits_read<'a>(
    name: &Name,
    limits: &'a [LimitSpec],
    scope: &str,
    member: Option<&str>,
) -> Result<Vec<(&'a LimitSpec, String)>> {
    let scope_key = name.key(scope)?;
    let member_key = member.map(|m| name.member_key(scope, m)).transpose()?;
    let has_members = limits.iter().any(|l| l.per == Per::Member);
    if member.is_some() && !has_members {
        return Err(Error::InvalidArgument {
            what: "member",
            reason: format!("the rate limits {name:?} have no limit per member"),
        });
    }
    let read: Vec<_> = limits
        .iter()
        .filter_map(|limit| match (limit.per, &member_key) {
            (Per::Scope, _) => Some((limit, keys::derive(&scope_key, &limit.name))),
            (Per::Member, Some(member_key)) => Some((limit, keys::derive(member_key, &limit.name))),
            (Per::Member, None) => None,
        })
        .collect();
    if read.is_empty() {
        return Err(Error::InvalidArgument {
            what: "member",
            reason: format!(
                "the rate limits {name:?} have limits per member only: name the member"
            ),
        });
    }
    Ok(read)
}

/// Several lines: the configuration, then the state, one fact a line.
impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} id {}", self.family, self.name, self.id)?;
        if let Some(member) = &self.member {
            write!(f, " member {member}")?;
        }
        writeln!(f)?;
        writeln!(f, "  spec        {}", self.spec)?;
        writeln!(f, "  mode        {}", self.mode)?;
        writeln!(f, "  generation  {}", self.generation)?;
        match &self.state {
            State::RateLimit(limit) => write_limit(f, limit),
            State::RateLimits { limits } => {
                for limit in limits {
                    write_limit(f, limit)?;
                }
                Ok(())
            }
            State::Counter(c) => {
                writeln!(f, "  key         {}", c.key)?;
                writeln!(
                    f,
                    "  count       {} of {} ({} left)",
                    c.count, c.limit, c.remaining
                )?;
                match c.reset_after {
                    Some(d) => writeln!(f, "  resets in   {}", duration(d)),
                    None => writeln!(f, "  resets in   - (no window open)"),
                }
            }
            State::Semaphore(s) => {
                writeln!(f, "  key         {}", s.key)?;
                writeln!(f, "  in use      {} of {}", s.in_use, s.permits)?;
                for (i, h) in s.holders.iter().enumerate() {
                    writeln!(
                        f,
                        "  holder {:<4} {} permit(s), expires in {}",
                        i + 1,
                        h.weight,
                        duration(h.expires_in)
                    )?;
                }
                Ok(())
            }
            State::Lock(l) => {
                writeln!(f, "  resource    {}", l.resource)?;
                match (l.held, l.fence, l.expires_in) {
                    (false, _, _) => writeln!(f, "  held        no")?,
                    (true, fence, expires) => writeln!(
                        f,
                        "  held        yes, fence {}, expires in {}",
                        fence.map_or("? (not nolock's)".to_owned(), |x| x.to_string()),
                        expires.map_or("never".to_owned(), duration)
                    )?,
                }
                writeln!(f, "  counter     {}", l.counter)
            }
        }
    }
}

/// The period end of a calendar limit's answer, in ms since the epoch.
fn calendar_end(algorithm: Algorithm, now: &crate::rate::RateLimit) -> Option<u64> {
    if algorithm != Algorithm::Calendar {
        return None;
    }
    let end = now.period_end?.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(end.as_millis()).ok()
}

fn write_limit(f: &mut fmt::Formatter<'_>, l: &LimitState) -> fmt::Result {
    if let (Some(name), Some(per)) = (&l.limit_name, l.per) {
        let per = match per {
            Per::Member => "member",
            Per::Scope => "scope",
        };
        writeln!(f, "  limit       {name} (per {per})")?;
    }
    writeln!(f, "  key         {}", l.key)?;
    writeln!(f, "  remaining   {} of {}", l.remaining, l.limit)?;
    writeln!(f, "  full in     {}", duration(l.reset_after))?;
    match l.retry_after {
        Some(d) => writeln!(f, "  retry after {}", duration(d))?,
        None => writeln!(f, "  retry after - (one unit fits now)")?,
    }
    if let Some(ms) = l.period_end_ms {
        let end = i64::try_from(ms)
            .ok()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok());
        match end {
            Some(end) => writeln!(f, "  period ends {end}")?,
            None => writeln!(f, "  period ends {ms} ms after the epoch")?,
        }
    }
    writeln!(f, "  debt        {}", l.debt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inspection_serializes_durations_in_milliseconds() {
        let seen = Inspection {
            family: Family::Lock,
            name: "payout".into(),
            id: "t7".into(),
            member: None,
            spec: Spec::lock(Duration::from_secs(10)),
            mode: Mode::Normal,
            generation: 0,
            state: State::Lock(LockState {
                resource: "{nolock:lock:payout:t7}".into(),
                held: true,
                fence: Some(42),
                expires_in: Some(Duration::from_millis(9_000)),
                counter: 42,
            }),
        };
        let json = serde_json::to_value(&seen).unwrap();
        assert_eq!(json["state"]["kind"], "lock");
        assert_eq!(json["state"]["expires_in_ms"], 9000);
        assert_eq!(json["state"]["fence"], 42);
        assert!(json.get("member").is_none());
        let text = seen.to_string();
        assert!(text.contains("fence 42, expires in 9s"), "{text}");
    }

    #[test]
    fn scope_inspections_read_the_limits_per_scope_only() {
        let name = Name::new("multi-gcra", "api").unwrap();
        let limit = |n: &str, per| LimitSpec {
            name: n.into(),
            per,
            rate: 10,
            period_ms: 1000,
            burst: 10,
            calendar: None,
        };
        let limits = [limit("user", Per::Member), limit("tenant", Per::Scope)];
        let scope = limits_read(&name, &limits, "acme", None).unwrap();
        assert_eq!(scope.len(), 1);
        assert_eq!(
            scope[0].1,
            keys::derive("{nolock:multi-gcra:api:acme}", "tenant")
        );
        let both = limits_read(&name, &limits, "acme", Some("alice")).unwrap();
        assert_eq!(
            both[0].1,
            keys::derive("{nolock:multi-gcra:api:acme}:alice", "user")
        );
        assert!(limits_read(&name, &limits[..1], "acme", None).is_err());
        assert!(limits_read(&name, &limits[1..], "acme", Some("alice")).is_err());
    }
}
