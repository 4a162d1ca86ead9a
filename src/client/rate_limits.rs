//! Several named limits on a [`Client`], decided together, all or nothing:
//! [`RateLimits`], limits per member and limits shared per scope, checked
//! for a typed [`Scope`]. It wraps [`MultiLimiter`], and answers as
//! [`RateLimit`](super::RateLimit) does.
//!
//! Over 500 lines only with its doc examples (the code is about 250).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::managed::Managed;
use super::rate::{answer, never_fits};
use super::{Admitted, Client, Connection, Name, Rejection};
use crate::config::{Config, LimitSpec, Mode, Per, Registry, Spec};
use crate::rate::{self, Algorithm, MultiKey, MultiLimiter, MultiRateLimit, Quota};
use crate::{keys, Error, Result};

impl Client {
    /// Several limits named `name`, decided together, all or nothing: limits
    /// kept per member of a scope (each user of a tenant: 10 per second) and
    /// limits shared by the whole scope (the tenant: 1000 per minute). Add
    /// them on the builder; the input is checked by
    /// [`RateLimitsBuilder::build`].
    ///
    /// The numbers are a declaration ([`crate::config`]): the handle's
    /// first call stores them under its name unless numbers are stored
    /// already, and the handle decides by the stored ones from then on
    /// (reporting a difference; [`insist`](RateLimits::insist) refuses one).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use nolock::client::Scope;
    /// use nolock::rate::Quota;
    ///
    /// # async fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let limits = client
    ///     .rate_limits("api")
    ///     .per_member("user", Quota::per_second(10)?)
    ///     .per_scope("tenant", Quota::per_minute(1000)?)
    ///     .build()?;
    /// let admitted = limits.check(&Scope::new("acme").member("alice")).await;
    /// # let _ = admitted;
    /// # Ok(()) }
    /// ```
    pub fn rate_limits(&self, name: &str) -> RateLimitsBuilder {
        RateLimitsBuilder {
            name: Name::new("multi", name),
            conn: self.connection(),
            registry: self.registry(),
            algorithm: Algorithm::Gcra,
            limits: Vec::new(),
            settle_within: None,
            debt_cap: None,
        }
    }
}

/// Who a [`RateLimits`] check is for: a scope (a tenant, an organisation,
/// a project), and a member of it (a user of that tenant) when the limits
/// include limits per member.
///
/// The limits per scope of a [`RateLimits`] are drawn from by every member
/// of the scope; the limits per member by that member alone. A `Scope`
/// without a member is only for limits that have no per-member limit: on
/// limits that do, a check is refused ([`Error::InvalidArgument`], nothing
/// sent), never let through unlimited. Likewise a member given to limits
/// that have no per-member limit is refused rather than ignored.
///
/// ```
/// use nolock::client::Scope;
///
/// let alice_at_acme = Scope::new("acme").member("alice");
/// assert_eq!(alice_at_acme.scope(), "acme");
/// assert_eq!(alice_at_acme.member_id(), Some("alice"));
/// assert_eq!(Scope::new("acme").member_id(), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scope {
    pub(crate) scope: String,
    pub(crate) member: Option<String>,
}

impl Scope {
    /// The scope `id`, without a member. Ids are checked when used: 1 to
    /// [`MAX_ID_LEN`](super::MAX_ID_LEN) bytes of any text.
    pub fn new(id: impl Into<String>) -> Scope {
        Scope {
            scope: id.into(),
            member: None,
        }
    }

    /// The same scope, for its member `id`.
    #[must_use]
    pub fn member(self, id: impl Into<String>) -> Scope {
        Scope {
            member: Some(id.into()),
            ..self
        }
    }

    /// The scope's id.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The member's id, when one was given.
    pub fn member_id(&self) -> Option<&str> {
        self.member.as_deref()
    }
}

/// The builder of a [`RateLimits`], from [`Client::rate_limits`]. Every
/// check of the input waits for [`RateLimitsBuilder::build`], so a chain
/// has one `?`.
#[derive(Debug)]
#[must_use = "a builder does nothing until built"]
pub struct RateLimitsBuilder {
    name: Result<Name>,
    conn: Connection,
    registry: Arc<Registry>,
    algorithm: Algorithm,
    /// Name, quota, and whether the limit is kept per member.
    limits: Vec<(String, Quota, bool)>,
    settle_within: Option<Duration>,
    debt_cap: Option<u64>,
}

