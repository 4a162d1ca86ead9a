#![allow(deprecated)] // limits::release stays tested while it is deprecated
//! The behaviour suite of `limits`, the engine and `Batch`, run twice: once
//! against a single `redis-server` and once against a local Redis Cluster of
//! 3 primaries with 1 replica each.
//!
//! Each body takes a [`Deployment`]; the `both!` macro makes a `single::` and
//! a `cluster::` test of it. The cluster is shared by the tests of this file
//! (it takes a few seconds to start), so the bodies isolate themselves by key
//! prefix, and assert server-wide counts exactly only when the deployment is
//! theirs alone. Tests that empty or inspect script caches, or count
//! commands, run alone on the cluster ([`CLUSTER_ACCESS`]); `both!` and
//! [`CLUSTER_ACCESS`] live in `support::deployment`, shared with
//! `tests/cluster_modules.rs`.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use nolock::limits::{self, PeekCounter, TryIncrement};
use nolock::{Batch, Error, Scripts};
use redis::aio::MultiplexedConnection;
use support::deployment::{both, run_batch_through_a_flush, Deployment, CLUSTER_ACCESS};
use support::{command_calls, keys, prefix, raw};

const MINUTE: Duration = Duration::from_secs(60);
/// `reset_after` is PTTL + 1 ms: the first moment the counter is gone.
const MS: Duration = Duration::from_millis(1);

both!(
    shared: [
        admits_up_to_the_limit_then_denies_without_consuming,
        increment_by_release_and_peek_keep_their_contracts,
        a_key_of_another_type_is_a_definite_error,
        the_window_expires_and_counting_starts_again,
        concurrent_callers_admit_exactly_the_limit,
        keys_are_routed_to_the_node_that_owns_them,
        a_batch_gives_the_same_results_as_single_calls,
        batch_entries_fail_alone,
        release_and_peek_batch,
    ],
    exclusive: [
        bad_input_is_rejected_before_anything_is_sent,
        scripts_load_on_every_node_and_the_fallback_recovers_a_flush,
        a_flush_between_two_batches_is_recovered_and_nothing_runs_twice,
    ],
);

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    raw(conn, &["GET", key]).await
}

async fn admits_up_to_the_limit_then_denies_without_consuming(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}c", prefix("limit"));
    for expected in 1..=3 {
        let a = limits::try_increment(&mut conn, &key, 3, MINUTE)
            .await
            .unwrap();
        assert!(a.admitted);
        assert_eq!((a.count, a.remaining), (expected, 3 - expected));
        assert!(a.reset_after.unwrap() <= MINUTE + MS);
    }
    for _ in 0..10 {
        let a = limits::try_increment(&mut conn, &key, 3, MINUTE)
            .await
            .unwrap();
        assert!(!a.admitted);
        assert_eq!((a.count, a.remaining), (3, 0));
    }
    let mut owner = d.owner(&key).await;
    // The count behind its tag (lua/lib/tag.lua): limit 3, a minute.
    assert_eq!(get(&mut owner, &key).await.as_deref(), Some("c3x60000:3"));
    let ttl: i64 = raw(&mut owner, &["PTTL", &key]).await;
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
}

async fn increment_by_release_and_peek_keep_their_contracts(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("by_release_peek");
    let key = format!("{p}c");

    let empty = limits::peek(&mut conn, &key).await.unwrap();
    assert_eq!((empty.count, empty.reset_after), (0, None));

    let a = nolock::limits::Counter::new(10, MINUTE)
        .unwrap()
        .try_increment_by(&mut conn, &key, 7)
        .await
        .unwrap();
    assert_eq!((a.admitted, a.count), (true, 7));
    let b = nolock::limits::Counter::new(10, MINUTE)
        .unwrap()
        .try_increment_by(&mut conn, &key, 4)
        .await
        .unwrap();
    assert_eq!((b.admitted, b.count), (false, 7), "all or nothing");
    let usage = limits::peek(&mut conn, &key).await.unwrap();
    assert_eq!(usage.count, 7);
    assert!(usage.reset_after.unwrap() <= MINUTE + MS, "one window");

    let missing = format!("{p}missing");
    let usage = limits::peek(&mut conn, &missing).await.unwrap();
    assert_eq!((usage.count, usage.reset_after), (0, None));
    let mut owner = d.owner(&missing).await;
    assert_eq!(get(&mut owner, &missing).await, None, "nothing created");
}

