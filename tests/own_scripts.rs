//! Your own scripts through nolock's engine ([`ScriptDir`], [`Call`]),
//! against a single `redis-server` and the local 3×2 cluster: the scripts
//! of `tests/fixtures/lua/` called alone and in batches, through a script
//! cache flush, on a replica, across slots, with the wrong reply type, with
//! nolock's helpers and one of their own; and the round trips of a miss
//! against redis-rs's `Script`, counted by the server.

mod support;

use std::time::Duration;

use nolock::limits::{Admission, TryIncrement};
use nolock::script::{Call, ScriptDir};
use nolock::{Batch, Error, Operation, Scripts};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use support::deployment::{both, run_batch_through_a_flush, Deployment, CLUSTER_ACCESS};
use support::{command_calls, prefix, raw};

static FIXTURES: ScriptDir = nolock::scripts!("$CARGO_MANIFEST_DIR/tests/fixtures/lua");

both!(
    shared: [
        a_user_script_uses_nolock_helpers_and_its_own,
        a_reply_of_the_wrong_type_is_a_typed_error_and_the_script_ran,
        a_cross_slot_call_is_refused_before_anything_is_sent,
        user_and_nolock_operations_share_one_batch,
    ],
    exclusive: [
        a_single_call_through_a_flush_costs_one_fallback,
        a_batch_through_a_flush_reloads_once_per_node,
        load_with_caches_user_scripts_on_every_node,
        a_miss_costs_two_round_trips_against_three_for_redis_rs_script,
    ],
);

fn add(key: &str, n: i64) -> Call<i64> {
    FIXTURES.call("counter/add", &[key]).unwrap().arg(n)
}

/// Flush every node, then call `counter/add` twice: the first call costs
/// exactly one fallback command on the key's owner (a `SCRIPT LOAD`
/// pipelined with the resent `EVALSHA`; `EVAL` only where `SCRIPT LOAD` is
/// refused) and is counted in `stats()`; the second is back on a single `EVALSHA`. Each
/// call runs once.
async fn a_single_call_through_a_flush_costs_one_fallback(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}c", prefix("single_flush"));
    let mut owner = d.owner(&key).await;
    d.flush_scripts_everywhere().await;

    let fallback_commands = |owner: &mut MultiplexedConnection| {
        let mut owner = owner.clone();
        async move {
            command_calls(&mut owner, "eval").await + command_calls(&mut owner, "script|load").await
        }
    };
    let fallbacks = nolock::stats().noscript_fallbacks;
    let before = fallback_commands(&mut owner).await;
    assert_eq!(add(&key, 5).run(&mut conn).await.unwrap(), 5);
    let after_miss = fallback_commands(&mut owner).await;
    assert_eq!(
        after_miss - before,
        1,
        "one SCRIPT LOAD (or EVAL) for the miss"
    );
    // Process-wide: other tests of this binary may add their own.
    assert!(nolock::stats().noscript_fallbacks > fallbacks);

    let evalshas = command_calls(&mut owner, "evalsha").await;
    assert_eq!(add(&key, 2).run(&mut conn).await.unwrap(), 7);
    assert_eq!(
        fallback_commands(&mut owner).await,
        after_miss,
        "no new fallback"
    );
    assert_eq!(command_calls(&mut owner, "evalsha").await - evalshas, 1);
    assert_eq!(
        d.get(&key).await.as_deref(),
        Some("7"),
        "each call ran once"
    );
}

/// A batch of 300 user calls over keys of every node, run three times with
/// a flush before the second: on the flushed run one `SCRIPT LOAD` per
/// script and primary and no `EVAL`, none on the others, every entry run
/// exactly once per run.
async fn a_batch_through_a_flush_reloads_once_per_node(d: &Deployment) {
    let mut conn = d.conn().await;
    Scripts::load_with(&mut conn, &[&FIXTURES]).await.unwrap();
    let p = prefix("batch_flush");
    let batch: Batch<Call<i64>> = (0..300).map(|i| add(&format!("{p}{i}"), 1)).collect();
    run_batch_through_a_flush(d, &batch, |run, value| *value == run as i64 + 1).await;
}

