//! Calendar quotas on a server whose clock is not the client's: a
//! `redis-server` under libfaketime (`tests/support/clock.rs`) set to the
//! last seconds of a month of 2025, while this process's clock reads
//! today. The server's clock decides: the first call, built for the
//! client's month, is refused and built again for the server's time
//! (`Error::PeriodMismatch` never reaches the caller); the admissions are
//! counted in the server's month, whose end every answer names; when the
//! server's month ends, a fresh count begins in the next month, and never
//! before; a reservation of one month settled in the next charges its
//! excess to the next month's count, and a refund of the month before
//! gives back nothing.
//!
//! Where no server runs under libfaketime, the tests say so and skip (fail
//! under `CI=true`).

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, Period, Quota, RateLimit, Settle};
use support::calendar::{at_ms, ms, tag_number};
use support::clock::{skewed_or_skip, SkewedServer};
use support::{command_calls, prefix, raw};

type Conn = redis::aio::MultiplexedConnection;

/// This process's estimate of the server's clock is one for the whole
/// process (`rate::calendar`): the tests here, each with a server of its
/// own clock, take turns, so that each one's first call is the one built
/// for the client's clock.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// 2025-02-01T00:00:00Z, and the first days of the months after, in ms.
const FEB: i64 = 1_738_368_000_000;
const MAR: i64 = 1_740_787_200_000;
const APR: i64 = 1_743_465_600_000;
const MAY: i64 = 1_746_057_600_000;

/// Sets the server's clock to read `target` (ms since the epoch) now.
fn set_server_at(clock: &SkewedServer, target: i64) {
    let here = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    clock.set(target as f64 / 1000.0 - here);
}

async fn stored(conn: &mut Conn, key: &str) -> (Option<String>, i64) {
    let value: Option<String> = raw(conn, &["GET", key]).await;
    let at: i64 = raw(conn, &["PEXPIRETIME", key]).await;
    (value, at)
}

/// Points this process's estimate of the server's clock at today: a
/// calendar peek on `conn`'s server while its clock is still right (another
/// test here may have left the estimate in 2025).
async fn learn_todays_time(conn: &mut Conn) {
    let today = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(1, Period::DAY).unwrap(),
    )
    .unwrap();
    let seen = today.peek(conn, &prefix("cal_today"), 1).await.unwrap();
    let here = SystemTime::now();
    let off = here
        .duration_since(seen.at)
        .unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_secs(60), "{off:?}");
}

/// Every decision's server time lies in the month it reports, and no
/// month admits more than `limit`: the units admitted per month (by its
/// end).
fn check_months(history: &[(RateLimit, u64)], limit: u64) -> BTreeMap<i64, u64> {
    let mut per_month = BTreeMap::new();
    for (r, cost) in history {
        let end = r
            .period_end
            .expect("a calendar answer names its period's end");
        let month = Period::MONTH
            .containing(end - Duration::from_millis(1))
            .unwrap();
        assert_eq!(month.end, end, "{r:?}: not a month's end");
        assert!(
            month.start <= r.at && r.at < month.end,
            "{r:?}: decided outside the month it reports"
        );
        let n = per_month.entry(ms(end)).or_insert(0);
        if r.allowed {
            *n += cost;
        }
    }
    for (end, n) in &per_month {
        assert!(*n <= limit, "{n} admitted in the month ending at {end}");
    }
    per_month
}

