//! Every rate limit's state knows what wrote it (`lua/lib/tag.lua`), on a
//! single server and on the local 3x2 cluster: two raw limiters of other
//! numbers, or of another algorithm, on one key are a definite
//! `Error::StateMismatch` with nothing written; a state written before
//! tags is read and tagged at its next write; the handles of stored
//! configurations adopt the state across a declared change.
//!
//! The counter's, the fixed window's, the token bucket's, the sliding
//! window's and the semaphore's own cases are in `tests/counter_tags.rs`,
//! `tests/window_tags.rs` and `tests/semaphore_tags.rs`.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::config::{Change, Spec};
use nolock::rate::{Algorithm, Limiter, MultiKey, MultiLimiter, Quota};
use nolock::script::Scripts;
use nolock::{Client, Error};
use support::deployment::{both, AnyConn, Deployment};

const MINUTE: Duration = Duration::from_secs(60);

both!(
    shared: [
        a_fast_gcra_on_a_slow_ones_key_is_refused_with_nothing_written,
        another_algorithm_on_a_gcra_key_is_refused,
        a_gcra_state_is_tagged_and_keeps_all_its_digits,
        a_state_written_before_tags_is_read_and_then_tagged,
        peek_partial_and_refund_refuse_another_limits_state,
        a_multi_limit_with_one_foreign_limit_writes_nothing,
        a_tag_that_is_no_tag_is_foreign_data,
        a_non_numeric_argument_is_a_definite_error_with_nothing_written,
        a_handle_adopts_the_state_across_a_declared_change,
    ],
    exclusive: [
        a_tagged_state_survives_a_script_flush,
    ],
);

/// A key of its own per test run: the cluster is shared.
fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{base}-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

fn gcra(rate: u64, period: Duration) -> Limiter {
    Limiter::new(Algorithm::Gcra, Quota::per(rate, period).unwrap()).unwrap()
}

/// The bytes and absolute expiry of a key, read on its owner: equal
/// snapshots mean nothing was written.
async fn snapshot(d: &Deployment, key: &str) -> (Option<Vec<u8>>, i64) {
    let mut owner = d.owner(key).await;
    let dump: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", key]).await;
    let expiry: i64 = support::raw(&mut owner, &["PEXPIRETIME", key]).await;
    (dump, expiry)
}

fn assert_mismatch<T: std::fmt::Debug>(
    result: nolock::Result<T>,
    key: &str,
    stored: &str,
    ours: &str,
) {
    match result {
        Err(Error::StateMismatch { detail }) => {
            let want = format!("{key} holds state written by {stored}, not {ours}");
            assert!(detail.contains(&want), "{detail:?} lacks {want:?}");
        }
        other => panic!("expected StateMismatch ({stored} vs {ours}): {other:?}"),
    }
}

/// The third row: GCRA 2 per minute, then GCRA 100 per second on
/// one key. The fast one used to answer "0 remaining", stuck behind the
/// slow one's state.
async fn a_fast_gcra_on_a_slow_ones_key_is_refused_with_nothing_written(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = unique("rl:row3");
    let slow = gcra(2, MINUTE);
    let fast = gcra(100, Duration::from_secs(1));
    assert!(slow.check(&mut conn, &key, 1).await.unwrap().allowed);
    let before = snapshot(d, &key).await;
    assert_mismatch(
        fast.check(&mut conn, &key, 1).await,
        &key,
        "g30000000x2",
        "g10000x100",
    );
    assert_mismatch(
        fast.peek(&mut conn, &key, 1).await,
        &key,
        "g30000000x2",
        "g10000x100",
    );
    assert_eq!(snapshot(d, &key).await, before, "nothing was written");
    // The slow one still decides by its own state.
    let again = slow.check(&mut conn, &key, 1).await.unwrap();
    assert!(again.allowed && again.remaining == 0, "{again:?}");
}

