//! `Client::rate_limit` and `Client::rate_limits` against real servers:
//! the normal path, the limit, bad input refused before I/O, ids that would
//! collide as raw keys, `SCRIPT FLUSH`, 64 tasks on one id, the multi-limit
//! on a cluster, and (with `axum`) the responses.

mod support;

use std::time::Duration;

use nolock::client::{Admitted, RateLimit, Rejection, Scope};
use nolock::rate::{Algorithm, Quota};
use nolock::{Client, Error};
use support::deployment::Deployment;
use support::{command_calls, raw, RedisServer};

/// A handle name of its own per call (the cluster is shared by the tests).
fn unique(test: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{test}-{}-{n}", std::process::id())
}

async fn client(server: &RedisServer) -> Client {
    Client::connect(server.url()).await.unwrap()
}

fn limited(answer: Result<Admitted, Rejection>) -> nolock::client::Limited {
    match answer {
        Err(Rejection::Limited(limited)) => limited,
        other => panic!("expected Limited, got {other:?}"),
    }
}

fn failed(answer: Result<Admitted, Rejection>) -> Error {
    match answer {
        Err(Rejection::Failed(err)) => err,
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// 10 per hour: one unit comes back every 6 minutes, so nothing refills
/// during a test and every number is known.
fn ten_per_hour() -> Quota {
    Quota::per_hour(10).unwrap()
}

#[tokio::test]
async fn the_quota_is_admitted_exactly_then_limited_with_headers() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let limit = client.rate_limit("per-user", ten_per_hour()).unwrap();
    for i in 1..=10u64 {
        let a = limit.check("alice").await.unwrap();
        assert_eq!((a.limit, a.remaining), (10, 10 - i));
        assert_eq!(a.headers().policy, r#""per-user";q=10;w=3600"#);
        assert!(a
            .headers()
            .rate_limit
            .starts_with(&format!(r#""per-user";r={};t="#, 10 - i)));
        assert_eq!(a.headers().retry_after, None);
    }
    let l = limited(limit.check("alice").await);
    assert_eq!(l.limit, 10);
    let wait = l.retry_after.expect("a wait");
    assert!(
        wait > Duration::from_secs(350) && wait <= Duration::from_secs(360),
        "{wait:?}"
    );
    assert_eq!(l.headers().retry_after.as_deref(), Some("360"));
    assert_eq!(l.headers().rate_limit, r#""per-user";r=0;t=360"#);
    // Another id has its own state.
    assert_eq!(limit.check("bob").await.unwrap().remaining, 9);
    // peek charges nothing; reset fills again.
    let seen = limit.peek("alice").await.unwrap();
    assert_eq!((seen.allowed, seen.remaining), (false, 0));
    assert_eq!(limit.peek("alice").await.unwrap().remaining, 0);
    limit.reset("alice").await.unwrap();
    assert_eq!(limit.peek("alice").await.unwrap().remaining, 10);
    assert_eq!(limit.check_cost("alice", 4).await.unwrap().remaining, 6);
    // A clone shares the state.
    assert_eq!(limit.clone().check("alice").await.unwrap().remaining, 5);
}

#[tokio::test]
async fn a_cost_above_the_burst_is_limited_for_good() {
    let server = RedisServer::start();
    let limit = client(&server)
        .await
        .rate_limit("uploads", ten_per_hour())
        .unwrap();
    let _ = limit.check_cost("t", 3).await.unwrap();
    let l = limited(limit.check_cost("t", 11).await);
    assert_eq!((l.limit, l.retry_after), (10, None));
    assert_eq!(l.headers().retry_after, None);
    assert_eq!(l.headers().rate_limit, r#""uploads";r=7;t=1080"#);
    // Nothing was taken.
    assert_eq!(limit.peek("t").await.unwrap().remaining, 7);
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let mut conn = server.conn().await;
    for bad in ["", "a b", "a:b", "{x}", "-x", &"n".repeat(65)] {
        assert!(
            matches!(
                client.rate_limit(bad, ten_per_hour()),
                Err(Error::InvalidArgument { what: "name", .. })
            ),
            "{bad:?}"
        );
    }
    // A window algorithm refuses a burst.
    let bursty = ten_per_hour().with_burst(20).unwrap();
    let gcra = client.rate_limit("bursty", bursty).unwrap();
    assert!(matches!(
        gcra.with_algorithm(Algorithm::FixedWindow),
        Err(Error::InvalidArgument { .. })
    ));
    let limit = client.rate_limit("api", ten_per_hour()).unwrap();
    let before = command_calls(&mut conn, "evalsha").await + command_calls(&mut conn, "eval").await;
    let long = "x".repeat(nolock::client::MAX_ID_LEN + 1);
    for id in ["", long.as_str()] {
        assert!(matches!(
            failed(limit.check(id).await),
            Error::InvalidArgument { what: "id", .. }
        ));
        assert!(limit.peek(id).await.is_err());
        assert!(limit.reset(id).await.is_err());
    }
    assert!(matches!(
        failed(limit.check_cost("alice", 0).await),
        Error::ZeroLimit { what: "cost" }
    ));
    assert!(matches!(
        failed(limit.check_cost("alice", u64::MAX).await),
        Error::OutOfRange { .. }
    ));
    let after = command_calls(&mut conn, "evalsha").await + command_calls(&mut conn, "eval").await;
    assert_eq!(after, before, "nothing was sent");
    // The longest id is fine.
    let longest = "x".repeat(nolock::client::MAX_ID_LEN);
    let _ = limit.check(&longest).await.unwrap();
}

#[tokio::test]
async fn ids_that_would_collide_as_raw_keys_never_share_state() {
    let server = RedisServer::start();
    let limit = client(&server)
        .await
        .rate_limit("c", Quota::per_hour(2).unwrap())
        .unwrap();
    let ids = ["a}b", "a%7Db", "{x}", "x", "a%257Db", "{x", "x}"];
    for id in ids {
        assert_eq!(limit.check(id).await.unwrap().remaining, 1, "{id}");
    }
    for id in ids {
        assert_eq!(limit.check(id).await.unwrap().remaining, 0, "{id}");
        limited(limit.check(id).await);
    }
    let mut keys = std::collections::HashSet::new();
    for id in ids {
        assert!(keys.insert(limit.key(id).unwrap()), "{id}");
    }
    // Each id's key is where the handle says, and only its own.
    let mut conn = server.conn().await;
    let stored: Vec<String> = raw(&mut conn, &["KEYS", "*"]).await;
    for key in &keys {
        assert!(stored.contains(key), "{key} in {stored:?}");
    }
}

#[tokio::test]
async fn a_script_flush_before_a_call_is_recovered() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        let limit = client
            .rate_limit(&format!("flush-{algorithm}"), ten_per_hour())
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
        assert_eq!(
            limit.check("alice").await.unwrap().remaining,
            9,
            "{algorithm}"
        );
        let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
        assert_eq!(
            limit.peek("alice").await.unwrap().remaining,
            9,
            "{algorithm}"
        );
        let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
        limit.reset("alice").await.unwrap();
        assert_eq!(
            limit.check("alice").await.unwrap().remaining,
            9,
            "{algorithm}"
        );
    }
}

#[tokio::test]
async fn sixty_four_tasks_on_one_id_never_pass_the_quota() {
    let server = RedisServer::start();
    let client = client(&server).await;
    for algorithm in Algorithm::ALL {
        let limit = client
            .rate_limit(&format!("race-{algorithm}"), Quota::per_hour(20).unwrap())
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (limit, barrier) = (limit.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    limit.check("hot").await
                })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(_) => admitted += 1,
                Err(Rejection::Limited(_)) => {}
                Err(other) => panic!("{algorithm}: {other}"),
            }
        }
        // One unit refills every 3 minutes: exactly the quota passes.
        assert_eq!(admitted, 20, "{algorithm}");
    }
}

#[tokio::test]
async fn the_decision_keeps_its_charge_for_refunds() {
    let server = RedisServer::start();
    let limit: RateLimit = client(&server)
        .await
        .rate_limit("refunds", ten_per_hour())
        .unwrap()
        .with_local_deny_cache(100)
        .with_debt_cap(5)
        .settle_within(Duration::from_secs(60))
        .unwrap();
    let mut decision = limit.decide("alice", 3).await.unwrap();
    assert_eq!(limit.answer(&decision).unwrap().remaining, 7);
    let charge = decision
        .charge_mut()
        .expect("an admission carries its charge");
    assert_eq!(charge.key(), limit.key("alice").unwrap());
    let back = charge.refund(&mut limit.connection(), 2).await.unwrap();
    assert_eq!((back.credited, back.remaining), (2, 9));
    assert_eq!(limit.peek("alice").await.unwrap().remaining, 9);
}

/// Per user 3 per hour, per tenant 5 per hour shared: on the cluster, every
/// key of a decision in one slot, decided together, nothing charged on a
/// refusal.
#[tokio::test]
async fn per_member_and_per_scope_limits_are_decided_together_on_a_cluster() {
    let Deployment::Cluster(cluster) = Deployment::cluster() else {
        unreachable!()
    };
    let client = Client::from_connection(cluster.conn().await).await.unwrap();
    let limits = client
        .rate_limits(&unique("multi"))
        .per_member("user", Quota::per_hour(3).unwrap())
        .per_scope("tenant", Quota::per_hour(5).unwrap())
        .build()
        .unwrap();
    let alice = Scope::new("acme").member("alice");
    let bob = Scope::new("acme").member("bob");
    for i in 1..=3u64 {
        let a = limits.check(&alice).await.unwrap();
        // The tightest limit: the user's 3 - i against the tenant's 5 - i.
        assert_eq!((a.limit, a.remaining), (3, 3 - i));
        assert!(a.headers().policy.contains(r#""user";q=3;w=3600"#));
        assert!(a.headers().policy.contains(r#""tenant";q=5;w=3600"#));
    }
    // Alice's own limit refuses; the tenant's is not charged for it.
    let l = limited(limits.check(&alice).await);
    assert_eq!(l.limit, 3);
    assert!(l.retry_after.is_some());
    assert!(l.headers().retry_after.is_some());
    let seen = limits.peek(&bob).await.unwrap();
    let remaining: Vec<u64> = seen.limits.iter().map(|l| l.remaining).collect();
    assert_eq!(remaining, [3, 2]);
    // Bob takes the tenant's last two; then the tenant refuses, and bob's
    // own limit is not charged for it.
    let _ = limits.check(&bob).await.unwrap();
    assert_eq!(limits.check(&bob).await.unwrap().remaining, 0);
    let l = limited(limits.check(&bob).await);
    assert_eq!(l.limit, 5);
    let seen = limits.peek(&bob).await.unwrap();
    let remaining: Vec<u64> = seen.limits.iter().map(|l| l.remaining).collect();
    assert_eq!(remaining, [1, 0]);
    // Another tenant is untouched, and a charge above a burst never fits.
    let carol = Scope::new("globex").member("carol");
    assert_eq!(limits.check(&carol).await.unwrap().remaining, 2);
    let l = limited(limits.check_cost(&carol, 4).await);
    assert_eq!((l.limit, l.retry_after), (3, None));
    // A missing member is an error, never unlimited.
    assert!(matches!(
        failed(limits.check(&Scope::new("acme")).await),
        Error::InvalidArgument { what: "scope", .. }
    ));
    // Resets: a member's own limits, then the scope's shared ones.
    limits.reset(&bob).await.unwrap();
    let seen = limits.peek(&bob).await.unwrap();
    assert_eq!(
        seen.limits.iter().map(|l| l.remaining).collect::<Vec<_>>(),
        [3, 0]
    );
    limits.reset(&Scope::new("acme")).await.unwrap();
    let seen = limits.peek(&alice).await.unwrap();
    assert_eq!(
        seen.limits.iter().map(|l| l.remaining).collect::<Vec<_>>(),
        [0, 5]
    );

    // Scope-only limits refuse a member rather than ignore it.
    let shared = client
        .rate_limits(&unique("shared"))
        .per_scope("tenant", Quota::per_hour(2).unwrap())
        .per_scope("tenant-burst", Quota::per_hour(1).unwrap())
        .build()
        .unwrap();
    assert_eq!(
        shared.check(&Scope::new("acme")).await.unwrap().remaining,
        0
    );
    limited(shared.check(&Scope::new("acme")).await);
    assert!(matches!(
        failed(shared.check(&alice).await),
        Error::InvalidArgument { what: "scope", .. }
    ));
}

#[tokio::test]
async fn rate_limits_refuse_bad_configurations_when_built() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let q = ten_per_hour();
    assert!(client.rate_limits("api").build().is_err());
    assert!(client.rate_limits("a b").per_scope("t", q).build().is_err());
    assert!(client
        .rate_limits("api")
        .per_member("x", q)
        .per_scope("x", q)
        .build()
        .is_err());
    assert!(client.rate_limits("api").per_scope("", q).build().is_err());
    assert!(client
        .rate_limits("api")
        .algorithm(Algorithm::SlidingWindow)
        .per_scope("t", q.with_burst(20).unwrap())
        .build()
        .is_err());
    assert!(client
        .rate_limits("api")
        .per_scope("t", q)
        .settle_within(Duration::ZERO)
        .build()
        .is_err());
    let limits = client
        .rate_limits("api")
        .per_member("user", q)
        .build()
        .unwrap();
    let mut conn = server.conn().await;
    let before = command_calls(&mut conn, "evalsha").await;
    for scope in [
        Scope::new("").member("u"),
        Scope::new("t").member(""),
        Scope::new("t"),
    ] {
        assert!(matches!(
            failed(limits.check(&scope).await),
            Error::InvalidArgument { .. }
        ));
    }
    assert!(matches!(
        failed(limits.check_cost(&Scope::new("t").member("u"), 0).await),
        Error::ZeroLimit { .. }
    ));
    assert_eq!(command_calls(&mut conn, "evalsha").await, before);
}

#[cfg(feature = "axum")]
mod responses {
    use super::*;
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;

    async fn body(res: axum::response::Response) -> String {
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn each_answer_is_a_response_with_a_body() {
        let server = RedisServer::start();
        let limit = client(&server)
            .await
            .rate_limit("web", Quota::per_minute(1).unwrap())
            .unwrap();
        // Admitted: the handler's response plus the two headers.
        let admitted = limit.check("u").await.unwrap();
        let res = (admitted, "hi").into_response();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["ratelimit-policy"], r#""web";q=1;w=60"#);
        assert_eq!(res.headers()["ratelimit"], r#""web";r=0;t=60"#);
        assert!(res.headers().get("retry-after").is_none());
        assert_eq!(body(res).await, "hi");
        // Limited: 429, three headers, a body.
        let res = limit.check("u").await.unwrap_err().into_response();
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()["retry-after"], "60");
        assert_eq!(res.headers()["ratelimit"], r#""web";r=0;t=60"#);
        assert!(res.headers().contains_key("ratelimit-policy"));
        assert!(body(res).await.contains("retry after 60 s"));
        // Never fits: 429 without Retry-After.
        let res = limit.check_cost("v", 2).await.unwrap_err().into_response();
        assert_eq!(res.status(), 429);
        assert!(res.headers().get("retry-after").is_none());
        assert!(body(res).await.contains("above the limit"));
        // Bad input: 500 naming it.
        let res = limit.check("").await.unwrap_err().into_response();
        assert_eq!(res.status(), 500);
        assert!(body(res).await.contains("id"));
        // Redis gone: 503, Retry-After: 1, a body.
        drop(server);
        let failure = tokio::time::timeout(Duration::from_secs(10), limit.check("u"))
            .await
            .expect("an answer in time")
            .unwrap_err();
        assert!(
            matches!(
                failure,
                Rejection::Failed(Error::Redis(_) | Error::Indeterminate(_))
            ),
            "{failure:?}"
        );
        let res = failure.into_response();
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()["retry-after"], "1");
        assert!(!body(res).await.is_empty());
    }
}

/// A rate limit's name is one stored configuration, algorithm included:
/// a handle built with another algorithm decides by the stored one, on the
/// same state, so it never reads a GCRA limit's stored time as a count. A
/// handle of another kind (a counter) under the same name is another
/// configuration and keeps its own state.
#[tokio::test]
async fn handles_of_other_kinds_under_one_name_keep_their_own_state() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let gcra = client.rate_limit("shared-name", ten_per_hour()).unwrap();
    let fixed = gcra.clone().with_algorithm(Algorithm::FixedWindow).unwrap();
    let counter = client
        .counter("shared-name", 10, Duration::from_secs(3600))
        .unwrap();
    for _ in 0..10 {
        let _ = gcra.check("alice").await.unwrap();
    }
    limited(gcra.check("alice").await);
    // The fixed-window handle decides by the stored GCRA limit.
    let l = limited(fixed.check("alice").await);
    assert_eq!(l.limit, 10);
    assert_eq!(gcra.key("alice").unwrap(), fixed.key("alice").unwrap());
    assert!(matches!(
        fixed.insist().await,
        Err(Error::ConfigMismatch { .. })
    ));
    // The counter is untouched by the GCRA limit's ten admissions.
    let c = counter.increment("alice").await.unwrap();
    assert_eq!(c.remaining, 9);
}
