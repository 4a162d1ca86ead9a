//! The tag of a bounded counter (`c<limit>x<window>:<count>`) and of a fixed
//! window (`f<window>x<limit>:<count>`), on a single server and on the local
//! 3x2 cluster: a call of other numbers, or of another limit, on a key is
//! `Error::StateMismatch` with the key left byte for byte as it was; a count
//! written before tags is read as before and tagged at its next admission;
//! a handle whose stored numbers changed with `Keep` takes the counts over;
//! the tags survive `SCRIPT FLUSH` and 64 callers at once.
//!
//! The issue's row: `Counter` 100/min, then 5 per second, then
//! `try_increment` at 1000/h on one key decided by their own numbers
//! against one count. Now the first writes the key and the other two are
//! refused.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nolock::config::{Change, Family, Spec, State};
use nolock::limits::{self, Counter};
use nolock::rate::{Algorithm, Limiter, Quota, Settle};
use nolock::{Client, Error};
use support::deployment::{both, Deployment};
use support::{prefix, raw};

const MINUTE: Duration = Duration::from_secs(60);

both!(
    shared: [
        the_issue_row_is_refused_and_writes_nothing,
        counters_and_fixed_windows_refuse_each_other,
        a_fixed_window_refuses_a_gcra_state,
        a_fixed_window_refuses_the_state_a_gcra_limiter_writes,
        a_fixed_window_of_other_numbers_is_refused,
        bare_counts_are_read_and_tagged_at_the_next_admission,
        a_refund_writes_its_tag_and_keeps_the_window,
        a_keep_change_through_the_client_counter_adopts_the_count,
        sixty_four_callers_never_pass_the_limit,
    ],
    exclusive: [a_script_flush_before_tagged_calls_is_survived],
);

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

/// `err` is the refusal of `ours` on `key`, which holds state tagged `by`.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: nolock::Result<T>, key: &str, by: &str, ours: &str) {
    match result {
        Err(Error::StateMismatch { detail }) => {
            assert!(
                detail.contains(&format!("{key} holds state written by {by}, not {ours}")),
                "{detail}"
            );
        }
        other => panic!("expected a state mismatch ({by} vs {ours}), got {other:?}"),
    }
}

fn fixed(quota: Quota) -> Limiter {
    Limiter::new(Algorithm::FixedWindow, quota).unwrap()
}

async fn the_issue_row_is_refused_and_writes_nothing(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}c", prefix("issue_row"));
    let api = Counter::new(100, MINUTE).unwrap();
    assert!(api.try_increment(&mut conn, &key).await.unwrap().admitted);
    let before = stored(d, &key).await;
    assert_eq!(before.0.as_deref(), Some("c100x60000:1"));

    let fast = Counter::new(5, Duration::from_secs(1)).unwrap();
    refused(
        fast.try_increment(&mut conn, &key).await,
        &key,
        "c100x60000",
        "c5x1000",
    );
    refused(
        limits::try_increment(&mut conn, &key, 1000, Duration::from_secs(3600)).await,
        &key,
        "c100x60000",
        "c1000x3600000",
    );
    // A read of other numbers is refused the same way; one of its own, or
    // one that names no numbers, reads the count.
    refused(
        fast.peek(&mut conn, &key).await,
        &key,
        "c100x60000",
        "c5x1000",
    );
    assert_eq!(api.peek(&mut conn, &key).await.unwrap().count, 1);
    assert_eq!(limits::peek(&mut conn, &key).await.unwrap().count, 1);
    assert_eq!(stored(d, &key).await, before, "nothing was written");

    // The counter's own calls go on as before.
    let a = api.try_increment_by(&mut conn, &key, 9).await.unwrap();
    assert_eq!((a.admitted, a.count), (true, 10));
    let after = stored(d, &key).await;
    assert_eq!(after.0.as_deref(), Some("c100x60000:10"));
    assert_eq!(after.1, before.1, "the window is kept");
}

