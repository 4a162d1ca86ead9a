//! Calendar quotas (`Algorithm::Calendar`) on a real server and on the
//! local 3x2 cluster: the period the server's clock is in is counted, its
//! end is in every answer and is the key's expiry, refunds act only within
//! the charge's period, a settlement's excess goes into the current
//! period, and a client whose boundaries miss the server's clock is
//! refused with nothing written.
//!
//! Also: bad arguments to the three scripts (raw `EVALSHA`) are definite
//! errors with nothing written on any key; foreign data (another tag, no
//! counter, a hash) is refused and left byte for byte, a bare count is read
//! as an untagged state, a count without expiry gets its period's end at its
//! next admission; `SCRIPT FLUSH` is survived; 64 racing tasks across real
//! second boundaries never pass the limit in any period (a checker holds
//! every decision to the period it reports); a client hours ahead is
//! refused for hourly periods and counted in the server's day for daily
//! ones; with stale zone data the stored period wins while it lasts. The
//! server's clock moved is `tests/calendar_clock.rs`.
//!
//! One file past the usual 500 lines on purpose: each test binary starts
//! its own 3x2 cluster, so the calendar's cluster tests share this one.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, MultiLimiter, Period, Quota, Settle};
use nolock::Error;
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, RedisResult};
use support::calendar::{at_ms, candidates, ms, period_of, tag_number};
use support::deployment::{both, Deployment};
use support::{prefix, raw};

both!(
    shared: [
        a_monthly_quota_counts_to_its_limit_and_names_the_months_end,
        refunds_and_settlements_act_in_the_charges_period,
        a_multi_limit_of_seconds_and_months_decides_once,
        boundaries_the_server_is_not_in_are_refused_and_write_nothing,
        costs_above_one_leave_the_exact_remaining_and_a_denial_writes_nothing,
        bad_arguments_to_check_are_definite_errors_that_write_nothing,
        bad_arguments_to_peek_and_refund_are_definite_errors_that_write_nothing,
        foreign_data_in_the_key_is_refused_and_left_as_it_was,
        a_bare_count_is_refused_as_foreign_and_left_alone,
        a_persisted_count_gets_the_periods_end_at_its_next_admission,
        sixty_four_tasks_across_second_boundaries_never_pass_the_limit_in_a_period,
        sixty_four_tasks_on_seconds_and_minutes_never_pass_either_limit,
        a_client_hours_ahead_is_refused_for_hours_and_counted_in_the_servers_day,
        stale_zone_data_the_stored_period_wins_while_it_lasts,
        a_charge_of_an_ended_period_gives_nothing_back_and_its_excess_goes_to_the_next,
        every_kind_of_period_is_counted_in_the_period_holding_the_servers_time,
    ],
    exclusive: [a_script_flush_before_calendar_calls_is_survived],
);

async fn server_ms(d: &Deployment, key: &str) -> i64 {
    let mut conn = d.owner(key).await;
    let t: Vec<String> = raw(&mut conn, &["TIME"]).await;
    t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
}

async fn a_monthly_quota_counts_to_its_limit_and_names_the_months_end(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}m", prefix("cal_month"));
    let month = Period::MONTH;
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(3, month).unwrap()).unwrap();
    let now = server_ms(d, &key).await;
    let want = month
        .containing(UNIX_EPOCH + Duration::from_millis(now as u64))
        .unwrap();
    for left in [2, 1, 0] {
        let r = limiter.check(&mut conn, &key, 1).await.unwrap();
        assert!(r.allowed);
        assert_eq!(r.remaining, left);
        assert_eq!(r.period_end, Some(want.end));
    }
    let denied = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert!(!denied.allowed);
    let retry = denied.retry_after.unwrap();
    let end_ms = ms(want.end);
    assert!(
        (ms(denied.at) + retry.as_millis() as i64 - end_ms).abs() <= 1,
        "{retry:?}"
    );
    let mut owner = d.owner(&key).await;
    let value: String = raw(&mut owner, &["GET", &key]).await;
    assert!(value.starts_with('k') && value.ends_with("x3:3"), "{value}");
    let at: i64 = raw(&mut owner, &["PEXPIRETIME", &key]).await;
    assert_eq!(at, end_ms, "the key expires at the month's end");
    // Another period on the same key is another tag: refused.
    let daily = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(3, Period::DAY).unwrap(),
    )
    .unwrap();
    assert!(matches!(
        daily.check(&mut conn, &key, 1).await,
        Err(Error::StateMismatch { .. })
    ));
    let peek = limiter.peek(&mut conn, &key, 1).await.unwrap();
    assert!(!peek.allowed);
    assert_eq!(peek.period_end, Some(want.end));
}

async fn refunds_and_settlements_act_in_the_charges_period(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}r", prefix("cal_refund"));
    let limiter = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(100, Period::DAY).unwrap(),
    )
    .unwrap();
    let mut a = limiter.check(&mut conn, &key, 10).await.unwrap();
    let charge = a.charge_mut().unwrap();
    let back = charge.refund(&mut conn, 4).await.unwrap();
    assert_eq!(back.credited, 4);
    assert_eq!(back.remaining, 94);
    let b = limiter.check(&mut conn, &key, 20).await.unwrap();
    let settled = b
        .into_charge()
        .unwrap()
        .settle(&mut conn, 50)
        .await
        .unwrap();
    assert!(matches!(settled, Settle::Settled(_)), "{settled:?}");
    let p = limiter.peek(&mut conn, &key, 1).await.unwrap();
    assert_eq!(p.remaining, 100 - 6 - 50);
}

async fn a_multi_limit_of_seconds_and_months_decides_once(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}u", prefix("cal_multi"));
    let limits = MultiLimiter::new(Algorithm::Calendar)
        .limit(
            "second",
            Quota::calendar(5, Period::seconds(60).unwrap()).unwrap(),
        )
        .unwrap()
        .limit("month", Quota::calendar(7, Period::MONTH).unwrap())
        .unwrap();
    let mut admitted = 0;
    for _ in 0..10 {
        if limits
            .check(&mut conn, key.as_str(), 1)
            .await
            .unwrap()
            .allowed
        {
            admitted += 1;
        }
    }
    // Five in the minute, unless the minute ended in between.
    assert!((5..=7).contains(&admitted), "{admitted}");
}