impl RateLimitsBuilder {
    /// Add a limit kept per member: each member of a scope has its own.
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let limits = client.rate_limits("api").per_member("user", Quota::per_second(10)?).build()?;
    /// # let _ = limits;
    /// # Ok(()) }
    /// ```
    pub fn per_member(mut self, limit: &str, quota: Quota) -> RateLimitsBuilder {
        self.limits.push((limit.to_owned(), quota, true));
        self
    }

    /// Add a limit shared by every member of a scope.
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let limits = client.rate_limits("api").per_scope("tenant", Quota::per_minute(1000)?).build()?;
    /// # let _ = limits;
    /// # Ok(()) }
    /// ```
    pub fn per_scope(mut self, limit: &str, quota: Quota) -> RateLimitsBuilder {
        self.limits.push((limit.to_owned(), quota, false));
        self
    }

    /// Decide every limit with `algorithm` (default [`Algorithm::Gcra`]).
    ///
    /// ```no_run
    /// use nolock::rate::{Algorithm, Quota};
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let limits = client
    ///     .rate_limits("api")
    ///     .algorithm(Algorithm::SlidingWindow)
    ///     .per_scope("tenant", Quota::per_hour(50_000)?)
    ///     .build()?;
    /// # let _ = limits;
    /// # Ok(()) }
    /// ```
    pub fn algorithm(mut self, algorithm: Algorithm) -> RateLimitsBuilder {
        self.algorithm = algorithm;
        self
    }

    /// [`MultiLimiter::settle_within`] for the charges of these limits
    /// (checked by [`RateLimitsBuilder::build`]).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let limits = client
    ///     .rate_limits("tokens")
    ///     .per_scope("tenant", Quota::per_minute(100_000)?)
    ///     .settle_within(Duration::from_secs(600))
    ///     .build()?;
    /// # let _ = limits;
    /// # Ok(()) }
    /// ```
    pub fn settle_within(mut self, within: Duration) -> RateLimitsBuilder {
        self.settle_within = Some(within);
        self
    }

    /// [`MultiLimiter::with_debt_cap`] for every limit.
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// let limits = client
    ///     .rate_limits("tokens")
    ///     .per_scope("tenant", Quota::per_minute(100_000)?)
    ///     .with_debt_cap(100_000)
    ///     .build()?;
    /// # let _ = limits;
    /// # Ok(()) }
    /// ```
    pub fn with_debt_cap(mut self, units: u64) -> RateLimitsBuilder {
        self.debt_cap = Some(units);
        self
    }

    /// The limits, with every setting checked.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad handle name, no limit at all, a
    /// bad or repeated limit name (1 to 64 ASCII letters, digits, `_ - . :`)
    /// or a quota the algorithm cannot honour; those of
    /// [`MultiLimiter::settle_within`].
    ///
    /// ```no_run
    /// use nolock::rate::Quota;
    /// # fn run(client: nolock::Client) -> nolock::Result<()> {
    /// assert!(client.rate_limits("api").build().is_err()); // no limit
    /// let q = Quota::per_second(10)?;
    /// assert!(client.rate_limits("api").per_member("x", q).per_scope("x", q).build().is_err());
    /// # Ok(()) }
    /// ```
    pub fn build(self) -> Result<RateLimits> {
        let name = self.name?;
        let own = Spec::RateLimits {
            algorithm: self.algorithm,
            limits: self
                .limits
                .iter()
                .map(|(limit, quota, per_member)| {
                    let per = if *per_member { Per::Member } else { Per::Scope };
                    LimitSpec::new(limit.as_str(), per, *quota)
                })
                .collect(),
        };
        if self.limits.is_empty() {
            return Err(Error::InvalidArgument {
                what: "limits",
                reason: format!("the rate limits {name:?} need at least one limit"),
            });
        }
        let local = Local {
            settle_within: self.settle_within,
            debt_cap: self.debt_cap,
        };
        let mine = local.parts(&name, &own)?;
        let managed = Managed::new(self.registry, name.clone(), own, move |config, name| {
            let parts = local.parts(&name, &config.spec)?;
            Ok((parts.clone(), parts.name))
        });
        Ok(RateLimits {
            name,
            mine,
            managed,
            conn: self.conn,
        })
    }
}

