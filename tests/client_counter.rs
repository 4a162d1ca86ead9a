//! `nolock::client::Counter`, the named bounded counter of a `Client`,
//! against a single `redis-server` and a local Redis Cluster (the `both!`
//! macro of `support::deployment` runs each body on both).
//!
//! Every body uses ids of its own (a unique prefix), so bodies run side by
//! side on the shared cluster; those that count commands or empty script
//! caches run alone there.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use nolock::client::{Counter, Rejection};
use nolock::{Client, Error};
use support::deployment::{both, Deployment};
use support::prefix;

const MINUTE: Duration = Duration::from_secs(60);
/// `reset_after` is PTTL + 1 ms: the first moment the counter is gone.
const MS: Duration = Duration::from_millis(1);

both!(
    shared: [
        admits_up_to_the_limit_then_limits,
        increment_by_takes_all_or_nothing,
        ids_that_would_collide_as_raw_keys_stay_apart,
        concurrent_increments_never_pass_the_limit,
        headers_round_up_and_name_the_counter,
        a_denied_id_is_admitted_after_its_retry_after,
    ],
    exclusive: [
        bad_input_is_refused_before_any_command,
        a_script_flush_before_the_call_is_survived,
    ],
);

/// A client on the deployment, as an application makes one.
async fn client(d: &Deployment) -> Client {
    match d {
        Deployment::Single(server) => Client::connect(server.url()).await.unwrap(),
        Deployment::Cluster(cluster) => Client::connect_cluster(cluster.urls()).await.unwrap(),
    }
}

fn limited(result: Result<nolock::client::Admitted, Rejection>) -> nolock::client::Limited {
    match result {
        Err(Rejection::Limited(limited)) => limited,
        other => panic!("expected a limit, got {other:?}"),
    }
}

fn failed(result: Result<nolock::client::Admitted, Rejection>) -> Error {
    match result {
        Err(Rejection::Failed(err)) => err,
        other => panic!("expected a failure, got {other:?}"),
    }
}

async fn admits_up_to_the_limit_then_limits(d: &Deployment) {
    let api = client(d).await.counter("api", 3, MINUTE).unwrap();
    let id = prefix("limit");
    for left in (0..3).rev() {
        let a = api.increment(&id).await.unwrap();
        assert_eq!((a.limit, a.remaining), (3, left));
        assert!(a.reset_after <= MINUTE + MS, "{:?}", a.reset_after);
        assert!(a.reset_after > MINUTE - Duration::from_secs(5));
    }
    for _ in 0..5 {
        let l = limited(api.increment(&id).await);
        assert_eq!(l.limit, 3);
        // The window must end before anything fits again.
        assert_eq!(l.retry_after, Some(l.reset_after));
        assert!(l.reset_after <= MINUTE + MS && l.reset_after > Duration::ZERO);
    }
    // The state is one key named by the handle and the id, tagged with the
    // numbers that wrote it; a denial wrote nothing.
    assert_eq!(
        d.get(&format!("{{nolock:counter:api:{id}}}"))
            .await
            .as_deref(),
        Some("c3x60000:3")
    );
    let usage = api.peek(&id).await.unwrap();
    assert_eq!((usage.count, usage.remaining(api.limit())), (3, 0));
    assert!(usage.reset_after.unwrap() <= MINUTE + MS);
    // Another id has its own window.
    let other = api.increment(&format!("{id}-other")).await.unwrap();
    assert_eq!(other.remaining, 2);
    let unseen = api.peek(&format!("{id}-unseen")).await.unwrap();
    assert_eq!((unseen.count, unseen.reset_after), (0, None));
}

async fn increment_by_takes_all_or_nothing(d: &Deployment) {
    let api = client(d).await.counter("batch", 10, MINUTE).unwrap();
    let id = prefix("by");
    // Exactly the limit at once.
    let a = api.increment_by(&id, 10).await.unwrap();
    assert_eq!(a.remaining, 0);
    limited(api.increment_by(&id, 1).await);

    let id = prefix("by-partial");
    assert_eq!(api.increment_by(&id, 7).await.unwrap().remaining, 3);
    // 4 does not fit in the 3 left: nothing is taken, and 3 still fit.
    let l = limited(api.increment_by(&id, 4).await);
    assert_eq!(
        l.headers().rate_limit,
        format!(r#""batch";r=3;t={}"#, l_t(&l))
    );
    assert_eq!(api.peek(&id).await.unwrap().count, 7);
    assert_eq!(api.increment_by(&id, 3).await.unwrap().remaining, 0);
    assert_eq!(api.peek(&id).await.unwrap().count, 10);
}

/// The `t` a `Limited` advertises: its reset in whole seconds, rounded up.
fn l_t(l: &nolock::client::Limited) -> String {
    nolock::rate::headers::delay_seconds(l.reset_after).to_string()
}

async fn ids_that_would_collide_as_raw_keys_stay_apart(d: &Deployment) {
    let api = client(d).await.counter("ids", 1, MINUTE).unwrap();
    let p = prefix("ids");
    // Each of these would give the same key (or end the hash tag early) if
    // ids were pasted into the key unescaped.
    let ids = [
        format!("{p}a}}b"),
        format!("{p}a%7Db"),
        format!("{p}a%257Db"),
        format!("{p}a}}:b"),
        format!("{p}a:}}b"),
        format!("{p}{{a}}b"),
    ];
    for id in &ids {
        let a = api.increment(id).await;
        assert_eq!(a.map(|a| a.remaining).ok(), Some(0), "{id:?}");
    }
    for id in &ids {
        limited(api.increment(id).await);
        assert_eq!(api.peek(id).await.unwrap().count, 1, "{id:?}");
    }
    // Another counter's ids never reach this one's keys.
    let other = client(d).await.counter("ids2", 1, MINUTE).unwrap();
    assert_eq!(other.increment(&ids[0]).await.unwrap().remaining, 0);
}

async fn concurrent_increments_never_pass_the_limit(d: &Deployment) {
    let api = client(d).await.counter("race", 10, MINUTE).unwrap();
    let id = prefix("race");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (api, id, barrier) = (api.clone(), id.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                api.increment(&id).await
            })
        })
        .collect();
    let mut remaining = BTreeSet::new();
    let mut denied = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(a) => assert!(remaining.insert(a.remaining), "two saw {}", a.remaining),
            Err(Rejection::Limited(_)) => denied += 1,
            Err(other) => panic!("{other}"),
        }
    }
    // Exactly the limit went through, each seeing a different count.
    assert_eq!(remaining, (0..10).collect());
    assert_eq!(denied, 54);
    assert_eq!(api.peek(&id).await.unwrap().count, 10);
}