async fn boundaries_the_server_is_not_in_are_refused_and_write_nothing(d: &Deployment) {
    let key = format!("{}x", prefix("cal_raw"));
    let mut conn = d.owner(&key).await;
    let sha: String = {
        let src = nolock::script::Scripts::get("rate/calendar/check")
            .unwrap()
            .source();
        raw(&mut conn, &["SCRIPT", "LOAD", src]).await
    };
    let now = server_ms(d, &key).await;
    // Three hourly periods, all a day ahead of the server.
    let h = 3_600_000;
    let b0 = (now / h + 24) * h;
    let args = [b0, b0 + h, b0 + 2 * h, b0 + 3 * h].map(|b| b.to_string());
    let r: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(&key)
        .arg(1)
        .arg(7)
        .arg(10)
        .arg(&args[..])
        .query_async(&mut conn)
        .await;
    let err = r.unwrap_err();
    assert_eq!(err.code(), Some("NOLOCK_PERIOD"), "{err}");
    let exists: i64 = raw(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0);
}

/// The key's value and its expiry (PEXPIRETIME), read on its primary.
async fn stored(d: &Deployment, key: &str) -> (Option<String>, i64) {
    let mut conn = d.owner(key).await;
    let value: Option<String> = raw(&mut conn, &["GET", key]).await;
    let at: i64 = raw(&mut conn, &["PEXPIRETIME", key]).await;
    (value, at)
}

/// `SET key value PX 60000`, on its primary.
async fn plant(d: &Deployment, key: &str, value: &str) {
    let mut conn = d.owner(key).await;
    let _: () = raw(&mut conn, &["SET", key, value, "PX", "60000"]).await;
}

/// Loads the nolock script `name` on `conn`'s server; its SHA.
async fn load(conn: &mut MultiplexedConnection, name: &str) -> String {
    let src = nolock::script::Scripts::get(name).unwrap().source();
    raw(conn, &["SCRIPT", "LOAD", src]).await
}

/// `EVALSHA sha #keys keys... args...`.
async fn evalsha<T: FromRedisValue, C: redis::aio::ConnectionLike>(
    conn: &mut C,
    sha: &str,
    keys: &[&str],
    args: &[String],
) -> RedisResult<T> {
    redis::cmd("EVALSHA")
        .arg(sha)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(conn)
        .await
}

fn strings<const N: usize>(values: [i64; N]) -> Vec<String> {
    values.iter().map(i64::to_string).collect()
}

/// `result` is the definite error `ERR nolock <script>: ...<what>...`.
#[track_caller]
fn definite<T: std::fmt::Debug>(result: RedisResult<T>, script: &str, what: &str, case: &str) {
    let err = result.expect_err(case);
    let text = err.to_string();
    assert!(
        text.contains(&format!("nolock {script}: ")) && text.contains(what),
        "{case}: {text}"
    );
    assert_eq!(err.code(), Some("ERR"), "{case}: {text}");
}

/// The check's refusal of `args`. It converts its arguments by arithmetic
/// (as the other hot checks, issue 37): a non-numeric one raises Lua's own
/// error, a server error before any write, so still definite; any other
/// bad argument is nolock's own ERR naming `what`.
fn check_refused(r: RedisResult<redis::Value>, args: &[String], what: &str, case: &str) {
    if args
        .iter()
        .any(|a| a.parse::<f64>().is_err() && a != "adopt")
    {
        let err = r.expect_err(case);
        assert!(
            matches!(err.kind(), redis::ErrorKind::Server(_)),
            "{case}: {err:?}"
        );
    } else {
        definite(r, "rate/calendar/check", what, case);
    }
}

async fn costs_above_one_leave_the_exact_remaining_and_a_denial_writes_nothing(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}m", prefix("cal_cost"));
    let month = Period::MONTH;
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, month).unwrap()).unwrap();
    let (_, end) = period_of(&month, server_ms(d, &key).await);
    let h = tag_number(&month);
    for (cost, left) in [(3, 7), (4, 3)] {
        let r = limiter.check(&mut conn, &key, cost).await.unwrap();
        assert!(r.allowed, "{cost}");
        assert_eq!(r.remaining, left);
        assert_eq!(r.period_end, Some(at_ms(end)));
        assert_eq!(r.debt, 0);
        assert!((ms(r.at) + r.reset_after.as_millis() as i64 - end).abs() <= 1);
    }
    let before = stored(d, &key).await;
    assert_eq!(before, (Some(format!("k{h}x10:7")), end));
    // 4 do not fit in 3: denied, nothing counted, nothing rewritten.
    let denied = limiter.check(&mut conn, &key, 4).await.unwrap();
    assert!(!denied.allowed);
    assert!(denied.charge().is_none());
    assert_eq!(denied.remaining, 3);
    assert_eq!(denied.period_end, Some(at_ms(end)));
    let retry = denied.retry_after.unwrap().as_millis() as i64;
    assert!((ms(denied.at) + retry - end).abs() <= 1, "{retry}");
    assert_eq!(stored(d, &key).await, before, "a denial writes nothing");
    let peek = limiter.peek(&mut conn, &key, 3).await.unwrap();
    assert!(peek.allowed);
    assert_eq!(peek.remaining, 3);
    assert_eq!(stored(d, &key).await, before, "a peek writes nothing");
    // Exactly the rest fits.
    let r = limiter.check(&mut conn, &key, 3).await.unwrap();
    assert!(r.allowed);
    assert_eq!(r.remaining, 0);
    assert_eq!(stored(d, &key).await, (Some(format!("k{h}x10:10")), end));
    let full = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert!(!full.allowed);
    assert_eq!(full.remaining, 0);
    // Inputs the API refuses before any I/O.
    assert!(matches!(
        limiter.check(&mut conn, &key, 0).await,
        Err(Error::ZeroLimit { .. })
    ));
    assert!(matches!(
        limiter.check(&mut conn, &key, 11).await,
        Err(Error::InsufficientCapacity {
            requested: 11,
            limit: 10
        })
    ));
    assert_eq!(stored(d, &key).await, (Some(format!("k{h}x10:10")), end));
}

/// Quotas and algorithms that do not go together are refused when the
/// limiter is built, before any I/O: a calendar quota under any algorithm
/// but the calendar, a burst under the calendar.
#[test]
fn calendar_quotas_and_other_algorithms_refuse_each_other_before_io() {
    let calendar = Quota::calendar(10, Period::MONTH).unwrap();
    for algorithm in Algorithm::ALL {
        let with_calendar = Limiter::new(algorithm, calendar);
        let with_rate = Limiter::new(algorithm, Quota::per_second(1).unwrap());
        if algorithm == Algorithm::Calendar {
            // A quota of a duration is wall-clock runs of it; a burst other
            // than the rate, or a duration in no whole unit that fits, is
            // refused.
            assert!(with_calendar.is_ok());
            assert!(with_rate.is_ok(), "{with_rate:?}");
            let bursty = Quota::per_second(1).unwrap().with_burst(2).unwrap();
            assert!(matches!(
                Limiter::new(algorithm, bursty),
                Err(Error::InvalidArgument { .. })
            ));
            let odd = Quota::per(1, std::time::Duration::from_millis(50 * 86_400_000 + 1));
            assert!(Limiter::new(algorithm, odd.unwrap()).is_err());
            assert!(MultiLimiter::new(algorithm)
                .limit("s", Quota::per_second(1).unwrap())
                .is_ok());
            assert!(MultiLimiter::new(algorithm).limit("b", bursty).is_err());
        } else {
            assert!(
                matches!(with_calendar, Err(Error::InvalidArgument { .. })),
                "{algorithm}: {with_calendar:?}"
            );
            assert!(with_rate.is_ok(), "{algorithm}");
            assert!(MultiLimiter::new(algorithm).limit("m", calendar).is_err());
        }
    }
    assert!(matches!(
        Quota::calendar(0, Period::DAY),
        Err(Error::ZeroLimit { .. })
    ));
    assert!(Quota::calendar(1 << 53, Period::MONTH).is_err());
    assert!(Period::seconds(0).is_err());
}