/// `Scripts::load_with` caches nolock's scripts and the fixtures on every
/// node, primaries and replicas; calls then need no fallback.
async fn load_with_caches_user_scripts_on_every_node(d: &Deployment) {
    let mut conn = d.conn().await;
    d.flush_scripts_everywhere().await;
    let loaded = Scripts::load_with(&mut conn, &[&FIXTURES]).await.unwrap();
    let user = FIXTURES.scripts().unwrap();
    assert_eq!(loaded.scripts.len(), Scripts::all().len() + user.len());
    assert!(loaded.scripts.contains(&"counter/checked_add"));
    for mut node in d.nodes().await {
        for script in Scripts::all().iter().chain(user) {
            let exists: Vec<bool> = raw(&mut node, &["SCRIPT", "EXISTS", script.sha1()]).await;
            assert_eq!(exists, [true], "{} on every node", script.name());
        }
    }
    let p = prefix("loaded");
    let evals = d.calls_on_primaries("eval").await;
    let loads = d.calls_on_primaries("script|load").await;
    for i in 0..12 {
        assert_eq!(add(&format!("{p}{i}"), 3).run(&mut conn).await.unwrap(), 3);
    }
    assert_eq!(d.calls_on_primaries("eval").await, evals, "no fallback");
    assert_eq!(d.calls_on_primaries("script|load").await, loads);
}

