//! J2: rate-limit an endpoint with a tower layer, per user 10 per second and
//! per tenant 1000 per minute shared by its users, with the `RateLimit` and
//! `RateLimit-Policy` headers. The service names four nolock items:
//! `Client`, `quota!`, `layer::RateLimitLayer` and `layer::Identity`; no
//! connection and no Redis key (`rate::Quota` only so that the test can
//! pass smaller quotas).
//!
//! ```text
//! cargo run --example j2_layer --features tower
//! curl -i -H 'x-tenant: acme' -H 'x-user: alice' http://127.0.0.1:3000/hello
//! ```
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1/`), `PORT` (default
//! 3000). A request without `x-tenant` or `x-user` (or with an empty one) is
//! answered `401` and never reaches the limits: there is no "anonymous,
//! unlimited" path. An admitted request gets both limits in its headers; a
//! denied one `429` with `Retry-After`. The test below
//! (`cargo test --example j2_layer --features tower`) starts its own
//! redis-server unless `REDIS_URL` is set.

use axum::http::{request::Parts, StatusCode};
use axum::{routing::get, Router};
use nolock::layer::{Identity, RateLimitLayer};
use nolock::rate::Quota;
use nolock::Client;

#[cfg(test)]
#[path = "../tests/support/server.rs"]
mod server;

/// The service: `GET /hello`, at most `per_user` per user and `per_tenant`
/// per tenant, the tenant's quota shared by all its users. A request must
/// fit both; a denied one takes from neither. (The quotas are parameters so
/// that the test can use a small tenant quota; `main` passes
/// `quota!(10 per second)` and `quota!(1000 per minute)`.)
pub fn app(client: &Client, per_user: Quota, per_tenant: Quota) -> nolock::Result<Router> {
    let limits = client
        .rate_limits("j2-api")
        .per_member("user", per_user)
        .per_scope("tenant", per_tenant)
        .build()?;
    Ok(Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::scoped(limits, |req| {
            // Who is calling: the `x-tenant` and `x-user` headers here, an
            // authenticated principal in a real service. Either missing or
            // empty: `401`, before any limit.
            match (header(req, "x-tenant"), header(req, "x-user")) {
                (Some(tenant), Some(user)) => Identity::member(tenant, user),
                _ => Identity::Rejected(StatusCode::UNAUTHORIZED),
            }
        })))
}

/// A header's value, when it is there, text and not empty.
fn header<'r>(req: &'r Parts, name: &str) -> Option<&'r str> {
    let value = req.headers.get(name)?.to_str().ok()?;
    Some(value).filter(|v| !v.is_empty())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1/".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let client = Client::connect(url).await?;
    let app = app(
        &client,
        nolock::quota!(10 per second),
        nolock::quota!(1000 per minute),
    )?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on 127.0.0.1:{port}");
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper::client::conn::http1::SendRequest;

    struct Reply {
        status: u16,
        policy: Option<String>,
        rate_limit: Option<String>,
        retry_after: Option<String>,
        body: String,
    }

    async fn get(sender: &mut SendRequest<Empty<Bytes>>, headers: &[(&str, &str)]) -> Reply {
        let mut request = hyper::Request::get("/hello").header("host", "localhost");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = sender
            .send_request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let header = |name: &str| {
            let value = response.headers().get(name)?;
            Some(value.to_str().unwrap().to_owned())
        };
        let policy = header("ratelimit-policy");
        let (rate_limit, retry_after) = (header("ratelimit"), header("retry-after"));
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            policy,
            rate_limit,
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// The `r=` of `limit` in a `RateLimit` header.
    fn remaining(rate_limit: &str, limit: &str) -> u64 {
        let item = rate_limit
            .split(", ")
            .find(|item| item.starts_with(&format!("\"{limit}\";")))
            .unwrap_or_else(|| panic!("no {limit} in {rate_limit}"));
        let r = item.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
        r.parse().unwrap()
    }

    #[tokio::test]
    async fn users_and_their_tenant_are_limited_and_no_identity_gets_401() {
        let (url, _server) = server::url_from_env_or_start();
        let client = Client::connect(url).await.unwrap();
        // Tenants of their own, for a shared REDIS_URL.
        let acme = format!("acme-{}", std::process::id());
        let globex = format!("globex-{}", std::process::id());
        // 10 per second per user, as in `main`; a tenant quota of 20 per
        // minute (one back every 3 s), small enough to run out in the test.
        let per_user = Quota::per_second(10).unwrap();
        let app = app(&client, per_user, Quota::per_minute(20).unwrap()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);

        // Alice: GCRA, 10 per second, so a full limit admits 10 at once
        // and one more every 100 ms. Requests are sent until the first 429;
        // on a run under 100 ms (the usual case) that is exactly the 11th.
        let start = Instant::now();
        let mut admitted = 0u64;
        let alice = [("x-tenant", acme.as_str()), ("x-user", "alice")];
        let denied = loop {
            let reply = get(&mut sender, &alice).await;
            if reply.status != 200 || admitted == 100 {
                break reply;
            }
            admitted += 1;
            assert_eq!(reply.body, "hello\n");
            assert_eq!(reply.retry_after, None);
            let policy = reply.policy.unwrap();
            assert_eq!(policy, r#""user";q=10;w=1, "tenant";q=20;w=60"#);
            let rate_limit = reply.rate_limit.unwrap();
            assert_eq!(remaining(&rate_limit, "tenant"), 20 - admitted);
        };
        let refilled = (start.elapsed().as_millis() / 100) as u64;
        assert!(
            (10..=10 + refilled).contains(&admitted),
            "{admitted} admitted, {refilled} refilled"
        );
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert_eq!(denied.retry_after.as_deref(), Some("1")); // under 1 s, rounded up
        assert!(denied.policy.unwrap().contains(r#""tenant";q=20;w=60"#));
        let rate_limit = denied.rate_limit.unwrap();
        assert_eq!(remaining(&rate_limit, "user"), 0);
        // The denial took nothing from the tenant.
        assert_eq!(remaining(&rate_limit, "tenant"), 20 - admitted);

        // Bob, same tenant, has a limit of his own.
        let reply = get(
            &mut sender,
            &[("x-tenant", acme.as_str()), ("x-user", "bob")],
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(remaining(&reply.rate_limit.unwrap(), "user"), 9);
        let used = admitted + 1;

        // The tenant's quota is shared: new users, one request each, run it
        // out; then a user who never sent a request is refused too.
        let mut fresh = 0u64;
        let tenant_denied = loop {
            let user = format!("user-{fresh}");
            let reply = get(
                &mut sender,
                &[("x-tenant", acme.as_str()), ("x-user", user.as_str())],
            )
            .await;
            if reply.status != 200 || fresh == 100 {
                break reply;
            }
            fresh += 1;
        };
        // One comes back every 3 s.
        let refilled = start.elapsed().as_secs() / 3;
        assert!(
            (20 - used..=20 - used + refilled).contains(&fresh),
            "{fresh} fresh users admitted after {used}, {refilled} refilled"
        );
        assert_eq!(tenant_denied.status, 429, "{}", tenant_denied.body);
        let rate_limit = tenant_denied.rate_limit.unwrap();
        assert_eq!(remaining(&rate_limit, "tenant"), 0);
        assert_eq!(remaining(&rate_limit, "user"), 10); // untouched
        let wait: u64 = tenant_denied.retry_after.unwrap().parse().unwrap();
        assert!((1..=3).contains(&wait), "{wait}");

        // Another tenant is not affected.
        let reply = get(
            &mut sender,
            &[("x-tenant", globex.as_str()), ("x-user", "alice")],
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);

        // No identity (a header missing or empty): 401 with a body and no
        // limit headers, every time, never let through unlimited.
        for headers in [
            &[("x-user", "alice")][..],
            &[("x-tenant", &*globex)][..],
            &[("x-tenant", &*globex), ("x-user", "")][..],
            &[][..],
        ] {
            for _ in 0..3 {
                let reply = get(&mut sender, headers).await;
                assert_eq!(reply.status, 401, "{:?}", headers);
                assert!(!reply.body.is_empty());
                assert!(reply.policy.is_none() && reply.rate_limit.is_none());
            }
        }
    }
}
