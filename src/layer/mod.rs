//! Tower layers that rate-limit HTTP requests (feature `tower`):
//! [`RateLimitLayer`] (requests per period) and [`ConcurrencyLimitLayer`]
//! (requests in flight, on [`crate::semaphore`]).
//!
//! Build a [`RateLimitLayer`] from a [`Client`](crate::Client) handle: the
//! layer runs on the handle's connection and derives every Redis key from
//! the handle's name and the id the request carries, so the code passes
//! neither a connection nor a key.
//!
//! * [`RateLimitLayer::limit`] with a [`client::RateLimit`]: one limit per
//!   id (a user, an API key, a client address);
//! * [`RateLimitLayer::scoped`] with a [`client::RateLimits`]: several
//!   limits at once, all or nothing, per member (a user) and shared per
//!   [`Scope`] (their tenant); the headers list every limit.
//!
//! [`RateLimitLayer::new`] and [`RateLimitLayer::multi`] are the
//! operation-level forms: a [`Limiter`] or a [`MultiLimiter`] on a
//! connection you pass, with Redis keys you write.
//!
//! The id function says what to do with every request, as an
//! [`Identity`]: [`Identity::Limited`] with its id (or scope, or key),
//! [`Identity::Unlimited`] for a request that is deliberately not limited
//! (a health check, an internal caller: it passes untouched, without
//! headers), or [`Identity::Rejected`] with a status for a request that has
//! no identity to be limited by (answered with that status, e.g. `401`, and
//! a short body; the inner service never sees it). There is no implicit
//! bypass: a missing header is whatever the id function writes for it, and
//! [`Identity::required`] makes "no id" a rejection.
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use http::{request::Parts, StatusCode};
//! use nolock::layer::{Identity, RateLimitLayer};
//! use nolock::rate::Quota;
//!
//! fn user(req: &Parts) -> Identity<String> {
//!     if req.uri.path() == "/health" {
//!         return Identity::Unlimited; // written out: not limited
//!     }
//!     let user = req.headers.get("x-user").and_then(|v| v.to_str().ok());
//!     let user = user.filter(|u| !u.is_empty()).map(str::to_owned);
//!     Identity::required(user, StatusCode::UNAUTHORIZED)
//! }
//!
//! # async fn run() -> nolock::Result<()> {
//! let client = nolock::Client::connect("redis://127.0.0.1/").await?;
//! let per_user = client.rate_limit("per-user", Quota::per_second(10)?)?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::limit(per_user, user));
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! Per user 10 per second and per tenant 1000 per minute, shared by the
//! tenant's users (`examples/j2_layer.rs` is the whole service, tested):
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use http::{request::Parts, StatusCode};
//! use nolock::client::Scope;
//! use nolock::layer::{Identity, RateLimitLayer};
//! use nolock::rate::Quota;
//!
//! fn tenant_and_user(req: &Parts) -> Identity<Scope> {
//!     let header = |name| req.headers.get(name).and_then(|v| v.to_str().ok());
//!     match (header("x-tenant"), header("x-user")) {
//!         (Some(tenant), Some(user)) if !tenant.is_empty() && !user.is_empty() => {
//!             Identity::Limited(Scope::new(tenant).member(user))
//!         }
//!         _ => Identity::Rejected(StatusCode::UNAUTHORIZED),
//!     }
//! }
//!
//! # async fn run() -> nolock::Result<()> {
//! let client = nolock::Client::connect("redis://127.0.0.1/").await?;
//! let limits = client
//!     .rate_limits("api")
//!     .per_member("user", Quota::per_second(10)?)
//!     .per_scope("tenant", Quota::per_minute(1000)?)
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::scoped(limits, tenant_and_user));
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! What the layer answers:
//!
//! * admitted: the inner service runs, and its response gets the
//!   `RateLimit-Policy` and `RateLimit` headers;
//! * denied: `429 Too Many Requests` with `RateLimit-Policy`, `RateLimit` and
//!   `Retry-After`, and the inner service never sees the request;
//! * Redis slow or down: what the layer's [`Guard`] says (default: 250 ms,
//!   [`OnFailure::Closed`], which answers `503` with `Retry-After: 1`);
//!   [`OnFailure::Open`] passes the request without `RateLimit` headers;
//!   [`OnFailure::Local`] decides in process and answers like Redis would.
//! * a cost above the limit's burst (it could never pass): `429` without
//!   `Retry-After`; any other invalid input (an empty or too long id, a
//!   scope without the member its limits need; with the operation-level
//!   forms, an empty key, keys in two cluster slots, a shared-limit name the
//!   [`MultiLimiter`] does not have): `500` with a one-line text body naming
//!   the problem (never the id or the key), reported as a
//!   `tracing` error event (feature `tracing`) and counted in
//!   `nolock_layer_failures_total` (feature `metrics`).
//!
//! The handler can read where the decision came from: the layer inserts the
//! [`DecidedBy`] into the request's extensions.
//!
//! It is a plain `tower::Layer` over `http::Request` and `http::Response`,
//! so it works with axum 0.8 (`Router::layer`), hyper (through
//! `hyper_util::service::TowerToHyperService`) and any tower stack. The
//! response body needs `From<String>`, for the bodies the layer writes
//! (empty for a `429`, one line of text otherwise): axum's `Body`,
//! `http_body_util::Full<Bytes>` and `String` have it.
//!
//! The operation-level form, with a key written by hand:
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use http::StatusCode;
//! use nolock::layer::{Identity, RateLimitLayer};
//! use nolock::rate::{Algorithm, Limiter, Quota};
//!
//! # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
//! let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10)?)?.named("user")?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(conn, limiter, |req| {
//!         if req.uri.path() == "/health" {
//!             return Identity::Unlimited; // written out: not limited
//!         }
//!         match req.headers.get("x-user").and_then(|v| v.to_str().ok()) {
//!             Some(user) => Identity::Limited(format!("rl:user:{user}")),
//!             None => Identity::Rejected(StatusCode::UNAUTHORIZED),
//!         }
//!     }));
//! # Ok(()) }
//! ```
//!
//! [`OnFailure::Closed`]: crate::policy::OnFailure::Closed
//! [`OnFailure::Open`]: crate::policy::OnFailure::Open
//! [`OnFailure::Local`]: crate::policy::OnFailure::Local

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use redis::aio::ConnectionLike;
use tower_layer::Layer;
use tower_service::Service;