async fn bad_input_is_rejected_before_anything_is_sent(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("bad_input");
    let key = format!("{p}c");
    // Alone on the deployment: command counts are this test's.
    let evalsha_before = d.calls_on_primaries("evalsha").await;
    let eval_before = d.calls_on_primaries("eval").await;

    let errors = [
        limits::try_increment(&mut conn, "", 1, MINUTE)
            .await
            .unwrap_err(),
        limits::try_increment(&mut conn, &key, 0, MINUTE)
            .await
            .unwrap_err(),
        limits::try_increment(&mut conn, &key, 1, Duration::ZERO)
            .await
            .unwrap_err(),
        nolock::limits::Counter::new(5, MINUTE)
            .unwrap()
            .try_increment_by(&mut conn, &key, 6)
            .await
            .unwrap_err(),
        limits::peek(&mut conn, "").await.unwrap_err(),
    ];
    for err in &errors {
        assert!(err.is_invalid_input() && err.is_definite(), "{err}");
    }
    // Batches refuse bad input when each operation is built.
    assert!(matches!(
        nolock::limits::Counter::new(0, MINUTE),
        Err(Error::ZeroLimit { what: "limit" })
    ));

    for mut node in d.nodes().await {
        assert!(keys(&mut node, &format!("{p}*")).await.is_empty());
    }
    assert_eq!(d.calls_on_primaries("evalsha").await, evalsha_before);
    assert_eq!(d.calls_on_primaries("eval").await, eval_before);
}

async fn a_key_of_another_type_is_a_definite_error(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}text", prefix("wrongtype"));
    let mut owner = d.owner(&key).await;
    let _: () = raw(&mut owner, &["SET", &key, "hello"]).await;

    let err = limits::try_increment(&mut conn, &key, 5, MINUTE)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");
    assert!(matches!(
        limits::peek(&mut conn, &key).await,
        Err(Error::Redis(_))
    ));
    assert_eq!(get(&mut owner, &key).await.as_deref(), Some("hello"));
    let ttl: i64 = raw(&mut owner, &["PTTL", &key]).await;
    assert_eq!(ttl, -1, "no expiry added");
}

async fn the_window_expires_and_counting_starts_again(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}c", prefix("window"));
    let window = Duration::from_millis(300);
    assert!(
        limits::try_increment(&mut conn, &key, 1, window)
            .await
            .unwrap()
            .admitted
    );
    let denied = limits::try_increment(&mut conn, &key, 1, window)
        .await
        .unwrap();
    assert!(!denied.admitted);
    tokio::time::sleep(denied.reset_after.unwrap()).await;
    let again = limits::try_increment(&mut conn, &key, 1, window)
        .await
        .unwrap();
    assert_eq!((again.admitted, again.count), (true, 1), "a new window");
}

async fn concurrent_callers_admit_exactly_the_limit(d: &Deployment) {
    // A hash tag puts the counter in one slot; the clients share nothing else.
    let key = format!("{{{}}}:c", prefix("concurrent"));
    let results = d
        .race(200, |mut conn| {
            let key = key.clone();
            async move {
                limits::try_increment(&mut conn, &key, 100, MINUTE)
                    .await
                    .unwrap()
            }
        })
        .await;
    let mut admitted = std::collections::BTreeSet::new();
    for a in results {
        if a.admitted {
            assert!(admitted.insert(a.count), "count {} seen twice", a.count);
        } else {
            assert_eq!(a.count, 100);
        }
    }
    assert_eq!(admitted, (1..=100).collect());
    let mut owner = d.owner(&key).await;
    assert_eq!(
        get(&mut owner, &key).await.as_deref(),
        Some("c100x60000:100")
    );
}

async fn keys_are_routed_to_the_node_that_owns_them(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("routing");
    let mut per_owner: BTreeMap<u16, usize> = BTreeMap::new();
    for i in 0..60 {
        let key = format!("{p}{i}");
        let a = nolock::limits::Counter::new(10, MINUTE)
            .unwrap()
            .try_increment_by(&mut conn, &key, 1 + i % 5)
            .await
            .unwrap();
        assert!(a.admitted);
        let mut owner = d.owner(&key).await;
        let stored = get(&mut owner, &key).await;
        assert_eq!(
            stored,
            Some(format!("c10x60000:{}", 1 + i % 5)),
            "{key} on its owner"
        );
        *per_owner.entry(d.owner_port(&key).await).or_default() += 1;
    }
    let expected_owners = if d.is_cluster() { 3 } else { 1 };
    assert_eq!(per_owner.len(), expected_owners, "{per_owner:?}");
}

