//! Reserve now, settle the real cost later (`Charge::settle`): below, equal
//! and above the reservation on every algorithm; a settlement past the
//! burst puts the limit into debt, denied until it drained by the server
//! clock; a second settlement (a copy, a resend) changes nothing; a
//! settlement after the charge drained gives nothing back; the deadline and
//! the debt cap; a multi-limit settlement's debt on each limit, in peek and
//! in the headers. Then random histories of reservations, settlements and
//! pauses against a GCRA model that says when the limiter recovers, each
//! held to the bound in every window by `tests/support/window.rs`.

mod support;

use std::time::{Duration, UNIX_EPOCH};

use nolock::rate::{
    Algorithm, Charge, Limiter, MultiKey, MultiLimiter, Quota, Settle, SettleCharge, Settlement,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use support::window::{self, Admitted, Bound, History};
use support::{prefix, RedisServer};

type Conn = redis::aio::MultiplexedConnection;

async fn reserve(conn: &mut Conn, l: &Limiter, key: &str, estimate: u64) -> Charge {
    l.check(conn, key, estimate)
        .await
        .unwrap()
        .into_charge()
        .expect("admitted")
}

fn settled(s: Settle) -> Settlement {
    match s {
        Settle::Settled(s) => s,
        other => panic!("not settled: {other:?}"),
    }
}

#[tokio::test]
async fn a_settlement_below_equal_or_above_its_reservation_lands_at_the_real_cost() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        // An hour-long quota: nothing drains during the test.
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        for (actual, credited, charged) in [(3, 2, 0), (5, 0, 0), (8, 0, 3), (0, 5, 0)] {
            let key = format!("{}{algorithm}:{actual}", prefix("settle"));
            let charge = reserve(&mut conn, &l, &key, 5).await;
            let s = settled(charge.settle(&mut conn, actual).await.unwrap());
            assert_eq!(
                (s.credited, s.charged, s.uncharged),
                (credited, charged, 0),
                "{algorithm} {actual}"
            );
            assert_eq!(
                s.state.remaining,
                10 - actual,
                "{algorithm} {actual}: {s:?}"
            );
            assert_eq!(s.state.debt, 0);
            let peek = l.peek(&mut conn, &key, 1).await.unwrap();
            assert_eq!(
                peek.remaining,
                10 - actual,
                "{algorithm} {actual}: {peek:?}"
            );
        }
    }
}

/// Sleeps until the server's clock is just past the start of a window of
/// length `w` (windows are aligned on the Unix epoch).
async fn at_a_window_start(conn: &mut Conn, w: Duration) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    let now = Duration::from_secs(secs) + Duration::from_micros(micros);
    let into = Duration::from_nanos((now.as_nanos() % w.as_nanos()) as u64);
    tokio::time::sleep(w - into + Duration::from_millis(5)).await;
}