async fn bad_arguments_to_check_are_definite_errors_that_write_nothing(d: &Deployment) {
    let p = prefix("cal_bad_check");
    let (key, other) = (format!("{{{p}}}a"), format!("{{{p}}}b"));
    let mut owner = d.owner(&key).await;
    let sha = load(&mut owner, "rate/calendar/check").await;
    let month = Period::MONTH;
    let h = tag_number(&month) as i64;
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, month).unwrap()).unwrap();
    let mut conn = d.conn().await;
    assert!(limiter.check(&mut conn, &key, 2).await.unwrap().allowed);
    let before = stored(d, &key).await;
    assert_eq!(before.0, Some(format!("k{h}x10:2")), "the API's tag");
    let b = candidates(&month, server_ms(d, &key).await);
    let [b0, b1, b2, b3] = b;
    let limit = |h: &str, l: &str, b: [&str; 4]| -> Vec<String> {
        [h, l, b[0], b[1], b[2], b[3]].map(str::to_owned).to_vec()
    };
    let (hs, bs) = (h.to_string(), strings(b));
    let good: Vec<String> = limit(&hs, "10", [&bs[0], &bs[1], &bs[2], &bs[3]]);
    let with_cost = |cost: &str, rest: &[String]| -> Vec<String> {
        std::iter::once(cost.to_owned())
            .chain(rest.iter().cloned())
            .collect()
    };
    let mut cases: Vec<(String, Vec<String>, &str)> = Vec::new();
    for cost in ["0", "-1", "1.5", "one", ""] {
        cases.push((format!("cost {cost:?}"), with_cost(cost, &good), "bad cost"));
    }
    cases.push((
        "cost above the limit".into(),
        with_cost("11", &good),
        "cost is above the limit of key 1",
    ));
    cases.push((
        "a boundary missing".into(),
        with_cost("1", &good[..5]),
        "expected 1 + 6 arguments",
    ));
    let mut extra = with_cost("1", &good);
    extra.push("nope".into());
    cases.push((
        "an extra argument".into(),
        extra,
        "expected 1 + 6 arguments",
    ));
    let bad_limit = "bad period or limit for key 1";
    for l in ["0", "-3", "2.5", "ten", "9007199254740992"] {
        let args = limit(&hs, l, [&bs[0], &bs[1], &bs[2], &bs[3]]);
        cases.push((format!("limit {l:?}"), with_cost("1", &args), bad_limit));
    }
    for h in ["4294967296", "-1", "0.5", "k"] {
        let args = limit(h, "10", [&bs[0], &bs[1], &bs[2], &bs[3]]);
        cases.push((format!("tag number {h}"), with_cost("1", &args), bad_limit));
    }
    for (name, b) in [
        ("two equal boundaries", [b0, b1, b1, b3]),
        ("decreasing boundaries", [b1, b0, b2, b3]),
        ("reversed boundaries", [b3, b2, b1, b0]),
        ("a negative boundary", [-5, b1, b2, b3]),
    ] {
        let bs = strings(b);
        let args = limit(&hs, "10", [&bs[0], &bs[1], &bs[2], &bs[3]]);
        cases.push((name.into(), with_cost("1", &args), bad_limit));
    }
    for (case, args, what) in &cases {
        let r: RedisResult<redis::Value> = evalsha(&mut owner, &sha, &[&key], args).await;
        check_refused(r, args, what, case);
        assert_eq!(stored(d, &key).await, before, "{case}: nothing written");
    }
    // Two limits: the first fits, the second is bad: nothing on either.
    for (case, args, what) in &cases {
        if !what.starts_with("bad period") {
            continue;
        }
        let second = &args[1..];
        let mut both = with_cost("1", &good);
        both.extend(second.iter().cloned());
        let r: RedisResult<redis::Value> = evalsha(&mut owner, &sha, &[&key, &other], &both).await;
        let what = what.replace("key 1", "key 2");
        check_refused(r, &both, &what, case);
        assert_eq!(stored(d, &key).await, before, "{case}: nothing on key 1");
        assert_eq!(stored(d, &other).await, (None, -2), "{case}: nor on key 2");
    }
    let mut small = with_cost("2", &good);
    small.extend(limit(&hs, "1", [&bs[0], &bs[1], &bs[2], &bs[3]]));
    let r: RedisResult<redis::Value> = evalsha(&mut owner, &sha, &[&key, &other], &small).await;
    definite(
        r,
        "rate/calendar/check",
        "cost is above the limit of key 2",
        "cost 2, limit 1",
    );
    assert_eq!(stored(d, &key).await, before);
    assert_eq!(stored(d, &other).await, (None, -2));
    // The arguments the cases bend are good as they are.
    let ok: Vec<i64> = evalsha(&mut owner, &sha, &[&key, &other], &{
        let mut both = with_cost("1", &good);
        both.extend(good.iter().cloned());
        both
    })
    .await
    .unwrap();
    assert_eq!((ok[0], ok[2], ok[3], ok[4], ok[5]), (1, 3, b2, 1, b2));
}