mod concurrency;

pub use concurrency::{ConcurrencyLimitLayer, ConcurrencyLimitService};

use crate::client::{self, Connection, Scope};
use crate::observe;
use crate::policy::{DecidedBy, Guard, OnFailure};
use crate::rate::{Headers, Limiter, MultiKey, MultiLimiter};
use crate::{Error, Result};

/// How long the default guard waits for Redis.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

type KeyFn = dyn Fn(&Parts) -> Identity<String> + Send + Sync;

/// A key function as the rate layer runs it: a handle-based layer derives the
/// key from the id, which can fail (an empty or too long id), and the
/// failure answers `500` with a body.
type CheckedKeyFn = dyn Fn(&Parts) -> Identity<Result<String>> + Send + Sync;
type MultiKeyFn = dyn Fn(&Parts) -> Identity<Result<MultiKey>> + Send + Sync;
type IdFn = dyn Fn(&Parts) -> Identity<String> + Send + Sync;
type ScopeFn = dyn Fn(&Parts) -> Identity<Scope> + Send + Sync;

/// What a layer does with one request, as its key function says: limit it
/// under a key, let it through unlimited, or refuse it. Every request gets
/// one of the three, written out: a request is never unlimited because a
/// header was missing.
///
/// `K` is what the layer limits by: an id (`String`) for
/// [`RateLimitLayer::limit`], a [`Scope`] for [`RateLimitLayer::scoped`],
/// a Redis key (`String`) for [`RateLimitLayer::new`] and
/// [`ConcurrencyLimitLayer::new`], a [`MultiKey`] for
/// [`RateLimitLayer::multi`].
///
/// ```
/// use http::{Request, StatusCode};
/// use nolock::layer::Identity;
///
/// fn tenant(req: &http::request::Parts) -> Identity<String> {
///     if req.uri.path() == "/health" {
///         return Identity::Unlimited;
///     }
///     let tenant = req.headers.get("x-tenant").and_then(|v| v.to_str().ok());
///     Identity::required(tenant.map(|t| format!("rl:{t}")), StatusCode::UNAUTHORIZED)
/// }
///
/// let (anonymous, _) = Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(tenant(&anonymous), Identity::Rejected(StatusCode::UNAUTHORIZED));
/// let (health, _) = Request::get("/health").body(()).unwrap().into_parts();
/// assert_eq!(tenant(&health), Identity::Unlimited);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity<K> {
    /// Limit the request under this key.
    Limited(K),
    /// Let the request through, not limited, without headers.
    Unlimited,
    /// Refuse the request with this status (e.g. `401` or `400`) and a short
    /// text body; the inner service never sees it.
    Rejected(StatusCode),
}