async fn counters_and_fixed_windows_refuse_each_other(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("families");
    // A fixed window's state, then a counter of the same numbers: another letter.
    let window_key = format!("{p}w");
    let window = fixed(Quota::per_minute(10).unwrap());
    assert!(
        window
            .check(&mut conn, &window_key, 1)
            .await
            .unwrap()
            .allowed
    );
    let before = stored(d, &window_key).await;
    assert_eq!(before.0.as_deref(), Some("f60000x10:1"));
    refused(
        limits::try_increment(&mut conn, &window_key, 10, MINUTE).await,
        &window_key,
        "f60000x10",
        "c10x60000",
    );
    refused(
        limits::peek(&mut conn, &window_key).await,
        &window_key,
        "f60000x10",
        "c",
    );
    assert_eq!(stored(d, &window_key).await, before);

    // A counter's state under a fixed window: refused by check, peek and refund.
    let counter_key = format!("{p}c");
    let a = limits::try_increment(&mut conn, &counter_key, 10, MINUTE)
        .await
        .unwrap();
    assert!(a.admitted);
    let before = stored(d, &counter_key).await;
    refused(
        window.check(&mut conn, &counter_key, 1).await,
        &counter_key,
        "c10x60000",
        "f60000x10",
    );
    refused(
        window.peek(&mut conn, &counter_key, 1).await,
        &counter_key,
        "c10x60000",
        "f60000x10",
    );
    assert_eq!(stored(d, &counter_key).await, before, "nothing was written");
}

async fn a_fixed_window_refuses_a_gcra_state(d: &Deployment) {
    let mut conn = d.conn().await;
    let window = fixed(Quota::per_second(10).unwrap());

    // A TAT as GCRA tags it (lib/tag), written raw.
    let planted = format!("{}g", prefix("gcra_raw"));
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    plant(d, &planted, &format!("g100000x10:{now_us}")).await;
    let before = stored(d, &planted).await;
    refused(
        window.check(&mut conn, &planted, 1).await,
        &planted,
        "g100000x10",
        "f1000x10",
    );
    refused(
        window.peek(&mut conn, &planted, 1).await,
        &planted,
        "g100000x10",
        "f1000x10",
    );
    refused(
        limits::try_increment(&mut conn, &planted, 10, MINUTE).await,
        &planted,
        "g100000x10",
        "c10x60000",
    );
    assert_eq!(stored(d, &planted).await, before, "nothing was written");
}

/// Needs GCRA's own tag (`lua/rate/gcra/check.lua` writing `g<T>x<b>:<tat>`).
async fn a_fixed_window_refuses_the_state_a_gcra_limiter_writes(d: &Deployment) {
    let mut conn = d.conn().await;
    let window = fixed(Quota::per_second(10).unwrap());
    let key = format!("{}g", prefix("gcra_real"));
    let gcra = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    assert!(gcra.check(&mut conn, &key, 1).await.unwrap().allowed);
    let before = stored(d, &key).await;
    let tat = before.0.clone().unwrap();
    let by = tat.split_once(':').map(|(by, _)| by).unwrap_or("");
    assert_eq!(by, "g100000x10", "GCRA tags its TAT: {tat}");
    refused(
        window.check(&mut conn, &key, 1).await,
        &key,
        "g100000x10",
        "f1000x10",
    );
    refused(
        window.peek(&mut conn, &key, 1).await,
        &key,
        "g100000x10",
        "f1000x10",
    );
    assert_eq!(stored(d, &key).await, before, "nothing was written");
}