/// `counter/checked_add` includes `lib/args` and `lib/fail` (nolock's) and
/// `lib/pair` (the fixture directory's own).
async fn a_user_script_uses_nolock_helpers_and_its_own(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}c", prefix("prelude"));
    let call = |n: i64| {
        FIXTURES
            .call::<(i64, String)>("counter/checked_add", &[&key])
            .unwrap()
            .arg(n)
    };
    assert_eq!(call(5).run(&mut conn).await.unwrap(), (5, "5".to_owned()));
    assert_eq!(
        call(1000).run(&mut conn).await.unwrap(),
        (1005, "1005".into())
    );
    for bad in [0, 1001] {
        match call(bad).run(&mut conn).await {
            Err(err @ Error::Redis(_)) => {
                assert!(err.is_definite());
                let text = err.to_string();
                assert!(
                    text.contains("nolock counter/checked_add: amount must be 1..1000"),
                    "{text}"
                );
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert_eq!(
        d.get(&key).await.as_deref(),
        Some("1005"),
        "nothing written"
    );
}

/// A reply that does not fit the type asked for is `Error::ReplyType`,
/// naming the script and the type; it is not definite: the script ran.
async fn a_reply_of_the_wrong_type_is_a_typed_error_and_the_script_ran(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}c", prefix("reply_type"));
    let call: Call<(i64, String)> = FIXTURES.call("counter/add", &[&key]).unwrap().arg(4);
    match call.run(&mut conn).await {
        Err(err @ Error::ReplyType { .. }) => {
            assert!(!err.is_definite());
            let text = err.to_string();
            assert!(
                text.contains("counter/add") && text.contains("(i64, alloc::string::String)"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(d.get(&key).await.as_deref(), Some("4"), "the script ran");

    // In a batch: the same error, for that entry alone.
    let mut batch: Batch<Box<dyn Operation<Output = Value>>> = Batch::new();
    batch.push(Box::new(call.map(|_| Value::Nil)));
    batch.push(Box::new(add(&key, 1).map(Value::Int)));
    let results = batch.run(&mut conn).await;
    assert!(matches!(results[0], Err(Error::ReplyType { .. })));
    assert_eq!(results[1].as_ref().unwrap(), &Value::Int(9));
}

/// A connection that fails the test if anything is sent.
struct MustNotSend;

impl ConnectionLike for MustNotSend {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        panic!("sent {:?}", cmd.args_iter().count())
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a Pipeline,
        _: usize,
        _: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        panic!("sent a pipeline")
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl nolock::BatchConnection for MustNotSend {}

/// Keys of two slots: `Error::CrossSlot` before any I/O, alone and in a
/// batch (where the other entries still run).
async fn a_cross_slot_call_is_refused_before_anything_is_sent(d: &Deployment) {
    let p = prefix("cross_slot");
    let (a, b) = (format!("{{{p}a}}:x"), format!("{{{p}b}}:y"));
    let call: Call<i64> = FIXTURES.call("counter/add", &[&a, &b]).unwrap().arg(1);
    match call.run(&mut MustNotSend).await {
        Err(err @ Error::CrossSlot { .. }) => assert!(err.is_invalid_input()),
        other => panic!("{other:?}"),
    }
    let batch: Batch<Call<i64>> = [call.clone(), call.clone()].into_iter().collect();
    for result in batch.run(&mut MustNotSend).await {
        assert!(matches!(result, Err(Error::CrossSlot { .. })));
    }

    let mut conn = d.conn().await;
    let batch: Batch<Call<i64>> = [call, add(&a, 2)].into_iter().collect();
    let results = batch.run(&mut conn).await;
    assert!(matches!(results[0], Err(Error::CrossSlot { .. })));
    assert_eq!(*results[1].as_ref().unwrap(), 2);
    assert!(
        !d.exists(&b).await,
        "nothing was written for the refused call"
    );
}

#[derive(Debug)]
enum Out {
    Quota(Admission),
    Counter(i64),
}

/// nolock's `TryIncrement` and a user call in one `Batch`, in order.
async fn user_and_nolock_operations_share_one_batch(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("mixed");
    let mut batch: Batch<Box<dyn Operation<Output = Out>>> = Batch::new();
    for i in 0..20 {
        let quota = TryIncrement::new(
            &nolock::limits::Counter::new(10, Duration::from_secs(60)).unwrap(),
            &format!("{p}q{i}"),
        )
        .unwrap();
        batch.push(Box::new(quota.map(Out::Quota)));
        batch.push(Box::new(add(&format!("{p}c{i}"), i).map(Out::Counter)));
    }
    let results = batch.run(&mut conn).await;
    assert_eq!(results.len(), 40);
    for (i, pair) in results.chunks(2).enumerate() {
        match (&pair[0], &pair[1]) {
            (Ok(Out::Quota(a)), Ok(Out::Counter(n))) => {
                assert!(a.admitted && a.count == 1, "{a:?}");
                assert_eq!(*n, i as i64);
            }
            other => panic!("{i}: {other:?}"),
        }
    }
}

/// A `#!lua flags=no-writes` user script is run with `EVALSHA_RO`, which a
/// cluster client reading from replicas sends to a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_read_only_user_script_is_served_by_a_replica() {
    let _alone = CLUSTER_ACCESS.write().await;
    let cluster = support::cluster::RedisCluster::shared();
    let client = redis::cluster::ClusterClient::builder(cluster.urls())
        .retries(0)
        .read_routing_strategy(redis::cluster_read_routing::RandomReplicaStrategy)
        .build()
        .unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    Scripts::load_with(&mut conn, &[&FIXTURES]).await.unwrap();
    let key = format!("{{{}}}:c", prefix("replica_read"));
    let shard = cluster.shard_of(&key).await;
    let mut replica = cluster.node(shard.replicas[0]).await;
    let mut primary = cluster.node(shard.primary).await;
    let ro = |c: &mut MultiplexedConnection| {
        let mut c = c.clone();
        async move { command_calls(&mut c, "evalsha_ro").await + command_calls(&mut c, "eval_ro").await }
    };
    let (replica_before, primary_before) = (ro(&mut replica).await, ro(&mut primary).await);

    assert_eq!(
        add(&key, 6).run(&mut conn).await.unwrap(),
        6,
        "write on the primary"
    );
    let read = || FIXTURES.call::<i64>("counter/read", &[&key]).unwrap();
    // Replication is asynchronous: read until the replica has the write.
    let mut value = read().run(&mut conn).await.unwrap();
    for _ in 0..100 {
        if value == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        value = read().run(&mut conn).await.unwrap();
    }
    assert_eq!(value, 6);
    let batch: Batch<Call<i64>> = (0..5).map(|_| read()).collect();
    for result in batch.run(&mut conn).await {
        assert_eq!(result.unwrap(), 6);
    }
    // Single reads went to the replica; a batch goes to the primaries
    // (`Batch` routes each part by its primary), still as `EVALSHA_RO`.
    let replica_reads = ro(&mut replica).await - replica_before;
    assert!(
        replica_reads >= 1,
        "reads ran on the replica: {replica_reads}"
    );
    assert_eq!(ro(&mut primary).await - primary_before, 5, "the batch");
    let role: Vec<Value> = raw(&mut replica, &["ROLE"]).await;
    assert_eq!(role[0], Value::BulkString(b"slave".to_vec()));
}

/// `[EVALSHA, EVAL, SCRIPT LOAD]` calls summed over every node.
async fn script_commands(d: &Deployment) -> [u64; 3] {
    let mut n = [0; 3];
    for mut node in d.nodes().await {
        for (count, cmd) in n.iter_mut().zip(["evalsha", "eval", "script|load"]) {
            *count += command_calls(&mut node, cmd).await;
        }
    }
    n
}

fn since(before: [u64; 3], after: [u64; 3]) -> [u64; 3] {
    [0, 1, 2].map(|i| after[i] - before[i])
}

/// A connection that counts its round trips: one per command or pipeline
/// handed to the connection underneath.
struct Counted<C> {
    inner: C,
    round_trips: usize,
}

impl<C: ConnectionLike + Send> ConnectionLike for Counted<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips += 1;
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips += 1;
        self.inner.req_packed_commands(pipe, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// The cost of a script cache miss: round trips counted by the client
/// connection, commands by the servers (`INFO commandstats`, every node).
/// nolock: `EVALSHA`, then one fallback round trip (a pipelined
/// `SCRIPT LOAD` + `EVALSHA`). redis-rs's
/// `Script::invoke_async`: `EVALSHA`, `SCRIPT LOAD` (to every node of a
/// cluster), `EVALSHA` again: 3 round trips. In a pipeline, redis-rs's
/// `invoke_script` fails with `NOSCRIPT` after a flush; a nolock `Batch`
/// recovers each entry. Printed for the README (`--nocapture`).
async fn a_miss_costs_two_round_trips_against_three_for_redis_rs_script(d: &Deployment) {
    let p = prefix("versus");
    let theirs = redis::Script::new(FIXTURES.get("counter/add").unwrap().source());
    let deployment = if d.is_cluster() { "cluster" } else { "single" };

    d.flush_scripts_everywhere().await;
    let before = script_commands(d).await;
    let mut conn = Counted {
        inner: d.conn().await,
        round_trips: 0,
    };
    assert_eq!(add(&format!("{p}a"), 1).run(&mut conn).await.unwrap(), 1);
    let (ours, our_trips) = (since(before, script_commands(d).await), conn.round_trips);

    d.flush_scripts_everywhere().await;
    let before = script_commands(d).await;
    conn.round_trips = 0;
    let value: i64 = theirs
        .key(format!("{p}b"))
        .arg(1)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, 1);
    let (redis_rs, their_trips) = (since(before, script_commands(d).await), conn.round_trips);

    println!(
        "{deployment}: a miss on one call [EVALSHA, EVAL, SCRIPT LOAD]: \
         nolock {ours:?} in {our_trips} round trips, \
         redis-rs Script {redis_rs:?} in {their_trips} round trips"
    );
    assert_eq!(our_trips, 2, "nolock: 2 round trips");
    assert_eq!(
        ours[1] + ours[2],
        1,
        "nolock: one fallback command, on one node"
    );
    assert_eq!(their_trips, 3, "redis-rs: 3 round trips");
    let loads = if d.is_cluster() { 6 } else { 1 };
    assert_eq!(
        redis_rs,
        [2, 0, loads],
        "redis-rs: SCRIPT LOAD on every node"
    );

    // Pipelines: 10 calls after a flush.
    let mut conn = conn.inner;
    d.flush_scripts_everywhere().await;
    let mut pipe = redis::pipe();
    for i in 0..10 {
        pipe.invoke_script(theirs.key(format!("{p}pipe{i}")).arg(1));
    }
    let failed: redis::RedisResult<Vec<i64>> = pipe.query_async(&mut conn).await;
    assert!(
        failed.is_err(),
        "redis-rs pipelines do not recover NOSCRIPT"
    );
    d.flush_scripts_everywhere().await;
    let before = script_commands(d).await;
    let batch: Batch<Call<i64>> = (0..10).map(|i| add(&format!("{p}pipe{i}"), 1)).collect();
    for result in batch.run(&mut conn).await {
        assert_eq!(result.unwrap(), 1, "each entry ran once");
    }
    let batched = since(before, script_commands(d).await);
    println!(
        "{deployment}: a miss in a batch of 10 [EVALSHA, EVAL, SCRIPT LOAD]: nolock {batched:?}; \
         redis-rs pipeline: {}",
        failed
            .map(|_| "ok".to_owned())
            .unwrap_or_else(|e| format!("{:?}", e.kind()))
    );
    assert!(batched[0] >= 10, "every entry sent");
    // At most one per entry; one SCRIPT LOAD per node where loading is allowed.
    assert!((1..=10).contains(&(batched[1] + batched[2])), "{batched:?}");
}
