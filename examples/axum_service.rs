//! A small axum service behind nolock's rate-limit layer: a per-user limit
//! and a global limit, checked together in one script call, with a failure
//! policy for when Redis is slow or down.
//!
//! ```text
//! cargo run --example axum_service --features tower
//! curl -i -H 'x-user: alice' http://127.0.0.1:3000/hello
//! ```
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1/`), `PORT` (default
//! 3000), `NOLOCK_POLICY` = `closed` (default), `open` or `local`,
//! `REPLICAS` (for `local`, default 2). `tests/web.rs` runs [`app`] on a free
//! port against its own redis-server.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{request::Parts, StatusCode};
use axum::{extract::Extension, routing::get, Router};
use nolock::layer::{Identity, RateLimitLayer};
use nolock::policy::{DecidedBy, Guard, OnFailure};
use nolock::rate::{Algorithm, MultiKey, MultiLimiter, Quota};
use redis::aio::ConnectionLike;

/// Per user: 5 per minute. For everyone together: 100 per minute.
pub fn limits() -> nolock::Result<MultiLimiter> {
    MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_minute(5)?)?
        .shared_limit("global", Quota::per_minute(100)?)
}

/// The global limit's key. Every key of one check must share a cluster slot,
/// so the user keys carry the same `{svc}` hash tag (on a cluster this puts
/// the whole service's limits on one node: fine for one service, and the
/// reason a per-tenant tag is the better choice at scale).
pub const GLOBAL_KEY: &str = "{svc}:global";

/// The keys of a request: the user's (the `x-user` header, an authenticated
/// user id in a real service) and the global limit's. `/health` is not
/// limited, said so; a request without a user is refused with `401`, never
/// let through unlimited.
fn keys(req: &Parts) -> Identity<MultiKey> {
    if req.uri.path() == "/health" {
        return Identity::Unlimited;
    }
    let user = req.headers.get("x-user").and_then(|v| v.to_str().ok());
    let keys = user
        .map(|user| MultiKey::new(&format!("{{svc}}:user:{user}")).shared("global", GLOBAL_KEY));
    Identity::required(keys, StatusCode::UNAUTHORIZED)
}

/// The service: `GET /hello` says who was served and who decided.
pub fn app<C>(conn: C, guard: Guard) -> nolock::Result<Router>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let layer = RateLimitLayer::multi(conn, limits()?, keys)?.guard(guard);
    Ok(Router::new()
        .route("/hello", get(hello))
        .route("/health", get(|| async { "ok" }))
        .layer(layer))
}

async fn hello(source: Option<Extension<DecidedBy>>) -> String {
    let by = source.map_or("nobody", |Extension(s)| s.name());
    format!("hello (decided by {by})\n")
}

/// The guard for `NOLOCK_POLICY`: 100 ms per decision.
pub fn guard_from_env() -> nolock::Result<Guard> {
    let on_failure = match std::env::var("NOLOCK_POLICY").as_deref() {
        Ok("open") => OnFailure::Open,
        Ok("local") => {
            let replicas = std::env::var("REPLICAS")
                .ok()
                .and_then(|r| r.parse().ok())
                .and_then(NonZeroU32::new)
                .unwrap_or(NonZeroU32::MIN.saturating_add(1));
            OnFailure::Local { replicas }
        }
        _ => OnFailure::Closed,
    };
    Guard::new(Duration::from_millis(100), on_failure)
}

#[allow(dead_code)] // tests/web.rs includes this file and calls `app` only.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1/".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    // ConnectionManager reconnects by itself once Redis is back.
    let conn = redis::Client::open(url)?.get_connection_manager().await?;
    let guard = guard_from_env()?;
    println!(
        "policy {:?}, listening on 127.0.0.1:{port}",
        guard.on_failure()
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app(conn, guard)?).await?;
    Ok(())
}
