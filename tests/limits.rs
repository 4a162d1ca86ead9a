//! `nolock::limits` against a real redis-server.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use nolock::{limits, Error};
use support::{command_calls, keys, prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);
/// `reset_after` is PTTL + 1 ms: the first moment the counter is gone.
const MS: Duration = Duration::from_millis(1);

#[tokio::test]
async fn admits_up_to_the_limit_then_denies_without_consuming() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}c", prefix("limit"));

    for expected in 1..=3 {
        let a = limits::try_increment(&mut conn, &key, 3, MINUTE)
            .await
            .unwrap();
        assert!(a.admitted);
        assert_eq!((a.count, a.limit, a.remaining), (expected, 3, 3 - expected));
        let reset = a.reset_after.expect("window set");
        assert!(
            reset <= MINUTE + MS && reset > MINUTE - Duration::from_secs(5),
            "{reset:?}"
        );
    }
    let ttl_before: i64 = raw(&mut conn, &["PTTL", &key]).await;
    for _ in 0..20 {
        let a = limits::try_increment(&mut conn, &key, 3, MINUTE)
            .await
            .unwrap();
        assert!(!a.admitted);
        assert_eq!((a.count, a.remaining), (3, 0));
        assert!(a.reset_after.unwrap() <= MINUTE + MS);
    }
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, "c3x60000:3", "denials did not consume");
    let ttl_after: i64 = raw(&mut conn, &["PTTL", &key]).await;
    assert!(ttl_after <= ttl_before, "denials did not extend the window");
}

#[tokio::test]
async fn the_window_expires_and_counting_starts_again() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}c", prefix("window"));
    let window = Duration::from_millis(300);

    let first = limits::try_increment(&mut conn, &key, 2, window)
        .await
        .unwrap();
    assert!(first.admitted);
    assert!(first.reset_after.unwrap() <= window + MS);
    assert!(
        limits::try_increment(&mut conn, &key, 2, window)
            .await
            .unwrap()
            .admitted
    );
    let denied = limits::try_increment(&mut conn, &key, 2, window)
        .await
        .unwrap();
    assert!(!denied.admitted);

    // Waiting exactly the reported reset_after is enough.
    tokio::time::sleep(denied.reset_after.unwrap()).await;
    let again = limits::try_increment(&mut conn, &key, 2, window)
        .await
        .unwrap();
    assert!(again.admitted);
    assert_eq!(again.count, 1, "a new window");
}

#[tokio::test]
async fn increment_by_n_is_all_or_nothing() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}c", prefix("by_n"));

    let a = nolock::limits::Counter::new(10, MINUTE)
        .unwrap()
        .try_increment_by(&mut conn, &key, 7)
        .await
        .unwrap();
    assert!(a.admitted);
    assert_eq!((a.count, a.remaining), (7, 3));
    let b = nolock::limits::Counter::new(10, MINUTE)
        .unwrap()
        .try_increment_by(&mut conn, &key, 4)
        .await
        .unwrap();
    assert!(!b.admitted, "7 + 4 > 10");
    assert_eq!(b.count, 7, "nothing of the 4 was added");
    let c = nolock::limits::Counter::new(10, MINUTE)
        .unwrap()
        .try_increment_by(&mut conn, &key, 3)
        .await
        .unwrap();
    assert!(c.admitted);
    assert_eq!((c.count, c.remaining), (10, 0));
}

#[tokio::test]
async fn peek_reads_without_writing() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("peek");
    let key = format!("{p}c");

    let empty = limits::peek(&mut conn, &key).await.unwrap();
    assert_eq!((empty.count, empty.reset_after), (0, None));
    assert!(keys(&mut conn, &format!("{p}*")).await.is_empty());

    let a = nolock::limits::Counter::new(10, MINUTE)
        .unwrap()
        .try_increment_by(&mut conn, &key, 4)
        .await
        .unwrap();
    assert!(a.admitted);
    let usage = limits::peek(&mut conn, &key).await.unwrap();
    assert_eq!(usage.count, 4);
    assert_eq!(usage.remaining(10), 6);
    assert!(usage.reset_after.unwrap() <= MINUTE + MS);
    assert_eq!(limits::peek(&mut conn, &key).await.unwrap().count, 4);
    assert!(
        command_calls(&mut conn, "evalsha_ro").await + command_calls(&mut conn, "eval_ro").await
            >= 3
    );
}

