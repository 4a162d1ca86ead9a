//! `nolock::rate` against a real redis-server: exact sequences, retry_after,
//! denials, peek/refund/reset, multi-limit, SCRIPT FLUSH, bad input.
//! The 200-task invariants are in `tests/rate_concurrency.rs`.

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, MultiKey, MultiLimiter, Quota, RateLimit};
use nolock::Error;
use support::{command_calls, keys, prefix, raw, RedisServer};

type Conn = redis::aio::MultiplexedConnection;

const MINUTE: Duration = Duration::from_secs(60);

fn limiter(algorithm: Algorithm, rate: u64, period: Duration) -> Limiter {
    Limiter::new(algorithm, Quota::per(rate, period).unwrap()).unwrap()
}

/// The stored value (DUMP) and absolute expiry of a key: equal snapshots
/// mean nothing was written.
async fn snapshot(conn: &mut Conn, key: &str) -> (Option<Vec<u8>>, i64) {
    let dump: Option<Vec<u8>> = raw(conn, &["DUMP", key]).await;
    let expiry: i64 = raw(conn, &["PEXPIRETIME", key]).await;
    (dump, expiry)
}

fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 10 per minute: nothing refills during a quick sequence (one unit takes
/// 6 s), so every number is known in advance.
#[tokio::test]
async fn every_algorithm_counts_down_then_denies_without_consuming() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::Calendar {
            support::calendar::room_in_this_minute().await;
        }
        let key = format!("{}{algorithm}", prefix("sequence"));
        let l = limiter(algorithm, 10, MINUTE);
        let first = *l.check(&mut conn, &key, 1).await.unwrap();
        for i in 1..=10u64 {
            let d = if i == 1 {
                first
            } else {
                *l.check(&mut conn, &key, 1).await.unwrap()
            };
            let ctx = format!("{algorithm} call {i}: {d:?}");
            assert!(d.allowed, "{ctx}");
            assert_eq!(
                (d.limit, d.remaining, d.retry_after),
                (10, 10 - i, None),
                "{ctx}"
            );
            let elapsed = since(d.at, first.at);
            let reset = d.reset_after;
            match algorithm {
                // Full again i intervals of 6 s after the first call.
                Algorithm::Gcra | Algorithm::TokenBucket => {
                    let full = ms(6_000 * i) - elapsed;
                    assert!(reset >= full && reset <= full + ms(1), "{ctx}")
                }
                // The end of the next aligned window.
                Algorithm::SlidingWindow => assert!(reset > MINUTE && reset <= 2 * MINUTE, "{ctx}"),
                // The window opened by the first call.
                Algorithm::FixedWindow => {
                    assert!(
                        reset <= MINUTE - elapsed + ms(1) && reset + ms(1) >= MINUTE - elapsed,
                        "{ctx}"
                    )
                }
                // The wall-clock minute the call fell in: its end, named
                // in the answer, is a whole minute since the epoch.
                Algorithm::Calendar => {
                    let end = d.period_end.expect("a calendar answer names its end");
                    let end_ms = end.duration_since(UNIX_EPOCH).unwrap().as_millis();
                    assert_eq!(end_ms % 60_000, 0, "{ctx}");
                    assert!(
                        end > d.at && end.duration_since(d.at).unwrap() <= MINUTE,
                        "{ctx}"
                    );
                    assert!(reset + ms(1) >= end.duration_since(d.at).unwrap(), "{ctx}");
                    assert!(reset <= end.duration_since(d.at).unwrap() + ms(1), "{ctx}");
                }
                _ => unreachable!(),
            }
        }
        let denied = l.check(&mut conn, &key, 1).await.unwrap();
        let ctx = format!("{algorithm}: {denied:?}");
        assert!(!denied.allowed, "{ctx}");
        assert_eq!(denied.remaining, 0, "{ctx}");
        let retry = denied.retry_after.expect("a denial says when to retry");
        let elapsed = since(denied.at, first.at);
        match algorithm {
            // One unit comes back 6 s after the first call.
            Algorithm::Gcra | Algorithm::TokenBucket => {
                assert!(
                    retry >= ms(6_000) - elapsed && retry <= ms(6_001) - elapsed,
                    "{ctx}"
                )
            }
            // 10 in this window: wait for the next one, then for the weight of
            // these 10 to fall to 9.
            Algorithm::SlidingWindow => assert!(retry > ms(6_000) && retry <= ms(66_000), "{ctx}"),
            Algorithm::FixedWindow | Algorithm::Calendar => {
                assert_eq!(Some(denied.reset_after), denied.retry_after, "{ctx}")
            }
            _ => unreachable!(),
        }

        let before = snapshot(&mut conn, &key).await;
        for _ in 0..20 {
            let again = l.check(&mut conn, &key, 1).await.unwrap();
            assert!(!again.allowed, "{algorithm}");
            assert!(
                again.retry_after.unwrap() <= retry,
                "{algorithm}: the wait never grows"
            );
        }
        assert_eq!(
            snapshot(&mut conn, &key).await,
            before,
            "{algorithm}: denials wrote nothing"
        );
    }
}