/// What a process sets for itself, whatever the stored numbers.
#[derive(Clone, Copy, Debug)]
struct Local {
    settle_within: Option<Duration>,
    debt_cap: Option<u64>,
}

impl Local {
    /// What decides for `spec`, named `name` (its generation included).
    fn parts(&self, name: &Name, spec: &Spec) -> Result<Parts> {
        let Spec::RateLimits { algorithm, limits } = spec else {
            return Err(Error::InvalidArgument {
                what: "spec",
                reason: format!("rate limits cannot decide by a {} spec", spec.family()),
            });
        };
        // Each algorithm stores its state its own way: its own keys.
        let name = name.with_kind(multi_kind(*algorithm));
        let mut quotas = Vec::with_capacity(limits.len());
        for limit in limits {
            quotas.push((
                limit.name.as_str(),
                limit.quota()?,
                limit.per == Per::Member,
            ));
        }
        // A handle's numbers change only by a declared change: it adopts
        // the state the numbers before wrote (lua/lib/tag.lua).
        let settings = |multi: MultiLimiter| -> Result<MultiLimiter> {
            let mut multi = multi.adopting();
            if let Some(within) = self.settle_within {
                multi = multi.settle_within(within)?;
            }
            if let Some(units) = self.debt_cap {
                multi = multi.with_debt_cap(units);
            }
            Ok(multi)
        };
        let part = |per_member: bool| -> Result<Option<MultiLimiter>> {
            let mut part = MultiLimiter::new(*algorithm);
            for (limit, quota, _) in quotas.iter().filter(|l| l.2 == per_member) {
                part = part.shared_limit(limit, *quota)?;
            }
            let part = settings(part)?;
            Ok((!part.is_empty()).then_some(part))
        };
        // Every limit is a shared one of the MultiLimiter: the handle names
        // each limit's key itself, from the scope and the member.
        let mut all = MultiLimiter::new(*algorithm);
        for (limit, quota, _) in &quotas {
            all = all.shared_limit(limit, *quota)?;
        }
        Ok(Parts {
            per_member: quotas.iter().map(|l| l.2).collect(),
            members: part(true)?,
            scopes: part(false)?,
            limiter: settings(all)?,
            name,
        })
    }
}

/// What decides for one version of the numbers.
#[derive(Clone, Debug)]
pub(crate) struct Parts {
    /// The name every key is built from (algorithm and generation).
    name: Name,
    /// Every limit, in the order added, each a shared limit whose key the
    /// handle builds ([`RateLimits::multi_key`]).
    limiter: MultiLimiter,
    /// Per limit of `limiter`: true when kept per member.
    per_member: Vec<bool>,
    /// The limits per member alone, and per scope alone (for resets).
    members: Option<MultiLimiter>,
    scopes: Option<MultiLimiter>,
}

/// Several named limits decided together, all or nothing, for a [`Scope`]:
/// limits per member and limits shared by the scope. Made by
/// [`Client::rate_limits`]; cheap to clone.
///
/// # Keys
///
/// For the handle `api`, the scope's shared limit `tenant` lives at
/// [`keys::derive`]`("{nolock:multi-gcra:api:<scope>}", "tenant")` and the member's
/// limit `user` at `keys::derive("{nolock:multi-gcra:api:<scope>}:<member>", "user")`:
/// every key of one check carries the scope's hash tag, so they share a
/// cluster slot by construction, and each limit's key is chosen by the
/// handle, never by a string per request.
///
/// # Example: per user 10/s, per tenant 1000/min shared
///
/// ```no_run
/// use nolock::client::Scope;
/// use nolock::rate::Quota;
///
/// # async fn run(client: nolock::Client) -> nolock::Result<()> {
/// let limits = client
///     .rate_limits("api")
///     .per_member("user", Quota::per_second(10)?)
///     .per_scope("tenant", Quota::per_minute(1000)?)
///     .build()?;
/// match limits.check(&Scope::new("acme").member("alice")).await {
///     Ok(admitted) => println!("{}", admitted.headers().rate_limit),
///     Err(rejection) => println!("{rejection}"), // which limit: the headers say
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimits {
    pub(crate) name: Name,
    /// What this process's own numbers decide (before any call).
    mine: Parts,
    /// What the stored numbers decide, rebuilt when they change.
    pub(crate) managed: Managed<Parts>,
    pub(crate) conn: Connection,
}

