//! Receipts over time: a rate charge's refund or settlement never lets more
//! through than the limit, whatever happened to the limit since the charge
//! was taken: a debt another settlement left, a reset, the settle deadline,
//! the charge draining before a copy of it settles. Each test is one
//! scenario that once over-admitted (issue 33), run on every algorithm it
//! concerns; `tests/rate_model.rs` holds random histories of all of them to
//! the bound in every window.

mod support;

use std::time::Duration;

use nolock::rate::{Algorithm, Charge, Limiter, MultiKey, MultiLimiter, Quota, Settle};
use support::{prefix, raw, RedisServer};

type Conn = redis::aio::MultiplexedConnection;

async fn take(conn: &mut Conn, l: &Limiter, key: &str, cost: u64) -> Charge {
    l.check(conn, key, cost)
        .await
        .unwrap()
        .into_charge()
        .expect("admitted")
}

/// How many checks of one unit are admitted now, one after the other.
async fn admitted_now(conn: &mut Conn, l: &Limiter, key: &str) -> u64 {
    let mut n = 0;
    while l.check(conn, key, 1).await.unwrap().allowed {
        n += 1;
        assert!(n <= 100, "unbounded");
    }
    n
}

fn copy(charge: &Charge) -> Charge {
    serde_json::from_str(&serde_json::to_string(charge).unwrap()).unwrap()
}

/// Quota 10 per hour: A takes 5, B takes 5, B settles at 8 (3 units of
/// debt), A gives its 5 back. Had A never been charged, 2 units would fit:
/// exactly 2 are admitted, on GCRA and on the token bucket (which once
/// turned the refund into 5 whole tokens while its refill time was still in
/// the future, and admitted 4).
#[tokio::test]
async fn a_refund_into_a_debt_gives_back_only_what_had_a_never_been_charged_would_fit() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        let key = format!("{}{algorithm}", prefix("debt"));
        let mut a = take(&mut conn, &l, &key, 5).await;
        let b = take(&mut conn, &l, &key, 5).await;
        let s = b.settle(&mut conn, 8).await.unwrap().settled().unwrap();
        assert_eq!((s.charged, s.state.debt), (3, 3), "{algorithm}");
        let r = a.refund(&mut conn, 5).await.unwrap();
        assert_eq!(r.credited, 5, "{algorithm}: A's units were all undrained");
        assert_eq!(r.remaining, 2, "{algorithm}");
        assert_eq!(admitted_now(&mut conn, &l, &key).await, 2, "{algorithm}");
    }
}

/// The same debt on a bucket that is partly refilled: a refund never moves
/// the bucket past what GCRA's schedule says (the two answer alike).
#[tokio::test]
async fn a_token_bucket_refund_answers_as_gcra_in_and_out_of_debt() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // 10 per second: T = 100 ms, so 60 ms of waiting refill nothing whole.
    let quota = Quota::per_second(10).unwrap();
    let mut seen = Vec::new();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let l = Limiter::new(algorithm, quota).unwrap();
        let key = format!("{}{algorithm}", prefix("alike"));
        let mut a = take(&mut conn, &l, &key, 4).await;
        let b = take(&mut conn, &l, &key, 6).await;
        let s = b.settle(&mut conn, 9).await.unwrap().settled().unwrap();
        let r = a.refund(&mut conn, 3).await.unwrap();
        let peek = l.peek(&mut conn, &key, 1).await.unwrap();
        seen.push((s.charged, r.credited, r.remaining, peek.debt));
    }
    assert_eq!(seen[0], seen[1], "GCRA, then the token bucket");
    assert_eq!(seen[0].0, 3);
}

/// Charge 5, refund 3, then a copy of the charge (taken before the refund)
/// settles at 5 after the charge drained: it still charges the 3 units the
/// refund gave back, because the refund's record lives until the settle
/// deadline (it once lived only until the charge drained, and the copy then
/// charged nothing). On every algorithm.
#[tokio::test]
async fn a_settlement_after_the_charge_drained_still_sees_the_refund() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        // 10 per 200 ms: a charge of 5 has drained after 100 ms; a window's
        // charge has gone once the next two 200 ms windows began.
        let l = Limiter::new(
            algorithm,
            Quota::per(10, Duration::from_millis(200)).unwrap(),
        )
        .unwrap()
        .settle_within(Duration::from_secs(5))
        .unwrap();
        let key = format!("{}{algorithm}", prefix("record"));
        let mut charge = take(&mut conn, &l, &key, 5).await;
        let late = copy(&charge);
        assert_eq!(charge.refund(&mut conn, 3).await.unwrap().credited, 3);
        tokio::time::sleep(Duration::from_millis(450)).await;
        let s = late.settle(&mut conn, 5).await.unwrap().settled().unwrap();
        assert_eq!(
            (s.credited, s.charged, s.uncharged),
            (0, 3, 0),
            "{algorithm}: 2 still held, 5 used"
        );
    }
}

