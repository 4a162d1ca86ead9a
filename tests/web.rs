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
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use nolock::policy::{Failure, Guard, Guarded, OnFailure};
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
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header("host", addr.to_string())
        .header("x-user", user)
        .body(Empty::<Bytes>::new())
        .unwrap();
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
    // The health route is limited too, under the same user.
    assert_eq!(get(local, "/health", "dave").await.status, 429);
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