async fn bad_arguments_to_peek_and_refund_are_definite_errors_that_write_nothing(d: &Deployment) {
    let p = prefix("cal_bad_refund");
    let key = format!("{{{p}}}a");
    let (record, reset) = (format!("{{{p}}}record"), format!("{{{p}}}reset"));
    let mut owner = d.owner(&key).await;
    let peek = load(&mut owner, "rate/calendar/peek").await;
    let refund = load(&mut owner, "rate/calendar/refund").await;
    let month = Period::MONTH;
    let h = tag_number(&month) as i64;
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, month).unwrap()).unwrap();
    let mut conn = d.conn().await;
    assert!(limiter.check(&mut conn, &key, 2).await.unwrap().allowed);
    let before = stored(d, &key).await;
    let now = server_ms(d, &key).await;
    let [b0, b1, b2, b3] = candidates(&month, now);
    let end = before.1;
    assert_eq!(end, b2);

    // Peek: as check.
    let peek_args =
        |cost: i64, h: i64, l: i64, b: [i64; 4]| strings([cost, h, l, b[0], b[1], b[2], b[3]]);
    let peek_cases = [
        ("cost 0", peek_args(0, h, 10, [b0, b1, b2, b3]), "bad cost"),
        (
            "cost above the limit",
            peek_args(11, h, 10, [b0, b1, b2, b3]),
            "cost is above the limit",
        ),
        (
            "limit 0",
            peek_args(1, h, 0, [b0, b1, b2, b3]),
            "bad period or limit",
        ),
        (
            "tag number 2^32",
            peek_args(1, 1 << 32, 10, [b0, b1, b2, b3]),
            "bad period or limit",
        ),
        (
            "equal boundaries",
            peek_args(1, h, 10, [b0, b1, b1, b3]),
            "bad period or limit",
        ),
        (
            "a boundary missing",
            peek_args(1, h, 10, [b0, b1, b2, b3])[..6].to_vec(),
            "expected 1 + 6 arguments",
        ),
    ];
    for (case, args, what) in &peek_cases {
        let r: RedisResult<redis::Value> = evalsha(&mut owner, &peek, &[&key], args).await;
        definite(r, "rate/calendar/peek", what, case);
    }
    let seen: Vec<i64> = evalsha(
        &mut owner,
        &peek,
        &[&key],
        &peek_args(8, h, 10, [b0, b1, b2, b3]),
    )
    .await
    .unwrap();
    assert_eq!((seen[0], seen[2], seen[3]), (1, 2, end));

    // Refund: amount, actual, at, cost, settle, cap, then h, L, b0..b3,
    // held, reset. A charge of 2 taken now, refunding 1.
    let max = (1_i64 << 53) - 1;
    let refund_args = |amount: i64, h: i64, l: i64, b: [i64; 4], held: i64| {
        strings([
            amount,
            0,
            now * 1000,
            2,
            now + 3_600_000,
            max,
            h,
            l,
            b[0],
            b[1],
            b[2],
            b[3],
            held,
            end - now,
        ])
    };
    let good = [b0, b1, b2, b3];
    let refund_cases = [
        ("amount -1", refund_args(-1, h, 10, good, 2), "bad amount"),
        (
            "limit 0",
            refund_args(1, h, 0, good, 2),
            "bad period or limit for key 1",
        ),
        (
            "tag number 2^32",
            refund_args(1, 1 << 32, 10, good, 2),
            "bad period or limit for key 1",
        ),
        (
            "boundaries not increasing",
            refund_args(1, h, 10, [b0, b2, b1, b3], 2),
            "bad period or limit for key 1",
        ),
        (
            "held above the cost",
            refund_args(1, h, 10, good, 3),
            "bad held or reset for limit 1",
        ),
        (
            "held and reset missing",
            refund_args(1, h, 10, good, 2)[..12].to_vec(),
            "expected 6 + 8 arguments",
        ),
    ];
    for (case, args, what) in &refund_cases {
        let r: RedisResult<redis::Value> =
            evalsha(&mut owner, &refund, &[&key, &record, &reset], args).await;
        definite(r, "rate/calendar/refund", what, case);
        assert_eq!(stored(d, &key).await, before, "{case}: nothing written");
        assert_eq!(stored(d, &record).await, (None, -2), "{case}: no record");
    }
    // The same refund with good arguments gives one back.
    let r: Vec<i64> = evalsha(
        &mut owner,
        &refund,
        &[&key, &record, &reset],
        &refund_args(1, h, 10, good, 2),
    )
    .await
    .unwrap();
    assert_eq!((r[0], r[2], r[3], r[5], r[6]), (0, 1, 0, 1, end), "{r:?}");
    assert_eq!(stored(d, &key).await, (Some(format!("k{h}x10:1")), end));
    assert_eq!(stored(d, &record).await.0.as_deref(), Some("1"));
}

/// A charge of `limiter` taken on a scratch key, pointed at `key`.
async fn charge_on(d: &Deployment, limiter: &Limiter, key: &str) -> nolock::rate::Charge {
    let mut conn = d.conn().await;
    let scratch = format!("{}s", prefix("cal_scratch"));
    let charge = limiter
        .check(&mut conn, &scratch, 1)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let json = serde_json::to_string(&charge).unwrap();
    let moved = json.replace(
        &serde_json::to_string(&scratch).unwrap(),
        &serde_json::to_string(key).unwrap(),
    );
    assert_ne!(moved, json);
    serde_json::from_str(&moved).unwrap()
}

