//! The tower layer in a real axum service (`examples/axum_service.rs`) on a
//! free port, against a real redis-server, with real HTTP requests; the
//! failure policies with Redis stopped or too slow. (What the `metrics` and
//! `tracing` features record is in `tests/observe.rs`.)

mod support;

#[allow(dead_code)]
#[path = "../examples/axum_service.rs"]
mod axum_service;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use nolock::layer::{ConcurrencyLimitLayer, Identity, RateLimitLayer};
use nolock::policy::{DecidedBy, Failure, Guard, Guarded, OnFailure};
use nolock::rate::{Algorithm, Limiter, Quota};
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

/// Serve `app` on a free port; returns its address.
async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// `GET path` as `user`, over a new HTTP/1.1 connection (hyper's client).
async fn get(addr: std::net::SocketAddr, path: &str, user: &str) -> Reply {
    get_with(addr, path, &[("x-user", user)]).await
}

/// `GET path` with these headers (and `host`).
async fn get_with(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
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

fn guard(on_failure: OnFailure) -> Guard {
    Guard::new(Duration::from_millis(100), on_failure).unwrap()
}

#[tokio::test]
async fn over_the_quota_is_429_with_headers() {
    let redis = RedisServer::start();
    let app = axum_service::app(redis.conn().await, guard(OnFailure::Closed)).unwrap();
    let addr = serve(app).await;

    // 5 per minute per user (GCRA, T = 12 s), 100 per minute for everyone.
    let policy = r#""user";q=5;w=60, "global";q=100;w=60"#;
    for i in 0..5u64 {
        let r = get(addr, "/hello", "alice").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body, "hello (decided by redis)\n");
        assert_eq!(r.header("ratelimit-policy"), Some(policy));
        // Full again 12 s per unit taken, rounded up to whole seconds.
        let user_t = 12 * (i + 1);
        let global_t = 0.6 * (i + 1) as f64;
        assert_eq!(
            r.header("ratelimit"),
            Some(
                format!(
                    r#""user";r={};t={user_t}, "global";r={};t={}"#,
                    4 - i,
                    99 - i,
                    global_t.ceil()
                )
                .as_str()
            )
        );
        assert_eq!(r.header("retry-after"), None);
    }

    let denied = get(addr, "/hello", "alice").await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.body, "");
    assert_eq!(denied.header("ratelimit-policy"), Some(policy));
    // One unit back 12 s after the first admission (less the test's own time).
    let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!((11..=12).contains(&retry), "Retry-After {retry}");
    let rate = denied.header("ratelimit").unwrap();
    assert!(
        rate.starts_with(&format!(r#""user";r=0;t={retry}, "global";r=95;t="#)),
        "{rate}"
    );

    // Another user has their own limit; the global one counts both.
    let bob = get(addr, "/hello", "bob").await;
    assert_eq!(bob.status, 200);
    assert!(bob
        .header("ratelimit")
        .unwrap()
        .contains(r#""global";r=94"#));
}

#[tokio::test]
async fn with_redis_stopped_each_policy_does_what_it_says() {
    let mut redis = RedisServer::start();
    let two = NonZeroU32::new(2).unwrap();
    let closed =
        serve(axum_service::app(redis.conn().await, guard(OnFailure::Closed)).unwrap()).await;
    let open = serve(axum_service::app(redis.conn().await, guard(OnFailure::Open)).unwrap()).await;
    let local = serve(
        axum_service::app(
            redis.conn().await,
            guard(OnFailure::Local { replicas: two }),
        )
        .unwrap(),
    )
    .await;
    for addr in [closed, open, local] {
        assert_eq!(
            get(addr, "/hello", "carol").await.body,
            "hello (decided by redis)\n"
        );
    }

    redis.kill();

    let r = get(closed, "/hello", "dave").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("ratelimit"), None);

    for _ in 0..8 {
        let r = get(open, "/hello", "dave").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello (decided by fail_open)\n");
        assert_eq!(
            r.header("ratelimit"),
            None,
            "nothing is known about the limit"
        );
    }

    // Local: 5 per minute over 2 replicas is a burst of 2 in this process.
    for _ in 0..2 {
        let r = get(local, "/hello", "dave").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello (decided by local)\n");
        assert!(r.header("ratelimit").unwrap().starts_with(r#""user";r="#));
    }
    let r = get(local, "/hello", "dave").await;
    assert_eq!(r.status, 429, "the local limiter still limits");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=24).contains(&retry), "one local unit is 24 s: {retry}");
    // The key function says the health route is not limited: it passes,
    // without headers, whatever the limit says.
    let health = get(local, "/health", "dave").await;
    assert_eq!((health.status, health.header("ratelimit")), (200, None));
}

#[tokio::test]
async fn a_slow_redis_times_out_into_the_fallback() {
    let redis = RedisServer::start();
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let mut conn = redis.conn().await;
    let mut blocker = redis.conn().await;
    let guard = Guard::new(Duration::from_millis(50), OnFailure::Open).unwrap();
    // The server holds every client's commands for 400 ms.
    redis::cmd("CLIENT")
        .arg(&["PAUSE", "400", "ALL"])
        .query_async::<()>(&mut blocker)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let g = guard
        .check(&limiter, &mut conn, "rl:slow", 1)
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(300));
    assert!(
        matches!(
            g,
            Guarded::Open {
                cause: Failure::Timeout(_)
            }
        ),
        "{g:?}"
    );
    assert!(g.allowed());
}

/// A service whose `/slow` waits at `gate` and answers who decided.
fn slow_app(
    conn: redis::aio::MultiplexedConnection,
    gate: Arc<tokio::sync::Semaphore>,
    entered: Arc<AtomicUsize>,
    on_failure: OnFailure,
) -> axum::Router {
    slow_app_with_ttl(conn, gate, entered, on_failure, Duration::from_secs(10))
}

fn slow_app_with_ttl(
    conn: redis::aio::MultiplexedConnection,
    gate: Arc<tokio::sync::Semaphore>,
    entered: Arc<AtomicUsize>,
    on_failure: OnFailure,
    ttl: Duration,
) -> axum::Router {
    let semaphore = nolock::semaphore::Semaphore::new(2, ttl).unwrap();
    let layer = ConcurrencyLimitLayer::new(conn, semaphore, |req| {
        let user = req.headers.get("x-user").and_then(|v| v.to_str().ok());
        Identity::Limited(format!("inflight:{}", user.unwrap_or("-")))
    })
    .guard(Guard::new(Duration::from_millis(100), on_failure).unwrap());
    let handler = move |source: Option<axum::Extension<DecidedBy>>| {
        let (gate, entered) = (Arc::clone(&gate), Arc::clone(&entered));
        async move {
            entered.fetch_add(1, Ordering::SeqCst);
            let _pass = gate.acquire().await;
            source
                .map_or("none", |axum::Extension(s)| s.name())
                .to_owned()
        }
    };
    axum::Router::new()
        .route("/slow", axum::routing::get(handler))
        .layer(layer)
}

async fn until_entered(entered: &AtomicUsize, n: usize) {
    for _ in 0..200 {
        if entered.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} requests never reached the handler");
}

#[tokio::test]
async fn at_most_n_requests_in_flight_per_key() {
    let mut redis = RedisServer::start();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let app = slow_app(
        redis.conn().await,
        Arc::clone(&gate),
        Arc::clone(&entered),
        OnFailure::Closed,
    );
    let addr = serve(app).await;

    let running: Vec<_> = ["alice", "alice", "bob"]
        .into_iter()
        .map(|user| tokio::spawn(async move { get(addr, "/slow", user).await }))
        .collect();
    until_entered(&entered, 3).await;
    // Two of alice's are running: a third is refused without reaching the handler.
    let refused = get(addr, "/slow", "alice").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(entered.load(Ordering::SeqCst), 3);

    gate.add_permits(3);
    for r in running {
        let r = r.await.unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "redis"));
    }
    // Each permit was given back before its response went out.
    let mut conn = redis.conn().await;
    let usage = nolock::semaphore::peek(&mut conn, "inflight:alice")
        .await
        .unwrap();
    assert_eq!(usage.in_use, 0);
    gate.add_permits(1);
    assert_eq!(get(addr, "/slow", "alice").await.status, 200);

    // Redis gone: Local admits 2 / 2 replicas = 1 in flight per key here;
    // Closed refuses with 503.
    let local_gate = Arc::new(tokio::sync::Semaphore::new(0));
    let local_entered = Arc::new(AtomicUsize::new(0));
    let two = NonZeroU32::new(2).unwrap();
    let local = serve(slow_app(
        redis.conn().await,
        Arc::clone(&local_gate),
        Arc::clone(&local_entered),
        OnFailure::Local { replicas: two },
    ))
    .await;
    redis.kill();
    assert_eq!(get(addr, "/slow", "carol").await.status, 503);
    let first = tokio::spawn(async move { get(local, "/slow", "carol").await });
    until_entered(&local_entered, 1).await;
    assert_eq!(get(local, "/slow", "carol").await.status, 429);
    local_gate.add_permits(2);
    let first = first.await.unwrap();
    assert_eq!((first.status, first.body.as_str()), (200, "local"));
    assert_eq!(
        get(local, "/slow", "carol").await.body,
        "local",
        "the slot came back"
    );
}