/// The fourth row, from GCRA's side: the fixed window read a TAT as
/// a count ("allowed: false" and no error). Every other algorithm refuses.
async fn another_algorithm_on_a_gcra_key_is_refused(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = unique("rl:row4");
    assert!(
        gcra(10, MINUTE)
            .check(&mut conn, &key, 1)
            .await
            .unwrap()
            .allowed
    );
    let before = snapshot(d, &key).await;
    let quota = Quota::per(10, MINUTE).unwrap();
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let other = Limiter::new(algorithm, quota).unwrap();
        let result = other.check(&mut conn, &key, 1).await;
        // Every state is a string whose tag says who wrote it.
        let ours = match algorithm {
            Algorithm::FixedWindow => "f60000x10",
            Algorithm::SlidingWindow => "s60000x10",
            _ => "b6000000x10",
        };
        assert_mismatch(result, &key, "g6000000x10", ours);
    }
    assert_eq!(snapshot(d, &key).await, before, "nothing was written");

    // And GCRA refuses a fixed window's count, a sliding window's and a
    // token bucket's state.
    for (algorithm, stored) in [
        (Algorithm::FixedWindow, "f60000x10"),
        (Algorithm::SlidingWindow, "s60000x10"),
        (Algorithm::TokenBucket, "b6000000x10"),
    ] {
        let counted = unique(&format!("rl:row4b:{algorithm}"));
        let other = Limiter::new(algorithm, quota).unwrap();
        assert!(other.check(&mut conn, &counted, 3).await.unwrap().allowed);
        let before = snapshot(d, &counted).await;
        assert_mismatch(
            gcra(10, MINUTE).check(&mut conn, &counted, 1).await,
            &counted,
            stored,
            "g6000000x10",
        );
        assert_eq!(snapshot(d, &counted).await, before, "{algorithm}");
    }
}

/// `g<T>x<b>:<TAT>`, the TAT with all 16 digits (Lua's own number to
/// string keeps 14), round-tripping through the next decision.
async fn a_gcra_state_is_tagged_and_keeps_all_its_digits(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = unique("rl:digits");
    let limiter = gcra(10, Duration::from_secs(1)); // T = 100000 us, burst 10
    let first = limiter.check(&mut conn, &key, 3).await.unwrap();
    assert!(first.allowed);
    let stored = d.get(&key).await.expect("stored");
    let tat = stored
        .strip_prefix("g100000x10:")
        .unwrap_or_else(|| panic!("{stored:?}"));
    assert_eq!(tat.len(), 16, "{stored:?}");
    let tat: u64 = tat.parse().unwrap();
    let at = first.at.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
    assert_eq!(tat, at + 300_000, "the TAT is exact");
    let second = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert_eq!(second.remaining, 6, "{second:?}");
    let stored = d.get(&key).await.unwrap();
    assert_eq!(stored, format!("g100000x10:{}", tat + 100_000));
}

/// A bare TAT, as versions before tags wrote it: read as before (a
/// rolling upgrade keeps every id's state), tagged at the next admission.
/// A denial writes nothing, so it leaves it bare.
async fn a_state_written_before_tags_is_read_and_then_tagged(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = unique("rl:legacy");
    let limiter = gcra(10, MINUTE); // T = 6 s
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    // Nine units in use: the TAT is 54 s ahead.
    let tat = now.as_micros() as u64 + 9 * 6_000_000;
    let mut owner = d.owner(&key).await;
    let _: () = support::raw(&mut owner, &["SET", &key, &tat.to_string(), "PX", "60000"]).await;

    let denied = limiter.check(&mut conn, &key, 2).await.unwrap();
    assert!(!denied.allowed, "only one unit fits: {denied:?}");
    assert_eq!(
        d.get(&key).await.unwrap(),
        tat.to_string(),
        "a denial writes nothing"
    );
    let admitted = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert!(admitted.allowed && admitted.remaining == 0, "{admitted:?}");
    assert_eq!(
        d.get(&key).await.unwrap(),
        format!("g6000000x10:{}", tat + 6_000_000)
    );
}

