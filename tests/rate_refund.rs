//! Refunds bound to their charge: the three ways an unbound refund let more
//! through than the limit (a refund after its charge drained, after its
//! window ended, from the wrong sliding window), each as a test. Random
//! interleavings of checks, refunds and pauses are in `tests/rate_model.rs`.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, Quota};
use support::{prefix, RedisServer};

/// 10 per `period_ms`, burst 10.
fn limiter(algorithm: Algorithm, period_ms: u64) -> Limiter {
    let quota = Quota::per(10, Duration::from_millis(period_ms)).unwrap();
    Limiter::new(algorithm, quota).unwrap()
}

#[tokio::test]
async fn a_refund_after_its_charge_drained_gives_nothing_back() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let key = format!("{}{algorithm}", prefix("drained"));
        // 10 per second (T = 100 ms), as in the issue: a unit comes back
        // every 100 ms, far more than a loaded machine's pauses.
        let l = limiter(algorithm, 1000);
        let mut first = l.check(&mut conn, &key, 10).await.unwrap();
        assert!(first.allowed, "{algorithm}");
        // The limiter refills in 1 s: by 1.05 s the first charge has drained.
        tokio::time::sleep(Duration::from_millis(1050)).await;
        let others = l.check(&mut conn, &key, 10).await.unwrap();
        assert!(others.allowed, "{algorithm}: refilled");
        let r = l.refund(&mut conn, &key, &mut first, 10).await.unwrap();
        assert_eq!(r.credited, 0, "{algorithm}: {r:?}");
        assert_eq!(r.remaining, 0, "{algorithm}: {r:?}");
        // Without the bound, 10 more would pass now: 20 at one instant.
        let more = l.check(&mut conn, &key, 1).await.unwrap();
        assert!(!more.allowed, "{algorithm}: {more:?}");
    }
}

#[tokio::test]
async fn a_refund_after_its_window_ended_does_not_land_in_the_next_one() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = prefix("fixed_window");
    let l = limiter(Algorithm::FixedWindow, 100);
    let mut first = l.check(&mut conn, &key, 10).await.unwrap();
    assert!(first.allowed);
    tokio::time::sleep(first.reset_after + Duration::from_millis(5)).await;
    let next = l.check(&mut conn, &key, 5).await.unwrap();
    assert!(next.allowed && next.remaining == 5, "{next:?}");
    let r = l.refund(&mut conn, &key, &mut first, 10).await.unwrap();
    assert_eq!((r.credited, r.remaining), (0, 5), "{r:?}");
    // Without the bound the refund lowered the new window's count: 15 in it.
    let more = l.check(&mut conn, &key, 6).await.unwrap();
    assert!(!more.allowed, "{more:?}");
    assert_eq!(first.charged, 10, "nothing was given back");
}

#[tokio::test]
async fn a_sliding_window_refund_comes_off_the_window_that_counted_it() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = prefix("sliding_window");
    let l = limiter(Algorithm::SlidingWindow, 100);
    // Start early in an aligned 100 ms window, so the next one is reached
    // after one short sleep.
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 100;
    if into > 40 {
        tokio::time::sleep(Duration::from_millis(102 - into as u64)).await;
    }
    let mut first = l.check(&mut conn, &key, 4).await.unwrap();
    assert!(first.allowed);
    let first_window = first.at.duration_since(UNIX_EPOCH).unwrap().as_millis() / 100;
    // Into the next aligned window.
    let wait = 100 - first.at.duration_since(UNIX_EPOCH).unwrap().as_millis() % 100 + 2;
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    let second = l.check(&mut conn, &key, 1).await.unwrap();
    assert!(second.allowed);
    let second_window = second.at.duration_since(UNIX_EPOCH).unwrap().as_millis() / 100;
    assert_eq!(second_window, first_window + 1, "the test ran late");

    let r = l.refund(&mut conn, &key, &mut first, 4).await.unwrap();
    assert_eq!(r.credited, 4, "{r:?}");
    let state: std::collections::HashMap<String, u64> = redis::cmd("HGETALL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        state.get("count"),
        Some(&1),
        "the current window keeps its own unit: {state:?}"
    );
    assert_eq!(
        state.get("previous"),
        Some(&0),
        "the refund came off the previous window"
    );
}
