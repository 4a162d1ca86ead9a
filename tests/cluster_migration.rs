//! A slot migration under load, on a cluster of its own (it changes the
//! topology): calls that meet `ASK`, `TRYAGAIN` or `MOVED` are resent by
//! nolock, so the callers see no error but `Indeterminate` for lost replies,
//! and every counter is exact.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nolock::{limits, semaphore, Scripts};
use support::cluster::RedisCluster;
use support::faults::{migrate_slot, node_id};
use support::history::{
    check_counter, check_fences, FenceOp, FenceReply, Increment, Outcome, Recorder,
};

const LONG: Duration = Duration::from_secs(600);
const LIMIT: u64 = 1_000_000;

type Counters = Recorder<Increment, limits::Admission>;

/// A primary other than `home`.
async fn another_primary(cluster: &RedisCluster, home: u16) -> u16 {
    cluster
        .shards()
        .await
        .into_iter()
        .map(|s| s.primary)
        .find(|&p| p != home)
        .expect("another primary")
}

/// 4 clients increment 4 counters of one slot (single-key scripts) and
/// take a fenced lock of the same slot (a two-key script), while the slot
/// is moved to another primary two keys at a time, then moved back. The
/// batches are 30 ms apart, so the slot stays half-moved for a while: a key
/// already moved draws `ASK` from the source, a lock whose two keys are
/// split draws `TRYAGAIN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moves_under_load_without_errors_and_counts_stay_exact() {
    let cluster = RedisCluster::start();
    let mut setup = cluster.conn().await;
    Scripts::load(&mut setup).await.expect("load scripts");
    let tag = "{migrating}";
    let slot = nolock::keys::slot(tag);
    let keys: Vec<String> = (0..4).map(|i| format!("{tag}:counter:{i}")).collect();
    // Some keys exist before the move, so MIGRATE has work to do; the lock
    // and its fence counter are created during it.
    for key in &keys {
        let first = limits::try_increment(&mut setup, key, LIMIT, LONG).await;
        assert!(first.expect("first increment").admitted);
    }
    let before = nolock::stats();

    let counters = Arc::new(Counters::new());
    let fences = Arc::new(Recorder::<FenceOp, FenceReply>::new());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (process, key) in keys.iter().enumerate() {
        let (counters, fences, stop, key) =
            (counters.clone(), fences.clone(), stop.clone(), key.clone());
        let mut conn = cluster.conn().await;
        let resource = format!("{tag}:lock");
        tasks.push(tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                counters
                    .record(
                        process,
                        Increment {
                            n: 1,
                            key: process as u32,
                        },
                        limits::try_increment(&mut conn, &key, LIMIT, LONG),
                    )
                    .await;
                round += 1;
                if round % 4 == process as u64 {
                    fences
                        .record(process, FenceOp::Acquire, async {
                            nolock::fence::Lock::new(Duration::from_millis(50))
                                .expect("a valid lock TTL")
                                .acquire(&mut conn, &resource)
                                .await
                                .map(|a| match a.acquired() {
                                    Some(g) => FenceReply::Granted(g.fence().number()),
                                    None => FenceReply::Held,
                                })
                        })
                        .await;
                }
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(200)).await;
    let home = cluster.shard_of(tag).await.primary;
    let away = another_primary(&cluster, home).await;
    let pause = Duration::from_millis(30);
    assert_eq!(migrate_slot(&cluster, slot, away, pause).await, home);
    assert_eq!(cluster.shard_of(tag).await.primary, away);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(migrate_slot(&cluster, slot, home, pause).await, away);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }

    let events = counters.events();
    let refused: Vec<_> = events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Definite(_)))
        .collect();
    assert!(
        refused.is_empty(),
        "definite errors reached callers: {refused:?}"
    );
    let fence_events = fences.events();
    let fence_refused: Vec<_> = fence_events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Definite(_)))
        .collect();
    assert!(
        fence_refused.is_empty(),
        "definite errors reached callers: {fence_refused:?}"
    );
    for (process, key) in keys.iter().enumerate() {
        let mine: Vec<_> = events
            .iter()
            .filter(|e| e.process == process)
            .cloned()
            .collect();
        let mut owner = cluster.node(cluster.shard_of(key).await.primary).await;
        let stored: String = redis::cmd("GET")
            .arg(key)
            .query_async(&mut owner)
            .await
            .expect("read the counter");
        // The count behind the counter's tag ("c<limit>x<window>:<count>").
        let stored: u64 = stored.rsplit(':').next().unwrap().parse().unwrap();
        // The first increment before the run counts as admitted.
        let verdict = check_counter(&mine, stored - 1, LIMIT);
        assert!(verdict.is_ok(), "{key}: {verdict:?}");
    }
    let verdict = check_fences(&fence_events, None);
    assert!(verdict.is_ok(), "{verdict:?}");
    let after = nolock::stats();
    let resent = (after.retries - before.retries) + (after.redirects - before.redirects);
    eprintln!(
        "{} calls, {} resent after ASK/TRYAGAIN/MOVED, {} indeterminate",
        events.len() + fence_events.len(),
        resent,
        events
            .iter()
            .filter(|e| e.outcome.is_indeterminate())
            .count()
    );
    assert!(resent > 0, "the migration never redirected a call");
}