/// GCRA at 10 per second with burst 10, the issue's example: 10 back to back,
/// then a denial of about 100 ms; after waiting that long one more passes.
#[tokio::test]
async fn gcra_ten_per_second_admits_ten_then_one_every_100_ms() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}g", prefix("gcra10"));
    let l = Limiter::new(
        Algorithm::Gcra,
        Quota::per_second(10).unwrap().with_burst(10).unwrap(),
    )
    .unwrap();
    let mut results = Vec::new();
    for _ in 0..11 {
        results.push(l.check(&mut conn, &key, 1).await.unwrap());
    }
    let span = since(results[10].at, results[0].at);
    if span < ms(100) {
        // Nothing came back during the sequence (one unit takes 100 ms).
        let remaining: Vec<u64> = results[..10].iter().map(|d| d.remaining).collect();
        assert_eq!(remaining, [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        assert!(results[..10].iter().all(|d| d.allowed));
        let denied = &results[10];
        assert!(!denied.allowed);
        let retry = denied.retry_after.unwrap();
        assert!(
            retry + span >= ms(100) && retry + span <= ms(101),
            "{retry:?} after {span:?}"
        );
    } else {
        eprintln!("slow machine: the sequence took {span:?}; checking the wait only");
    }
    // Wait what the last denial said (or until one unit is back) and ask again.
    let last = results.last().unwrap();
    tokio::time::sleep(last.retry_after.unwrap_or_default()).await;
    let d = l.check(&mut conn, &key, 1).await.unwrap();
    assert!(d.allowed, "{d:?}");
}

/// After a denial, keep asking (denied every time, taking nothing) until
/// `retry_after` has passed by the server clock: the first call at or after
/// that moment is admitted, and none before it (within the 1 ms rounding).
#[tokio::test]
async fn waiting_retry_after_is_enough_and_denials_take_nothing() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    for algorithm in Algorithm::ALL {
        let key = format!("{}{algorithm}", prefix("retry"));
        let l = limiter(algorithm, 10, ms(200));
        // Take all 10 at once, then ask for all 10 again until denied (a
        // stalled machine may have refilled in between).
        let mut first_denial = None;
        for _ in 0..20 {
            let d = l.check(&mut conn, &key, 10).await.unwrap();
            if !d.allowed {
                first_denial = Some((d, Instant::now()));
                break;
            }
        }
        let (denied, received) = first_denial.expect("10 of 10 cannot pass 20 times in a row");
        let retry = denied.retry_after.unwrap();
        assert!(
            retry > Duration::ZERO && retry <= ms(400),
            "{algorithm}: {denied:?}"
        );

        let mut denials = 0;
        let mut admitted: Option<RateLimit> = None;
        while received.elapsed() < retry + ms(5) && denials < 5_000 {
            let d = l.check(&mut conn, &key, 10).await.unwrap();
            let waited = since(d.at, denied.at);
            if waited + ms(1) <= retry {
                assert!(
                    !d.allowed,
                    "{algorithm}: admitted {waited:?} into a wait of {retry:?}"
                );
            }
            if waited >= retry {
                assert!(
                    d.allowed,
                    "{algorithm}: denied {waited:?} after a wait of {retry:?}"
                );
            }
            if d.allowed {
                admitted = Some(*d);
                break;
            }
            denials += 1;
            tokio::time::sleep(ms(1)).await;
        }
        assert!(
            denials > 10,
            "{algorithm}: a long run of denials ({denials})"
        );
        if admitted.is_none() {
            tokio::time::sleep((received + retry).saturating_duration_since(Instant::now())).await;
            let d = l.check(&mut conn, &key, 10).await.unwrap();
            assert!(d.allowed, "{algorithm}: {d:?} after waiting {retry:?}");
        }
    }
}

