//! Refunds bound to their charge: the three ways an unbound refund let more
//! through than the limit (a refund after its charge drained, after its
//! window ended, from the wrong sliding window), each as a test. Random
//! interleavings of checks, refunds and pauses are in `tests/rate_model.rs`.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::rate::{Algorithm, Charge, Limiter, MultiCharge, MultiKey, MultiLimiter, Quota};
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
        let r = first
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 10)
            .await
            .unwrap();
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
    let r = first
        .charge_mut()
        .unwrap()
        .refund(&mut conn, 10)
        .await
        .unwrap();
    assert_eq!((r.credited, r.remaining), (0, 5), "{r:?}");
    // Without the bound the refund lowered the new window's count: 15 in it.
    let more = l.check(&mut conn, &key, 6).await.unwrap();
    assert!(!more.allowed, "{more:?}");
    assert_eq!(
        first.charge().map_or(0, |c| c.held()),
        10,
        "nothing was given back"
    );
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

    let r = first
        .charge_mut()
        .unwrap()
        .refund(&mut conn, 4)
        .await
        .unwrap();
    assert_eq!(r.credited, 4, "{r:?}");
    // "s<w>x<L>:<start>:<count>:<previous>" (lua/lib/window.lua); 10 per
    // 100 ms: the window and the limit, as the scripts take them.
    let state: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let parts: Vec<&str> = state.split(':').collect();
    assert_eq!(parts.len(), 4, "{state}");
    assert_eq!(
        parts[2], "1",
        "the current window keeps its own unit: {state}"
    );
    assert_eq!(
        parts[3], "0",
        "the refund came off the previous window: {state}"
    );
    assert_eq!(parts[0], "s100x10", "the refund keeps the tag: {state}");
}

/// The second over-admission path of a copyable charge: refund it, then
/// refund a copy of it (serialized before the first refund, as another
/// process or a retry may hold it) over a second connection. The server's
/// record of the charge gives nothing back the second time, on every
/// algorithm, single and multi-limit, so the limit admits exactly what it
/// would had the charge never been taken.
#[tokio::test]
async fn a_copy_of_a_refunded_charge_gives_nothing_back() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut other = server.conn().await;
    for algorithm in Algorithm::ALL {
        let key = format!("{}{algorithm}", prefix("copy"));
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        let mut charge = l
            .check(&mut conn, &key, 5)
            .await
            .unwrap()
            .into_charge()
            .expect("admitted");
        let copy = serde_json::to_string(&charge).unwrap();
        assert_eq!(charge.refund(&mut conn, 5).await.unwrap().credited, 5);
        let mut copy: Charge = serde_json::from_str(&copy).unwrap();
        assert_eq!(
            (copy.key(), copy.held()),
            (key.as_str(), 5),
            "the copy claims it all"
        );
        let again = copy.refund(&mut other, 5).await.unwrap();
        assert_eq!(again.credited, 0, "{algorithm}: {again:?}");
        assert_eq!(again.remaining, 10, "{algorithm}");
        // 10 fit, and not 11: the refunds gave back 5, once.
        assert!(
            l.check(&mut conn, &key, 10).await.unwrap().allowed,
            "{algorithm}"
        );
        assert!(
            !l.check(&mut conn, &key, 1).await.unwrap().allowed,
            "{algorithm}"
        );

        // The same through a multi-limit charge, on every limit.
        let tag = prefix("copy_multi");
        let limits = MultiLimiter::new(algorithm)
            .limit("user", Quota::per_hour(10).unwrap())
            .unwrap()
            .shared_limit("all", Quota::per_hour(20).unwrap())
            .unwrap();
        let multi_key =
            MultiKey::new(&format!("{{{tag}}}:u")).shared("all", &format!("{{{tag}}}:all"));
        let mut charge = limits
            .check(&mut conn, multi_key.clone(), 4)
            .await
            .unwrap()
            .into_charge()
            .expect("admitted");
        let copy = serde_json::to_string(&charge).unwrap();
        let given: Vec<u64> = charge
            .refund(&mut conn, 4)
            .await
            .unwrap()
            .iter()
            .map(|r| r.credited)
            .collect();
        assert_eq!(given, [4, 4], "{algorithm}");
        let mut copy: MultiCharge = serde_json::from_str(&copy).unwrap();
        let again: Vec<u64> = copy
            .refund(&mut other, 4)
            .await
            .unwrap()
            .iter()
            .map(|r| r.credited)
            .collect();
        assert_eq!(again, [0, 0], "{algorithm}");
        let peek = limits.peek(&mut conn, multi_key, 1).await.unwrap();
        let left: Vec<u64> = peek.limits.iter().map(|l| l.remaining).collect();
        assert_eq!(left, [10, 20], "{algorithm}: back where they started");
    }
}

/// A charge's record lives beside its key, in its slot, and goes when no
/// copy of the charge can act on it any more: after it drained and after its
/// settle deadline (a settlement of a copy must still see the refund).
#[tokio::test]
async fn a_charge_record_is_kept_only_while_it_matters() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = prefix("record");
    // 10 per 200 ms: a charge of 2 drains in 40 ms; settled within 100 ms.
    let l = limiter(Algorithm::Gcra, 200)
        .settle_within(Duration::from_millis(100))
        .unwrap();
    let mut charge = l
        .check(&mut conn, &key, 2)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    assert_eq!(charge.refund(&mut conn, 1).await.unwrap().credited, 1);
    let record = nolock::keys::derive(&key, &format!("charge#{}", charge.id()));
    assert_eq!(nolock::keys::slot(&record), nolock::keys::slot(&key));
    let held: String = redis::cmd("GET")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(held, "1", "one unit of the charge left");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (50..=102).contains(&ttl),
        "until the deadline, later than the drain: {ttl} ms"
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    // Foreign data at a record is refused, and nothing is given back.
    let mut charge = l
        .check(&mut conn, &key, 2)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let record = nolock::keys::derive(&key, &format!("charge#{}", charge.id()));
    for foreign in ["x", "3", "1,1", "-1", "01", ""] {
        let _: () = redis::cmd("SET")
            .arg(&record)
            .arg(foreign)
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = charge.refund(&mut conn, 1).await.unwrap_err();
        assert!(err.is_definite(), "{foreign:?}: {err}");
        assert_eq!(charge.held(), 2, "{foreign:?}");
    }
    let _: () = redis::cmd("SET")
        .arg(&record)
        .arg("0")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        charge.refund(&mut conn, 2).await.unwrap().credited,
        0,
        "the record says nothing is left"
    );
}