async fn a_fixed_window_of_other_numbers_is_refused(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}w", prefix("fixed_numbers"));
    let ten = fixed(Quota::per_minute(10).unwrap());
    let mut first = ten.check(&mut conn, &key, 3).await.unwrap();
    assert!(first.allowed);
    let before = stored(d, &key).await;
    assert_eq!(before.0.as_deref(), Some("f60000x10:3"));

    for (other, ours) in [
        (fixed(Quota::per_minute(5).unwrap()), "f60000x5"),
        (fixed(Quota::per_second(10).unwrap()), "f1000x10"),
        (
            fixed(Quota::per(10, Duration::from_secs(3600)).unwrap()),
            "f3600000x10",
        ),
    ] {
        refused(
            other.check(&mut conn, &key, 1).await,
            &key,
            "f60000x10",
            ours,
        );
        refused(
            other.peek(&mut conn, &key, 1).await,
            &key,
            "f60000x10",
            ours,
        );
        // A charge of other numbers pointed at this key: its refund is
        // refused too (the key was emptied and written by `ten` since).
        let scratch = format!("{}w", prefix("fixed_scratch"));
        let mut charge = other
            .check(&mut conn, &scratch, 1)
            .await
            .unwrap()
            .into_charge()
            .unwrap();
        let json = serde_json::to_string(&charge).unwrap();
        let moved = json.replace(
            &serde_json::to_string(&scratch).unwrap(),
            &serde_json::to_string(&key).unwrap(),
        );
        assert_ne!(moved, json);
        charge = serde_json::from_str(&moved).unwrap();
        refused(charge.refund(&mut conn, 1).await, &key, "f60000x10", ours);
    }
    assert_eq!(stored(d, &key).await, before, "nothing was written");

    // The limiter's own calls go on, and its refund keeps the tag.
    let charge = first.charge_mut().unwrap();
    assert_eq!(charge.refund(&mut conn, 1).await.unwrap().credited, 1);
    assert_eq!(
        stored(d, &key).await,
        (Some("f60000x10:2".into()), before.1)
    );
}

async fn bare_counts_are_read_and_tagged_at_the_next_admission(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("bare");

    // A counter written before tags: read as it is; a denial writes no tag.
    let key = format!("{p}c");
    plant(d, &key, "4").await;
    let before = stored(d, &key).await;
    assert_eq!(limits::peek(&mut conn, &key).await.unwrap().count, 4);
    let api = Counter::new(5, MINUTE).unwrap();
    assert_eq!(api.peek(&mut conn, &key).await.unwrap().count, 4);
    let denied = api.try_increment_by(&mut conn, &key, 2).await.unwrap();
    assert_eq!((denied.admitted, denied.count), (false, 4));
    assert_eq!(stored(d, &key).await, before, "a denial writes no tag");
    let a = api.try_increment(&mut conn, &key).await.unwrap();
    assert_eq!((a.admitted, a.count, a.remaining), (true, 5, 0));
    assert_eq!(
        stored(d, &key).await,
        (Some("c5x60000:5".into()), before.1),
        "tagged, the window kept"
    );

    // A fixed window written before tags.
    let key = format!("{p}w");
    plant(d, &key, "2").await;
    let before = stored(d, &key).await;
    let window = fixed(Quota::per_minute(10).unwrap());
    let peeked = window.peek(&mut conn, &key, 1).await.unwrap();
    assert_eq!(peeked.remaining, 8);
    let mut checked = window.check(&mut conn, &key, 1).await.unwrap();
    assert!(checked.allowed);
    assert_eq!(checked.remaining, 7);
    assert_eq!(
        stored(d, &key).await,
        (Some("f60000x10:3".into()), before.1)
    );
    // A refund on a bare count (the charge's window) tags it too.
    let mut owner = d.owner(&key).await;
    let _: () = raw(&mut owner, &["SET", &key, "3", "KEEPTTL"]).await;
    let refund = checked
        .charge_mut()
        .unwrap()
        .refund(&mut conn, 1)
        .await
        .unwrap();
    assert_eq!((refund.credited, refund.remaining), (1, 8));
    assert_eq!(
        stored(d, &key).await,
        (Some("f60000x10:2".into()), before.1)
    );
}