/// Inside a script, a key that its node has not got, in a slot that is
/// migrating, is refused ("Script attempted to access a non local key"),
/// although the script was let in because its keys were all there. A
/// script that empties a key and touches it again meets exactly that:
/// Redis deletes an emptied sorted set. The semaphore's acquire clears
/// expired permits and its release removes the holder's; neither may then
/// touch a key it has just emptied, or the call fails after it has written.
/// The slot is left half-open (`MIGRATING` on its owner, `IMPORTING` on the
/// other primary) for the whole test, so every call meets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_that_empties_its_key_in_a_migrating_slot_still_answers() {
    let cluster = RedisCluster::start();
    let mut conn = cluster.conn().await;
    Scripts::load(&mut conn).await.expect("load scripts");
    let key = "{half-open}:semaphore";
    let slot = nolock::keys::slot(key);
    let home = cluster.shard_of(key).await.primary;
    let away = another_primary(&cluster, home).await;
    let mut owner = cluster.node(home).await;
    let mut target = cluster.node(away).await;
    let (home_id, away_id) = (node_id(&cluster, home).await, node_id(&cluster, away).await);
    let semaphore = semaphore::Semaphore::new(2, Duration::from_secs(30)).expect("a semaphore");
    // Every permit in the set has expired, but the set has no TTL (left by
    // a holder whose PEXPIREAT never came): the acquire clears them all.
    let stale = semaphore::PermitId::random().expect("an id");
    let _: () = redis::cmd("ZADD")
        .arg(key)
        .arg(1)
        .arg(format!("{}:1", stale.as_str()))
        .query_async(&mut owner)
        .await
        .expect("a stale permit");
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&home_id)
        .query_async(&mut target)
        .await
        .expect("SETSLOT IMPORTING");
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&away_id)
        .query_async(&mut owner)
        .await
        .expect("SETSLOT MIGRATING");

    let permit = semaphore
        .acquire(&mut conn, key)
        .await
        .expect("an acquire that clears every expired permit answers")
        .acquired()
        .expect("a free permit");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut owner)
        .await
        .expect("read the set");
    // The semaphore's tag (score 0, lib/tag) and the permit.
    assert_eq!(
        members,
        ["by:m2".to_owned(), format!("{}:1", permit.id().as_str())]
    );

    // The only holder leaves: its release empties the set.
    let released = permit
        .release(&mut conn)
        .await
        .expect("a release that empties the set answers");
    assert_eq!(released, semaphore::PermitRelease::Released);
    let left: u64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query_async(&mut owner)
        .await
        .expect("COUNTKEYSINSLOT");
    assert_eq!(left, 0, "the emptied set is gone");
}