#[tokio::test]
async fn a_settlement_past_the_burst_is_a_debt_denied_until_it_drained() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        // GCRA and the bucket: 10 per 100 ms, T = 10 ms. The windows: 10
        // per second, and the reservation made at the start of a window,
        // so that the settlement lands in the same window even on a loaded
        // machine (a reservation near a window's end is counted in the
        // previous window by the time it is settled, and leaves no debt).
        let period = match algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => Duration::from_millis(100),
            _ => Duration::from_secs(1),
        };
        let l = Limiter::new(algorithm, Quota::per(10, period).unwrap()).unwrap();
        let key = format!("{}{algorithm}", prefix("debt"));
        if period == Duration::from_secs(1) {
            at_a_window_start(&mut conn, period).await;
        }
        let charge = reserve(&mut conn, &l, &key, 10).await;
        let s = settled(charge.settle(&mut conn, 14).await.unwrap());
        assert_eq!((s.credited, s.charged), (0, 4), "{algorithm}");
        assert_eq!(
            (s.state.remaining, s.state.debt),
            (0, 4),
            "{algorithm}: {s:?}"
        );
        assert!(!s.state.allowed);
        let peek = l.peek(&mut conn, &key, 1).await.unwrap();
        assert_eq!(peek.debt, 4, "{algorithm}: peek reports the debt");
        let denied = l.check(&mut conn, &key, 1).await.unwrap();
        assert!(!denied.allowed, "{algorithm}: in debt");
        let wait = denied.retry_after.expect("a denial says when");
        match algorithm {
            // 4 units of debt and one more unit: 50 ms of schedule.
            Algorithm::Gcra | Algorithm::TokenBucket => {
                assert!(
                    wait > Duration::from_millis(40) && wait <= Duration::from_millis(50),
                    "{algorithm}: {wait:?}"
                )
            }
            // The window that holds the debt ends.
            _ => assert!(wait <= 2 * period, "{algorithm}: {wait:?}"),
        }
        // Half way through the wait: still denied, by the server clock.
        tokio::time::sleep(wait / 2).await;
        let midway = l.check(&mut conn, &key, 1).await.unwrap();
        assert!(!midway.allowed, "{algorithm}: {midway:?}");
        // The server's own answer now, then after it: admitted.
        let wait = midway.retry_after.unwrap();
        tokio::time::sleep(wait).await;
        let after = l.check(&mut conn, &key, 1).await.unwrap();
        assert!(
            after.allowed,
            "{algorithm}: admitted once the debt drained: {after:?}"
        );
        assert_eq!(after.debt, 0);
    }
}

#[tokio::test]
async fn a_charge_is_settled_once_whatever_copies_say() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut other = server.conn().await;
    for algorithm in Algorithm::ALL {
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        let key = format!("{}{algorithm}", prefix("once"));
        let charge = reserve(&mut conn, &l, &key, 5).await;
        let copy = serde_json::to_string(&charge).unwrap();
        let resend = SettleCharge::new(&charge, 7).unwrap();
        let s = settled(charge.settle(&mut conn, 7).await.unwrap());
        assert_eq!(s.charged, 2, "{algorithm}");
        // The same settlement again (a resend without an id), and a copy
        // settling at another cost: nothing changes.
        let mut again = nolock::Batch::new();
        again.push(resend);
        assert_eq!(
            again.run(&mut other).await.pop().unwrap().unwrap(),
            Settle::AlreadySettled
        );
        let copy_charge: Charge = serde_json::from_str(&copy).unwrap();
        assert_eq!(
            copy_charge.settle(&mut other, 1).await.unwrap(),
            Settle::AlreadySettled
        );
        // Nor can a copy refund a settled charge.
        let mut copy_charge: Charge = serde_json::from_str(&copy).unwrap();
        assert_eq!(
            copy_charge.refund(&mut other, 5).await.unwrap().credited,
            0,
            "{algorithm}"
        );
        assert_eq!(
            l.peek(&mut conn, &key, 1).await.unwrap().remaining,
            3,
            "{algorithm}: 7 charged"
        );
    }
    // Multi-limit: every limit settles once.
    let limits = MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_hour(10).unwrap())
        .unwrap()
        .shared_limit("all", Quota::per_hour(100).unwrap())
        .unwrap();
    let tag = prefix("once_multi");
    let key = MultiKey::new(&format!("{{{tag}}}:u")).shared("all", &format!("{{{tag}}}:all"));
    let charge = limits
        .check(&mut conn, key.clone(), 4)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let copy = serde_json::to_string(&charge).unwrap();
    let Settle::Settled(per_limit) = charge.settle(&mut conn, 6).await.unwrap() else {
        panic!("settled")
    };
    assert_eq!(
        per_limit.iter().map(|s| s.charged).collect::<Vec<_>>(),
        [2, 2]
    );
    let copy: nolock::rate::MultiCharge = serde_json::from_str(&copy).unwrap();
    assert_eq!(
        copy.settle(&mut other, 6).await.unwrap(),
        Settle::AlreadySettled
    );
    let peek = limits.peek(&mut conn, key, 1).await.unwrap();
    assert_eq!(
        peek.limits.iter().map(|l| l.remaining).collect::<Vec<_>>(),
        [4, 94]
    );
}