async fn peek_partial_and_refund_refuse_another_limits_state(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = unique("rl:paths");
    let ten = gcra(10, MINUTE);
    let twenty = gcra(20, MINUTE);
    let mut charge = ten
        .check(&mut conn, &key, 4)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let before = snapshot(d, &key).await;
    assert_mismatch(
        twenty.peek(&mut conn, &key, 1).await,
        &key,
        "g6000000x10",
        "g3000000x20",
    );
    assert_mismatch(
        twenty.check_at_most(&mut conn, &key, 5).await,
        &key,
        "g6000000x10",
        "g3000000x20",
    );
    assert_eq!(snapshot(d, &key).await, before);

    // A charge of the other numbers, on this key: its refund is refused.
    let other = unique("rl:paths-other");
    let mut foreign = twenty
        .check(&mut conn, &other, 2)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let _: () = {
        let mut owner = d.owner(&other).await;
        let value = d.get(&key).await.unwrap();
        support::raw(&mut owner, &["SET", &other, &value, "PX", "60000"]).await
    };
    let before_other = snapshot(d, &other).await;
    assert!(matches!(
        foreign.refund(&mut conn, 1).await,
        Err(Error::StateMismatch { .. })
    ));
    assert_eq!(snapshot(d, &other).await.0, before_other.0);
    assert_eq!(foreign.held(), 2, "a refused refund keeps its count");

    // Its own numbers refund as before.
    let refund = charge.refund(&mut conn, 4).await.unwrap();
    assert_eq!(refund.credited, 4);
}

async fn a_multi_limit_with_one_foreign_limit_writes_nothing(d: &Deployment) {
    let mut conn = d.conn().await;
    let tenant = unique("{t");
    let limits = MultiLimiter::new(Algorithm::Gcra)
        .shared_limit("second", Quota::per_second(5).unwrap())
        .unwrap()
        .shared_limit("minute", Quota::per_minute(100).unwrap())
        .unwrap();
    let keys = [format!("{tenant}}}:s"), format!("{tenant}}}:m")];
    // Another limiter wrote the minute key.
    assert!(
        gcra(7, MINUTE)
            .check(&mut conn, &keys[1], 1)
            .await
            .unwrap()
            .allowed
    );
    let before = (snapshot(d, &keys[0]).await, snapshot(d, &keys[1]).await);
    let key = MultiKey::new(&keys[0])
        .shared("second", &keys[0])
        .shared("minute", &keys[1]);
    let result = limits.check(&mut conn, key, 1).await;
    assert!(
        matches!(result, Err(Error::StateMismatch { .. })),
        "{result:?}"
    );
    assert_eq!(
        (snapshot(d, &keys[0]).await, snapshot(d, &keys[1]).await),
        before,
        "all or nothing: not even the first limit was charged"
    );
}

async fn a_tag_that_is_no_tag_is_foreign_data(d: &Deployment) {
    let mut conn = d.conn().await;
    let limiter = gcra(10, MINUTE);
    for value in [
        "hello:123",
        "g1x:5",
        ":17",
        "g6000000x10:",
        "g6000000x10:012",
    ] {
        let key = unique("rl:foreign");
        let mut owner = d.owner(&key).await;
        let _: () = support::raw(&mut owner, &["SET", &key, value]).await;
        match limiter.check(&mut conn, &key, 1).await {
            Err(Error::Redis(err)) => {
                assert!(
                    format!("{err}").contains("does not hold a GCRA state"),
                    "{value}: {err}"
                )
            }
            other => panic!("{value:?}: {other:?}"),
        }
        assert_eq!(
            d.get(&key).await.as_deref(),
            Some(value),
            "nothing was written"
        );
    }
}

async fn client(d: &Deployment) -> Client {
    let client = match d {
        Deployment::Single(server) => Client::connect(server.url()).await.unwrap(),
        Deployment::Cluster(cluster) => Client::connect_cluster(cluster.urls()).await.unwrap(),
    };
    client.config_poll(Duration::from_millis(50)).unwrap()
}

