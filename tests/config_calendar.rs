//! Calendar quotas stored as named configurations (`nolock::config`), on a
//! single server and on the local 3x2 cluster: a per-customer monthly
//! quota is one configured limit used through a client handle; a plan
//! upgrade mid-month and a zone change (`Change::Keep`) keep the month's
//! usage, because handles adopt the state the numbers before wrote; a
//! multi-limit of 10 per calendar second and 100 000 per month decides
//! once; and stored configurations round-trip through serde, those
//! written before calendar quotas byte for byte.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nolock::client::{Rejection, Scope};
use nolock::config::{Change, Family, LimitSpec, Per, Spec};
use nolock::rate::{Algorithm, Period, Quota, Zone};
use nolock::{Client, Error};
use support::deployment::{both, Deployment};
use support::raw;

/// The poll the tests' clients use: the bound a change reaches them in.
const POLL: Duration = Duration::from_millis(50);

both!(
    shared: [
        a_monthly_quota_per_customer_is_one_configured_limit,
        a_plan_upgrade_mid_month_keeps_the_months_usage,
        a_zone_change_keeps_the_stored_month_until_it_runs_out,
        ten_per_second_and_a_hundred_thousand_per_month_decide_once,
        stored_calendar_configs_read_back_as_written,
    ],
    exclusive: [],
);

async fn client(d: &Deployment) -> Client {
    let client = match d {
        Deployment::Single(server) => Client::connect(server.url()).await.unwrap(),
        Deployment::Cluster(cluster) => Client::connect_cluster(cluster.urls()).await.unwrap(),
    };
    client.config_poll(POLL).unwrap()
}

/// A name of its own per test run: the cluster is shared.
fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{base}-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// The server's clock, read on the node that owns `key`.
async fn server_time(d: &Deployment, key: &str) -> SystemTime {
    let mut conn = d.owner(key).await;
    let t: Vec<String> = raw(&mut conn, &["TIME"]).await;
    UNIX_EPOCH
        + Duration::from_secs(t[0].parse().unwrap())
        + Duration::from_micros(t[1].parse().unwrap())
}

/// The end of the period of `period` holding the server's time at `key`.
async fn end_at_server(d: &Deployment, key: &str, period: Period) -> SystemTime {
    period.containing(server_time(d, key).await).unwrap().end
}