impl<K> Identity<K> {
    /// [`Identity::Limited`] with the key when there is one, otherwise
    /// [`Identity::Rejected`] with `status`: for key functions where every
    /// request must have an identity.
    ///
    /// ```
    /// use http::StatusCode;
    /// use nolock::layer::Identity;
    ///
    /// let missing: Option<String> = None;
    /// assert_eq!(
    ///     Identity::required(missing, StatusCode::BAD_REQUEST),
    ///     Identity::Rejected(StatusCode::BAD_REQUEST)
    /// );
    /// assert_eq!(Identity::required(Some(7), StatusCode::BAD_REQUEST), Identity::Limited(7));
    /// ```
    pub fn required(key: Option<K>, status: StatusCode) -> Self {
        match key {
            Some(key) => Identity::Limited(key),
            None => Identity::Rejected(status),
        }
    }

    /// The key turned into another, the other two answers kept.
    fn map<T>(self, f: impl FnOnce(K) -> T) -> Identity<T> {
        match self {
            Identity::Limited(key) => Identity::Limited(f(key)),
            Identity::Unlimited => Identity::Unlimited,
            Identity::Rejected(status) => Identity::Rejected(status),
        }
    }
}

impl Identity<Scope> {
    /// [`Identity::Limited`] as `member` of `scope`: the scope function of
    /// [`RateLimitLayer::scoped`] without naming [`Scope`].
    ///
    /// ```
    /// use nolock::client::Scope;
    /// use nolock::layer::Identity;
    ///
    /// assert_eq!(
    ///     Identity::member("acme", "alice"),
    ///     Identity::Limited(Scope::new("acme").member("alice"))
    /// );
    /// ```
    pub fn member(scope: impl Into<String>, member: impl Into<String>) -> Self {
        Identity::Limited(Scope::new(scope).member(member))
    }

    /// [`Identity::Limited`] as the whole of `scope`, no member: for
    /// [`RateLimits`](crate::client::RateLimits) that have only per-scope
    /// limits.
    pub fn scope(scope: impl Into<String>) -> Self {
        Identity::Limited(Scope::new(scope))
    }
}

/// The body of an [`Identity::Rejected`] answer.
const NO_IDENTITY: &str = "no identity to limit this request by\n";

/// The body of a `503` (Redis failed, and the guard fails closed).
const UNAVAILABLE: &str = "the request limit could not be checked; retry later\n";

/// A request the layer could not decide because its input is invalid (an
/// empty key, keys in two cluster slots, an unknown shared-limit name): the
/// `500` body naming the problem, also reported through `tracing` and
/// `metrics`. No key goes into it, only what is wrong.
fn invalid_request(layer: &'static str, err: &Error) -> String {
    let problem = match err {
        Error::EmptyKey => "the key function returned an empty key".to_owned(),
        Error::CrossSlot {
            first_slot,
            second_slot,
            ..
        } => format!(
            "the keys of the request are in cluster slots {first_slot} and {second_slot}; \
             give them one {{hash tag}}"
        ),
        Error::InvalidArgument {
            what: "shared keys",
            ..
        } => "a shared-limit key is missing, repeated, or names a limit the \
              MultiLimiter does not have"
            .to_owned(),
        // A handle's id or scope: the reason names what is wrong (a length,
        // a missing member), never the id itself.
        Error::InvalidArgument {
            what: what @ ("id" | "member id" | "scope"),
            reason,
        } => format!("the {what} of the request is invalid: {reason}"),
        Error::InvalidArgument { what, .. } => format!("invalid {what}"),
        other => other.to_string(),
    };
    observe::layer_failure(layer, &problem);
    format!("{layer} limit misconfigured: {problem}\n")
}