#[tokio::test]
async fn the_servers_month_is_counted_and_its_end_starts_a_fresh_one() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(clock) = skewed_or_skip("calendar month end", &[]) else {
        return;
    };
    let mut conn = clock.server.conn().await;
    nolock::Scripts::load(&mut conn).await.unwrap();
    let key = format!("{}m", prefix("cal_month_end"));
    let month = Period::MONTH;
    let h = tag_number(&month);
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(5, month).unwrap()).unwrap();
    learn_todays_time(&mut conn).await;
    // 2025-01-31T23:59:55Z on the server; December 2026 here.
    set_server_at(&clock, FEB - 5_000);
    let mut history = Vec::new();

    // The first call was built for the client's month: refused, built
    // again for the server's time, and sent once more, unseen.
    let before = command_calls(&mut conn, "evalsha").await;
    let first = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert_eq!(command_calls(&mut conn, "evalsha").await - before, 2);
    assert!(first.allowed);
    assert_eq!(first.remaining, 4);
    assert_eq!(first.period_end, Some(at_ms(FEB)), "January 2025's end");
    assert!(
        ms(first.at) >= FEB - 5_000 && ms(first.at) < FEB,
        "{first:?}"
    );
    history.push((*first, 1));
    // The estimate is kept: no more refusals.
    let before = command_calls(&mut conn, "evalsha").await;
    for left in [3, 2, 1, 0] {
        let r = limiter.check(&mut conn, &key, 1).await.unwrap();
        assert!(r.allowed);
        assert_eq!(r.remaining, left);
        history.push((*r, 1));
    }
    assert_eq!(command_calls(&mut conn, "evalsha").await - before, 4);
    // January is spent: denied until its end, by the server's clock.
    let denied = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert!(!denied.allowed);
    let retry = denied.retry_after.unwrap().as_millis() as i64;
    assert!((ms(denied.at) + retry - FEB).abs() <= 1, "{denied:?}");
    history.push((*denied, 1));
    assert_eq!(
        stored(&mut conn, &key).await,
        (Some(format!("k{h}x5:5")), FEB)
    );

    // 2025-02-01T00:00:01Z: a fresh count in February.
    set_server_at(&clock, FEB + 1_000);
    let feb = limiter.check(&mut conn, &key, 2).await.unwrap();
    assert!(feb.allowed);
    assert_eq!(feb.remaining, 3);
    assert_eq!(feb.period_end, Some(at_ms(MAR)), "February 2025's end");
    assert!(ms(feb.at) >= FEB);
    history.push((*feb, 2));
    let peek = limiter.peek(&mut conn, &key, 4).await.unwrap();
    assert!(!peek.allowed);
    assert_eq!(peek.remaining, 3);
    assert_eq!(
        stored(&mut conn, &key).await,
        (Some(format!("k{h}x5:2")), MAR)
    );

    let per_month = check_months(&history, 5);
    assert_eq!(per_month, BTreeMap::from([(FEB, 5), (MAR, 2)]));
    clock.set(0.0);
}

/// A token budget per month: a reservation taken in March 2025 (by the
/// server's clock) and settled in April charges its excess to April's
/// count (debt when it passes the limit); a refund, or a settlement below
/// the reservation, of a March charge gives back nothing in April and
/// leaves April's count as it was.
#[tokio::test]
async fn a_reservation_settled_after_the_months_end_charges_the_next_month() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(clock) = skewed_or_skip("calendar settle across a month end", &[]) else {
        return;
    };
    let mut conn = clock.server.conn().await;
    nolock::Scripts::load(&mut conn).await.unwrap();
    let key = format!("{}t", prefix("cal_tokens"));
    let month = Period::MONTH;
    let h = tag_number(&month);
    let tokens = Limiter::new(Algorithm::Calendar, Quota::calendar(2000, month).unwrap()).unwrap();
    // 2025-03-31T23:59:55Z on the server.
    set_server_at(&clock, APR - 5_000);
    let big = limiter_check(&tokens, &mut conn, &key, 1000).await;
    assert_eq!(big.period_end, Some(at_ms(APR)));
    let small = limiter_check(&tokens, &mut conn, &key, 300).await;
    let below = limiter_check(&tokens, &mut conn, &key, 100).await;
    let debtor = limiter_check(&tokens, &mut conn, &key, 500).await;
    assert_eq!(debtor.remaining, 100);
    assert_eq!(
        stored(&mut conn, &key).await,
        (Some(format!("k{h}x2000:1900")), APR)
    );

    // 2025-04-01T00:00:01Z.
    set_server_at(&clock, APR + 1_000);
    // Meanwhile the process talked to a server whose clock is right: the
    // settlement is built for today, refused, and built again, unseen.
    let elsewhere = support::RedisServer::start();
    learn_todays_time(&mut elsewhere.conn().await).await;
    let before = command_calls(&mut conn, "evalsha").await;
    let settled = big
        .into_charge()
        .unwrap()
        .settle(&mut conn, 1500)
        .await
        .unwrap();
    assert_eq!(command_calls(&mut conn, "evalsha").await - before, 2);
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    assert_eq!((s.credited, s.charged, s.uncharged), (0, 500, 0));
    assert_eq!(s.state.remaining, 1500);
    assert_eq!(s.state.debt, 0);
    assert_eq!(s.state.period_end, Some(at_ms(MAY)), "April's end");
    let peek = tokens.peek(&mut conn, &key, 1).await.unwrap();
    assert_eq!(peek.remaining, 1500);
    assert_eq!(peek.period_end, Some(at_ms(MAY)));
    let april = (Some(format!("k{h}x2000:500")), MAY);
    assert_eq!(stored(&mut conn, &key).await, april);

    // March's charges give nothing back in April.
    let mut small = small;
    let back = small
        .charge_mut()
        .unwrap()
        .refund(&mut conn, 300)
        .await
        .unwrap();
    assert_eq!((back.credited, back.remaining), (0, 1500));
    let settled = below
        .into_charge()
        .unwrap()
        .settle(&mut conn, 10)
        .await
        .unwrap();
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    assert_eq!((s.credited, s.charged, s.state.remaining), (0, 0, 1500));
    assert_eq!(
        stored(&mut conn, &key).await,
        april,
        "April's count untouched"
    );

    // An excess past April's limit is debt: 500 + 2000 = 2500 of 2000.
    let settled = debtor
        .into_charge()
        .unwrap()
        .settle(&mut conn, 2500)
        .await
        .unwrap();
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    assert_eq!((s.charged, s.state.remaining, s.state.debt), (2000, 0, 500));
    let denied = tokens.check(&mut conn, &key, 1).await.unwrap();
    assert!(!denied.allowed);
    let retry = denied.retry_after.unwrap().as_millis() as i64;
    assert!((ms(denied.at) + retry - MAY).abs() <= 1, "{denied:?}");
    assert_eq!(
        stored(&mut conn, &key).await,
        (Some(format!("k{h}x2000:2500")), MAY)
    );
    clock.set(0.0);
}