#[tokio::test]
async fn peek_answers_like_check_and_changes_nothing() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let ro_before =
        command_calls(&mut conn, "evalsha_ro").await + command_calls(&mut conn, "eval_ro").await;
    for algorithm in Algorithm::ALL {
        let p = prefix("peek");
        if algorithm == Algorithm::Calendar {
            support::calendar::room_in_this_minute().await;
        }
        let key = format!("{p}{algorithm}");
        let l = limiter(algorithm, 10, MINUTE);

        let empty = l.peek(&mut conn, &key, 10).await.unwrap();
        assert!(empty.allowed, "{algorithm}");
        assert_eq!(
            (empty.remaining, empty.reset_after, empty.retry_after),
            (10, Duration::ZERO, None)
        );
        assert!(
            keys(&mut conn, &format!("{p}*")).await.is_empty(),
            "{algorithm}: peek created nothing"
        );

        let taken = l.check(&mut conn, &key, 8).await.unwrap();
        assert_eq!(taken.remaining, 2, "{algorithm}");
        let before = snapshot(&mut conn, &key).await;
        for _ in 0..3 {
            let fits = l.peek(&mut conn, &key, 2).await.unwrap();
            assert!(fits.allowed, "{algorithm}");
            assert_eq!(
                fits.remaining, 2,
                "{algorithm}: peek reports without taking"
            );
            let too_much = l.peek(&mut conn, &key, 3).await.unwrap();
            assert!(!too_much.allowed, "{algorithm}");
            assert!(too_much.retry_after.unwrap() > Duration::ZERO);
            assert!(too_much.reset_after <= taken.reset_after, "{algorithm}");
        }
        assert_eq!(
            snapshot(&mut conn, &key).await,
            before,
            "{algorithm}: peek wrote nothing"
        );
        // And check agrees with what peek said.
        assert!(
            !l.check(&mut conn, &key, 3).await.unwrap().allowed,
            "{algorithm}"
        );
        assert!(
            l.check(&mut conn, &key, 2).await.unwrap().allowed,
            "{algorithm}"
        );
    }
    let ro_after =
        command_calls(&mut conn, "evalsha_ro").await + command_calls(&mut conn, "eval_ro").await;
    assert!(ro_after >= ro_before + 4 * 7, "peeks ran read-only");
}