impl RateLimits {
    /// Take one unit from every limit of `scope` if each has room;
    /// otherwise take nothing. See [`RateLimits::check_cost`].
    ///
    /// # Errors
    ///
    /// As [`RateLimits::check_cost`].
    ///
    /// ```no_run
    /// use nolock::client::Scope;
    /// # async fn run(limits: nolock::client::RateLimits) -> Result<(), nolock::client::Rejection> {
    /// let admitted = limits.check(&Scope::new("acme").member("alice")).await?;
    /// # let _ = admitted;
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, scope: &Scope) -> Result<Admitted, Rejection> {
        self.check_cost(scope, 1).await
    }

    /// Take `cost` units from every limit of `scope` (the member's limits
    /// and the scope's shared ones) if each has room; otherwise take
    /// nothing. One script call.
    ///
    /// The answer's `limit`, `remaining` and `reset_after` are those of the
    /// tightest limit: after an admission the one with the least
    /// `remaining`; after a denial the one with the longest `retry_after`.
    /// The headers list every limit.
    ///
    /// # Errors
    ///
    /// [`Rejection::Limited`] when some limit has no room now (`retry_after`
    /// is the longest wait), or when `cost` is above some limit's burst
    /// (`retry_after: None`: it never fits). [`Rejection::Failed`] with
    /// [`Error::InvalidArgument`] for a bad id, a scope without a member on
    /// limits per member, or a member on limits without any, and
    /// [`Error::ZeroLimit`] (`cost` 0), before any I/O; [`Error::Redis`] or
    /// [`Error::Indeterminate`] from Redis.
    ///
    /// ```no_run
    /// use nolock::client::Scope;
    /// # async fn run(limits: nolock::client::RateLimits) -> Result<(), nolock::client::Rejection> {
    /// let admitted = limits.check_cost(&Scope::new("acme").member("alice"), 5).await?;
    /// # let _ = admitted;
    /// # Ok(()) }
    /// ```
    pub async fn check_cost(&self, scope: &Scope, cost: u64) -> Result<Admitted, Rejection> {
        // Checked here only before the first call, which reads the
        // registry; later calls check it as they build the keys.
        if self.managed.latest().is_none() {
            self.mine.multi_key(scope)?;
        }
        crate::validate::positive("cost", cost)?;
        let current = self.managed.current().await?;
        let parts = &current.engine;
        let key = parts.multi_key(scope)?;
        if let Some(decision) = switched_multi(parts, current.mode(), cost)? {
            return parts.answer(&decision);
        }
        let mut conn = self.conn.clone();
        match parts.limiter.check(&mut conn, key.clone(), cost).await {
            Ok(decision) => parts.answer(&decision),
            Err(Error::InsufficientCapacity { .. }) => {
                let state = parts.limiter.peek(&mut conn, key, 1).await?;
                let headers = parts.limiter.headers(&state);
                // The first limit the cost is above.
                let over = state.limits.iter().find(|l| l.limit < cost);
                let over = over.or(state.limits.first()).copied();
                match over {
                    Some(limit) => Err(never_fits(limit, headers)),
                    None => Err(Rejection::Failed(no_limit())),
                }
            }
            Err(err) => Err(Rejection::Failed(err)),
        }
    }

    /// What a check of one unit for `scope` would answer now, every
    /// limit's state, without taking anything. Read-only.
    ///
    /// # Errors
    ///
    /// As [`RateLimits::check_cost`] before any I/O; [`Error::Redis`] and
    /// [`Error::Indeterminate`] from Redis (safe to retry).
    ///
    /// ```no_run
    /// use nolock::client::Scope;
    /// # async fn run(limits: nolock::client::RateLimits) -> nolock::Result<()> {
    /// let now = limits.peek(&Scope::new("acme").member("alice")).await?;
    /// println!("{} left on the tightest limit", now.remaining());
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, scope: &Scope) -> Result<MultiRateLimit> {
        // Checked here only before the first call, which reads the
        // registry; later calls check it as they build the keys.
        if self.managed.latest().is_none() {
            self.mine.multi_key(scope)?;
        }
        let current = self.managed.current().await?;
        let key = current.engine.multi_key(scope)?;
        current
            .engine
            .limiter
            .peek(&mut self.conn.clone(), key, 1)
            .await
    }

    /// Forget state: with a member, that member's limits (the scope's
    /// shared limits keep theirs); without, the scope's shared limits (each
    /// member's keep theirs). Charges taken before lose their power to
    /// refund or settle on the limits reset ([`rate::Limiter::reset`]).
    /// Idempotent.
    ///
    /// # Errors
    ///
    /// As [`RateLimits::peek`], except that a scope without a member is
    /// accepted on limits that have limits per member (it resets the
    /// scope's limits); [`Error::InvalidArgument`] when the limits reset
    /// would be none.
    ///
    /// ```no_run
    /// use nolock::client::Scope;
    /// # async fn run(limits: nolock::client::RateLimits) -> nolock::Result<()> {
    /// limits.reset(&Scope::new("acme").member("alice")).await?; // alice only
    /// limits.reset(&Scope::new("acme")).await?; // the tenant's shared limits
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, scope: &Scope) -> Result<()> {
        let current = self.managed.current().await?;
        current.engine.reset(&mut self.conn.clone(), scope).await
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
    /// As [`RateLimits::insist`], without the mismatch.
    pub async fn config(&self) -> Result<Config> {
        self.managed.config().await
    }

    /// What decides now, without a call: the latest stored numbers this
    /// handle used, or its own before its first call.
    fn parts(&self) -> Parts {
        match self.managed.latest() {
            Some(current) => current.engine.clone(),
            None => self.mine.clone(),
        }
    }
}