async fn limiter_check(
    limiter: &Limiter,
    conn: &mut Conn,
    key: &str,
    cost: u64,
) -> nolock::rate::Decision {
    let d = limiter.check(conn, key, cost).await.unwrap();
    assert!(d.allowed, "{cost}: {d:?}");
    d
}

/// The server's clock stepped back across a month's end (an NTP
/// correction of 3 s) after the next month was opened: by the server's
/// clock it is January again, whose limit was spent, so nothing more may
/// be admitted before February. (Once the stored February count won, as it
/// had not ended, and January got February's quota.) Now January answers
/// as full until its end.
#[tokio::test]
async fn a_clock_stepped_back_across_the_months_end_never_gets_the_next_months_quota() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(clock) = skewed_or_skip("calendar backward step", &[]) else {
        return;
    };
    let mut conn = clock.server.conn().await;
    let key = format!("{}b", prefix("cal_back"));
    let limiter = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(3, Period::MONTH).unwrap(),
    )
    .unwrap();
    set_server_at(&clock, FEB - 5_000);
    let mut history = Vec::new();
    for _ in 0..3 {
        let r = limiter_check(&limiter, &mut conn, &key, 1).await;
        history.push((*r, 1));
    }
    set_server_at(&clock, FEB + 1_000);
    let r = limiter_check(&limiter, &mut conn, &key, 1).await;
    assert_eq!(r.period_end, Some(at_ms(MAR)));
    history.push((*r, 1));
    // Back to 2025-01-31T23:59:58Z.
    set_server_at(&clock, FEB - 2_000);
    let again = limiter.check(&mut conn, &key, 1).await.unwrap();
    history.push((*again, 1));
    clock.set(0.0);
    check_months(&history, 3);
    assert!(!again.allowed, "January's quota is spent: {again:?}");
}

/// 64 tasks checking a monthly quota of 20 for 3 s from
/// 2025-01-31T23:59:58.5Z on the server: every task's first call is built
/// for the client's month and rebuilt, unseen; January admits exactly 20,
/// February 20 from its first millisecond on, each decision in the month
/// it reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_across_the_servers_month_end_never_pass_the_limit_in_a_month() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(clock) = skewed_or_skip("calendar month end, 64 tasks", &[]) else {
        return;
    };
    let mut conn = clock.server.conn().await;
    nolock::Scripts::load(&mut conn).await.unwrap();
    let key = format!("{}m", prefix("cal_month_race"));
    let limiter = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(20, Period::MONTH).unwrap(),
    )
    .unwrap();
    learn_todays_time(&mut conn).await;
    let evalsha_before = command_calls(&mut conn, "evalsha").await;
    set_server_at(&clock, FEB - 1_500);
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(clock.server.conn().await);
    }
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (mut conn, limiter, key, barrier) = (
                conns[i % 4].clone(),
                limiter.clone(),
                key.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let mut seen = Vec::new();
                while std::time::Instant::now() < until {
                    let r = limiter.check(&mut conn, &key, 1).await.unwrap();
                    seen.push((*r, 1));
                }
                seen
            })
        })
        .collect();
    let mut history = Vec::new();
    for task in tasks {
        history.extend(task.await.expect("a task failed"));
    }
    clock.set(0.0);
    // Every call is in the history: none failed, refused or not.
    let sent = command_calls(&mut conn, "evalsha").await - evalsha_before;
    assert!(
        sent > history.len() as u64,
        "{sent} sent, {}",
        history.len()
    );
    let per_month = check_months(&history, 20);
    assert_eq!(per_month, BTreeMap::from([(FEB, 20), (MAR, 20)]));
    // No admission in February before its first millisecond.
    let first_feb = history
        .iter()
        .filter(|(r, _)| r.allowed && r.period_end == Some(at_ms(MAR)))
        .map(|(r, _)| ms(r.at))
        .min()
        .unwrap();
    assert!(first_feb >= FEB, "{first_feb}");
}