/// A response the layer writes itself.
fn answer<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response
}
type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

#[derive(Clone)]
enum Limits {
    One(Limiter, Arc<CheckedKeyFn>),
    Multi(MultiLimiter, Arc<MultiKeyFn>),
    /// A handle: its stored numbers are read per request (from the
    /// client's cache), so a change reaches the layer as it reaches the
    /// handle.
    Handle(Box<client::RateLimit>, Arc<IdFn>),
    Scoped(Box<client::RateLimits>, Arc<ScopeFn>),
}

/// Cloned only by a builder call on a layer that was already cloned, so that
/// the call applies to that copy instead of being lost.
#[derive(Clone)]
struct Shared<C> {
    conn: C,
    limits: Limits,
    cost: Option<Arc<CostFn>>,
    guard: Guard,
}

/// Rate-limits every request through the wrapped service. See the
/// [module docs](self).
///
/// Built from a handle ([`RateLimitLayer::limit`], [`RateLimitLayer::scoped`])
/// it runs on the handle's [`Connection`] (the default `C`); built from a
/// limiter and keys ([`RateLimitLayer::new`], [`RateLimitLayer::multi`]), on
/// the connection given.
pub struct RateLimitLayer<C = Connection> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C> fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RateLimitLayer");
        match &self.shared.limits {
            Limits::One(l, _) => d.field("limiter", l),
            Limits::Multi(l, _) => d.field("limiter", l),
            Limits::Handle(h, _) => d.field("limit", h),
            Limits::Scoped(h, _) => d.field("limits", h),
        };
        d.field("guard", &self.shared.guard).finish_non_exhaustive()
    }
}

impl RateLimitLayer<Connection> {
    /// Limit each request with the handle `limit`, under the id
    /// `id(request)` names ([`Identity::Limited`]): a user, an API key, a
    /// client address. The layer derives the Redis key from the handle's
    /// name and the id, as [`client::RateLimit::check`] does, on the
    /// handle's connection; the handle's settings (algorithm, local deny
    /// cache, debt cap) apply. [`Identity::Unlimited`] passes the request
    /// without a check, [`Identity::Rejected`] answers its status.
    ///
    /// Everything about the limit was checked when the handle was built.
    /// An id that is bad at request time (empty, or longer than
    /// [`client::MAX_ID_LEN`] bytes) is a bug of the id function, not of
    /// the caller: it answers `500` with a one-line body naming the problem
    /// (reported through `tracing` and `metrics` when enabled), and the
    /// inner service never sees the request. Have the id function answer
    /// [`Identity::Rejected`] for a header that is missing or empty.
    ///
    /// ```no_run
    /// use axum::{routing::get, Router};
    /// use http::{request::Parts, StatusCode};
    /// use nolock::layer::{Identity, RateLimitLayer};
    /// use nolock::rate::Quota;
    ///
    /// fn user(req: &Parts) -> Identity<String> {
    ///     let user = req.headers.get("x-user").and_then(|v| v.to_str().ok());
    ///     let user = user.filter(|u| !u.is_empty()).map(str::to_owned);
    ///     Identity::required(user, StatusCode::UNAUTHORIZED)
    /// }
    ///
    /// # async fn run() -> nolock::Result<()> {
    /// let client = nolock::Client::connect("redis://127.0.0.1/").await?;
    /// let per_user = client.rate_limit("per-user", Quota::per_second(10)?)?;
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(RateLimitLayer::limit(per_user, user));
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    pub fn limit(
        limit: client::RateLimit,
        id: impl Fn(&Parts) -> Identity<String> + Send + Sync + 'static,
    ) -> Self {
        let conn = limit.connection();
        Self::build(conn, Limits::Handle(Box::new(limit), Arc::new(id)))
    }