async fn foreign_data_in_the_key_is_refused_and_left_as_it_was(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cal_foreign");
    let month = Period::MONTH;
    let h = tag_number(&month);
    let ours = format!("k{h}x10");
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, month).unwrap()).unwrap();
    // (value, the tag it is refused as, or None: not a counter at all)
    let cases = [
        ("hello".to_owned(), None),
        ("3.0".to_owned(), None),
        (format!("{ours}:abc"), None),
        (format!("{ours}:-1"), None),
        ("k1x2:abc".to_owned(), Some("k1x2")),
        ("k1x2:3".to_owned(), Some("k1x2")),
        (format!("k{h}x11:1"), Some("")),
        ("g100x1:5".to_owned(), Some("g100x1")),
        ("f60000x10:3".to_owned(), Some("f60000x10")),
        ("c10x60000:3".to_owned(), Some("c10x60000")),
    ];
    for (i, (value, by)) in cases.iter().enumerate() {
        let key = format!("{p}{i}");
        plant(d, &key, value).await;
        let before = stored(d, &key).await;
        let by = by.map(|b| {
            if b.is_empty() {
                format!("k{h}x11")
            } else {
                b.to_owned()
            }
        });
        let check = limiter.check(&mut conn, &key, 1).await.map(|_| ());
        let peek = limiter.peek(&mut conn, &key, 1).await.map(|_| ());
        let mut charge = charge_on(d, &limiter, &key).await;
        let refund = charge.refund(&mut conn, 1).await.map(|_| ());
        let settle = charge_on(d, &limiter, &key)
            .await
            .settle(&mut conn, 5)
            .await
            .map(|_| ());
        for (what, result) in [
            ("check", check),
            ("peek", peek),
            ("refund", refund),
            ("settle", settle),
        ] {
            match (&by, result) {
                (Some(by), Err(Error::StateMismatch { detail })) => assert!(
                    detail.contains(&format!("{key} holds state written by {by}, not {ours}")),
                    "{value} {what}: {detail}"
                ),
                (None, Err(Error::Redis(e))) => {
                    assert_eq!(e.code(), Some("ERR"), "{value} {what}: {e}");
                    assert!(e.to_string().contains("does not hold a counter"), "{e}");
                }
                (_, other) => panic!("{value} {what}: {other:?}"),
            }
        }
        assert_eq!(stored(d, &key).await, before, "{value}: nothing written");
    }
    // A hash: WRONGTYPE, definite, the hash untouched.
    let key = format!("{p}hash");
    let mut owner = d.owner(&key).await;
    let _: () = raw(&mut owner, &["HSET", &key, "count", "3"]).await;
    for result in [
        limiter.check(&mut conn, &key, 1).await.map(|_| ()),
        limiter.peek(&mut conn, &key, 1).await.map(|_| ()),
        charge_on(d, &limiter, &key)
            .await
            .refund(&mut conn, 1)
            .await
            .map(|_| ()),
    ] {
        match result {
            Err(Error::Redis(e)) => assert!(e.to_string().contains("WRONGTYPE"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    let all: Vec<String> = raw(&mut owner, &["HGETALL", &key]).await;
    assert_eq!(all, ["count", "3"]);
}

/// A bare count (no tag; what a fixed window wrote before tags, or a
/// user's own counter) is read as an untagged state (lib/tag): its count
/// and its expiry taken as the stored period, which wins while it lasts;
/// the admission tags it and keeps the expiry; a denial writes nothing.
/// A bare count (a fixed window's or counter's state from before tags) is
/// no calendar state: calendar states were tagged from the start, so the
/// calendar scripts read strictly and refuse it, writing nothing.
async fn a_bare_count_is_refused_as_foreign_and_left_alone(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cal_bare");
    let limiter = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(10, Period::MONTH).unwrap(),
    )
    .unwrap();
    for count in ["4", "10"] {
        let key = format!("{p}{count}");
        plant(d, &key, count).await;
        let before = stored(d, &key).await;
        for result in [
            limiter.peek(&mut conn, &key, 1).await.map(drop),
            limiter.check(&mut conn, &key, 1).await.map(drop),
        ] {
            match result {
                Err(Error::Redis(e)) => {
                    assert!(e.to_string().contains("does not hold a counter"), "{e}")
                }
                other => panic!("{count}: {other:?}"),
            }
        }
        assert_eq!(stored(d, &key).await, before, "nothing written");
    }
}

async fn a_persisted_count_gets_the_periods_end_at_its_next_admission(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}p", prefix("cal_persist"));
    let month = Period::MONTH;
    let h = tag_number(&month);
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, month).unwrap()).unwrap();
    let (_, end) = period_of(&month, server_ms(d, &key).await);
    assert!(limiter.check(&mut conn, &key, 2).await.unwrap().allowed);
    let mut owner = d.owner(&key).await;
    let persisted: i64 = raw(&mut owner, &["PERSIST", &key]).await;
    assert_eq!(persisted, 1);
    let before = stored(d, &key).await;
    assert_eq!(before, (Some(format!("k{h}x10:2")), -1));
    let peek = limiter.peek(&mut conn, &key, 1).await.unwrap();
    assert_eq!(peek.remaining, 8);
    assert_eq!(peek.period_end, Some(at_ms(end)));
    let denied = limiter.check(&mut conn, &key, 9).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 8);
    assert_eq!(denied.period_end, Some(at_ms(end)));
    assert_eq!(stored(d, &key).await, before, "a denial writes nothing");
    let r = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert!(r.allowed);
    assert_eq!(r.remaining, 7);
    assert_eq!(r.period_end, Some(at_ms(end)));
    assert_eq!(
        stored(d, &key).await,
        (Some(format!("k{h}x10:3")), end),
        "the count kept, the period's end set"
    );
}

/// A refund of a charge whose key lost its expiry (someone PERSISTed it)
/// answers: credited 0 (the count is not known to be the charge's
/// period's), the count kept, and the end of the period the server is in
/// (once `{.., 3, 0}`: end 0 for a count of 3, which the client rejected
/// as `Error::UnexpectedReply` for a refund that ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_a_persisted_count_answers() {
    a_refund_on_a_persisted_count_credits_nothing(&Deployment::single()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_after_the_period_ended_names_its_period() {
    a_settlement_after_the_period_ended_names_the_current_period(&Deployment::single()).await
}

async fn a_refund_on_a_persisted_count_credits_nothing(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}p", prefix("cal_persist_refund"));
    let month = Period::MONTH;
    let h = tag_number(&month);
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, month).unwrap()).unwrap();
    let mut d3 = limiter.check(&mut conn, &key, 3).await.unwrap();
    let mut owner = d.owner(&key).await;
    let _: i64 = raw(&mut owner, &["PERSIST", &key]).await;
    let refund = d3.charge_mut().unwrap().refund(&mut conn, 1).await;
    let after = stored(d, &key).await;
    match refund {
        Ok(r) => {
            assert!(r.credited <= 1);
            assert_eq!(r.remaining, 7 + r.credited);
            assert_eq!(after.0, Some(format!("k{h}x10:{}", 3 - r.credited)));
        }
        Err(e) => panic!("the refund ran (count {:?}), but answered {e:?}", after.0),
    }
}

/// One decision as a checker sees it: admitted or not, its cost, the
/// server time of the decision (µs) and the end of the period it reports
/// (ms).
#[derive(Debug, Clone, Copy)]
struct Seen {
    allowed: bool,
    cost: u64,
    at_us: i64,
    end_ms: i64,
}

impl Seen {
    fn of(r: &nolock::rate::RateLimit, cost: u64) -> Seen {
        Seen {
            allowed: r.allowed,
            cost,
            at_us: r.at.duration_since(UNIX_EPOCH).unwrap().as_micros() as i64,
            end_ms: ms(r
                .period_end
                .expect("a calendar answer names its period's end")),
        }
    }
}

/// The calendar invariant over a history, for periods of `length_ms`
/// aligned to the epoch: every decision's server time lies in the period
/// it reports (`end - length <= at < end`), and in EVERY period seen the
/// units admitted are at most `limit`. Returns the units admitted per
/// period (by its end).
fn check_periods(history: &[Seen], length_ms: i64, limit: u64) -> BTreeMap<i64, u64> {
    let mut per_period = BTreeMap::new();
    for s in history {
        let at_ms = s.at_us.div_euclid(1000);
        assert_eq!(s.end_ms % length_ms, 0, "{s:?}: not a period's end");
        assert!(
            s.end_ms - length_ms <= at_ms && at_ms < s.end_ms,
            "{s:?}: decided outside the period it reports"
        );
        let n = per_period.entry(s.end_ms).or_insert(0);
        if s.allowed {
            *n += s.cost;
        }
    }
    for (end, n) in &per_period {
        assert!(
            *n <= limit,
            "{n} units admitted in the period ending at {end} ms, limit {limit}"
        );
    }
    per_period
}

