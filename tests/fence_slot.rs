//! Fences in bounded memory (`FenceSource::PerSlot`) on a single server and
//! on the local 3x2 cluster: a history checker over many resources in one
//! slot and across slots (fences per resource strictly increase in real
//! time, never repeat after a lock expired, a stale holder's write is
//! refused), the switch from per-resource counters, a script flush, bad
//! input and foreign data in a slot's counter.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{self, slot_counter, Fence, FenceSource, Lock, LockAttempt, Write};
use nolock::keys::{derive, slot};
use nolock::Error;
use support::deployment::{both, AnyConn, Deployment};
use support::prefix;

both!(
    shared: [
        a_history_of_many_resources_keeps_every_resources_fences_increasing,
        a_stale_holders_write_is_refused_after_a_newer_grant_wrote,
        a_resource_locked_again_after_its_lock_expired_gets_a_greater_fence,
        a_resource_with_a_per_resource_counter_continues_above_it,
        bad_input_is_refused_before_anything_is_sent,
        a_batch_and_a_waiter_take_slot_fences,
    ],
    exclusive: [
        slot_fences_survive_a_script_flush,
        foreign_data_in_the_slot_counter_is_refused_before_any_write,
    ],
);

const MINUTE: Duration = Duration::from_secs(60);

fn slot_lock(ttl: Duration) -> Lock {
    Lock::new(ttl)
        .unwrap()
        .with_fence_source(FenceSource::PerSlot)
}

fn counter_of(resource: &str) -> &'static str {
    slot_counter(slot(&derive(resource, "lock")))
}