async fn scripts_load_on_every_node_and_the_fallback_recovers_a_flush(d: &Deployment) {
    let mut conn = d.conn().await;

    d.flush_scripts_everywhere().await;
    let loaded = Scripts::load(&mut conn).await.unwrap();
    assert_eq!(loaded.scripts.len(), Scripts::all().len());
    let nodes = d.nodes().await;
    assert_eq!(nodes.len(), if d.is_cluster() { 6 } else { 1 });
    for mut node in nodes {
        for script in Scripts::all() {
            let exists: Vec<bool> = raw(&mut node, &["SCRIPT", "EXISTS", script.sha1()]).await;
            assert_eq!(exists, [true], "{} on every node", script.name());
        }
    }

    // Emptied everywhere: every call still runs exactly once, after a
    // SCRIPT LOAD pipelined before it to the node that owns its key.
    d.flush_scripts_everywhere().await;
    let p = prefix("fallback");
    let eval_before = d.calls_on_primaries("eval").await;
    let loads_before = d.calls_on_primaries("script|load").await;
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("{p}{i}");
        owners.insert(d.owner_port(&key).await);
        let a = limits::try_increment(&mut conn, &key, 5, MINUTE)
            .await
            .unwrap();
        assert_eq!((a.admitted, a.count), (true, 1), "ran exactly once");
        let usage = limits::peek(&mut conn, &key).await.unwrap();
        assert_eq!(usage.count, 1);
    }
    // This test runs alone: no EVAL, and one SCRIPT LOAD of each of the two
    // scripts per primary that owns one of the keys, so the pipeline went
    // to the key's node (on another node the EVALSHA would get MOVED, and
    // the owner would be missing the script for the next key).
    let evals = d.calls_on_primaries("eval").await - eval_before;
    assert_eq!(evals, 0);
    let loads = d.calls_on_primaries("script|load").await - loads_before;
    assert_eq!(loads, 2 * owners.len() as u64);
}

/// 1,000 operations in one batch and the same 1,000 as single calls, on two
/// key sets of the same shape, give the same results in the same order. Keys
/// repeat within the batch (4 uses of 250 keys, limit 3), so order matters.
async fn a_batch_gives_the_same_results_as_single_calls(d: &Deployment) {
    let mut conn = d.conn().await;
    let (batched, single) = (prefix("batched"), prefix("single"));
    let ops = |p: &str| -> Vec<TryIncrement> {
        (0..1000)
            .map(|i| {
                TryIncrement::by(
                    &nolock::limits::Counter::new(3, MINUTE).unwrap(),
                    &format!("{p}{}", i % 250),
                    1 + (i % 2) as u64,
                )
                .unwrap()
            })
            .collect()
    };
    let batch: Batch<TryIncrement> = ops(&batched).into_iter().collect();
    let batch_results = batch.run(&mut conn).await;

    let mut single_results = Vec::new();
    for i in 0..1000u64 {
        let key = format!("{single}{}", i % 250);
        single_results.push(
            nolock::limits::Counter::new(3, MINUTE)
                .unwrap()
                .try_increment_by(&mut conn, &key, 1 + i % 2)
                .await
                .unwrap(),
        );
    }
    assert_eq!(batch_results.len(), 1000);
    let mut admitted = 0;
    for (i, (b, s)) in batch_results.into_iter().zip(&single_results).enumerate() {
        let b = b.unwrap_or_else(|e| panic!("entry {i}: {e}"));
        assert_eq!(
            (b.admitted, b.count, b.limit, b.remaining),
            (s.admitted, s.count, s.limit, s.remaining),
            "entry {i}"
        );
        assert!(b.reset_after.unwrap() <= MINUTE + MS);
        admitted += u64::from(b.admitted);
    }
    assert!(
        admitted > 250 && admitted < 1000,
        "{admitted}: a mix of both"
    );
    for i in [0, 1, 123, 249] {
        let key = format!("{batched}{i}");
        let mut owner = d.owner(&key).await;
        let expected = single_results[i].count.max(single_results[i + 750].count);
        assert_eq!(
            get(&mut owner, &key).await,
            Some(format!("c3x60000:{expected}")),
            "{key}"
        );
    }
}

async fn a_flush_between_two_batches_is_recovered_and_nothing_runs_twice(d: &Deployment) {
    let p = prefix("flush_batches");
    let keys: Vec<String> = (0..500).map(|i| format!("{p}{i}")).collect();
    let batch: Batch<TryIncrement> = keys
        .iter()
        .map(|k| {
            TryIncrement::by(&nolock::limits::Counter::new(1000, MINUTE).unwrap(), k, 3).unwrap()
        })
        .collect();
    run_batch_through_a_flush(d, &batch, |run, a| {
        a.admitted && a.count == 3 * (run as u64 + 1)
    })
    .await;
    // Stored counts: each key ran exactly three times in total.
    for key in keys.iter().step_by(50) {
        let mut owner = d.owner(key).await;
        assert_eq!(
            get(&mut owner, key).await.as_deref(),
            Some("c1000x60000:9"),
            "{key}"
        );
    }
}

