//! What the `metrics` and `tracing` features record, captured by
//! `metrics-util`'s debugging recorder and a test subscriber. Alone in its
//! test binary: both are process-wide, and tracing caches per-callsite
//! interest, so spans from tests running beside it would mix in.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nolock::policy::{DecidedBy, Guard, OnFailure};
use nolock::rate::{Algorithm, Limiter, Quota};
use support::RedisServer;

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
    tracing::subscriber::set_global_default(captured.clone()).unwrap();

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
    let lease = nolock::fence::Lock::new(Duration::from_millis(300))
        .expect("a valid lock TTL")
        .lease(conn.clone(), "metrics-test-lease")
        .await
        .unwrap()
        .acquired()
        .unwrap();
    // Opted in, the first key is recorded.
    nolock::record_keys_in_spans(true);
    let peek = limiter.peek(&mut conn, "opted-in-key", 1).await.unwrap();
    assert!(peek.allowed, "a fresh key has room");
    nolock::record_keys_in_spans(false);
    // Checks run as operation values (a batch) and denials answered by the
    // deny cache are decisions too (another algorithm, so that the GCRA
    // span counts below stay the single calls').
    let batched = Limiter::new(Algorithm::TokenBucket, Quota::per_minute(1).unwrap())
        .unwrap()
        .named("metrics-batch")
        .unwrap();
    let mut batch = nolock::Batch::new();
    for _ in 0..3 {
        batch.push(nolock::rate::Check::new(&batched, "batch-key", 1).unwrap());
    }
    let answers = batch.run(&mut conn).await;
    let admitted: Vec<bool> = answers.into_iter().map(|a| a.unwrap().allowed).collect();
    assert_eq!(admitted, [true, false, false]);
    let cached = Limiter::new(Algorithm::TokenBucket, Quota::per_minute(1).unwrap())
        .unwrap()
        .named("metrics-cache")
        .unwrap()
        .with_local_deny_cache(16);
    for _ in 0..3 {
        let _ = cached.check(&mut conn, "cache-key", 1).await.unwrap();
    }
    #[cfg(feature = "tower")]
    assert_eq!(layer_answer_to_an_empty_key(conn.clone()).await, 500);
    // A process built with other numbers decides by the stored ones and
    // says so, once per change it learns of; an unlimited name is counted.
    let minute = Duration::from_secs(60);
    let client = nolock::Client::connect(redis.url()).await.unwrap();
    let first = client.counter("metrics-config", 5, minute).unwrap();
    let _ = first.increment("u").await.unwrap();
    let other = client.counter("metrics-config", 6, minute).unwrap();
    assert_eq!(other.increment("u").await.unwrap().remaining, 3);
    let configs = client.configs();
    configs
        .unlimit(nolock::config::Family::Counter, "metrics-config")
        .await
        .unwrap();
    configs.refresh().await.unwrap();
    let _ = other.increment("u").await.unwrap();
    let open = Guard::new(Duration::from_millis(100), OnFailure::Open).unwrap();
    redis.kill();
    for _ in 0..2 {
        let g = open
            .check(&limiter, &mut conn, "secret-user-key", 1)
            .await
            .unwrap();
        assert_eq!(g.source(), DecidedBy::Open);
    }
    // The lease's renewal fails with the server gone: a loss.
    let loss = tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .unwrap();
    assert!(
        matches!(loss, nolock::Loss::RenewalFailed { .. }),
        "{loss:?}"
    );

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
    assert_eq!(
        count("nolock_fallback_decisions_total{policy=fail_open}"),
        2
    );
    assert_eq!(
        count("nolock_decisions_total{limiter=metrics-batch,decision=allowed}"),
        1
    );
    assert_eq!(
        count("nolock_decisions_total{limiter=metrics-batch,decision=denied}"),
        2
    );
    // One admitted, then denials: the first from Redis, the rest from the
    // cache (the limiter is empty for a minute), all counted.
    assert_eq!(
        count("nolock_decisions_total{limiter=metrics-cache,decision=allowed}"),
        1
    );
    assert_eq!(
        count("nolock_decisions_total{limiter=metrics-cache,decision=denied}"),
        2
    );
    assert!(count("nolock_noscript_fallbacks_total{script=rate/gcra/check}") >= 1);
    assert!(
        count("nolock_errors_total{script=rate/gcra/check,kind=definite}")
            + count("nolock_errors_total{script=rate/gcra/check,kind=indeterminate}")
            >= 2
    );
    assert!(samples >= 7, "one latency sample per call: {samples}");
    assert!(count("nolock_lease_losses_total{}") >= 1);
    assert_eq!(
        count("nolock_config_differs_total{family=counter,name=metrics-config}"),
        2,
        "once at the first call, once after the switch"
    );
    assert_eq!(
        count("nolock_unlimited_total{family=counter,name=metrics-config}"),
        1
    );
    #[cfg(feature = "tower")]
    assert_eq!(count("nolock_layer_failures_total{layer=rate}"), 1);

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
    let peeks: Vec<_> = all
        .iter()
        .filter(|(n, f)| n == "nolock.script" && f["script"] == "rate/gcra/peek")
        .collect();
    assert_eq!(peeks.len(), 1);
    assert_eq!(peeks[0].1["key"], "opted-in-key");
    assert!(
        all.iter()
            .all(|(_, f)| f.values().all(|v| !v.contains("secret-user-key"))),
        "keys are not recorded unless asked for"
    );
    assert!(all.iter().any(
        |(n, f)| n == "event:WARN" && f.get("policy").map(String::as_str) == Some("fail_open")
    ));
    assert!(all.iter().any(|(n, f)| n == "event:WARN"
        && f.get("stored").map(String::as_str) == Some("counter 5/1min")
        && f.get("ours").map(String::as_str) == Some("counter 6/1min")));
    #[cfg(feature = "tower")]
    assert!(all.iter().any(|(n, f)| n == "event:ERROR"
        && f.get("layer").map(String::as_str) == Some("rate")
        && f.get("problem").map(String::as_str) == Some("the key function returned an empty key")));
}

/// The status a rate-limit layer whose key function returns an empty key
/// answers, over real HTTP.
#[cfg(feature = "tower")]
async fn layer_answer_to_an_empty_key(conn: redis::aio::MultiplexedConnection) -> u16 {
    use nolock::layer::{Identity, RateLimitLayer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(RateLimitLayer::new(conn, limiter, |_| {
            Identity::Limited(String::new())
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(
        response.ends_with("the key function returned an empty key\n"),
        "{response}"
    );
    response[9..12].parse().unwrap()
}