async fn a_refund_writes_its_tag_and_keeps_the_window(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}w", prefix("refund"));
    let window = fixed(Quota::per_minute(10).unwrap());
    let mut charges = Vec::new();
    for _ in 0..3 {
        let decision = window.check(&mut conn, &key, 2).await.unwrap();
        assert!(decision.allowed);
        charges.push(decision.into_charge().unwrap());
    }
    let before = stored(d, &key).await;
    assert_eq!(before.0.as_deref(), Some("f60000x10:6"));
    let r = charges[0].refund(&mut conn, 2).await.unwrap();
    assert_eq!((r.credited, r.remaining), (2, 6));
    assert_eq!(
        stored(d, &key).await,
        (Some("f60000x10:4".into()), before.1)
    );
    // A settlement above the reservation charges the excess, tagged.
    let settled = charges.remove(1).settle(&mut conn, 5).await.unwrap();
    let Settle::Settled(s) = settled else {
        panic!("{settled:?}")
    };
    assert_eq!((s.charged, s.state.remaining), (3, 3));
    assert_eq!(
        stored(d, &key).await,
        (Some("f60000x10:7".into()), before.1)
    );
    // A counter state beside the charge: the refund refuses it.
    let _: () = raw(
        &mut d.owner(&key).await,
        &["SET", &key, "c10x60000:7", "KEEPTTL"],
    )
    .await;
    let before = stored(d, &key).await;
    refused(
        charges[1].refund(&mut conn, 1).await,
        &key,
        "c10x60000",
        "f60000x10",
    );
    assert_eq!(stored(d, &key).await, before);
}

/// A name of its own per test run: the deployment is shared.
fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{base}-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

async fn client(d: &Deployment) -> Client {
    match d {
        Deployment::Single(server) => Client::connect(server.url()).await.unwrap(),
        Deployment::Cluster(cluster) => Client::connect_cluster(cluster.urls()).await.unwrap(),
    }
}

/// The key of `id` under the counter `name`, and its count, as an operator
/// inspects them.
async fn inspect(client: &Client, name: &str, id: &str) -> (String, u64) {
    let seen = client
        .configs()
        .inspect(Family::Counter, name, id)
        .await
        .unwrap();
    match seen.state {
        State::Counter(c) => (c.key, c.count),
        other => panic!("{other:?}"),
    }
}

async fn a_keep_change_through_the_client_counter_adopts_the_count(d: &Deployment) {
    let name = unique("plan");
    let client = client(d).await;
    let api = client.counter(&name, 10, MINUTE).unwrap();
    assert_eq!(api.increment_by("acme", 6).await.unwrap().remaining, 4);
    let (key, count) = inspect(&client, &name, "acme").await;
    assert_eq!(count, 6);
    let before = stored(d, &key).await;
    assert_eq!(before.0.as_deref(), Some("c10x60000:6"));

    let configs = client.configs();
    configs
        .set(&name, Spec::counter(20, MINUTE), Change::Keep)
        .await
        .unwrap();
    configs.refresh().await.unwrap();
    // The handle reads the count of the numbers before, writing nothing...
    assert_eq!(api.peek("acme").await.unwrap().count, 6);
    assert_eq!(api.limit(), 20);
    assert_eq!(inspect(&client, &name, "acme").await.1, 6);
    assert_eq!(stored(d, &key).await, before);
    // ...and takes it over at its next increment.
    assert_eq!(api.increment("acme").await.unwrap().remaining, 13);
    let after = stored(d, &key).await;
    assert_eq!(after, (Some("c20x60000:7".into()), before.1));
    // A raw counter of the numbers before is now refused: it does not adopt.
    let mut conn = d.conn().await;
    refused(
        Counter::new(10, MINUTE)
            .unwrap()
            .try_increment(&mut conn, &key)
            .await,
        &key,
        "c20x60000",
        "c10x60000",
    );
    assert_eq!(stored(d, &key).await, after);
    // The handle's other ids start tagged with the stored numbers.
    assert_eq!(api.increment("fresh").await.unwrap().remaining, 19);
    let (fresh, _) = inspect(&client, &name, "fresh").await;
    assert_eq!(stored(d, &fresh).await.0.as_deref(), Some("c20x60000:1"));
}