/// In a `Batch` the refusal is the caller's to handle (`Error::PeriodMismatch`,
/// nothing written); the refusal taught the process the server's time, so
/// the operation built again is counted in the server's month.
#[tokio::test]
async fn a_batch_returns_the_period_mismatch_and_the_operation_built_again_is_counted() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(clock) = skewed_or_skip("calendar batch", &[]) else {
        return;
    };
    let mut conn = clock.server.conn().await;
    let key = format!("{}b", prefix("cal_batch"));
    let month = Period::MONTH;
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(5, month).unwrap()).unwrap();
    // 2024-06-15T12:00:00Z: a month no other test here sets.
    const JUNE_15: i64 = 1_718_452_800_000;
    const JULY: i64 = 1_719_792_000_000;
    learn_todays_time(&mut conn).await;
    set_server_at(&clock, JUNE_15);
    let mut batch = nolock::Batch::new();
    batch.push(nolock::rate::Check::new(&limiter, &key, 2).unwrap());
    let results = batch.run(&mut conn).await;
    match &results[0] {
        Err(nolock::Error::PeriodMismatch { detail }) => {
            assert!(detail.contains("nothing was written"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(stored(&mut conn, &key).await, (None, -2));
    let mut again = nolock::Batch::new();
    again.push(nolock::rate::Check::new(&limiter, &key, 2).unwrap());
    let results = again.run(&mut conn).await;
    let decision = results[0].as_ref().unwrap();
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 3);
    assert_eq!(decision.period_end, Some(at_ms(JULY)));
    let h = tag_number(&month);
    assert_eq!(
        stored(&mut conn, &key).await,
        (Some(format!("k{h}x5:2")), JULY)
    );
    clock.set(0.0);
}

/// A daily quota in central European time (a POSIX rule: no tz database
/// needed) on the server's spring-forward day, 2025-03-30, which is 23
/// hours long: counted until 2025-03-30T22:00:00Z (midnight CEST), then a
/// fresh day whose end is 24 hours later.
#[tokio::test]
async fn a_day_of_23_hours_on_the_servers_clock_ends_at_the_zones_midnight() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(clock) = skewed_or_skip("calendar DST day", &[]) else {
        return;
    };
    const DAY_START: i64 = 1_743_289_200_000; // 2025-03-29T23:00:00Z
    const DAY_END: i64 = 1_743_372_000_000; // 2025-03-30T22:00:00Z
    const NEXT_END: i64 = 1_743_458_400_000; // 2025-03-31T22:00:00Z
    assert_eq!(DAY_END - DAY_START, 23 * 3_600_000);
    let mut conn = clock.server.conn().await;
    let berlin = nolock::rate::Zone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
    let day = Period::DAY.in_zone(berlin);
    let h = tag_number(&day);
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(2, day).unwrap()).unwrap();
    let key = format!("{}d", prefix("cal_dst"));
    set_server_at(&clock, DAY_END - 3_000);
    let mut history = Vec::new();
    for left in [1, 0] {
        let r = limiter_check(&limiter, &mut conn, &key, 1).await;
        assert_eq!(r.remaining, left);
        assert_eq!(r.period_end, Some(at_ms(DAY_END)));
        history.push(*r);
    }
    let denied = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert!(!denied.allowed);
    history.push(*denied);
    assert_eq!(
        stored(&mut conn, &key).await,
        (Some(format!("k{h}x2:2")), DAY_END)
    );
    set_server_at(&clock, DAY_END + 1_000);
    let r = limiter_check(&limiter, &mut conn, &key, 1).await;
    assert_eq!(r.remaining, 1);
    assert_eq!(r.period_end, Some(at_ms(NEXT_END)));
    history.push(*r);
    clock.set(0.0);
    for r in &history {
        let p = day.containing(r.at).unwrap();
        assert_eq!(Some(p.end), r.period_end, "{r:?}");
    }
}