    /// Limit each request with every limit of the handle `limits` at once,
    /// all or nothing, for the [`Scope`] `scope(request)` names: the scope
    /// (a tenant) for the limits shared per scope, and its member (a user of
    /// that tenant) for the limits per member. The layer derives every key
    /// from the handle's name, the scope and the member, as
    /// [`client::RateLimits::check`] does: they share one cluster slot by
    /// construction, and each limit's key is chosen by the handle, never
    /// matched by name per request. The response headers list every limit.
    ///
    /// Everything about the limits was checked when the handle was built
    /// ([`client::RateLimitsBuilder::build`]). A scope that is bad at
    /// request time (an empty or too long id, no member for limits per
    /// member, a member for limits without any) is a bug of the scope
    /// function: it answers `500` with a one-line body naming the problem,
    /// as [`RateLimitLayer::limit`] does for a bad id.
    ///
    /// ```no_run
    /// use axum::{routing::get, Router};
    /// use http::{request::Parts, StatusCode};
    /// use nolock::client::Scope;
    /// use nolock::layer::{Identity, RateLimitLayer};
    /// use nolock::rate::Quota;
    ///
    /// /// A request without both headers is refused with 401, never let
    /// /// through unlimited.
    /// fn tenant_user(req: &Parts) -> Identity<Scope> {
    ///     let header = |name| req.headers.get(name).and_then(|v| v.to_str().ok());
    ///     match (header("x-tenant"), header("x-user")) {
    ///         (Some(tenant), Some(user)) if !tenant.is_empty() && !user.is_empty() => {
    ///             Identity::Limited(Scope::new(tenant).member(user))
    ///         }
    ///         _ => Identity::Rejected(StatusCode::UNAUTHORIZED),
    ///     }
    /// }
    ///
    /// # async fn run() -> nolock::Result<()> {
    /// let client = nolock::Client::connect("redis://127.0.0.1/").await?;
    /// let limits = client
    ///     .rate_limits("api")
    ///     .per_member("user", Quota::per_second(10)?)
    ///     .per_scope("tenant", Quota::per_minute(1000)?)
    ///     .build()?;
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(RateLimitLayer::scoped(limits, tenant_user));
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    pub fn scoped(
        limits: client::RateLimits,
        scope: impl Fn(&Parts) -> Identity<Scope> + Send + Sync + 'static,
    ) -> Self {
        let conn = limits.connection();
        Self::build(conn, Limits::Scoped(Box::new(limits), Arc::new(scope)))
    }
}

impl<C> RateLimitLayer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Limit each request with `limiter` at the Redis key `key(request)`
    /// names ([`Identity::Limited`]); [`Identity::Unlimited`] passes the
    /// request without a check, [`Identity::Rejected`] answers its status.
    ///
    /// `conn` is cloned per request: pass a `MultiplexedConnection` or a
    /// `ConnectionManager` (which reconnects after Redis comes back).
    pub fn new(
        conn: C,
        limiter: Limiter,
        key: impl Fn(&Parts) -> Identity<String> + Send + Sync + 'static,
    ) -> Self {
        let key = move |parts: &Parts| key(parts).map(Ok);
        Self::build(conn, Limits::One(limiter, Arc::new(key)))
    }

    /// Limit each request with every limit of `limiter` at once, all or
    /// nothing, at the keys `key(request)` names: the user key its per-user
    /// limits derive from, and the key of each shared limit by name (a
    /// per-tenant or global limit, chosen per request), as an
    /// [`Identity`]. Every key must share one cluster slot (put one hash tag
    /// in all of them); otherwise the request fails before I/O with `500`
    /// and a body naming the problem.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `limiter` has no limit.
    ///
    /// ```
    /// use http::{request::Parts, StatusCode};
    /// use nolock::layer::{Identity, RateLimitLayer};
    /// use nolock::rate::{Algorithm, MultiKey, MultiLimiter, Quota};
    ///
    /// /// A request without both headers is refused with 401, never let
    /// /// through unlimited.
    /// fn keys(req: &Parts) -> Identity<MultiKey> {
    ///     let header = |name| req.headers.get(name).and_then(|v| v.to_str().ok());
    ///     let (Some(tenant), Some(user)) = (header("x-tenant"), header("x-user")) else {
    ///         return Identity::Rejected(StatusCode::UNAUTHORIZED);
    ///     };
    ///     Identity::Limited(
    ///         MultiKey::new(&format!("{{{tenant}}}:user:{user}"))
    ///             .shared("tenant", &format!("{{{tenant}}}:all")),
    ///     )
    /// }
    ///
    /// # fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let limits = MultiLimiter::new(Algorithm::Gcra)
    ///     .limit("user", Quota::per_second(10)?)?
    ///     .shared_limit("tenant", Quota::per_second(100)?)?;
    /// let layer = RateLimitLayer::multi(conn, limits, keys)?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn multi(
        conn: C,
        limiter: MultiLimiter,
        key: impl Fn(&Parts) -> Identity<MultiKey> + Send + Sync + 'static,
    ) -> Result<Self> {
        if limiter.is_empty() {
            return Err(Error::InvalidArgument {
                what: "limits",
                reason: "a MultiLimiter needs at least one limit".to_owned(),
            });
        }
        let key = move |parts: &Parts| key(parts).map(Ok);
        Ok(Self::build(conn, Limits::Multi(limiter, Arc::new(key))))
    }

    fn build(conn: C, limits: Limits) -> Self {
        RateLimitLayer {
            shared: Arc::new(Shared {
                conn,
                limits,
                cost: None,
                guard: Guard::unchecked(DEFAULT_TIMEOUT, OnFailure::Closed),
            }),
        }
    }

    /// Charge `cost(request)` units per request instead of 1.
    pub fn cost(self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.map(|s| s.cost = Some(Arc::new(cost)))
    }

    /// Decide under `guard` (timeout and failure policy) instead of the
    /// default ([`DEFAULT_TIMEOUT`], fail closed).
    pub fn guard(self, guard: Guard) -> Self {
        self.map(|s| s.guard = guard)
    }

    fn map(self, f: impl FnOnce(&mut Shared<C>)) -> Self {
        // A layer already cloned shares its settings: change a copy, so the
        // call is never lost and the other clones keep what they had.
        let mut shared = Arc::try_unwrap(self.shared).unwrap_or_else(|s| (*s).clone());
        f(&mut shared);
        RateLimitLayer {
            shared: Arc::new(shared),
        }
    }
}