#[tokio::test]
async fn refund_and_reset_restore_capacity() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    for algorithm in Algorithm::ALL {
        let p = prefix("refund");
        if algorithm == Algorithm::Calendar {
            support::calendar::room_in_this_minute().await;
        }
        let key = format!("{p}{algorithm}");
        let l = limiter(algorithm, 10, MINUTE);

        // A refund of a charge whose key is gone creates nothing.
        let other = format!("{p}other:{algorithm}");
        let mut charge = l.check(&mut conn, &other, 1).await.unwrap();
        l.reset(&mut conn, &other).await.unwrap();
        let r = charge
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 1)
            .await
            .unwrap();
        assert_eq!((r.credited, r.remaining), (0, 10), "{algorithm}");
        assert!(
            keys(&mut conn, &format!("{p}*")).await.is_empty(),
            "{algorithm}: refund created nothing"
        );

        let mut six = l.check(&mut conn, &key, 6).await.unwrap();
        assert_eq!(
            (six.remaining, six.charge().map_or(0, |c| c.held())),
            (4, 6),
            "{algorithm}"
        );
        let r = six
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 4)
            .await
            .unwrap();
        assert_eq!((r.credited, r.remaining), (4, 8), "{algorithm}");
        let mut d = l.check(&mut conn, &key, 8).await.unwrap();
        assert!(d.allowed && d.remaining == 0, "{algorithm}: {d:?}");
        let denied = l.check(&mut conn, &key, 1).await.unwrap();
        // A denial carries no charge: there is nothing to refund.
        assert!(!denied.allowed && denied.charge().is_none(), "{algorithm}");

        // A refund never gives back more than its charge took.
        assert!(matches!(
            d.charge_mut().unwrap().refund(&mut conn, 9).await,
            Err(Error::InvalidArgument { what: "amount", .. })
        ));
        let r = d.charge_mut().unwrap().refund(&mut conn, 8).await.unwrap();
        assert_eq!((r.credited, r.remaining), (8, 8), "{algorithm}");
        assert_eq!(d.charge().map_or(0, |c| c.held()), 0, "refunded in full");
        assert!(matches!(
            d.charge_mut().unwrap().refund(&mut conn, 1).await,
            Err(Error::InvalidArgument { what: "charge", .. })
        ));
        let r = six
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 2)
            .await
            .unwrap();
        // GCRA and the bucket count each charge as draining from its own
        // arrival, so the milliseconds between the checks and the refunds
        // are not given back: part of a unit stays taken.
        let (credited, least) = match algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => (2, 9),
            _ => (2, 10),
        };
        assert!(
            r.credited == credited && r.remaining >= least,
            "{algorithm}: {r:?}"
        );

        // A charge refunded at once leaves the limiter as it found it.
        l.reset(&mut conn, &key).await.unwrap();
        let key = format!("{p}{algorithm}:again");
        let mut four = l.check(&mut conn, &key, 4).await.unwrap();
        let r = four
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 4)
            .await
            .unwrap();
        assert_eq!((r.credited, r.remaining), (4, 10), "{algorithm}");
        let full = l.peek(&mut conn, &key, 10).await.unwrap();
        assert!(
            full.allowed && full.remaining == 10,
            "{algorithm}: {full:?}"
        );
        let exists: i64 = raw(&mut conn, &["EXISTS", &key]).await;
        match algorithm {
            // A full limiter is a missing key.
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::SlidingWindow => {
                assert_eq!(exists, 0, "{algorithm}")
            }
            // The calendar keeps its period (count 0, tagged with the
            // period's hash and the limit) until it ends.
            Algorithm::Calendar => {
                let value = raw::<String>(&mut conn, &["GET", &key]).await;
                assert!(
                    value.starts_with('k') && value.ends_with("x10:0"),
                    "{value}"
                );
            }
            // The fixed window keeps its window (count 0, tagged with its
            // window and limit) until it ends.
            _ => assert_eq!(
                raw::<String>(&mut conn, &["GET", &key]).await,
                "f60000x10:0"
            ),
        }

        assert!(
            l.check(&mut conn, &key, 10).await.unwrap().allowed,
            "{algorithm}"
        );
        assert!(
            !l.check(&mut conn, &key, 1).await.unwrap().allowed,
            "{algorithm}"
        );
        l.reset(&mut conn, &key).await.unwrap();
        l.reset(&mut conn, &key).await.unwrap(); // idempotent
        assert!(
            keys(&mut conn, &format!("{p}*")).await.is_empty(),
            "{algorithm}"
        );
        let d = l.check(&mut conn, &key, 10).await.unwrap();
        assert!(
            d.allowed && d.remaining == 0,
            "{algorithm}: reset made it full"
        );
    }
}

/// Every key a script writes expires once the limiter is full again.
#[tokio::test]
async fn idle_limiters_leave_no_keys_behind() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("expiry");
    let window = ms(50);
    for algorithm in Algorithm::ALL {
        let key = format!("{p}{algorithm}");
        let d = limiter(algorithm, 5, window)
            .check(&mut conn, &key, 2)
            .await
            .unwrap();
        let expiry: i64 = raw(&mut conn, &["PEXPIRETIME", &key]).await;
        let at_ms =
            d.at.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
        let reset_ms = d.reset_after.as_millis() as i64;
        // The key lasts exactly until the limiter is full (within the ms rounding).
        assert!(
            expiry >= at_ms + reset_ms - 1 && expiry <= at_ms + reset_ms + 1,
            "{algorithm}: {expiry} vs {d:?}"
        );
    }
    // The sliding window needs two windows to forget; the others one.
    tokio::time::sleep(3 * window).await;
    for algorithm in Algorithm::ALL {
        let exists: i64 = raw(&mut conn, &["EXISTS", &format!("{p}{algorithm}")]).await;
        assert_eq!(exists, 0, "{algorithm}");
    }
}