/// A multi-limit settlement charges its excess on every limit, each under
/// the debt cap; peek reports each limit's debt, and the headers of the
/// next denial count the debt in `Retry-After` and `RateLimit`.
#[tokio::test]
async fn a_multi_limit_settlement_owes_on_every_limit_and_the_headers_say_so() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        // An hour-long quota: nothing drains during the test.
        let limits = MultiLimiter::new(algorithm)
            .limit("user", Quota::per_hour(10).unwrap())
            .unwrap()
            .shared_limit("all", Quota::per_hour(100).unwrap())
            .unwrap()
            .with_debt_cap(3);
        let tag = format!("{}{algorithm}", prefix("multi_debt"));
        let key = MultiKey::new(&format!("{{{tag}}}:u")).shared("all", &format!("{{{tag}}}:all"));
        let charge = limits
            .check(&mut conn, key.clone(), 10)
            .await
            .unwrap()
            .into_charge()
            .unwrap();
        let Settle::Settled(per_limit) = charge.settle(&mut conn, 15).await.unwrap() else {
            panic!("{algorithm}: settled")
        };
        // The user limit goes 5 past empty, capped at 3; the shared limit
        // has room for the whole excess.
        assert_eq!(
            per_limit
                .iter()
                .map(|s| (s.charged, s.uncharged, s.state.debt))
                .collect::<Vec<_>>(),
            [(3, 2, 3), (5, 0, 0)],
            "{algorithm}"
        );
        let peek = limits.peek(&mut conn, key.clone(), 1).await.unwrap();
        assert_eq!(
            peek.limits
                .iter()
                .map(|l| (l.remaining, l.debt))
                .collect::<Vec<_>>(),
            [(0, 3), (85, 0)],
            "{algorithm}"
        );
        let denied = limits.check(&mut conn, key, 1).await.unwrap();
        assert!(!denied.allowed, "{algorithm}: in debt");
        let headers = limits.headers(&denied);
        let retry: u64 = headers
            .iter()
            .find(|(name, _)| *name == "Retry-After")
            .map(|(_, v)| v.parse().unwrap())
            .expect("a denial says when");
        // GCRA, token bucket: 3 owed and 1 asked, 360 s each. Fixed
        // window: the hour's window (from the first charge) ends. Sliding
        // window (hours aligned to the epoch): the full window must have
        // become the previous one and weigh at most 9 of 10, 360 s into it.
        // Calendar: the wall-clock hour ends (its debt goes with it).
        let into_hour = denied.limits[0]
            .at
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 3600;
        let expected = match algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => 4 * 360,
            Algorithm::FixedWindow => 3600,
            // The wall-clock hour (an hour under the calendar) ends.
            Algorithm::Calendar => 3600 - into_hour,
            _ => 3600 - into_hour + 360,
        };
        assert!(
            retry + 2 >= expected && retry <= expected,
            "{algorithm}: Retry-After {retry}, expected about {expected}"
        );
        let rate_limit = headers
            .iter()
            .find(|(name, _)| *name == "RateLimit")
            .map(|(_, v)| v.to_owned())
            .unwrap();
        assert!(
            rate_limit.starts_with("\"user\";r=0;"),
            "{algorithm}: {rate_limit}"
        );
    }
}

#[tokio::test]
async fn a_settlement_after_the_charge_drained_gives_nothing_back() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        // T = 10 ms: a charge of 5 has drained after 50 ms (GCRA, token
        // bucket); a window's charge has gone once the next two 100 ms
        // windows began.
        let l = Limiter::new(
            algorithm,
            Quota::per(10, Duration::from_millis(100)).unwrap(),
        )
        .unwrap();
        let key = format!("{}{algorithm}", prefix("drained"));
        let charge = reserve(&mut conn, &l, &key, 5).await;
        let drained = match algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => 80,
            _ => 250,
        };
        tokio::time::sleep(Duration::from_millis(drained)).await;
        let s = settled(charge.settle(&mut conn, 1).await.unwrap());
        assert_eq!(
            (s.credited, s.charged),
            (0, 0),
            "{algorithm}: drained already"
        );
        assert_eq!(s.state.remaining, 10, "{algorithm}: full, never more");
    }
}