async fn batch_entries_fail_alone(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("entries");
    let text = format!("{p}text");
    let mut owner = d.owner(&text).await;
    let _: () = raw(&mut owner, &["SET", &text, "hello"]).await;

    let mut batch = Batch::new();
    batch
        .push(
            TryIncrement::new(
                &nolock::limits::Counter::new(1, MINUTE).unwrap(),
                &format!("{p}a"),
            )
            .unwrap(),
        )
        .push(TryIncrement::new(&nolock::limits::Counter::new(1, MINUTE).unwrap(), &text).unwrap())
        .push(
            TryIncrement::new(
                &nolock::limits::Counter::new(1, MINUTE).unwrap(),
                &format!("{p}a"),
            )
            .unwrap(),
        )
        .push(
            TryIncrement::new(
                &nolock::limits::Counter::new(1, MINUTE).unwrap(),
                &format!("{p}b"),
            )
            .unwrap(),
        );
    let results = batch.run(&mut conn).await;
    assert_eq!(results.len(), 4);
    assert!(matches!(&results[0], Ok(a) if a.admitted && a.count == 1));
    assert!(matches!(&results[1], Err(e @ Error::Redis(_)) if e.is_definite()));
    assert!(matches!(&results[2], Ok(a) if !a.admitted && a.count == 1));
    assert!(matches!(&results[3], Ok(a) if a.admitted));
    assert_eq!(get(&mut owner, &text).await.as_deref(), Some("hello"));

    let empty: Batch<TryIncrement> = Batch::new();
    assert!(empty.run(&mut conn).await.is_empty());
}

async fn release_and_peek_batch(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("release_peek_batch");
    let keys: Vec<String> = (0..30).map(|i| format!("{p}{i}")).collect();
    let up: Batch<TryIncrement> = keys
        .iter()
        .map(|k| {
            TryIncrement::by(&nolock::limits::Counter::new(10, MINUTE).unwrap(), k, 5).unwrap()
        })
        .collect();
    assert!(up.run(&mut conn).await.iter().all(|r| r.is_ok()));

    let peek: Batch<PeekCounter> = keys.iter().map(|k| PeekCounter::new(k).unwrap()).collect();
    for result in peek.run(&mut conn).await {
        let usage = result.unwrap();
        assert_eq!(usage.count, 5);
        assert!(usage.reset_after.unwrap() <= MINUTE + MS);
    }
}

/// `EVALSHA_RO` (peek) served by replicas, when the cluster client routes
/// reads there; the writes still go to the primaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_read_only_scripts_run_on_replicas() {
    // Alone on the cluster, so that no other test's reads reach the primary.
    let _cache = CLUSTER_ACCESS.write().await;
    let cluster = support::cluster::RedisCluster::shared();
    let client = redis::cluster::ClusterClient::builder(cluster.urls())
        .retries(0)
        .read_routing_strategy(redis::cluster_read_routing::RandomReplicaStrategy)
        .build()
        .unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let p = format!("{{{}}}", prefix("replica_reads"));
    let key = format!("{p}:c");
    let shard = cluster.shard_of(&key).await;
    let mut replica = cluster.node(shard.replicas[0]).await;
    let mut primary = cluster.node(shard.primary).await;

    let ro = |c: &mut MultiplexedConnection| {
        let mut c = c.clone();
        async move { command_calls(&mut c, "evalsha_ro").await + command_calls(&mut c, "eval_ro").await }
    };
    let (replica_before, primary_before) = (ro(&mut replica).await, ro(&mut primary).await);

    let a = nolock::limits::Counter::new(10, MINUTE)
        .unwrap()
        .try_increment_by(&mut conn, &key, 4)
        .await
        .unwrap();
    assert!(a.admitted, "the write went to the primary");
    // Replication is asynchronous: read until the replica has the write.
    let mut usage = limits::peek(&mut conn, &key).await.unwrap();
    for _ in 0..100 {
        if usage.count == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        usage = limits::peek(&mut conn, &key).await.unwrap();
    }
    assert_eq!(usage.count, 4);
    for _ in 0..10 {
        assert_eq!(limits::peek(&mut conn, &key).await.unwrap().count, 4);
    }
    let replica_reads = ro(&mut replica).await - replica_before;
    assert!(
        replica_reads >= 11,
        "peeks ran on the replica: {replica_reads}"
    );
    // Not one read went to the primary.
    assert_eq!(ro(&mut primary).await, primary_before);
    let role: Vec<redis::Value> = raw(&mut replica, &["ROLE"]).await;
    assert_eq!(role[0], redis::Value::BulkString(b"slave".to_vec()));
}
