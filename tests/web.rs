//! The tower layer in a real axum service (`examples/axum_service.rs`) on a
//! free port, against a real redis-server, with real HTTP requests; the
//! failure policies with Redis stopped or too slow; what the `metrics` and
//! `tracing` features record.

mod support;

#[allow(dead_code)]
#[path = "../examples/axum_service.rs"]
mod axum_service;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use nolock::policy::{Failure, Guard, Guarded, OnFailure, Source};
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

/// Spans and events seen by a test subscriber: (name, fields).
#[derive(Default, Clone)]
struct Captured(Arc<Mutex<Vec<Record>>>);

/// A span or event name and its fields.
type Record = (String, HashMap<String, String>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl tracing::Subscriber for Captured {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = HashMap::new();
        span.record(&mut Fields(&mut fields));
        let mut all = self.0.lock().unwrap();
        all.push((span.metadata().name().to_owned(), fields));
        tracing::span::Id::from_u64(all.len() as u64)
    }
    fn record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut all = self.0.lock().unwrap();
        let index = usize::try_from(id.into_u64()).unwrap() - 1;
        values.record(&mut Fields(&mut all[index].1));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let mut all = self.0.lock().unwrap();
        all.push((format!("event:{}", event.metadata().level()), fields));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn metrics_and_spans_match_the_decisions() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let captured = Captured::default();
    // A current-thread runtime: everything below runs on this thread.
    let _default = tracing::subscriber::set_default(captured.clone());

    let mut redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let name = "metrics-test";
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_minute(3).unwrap())
        .unwrap()
        .named(name)
        .unwrap();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let mut allowed = 0;
    for _ in 0..5 {
        allowed += u64::from(
            limiter
                .check(&mut conn, "secret-user-key", 1)
                .await
                .unwrap()
                .allowed,
        );
    }
    assert_eq!(allowed, 3);
    let lease = nolock::fence::Lease::acquire(
        conn.clone(),
        "metrics-test-lease",
        Duration::from_millis(300),
        &nolock::fence::Backoff::none(),
    )
    .await
    .unwrap()
    .acquired()
    .unwrap();
    let open = Guard::new(Duration::from_millis(100), OnFailure::Open).unwrap();
    redis.kill();
    for _ in 0..2 {
        let g = open
            .check(&limiter, &mut conn, "secret-user-key", 1)
            .await
            .unwrap();
        assert_eq!(g.source(), Source::Open);
    }
    // The lease's renewal fails with the server gone: a loss.
    tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .unwrap();

    let mut counters = HashMap::new();
    let mut samples = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        match value {
            DebugValue::Counter(n) => {
                counters.insert(format!("{}{{{}}}", key.name(), labels.join(",")), n);
            }
            DebugValue::Histogram(v)
                if key.name() == "nolock_operation_duration_seconds"
                    && labels.contains(&"script=rate/gcra/check".to_owned()) =>
            {
                samples += v.len();
            }
            _ => {}
        }
    }
    let count = |k: &str| counters.get(k).copied().unwrap_or(0);
    assert_eq!(
        count("nolock_decisions_total{limiter=metrics-test,decision=allowed}"),
        3
    );
    assert_eq!(
        count("nolock_decisions_total{limiter=metrics-test,decision=denied}"),
        2
    );
    // The other tests of this file run their own fallbacks at the same time.
    assert!(count("nolock_fallback_decisions_total{policy=fail_open}") >= 2);
    assert!(count("nolock_noscript_fallbacks_total{script=rate/gcra/check}") >= 1);
    assert!(
        count("nolock_errors_total{script=rate/gcra/check,kind=definite}")
            + count("nolock_errors_total{script=rate/gcra/check,kind=indeterminate}")
            >= 2
    );
    assert!(samples >= 7, "one latency sample per call: {samples}");
    assert!(count("nolock_lease_losses_total{}") >= 1);

    let all = captured.0.lock().unwrap();
    let spans: Vec<_> = all
        .iter()
        .filter(|(n, f)| n == "nolock.script" && f["script"] == "rate/gcra/check")
        .collect();
    assert_eq!(spans.len(), 7, "one span per script call");
    let first = &spans[0].1;
    assert_eq!(first["script"], "rate/gcra/check");
    assert_eq!(first["outcome"], "ok");
    assert_eq!(
        first["fallback"], "true",
        "the flushed cache made the first call use EVAL"
    );
    assert_eq!(spans[1].1["fallback"], "false");
    assert_eq!(spans[1].1["redirects"], "0");
    assert_ne!(spans[6].1["outcome"], "ok");
    assert!(
        all.iter()
            .all(|(_, f)| f.values().all(|v| !v.contains("secret-user-key"))),
        "keys are not recorded unless asked for"
    );
    assert!(all.iter().any(
        |(n, f)| n == "event:WARN" && f.get("policy").map(String::as_str) == Some("fail_open")
    ));
}