#[tokio::test]
async fn after_its_deadline_a_charge_counts_as_settled_at_its_reservation() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap())
            .unwrap()
            .settle_within(Duration::from_millis(40))
            .unwrap();
        let key = format!("{}{algorithm}", prefix("deadline"));
        let charge = reserve(&mut conn, &l, &key, 5).await;
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(
            charge.settle(&mut conn, 9).await.unwrap(),
            Settle::Expired,
            "{algorithm}"
        );
        assert_eq!(
            l.peek(&mut conn, &key, 1).await.unwrap().remaining,
            5,
            "{algorithm}: still 5 charged"
        );
        assert!(l.clone().settle_within(Duration::ZERO).is_err());
    }
}

#[tokio::test]
async fn the_debt_cap_bounds_the_debt_a_settlement_leaves() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in Algorithm::ALL {
        let l = Limiter::new(algorithm, Quota::per_hour(10).unwrap())
            .unwrap()
            .with_debt_cap(2);
        let key = format!("{}{algorithm}", prefix("cap"));
        let charge = reserve(&mut conn, &l, &key, 10).await;
        let s = settled(charge.settle(&mut conn, 15).await.unwrap());
        assert_eq!(
            (s.charged, s.uncharged, s.state.debt),
            (2, 3, 2),
            "{algorithm}: {s:?}"
        );
        // The cap bounds the debt a settlement leaves, counting what is
        // owed already: a second overrun on a limit at its cap adds nothing.
        let key2 = format!("{}{algorithm}:again", prefix("cap"));
        let first = reserve(&mut conn, &l, &key2, 5).await;
        let second = reserve(&mut conn, &l, &key2, 5).await;
        let s = settled(first.settle(&mut conn, 7).await.unwrap());
        assert_eq!((s.charged, s.state.debt), (2, 2), "{algorithm}: {s:?}");
        let s = settled(second.settle(&mut conn, 8).await.unwrap());
        assert_eq!(
            (s.charged, s.uncharged, s.state.debt),
            (0, 3, 2),
            "{algorithm}: at the cap already: {s:?}"
        );
        // check_at_most reports the same debt (GCRA, token bucket).
        if matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket) {
            let partial = l.check_at_most(&mut conn, &key, 5).await.unwrap();
            assert_eq!(
                (partial.granted, partial.state.debt, partial.state.allowed),
                (0, 2, false),
                "{algorithm}: {partial:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_settlement_refuses_foreign_data_and_writes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let l = Limiter::new(Algorithm::Gcra, Quota::per_hour(10).unwrap()).unwrap();
    let key = prefix("settle_foreign");
    let charge = reserve(&mut conn, &l, &key, 5).await;
    let record = nolock::keys::derive(&key, &format!("charge#{}", charge.id()));
    let _: () = redis::cmd("SET")
        .arg(&record)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let before: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = charge.settle(&mut conn, 9).await.unwrap_err();
    assert!(err.is_definite(), "{err}");
    let after: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(before, after);
}

/// One step of a reservation history.
#[derive(Debug, Clone)]
enum Op {
    /// Reserve `estimate` after `pause_ms`.
    Reserve { estimate: u64, pause_ms: u64 },
    /// Settle the oldest open reservation at `actual` after `pause_ms`.
    Settle { actual: u64, pause_ms: u64 },
}

fn history() -> impl Strategy<Value = Vec<Op>> {
    let pause = prop::sample::select(vec![0u64, 0, 2, 7, 20]);
    let op = prop_oneof![
        (1u64..=5, pause.clone())
            .prop_map(|(estimate, pause_ms)| Op::Reserve { estimate, pause_ms }),
        (0u64..=12, pause).prop_map(|(actual, pause_ms)| Op::Settle { actual, pause_ms }),
    ];
    prop::collection::vec(op, 1..30)
}

/// GCRA, as `lua/rate/gcra/*` document it, with settlements: the model's
/// TAT says what every check answers and when the limiter recovers.
struct Model {
    t: u64,
    b: u64,
    tat: u64,
}

impl Model {
    fn check(&mut self, now: u64, cost: u64) -> (bool, u64, u64) {
        let tat = self.tat.max(now);
        let fits = tat - now + cost * self.t <= self.b * self.t;
        if fits {
            self.tat = tat + cost * self.t;
        }
        let after = self.tat.max(now);
        let room = (self.b * self.t) as i64 - (after - now) as i64;
        let debt = if room < 0 {
            (-room as u64).div_ceil(self.t)
        } else {
            0
        };
        (fits, if room > 0 { room as u64 / self.t } else { 0 }, debt)
    }

    /// Settles a charge of `cost` admitted at `at` at `actual`, at `now`.
    fn settle(&mut self, now: u64, at: u64, cost: u64, actual: u64) -> (u64, u64) {
        let mut tat = self.tat.max(now);
        // The tail of the charge goes back: its first units drained first.
        let give = cost.saturating_sub(actual).min(self.b);
        let back = (give * self.t).min((at + cost.min(self.b) * self.t).saturating_sub(now));
        let before = tat;
        if back > 0 && tat > now {
            tat = (tat - back).max(now);
        }
        let credited = (before - tat).div_ceil(self.t);
        let excess = actual.saturating_sub(cost);
        tat += excess * self.t; // no cap: (b + 2^53) x T is past 2^51, never reached here
        self.tat = tat;
        (credited, excess)
    }
}

#[test]
fn reservation_histories_follow_the_model_and_never_admit_more() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt.block_on(server.conn());
    let mut runner = TestRunner::new(Config {
        cases: 16,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    runner
        .run(&history(), |ops| {
            // 10 per 100 ms, burst 10: T = 10 ms.
            let quota = Quota::per(10, Duration::from_millis(100)).unwrap();
            let l = Limiter::new(Algorithm::Gcra, quota).unwrap();
            let key = prefix("settle_model");
            let mut conn = conn.clone();
            let mut model = Model {
                t: 10_000,
                b: 10,
                tat: 0,
            };
            let us =
                |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
            rt.block_on(async {
                let mut open: std::collections::VecDeque<(Charge, u64, Admitted)> =
                    Default::default();
                let mut history = History::new();
                for op in &ops {
                    match *op {
                        Op::Reserve { estimate, pause_ms } => {
                            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                            let d = l.check(&mut conn, &key, estimate).await.unwrap();
                            let now = us(d.at);
                            let (fits, remaining, debt) = model.check(now, estimate);
                            prop_assert_eq!(
                                (d.allowed, d.remaining, d.debt),
                                (fits, remaining, debt),
                                "{:?}",
                                op
                            );
                            if let Some(charge) = d.into_charge() {
                                let admitted = history.admit(now, estimate);
                                open.push_back((charge, estimate, admitted));
                            }
                        }
                        Op::Settle { actual, pause_ms } => {
                            let Some((charge, cost, admitted)) = open.pop_front() else {
                                continue;
                            };
                            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                            let at = us(charge.at());
                            let s = match charge.settle(&mut conn, actual).await.unwrap() {
                                Settle::Settled(s) => s,
                                other => return Err(TestCaseError::fail(format!("{other:?}"))),
                            };
                            let now = us(s.state.at);
                            let (credited, charged) = model.settle(now, at, cost, actual);
                            prop_assert_eq!(
                                (s.credited, s.charged),
                                (credited, charged),
                                "{:?}",
                                op
                            );
                            // What it gave back counts against its own
                            // admission; the excess when it is charged.
                            history.credit(admitted, s.credited);
                            history.excess(now, s.charged);
                        }
                    }
                }
                // Held to the bound in every window (tests/support/window).
                if let Err(e) = window::check(
                    &history,
                    Bound::rate_everywhere(10, quota.emission_interval()),
                ) {
                    prop_assert!(false, "{}", e);
                }
                Ok(())
            })
        })
        .unwrap();
}