/// 64 tasks checking for about 2.5 s, each call recorded.
async fn hammer<T, F, Fut>(d: &Deployment, call: F) -> Vec<T>
where
    F: Fn(support::deployment::AnyConn) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let until = Instant::now() + Duration::from_millis(2_500);
    let runs = d
        .race(64, move |conn| {
            let call = call.clone();
            async move {
                let mut seen = Vec::new();
                while Instant::now() < until {
                    seen.push(call(conn.clone()).await);
                }
                seen
            }
        })
        .await;
    runs.into_iter().flatten().collect()
}

async fn sixty_four_tasks_across_second_boundaries_never_pass_the_limit_in_a_period(
    d: &Deployment,
) {
    let key = format!("{}s", prefix("cal_race"));
    let limit = 5;
    let limiter = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(limit, Period::seconds(1).unwrap()).unwrap(),
    )
    .unwrap();
    let history = {
        let key = key.clone();
        hammer(d, move |mut conn| {
            let (limiter, key) = (limiter.clone(), key.clone());
            async move {
                let cost = 1 + fastrand::u64(0..2);
                Seen::of(&limiter.check(&mut conn, &key, cost).await.unwrap(), cost)
            }
        })
        .await
    };
    let per_period = check_periods(&history, 1000, limit);
    // The run spans at least two boundaries, and the limit was reached:
    // the bound is met, not just not approached.
    assert!(per_period.len() >= 3, "{per_period:?}");
    assert!(
        per_period.values().filter(|n| **n >= limit - 1).count() >= 2,
        "{per_period:?}"
    );
    assert!(history.iter().any(|s| !s.allowed));
}

async fn sixty_four_tasks_on_seconds_and_minutes_never_pass_either_limit(d: &Deployment) {
    let key = format!("{}u", prefix("cal_race_multi"));
    let (per_second, per_minute) = (5, 12);
    let limits = MultiLimiter::new(Algorithm::Calendar)
        .limit(
            "second",
            Quota::calendar(per_second, Period::seconds(1).unwrap()).unwrap(),
        )
        .unwrap()
        .limit(
            "minute",
            Quota::calendar(per_minute, Period::minutes(1).unwrap()).unwrap(),
        )
        .unwrap();
    let history = {
        let key = key.clone();
        hammer(d, move |mut conn| {
            let (limits, key) = (limits.clone(), key.clone());
            async move {
                let r = limits.check(&mut conn, key.as_str(), 1).await.unwrap();
                assert_eq!(r.limits.len(), 2);
                if r.allowed {
                    assert!(r.limits.iter().all(|l| l.allowed), "{r:?}");
                } else {
                    let by = r.denied_by.expect("a denial names its limit");
                    assert!(!r.limits[by].allowed, "{r:?}");
                }
                // All or nothing: a limit is counted only when both are.
                let seen = |l: &nolock::rate::RateLimit| Seen {
                    allowed: r.allowed,
                    ..Seen::of(l, 1)
                };
                (seen(&r.limits[0]), seen(&r.limits[1]))
            }
        })
        .await
    };
    let (seconds, minutes): (Vec<Seen>, Vec<Seen>) = history.into_iter().unzip();
    let per_second_period = check_periods(&seconds, 1000, per_second);
    let per_minute_period = check_periods(&minutes, 60_000, per_minute);
    // Both limits were reached: a second's 5, and the minute's 12 (within
    // 2.5 s, unless a minute ended during the run).
    assert!(
        per_second_period.values().any(|n| *n == per_second),
        "{per_second_period:?}"
    );
    assert!(
        per_minute_period.values().any(|n| *n == per_minute) || per_minute_period.len() == 2,
        "{per_minute_period:?}"
    );
    assert_eq!(
        per_second_period.values().sum::<u64>(),
        per_minute_period.values().sum::<u64>()
    );
}

/// A client whose clock is 3 h ahead of the server's, simulated with the
/// boundaries it would send. Hourly periods: none of its three holds the
/// server's hour, so it is refused with the server's time and nothing is
/// written, until a period is stored, which then wins. Daily periods: its
/// three days still hold the server's day, which is counted, not the
/// client's (the next day).
async fn a_client_hours_ahead_is_refused_for_hours_and_counted_in_the_servers_day(d: &Deployment) {
    let p = prefix("cal_ahead");
    let key = format!("{p}h");
    let mut owner = d.owner(&key).await;
    let (check, peek) = (
        load(&mut owner, "rate/calendar/check").await,
        load(&mut owner, "rate/calendar/peek").await,
    );
    let hour = Period::hours(1).unwrap();
    let h = tag_number(&hour) as i64;
    const H: i64 = 3_600_000;
    let now = server_ms(d, &key).await;
    let ahead = candidates(&hour, now + 3 * H);
    assert_eq!(ahead[0], (now / H + 2) * H);
    let args = strings([1, h, 5, ahead[0], ahead[1], ahead[2], ahead[3]]);
    for sha in [&check, &peek] {
        let err = evalsha::<redis::Value, _>(&mut owner, sha, &[&key], &args)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("NOLOCK_PERIOD"), "{err}");
        let text = err.to_string();
        let said: i64 = text
            .split("server time ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            (now..now + 60_000).contains(&said),
            "{said} vs {now}: {text}"
        );
        assert!(text.contains("nothing was written"), "{text}");
        assert_eq!(stored(d, &key).await, (None, -2));
    }
    // The server's hour, stored by a client whose clock is right: the
    // client ahead is now counted in it (the stored period wins).
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(5, hour).unwrap()).unwrap();
    let mut conn = d.conn().await;
    let r = limiter.check(&mut conn, &key, 1).await.unwrap();
    let end = ms(r.period_end.unwrap());
    assert_eq!(stored(d, &key).await, (Some(format!("k{h}x5:1")), end));
    if end > ahead[0] {
        // The hour ended meanwhile: the boundaries now hold the server.
        return;
    }
    let counted: Vec<i64> = evalsha(&mut owner, &check, &[&key], &args).await.unwrap();
    assert_eq!((counted[0], counted[2], counted[3]), (1, 2, end));
    assert_eq!(stored(d, &key).await, (Some(format!("k{h}x5:2")), end));

    // Days: the client is already in the server's next day.
    let day = Period::DAY;
    let h = tag_number(&day) as i64;
    let key = format!("{p}d");
    // The day's key may live on another node of the cluster.
    let mut owner = d.owner(&key).await;
    assert_eq!(load(&mut owner, "rate/calendar/check").await, check);
    let now = server_ms(d, &key).await;
    let (start, end) = period_of(&day, now);
    let client = end + 3 * H;
    let b = candidates(&day, client);
    assert_eq!(b, [start, end, end + 24 * H, end + 48 * H]);
    let r: Vec<i64> = evalsha(
        &mut owner,
        &check,
        &[&key],
        &strings([2, h, 5, b[0], b[1], b[2], b[3]]),
    )
    .await
    .unwrap();
    let seen_now = r[1] / 1000;
    let (_, server_end) = period_of(&day, seen_now);
    assert_eq!((r[0], r[2], r[3]), (1, 2, server_end), "{r:?}");
    assert_eq!(
        stored(d, &key).await,
        (Some(format!("k{h}x5:2")), server_end)
    );
    // A client whose clock is right reads the same count in the same day.
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(5, day).unwrap()).unwrap();
    let peek = limiter.peek(&mut conn, &key, 1).await.unwrap();
    assert_eq!(peek.remaining, 3);
    assert_eq!(peek.period_end, Some(at_ms(server_end)));
}