/// Requests that run for several TTLs keep their permits (the layer renews
/// them), so a third request is still refused; they come back at the end.
#[tokio::test]
async fn a_request_longer_than_the_permit_ttl_keeps_its_permit() {
    let redis = RedisServer::start();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let ttl = Duration::from_millis(300);
    let app = slow_app_with_ttl(
        redis.conn().await,
        Arc::clone(&gate),
        Arc::clone(&entered),
        OnFailure::Closed,
        ttl,
    );
    let addr = serve(app).await;
    let running: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "/slow", "dave").await }))
        .collect();
    until_entered(&entered, 2).await;
    let mut conn = redis.conn().await;
    for _ in 0..4 {
        tokio::time::sleep(ttl).await;
        let usage = nolock::semaphore::peek(&mut conn, "inflight:dave")
            .await
            .unwrap();
        assert_eq!(usage.in_use, 2, "both permits are still held");
        assert_eq!(get(addr, "/slow", "dave").await.status, 429);
    }
    assert_eq!(entered.load(Ordering::SeqCst), 2);
    gate.add_permits(2);
    for r in running {
        assert_eq!(r.await.unwrap().status, 200);
    }
    let usage = nolock::semaphore::peek(&mut conn, "inflight:dave")
        .await
        .unwrap();
    assert_eq!(usage.in_use, 0, "both permits were given back");
}