#[tokio::test]
async fn multi_limit_second_denies_and_the_first_is_unchanged() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    for algorithm in Algorithm::ALL {
        let user = format!("{}{algorithm}:user", prefix("multi"));
        let limits = MultiLimiter::new(algorithm)
            .limit("wide", Quota::per_minute(100).unwrap())
            .unwrap()
            .limit("narrow", Quota::per_minute(2).unwrap())
            .unwrap();
        let keys = limits.keys(&(&user).into()).unwrap();
        for expect in [[99, 1], [98, 0]] {
            let d = limits.check(&mut conn, &user, 1).await.unwrap();
            assert!(d.allowed && d.denied_by.is_none(), "{algorithm}: {d:?}");
            let remaining: Vec<u64> = d.limits.iter().map(|l| l.remaining).collect();
            assert_eq!(remaining, expect, "{algorithm}");
        }
        let wide_before = snapshot(&mut conn, &keys[0]).await;
        let d = limits.check(&mut conn, &user, 1).await.unwrap();
        assert!(!d.allowed, "{algorithm}");
        assert_eq!(d.denied_by, Some(1), "{algorithm}: the narrow limit denied");
        assert_eq!(limits.name(1), Some("narrow"));
        assert!(
            d.limits[0].allowed && d.limits[0].retry_after.is_none(),
            "{algorithm}: {d:?}"
        );
        assert_eq!(
            d.limits[0].remaining, 98,
            "{algorithm}: nothing taken from the wide limit"
        );
        assert!(!d.limits[1].allowed, "{algorithm}");
        assert_eq!(d.retry_after(), d.limits[1].retry_after);
        assert_eq!(
            snapshot(&mut conn, &keys[0]).await,
            wide_before,
            "{algorithm}: wide state unchanged"
        );
        // Read back through a single limiter on the same key.
        let wide = limiter(algorithm, 100, MINUTE);
        assert_eq!(
            wide.peek(&mut conn, &keys[0], 1).await.unwrap().remaining,
            98,
            "{algorithm}"
        );
    }
}

#[tokio::test]
async fn a_shared_tenant_limit_denies_every_user_of_the_tenant() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let tag = prefix("tenant");
    let tenant = format!("{{{tag}}}:all");
    let (alice, bob) = (format!("{{{tag}}}:alice"), format!("{{{tag}}}:bob"));
    let limits = MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_minute(10).unwrap())
        .unwrap()
        .shared_limit("tenant", Quota::per_minute(3).unwrap())
        .unwrap();
    let of = |user: &str| MultiKey::new(user).shared("tenant", &tenant);
    let mut alice_last = None;
    for user in [&alice, &alice, &bob] {
        let d = limits.check(&mut conn, of(user), 1).await.unwrap();
        assert!(d.allowed, "{d:?}");
        if user == &alice {
            alice_last = d.into_charge();
        }
    }
    let mut alice_last = alice_last.unwrap();
    let bob_key = limits.keys(&of(&bob)).unwrap().remove(0);
    let bob_before = snapshot(&mut conn, &bob_key).await;
    let d = limits.check(&mut conn, of(&bob), 1).await.unwrap();
    assert_eq!(d.denied_by, Some(1), "{d:?}");
    assert_eq!(d.limits[0].remaining, 9, "bob's own limit kept its 9");
    assert_eq!(snapshot(&mut conn, &bob_key).await, bob_before);

    // Refund and reset reach every key, the shared one included.
    let refunds = alice_last.refund(&mut conn, 1).await.unwrap();
    let got: Vec<_> = refunds.iter().map(|r| (r.credited, r.remaining)).collect();
    assert_eq!(got, [(1, 9), (1, 1)]);
    assert!(limits.check(&mut conn, of(&bob), 1).await.unwrap().allowed);
    limits.reset(&mut conn, of(&alice)).await.unwrap();
    let d = limits.peek(&mut conn, of(&bob), 3).await.unwrap();
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.limits[1].remaining, 3);
}