#[tokio::test]
async fn bad_input_is_rejected_before_anything_is_sent() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let evalsha_before = command_calls(&mut conn, "evalsha").await;

    let cases: Vec<(Result<limits::Admission, Error>, &str)> = vec![
        (
            limits::try_increment(&mut conn, "", 1, MINUTE).await,
            "empty key",
        ),
        (
            limits::try_increment(&mut conn, "k", 0, MINUTE).await,
            "zero limit",
        ),
        (
            limits::try_increment(&mut conn, "k", 1, Duration::ZERO).await,
            "zero window",
        ),
        (
            limits::try_increment(&mut conn, "k", 1, Duration::from_micros(900)).await,
            "sub-ms window",
        ),
        (
            limits::try_increment(&mut conn, "k", 1, Duration::from_secs(u64::MAX)).await,
            "huge window",
        ),
        (
            limits::try_increment(&mut conn, "k", u64::MAX, MINUTE).await,
            "huge limit",
        ),
        (
            nolock::limits::Counter::new(5, MINUTE)
                .unwrap()
                .try_increment_by(&mut conn, "k", 0)
                .await,
            "zero n",
        ),
        (
            nolock::limits::Counter::new(5, MINUTE)
                .unwrap()
                .try_increment_by(&mut conn, "k", 6)
                .await,
            "n above limit",
        ),
    ];
    for (result, what) in cases {
        let err = result.expect_err(what);
        assert!(err.is_invalid_input(), "{what}: {err}");
        assert!(err.is_definite());
    }
    assert!(matches!(
        limits::try_increment(&mut conn, "", 1, MINUTE).await,
        Err(Error::EmptyKey)
    ));
    assert!(matches!(
        limits::try_increment(&mut conn, "k", 0, MINUTE).await,
        Err(Error::ZeroLimit { what: "limit" })
    ));
    assert!(matches!(
        limits::try_increment(&mut conn, "k", 1, Duration::ZERO).await,
        Err(Error::ZeroDuration { what: "window" })
    ));
    assert!(matches!(
        limits::try_increment(&mut conn, "k", 1, Duration::from_secs(u64::MAX)).await,
        Err(Error::DurationTooLong { what: "window", .. })
    ));
    assert!(matches!(
        limits::try_increment(&mut conn, "k", u64::MAX, MINUTE).await,
        Err(Error::OutOfRange { what: "limit", .. })
    ));
    assert!(matches!(
        nolock::limits::Counter::new(5, MINUTE)
            .unwrap()
            .try_increment_by(&mut conn, "k", 6)
            .await,
        Err(Error::InsufficientCapacity {
            requested: 6,
            limit: 5
        })
    ));
    assert!(matches!(
        limits::peek(&mut conn, "").await,
        Err(Error::EmptyKey)
    ));

    let dbsize: i64 = raw(&mut conn, &["DBSIZE"]).await;
    assert_eq!(dbsize, 0, "nothing written");
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        evalsha_before,
        "nothing sent"
    );
    assert_eq!(command_calls(&mut conn, "eval").await, 0);
}