/// A builder call on a layer that was already cloned applies to that layer
/// and leaves the clone as it was (it used to be dropped silently).
#[tokio::test]
async fn a_builder_call_after_a_clone_is_not_lost() {
    let server = RedisServer::start();
    let conn = server.conn().await;
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let layer = RateLimitLayer::new(conn.clone(), limiter, |_| Identity::Limited("k".into()));
    let kept = layer.clone();
    let open = layer.guard(Guard::new(Duration::from_millis(40), OnFailure::Open).unwrap());
    let (open, kept) = (format!("{open:?}"), format!("{kept:?}"));
    assert!(open.contains("Open") && open.contains("40ms"), "{open}");
    assert!(kept.contains("Closed") && !kept.contains("40ms"), "{kept}");

    let semaphore = nolock::semaphore::Semaphore::new(2, Duration::from_secs(1)).unwrap();
    let layer = ConcurrencyLimitLayer::new(conn, semaphore, |_| Identity::Limited("k".into()));
    let kept = layer.clone();
    let open = layer.guard(Guard::new(Duration::from_millis(40), OnFailure::Open).unwrap());
    let (open, kept) = (format!("{open:?}"), format!("{kept:?}"));
    assert!(open.contains("Open") && open.contains("40ms"), "{open}");
    assert!(kept.contains("Closed") && !kept.contains("40ms"), "{kept}");
}