/// Quota 10 per hour: A takes 5, the limit is reset, B takes 10, then A's
/// refund gives nothing back (it once gave 5, and 5 more were admitted) and
/// a copy of A settling below its estimate finds the charge expired. A
/// charge taken after the reset refunds as usual. On every algorithm, and
/// on a multi-limit.
#[tokio::test]
async fn a_reset_ends_every_earlier_charges_power_to_refund_or_settle() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        let key = format!("{}{algorithm}", prefix("reset"));
        let mut a = take(&mut conn, &l, &key, 5).await;
        let a_copy = copy(&a);
        l.reset(&mut conn, &key).await.unwrap();
        let mut b = take(&mut conn, &l, &key, 10).await;
        let r = a.refund(&mut conn, 5).await.unwrap();
        assert_eq!((r.credited, r.remaining), (0, 0), "{algorithm}");
        assert_eq!(a.held(), 5, "{algorithm}: the charge keeps its count");
        assert_eq!(
            a_copy.settle(&mut conn, 0).await.unwrap(),
            Settle::Expired,
            "{algorithm}"
        );
        assert_eq!(admitted_now(&mut conn, &l, &key).await, 0, "{algorithm}");
        assert_eq!(
            b.refund(&mut conn, 4).await.unwrap().credited,
            4,
            "{algorithm}"
        );
        assert_eq!(admitted_now(&mut conn, &l, &key).await, 4, "{algorithm}");
        // Reset twice: the marker never goes back.
        l.reset(&mut conn, &key).await.unwrap();
        l.reset(&mut conn, &key).await.unwrap();
        assert_eq!(
            b.refund(&mut conn, 1).await.unwrap().credited,
            0,
            "{algorithm}"
        );
    }

    let limits = MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_hour(10).unwrap())
        .unwrap()
        .shared_limit("tenant", Quota::per_hour(100).unwrap())
        .unwrap();
    let tag = prefix("multi_reset");
    let (user, all) = (format!("{{{tag}}}:u1"), format!("{{{tag}}}:all"));
    let key = || MultiKey::new(&user).shared("tenant", &all);
    let mut a = limits
        .check(&mut conn, key(), 5)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    limits.reset(&mut conn, key()).await.unwrap();
    let credited: Vec<u64> = a
        .refund(&mut conn, 5)
        .await
        .unwrap()
        .iter()
        .map(|r| r.credited)
        .collect();
    assert_eq!(credited, [0, 0], "every limit of a multi-limit");
}

/// A reset of one limit of a multi-limit (through a single limiter on the
/// shared key) ends the multi-limit charge's power on every limit: a refund
/// cannot give back on one limit and not on the other.
#[tokio::test]
async fn a_reset_of_one_shared_key_ends_a_multi_limit_charge_everywhere() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let tenant = Quota::per_hour(100).unwrap();
    let limits = MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_hour(10).unwrap())
        .unwrap()
        .shared_limit("tenant", tenant)
        .unwrap();
    let tag = prefix("one_reset");
    let shared = format!("{{{tag}}}:all");
    let key = MultiKey::new(&format!("{{{tag}}}:u1")).shared("tenant", &shared);
    let mut a = limits
        .check(&mut conn, key, 5)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let single = Limiter::new(Algorithm::Gcra, tenant).unwrap();
    single.reset(&mut conn, &shared).await.unwrap();
    let credited: Vec<u64> = a
        .refund(&mut conn, 5)
        .await
        .unwrap()
        .iter()
        .map(|r| r.credited)
        .collect();
    assert_eq!(credited, [0, 0]);
}

/// Past its settle deadline a charge counts as settled at its cost, as the
/// module docs say: a settlement answers `Expired` and a refund gives
/// nothing back (it once gave everything back). On every algorithm.
#[tokio::test]
async fn a_refund_past_the_settle_deadline_gives_nothing_back() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap())
            .unwrap()
            .settle_within(Duration::from_millis(50))
            .unwrap();
        let key = format!("{}{algorithm}", prefix("late"));
        let mut charge = take(&mut conn, &l, &key, 5).await;
        let late = copy(&charge);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(late.settle(&mut conn, 1).await.unwrap(), Settle::Expired);
        let r = charge.refund(&mut conn, 5).await.unwrap();
        assert_eq!((r.credited, r.remaining), (0, 5), "{algorithm}");
        // Before the deadline, a refund gives back as usual.
        let mut fresh = take(&mut conn, &l, &key, 2).await;
        assert_eq!(fresh.refund(&mut conn, 2).await.unwrap().credited, 2);
    }
}

/// A reset marker that is not a time nolock wrote is foreign data: the
/// reset and every refund of the key refuse it with a definite error and
/// change nothing. After a `SCRIPT FLUSH`, the reset runs through the
/// engine's fallback and still marks the key.
#[tokio::test]
async fn a_reset_marker_is_read_strictly_and_survives_a_script_flush() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let l = Limiter::new(Algorithm::Gcra, Quota::per_hour(10).unwrap()).unwrap();
    let key = prefix("marker");
    let marker = nolock::keys::derive(&key, "reset");
    let mut charge = take(&mut conn, &l, &key, 3).await;
    for foreign in ["x", "", "01", "1e3", "-5"] {
        let _: () = raw(&mut conn, &["SET", &marker, foreign]).await;
        let err = l.reset(&mut conn, &key).await.unwrap_err();
        assert!(err.is_definite(), "{foreign:?}: {err}");
        let err = charge.refund(&mut conn, 1).await.unwrap_err();
        assert!(err.is_definite(), "{foreign:?}: {err}");
        assert_eq!(charge.held(), 3);
        assert_eq!(
            l.peek(&mut conn, &key, 1).await.unwrap().remaining,
            7,
            "{foreign:?}"
        );
    }
    let _: () = raw(&mut conn, &["DEL", &marker]).await;
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    l.reset(&mut conn, &key).await.unwrap();
    assert_eq!(l.peek(&mut conn, &key, 1).await.unwrap().remaining, 10);
    let at: String = raw(&mut conn, &["GET", &marker]).await;
    let micros: u64 = at.parse().unwrap();
    let charged = charge
        .at()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        micros >= charged,
        "the reset's server time: {micros} >= {charged}"
    );
    let ttl: i64 = raw(&mut conn, &["PTTL", &marker]).await;
    assert!(
        (3_590_000..=3_600_000).contains(&ttl),
        "kept for the quota's fill time: {ttl} ms"
    );
    assert_eq!(charge.refund(&mut conn, 3).await.unwrap().credited, 0);
}