impl Parts {
    async fn reset(&self, conn: &mut Connection, scope: &Scope) -> Result<()> {
        let scope_key = self.name.key(&scope.scope)?;
        let (part, base) = match &scope.member {
            Some(member) => (
                self.members.as_ref(),
                self.name.member_key(&scope.scope, member)?,
            ),
            None => (self.scopes.as_ref(), scope_key.clone()),
        };
        let Some(part) = part else {
            return Err(Error::InvalidArgument {
                what: "scope",
                reason: format!(
                    "the rate limits {:?} have no limit per {}",
                    self.name,
                    if scope.member.is_some() {
                        "member"
                    } else {
                        "scope"
                    }
                ),
            });
        };
        let mut key = MultiKey::new(&scope_key);
        for limit in (0..part.len()).filter_map(|i| part.name(i)) {
            key = key.shared(limit, &keys::derive(&base, limit));
        }
        part.reset(conn, key).await
    }

    fn answer(&self, decision: &MultiRateLimit) -> Result<Admitted, Rejection> {
        let headers = self.limiter.headers(decision);
        let tightest = if decision.allowed {
            decision.limits.iter().min_by_key(|l| l.remaining)
        } else {
            // The first of the longest waits.
            let longest = decision.retry_after();
            decision.limits.iter().find(|l| l.retry_after == longest)
        };
        match tightest {
            Some(limit) => answer(
                &rate::RateLimit {
                    allowed: decision.allowed,
                    ..*limit
                },
                headers,
            ),
            None => Err(Rejection::Failed(no_limit())),
        }
    }
}

impl RateLimits {
    /// The handle's answer for a decision of these limits: [`Admitted`] or
    /// [`Rejection::Limited`], with every limit in the headers.
    ///
    /// # Errors
    ///
    /// [`Rejection::Limited`] when the decision did not admit.
    ///
    /// ```no_run
    /// use nolock::client::Scope;
    /// # async fn run(limits: nolock::client::RateLimits) -> Result<(), nolock::client::Rejection> {
    /// let key = limits.multi_key(&Scope::new("acme").member("alice"))?;
    /// let mut conn = limits.connection();
    /// let decision = limits.limiter().check(&mut conn, key, 1).await?;
    /// let admitted = limits.answer(&decision)?;
    /// # let _ = admitted;
    /// # Ok(()) }
    /// ```
    pub fn answer(&self, decision: &MultiRateLimit) -> Result<Admitted, Rejection> {
        self.parts().answer(decision)
    }