/// The handles' numbers change only by a declared change, so they adopt
/// what the numbers before wrote: a `Keep` change keeps every id's state
/// (GCRA keeps the full-again time) and the next admission retags it. A
/// raw limiter of the old numbers on that key is then refused.
async fn a_handle_adopts_the_state_across_a_declared_change(d: &Deployment) {
    let name = unique("plan");
    let operator = client(d).await;
    let api = client(d)
        .await
        .rate_limit(&name, Quota::per_minute(10).unwrap())
        .unwrap();
    for _ in 0..4 {
        let _ = api.check("acme").await.unwrap();
    }
    let key = api.key("acme").unwrap();
    assert!(d.get(&key).await.unwrap().starts_with("g6000000x10:"));
    operator
        .configs()
        .set(
            &name,
            Spec::rate_limit(Algorithm::Gcra, Quota::per_minute(20).unwrap()),
            Change::Keep,
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    while api.limiter().quota().burst() != 20 {
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the change arrives"
        );
        let _ = api.peek("acme").await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The peek and the check adopt the old state: no error, and what was
    // used is still used (24 s of schedule = 8 units of 3 s).
    let peeked = api.peek("acme").await.unwrap();
    assert!((11..=12).contains(&peeked.remaining), "{peeked:?}");
    let admitted = api.check("acme").await.unwrap();
    assert!(admitted.remaining >= 10, "{admitted:?}");
    assert!(
        d.get(&key).await.unwrap().starts_with("g3000000x20:"),
        "retagged"
    );
    // A raw limiter of the old numbers is now refused on that key.
    let mut conn = d.conn().await;
    assert!(matches!(
        gcra(10, MINUTE).check(&mut conn, &key, 1).await,
        Err(Error::StateMismatch { .. })
    ));
}

async fn a_tagged_state_survives_a_script_flush(d: &Deployment) {
    let mut conn: AnyConn = d.conn().await;
    let key = unique("rl:flush");
    let limiter = gcra(10, MINUTE);
    assert!(limiter.check(&mut conn, &key, 1).await.unwrap().allowed);
    d.flush_scripts_everywhere().await;
    let second = limiter.check(&mut conn, &key, 1).await.unwrap();
    assert_eq!(second.remaining, 8);
    d.flush_scripts_everywhere().await;
    assert_mismatch(
        gcra(11, MINUTE).check(&mut conn, &key, 1).await,
        &key,
        "g6000000x10",
        "g5454546x11",
    );
}

/// The checks convert their arguments by arithmetic (issue 37: tonumber
/// parses twice): a non-numeric argument raises Lua's own error. Still a
/// server error before any write, so still definite, whatever its wording.
async fn a_non_numeric_argument_is_a_definite_error_with_nothing_written(d: &Deployment) {
    let mut conn = d.conn().await;
    for (script, limiter) in [
        ("rate/gcra/check", Algorithm::Gcra),
        ("rate/token_bucket/check", Algorithm::TokenBucket),
        ("rate/sliding_window/check", Algorithm::SlidingWindow),
    ] {
        let key = unique("rl:args");
        // A state of its own, so that a write would show.
        let own = Limiter::new(limiter, Quota::per(10, MINUTE).unwrap()).unwrap();
        assert!(own.check(&mut conn, &key, 1).await.unwrap().allowed);
        let before = snapshot(d, &key).await;
        let source = Scripts::get(script).unwrap().source();
        for args in [
            ["x", "6000000", "10"],
            ["1", "six", "10"],
            ["1", "6000000", ""],
            ["1", "6000000", "nan"],
        ] {
            let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
                .arg(source)
                .arg(1)
                .arg(&key)
                .arg(&args[..])
                .query_async(&mut conn)
                .await;
            let err = reply.expect_err(&format!("{script} {args:?}"));
            // A reply from the server: nolock's Error::from_redis calls
            // every server error definite.
            assert!(
                matches!(err.kind(), redis::ErrorKind::Server(_)),
                "{script} {args:?}: {err:?}"
            );
        }
        assert_eq!(
            snapshot(d, &key).await,
            before,
            "{script}: nothing was written"
        );
    }
}