#[tokio::test]
async fn a_key_of_another_type_is_a_definite_error_and_is_left_alone() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("wrongtype");
    let hash = format!("{p}hash");
    let text = format!("{p}text");
    let _: () = raw(&mut conn, &["HSET", &hash, "f", "v"]).await;
    let _: () = raw(&mut conn, &["SET", &text, "hello"]).await;

    for key in [&hash, &text] {
        let err = limits::try_increment(&mut conn, key, 5, MINUTE)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "{err}");
        assert!(err.is_definite());
        assert!(matches!(
            limits::peek(&mut conn, key).await,
            Err(Error::Redis(_))
        ));
    }
    let text_now: String = raw(&mut conn, &["GET", &text]).await;
    assert_eq!(text_now, "hello");
    let ttl: i64 = raw(&mut conn, &["PTTL", &text]).await;
    assert_eq!(ttl, -1, "no expiry was added");
}

#[tokio::test]
async fn a_counter_found_without_expiry_gets_the_window_on_admission() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}c", prefix("noexpiry"));
    let _: () = raw(&mut conn, &["SET", &key, "2"]).await;
    let a = limits::try_increment(&mut conn, &key, 5, MINUTE)
        .await
        .unwrap();
    assert_eq!(a.count, 3);
    assert!(a.reset_after.is_some());
    let ttl: i64 = raw(&mut conn, &["PTTL", &key]).await;
    assert!(ttl > 0);
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, "c5x60000:3", "the bare count was tagged");
}

#[tokio::test]
async fn a_full_counter_found_without_expiry_gets_the_window_on_denial() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}c", prefix("noexpiry_full"));
    let _: () = raw(&mut conn, &["SET", &key, "5"]).await;
    let a = limits::try_increment(&mut conn, &key, 5, MINUTE)
        .await
        .unwrap();
    assert!(!a.admitted);
    assert_eq!(a.count, 5, "nothing consumed");
    assert!(a.reset_after.is_some(), "so the caller knows when to retry");
    let ttl: i64 = raw(&mut conn, &["PTTL", &key]).await;
    assert!(ttl > 0 && ttl <= 60_000, "it will not deny forever: {ttl}");
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, "5", "a denial writes no tag");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_callers_admit_exactly_the_limit() {
    let redis = support::redis();
    let key = format!("{}c", prefix("concurrent"));
    // Several connections, so requests really interleave on the server.
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(redis.conn().await);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(200));
    let mut tasks = Vec::new();
    for i in 0..200 {
        let mut conn = conns[i % conns.len()].clone();
        let key = key.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            limits::try_increment(&mut conn, &key, 100, MINUTE)
                .await
                .unwrap()
        }));
    }
    let mut admitted_counts = BTreeSet::new();
    let mut denied = 0;
    for task in tasks {
        let a = task.await.unwrap();
        assert!(a.count <= 100);
        if a.admitted {
            assert!(
                admitted_counts.insert(a.count),
                "count {} seen twice",
                a.count
            );
        } else {
            assert_eq!(a.count, 100, "denied only when full");
            denied += 1;
        }
    }
    assert_eq!(admitted_counts.len(), 100);
    assert_eq!(admitted_counts, (1..=100).collect::<BTreeSet<_>>());
    assert_eq!(denied, 100);
    let mut conn = redis.conn().await;
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, "c100x60000:100");
}

#[tokio::test]
async fn works_through_connection_manager_and_a_pool() {
    let redis = support::redis();
    let key = format!("{}c", prefix("conn_kinds"));

    let mut manager = redis::aio::ConnectionManager::new(redis.client())
        .await
        .unwrap();
    let a = limits::try_increment(&mut manager, &key, 2, MINUTE)
        .await
        .unwrap();
    assert_eq!((a.admitted, a.count), (true, 1));

    let pool = deadpool_redis::Config::from_url(redis.url.clone())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let mut pooled = pool.get().await.unwrap();
    let b = limits::try_increment(&mut pooled, &key, 2, MINUTE)
        .await
        .unwrap();
    assert_eq!((b.admitted, b.count), (true, 2));
    let c = limits::try_increment(&mut pooled, &key, 2, MINUTE)
        .await
        .unwrap();
    assert!(!c.admitted);
    assert_eq!(limits::peek(&mut manager, &key).await.unwrap().count, 2);
}