impl<S, C> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimitService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
pub struct RateLimitService<S, C = Connection> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C> Clone for RateLimitService<S, C> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for RateLimitService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What the limit says about one request.
enum Verdict {
    Pass(Option<Headers>),
    Refuse(StatusCode, Option<Headers>, String),
}

impl<C> Shared<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn decide(&self, parts: &Parts) -> (Verdict, Option<DecidedBy>) {
        let cost = || self.cost.as_ref().map_or(1, |f| f(parts));
        let mut conn = self.conn.clone();
        let (guarded, headers) = match &self.limits {
            Limits::One(limiter, key) => {
                let key = match key(parts) {
                    Identity::Limited(Ok(key)) => key,
                    Identity::Limited(Err(e)) => return (invalid(&e), None),
                    Identity::Unlimited => return (Verdict::Pass(None), None),
                    Identity::Rejected(status) => return (rejected(status), None),
                };
                match self.guard.check(limiter, &mut conn, &key, cost()).await {
                    Ok(g) => {
                        let headers = g.decision().map(|d| limiter.headers(d));
                        (Ok((g.allowed(), g.source())), headers)
                    }
                    Err(e) => (Err(e), None),
                }
            }
            Limits::Multi(limiter, key) => {
                let key = match key(parts) {
                    Identity::Limited(Ok(key)) => key,
                    Identity::Limited(Err(e)) => return (invalid(&e), None),
                    Identity::Unlimited => return (Verdict::Pass(None), None),
                    Identity::Rejected(status) => return (rejected(status), None),
                };
                match self
                    .guard
                    .check_multi(limiter, &mut conn, key, cost())
                    .await
                {
                    Ok(g) => {
                        let headers = g.decision().map(|d| limiter.headers(d));
                        (Ok((g.allowed(), g.source())), headers)
                    }
                    Err(e) => (Err(e), None),
                }
            }
            Limits::Handle(handle, id) => {
                let id = match id(parts) {
                    Identity::Limited(id) => id,
                    Identity::Unlimited => return (Verdict::Pass(None), None),
                    Identity::Rejected(status) => return (rejected(status), None),
                };
                let current = match handle.managed.current().await {
                    Ok(current) => current,
                    Err(e) => return (unavailable(&e), None),
                };
                let limiter = &current.engine;
                let key = match current.name.key(&id) {
                    Ok(key) => key,
                    Err(e) => return (invalid(&e), None),
                };
                match client::switched(&current, cost()) {
                    Ok(Some(d)) => (Ok((d.allowed, DecidedBy::Redis)), Some(limiter.headers(&d))),
                    Ok(None) => match self.guard.check(limiter, &mut conn, &key, cost()).await {
                        Ok(g) => {
                            let headers = g.decision().map(|d| limiter.headers(d));
                            (Ok((g.allowed(), g.source())), headers)
                        }
                        Err(e) => (Err(e), None),
                    },
                    Err(e) => (Err(e), None),
                }
            }
            Limits::Scoped(handle, scope) => {
                let scope = match scope(parts) {
                    Identity::Limited(scope) => scope,
                    Identity::Unlimited => return (Verdict::Pass(None), None),
                    Identity::Rejected(status) => return (rejected(status), None),
                };
                let current = match handle.managed.current().await {
                    Ok(current) => current,
                    Err(e) => return (unavailable(&e), None),
                };
                let limits = &current.engine;
                let key = match limits.multi_key(&scope) {
                    Ok(key) => key,
                    Err(e) => return (invalid(&e), None),
                };
                let limiter = limits.limiter();
                match client::switched_multi(limits, current.mode(), cost()) {
                    Ok(Some(d)) => (Ok((d.allowed, DecidedBy::Redis)), Some(limiter.headers(&d))),
                    Ok(None) => match self
                        .guard
                        .check_multi(limiter, &mut conn, key, cost())
                        .await
                    {
                        Ok(g) => {
                            let headers = g.decision().map(|d| limiter.headers(d));
                            (Ok((g.allowed(), g.source())), headers)
                        }
                        Err(e) => (Err(e), None),
                    },
                    Err(e) => (Err(e), None),
                }
            }
        };
        match guarded {
            Ok((true, source)) => (Verdict::Pass(headers), Some(source)),
            Ok((false, DecidedBy::Closed)) => (
                Verdict::Refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    UNAVAILABLE.to_owned(),
                ),
                Some(DecidedBy::Closed),
            ),
            Ok((false, source)) => (
                Verdict::Refuse(StatusCode::TOO_MANY_REQUESTS, headers, String::new()),
                Some(source),
            ),
            Err(Error::InsufficientCapacity { .. }) => (
                Verdict::Refuse(StatusCode::TOO_MANY_REQUESTS, None, String::new()),
                None,
            ),
            Err(e) => (invalid(&e), None),
        }
    }
}