async fn a_script_flush_before_tagged_calls_is_survived(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("flush");
    let key = format!("{p}c");
    let api = Counter::new(3, MINUTE).unwrap();
    d.flush_scripts_everywhere().await;
    assert_eq!(api.try_increment(&mut conn, &key).await.unwrap().count, 1);
    d.flush_scripts_everywhere().await;
    assert_eq!(api.peek(&mut conn, &key).await.unwrap().count, 1);
    d.flush_scripts_everywhere().await;
    refused(
        limits::try_increment(&mut conn, &key, 4, MINUTE).await,
        &key,
        "c3x60000",
        "c4x60000",
    );
    d.flush_scripts_everywhere().await;
    refused(
        Counter::new(4, MINUTE).unwrap().peek(&mut conn, &key).await,
        &key,
        "c3x60000",
        "c4x60000",
    );
    assert_eq!(stored(d, &key).await.0.as_deref(), Some("c3x60000:1"));

    let key = format!("{p}w");
    let window = fixed(Quota::per_minute(3).unwrap());
    d.flush_scripts_everywhere().await;
    let mut decision = window.check(&mut conn, &key, 2).await.unwrap();
    assert!(decision.allowed);
    d.flush_scripts_everywhere().await;
    assert_eq!(window.peek(&mut conn, &key, 1).await.unwrap().remaining, 1);
    d.flush_scripts_everywhere().await;
    let charge = decision.charge_mut().unwrap();
    assert_eq!(charge.refund(&mut conn, 1).await.unwrap().credited, 1);
    d.flush_scripts_everywhere().await;
    refused(
        fixed(Quota::per_minute(4).unwrap())
            .check(&mut conn, &key, 1)
            .await,
        &key,
        "f60000x3",
        "f60000x4",
    );
    assert_eq!(stored(d, &key).await.0.as_deref(), Some("f60000x3:1"));
}

async fn sixty_four_callers_never_pass_the_limit(d: &Deployment) {
    let p = prefix("race");
    // A counter that starts from a bare count of 3: 7 more fit.
    let key = format!("{p}c");
    plant(d, &key, "3").await;
    let api = Counter::new(10, MINUTE).unwrap();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (mut conn, key, api, barrier) =
            (d.conn().await, key.clone(), api.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            api.try_increment(&mut conn, &key).await.unwrap()
        }));
    }
    let mut counts = BTreeSet::new();
    for task in tasks {
        let a = task.await.unwrap();
        assert!(a.count <= 10, "{a:?}");
        if a.admitted {
            assert!(counts.insert(a.count), "count {} seen twice", a.count);
        } else {
            assert_eq!(a.count, 10, "denied only when full");
        }
    }
    assert_eq!(counts, (4..=10).collect());
    assert_eq!(stored(d, &key).await.0.as_deref(), Some("c10x60000:10"));

    // A fixed window, from empty.
    let key = format!("{p}w");
    let window = fixed(Quota::per_minute(10).unwrap());
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (mut conn, key, window, barrier) =
            (d.conn().await, key.clone(), window.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            window.check(&mut conn, &key, 1).await.unwrap()
        }));
    }
    let mut remaining = BTreeSet::new();
    let mut denied = 0;
    for task in tasks {
        let decision = task.await.unwrap();
        if decision.allowed {
            assert!(
                remaining.insert(decision.remaining),
                "two saw {}",
                decision.remaining
            );
        } else {
            denied += 1;
        }
    }
    assert_eq!(remaining, (0..10).collect());
    assert_eq!(denied, 54);
    assert_eq!(stored(d, &key).await.0.as_deref(), Some("f60000x10:10"));
}