/// Two clients with other zone data: one period definition (same tag
/// number and limit), boundaries an hour apart. The first to write stores
/// its period; the other is counted in it while it lasts (its own end is
/// not used), so 64 racing calls of both admit the limit once; once the
/// stored period ends, the next call opens its own client's period.
async fn stale_zone_data_the_stored_period_wins_while_it_lasts(d: &Deployment) {
    let p = prefix("cal_stale");
    let key = format!("{p}d");
    let mut owner = d.owner(&key).await;
    let check = load(&mut owner, "rate/calendar/check").await;
    const H: i64 = 3_600_000;
    let h = tag_number(&Period::DAY) as i64;
    let now = server_ms(d, &key).await;
    let utc = candidates(&Period::DAY, now);
    // The other client's days start an hour earlier; take the three of
    // them that hold now.
    let shifted = candidates(&Period::DAY, now + H).map(|b| b - H);
    let args_of = |b: [i64; 4]| strings([1, h, 10, b[0], b[1], b[2], b[3]]);
    let (a, b) = (args_of(utc), args_of(shifted));
    let replies: Vec<RedisResult<Vec<i64>>> = d
        .race(64, |mut conn| {
            let (sha, key) = (check.clone(), key.clone());
            let args = if fastrand::bool() {
                a.clone()
            } else {
                b.clone()
            };
            async move { evalsha(&mut conn, &sha, &[&key], &args).await }
        })
        .await;
    let replies: Vec<Vec<i64>> = replies.into_iter().map(Result::unwrap).collect();
    let ends: std::collections::BTreeSet<i64> = replies.iter().map(|r| r[3]).collect();
    assert_eq!(ends.len(), 1, "one period counted: {ends:?}");
    let end = *ends.first().unwrap();
    let admitted = replies.iter().filter(|r| r[0] == 1).count();
    assert_eq!(admitted, 10);
    let mut counts: Vec<i64> = replies.iter().filter(|r| r[0] == 1).map(|r| r[2]).collect();
    counts.sort();
    assert_eq!(counts, (1..=10).collect::<Vec<_>>());
    assert_eq!(stored(d, &key).await, (Some(format!("k{h}x10:10")), end));

    // The same in periods of 1.2 s, to see the stored one end: A's
    // periods end at t + 600, B's at t + 800.
    let key = format!("{p}s");
    let mut owner = d.owner(&key).await;
    let check = load(&mut owner, "rate/calendar/check").await;
    let t = server_ms(d, &key).await;
    let a = [t - 1800, t - 600, t + 600, t + 1800];
    let b = [t - 1600, t - 400, t + 800, t + 2000];
    let call = |b: [i64; 4]| strings([1, 1, 3, b[0], b[1], b[2], b[3]]);
    let first: Vec<i64> = evalsha(&mut owner, &check, &[&key], &call(a))
        .await
        .unwrap();
    assert_eq!((first[0], first[2], first[3]), (1, 1, t + 600));
    for count in [2, 3] {
        let r: Vec<i64> = evalsha(&mut owner, &check, &[&key], &call(b))
            .await
            .unwrap();
        if r[1] / 1000 >= t + 600 {
            return; // a slow machine: A's period ended already
        }
        assert_eq!(
            (r[0], r[2], r[3]),
            (1, count, t + 600),
            "B counts in A's period"
        );
    }
    let full: Vec<i64> = evalsha(&mut owner, &check, &[&key], &call(b))
        .await
        .unwrap();
    if full[1] / 1000 < t + 600 {
        assert_eq!((full[0], full[2], full[3]), (0, 3, t + 600));
    }
    assert_eq!(stored(d, &key).await, (Some("k1x3:3".into()), t + 600));
    let wait = t + 620 - server_ms(d, &key).await;
    tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
    let next: Vec<i64> = evalsha(&mut owner, &check, &[&key], &call(b))
        .await
        .unwrap();
    assert_eq!(
        (next[0], next[2], next[3]),
        (1, 1, t + 800),
        "B's own period"
    );
    assert_eq!(stored(d, &key).await, (Some("k1x3:1".into()), t + 800));
}

async fn a_script_flush_before_calendar_calls_is_survived(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}f", prefix("cal_flush"));
    let month = Period::MONTH;
    let h = tag_number(&month);
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, month).unwrap()).unwrap();
    let (_, end) = period_of(&month, server_ms(d, &key).await);
    d.flush_scripts_everywhere().await;
    let mut first = limiter.check(&mut conn, &key, 3).await.unwrap();
    assert!(first.allowed);
    assert_eq!(first.period_end, Some(at_ms(end)));
    d.flush_scripts_everywhere().await;
    assert_eq!(limiter.peek(&mut conn, &key, 1).await.unwrap().remaining, 7);
    d.flush_scripts_everywhere().await;
    let back = first
        .charge_mut()
        .unwrap()
        .refund(&mut conn, 1)
        .await
        .unwrap();
    assert_eq!((back.credited, back.remaining), (1, 8));
    let second = limiter.check(&mut conn, &key, 2).await.unwrap();
    d.flush_scripts_everywhere().await;
    let settled = second
        .into_charge()
        .unwrap()
        .settle(&mut conn, 4)
        .await
        .unwrap();
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    assert_eq!((s.charged, s.state.remaining), (2, 4));
    assert_eq!(stored(d, &key).await, (Some(format!("k{h}x10:6")), end));
    d.flush_scripts_everywhere().await;
    let other = Limiter::new(Algorithm::Calendar, Quota::calendar(11, month).unwrap()).unwrap();
    assert!(matches!(
        other.check(&mut conn, &key, 1).await,
        Err(Error::StateMismatch { .. })
    ));
    d.flush_scripts_everywhere().await;
    let multi = MultiLimiter::new(Algorithm::Calendar)
        .limit("day", Quota::calendar(2, Period::DAY).unwrap())
        .unwrap();
    let key = format!("{}g", prefix("cal_flush"));
    assert!(
        multi
            .check(&mut conn, key.as_str(), 2)
            .await
            .unwrap()
            .allowed
    );
    d.flush_scripts_everywhere().await;
    assert!(
        !multi
            .check(&mut conn, key.as_str(), 1)
            .await
            .unwrap()
            .allowed
    );
}