fn grant(outcome: LockAttempt) -> fence::Grant {
    match outcome {
        LockAttempt::Acquired(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}

/// One grant as the client saw it: sent and answered (local clock) and its fence.
#[derive(Debug, Clone, Copy)]
struct Granted {
    sent: Instant,
    answered: Instant,
    fence: u64,
}

/// The invariant of slot fences, over a whole history: per resource, no
/// fence repeats, and a grant answered before another was sent has the
/// smaller fence (the lock orders a resource's grants; the shared counter
/// only grows). Within one slot no fence repeats either (one counter).
fn check_history(history: &HashMap<String, Vec<Granted>>) {
    let mut by_slot: HashMap<u16, Vec<u64>> = HashMap::new();
    for (resource, grants) in history {
        for a in grants {
            for b in grants {
                if a.answered < b.sent {
                    assert!(
                        a.fence < b.fence,
                        "{resource}: grant {a:?} answered before {b:?} was sent, not below it"
                    );
                }
            }
        }
        let mut fences: Vec<u64> = grants.iter().map(|g| g.fence).collect();
        fences.sort_unstable();
        let count = fences.len();
        fences.dedup();
        assert_eq!(fences.len(), count, "{resource}: a fence repeated");
        by_slot
            .entry(slot(&derive(resource, "lock")))
            .or_default()
            .extend(fences);
    }
    for (slot, mut fences) in by_slot {
        fences.sort_unstable();
        let count = fences.len();
        fences.dedup();
        assert_eq!(fences.len(), count, "slot {slot}: a fence repeated");
    }
}

/// 12 resources that share one slot (one hash tag) and 12 spread over
/// slots; 6 workers pick a resource at random, acquire with a 25..60 ms
/// TTL, write under the fence, then release, let the lock expire, or
/// write again after sleeping past it (a paused holder). Every applied
/// write must come from the grant the lock held, so the value's fence at
/// the end is the greatest fence that was applied.
async fn a_history_of_many_resources_keeps_every_resources_fences_increasing(d: &Deployment) {
    let base = prefix("slot-history");
    let mut resources: Vec<String> = (0..12).map(|i| format!("{{{base}}}:order:{i}")).collect();
    resources.extend((0..12).map(|i| format!("{base}:payout:{i}")));
    let tagged = slot(&derive(&resources[0], "lock"));
    assert!(resources[..12]
        .iter()
        .all(|r| slot(&derive(r, "lock")) == tagged));
    let resources = Arc::new(resources);
    let history: Arc<Mutex<HashMap<String, Vec<Granted>>>> = Arc::default();
    let applied: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..6u64 {
        let mut conn: AnyConn = d.conn().await;
        let (resources, history, applied, refused) = (
            resources.clone(),
            history.clone(),
            applied.clone(),
            refused.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(w);
            for _ in 0..60 {
                let resource = &resources[rng.usize(..resources.len())];
                let ttl = Duration::from_millis(rng.u64(25..60));
                let sent = Instant::now();
                let outcome = slot_lock(ttl).acquire(&mut conn, resource).await.unwrap();
                let answered = Instant::now();
                let LockAttempt::Acquired(grant) = outcome else {
                    tokio::time::sleep(Duration::from_millis(rng.u64(1..10))).await;
                    continue;
                };
                let fence = grant.fence().clone();
                assert_eq!(fence.source(), FenceSource::PerSlot);
                history
                    .lock()
                    .unwrap()
                    .entry(resource.clone())
                    .or_default()
                    .push(Granted {
                        sent,
                        answered,
                        fence: fence.number(),
                    });
                let record = |out: Write| {
                    if out.is_applied() {
                        applied
                            .lock()
                            .unwrap()
                            .entry(resource.clone())
                            .or_default()
                            .push(fence.number());
                    } else {
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                };
                record(
                    fence
                        .write(&mut conn, fence.number().to_string())
                        .await
                        .unwrap(),
                );
                match rng.u8(..3) {
                    0 => {
                        // Released, or Lost when the lease ran out first.
                        let _ = grant.release(&mut conn).await.unwrap();
                    }
                    1 => {} // left to expire
                    _ => {
                        // Paused past the lease: the write must not apply
                        // (the lock is free or holds a newer grant).
                        tokio::time::sleep(ttl + Duration::from_millis(15)).await;
                        let late = fence.write(&mut conn, "late").await.unwrap();
                        assert!(
                            matches!(late, Write::Ended | Write::Stale { .. }),
                            "{resource}: a paused holder's write was {late:?}"
                        );
                        record(late);
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    let grants: usize = history.values().map(Vec::len).sum();
    assert!(grants >= 100, "too few grants to say anything: {grants}");
    assert!(refused.load(std::sync::atomic::Ordering::Relaxed) > 0);
    check_history(&history);
    // The value of each resource holds the greatest fence that applied.
    let mut conn = d.conn().await;
    let applied = applied.lock().unwrap().clone();
    for (resource, fences) in &applied {
        let stored = fence::read(&mut conn, resource).await.unwrap().unwrap();
        assert_eq!(Some(&stored.fence), fences.iter().max(), "{resource}");
        assert_eq!(stored.value, stored.fence.to_string().into_bytes());
    }
    // Bounded memory: no resource has a counter of its own.
    for resource in resources.iter() {
        assert!(!d.exists(&derive(resource, "fence")).await, "{resource}");
    }
}

async fn a_stale_holders_write_is_refused_after_a_newer_grant_wrote(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}acct", prefix("slot-stale"));
    let short = slot_lock(Duration::from_millis(40));
    let old = grant(short.acquire(&mut conn, &resource).await.unwrap());
    let old_fence = old.fence().clone();
    assert_eq!(
        old_fence.write(&mut conn, "old").await.unwrap(),
        Write::Applied
    );
    // A write equal to the lock's fence may repeat (a retried write).
    assert_eq!(
        old_fence.write(&mut conn, "old2").await.unwrap(),
        Write::Applied
    );
    // Paused past its lease: a newer grant takes the lock and writes.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let new = grant(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert!(new.fence().number() > old_fence.number());
    assert_eq!(
        new.fence().write(&mut conn, "new").await.unwrap(),
        Write::Applied
    );
    assert_eq!(
        old_fence.write(&mut conn, "stale").await.unwrap(),
        Write::Stale {
            current_fence: new.fence().number()
        }
    );
    // Not yet granted: a fence above the lock's.
    let ahead = Fence::from_message(&resource, new.fence().number() + 1)
        .unwrap()
        .with_source(FenceSource::PerSlot);
    assert_eq!(
        ahead.write(&mut conn, "ahead").await.unwrap(),
        Write::NotGranted {
            counter: new.fence().number()
        }
    );
    // Released: the newest grant itself no longer writes, and neither does the old one.
    let new_fence = new.fence().clone();
    assert_eq!(
        new.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    assert_eq!(
        new_fence.write(&mut conn, "after").await.unwrap(),
        Write::Ended
    );
    assert_eq!(
        old_fence.write(&mut conn, "after").await.unwrap(),
        Write::Ended
    );
    let stored = fence::read(&mut conn, &resource).await.unwrap().unwrap();
    assert_eq!(
        (stored.value, stored.fence),
        (b"new".to_vec(), new_fence.number())
    );
    // A slot fence sent to the per-resource check is refused too (no counter).
    let per_resource = Fence::from_message(&resource, new_fence.number()).unwrap();
    assert_eq!(
        per_resource.write(&mut conn, "x").await.unwrap(),
        Write::NotGranted { counter: 0 }
    );
}

async fn a_resource_locked_again_after_its_lock_expired_gets_a_greater_fence(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}job", prefix("slot-again"));
    let lock_key = derive(&resource, "lock");
    let short = slot_lock(Duration::from_millis(20));
    let mut last = 0;
    for _ in 0..5 {
        let g = grant(short.acquire(&mut conn, &resource).await.unwrap());
        assert!(
            g.fence().number() > last,
            "{} after {last}",
            g.fence().number()
        );
        last = g.fence().number();
        // The lock expires on the server; nothing of the resource is left.
        let start = Instant::now();
        while d.exists(&lock_key).await {
            assert!(start.elapsed() < Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!d.exists(&derive(&resource, "fence")).await);
    }
    // The slot's counter is at least the last fence it gave.
    let counter: u64 = d.get(counter_of(&resource)).await.unwrap().parse().unwrap();
    assert!(counter >= last);
    // A retry under the same token answers the same grant, drawing nothing.
    let token = fence::Token::random().unwrap();
    let first = grant(
        slot_lock(MINUTE)
            .acquire_as(&mut conn, &resource, &token)
            .await
            .unwrap(),
    );
    let again = grant(
        slot_lock(MINUTE)
            .acquire_as(&mut conn, &resource, &token)
            .await
            .unwrap(),
    );
    assert_eq!(first.fence(), again.fence());
    assert!(matches!(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
        LockAttempt::Held { .. }
    ));
    // Extend and release work on slot grants as on any grant.
    let mut first = first;
    assert!(matches!(
        first.extend(&mut conn).await.unwrap(),
        fence::LockExtend::Extended { .. }
    ));
    assert_eq!(
        first.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// The switch: a resource whose per-resource counter is at 1000 gets a
/// slot fence above it, and a per-resource floor set by `fence::advance`
/// keeps applying in slot mode.
async fn a_resource_with_a_per_resource_counter_continues_above_it(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}payout", prefix("slot-migrate"));
    let old = derive(&resource, "fence");
    let mut owner = d.owner(&old).await;
    let _: () = support::raw(&mut owner, &["SET", &old, "1000"]).await;
    let first = grant(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert!(first.fence().number() > 1000, "{:?}", first.fence());
    // The old counter is only read.
    assert_eq!(d.get(&old).await.as_deref(), Some("1000"));
    let slot_count: u64 = d.get(counter_of(&resource)).await.unwrap().parse().unwrap();
    assert!(slot_count >= first.fence().number());
    let first_fence = first.fence().number();
    assert_eq!(
        first.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let second = grant(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert!(second.fence().number() > first_fence);
    let floor = second.fence().number() + 5000;
    assert_eq!(
        second.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    // A floor raised with advance: the next slot grant is above it.
    assert!(matches!(
        fence::advance(&mut conn, &resource, floor).await.unwrap(),
        fence::AdvanceAttempt::Advanced(_)
    ));
    let third = grant(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert!(
        third.fence().number() > floor,
        "{:?} after {floor}",
        third.fence()
    );
    assert_eq!(
        third.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

async fn bad_input_is_refused_before_anything_is_sent(d: &Deployment) {
    let mut conn = d.conn().await;
    assert!(matches!(
        Lock::new(Duration::ZERO),
        Err(Error::ZeroDuration { .. })
    ));
    assert!(matches!(
        slot_lock(MINUTE).acquire(&mut conn, "").await,
        Err(Error::EmptyKey)
    ));
    assert!(matches!(
        fence::AcquireLock::new(&slot_lock(MINUTE), ""),
        Err(Error::EmptyKey)
    ));
    assert!(matches!(
        Fence::from_message("r", 0),
        Err(Error::ZeroLimit { .. })
    ));
    let big = vec![0u8; nolock::MAX_VALUE_LEN + 1];
    let fence = Fence::from_message("r", 1)
        .unwrap()
        .with_source(FenceSource::PerSlot);
    assert!(matches!(
        fence.write(&mut conn, &big).await,
        Err(Error::ValueTooLarge { .. })
    ));
}

async fn slot_fences_survive_a_script_flush(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}flush", prefix("slot-flush"));
    let mut owner = d.owner(&derive(&resource, "lock")).await;
    let cached = |name: &str| {
        let sha = nolock::script::Scripts::get(name)
            .unwrap()
            .sha1()
            .to_owned();
        redis::cmd("SCRIPT").arg("EXISTS").arg(sha).to_owned()
    };
    d.flush_scripts_everywhere().await;
    let before: Vec<i64> = cached("fence/acquire_slot")
        .query_async(&mut owner)
        .await
        .unwrap();
    assert_eq!(before, [0], "the flush emptied the cache");
    let g = grant(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    // The call found the script missing and ran it all the same (the
    // engine loads it again, or falls back to EVAL): it is cached again.
    let after: Vec<i64> = cached("fence/acquire_slot")
        .query_async(&mut owner)
        .await
        .unwrap();
    assert_eq!(after, [1]);
    d.flush_scripts_everywhere().await;
    assert_eq!(
        g.fence().write(&mut conn, "v").await.unwrap(),
        Write::Applied
    );
    let after: Vec<i64> = cached("fence/write_held")
        .query_async(&mut owner)
        .await
        .unwrap();
    assert_eq!(after, [1]);
    d.flush_scripts_everywhere().await;
    let fence = g.fence().clone();
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    d.flush_scripts_everywhere().await;
    let next = grant(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert!(next.fence().number() > fence.number());
    assert_eq!(
        next.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// A slot counter holding something nolock did not write (text, another
/// type, the last integer) is a definite error naming the key, with
/// nothing written: no lock taken, the counter unchanged. Exclusive: the
/// counter is shared by every resource of its slot.
async fn foreign_data_in_the_slot_counter_is_refused_before_any_write(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}foreign", prefix("slot-foreign"));
    let counter = counter_of(&resource);
    let lock_key = derive(&resource, "lock");
    let mut owner = d.owner(counter).await;
    let saved: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", counter]).await;
    for (setup, expect) in [
        (vec!["SET", counter, "not a number"], "non-counter"),
        (vec!["SET", counter, "007"], "non-counter"),
        (vec!["SET", counter, "9223372036854775807"], "non-counter"),
        (vec!["HSET", counter, "f", "1"], "WRONGTYPE"),
    ] {
        let _: () = support::raw(&mut owner, &["DEL", counter]).await;
        let _: redis::Value = support::raw(&mut owner, &setup).await;
        let before: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", counter]).await;
        let err = slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .expect_err(expect);
        assert!(err.is_definite(), "{err}");
        assert!(err.to_string().contains(expect), "{err}");
        assert!(!d.exists(&lock_key).await, "a lock was taken: {err}");
        let after: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", counter]).await;
        assert_eq!(before, after, "the counter changed");
    }
    // Put the slot's counter back for the resources that share it.
    let _: () = support::raw(&mut owner, &["DEL", counter]).await;
    if let Some(dump) = saved {
        let _: () = redis::cmd("RESTORE")
            .arg(counter)
            .arg(0)
            .arg(dump)
            .query_async(&mut owner)
            .await
            .unwrap();
    }
    let g = grant(
        slot_lock(MINUTE)
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// Operation values in a batch (resources in many slots, one round trip on
/// a single server) and `Waiters` (woken by the release) take slot fences
/// too, and those fences write.
async fn a_batch_and_a_waiter_take_slot_fences(d: &Deployment) {
    let mut conn = d.conn().await;
    let base = prefix("slot-batch");
    let lock = slot_lock(MINUTE);
    let resources: Vec<String> = (0..20).map(|i| format!("{base}:{i}")).collect();
    let mut batch = nolock::Batch::new();
    for resource in &resources {
        batch.push(fence::AcquireLock::new(&lock, resource).unwrap());
    }
    let mut grants = Vec::new();
    for (resource, outcome) in resources.iter().zip(batch.run(&mut conn).await) {
        let g = grant(outcome.unwrap());
        assert_eq!(g.fence().resource(), resource);
        assert_eq!(g.fence().source(), FenceSource::PerSlot);
        assert_eq!(
            g.fence().write(&mut conn, "b").await.unwrap(),
            Write::Applied
        );
        grants.push(g);
    }
    for g in grants {
        assert_eq!(
            g.release(&mut conn).await.unwrap(),
            fence::LockRelease::Released
        );
    }

    let resource = format!("{base}:waited");
    let port = match d {
        Deployment::Single(server) => server.port,
        Deployment::Cluster(cluster) => cluster.ports()[0],
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let waiters = fence::Waiters::new(&client).await.unwrap();
    let holder = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    let held = holder.fence().number();
    let mut other = d.conn().await;
    let waiting = lock
        .clone()
        .with_wait(nolock::Backoff::new(Duration::from_secs(10)));
    let resource2 = resource.clone();
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let outcome = waiters
            .acquire(&mut other, &waiting, &resource2)
            .await
            .unwrap();
        (grant(outcome), started.elapsed(), other)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        holder.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let (next, waited, mut other) = waiter.await.unwrap();
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(next.fence().number() > held);
    assert_eq!(next.fence().source(), FenceSource::PerSlot);
    assert_eq!(
        next.fence().write(&mut other, "w").await.unwrap(),
        Write::Applied
    );
    assert_eq!(
        next.release(&mut other).await.unwrap(),
        fence::LockRelease::Released
    );
}