#[tokio::test]
async fn a_script_flush_is_recovered_by_loading_the_script() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    nolock::Scripts::load(&mut conn).await.unwrap();
    for algorithm in Algorithm::ALL {
        let key = format!("{}{algorithm}", prefix("flush"));
        let l = limiter(algorithm, 10, MINUTE);
        assert_eq!(l.check(&mut conn, &key, 1).await.unwrap().remaining, 9);

        let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
        let loads = command_calls(&mut conn, "script|load").await;
        let d = l.check(&mut conn, &key, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 8), "{algorithm}");
        assert_eq!(
            command_calls(&mut conn, "script|load").await,
            loads + 1,
            "{algorithm}"
        );
        // Cached again: the next call is a plain EVALSHA.
        let mut last = l.check(&mut conn, &key, 1).await.unwrap();
        assert_eq!(last.remaining, 7);
        assert_eq!(
            command_calls(&mut conn, "script|load").await,
            loads + 1,
            "{algorithm}"
        );

        let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
        assert_eq!(
            l.peek(&mut conn, &key, 1).await.unwrap().remaining,
            7,
            "{algorithm}"
        );
        assert_eq!(
            last.charge_mut()
                .unwrap()
                .refund(&mut conn, 1)
                .await
                .unwrap()
                .remaining,
            8,
            "{algorithm}"
        );
    }
    // Loaded, never run as EVAL / EVAL_RO (which the EVAL LRU could evict).
    assert_eq!(command_calls(&mut conn, "eval").await, 0);
    assert_eq!(command_calls(&mut conn, "eval_ro").await, 0);
}

#[tokio::test]
async fn bad_input_is_rejected_before_anything_is_sent() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let l = limiter(Algorithm::Gcra, 5, MINUTE);
    let multi = MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_minute(5).unwrap())
        .unwrap()
        .shared_limit("tenant", Quota::per_minute(50).unwrap())
        .unwrap();
    let tenant = |user: &str, shared: &str| MultiKey::new(user).shared("tenant", shared);

    assert!(matches!(
        l.check(&mut conn, "", 1).await,
        Err(Error::EmptyKey)
    ));
    assert!(matches!(
        l.check(&mut conn, "k", 0).await,
        Err(Error::ZeroLimit { what: "cost" })
    ));
    assert!(matches!(
        l.check(&mut conn, "k", 6).await,
        Err(Error::InsufficientCapacity {
            requested: 6,
            limit: 5
        })
    ));
    assert!(matches!(
        l.check(&mut conn, "k", u64::MAX).await,
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        l.peek(&mut conn, "k", 6).await,
        Err(Error::InsufficientCapacity { .. })
    ));
    assert!(matches!(l.reset(&mut conn, "").await, Err(Error::EmptyKey)));
    assert!(matches!(
        multi
            .check(&mut conn, tenant("user:1", "{tenant:7}:all"), 1)
            .await,
        Err(Error::CrossSlot { .. })
    ));
    assert!(matches!(
        multi.check(&mut conn, "{t}:u", 1).await,
        Err(Error::InvalidArgument {
            what: "shared keys",
            ..
        })
    ));
    assert!(matches!(
        multi
            .check(
                &mut conn,
                tenant("{t}:u", "{t}:all").shared("region", "{t}:eu"),
                1
            )
            .await,
        Err(Error::InvalidArgument {
            what: "shared keys",
            ..
        })
    ));
    assert!(matches!(
        multi.check(&mut conn, tenant("{t}:u", "{t}:all"), 6).await,
        Err(Error::InsufficientCapacity {
            requested: 6,
            limit: 5
        })
    ));
    assert!(matches!(
        multi.reset(&mut conn, tenant("u", "{t}:all")).await,
        Err(Error::CrossSlot { .. })
    ));

    // Quotas are checked when built, long before any call.
    assert!(matches!(
        Quota::per_second(0),
        Err(Error::ZeroLimit { what: "rate" })
    ));
    assert!(matches!(
        Quota::per(1, Duration::ZERO),
        Err(Error::ZeroDuration { what: "period" })
    ));
    assert!(matches!(
        Quota::per(1, Duration::from_secs(u64::MAX)),
        Err(Error::DurationTooLong { what: "period", .. })
    ));
    assert!(matches!(
        Quota::per_second(1).unwrap().with_burst(0),
        Err(Error::ZeroLimit { what: "burst" })
    ));
    let bursty = Quota::per_second(1).unwrap().with_burst(5).unwrap();
    assert!(matches!(
        Limiter::new(Algorithm::FixedWindow, bursty),
        Err(Error::InvalidArgument { what: "quota", .. })
    ));
    assert!(matches!(
        l.clone().named("no spaces"),
        Err(Error::InvalidArgument { what: "name", .. })
    ));

    let dbsize: i64 = raw(&mut conn, &["DBSIZE"]).await;
    assert_eq!(dbsize, 0, "nothing written");
    for cmd in ["evalsha", "eval", "evalsha_ro", "eval_ro", "del"] {
        assert_eq!(command_calls(&mut conn, cmd).await, 0, "no {cmd} sent");
    }
}

