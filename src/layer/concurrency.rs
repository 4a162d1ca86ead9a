//! [`ConcurrencyLimitLayer`]: at most N requests in flight per key, across
//! every replica, on [`crate::semaphore`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use redis::aio::ConnectionLike;
use tower_layer::Layer;
use tower_service::Service;

use super::{KeyFn, DEFAULT_TIMEOUT};
use crate::observe;
use crate::policy::{DecidedBy as Source, Failure, OnFailure};
use crate::semaphore::{self, Acquire, PermitLease};

/// At most `permits` requests in flight per key (a tenant, a user, one
/// fragile backend), counted across every replica of the service with a
/// [`crate::semaphore`]: a permit is acquired before the inner service runs
/// and released when its response (headers) is ready.
///
/// * full: `429 Too Many Requests` with `Retry-After: 1` (permits usually
///   come back sooner than their TTL);
/// * Redis slow or down (past the timeout, default [`DEFAULT_TIMEOUT`]): by
///   the [`OnFailure`]: `Closed` (default) answers `503` with
///   `Retry-After: 1`, `Open` lets the request through, `Local { replicas }`
///   allows `permits / replicas` (at least 1) in flight per key in this
///   process. The [`Source`] goes into the request's extensions.
///
/// Each permit is held as a [`PermitLease`]: renewed every `ttl / 3`
/// while its request runs, so a request may take longer than `ttl`. The
/// TTL bounds how long the permit of a replica that died mid-request keeps
/// its slot. A permit whose renewal fails for longer than its TTL is lost
/// (counted as a lease loss by the `metrics` feature); the request still
/// runs to its end, so for that while more than `permits` requests may be
/// in flight. A request whose future is dropped (the client went away)
/// gives its permit back in the background. A streamed body still being
/// sent after the headers no longer holds one.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{routing::post, Router};
/// use nolock::layer::ConcurrencyLimitLayer;
///
/// # async fn run(conn: redis::aio::MultiplexedConnection) {
/// let app: Router = Router::new()
///     .route("/export", post(|| async { "done" }))
///     .layer(ConcurrencyLimitLayer::new(conn, 2, Duration::from_secs(30), |req| {
///         let tenant = req.headers.get("x-tenant").and_then(|v| v.to_str().ok());
///         format!("exports:{}", tenant.unwrap_or("none"))
///     }));
/// # }
/// ```
pub struct ConcurrencyLimitLayer<C> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    conn: C,
    permits: u64,
    ttl: Duration,
    key: Arc<KeyFn>,
    timeout: Duration,
    on_failure: OnFailure,
    /// In-flight requests per key admitted by `OnFailure::Local`.
    local: Mutex<HashMap<String, u64>>,
}

impl<C> Clone for ConcurrencyLimitLayer<C> {
    fn clone(&self) -> Self {
        ConcurrencyLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C> fmt::Debug for ConcurrencyLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("permits", &self.shared.permits)
            .field("ttl", &self.shared.ttl)
            .field("timeout", &self.shared.timeout)
            .field("on_failure", &self.shared.on_failure)
            .finish_non_exhaustive()
    }
}

impl<C> ConcurrencyLimitLayer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// At most `permits` requests in flight per `key(request)`, each
    /// holding its permit for at most `ttl`. Invalid numbers (0 permits, a
    /// TTL under 1 ms) make every request fail with `500` (the semaphore
    /// checks them before any I/O).
    pub fn new(
        conn: C,
        permits: u64,
        ttl: Duration,
        key: impl Fn(&Parts) -> String + Send + Sync + 'static,
    ) -> Self {
        ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                conn,
                permits,
                ttl,
                key: Arc::new(key),
                timeout: DEFAULT_TIMEOUT,
                on_failure: OnFailure::Closed,
                local: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Wait at most `timeout` for Redis, then act by `on_failure`.
    pub fn on_failure(self, timeout: Duration, on_failure: OnFailure) -> Self {
        // A layer already cloned shares its settings: change a copy (with
        // its own local fallback counts), so the call is never lost.
        let shared = Arc::try_unwrap(self.shared).unwrap_or_else(|s| Shared {
            conn: s.conn.clone(),
            permits: s.permits,
            ttl: s.ttl,
            key: Arc::clone(&s.key),
            timeout: s.timeout,
            on_failure: s.on_failure,
            local: Mutex::new(HashMap::new()),
        });
        ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                timeout,
                on_failure,
                ..shared
            }),
        }
    }
}

impl<S, C> Layer<S> for ConcurrencyLimitLayer<C> {
    type Service = ConcurrencyLimitService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimitService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`ConcurrencyLimitLayer`] wraps around another.
pub struct ConcurrencyLimitService<S, C> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C> Clone for ConcurrencyLimitService<S, C> {
    fn clone(&self) -> Self {
        ConcurrencyLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for ConcurrencyLimitService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What was taken for one request, to give back after it.
enum Held {
    Redis(PermitLease),
    Local,
    Nothing,
}

impl<C> Shared<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `Ok((what was taken, who decided))`, or the refusal's status.
    async fn enter(&self, key: &str) -> Result<(Held, Source), StatusCode> {
        let mut conn = self.conn.clone();
        let call = semaphore::acquire(&mut conn, key, self.permits, self.ttl);
        let cause = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(Acquire::Acquired(permit))) => {
                return match PermitLease::start(self.conn.clone(), key, permit) {
                    Ok(lease) => Ok((Held::Redis(lease), Source::Redis)),
                    Err(_) => Err(StatusCode::INTERNAL_SERVER_ERROR),
                };
            }
            Ok(Ok(Acquire::Full { .. })) => return Err(StatusCode::TOO_MANY_REQUESTS),
            Ok(Err(err)) if err.is_invalid_input() => {
                return Err(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Ok(Err(err)) => Failure::Redis(err),
            Err(_) => Failure::Timeout(self.timeout),
        };
        let (result, source) = match self.on_failure {
            OnFailure::Open => (Ok((Held::Nothing, Source::Open)), Source::Open),
            OnFailure::Local { replicas } => {
                let share = (self.permits / u64::from(replicas.get())).max(1);
                let mut map = self.local.lock().unwrap_or_else(|e| e.into_inner());
                let in_flight = map.entry(key.to_owned()).or_insert(0);
                if *in_flight < share {
                    *in_flight += 1;
                    (Ok((Held::Local, Source::Local)), Source::Local)
                } else {
                    (Err(StatusCode::TOO_MANY_REQUESTS), Source::Local)
                }
            }
            // `OnFailure` is non-exhaustive: anything else fails closed.
            _ => (Err(StatusCode::SERVICE_UNAVAILABLE), Source::Closed),
        };
        observe::fallback(source.name(), &cause);
        result
    }

    async fn leave(&self, key: &str, held: Held) {
        match held {
            Held::Redis(lease) => {
                // Stops the renewals; a failed release leaves the permit to its TTL.
                let _ = lease.release().await;
            }
            Held::Local => {
                let mut map = self.local.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(n) = map.get_mut(key) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        map.remove(key);
                    }
                }
            }
            Held::Nothing => {}
        }
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimitService<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    C: ConnectionLike + Clone + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let key = (shared.key)(&parts);
            match shared.enter(&key).await {
                Ok((held, source)) => {
                    parts.extensions.insert(source);
                    let result = inner.call(Request::from_parts(parts, body)).await;
                    shared.leave(&key, held).await;
                    result
                }
                Err(status) => {
                    let mut response = Response::new(ResBody::default());
                    *response.status_mut() = status;
                    if status != StatusCode::INTERNAL_SERVER_ERROR {
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