/// A request without identity is answered as the key function wrote it: a
/// request without a user is refused with 401 (a body, no limit taken);
/// `/health` passes only because `Identity::Unlimited` is written for it.
#[tokio::test]
async fn a_request_without_identity_is_refused_unless_unlimited_is_written() {
    let redis = RedisServer::start();
    let addr =
        serve(axum_service::app(redis.conn().await, guard(OnFailure::Closed)).unwrap()).await;
    for _ in 0..30 {
        let r = get_with(addr, "/hello", &[]).await;
        assert_eq!(r.status, 401);
        assert_eq!(r.body, "no identity to limit this request by\n");
        assert_eq!(r.header("ratelimit"), None);
    }
    let health = get_with(addr, "/health", &[]).await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok"));
    assert_eq!(health.header("ratelimit"), None);
    // Nothing was counted for the refused requests: the global limit is untouched.
    let r = get(addr, "/hello", "erin").await;
    assert_eq!(r.status, 200);
    assert!(r.header("ratelimit").unwrap().contains(r#""global";r=99"#));

    // A layer that writes `Unlimited` for a missing identity passes it, and
    // only then.
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_minute(1).unwrap()).unwrap();
    let layer = RateLimitLayer::new(redis.conn().await, limiter, |req| {
        match req.headers.get("x-user").and_then(|v| v.to_str().ok()) {
            Some(user) => Identity::Limited(format!("web:unlimited:{user}")),
            None => Identity::Unlimited,
        }
    });
    let addr = serve(
        axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    for _ in 0..3 {
        let r = get_with(addr, "/", &[]).await;
        assert_eq!((r.status, r.header("ratelimit")), (200, None));
    }
    assert_eq!(get(addr, "/", "frank").await.status, 200);
    assert_eq!(get(addr, "/", "frank").await.status, 429);
}

/// Invalid input per request is a 500 with a body naming the problem, from
/// both layers: an empty key, keys in two cluster slots, a shared-limit name
/// the limiter does not have.
#[tokio::test]
async fn an_invalid_key_is_a_500_with_a_body() {
    use nolock::rate::{MultiKey, MultiLimiter};

    let redis = RedisServer::start();
    let hello = || axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let empty = RateLimitLayer::new(redis.conn().await, limiter, |_| {
        Identity::Limited(String::new())
    });
    let limits = || {
        MultiLimiter::new(Algorithm::Gcra)
            .limit("user", Quota::per_second(10).unwrap())
            .unwrap()
            .shared_limit("tenant", Quota::per_second(100).unwrap())
            .unwrap()
    };
    let typo = RateLimitLayer::multi(redis.conn().await, limits(), |_| {
        Identity::Limited(MultiKey::new("{t1}:user:u").shared("tenants", "{t1}:all"))
    })
    .unwrap();
    let split = RateLimitLayer::multi(redis.conn().await, limits(), |_| {
        Identity::Limited(MultiKey::new("{t1}:user:u").shared("tenant", "{t2}:all"))
    })
    .unwrap();
    let semaphore = nolock::semaphore::Semaphore::new(2, Duration::from_secs(10)).unwrap();
    let in_flight = ConcurrencyLimitLayer::new(redis.conn().await, semaphore, |_| {
        Identity::Limited(String::new())
    });
    let cases = [
        (serve(hello().layer(empty)).await, "rate limit misconfigured: the key function returned an empty key\n"),
        (serve(hello().layer(typo)).await, "rate limit misconfigured: a shared-limit key is missing, repeated, or names a limit the MultiLimiter does not have\n"),
        (serve(hello().layer(split)).await, "in cluster slots"),
        (serve(hello().layer(in_flight)).await, "concurrency limit misconfigured: the key function returned an empty key\n"),
    ];
    for (addr, body) in cases {
        let r = get(addr, "/", "gina").await;
        assert_eq!(r.status, 500, "{}", r.body);
        assert!(r.body.contains(body), "{:?}", r.body);
        assert!(!r.body.contains("{t1}"), "no key in the body: {:?}", r.body);
    }
}

/// A monthly calendar quota behind the layer: `t` of the `RateLimit`
/// header and `Retry-After` count the seconds left in the month by the
/// server's clock, from the first request (a quota resets at the month's
/// end however little was used), and the policy's `w` is the longest month.
#[tokio::test]
async fn a_monthly_calendar_quota_behind_the_layer_names_the_months_end() {
    use nolock::rate::Period;
    use std::time::SystemTime;
    let redis = RedisServer::start();
    let limiter = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(2, Period::MONTH).unwrap(),
    )
    .unwrap()
    .named("plan")
    .unwrap();
    let layer = RateLimitLayer::new(redis.conn().await, limiter, |req| {
        match req.headers.get("x-user").and_then(|v| v.to_str().ok()) {
            Some(user) => Identity::Limited(format!("web:plan:{user}")),
            None => Identity::Unlimited,
        }
    });
    let addr = serve(
        axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    // The test server runs on this machine's clock.
    let now = SystemTime::now();
    let month = Period::MONTH.containing(now).unwrap();
    let left = month.end.duration_since(now).unwrap().as_secs_f64();
    let near = |t: u64| (t as f64 - left).abs() <= 3.0;
    for remaining in [1, 0] {
        let r = get(addr, "/", "gina").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(r#""plan";q=2;w=2689200"#)
        );
        let rate = r.header("ratelimit").unwrap();
        let t: u64 = rate.rsplit("t=").next().unwrap().parse().unwrap();
        assert!(
            rate.starts_with(&format!(r#""plan";r={remaining};t="#)),
            "{rate}"
        );
        assert!(near(t), "t={t}, {left} s left in the month");
    }
    let denied = get(addr, "/", "gina").await;
    assert_eq!(denied.status, 429);
    let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!(
        near(retry),
        "Retry-After {retry}, {left} s left in the month"
    );
    // Another user has a month of their own.
    assert_eq!(get(addr, "/", "hal").await.status, 200);
}