/// A real charge of `cost` at `key`, which must be free: taken, then the key
/// is deleted, so the test can put whatever it likes there before the refund.
async fn charge_then_clear(
    conn: &mut redis::aio::MultiplexedConnection,
    l: &Limiter,
    key: &str,
    cost: u64,
) -> nolock::rate::Charge {
    let charge = l
        .check(conn, key, cost)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let _: i64 = raw(conn, &["DEL", key]).await;
    charge
}

#[tokio::test]
async fn a_key_of_another_shape_is_a_definite_error_and_is_left_alone() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("shape");
    for algorithm in Algorithm::ALL {
        let l = limiter(algorithm, 5, MINUTE);
        let (hash, text) = (
            format!("{p}hash:{algorithm}"),
            format!("{p}text:{algorithm}"),
        );
        let mut charges = Vec::new();
        for key in [&hash, &text] {
            charges.push(charge_then_clear(&mut conn, &l, key, 1).await);
        }
        let _: () = raw(&mut conn, &["HSET", &hash, "f", "v"]).await;
        let _: () = raw(&mut conn, &["SET", &text, "hello"]).await;
        for (key, mut charge) in [&hash, &text].into_iter().zip(charges) {
            let before = snapshot(&mut conn, key).await;
            let err = l.check(&mut conn, key, 1).await.unwrap_err();
            assert!(
                matches!(err, Error::Redis(_)) && err.is_definite(),
                "{algorithm} {key}: {err}"
            );
            assert!(
                matches!(l.peek(&mut conn, key, 1).await, Err(Error::Redis(_))),
                "{algorithm}"
            );
            assert!(
                matches!(charge.refund(&mut conn, 1).await, Err(Error::Redis(_))),
                "{algorithm}"
            );
            assert_eq!(
                snapshot(&mut conn, key).await,
                before,
                "{algorithm} {key}: left alone"
            );
        }
    }
}

/// A multi-limit call that fails on its last key writes nothing on the first.
#[tokio::test]
async fn a_bad_key_in_a_multi_limit_call_writes_nothing() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let tag = prefix("partial");
    let bad = format!("{{{tag}}}:bad");
    let _: () = raw(&mut conn, &["SET", &bad, "not a number"]).await;
    for algorithm in [Algorithm::Gcra, Algorithm::FixedWindow] {
        let user = format!("{{{tag}}}:{algorithm}");
        let limits = MultiLimiter::new(algorithm)
            .limit("own", Quota::per_minute(10).unwrap())
            .unwrap()
            .shared_limit("bad", Quota::per_minute(10).unwrap())
            .unwrap();
        let key = MultiKey::new(&user).shared("bad", &bad);
        assert!(matches!(
            limits.check(&mut conn, key.clone(), 1).await,
            Err(Error::Redis(_))
        ));
        let own = limits.keys(&key).unwrap().remove(0);
        let exists: i64 = raw(&mut conn, &["EXISTS", &own]).await;
        assert_eq!(exists, 0, "{algorithm}: no partial write");
    }
}