/// A request whose input is invalid: `500` with a body naming the problem.
fn invalid(err: &Error) -> Verdict {
    Verdict::Refuse(
        StatusCode::INTERNAL_SERVER_ERROR,
        None,
        invalid_request("rate", err),
    )
}

/// Redis could not say which numbers decide (the first request of a
/// handle declares them): `503`, as when it cannot decide.
fn unavailable(err: &Error) -> Verdict {
    observe::layer_failure("rate", &err.to_string());
    Verdict::Refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        None,
        UNAVAILABLE.to_owned(),
    )
}

fn rejected(status: StatusCode) -> Verdict {
    Verdict::Refuse(status, None, NO_IDENTITY.to_owned())
}

fn set_headers(map: &mut http::HeaderMap, headers: &Headers) {
    for (name, value) in headers.iter() {
        // The values are plain ASCII (checked policy names and numbers).
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            map.insert(name, value);
        }
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    C: ConnectionLike + Clone + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone takes the place of the service that was polled ready,
        // which goes into the future (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let (verdict, source) = shared.decide(&parts).await;
            match verdict {
                Verdict::Pass(headers) => {
                    if let Some(source) = source {
                        parts.extensions.insert(source);
                    }
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    if let Some(headers) = headers {
                        set_headers(response.headers_mut(), &headers);
                    }
                    Ok(response)
                }
                Verdict::Refuse(status, headers, body) => {
                    let mut response = answer::<ResBody>(status, body);
                    if let Some(headers) = headers {
                        set_headers(response.headers_mut(), &headers);
                    } else if status == StatusCode::SERVICE_UNAVAILABLE {
                        response
                            .headers_mut()
                            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
                    }
                    Ok(response)
                }
            }
        })
    }
}
