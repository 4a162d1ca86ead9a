//! Calendar quotas (`Algorithm::Calendar`) on a real server and on the
//! local 3x2 cluster: the period the server's clock is in is counted, its
//! end is in every answer and is the key's expiry, refunds act only within
//! the charge's period, a settlement's excess goes into the current
//! period, and a client whose boundaries miss the server's clock is
//! refused with nothing written.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, MultiLimiter, Period, Quota, Settle};
use nolock::Error;
use support::deployment::{both, Deployment};
use support::{prefix, raw};

both!(
    shared: [
        a_monthly_quota_counts_to_its_limit_and_names_the_months_end,
        refunds_and_settlements_act_in_the_charges_period,
        a_multi_limit_of_seconds_and_months_decides_once,
        boundaries_the_server_is_not_in_are_refused_and_write_nothing,
    ],
    exclusive: [],
);

fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

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
    let mut conn = d.owner(&format!("{}x", prefix("cal_raw"))).await;
    let key = format!("{}x", prefix("cal_raw"));
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
