//! Tower layers that rate-limit HTTP requests (feature `tower`):
//! [`RateLimitLayer`] (requests per period) and [`ConcurrencyLimitLayer`]
//! (requests in flight, on [`crate::semaphore`]).
//!
//! [`RateLimitLayer`] runs a [`Limiter`] or a [`MultiLimiter`] before the
//! inner service, with a key taken from the request (client IP, a header, an
//! authenticated user in the request extensions) and an optional cost. The
//! key function returns `None` for a request that is not limited (a health
//! check, an internal caller): it passes untouched, without headers.
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
//!   `Retry-After`; any other invalid input (an empty key): `500`.
//!
//! The handler can read where the decision came from: the layer inserts the
//! [`DecidedBy`] into the request's extensions.
//!
//! It is a plain `tower::Layer` over `http::Request` and `http::Response`,
//! so it works with axum 0.8 (`Router::layer`), hyper (through
//! `hyper_util::service::TowerToHyperService`) and any tower stack. The
//! response body only needs `Default` (for the empty 429/503 body).
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use nolock::layer::RateLimitLayer;
//! use nolock::rate::{Algorithm, Limiter, Quota};
//!
//! # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
//! let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10)?)?.named("user")?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(conn, limiter, |req| {
//!         if req.uri.path() == "/health" {
//!             return None; // not limited
//!         }
//!         let user = req.headers.get("x-user").and_then(|v| v.to_str().ok());
//!         Some(format!("rl:user:{}", user.unwrap_or("anonymous")))
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

use crate::policy::{DecidedBy, Guard, OnFailure};
use crate::rate::{Headers, Limiter, MultiKey, MultiLimiter};
use crate::{Error, Result};

/// How long the default guard waits for Redis.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

type OptionalKeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type MultiKeyFn = dyn Fn(&Parts) -> Option<MultiKey> + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

#[derive(Clone)]
enum Limits {
    One(Limiter, Arc<OptionalKeyFn>),
    Multi(MultiLimiter, Arc<MultiKeyFn>),
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
pub struct RateLimitLayer<C> {
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
        };
        d.field("guard", &self.shared.guard).finish_non_exhaustive()
    }
}

impl<C> RateLimitLayer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Limit each request with `limiter` at the Redis key `key(request)`;
    /// a request whose `key` is `None` is not limited.
    ///
    /// `conn` is cloned per request: pass a `MultiplexedConnection` or a
    /// `ConnectionManager` (which reconnects after Redis comes back).
    pub fn new(
        conn: C,
        limiter: Limiter,
        key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self::build(conn, Limits::One(limiter, Arc::new(key)))
    }

    /// Limit each request with every limit of `limiter` at once, all or
    /// nothing, at the keys `key(request)` names: the user key its per-user
    /// limits derive from, and the key of each shared limit by name (a
    /// per-tenant or global limit, chosen per request). A request whose
    /// `key` is `None` is not limited. Every key must share one cluster
    /// slot (put one hash tag in all of them); otherwise the request fails
    /// before I/O with `500`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `limiter` has no limit.
    ///
    /// ```
    /// use nolock::layer::RateLimitLayer;
    /// use nolock::rate::{Algorithm, MultiKey, MultiLimiter, Quota};
    ///
    /// # fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let limits = MultiLimiter::new(Algorithm::Gcra)
    ///     .limit("user", Quota::per_second(10)?)?
    ///     .shared_limit("tenant", Quota::per_second(100)?)?;
    /// let layer = RateLimitLayer::multi(conn, limits, |req| {
    ///     let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
    ///     let user = req.headers.get("x-user")?.to_str().ok()?;
    ///     Some(
    ///         MultiKey::new(&format!("{{{tenant}}}:user:{user}"))
    ///             .shared("tenant", &format!("{{{tenant}}}:all")),
    ///     )
    /// })?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn multi(
        conn: C,
        limiter: MultiLimiter,
        key: impl Fn(&Parts) -> Option<MultiKey> + Send + Sync + 'static,
    ) -> Result<Self> {
        if limiter.is_empty() {
            return Err(Error::InvalidArgument {
                what: "limits",
                reason: "a MultiLimiter needs at least one limit".to_owned(),
            });
        }
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
pub struct RateLimitService<S, C> {
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
    Refuse(StatusCode, Option<Headers>),
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
                let Some(key) = key(parts) else {
                    return (Verdict::Pass(None), None);
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
                let Some(key) = key(parts) else {
                    return (Verdict::Pass(None), None);
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
        };
        match guarded {
            Ok((true, source)) => (Verdict::Pass(headers), Some(source)),
            Ok((false, DecidedBy::Closed)) => (
                Verdict::Refuse(StatusCode::SERVICE_UNAVAILABLE, None),
                Some(DecidedBy::Closed),
            ),
            Ok((false, source)) => (
                Verdict::Refuse(StatusCode::TOO_MANY_REQUESTS, headers),
                Some(source),
            ),
            Err(Error::InsufficientCapacity { .. }) => {
                (Verdict::Refuse(StatusCode::TOO_MANY_REQUESTS, None), None)
            }
            Err(_) => (
                Verdict::Refuse(StatusCode::INTERNAL_SERVER_ERROR, None),
                None,
            ),
        }
    }
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
    ResBody: Default + Send + 'static,
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
                Verdict::Refuse(status, headers) => {
                    let mut response = Response::new(ResBody::default());
                    *response.status_mut() = status;
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