#[tokio::test]
async fn headers_for_live_decisions() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}h", prefix("headers"));
    let l = Limiter::new(Algorithm::FixedWindow, Quota::per_minute(2).unwrap())
        .unwrap()
        .named("per-minute")
        .unwrap();
    let d = l.check(&mut conn, &key, 1).await.unwrap();
    let h = l.headers(&d);
    assert_eq!(h.policy, r#""per-minute";q=2;w=60"#);
    assert_eq!(h.rate_limit, r#""per-minute";r=1;t=60"#);
    assert_eq!(h.retry_after, None);
    let _ = l.check(&mut conn, &key, 1).await.unwrap();
    let d = l.check(&mut conn, &key, 1).await.unwrap();
    assert!(!d.allowed);
    let h = l.headers(&d);
    assert_eq!(h.rate_limit, r#""per-minute";r=0;t=60"#);
    assert_eq!(h.retry_after.as_deref(), Some("60"));
}

#[tokio::test]
async fn works_through_connection_manager_and_a_pool() {
    let redis = support::redis();
    let key = format!("{}c", prefix("rate_conn_kinds"));
    let l = limiter(Algorithm::Gcra, 2, MINUTE);
    let mut manager = redis::aio::ConnectionManager::new(redis.client())
        .await
        .unwrap();
    assert_eq!(l.check(&mut manager, &key, 1).await.unwrap().remaining, 1);
    let pool = deadpool_redis::Config::from_url(redis.url.clone())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let mut pooled = pool.get().await.unwrap();
    assert_eq!(l.check(&mut pooled, &key, 1).await.unwrap().remaining, 0);
    assert!(!l.check(&mut pooled, &key, 1).await.unwrap().allowed);
}

/// A fixed-window counter that Lua's `tonumber` reads but `INCRBY`/`DECRBY`
/// refuse ("5.0", " 5", "0x5", "5e0") must fail the call before the first
/// write: a multi-limit check or refund must not charge the keys before it.
#[tokio::test]
async fn a_counter_incrby_refuses_fails_a_multi_limit_call_before_any_write() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let tag = prefix("lenient");
    let limits = MultiLimiter::new(Algorithm::FixedWindow)
        .limit("own", Quota::per_minute(10).unwrap())
        .unwrap()
        .shared_limit("odd", Quota::per_minute(10).unwrap())
        .unwrap();
    for (i, odd_value) in ["5.0", " 5", "0x5", "5e0"].into_iter().enumerate() {
        let user = format!("{{{tag}}}:user{i}");
        let odd = format!("{{{tag}}}:odd{i}");
        let key = MultiKey::new(&user).shared("odd", &odd);
        // A real charge on both keys, taken before the odd value is written.
        let mut charge = limits
            .check(&mut conn, key.clone(), 1)
            .await
            .unwrap()
            .into_charge()
            .unwrap();
        let own = limits.keys(&key).unwrap().remove(0);
        let _: i64 = raw(&mut conn, &["DEL", &own]).await;
        let _: () = raw(&mut conn, &["SET", &odd, odd_value, "PX", "60000"]).await;

        // check on a missing own key: it would be created before the odd key fails.
        let err = limits.check(&mut conn, key.clone(), 1).await.unwrap_err();
        assert!(err.is_definite(), "{odd_value:?}: {err}");
        let exists: i64 = raw(&mut conn, &["EXISTS", &own]).await;
        assert_eq!(exists, 0, "{odd_value:?}: check wrote the first key");

        // check and refund on an existing own key: it would be counted first.
        let _: () = raw(&mut conn, &["SET", &own, "3", "PX", "60000"]).await;
        let before = snapshot(&mut conn, &own).await;
        assert!(limits.check(&mut conn, key.clone(), 1).await.is_err());
        assert!(charge.refund(&mut conn, 1).await.is_err());
        assert_eq!(
            snapshot(&mut conn, &own).await,
            before,
            "{odd_value:?}: the first key was written"
        );
        let stored: String = raw(&mut conn, &["GET", &odd]).await;
        assert_eq!(stored, odd_value, "the odd key is left alone");
    }
}