/// Waits until `f` holds, at most a second.
async fn within<F, Fut>(mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let from = Instant::now();
    while !f().await {
        assert!(from.elapsed() < Duration::from_secs(1), "not within 1s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn limited<T: std::fmt::Debug>(r: Result<T, Rejection>) -> nolock::client::Limited {
    match r {
        Err(Rejection::Limited(l)) => l,
        other => panic!("not limited: {other:?}"),
    }
}

fn berlin() -> Zone {
    Zone::parse("Europe/Berlin").unwrap()
}

async fn a_monthly_quota_per_customer_is_one_configured_limit(d: &Deployment) {
    let name = unique("monthly");
    let month = Period::MONTH.in_zone(berlin());
    let quota = Quota::calendar(3, month).unwrap();
    let api = client(d).await.rate_limit(&name, quota).unwrap();
    let key = api.key("acme").unwrap();
    assert!(key.contains("calendar"), "{key}");
    for left in [2, 1, 0] {
        assert_eq!(api.check("acme").await.unwrap().remaining, left);
    }
    let denied = limited(api.check("acme").await);
    let end = end_at_server(d, &key, month).await;
    let retry = denied.retry_after.expect("until the month's end");
    let until = end.duration_since(SystemTime::now()).unwrap();
    assert!(
        retry.abs_diff(until) < Duration::from_secs(5),
        "{retry:?} {until:?}"
    );
    // Each customer has a month of its own, in the one configured limit.
    assert_eq!(api.check("globex").await.unwrap().remaining, 2);
    assert_eq!(api.peek("acme").await.unwrap().period_end, Some(end));

    // Stored once, with its period, and listed as an operator reads it.
    let config = api.insist().await.unwrap();
    assert_eq!(config.spec, Spec::rate_limit(Algorithm::Calendar, quota));
    assert_eq!(config.spec.quota().unwrap().calendar_period(), Some(month));
    assert_eq!(
        config.spec.to_string(),
        "calendar 3 per 1 month in Europe/Berlin from 00:00"
    );
    let listed = client(d).await.configs().list().await.unwrap();
    assert!(listed
        .iter()
        .any(|c| c.family == Family::RateLimit && c.name == name && c.spec == config.spec));
    // A process built with a daily quota under that name decides by the
    // stored month, on the same state.
    let daily = client(d)
        .await
        .rate_limit(&name, Quota::calendar(100, Period::DAY).unwrap())
        .unwrap();
    limited(daily.check("acme").await);
    assert!(matches!(
        daily.insist().await,
        Err(Error::ConfigMismatch { .. })
    ));
}

async fn a_plan_upgrade_mid_month_keeps_the_months_usage(d: &Deployment) {
    let name = unique("plan");
    let operator = client(d).await;
    let basic = Quota::calendar(10_000, Period::MONTH).unwrap();
    let api = client(d).await.rate_limit(&name, basic).unwrap();
    assert_eq!(
        api.check_cost("acme", 9_000).await.unwrap().remaining,
        1_000
    );
    let key = api.key("acme").unwrap();
    let end = api.peek("acme").await.unwrap().period_end.unwrap();

    let pro = Quota::calendar(20_000, Period::MONTH).unwrap();
    operator
        .configs()
        .set(
            &name,
            Spec::rate_limit(Algorithm::Calendar, pro),
            Change::Keep,
        )
        .await
        .unwrap();
    within(|| async { api.peek("acme").await.unwrap().limit == 20_000 }).await;
    // The 9 000 used this month still count: 11 000 left, not 20 000
    // (and no NOLOCK_STATE: the handle adopts the state of 10 000).
    let now = api.peek("acme").await.unwrap();
    assert_eq!((now.remaining, now.period_end), (11_000, Some(end)));
    let admitted = api.check_cost("acme", 11_000).await.unwrap();
    assert_eq!(admitted.remaining, 0);
    limited(api.check("acme").await);
    let mut owner = d.owner(&key).await;
    let value: String = raw(&mut owner, &["GET", &key]).await;
    assert!(value.ends_with("x20000:20000"), "retagged: {value}");
    // Same key: Keep starts no new generation.
    assert_eq!(api.key("acme").unwrap(), key);
}

async fn a_zone_change_keeps_the_stored_month_until_it_runs_out(d: &Deployment) {
    let name = unique("zone");
    let operator = client(d).await;
    let utc = Period::MONTH;
    let api = client(d)
        .await
        .rate_limit(&name, Quota::calendar(100, utc).unwrap())
        .unwrap();
    assert_eq!(api.check_cost("acme", 30).await.unwrap().remaining, 70);
    let key = api.key("acme").unwrap();
    let utc_end = api.peek("acme").await.unwrap().period_end.unwrap();
    let mut owner = d.owner(&key).await;
    let before: String = raw(&mut owner, &["GET", &key]).await;

    let local = Period::MONTH.in_zone(berlin());
    let spec = Spec::rate_limit(Algorithm::Calendar, Quota::calendar(100, local).unwrap());
    operator
        .configs()
        .set(&name, spec, Change::Keep)
        .await
        .unwrap();
    within(|| async {
        api.peek("acme").await.is_ok() && api.limiter().quota().calendar_period() == Some(local)
    })
    .await;
    // The usage is kept, and the stored month (UTC) runs to its end: one
    // period is never counted twice at once.
    let d1 = api.decide("acme", 1).await.unwrap();
    assert!(d1.allowed);
    assert_eq!((d1.remaining, d1.period_end), (69, Some(utc_end)));
    let after: String = raw(&mut owner, &["GET", &key]).await;
    assert!(after.ends_with("x100:31"), "{after}");
    assert_eq!(
        before.split(':').next(),
        after.split(':').next(),
        "the zone is not in the tag: where a month starts, not what it is"
    );
    // So a raw limiter of the new zone reads the same state, no refusal.
    let raw_berlin =
        nolock::rate::Limiter::new(Algorithm::Calendar, Quota::calendar(100, local).unwrap())
            .unwrap();
    let mut conn = d.conn().await;
    let seen = raw_berlin.peek(&mut conn, &key, 1).await.unwrap();
    assert_eq!((seen.remaining, seen.period_end), (69, Some(utc_end)));
    // A customer without a stored month gets the Berlin one.
    let fresh = api.decide("globex", 1).await.unwrap();
    let fresh_key = api.key("globex").unwrap();
    assert_eq!(
        fresh.period_end,
        Some(end_at_server(d, &fresh_key, local).await)
    );
    assert_ne!(
        Some(utc_end),
        fresh.period_end,
        "Berlin's month ends an hour or two earlier"
    );
}

async fn ten_per_second_and_a_hundred_thousand_per_month_decide_once(d: &Deployment) {
    let name = unique("tiers");
    let second = Quota::calendar(10, Period::seconds(1).unwrap()).unwrap();
    let month = Quota::calendar(100_000, Period::MONTH).unwrap();
    let limits = client(d)
        .await
        .rate_limits(&name)
        .algorithm(Algorithm::Calendar)
        .per_member("user", second)
        .per_scope("tenant", month)
        .build()
        .unwrap();
    let alice = Scope::new("acme").member("alice");
    assert_eq!(limits.check(&alice).await.unwrap().remaining, 9);
    let config = limits.insist().await.unwrap();
    assert_eq!(
        config.spec,
        Spec::RateLimits {
            algorithm: Algorithm::Calendar,
            limits: vec![
                LimitSpec::new("user", Per::Member, second),
                LimitSpec::new("tenant", Per::Scope, month),
            ],
        }
    );
    assert_eq!(
        config.spec.to_string(),
        "calendar user per member 10 per 1 second, \
         tenant per scope 100000 per 1 month in UTC from 00:00"
    );

    // Per calendar second at most 10 of alice's; every admission counted
    // once in the tenant's month. Grouped by the second each was counted
    // in, whatever the machine's speed.
    let multi = limits.limiter();
    let mut conn = limits.connection();
    let mut per_second = std::collections::BTreeMap::new();
    let mut admitted = 1;
    for _ in 0..40 {
        let key = limits.multi_key(&alice).unwrap();
        let r = multi.check(&mut conn, key, 1).await.unwrap();
        let user = &r.limits[0];
        assert!(user.period_end.is_some());
        if r.allowed {
            admitted += 1;
            *per_second.entry(user.period_end).or_insert(0) += 1;
        } else {
            assert_eq!(r.denied_by, Some(0), "only the second denies");
        }
    }
    assert!(per_second.values().all(|&n| n <= 10), "{per_second:?}");
    let now = limits.peek(&alice).await.unwrap();
    assert_eq!(now.limits[1].remaining, 100_000 - admitted);
    // Bob shares the tenant's month, not alice's second.
    let bob = Scope::new("acme").member("bob");
    assert_eq!(limits.check(&bob).await.unwrap().remaining, 9);
    let now = limits.peek(&bob).await.unwrap();
    assert_eq!(now.limits[1].remaining, 100_000 - admitted - 1);
    // Every node of the test deployments runs on one machine's clock.
    assert_eq!(
        now.limits[1].period_end,
        Some(end_at_server(d, &name, Period::MONTH).await)
    );
}

async fn stored_calendar_configs_read_back_as_written(d: &Deployment) {
    // Written before calendar quotas: the same bytes, read the same way.
    let old =
        r#"{"kind":"rate-limit","algorithm":"gcra","rate":100,"period_ms":60000,"burst":100}"#;
    let spec: Spec = serde_json::from_str(old).unwrap();
    assert_eq!(
        spec,
        Spec::rate_limit(Algorithm::Gcra, Quota::per_minute(100).unwrap())
    );
    assert_eq!(serde_json::to_string(&spec).unwrap(), old);
    let old_multi = r#"{"kind":"rate-limits","algorithm":"gcra","limits":[{"name":"user","per":"member","rate":10,"period_ms":1000,"burst":10}]}"#;
    let multi: Spec = serde_json::from_str(old_multi).unwrap();
    assert_eq!(serde_json::to_string(&multi).unwrap(), old_multi);
    multi.validate().unwrap();

    // With a calendar: the period is stored whole, and comes back equal.
    let quarter = Period::months(3)
        .unwrap()
        .in_zone(berlin())
        .days_start_at(6, 0)
        .unwrap();
    let spec = Spec::rate_limit(
        Algorithm::Calendar,
        Quota::calendar(50_000, quarter).unwrap(),
    );
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(
        json["calendar"],
        serde_json::json!({
            "unit": "month", "every": 3, "zone": "Europe/Berlin",
            "week_start": "monday", "day_start": "06:00"
        })
    );
    let back: Spec = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, spec);
    assert_eq!(back.quota().unwrap().calendar_period(), Some(quarter));
    // Numbers Quota::calendar would not compute are refused.
    let mut forged = json.clone();
    forged["period_ms"] = serde_json::json!(1000);
    let forged: Spec = serde_json::from_value(forged).unwrap();
    assert!(matches!(
        forged.validate(),
        Err(Error::InvalidArgument { .. })
    ));
    // A calendar period needs the calendar algorithm.
    let mut gcra = json.clone();
    gcra["algorithm"] = serde_json::json!("gcra");
    let gcra: Spec = serde_json::from_value(gcra).unwrap();
    match gcra.validate() {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("only algorithm calendar"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Without a period, the calendar algorithm counts in runs of the
    // stored period from the epoch: valid, and read as such.
    let mut bare = json;
    bare.as_object_mut().unwrap().remove("calendar");
    let bare: Spec = serde_json::from_value(bare).unwrap();
    bare.validate().unwrap();
    assert_eq!(bare.quota().unwrap().calendar_period(), None);

    // Through the registry: stored and read back equal, and the stored
    // body of a spec without calendar is the one written before.
    let client = client(d).await;
    let configs = client.configs();
    let (cal, plain) = (unique("cal"), unique("plain"));
    configs.set(&cal, spec.clone(), Change::Keep).await.unwrap();
    let minute = Spec::rate_limit(Algorithm::Gcra, Quota::per_minute(100).unwrap());
    configs.set(&plain, minute, Change::Keep).await.unwrap();
    let read = configs.get(Family::RateLimit, &cal).await.unwrap().unwrap();
    assert_eq!(read.spec, spec);
    let mut conn = client.connection();
    let field = format!("rate-limit:{plain}");
    let stored: String = redis::cmd("HGET")
        .arg(nolock::config::REGISTRY_KEY)
        .arg(&field)
        .query_async(&mut conn)
        .await
        .unwrap();
    let body = stored.splitn(3, ' ').nth(2).unwrap();
    assert!(body.contains(old), "{body}");
    assert!(!body.contains("calendar"), "{body}");
}