/// The checker's own test: a history with one unit too many in one period
/// (but not from the start of the run) fails it.
#[test]
#[should_panic(expected = "3 units admitted in the period ending at 3000 ms, limit 2")]
fn the_period_checker_catches_one_period_over_its_limit() {
    let seen = |at_ms: i64, end_ms: i64| Seen {
        allowed: true,
        cost: 1,
        at_us: at_ms * 1000,
        end_ms,
    };
    // Periods of 1 s: 2, 0, then 3 (the run as a whole is under 2 per s).
    let history = [
        seen(0, 1000),
        seen(999, 1000),
        seen(2000, 3000),
        seen(2500, 3000),
        seen(2999, 3000),
    ];
    check_periods(&history, 1000, 2);
}

/// The checker's own test: a decision whose server time is not in the
/// period it reports (at its end, which belongs to the next) fails it.
#[test]
#[should_panic(expected = "decided outside the period it reports")]
fn the_period_checker_catches_a_decision_outside_its_period() {
    let history = [Seen {
        allowed: false,
        cost: 1,
        at_us: 1_000_000,
        end_ms: 1000,
    }];
    check_periods(&history, 1000, 2);
}

/// Periods of one second, on the server's real clock: a charge of one
/// period refunded or settled in the next gives nothing back there, and a
/// settlement's excess is charged to the next period's count.
async fn a_charge_of_an_ended_period_gives_nothing_back_and_its_excess_goes_to_the_next(
    d: &Deployment,
) {
    let mut conn = d.conn().await;
    let key = format!("{}s", prefix("cal_next"));
    let second = Period::seconds(1).unwrap();
    let h = tag_number(&second);
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, second).unwrap()).unwrap();
    // Start early in a second, so that the three charges share it.
    let now = server_ms(d, &key).await;
    if now % 1000 > 500 {
        tokio::time::sleep(Duration::from_millis((1000 - now % 1000) as u64 + 5)).await;
    }
    let mut a = limiter.check(&mut conn, &key, 4).await.unwrap();
    let b = limiter.check(&mut conn, &key, 3).await.unwrap();
    let c = limiter.check(&mut conn, &key, 2).await.unwrap();
    let end = ms(a.period_end.unwrap());
    assert!(a.allowed && b.allowed && c.allowed);
    assert_eq!(c.period_end, Some(at_ms(end)), "one second");
    assert_eq!(c.remaining, 1);
    let wait = end + 5 - server_ms(d, &key).await;
    tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
    // The next second: opened by a check of 1.
    let next = limiter.check(&mut conn, &key, 1).await.unwrap();
    let next_end = ms(next.period_end.unwrap());
    assert!(next_end > end);
    let back = a.charge_mut().unwrap().refund(&mut conn, 4).await.unwrap();
    let mut left = 9;
    if server_ms(d, &key).await >= next_end {
        return; // a slow machine: the next second ended too
    }
    assert_eq!((back.credited, back.remaining), (0, left));
    let settled = b.into_charge().unwrap().settle(&mut conn, 1).await.unwrap();
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    assert_eq!((s.credited, s.charged, s.state.remaining), (0, 0, left));
    let settled = c.into_charge().unwrap().settle(&mut conn, 5).await.unwrap();
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    left -= 3;
    assert_eq!((s.credited, s.charged, s.state.remaining), (0, 3, left));
    let (value, expiry) = stored(d, &key).await;
    if server_ms(d, &key).await < next_end {
        assert_eq!(value, Some(format!("k{h}x10:4")));
        assert_eq!(expiry, next_end);
        assert_eq!(s.state.period_end, Some(at_ms(next_end)));
    }
}

/// `RateLimit::period_end` is documented as set "for Algorithm::Calendar
/// always (the period's end, also when nothing was counted in it yet)".
/// A settlement below its reservation after the charge's period ended,
/// with no period stored since, answers a state whose period_end is None:
/// rate/calendar/refund answers end 0 when no period is stored and no
/// excess opens one (check and peek answer the period of the boundaries
/// holding the server's time instead).
async fn a_settlement_after_the_period_ended_names_the_current_period(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}s", prefix("cal_settle_end"));
    let second = Period::seconds(1).unwrap();
    let limiter = Limiter::new(Algorithm::Calendar, Quota::calendar(10, second).unwrap()).unwrap();
    let a = limiter.check(&mut conn, &key, 4).await.unwrap();
    let end = ms(a.period_end.unwrap());
    let wait = end + 5 - server_ms(d, &key).await;
    tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
    let settled = a.into_charge().unwrap().settle(&mut conn, 1).await.unwrap();
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    assert_eq!((s.credited, s.charged, s.state.remaining), (0, 0, 10));
    let period_end = s.state.period_end.map(ms);
    assert!(
        matches!(period_end, Some(e) if e > end),
        "the settlement's state names no current period: {:?}",
        s.state
    );
}

/// Every kind of period the API builds (a zone's day from 06:00, Sunday
/// weeks, quarters, years, a DST zone's month, minutes) is counted in the
/// period holding the server's time, tagged with its own number.
async fn every_kind_of_period_is_counted_in_the_period_holding_the_servers_time(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cal_kinds");
    let berlin = nolock::rate::Zone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
    let periods = [
        Period::DAY
            .in_zone(nolock::rate::Zone::fixed(5 * 3600 + 1800).unwrap())
            .days_start_at(6, 0)
            .unwrap(),
        Period::WEEK.weeks_start_on(nolock::rate::Weekday::Sunday),
        Period::months(3).unwrap(),
        Period::YEAR,
        Period::MONTH.in_zone(berlin),
        Period::minutes(15).unwrap(),
        Period::days(2)
            .unwrap()
            .in_zone(nolock::rate::Zone::fixed(-8 * 3600).unwrap()),
    ];
    for (i, period) in periods.iter().enumerate() {
        let key = format!("{p}{i}");
        let limiter =
            Limiter::new(Algorithm::Calendar, Quota::calendar(7, *period).unwrap()).unwrap();
        let r = limiter.check(&mut conn, &key, 2).await.unwrap();
        assert!(r.allowed, "{period}");
        let held = period.containing(r.at).unwrap();
        assert_eq!(r.period_end, Some(held.end), "{period}");
        let h = tag_number(period);
        let (value, expiry) = stored(d, &key).await;
        assert_eq!(value, Some(format!("k{h}x7:2")), "{period}");
        assert_eq!(expiry, ms(held.end), "{period}");
    }
}
