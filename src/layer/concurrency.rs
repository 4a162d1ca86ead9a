//! [`ConcurrencyLimitLayer`]: at most N requests in flight per key, across
//! every replica, on [`crate::semaphore`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::header::{HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use redis::aio::ConnectionLike;
use tower_layer::Layer;
use tower_service::Service;

use super::{answer, invalid_request, Identity, KeyFn, DEFAULT_TIMEOUT, UNAVAILABLE};
use crate::observe;
use crate::policy::{DecidedBy, Failure, Guard, OnFailure};
use crate::semaphore::{Permit, PermitAttempt, PermitId, PermitLease, Semaphore};
use crate::timer;
use crate::Error;

/// At most N requests in flight per key (a tenant, a user, one fragile
/// backend), counted across every replica of the service with a
/// [`Semaphore`]: a permit is acquired before the inner service runs and
/// released when its response (headers) is ready. The key function answers
/// an [`Identity`] for every request: [`Identity::Limited`] with its key,
/// [`Identity::Unlimited`] (it passes untouched) or [`Identity::Rejected`]
/// (answered with that status and a short body).
///
/// * full: `429 Too Many Requests` with `Retry-After: 1` (permits usually
///   come back sooner than their TTL);
/// * Redis slow or down (past the guard's timeout, default
///   [`DEFAULT_TIMEOUT`]): by the guard's [`OnFailure`]: `Closed` (default)
///   answers `503` with `Retry-After: 1`, `Open` lets the request through,
///   `Local { replicas }` allows `permits / replicas` (at least 1) in
///   flight per key in this process. The [`DecidedBy`] goes into the
///   request's extensions;
/// * invalid input (an empty key): `500` with a one-line body naming the
///   problem, reported as in [`super::RateLimitLayer`].
///
/// Each permit is acquired under an id drawn before anything is sent: an
/// acquire that timed out or lost its reply may still have taken a permit
/// on the server, so the layer releases that id in the background (a
/// release of a permit never granted is harmless) instead of leaving it to
/// its TTL. Each permit held is a [`PermitLease`]: renewed every `ttl / 3`
/// while its request runs, so a request may take longer than `ttl`. The TTL
/// bounds how long the permit of a replica that died mid-request keeps its
/// slot. A permit whose renewal fails for longer than its TTL is lost
/// (counted as a lease loss by the `metrics` feature); the request still
/// runs to its end, so for that while more than `permits` requests may be
/// in flight. A request whose future is dropped (the client went away, an
/// outer timeout, a panicking handler) gives its permit, or its local slot,
/// back. A streamed body still being sent after the headers no longer holds
/// one.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{routing::post, Router};
/// use http::StatusCode;
/// use nolock::layer::{ConcurrencyLimitLayer, Identity};
/// use nolock::semaphore::Semaphore;
///
/// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let exports = Semaphore::new(2, Duration::from_secs(30))?;
/// let app: Router = Router::new()
///     .route("/export", post(|| async { "done" }))
///     .layer(ConcurrencyLimitLayer::new(conn, exports, |req| {
///         let tenant = req.headers.get("x-tenant").and_then(|v| v.to_str().ok());
///         Identity::required(tenant.map(|t| format!("exports:{t}")), StatusCode::BAD_REQUEST)
///     }));
/// # Ok(()) }
/// ```
pub struct ConcurrencyLimitLayer<C> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    conn: C,
    semaphore: Semaphore,
    key: Arc<KeyFn>,
    guard: Guard,
    /// In-flight requests per key admitted by `OnFailure::Local`.
    local: Arc<Mutex<HashMap<String, u64>>>,
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
            .field("semaphore", &self.shared.semaphore)
            .field("guard", &self.shared.guard)
            .finish_non_exhaustive()
    }
}

impl<C> ConcurrencyLimitLayer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// At most `semaphore.permits()` requests in flight per key that
    /// `key(request)` names (see [`Identity`]), each permit expiring `semaphore.ttl()` after
    /// its last renewal. The semaphore was validated when it was built;
    /// only its size and TTL are used (a request never waits for a permit).
    pub fn new(
        conn: C,
        semaphore: Semaphore,
        key: impl Fn(&Parts) -> Identity<String> + Send + Sync + 'static,
    ) -> Self {
        ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                conn,
                semaphore: semaphore.with_wait(crate::Backoff::none()),
                key: Arc::new(key),
                guard: Guard::unchecked(DEFAULT_TIMEOUT, OnFailure::Closed),
                local: Arc::new(Mutex::new(HashMap::new())),
            }),
        }
    }

    /// Decide under `guard` (timeout and failure policy) instead of the
    /// default ([`DEFAULT_TIMEOUT`], fail closed), as
    /// [`super::RateLimitLayer::guard`].
    pub fn guard(self, guard: Guard) -> Self {
        // A layer already cloned shares its settings: change a copy (with
        // its own local fallback counts), so the call is never lost.
        let shared = Arc::try_unwrap(self.shared).unwrap_or_else(|s| Shared {
            conn: s.conn.clone(),
            semaphore: s.semaphore.clone(),
            key: Arc::clone(&s.key),
            guard: s.guard.clone(),
            local: Arc::new(Mutex::new(HashMap::new())),
        });
        ConcurrencyLimitLayer {
            shared: Arc::new(Shared { guard, ..shared }),
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

/// What was taken for one request; dropping it gives it back.
enum Held {
    /// A permit: released (in the background) when the lease drops.
    Redis(PermitLease),
    /// A slot of the local fallback, given back when dropped.
    Local {
        _slot: LocalSlot,
    },
    Nothing,
}

/// A slot of `OnFailure::Local`, given back when dropped: after the
/// response, and also when the request's future is dropped on the way.
struct LocalSlot {
    counts: Arc<Mutex<HashMap<String, u64>>>,
    key: String,
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        let mut map = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// A permit asked for but not known to be granted or refused: unless
/// disarmed, dropping it releases the id in the background, so a permit
/// taken by an acquire whose reply never came (a timeout, a lost reply, a
/// dropped request) does not sit out its TTL.
struct Pending<C: ConnectionLike + Clone + Send + 'static> {
    conn: C,
    permit: Option<Permit>,
}

impl<C: ConnectionLike + Clone + Send + 'static> Drop for Pending<C> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut conn = self.conn.clone();
        // Nothing resends the acquire after this release, cluster included:
        // the guard drops only after the acquire's future was answered or
        // dropped (`enter`'s `select!`), and that future holds nolock's own
        // resends (`Invocation::run`); a cluster client built with
        // `retries(0)` resends nothing itself, and redis-rs never sends a
        // queued request whose caller is gone. One already handed to the
        // node's connection goes out ahead of this release on it; only bytes
        // of a connection the client gave up on, still in the network, could
        // land after it (that permit then lives out its TTL).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Harmless when nothing was granted; a failure leaves it to its TTL.
                let _ = permit.release(&mut conn).await;
            });
        }
    }
}