async fn headers_round_up_and_name_the_counter(d: &Deployment) {
    let api = client(d).await.counter("hdr", 2, MINUTE).unwrap();
    let id = prefix("hdr");
    let a = api.increment(&id).await.unwrap();
    let t = nolock::rate::headers::delay_seconds(a.reset_after);
    // PTTL + 1 ms, rounded up: 61 right after the window started.
    assert!((59..=61).contains(&t), "{t}");
    let h = a.headers();
    assert_eq!(h.policy, r#""hdr";q=2;w=60"#);
    assert_eq!(h.rate_limit, format!(r#""hdr";r=1;t={t}"#));
    assert_eq!(h.retry_after, None);
    let names: Vec<_> = h.iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["RateLimit-Policy", "RateLimit"]);

    assert_eq!(api.increment(&id).await.unwrap().remaining, 0);
    let l = limited(api.increment(&id).await);
    let h = l.headers();
    let retry: u64 = h.retry_after.as_deref().unwrap().parse().unwrap();
    // Whole seconds, rounded up: never earlier than the window's end.
    assert!(Duration::from_secs(retry) >= l.reset_after);
    assert!(Duration::from_secs(retry) < l.reset_after + Duration::from_secs(1));
    assert_eq!(h.rate_limit, format!(r#""hdr";r=0;t={retry}"#));
    assert_eq!(h.policy, r#""hdr";q=2;w=60"#);
}

async fn a_denied_id_is_admitted_after_its_retry_after(d: &Deployment) {
    let api = client(d)
        .await
        .counter("short", 1, Duration::from_millis(150))
        .unwrap();
    let id = prefix("short");
    assert_eq!(api.increment(&id).await.unwrap().remaining, 0);
    let l = limited(api.increment(&id).await);
    let wait = l.retry_after.unwrap();
    assert!(wait <= Duration::from_millis(151), "{wait:?}");
    // The header says 1 s, not 0: `as_secs()` would round 150 ms down.
    assert_eq!(l.headers().retry_after.as_deref(), Some("1"));
    tokio::time::sleep(wait).await;
    assert_eq!(api.increment(&id).await.unwrap().remaining, 0);
}

async fn bad_input_is_refused_before_any_command(d: &Deployment) {
    let client = client(d).await;
    let calls = || async {
        d.calls_on_primaries("evalsha").await + d.calls_on_primaries("evalsha_ro").await
    };
    // The handle's numbers are stored on its first call (one script call
    // to the registry); declared here, so that what follows is counted
    // from a declared handle.
    let api: Counter = client.counter("bad-input", 5, MINUTE).unwrap();
    api.insist().await.unwrap();
    let before = calls().await;

    assert!(matches!(
        client.counter("api", 0, MINUTE),
        Err(Error::ZeroLimit { what: "limit" })
    ));
    assert!(matches!(
        client.counter("api", 1, Duration::ZERO),
        Err(Error::ZeroDuration { what: "window" })
    ));
    for name in ["", "a b", "a:b", "{api}", "-api", &"n".repeat(65)] {
        assert!(
            matches!(
                client.counter(name, 1, MINUTE),
                Err(Error::InvalidArgument { what: "name", .. })
            ),
            "{name:?}"
        );
    }
    assert!(matches!(
        failed(api.increment_by("alice", 0).await),
        Error::ZeroLimit { what: "n" }
    ));
    assert!(matches!(
        failed(api.increment_by("alice", 6).await),
        Error::InsufficientCapacity {
            requested: 6,
            limit: 5
        }
    ));
    let too_long = "x".repeat(nolock::client::MAX_ID_LEN + 1);
    for id in ["", too_long.as_str()] {
        assert!(matches!(
            failed(api.increment(id).await),
            Error::InvalidArgument { what: "id", .. }
        ));
        assert!(matches!(
            api.peek(id).await,
            Err(Error::InvalidArgument { what: "id", .. })
        ));
    }
    assert_eq!(calls().await, before, "bad input reached Redis");
    // The longest id is fine.
    let mut longest = prefix("long");
    longest.push_str(&"x".repeat(nolock::client::MAX_ID_LEN - longest.len()));
    assert_eq!(api.increment(&longest).await.unwrap().remaining, 4);
}

async fn a_script_flush_before_the_call_is_survived(d: &Deployment) {
    let api = client(d).await.counter("flush", 2, MINUTE).unwrap();
    let id = prefix("flush");
    d.flush_scripts_everywhere().await;
    assert_eq!(api.increment(&id).await.unwrap().remaining, 1);
    d.flush_scripts_everywhere().await;
    assert_eq!(api.peek(&id).await.unwrap().count, 1);
    d.flush_scripts_everywhere().await;
    assert_eq!(api.increment_by(&id, 1).await.unwrap().remaining, 0);
    limited(api.increment(&id).await);
}
