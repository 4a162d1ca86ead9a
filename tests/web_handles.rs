//! The tower layer built from client handles ([`RateLimitLayer::limit`],
//! [`RateLimitLayer::scoped`]) in a real axum service, against real
//! redis-servers, with real HTTP requests: limits per id and per scope, ids
//! that would collide as hand-written keys stay apart, a bad id answers
//! `500` with a body naming the problem, and the keys of a scope share one
//! cluster slot.

mod support;

use std::collections::HashMap;

use http::request::Parts;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use nolock::client::Scope;
use nolock::layer::{Identity, RateLimitLayer};
use nolock::rate::Quota;
use nolock::Client;
use support::deployment::Deployment;
use support::RedisServer;

/// A response: status, headers (lower-case names), body.
struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// `app` behind `layer` on a free port; returns its address.
async fn serve(layer: RateLimitLayer) -> std::net::SocketAddr {
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello\n" }))
        .route("/health", axum::routing::get(|| async { "ok\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// `GET /` with these headers, over a new HTTP/1.1 connection.
async fn get(addr: std::net::SocketAddr, headers: &[(&str, &str)]) -> Reply {
    get_path(addr, "/", headers).await
}

/// `GET path` with these headers, over a new HTTP/1.1 connection.
async fn get_path(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut request = hyper::Request::get(path).header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Empty::<Bytes>::new()).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
        .collect();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn header<'a>(req: &'a Parts, name: &str) -> Option<&'a str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The `x-user` header as the id, verbatim (an empty one included, so that
/// a bad id reaches the layer); `/health` unlimited; no header: `401`.
fn user(req: &Parts) -> Identity<String> {
    if req.uri.path() == "/health" {
        return Identity::Unlimited;
    }
    Identity::required(
        header(req, "x-user").map(str::to_owned),
        StatusCode::UNAUTHORIZED,
    )
}

/// `x-tenant` and `x-user` as they come (empty ones included), the member
/// left out when `x-user` is missing (so that the scope is bad for limits
/// per member); no `x-tenant`: `401`.
fn tenant_user(req: &Parts) -> Identity<Scope> {
    let Some(tenant) = header(req, "x-tenant") else {
        return Identity::Rejected(StatusCode::UNAUTHORIZED);
    };
    let scope = Scope::new(tenant);
    Identity::Limited(match header(req, "x-user") {
        Some(user) => scope.member(user),
        None => scope,
    })
}

#[tokio::test]
async fn a_rate_limit_handle_limits_each_id() {
    let redis = RedisServer::start();
    let client = Client::from_connection(redis.conn().await).await.unwrap();
    let per_user = client
        .rate_limit("per-user", Quota::per_hour(3).unwrap())
        .unwrap();
    let addr = serve(RateLimitLayer::limit(per_user, user)).await;

    for i in 0..3u64 {
        let r = get(addr, &[("x-user", "alice")]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body, "hello\n");
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(r#""per-user";q=3;w=3600"#)
        );
        let rate = r.header("ratelimit").unwrap();
        assert!(
            rate.starts_with(&format!(r#""per-user";r={};"#, 2 - i)),
            "{rate}"
        );
        assert_eq!(r.header("retry-after"), None);
    }
    let denied = get(addr, &[("x-user", "alice")]).await;
    assert_eq!(denied.status, 429);
    assert!(denied.header("retry-after").is_some());
    assert!(denied
        .header("ratelimit")
        .unwrap()
        .starts_with(r#""per-user";r=0;"#));

    // Another id has a limit of its own.
    let bob = get(addr, &[("x-user", "bob")]).await;
    assert_eq!(bob.status, 200, "{}", bob.body);

    // Every request gets what the id function says: no header is 401,
    // /health passes without a check.
    let anonymous = get(addr, &[]).await;
    assert_eq!(anonymous.status, 401);
    assert!(!anonymous.body.is_empty());
    assert_eq!(anonymous.header("ratelimit"), None);
    for _ in 0..5 {
        let health = get_path(addr, "/health", &[("x-user", "alice")]).await;
        assert_eq!(health.status, 200);
        assert_eq!(health.body, "ok\n");
        assert_eq!(health.header("ratelimit"), None);
    }
}

/// An operator's switch reaches the layers built from handles: a blocked
/// name answers 429 without `Retry-After`, an unlimited one 200, for one
/// limit and for several, and unblocking brings back the numbers with the
/// state they had.
#[tokio::test]
async fn the_layers_follow_the_kill_switch() {
    use nolock::config::Family;

    let redis = RedisServer::start();
    let client = Client::from_connection(redis.conn().await).await.unwrap();
    let configs = client.configs();
    let per_user = client
        .rate_limit("switched", Quota::per_hour(1).unwrap())
        .unwrap();
    let one = serve(RateLimitLayer::limit(per_user, user)).await;
    let limits = client
        .rate_limits("switched-multi")
        .per_member("user", Quota::per_hour(1).unwrap())
        .per_scope("tenant", Quota::per_hour(10).unwrap())
        .build()
        .unwrap();
    let several = serve(RateLimitLayer::scoped(limits, tenant_user)).await;
    let alice = [("x-user", "alice")];
    let acme_alice = [("x-tenant", "acme"), ("x-user", "alice")];
    for (addr, headers) in [(one, &alice[..]), (several, &acme_alice[..])] {
        assert_eq!(get(addr, headers).await.status, 200);
        assert_eq!(get(addr, headers).await.status, 429);
    }

    for family in [Family::RateLimit, Family::RateLimits] {
        let name = if family == Family::RateLimit {
            "switched"
        } else {
            "switched-multi"
        };
        configs.unlimit(family, name).await.unwrap();
    }
    configs.refresh().await.unwrap();
    for (addr, headers) in [(one, &alice[..]), (several, &acme_alice[..])] {
        for _ in 0..3 {
            let r = get(addr, headers).await;
            assert_eq!(r.status, 200, "unlimited: {}", r.body);
        }
    }

    configs.block(Family::RateLimit, "switched").await.unwrap();
    configs
        .block(Family::RateLimits, "switched-multi")
        .await
        .unwrap();
    configs.refresh().await.unwrap();
    for (addr, headers) in [
        (one, &[("x-user", "bob")][..]),
        (several, &[("x-tenant", "acme"), ("x-user", "bob")][..]),
    ] {
        let r = get(addr, headers).await;
        assert_eq!(r.status, 429, "blocked: {}", r.body);
        assert_eq!(r.header("retry-after"), None);
        assert!(r.header("ratelimit").is_some());
    }

    configs
        .unblock(Family::RateLimit, "switched")
        .await
        .unwrap();
    configs
        .unblock(Family::RateLimits, "switched-multi")
        .await
        .unwrap();
    configs.refresh().await.unwrap();
    for (addr, headers) in [(one, &alice[..]), (several, &acme_alice[..])] {
        assert_eq!(
            get(addr, headers).await.status,
            429,
            "alice's state is kept"
        );
    }
    assert_eq!(get(one, &[("x-user", "carol")]).await.status, 200);
}

#[tokio::test]
async fn rate_limits_handle_limits_per_member_and_shares_per_scope() {
    let redis = RedisServer::start();
    let client = Client::from_connection(redis.conn().await).await.unwrap();
    let limits = client
        .rate_limits("api")
        .per_member("user", Quota::per_hour(2).unwrap())
        .per_scope("tenant", Quota::per_hour(3).unwrap())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::scoped(limits, tenant_user)).await;
    let policy = r#""user";q=2;w=3600, "tenant";q=3;w=3600"#;
    let acme_alice = [("x-tenant", "acme"), ("x-user", "alice")];

    for _ in 0..2 {
        let r = get(addr, &acme_alice).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("ratelimit-policy"), Some(policy));
    }
    // Alice's own limit refuses; the tenant is not charged for it.
    let denied = get(addr, &acme_alice).await;
    assert_eq!(denied.status, 429);
    let rate = denied.header("ratelimit").unwrap();
    assert!(rate.starts_with(r#""user";r=0;"#), "{rate}");
    assert!(rate.contains(r#""tenant";r=1;"#), "{rate}");

    // Bob takes the tenant's last unit; then carol, who sent nothing yet,
    // is refused by the shared limit.
    let bob = get(addr, &[("x-tenant", "acme"), ("x-user", "bob")]).await;
    assert_eq!(bob.status, 200, "{}", bob.body);
    let carol = get(addr, &[("x-tenant", "acme"), ("x-user", "carol")]).await;
    assert_eq!(carol.status, 429);
    let rate = carol.header("ratelimit").unwrap();
    assert!(rate.starts_with(r#""user";r=2;"#), "{rate}");
    assert!(rate.contains(r#""tenant";r=0;"#), "{rate}");

    // Another tenant is apart.
    let other = get(addr, &[("x-tenant", "globex"), ("x-user", "carol")]).await;
    assert_eq!(other.status, 200, "{}", other.body);

    let anonymous = get(addr, &[("x-user", "alice")]).await;
    assert_eq!(anonymous.status, 401);
    assert!(!anonymous.body.is_empty());
}

#[tokio::test]
async fn ids_that_collide_as_raw_keys_stay_apart() {
    let redis = RedisServer::start();
    let client = Client::from_connection(redis.conn().await).await.unwrap();
    let one = client
        .rate_limit("one", Quota::per_hour(1).unwrap())
        .unwrap();
    let addr = serve(RateLimitLayer::limit(one, user)).await;
    // `}` is escaped as `%7D`, and `%` as `%25`: neither id reads as the
    // other, nor ends the hash tag early.
    for id in ["a}b", "a%7Db", "a", "a}", "a%"] {
        let first = get(addr, &[("x-user", id)]).await;
        assert_eq!(first.status, 200, "{id}: {}", first.body);
        let second = get(addr, &[("x-user", id)]).await;
        assert_eq!(second.status, 429, "{id}");
    }

    // `format!("{tenant}:{user}")` would give `a:b:c` twice here; a scope
    // and its member are kept apart.
    let limits = client
        .rate_limits("scoped")
        .per_member("user", Quota::per_hour(1).unwrap())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::scoped(limits, tenant_user)).await;
    for (tenant, user) in [("a:b", "c"), ("a", "b:c"), ("a}", "b"), ("a", "}b")] {
        let headers = [("x-tenant", tenant), ("x-user", user)];
        let first = get(addr, &headers).await;
        assert_eq!(first.status, 200, "{tenant} {user}: {}", first.body);
        let second = get(addr, &headers).await;
        assert_eq!(second.status, 429, "{tenant} {user}");
    }
}

#[tokio::test]
async fn a_bad_id_answers_500_naming_the_problem() {
    let redis = RedisServer::start();
    let client = Client::from_connection(redis.conn().await).await.unwrap();
    let per_user = client
        .rate_limit("per-user", Quota::per_hour(3).unwrap())
        .unwrap();
    let addr = serve(RateLimitLayer::limit(per_user, user)).await;
    let long = "x".repeat(nolock::client::MAX_ID_LEN + 1);
    for id in ["", long.as_str()] {
        for _ in 0..2 {
            let r = get(addr, &[("x-user", id)]).await;
            assert_eq!(r.status, 500);
            assert_eq!(r.header("ratelimit"), None);
            assert!(
                r.body
                    .starts_with("rate limit misconfigured: the id of the request is invalid: "),
                "{}",
                r.body
            );
            assert!(r.body.contains(&format!("got {}", id.len())), "{}", r.body);
            // The id itself is not echoed.
            assert!(!r.body.contains("xxxx"), "{}", r.body);
        }
    }

    let limits = client
        .rate_limits("api")
        .per_member("user", Quota::per_hour(2).unwrap())
        .per_scope("tenant", Quota::per_hour(3).unwrap())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::scoped(limits, tenant_user)).await;
    // A scope without the member its limits need; an empty member; an
    // empty scope.
    for (headers, what) in [
        (&[("x-tenant", "acme")][..], "scope"),
        (&[("x-tenant", "acme"), ("x-user", "")][..], "member id"),
        (&[("x-tenant", ""), ("x-user", "alice")][..], "id"),
    ] {
        let r = get(addr, headers).await;
        assert_eq!(r.status, 500, "{headers:?}");
        let prefix = format!("rate limit misconfigured: the {what} of the request is invalid: ");
        assert!(r.body.starts_with(&prefix), "{headers:?}: {}", r.body);
        assert!(r.body.len() > prefix.len() + 1, "{}", r.body);
    }
    // Nothing was charged by the refusals.
    let r = get(addr, &[("x-tenant", "acme"), ("x-user", "alice")]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("ratelimit").unwrap().contains(r#""tenant";r=2;"#));
}

#[tokio::test]
async fn the_keys_of_a_scope_share_one_cluster_slot() {
    let Deployment::Cluster(cluster) = Deployment::cluster() else {
        unreachable!()
    };
    let client = Client::from_connection(cluster.conn().await).await.unwrap();
    let limits = client
        .rate_limits("api")
        .per_member("user", Quota::per_hour(1).unwrap())
        .per_scope("tenant", Quota::per_hour(100).unwrap())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::scoped(limits, tenant_user)).await;
    // Tenants and users spread over the cluster's slots: every check is one
    // script call on one node, never a cross-slot error.
    for t in 0..8 {
        let tenant = format!("tenant-{t}");
        for u in 0..3 {
            let user = format!("user-{u}");
            let headers = [("x-tenant", tenant.as_str()), ("x-user", user.as_str())];
            let r = get(addr, &headers).await;
            assert_eq!(r.status, 200, "{tenant} {user}: {}", r.body);
            assert!(r
                .header("ratelimit")
                .unwrap()
                .contains(&format!(r#""tenant";r={};"#, 99 - u)));
            assert_eq!(get(addr, &headers).await.status, 429);
        }
    }
}