impl<C> Shared<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `Ok((what was taken, who decided))`, or the refusal's status and body.
    async fn enter(&self, key: &str) -> Result<(Held, DecidedBy), (StatusCode, String)> {
        let internal = |err: Error| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                invalid_request("concurrency", &err),
            )
        };
        let id = PermitId::random().map_err(internal)?;
        let permit = self
            .semaphore
            .restore(key, id.clone(), 1)
            .map_err(internal)?;
        let mut pending = Pending {
            conn: self.conn.clone(),
            permit: Some(permit),
        };
        let mut conn = self.conn.clone();
        let timeout = self.guard.timeout();
        let sleep = match timer::sleep(timeout) {
            Ok(sleep) => sleep,
            Err(err) => {
                pending.permit = None; // nothing was sent
                return Err(internal(err));
            }
        };
        let call = self.semaphore.acquire_as(&mut conn, key, &id, 1);
        let result = tokio::select! {
            result = call => Some(result),
            _ = sleep => None,
        };
        let cause = match result {
            Some(Ok(PermitAttempt::Acquired(permit))) => {
                pending.permit = None;
                return match PermitLease::start(self.conn.clone(), permit) {
                    Ok(lease) => Ok((Held::Redis(lease), DecidedBy::Redis)),
                    Err(err) => Err(internal(err)),
                };
            }
            Some(Ok(PermitAttempt::Full { .. })) => {
                pending.permit = None;
                return Err((StatusCode::TOO_MANY_REQUESTS, String::new()));
            }
            Some(Err(err)) if err.is_invalid_input() => {
                pending.permit = None;
                return Err(internal(err));
            }
            // A definite error ran nothing; an indeterminate one or a
            // timeout may have: `pending` releases the id either way.
            Some(Err(err)) => Failure::Redis(err),
            None => Failure::Timeout(timeout),
        };
        let (result, source) = match self.guard.on_failure() {
            OnFailure::Open => (Ok((Held::Nothing, DecidedBy::Open)), DecidedBy::Open),
            OnFailure::Local { replicas } => {
                let share = (self.semaphore.permits() / u64::from(replicas.get())).max(1);
                let mut map = self.local.lock().unwrap_or_else(|e| e.into_inner());
                let in_flight = map.entry(key.to_owned()).or_insert(0);
                if *in_flight < share {
                    *in_flight += 1;
                    let slot = LocalSlot {
                        counts: Arc::clone(&self.local),
                        key: key.to_owned(),
                    };
                    (
                        Ok((Held::Local { _slot: slot }, DecidedBy::Local)),
                        DecidedBy::Local,
                    )
                } else {
                    (
                        Err((StatusCode::TOO_MANY_REQUESTS, String::new())),
                        DecidedBy::Local,
                    )
                }
            }
            // `OnFailure` is non-exhaustive: anything else fails closed.
            _ => (
                Err((StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE.to_owned())),
                DecidedBy::Closed,
            ),
        };
        observe::fallback(source.name(), &cause);
        result
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimitService<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
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
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let key = match (shared.key)(&parts) {
                Identity::Limited(key) => key,
                Identity::Unlimited => return inner.call(Request::from_parts(parts, body)).await,
                Identity::Rejected(status) => {
                    return Ok(answer(status, super::NO_IDENTITY.to_owned()));
                }
            };
            match shared.enter(&key).await {
                Ok((held, source)) => {
                    parts.extensions.insert(source);
                    let result = inner.call(Request::from_parts(parts, body)).await;
                    if let Held::Redis(lease) = held {
                        // Stops the renewals; a failed release leaves the
                        // permit to its TTL. (A dropped future drops the
                        // lease or the slot, which give back on their own.)
                        let _ = lease.release().await;
                    }
                    result
                }
                Err((status, body)) => {
                    let mut response = answer::<ResBody>(status, body);
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