    /// The handle's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The [`MultiLimiter`] underneath (every limit is one of its shared
    /// limits), for the operation-level API: [`rate::MultiCheck`] values,
    /// [`MultiRateLimit::charge_mut`] refunds, settlements.
    pub fn limiter(&self) -> MultiLimiter {
        self.parts().limiter
    }

    /// The connection the handle uses (a clone), for the operation-level
    /// API: refunds and settlements of the charges of
    /// [`RateLimits::limiter`] checks.
    pub fn connection(&self) -> Connection {
        self.conn.clone()
    }

    /// The keys of a check for `scope`, for [`RateLimits::limiter`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad id, a scope without a member on
    /// limits per member, or a member on limits without any.
    ///
    /// ```no_run
    /// use nolock::client::Scope;
    /// # fn run(limits: nolock::client::RateLimits) -> nolock::Result<()> {
    /// let key = limits.multi_key(&Scope::new("acme").member("alice"))?;
    /// assert_eq!(limits.limiter().keys(&key)?.len(), limits.limiter().len());
    /// # Ok(()) }
    /// ```
    pub fn multi_key(&self, scope: &Scope) -> Result<MultiKey> {
        self.parts().multi_key(scope)
    }
}

impl Parts {
    #[cfg(feature = "tower")]
    pub(crate) fn limiter(&self) -> &MultiLimiter {
        &self.limiter
    }

    pub(crate) fn multi_key(&self, scope: &Scope) -> Result<MultiKey> {
        let scope_key = self.name.key(&scope.scope)?;
        let has_members = self.members.is_some();
        let member_key = match (&scope.member, has_members) {
            (Some(member), true) => Some(self.name.member_key(&scope.scope, member)?),
            (None, false) => None,
            (None, true) => {
                return Err(Error::InvalidArgument {
                    what: "scope",
                    reason: format!(
                        "the rate limits {:?} have limits per member: name the member \
                         (Scope::new(scope).member(id))",
                        self.name
                    ),
                })
            }
            (Some(_), false) => {
                return Err(Error::InvalidArgument {
                    what: "scope",
                    reason: format!(
                        "the rate limits {:?} have no limit per member, so the member would \
                         not be limited: use Scope::new(scope) alone",
                        self.name
                    ),
                })
            }
        };
        let mut key = MultiKey::new(&scope_key);
        for (i, &per_member) in self.per_member.iter().enumerate() {
            let Some(limit) = self.limiter.name(i) else {
                break;
            };
            let base = match (&member_key, per_member) {
                (Some(member_key), true) => member_key,
                _ => &scope_key,
            };
            key = key.shared(limit, &keys::derive(base, limit));
        }
        Ok(key)
    }
}

/// A decision without any limit: cannot happen for built limits (they have
/// one at least), answered as an error rather than a panic.
/// The answer of an operator's switch ([`Mode`]), decided without Redis:
/// `None` when the numbers decide.
pub(crate) fn switched_multi(
    parts: &Parts,
    mode: Mode,
    cost: u64,
) -> Result<Option<MultiRateLimit>> {
    let allowed = match mode {
        Mode::Normal => return Ok(None),
        Mode::Blocked => false,
        Mode::Unlimited => {
            crate::observe::unlimited("rate-limits", parts.name.as_str());
            true
        }
    };
    crate::validate::positive("cost", cost)?;
    let at = SystemTime::now();
    let limits = parts
        .limiter
        .quotas()
        .iter()
        .map(|quota| rate::RateLimit {
            allowed,
            limit: quota.burst(),
            remaining: if allowed { quota.burst() } else { 0 },
            retry_after: None,
            reset_after: Duration::ZERO,
            at,
            debt: 0,
            period_end: None,
        })
        .collect();
    Ok(Some(MultiRateLimit::uncharged(allowed, limits)))
}

fn no_limit() -> Error {
    Error::UnexpectedReply {
        script: "rate",
        detail: "a decision without any limit".to_owned(),
    }
}

/// The kind of handle of several rate limits, in their keys.
pub(crate) fn multi_kind(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Gcra => "multi-gcra",
        Algorithm::TokenBucket => "multi-bucket",
        Algorithm::SlidingWindow => "multi-sliding",
        Algorithm::FixedWindow => "multi-fixed",
        Algorithm::Calendar => "multi-calendar",
    }
}
