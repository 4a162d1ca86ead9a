//! Limits that live on the server (`nolock::config`), on a single server
//! and on the local 3x2 cluster: the four disagreements of two processes
//! built with other numbers now agree (or, asked to insist, fail at
//! startup); a change at run time reaches every client within its poll
//! bound, keeping or resetting state; the kill switch both ways; foreign
//! data at the registry is a typed error naming the key.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nolock::client::Rejection;
use nolock::config::{Change, Family, Mode, Spec};
use nolock::fence::LockAttempt;
use nolock::rate::{Algorithm, Quota};
use nolock::semaphore::PermitAttempt;
use nolock::{Client, Error};
use support::deployment::{both, Deployment};

const MINUTE: Duration = Duration::from_secs(60);
/// The poll the tests' clients use: the bound a change reaches them in.
const POLL: Duration = Duration::from_millis(50);

both!(
    shared: [
        two_semaphores_of_other_sizes_agree_on_the_stored_size,
        counters_of_other_numbers_agree_and_insist_refuses,
        a_fast_rate_limit_decides_by_the_stored_slow_one,
        another_algorithm_on_a_stored_name_decides_by_the_stored_one,
        a_change_keeps_or_resets_and_reaches_every_client,
        the_kill_switch_blocks_and_unlimits_without_redis,
        bad_input_is_refused_before_anything_is_written,
        concurrent_changes_lose_nothing,
        a_change_under_load_reaches_every_task_within_the_poll_bound,
        a_semaphore_grown_under_load_is_never_full_after_the_bound,
    ],
    exclusive: [
        foreign_data_at_the_registry_is_named,
        the_registry_survives_a_script_flush,
    ],
);

async fn client(d: &Deployment) -> Client {
    let client = match d {
        Deployment::Single(server) => Client::connect(server.url()).await.unwrap(),
        Deployment::Cluster(cluster) => Client::connect_cluster(cluster.urls()).await.unwrap(),
    };
    client.config_poll(POLL).unwrap()
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

fn limited<T: std::fmt::Debug>(r: Result<T, Rejection>) -> nolock::client::Limited {
    match r {
        Err(Rejection::Limited(l)) => l,
        other => panic!("not limited: {other:?}"),
    }
}

async fn two_semaphores_of_other_sizes_agree_on_the_stored_size(d: &Deployment) {
    let name = unique("jobs");
    let three = client(d).await.semaphore(&name, 3, MINUTE).unwrap();
    let one = client(d).await.semaphore(&name, 1, MINUTE).unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        match three.acquire("tenant").await.unwrap() {
            PermitAttempt::Acquired(lease) => held.push(lease),
            other => panic!("{other:?}"),
        }
    }
    // Before: the size-1 handle said "full, 2 in use". Now it decides by
    // the stored size, 3: one more fits, for either handle, and no more.
    match one.acquire("tenant").await.unwrap() {
        PermitAttempt::Acquired(lease) => held.push(lease),
        other => panic!("the size-1 handle decides by 3: {other:?}"),
    }
    assert_eq!(one.permits(), 3);
    assert!(matches!(
        three.acquire("tenant").await.unwrap(),
        PermitAttempt::Full { .. }
    ));
    assert!(matches!(
        one.acquire("tenant").await.unwrap(),
        PermitAttempt::Full { .. }
    ));
    match one.insist().await {
        Err(Error::ConfigMismatch { stored, ours, .. }) => {
            assert_eq!(stored, "semaphore 3 ttl 1min");
            assert_eq!(ours, "semaphore 1 ttl 1min");
        }
        other => panic!("{other:?}"),
    }
    for lease in held {
        let _ = lease.release().await.unwrap();
    }
}

async fn counters_of_other_numbers_agree_and_insist_refuses(d: &Deployment) {
    let name = unique("api");
    let per_minute = client(d).await.counter(&name, 100, MINUTE).unwrap();
    let per_second = client(d)
        .await
        .counter(&name, 5, Duration::from_secs(1))
        .unwrap();
    let free = client(d)
        .await
        .counter(&name, 1000, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(per_minute.increment("u").await.unwrap().remaining, 99);
    // The others decide by 100 per minute too, on one count.
    assert_eq!(per_second.increment("u").await.unwrap().remaining, 98);
    assert_eq!(free.increment_by("u", 8).await.unwrap().remaining, 90);
    assert_eq!((per_second.limit(), per_second.window()), (100, MINUTE));
    assert!(matches!(
        free.insist().await,
        Err(Error::ConfigMismatch { .. })
    ));
    per_minute.insist().await.unwrap();
    let config = per_second.config().await.unwrap();
    assert_eq!(config.spec, Spec::counter(100, MINUTE));
}

async fn a_fast_rate_limit_decides_by_the_stored_slow_one(d: &Deployment) {
    let name = unique("gcra");
    let slow = client(d)
        .await
        .rate_limit(&name, Quota::per_minute(2).unwrap())
        .unwrap();
    let fast = client(d)
        .await
        .rate_limit(&name, Quota::per_second(100).unwrap())
        .unwrap();
    let _ = slow.check("u").await.unwrap();
    let _ = slow.check("u").await.unwrap();
    // Before: "allowed: false, remaining: 0" with no word of why. Now the
    // fast handle decides by the stored 2/min, and says so in its answer.
    let l = limited(fast.check("u").await);
    assert_eq!(l.limit, 2);
    assert!(l.retry_after.unwrap() > Duration::from_secs(20));
    assert!(matches!(
        fast.insist().await,
        Err(Error::ConfigMismatch { .. })
    ));
}

async fn another_algorithm_on_a_stored_name_decides_by_the_stored_one(d: &Deployment) {
    let name = unique("alg");
    let quota = Quota::per_minute(3).unwrap();
    let gcra = client(d).await.rate_limit(&name, quota).unwrap();
    let fixed = client(d)
        .await
        .rate_limit(&name, quota)
        .unwrap()
        .with_algorithm(Algorithm::FixedWindow)
        .unwrap();
    let _ = gcra.check("u").await.unwrap();
    let _ = gcra.check("u").await.unwrap();
    // Before: the fixed window read the stored GCRA time as a count. Now
    // it decides by the stored algorithm, on the same state.
    assert_eq!(fixed.check("u").await.unwrap().remaining, 0);
    limited(fixed.check("u").await);
    assert_eq!(fixed.key("u").unwrap(), gcra.key("u").unwrap());
    assert!(matches!(
        fixed.insist().await,
        Err(Error::ConfigMismatch { .. })
    ));
}

/// Waits until `f` holds, at most `bound` after `from`; answers how long
/// it took.
async fn within<F, Fut>(from: Instant, bound: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if f().await {
            return from.elapsed();
        }
        assert!(from.elapsed() < bound, "not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn a_change_keeps_or_resets_and_reaches_every_client(d: &Deployment) {
    let name = unique("plan");
    let operator = client(d).await;
    let api = client(d).await.counter(&name, 10, MINUTE).unwrap();
    assert_eq!(api.increment_by("acme", 6).await.unwrap().remaining, 4);

    // Keep: the count stays, the new limit applies to it.
    let set = operator
        .configs()
        .set(&name, Spec::counter(20, MINUTE), Change::Keep)
        .await
        .unwrap();
    assert_eq!((set.generation, set.mode), (0, Mode::Normal));
    let started = Instant::now();
    within(started, Duration::from_secs(1), || async {
        api.peek("acme").await.is_ok() && api.limit() == 20
    })
    .await;
    assert_eq!(api.increment("acme").await.unwrap().remaining, 13);

    // Reset: every id starts afresh, at once.
    let set = operator
        .configs()
        .set(&name, Spec::counter(20, MINUTE), Change::Reset)
        .await
        .unwrap();
    assert_eq!(set.generation, 1);
    let started = Instant::now();
    within(started, Duration::from_secs(1), || async {
        api.peek("acme").await.unwrap().count == 0
    })
    .await;
    assert_eq!(api.increment("acme").await.unwrap().remaining, 19);

    // A semaphore or a lock cannot be reset.
    assert!(matches!(
        operator
            .configs()
            .set(&name, Spec::semaphore(2, MINUTE), Change::Reset)
            .await,
        Err(Error::InvalidArgument { what: "change", .. })
    ));
    let listed = operator.configs().list().await.unwrap();
    let entry = listed
        .iter()
        .find(|c| c.family == Family::Counter && c.name == name)
        .expect("listed");
    assert_eq!(entry.spec, Spec::counter(20, MINUTE));
}

async fn the_kill_switch_blocks_and_unlimits_without_redis(d: &Deployment) {
    let name = unique("switch");
    let operator = client(d).await;
    let configs = operator.configs();
    let api = client(d)
        .await
        .rate_limit(&name, Quota::per_minute(1).unwrap())
        .unwrap();
    let _ = api.check("u").await.unwrap();
    limited(api.check("u").await);

    configs.unlimit(Family::RateLimit, &name).await.unwrap();
    let started = Instant::now();
    within(started, Duration::from_secs(1), || async {
        api.check("u").await.is_ok()
    })
    .await;
    for _ in 0..20 {
        let _ = api.check("u").await.unwrap();
    }

    configs.block(Family::RateLimit, &name).await.unwrap();
    within(started, Duration::from_secs(2), || async {
        api.check("fresh").await.is_err()
    })
    .await;
    let l = limited(api.check("another").await);
    assert_eq!(l.retry_after, None, "blocked: no time to wait for");

    configs.unblock(Family::RateLimit, &name).await.unwrap();
    within(started, Duration::from_secs(3), || async {
        api.check("new-id").await.is_ok()
    })
    .await;
    // The state from before the switch is still there.
    limited(api.check("u").await);

    // Locks and semaphores: blocked is a typed error; a lock is never
    // unlimited.
    let lock_name = unique("lock");
    let lock = client(d).await.lock(&lock_name, MINUTE).unwrap();
    assert!(matches!(
        lock.acquire("x").await.unwrap(),
        LockAttempt::Acquired(_)
    ));
    assert!(matches!(
        configs.unlimit(Family::Lock, &lock_name).await,
        Err(Error::InvalidArgument { .. })
    ));
    configs.block(Family::Lock, &lock_name).await.unwrap();
    configs.refresh().await.unwrap();
    let blocked_lock = operator.lock(&lock_name, MINUTE).unwrap();
    assert!(matches!(
        blocked_lock.acquire("y").await,
        Err(Error::Blocked { .. })
    ));
    assert!(matches!(
        configs.block(Family::Semaphore, &unique("never")).await,
        Err(Error::UnknownConfig { .. })
    ));
}

async fn bad_input_is_refused_before_anything_is_written(d: &Deployment) {
    let configs = client(d).await.configs();
    let name = unique("bad");
    for (name, spec) in [
        ("a b", Spec::counter(1, MINUTE)),
        (name.as_str(), Spec::counter(0, MINUTE)),
        (name.as_str(), Spec::semaphore(1, Duration::ZERO)),
    ] {
        assert!(
            configs.set(name, spec.clone(), Change::Keep).await.is_err(),
            "{name} {spec}"
        );
    }
    assert_eq!(configs.get(Family::Counter, &name).await.unwrap(), None);
    assert_eq!(configs.get(Family::Semaphore, &name).await.unwrap(), None);
}

/// Runs 4 clients x 16 tasks: each task calls `decide(handle, id)` in a
/// loop, which answers whether that decision was by the old numbers; the
/// operator's `change` runs after a warm-up. Answers how long after the
/// change returned the last call by old numbers was sent (zero when none
/// was).
async fn lateness_under_load<H, D, DF, C, CF>(handles: Vec<H>, decide: D, change: C) -> Duration
where
    H: Clone + Send + Sync + 'static,
    D: Fn(H, String) -> DF + Clone + Send + Sync + 'static,
    DF: std::future::Future<Output = bool> + Send,
    C: FnOnce() -> CF,
    CF: std::future::Future<Output = ()>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let changed_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let late = Arc::new(AtomicU64::new(0));
    let decided = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (i, handle) in handles.iter().enumerate() {
        for t in 0..16 {
            let (handle, decide, stop, changed_at, late, decided) = (
                handle.clone(),
                decide.clone(),
                Arc::clone(&stop),
                Arc::clone(&changed_at),
                Arc::clone(&late),
                Arc::clone(&decided),
            );
            tasks.push(tokio::spawn(async move {
                let id = format!("{i}-{t}");
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let by_old = decide(handle.clone(), id.clone()).await;
                    decided.fetch_add(1, Ordering::Relaxed);
                    let changed = *changed_at.lock().unwrap();
                    if let (true, Some(changed)) = (by_old, changed) {
                        if sent > changed {
                            let after = (sent - changed).as_micros() as u64;
                            late.fetch_max(after, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = decided.load(Ordering::Relaxed);
    change().await;
    *changed_at.lock().unwrap() = Some(Instant::now());
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    assert!(before > 64, "the tasks were deciding before the change");
    Duration::from_micros(late.load(Ordering::Relaxed))
}

/// The bound a change must reach every task in: the poll, a registry
/// read, and room for a loaded machine.
const BOUND: Duration = Duration::from_millis(450);

/// 4 clients x 16 tasks decide on one rate limit while an operator changes
/// its numbers, keeping or resetting the state, for every algorithm: after
/// the poll bound no task decides by the old numbers (every answer carries
/// the limit it was decided by).
async fn a_change_under_load_reaches_every_task_within_the_poll_bound(d: &Deployment) {
    let old = Quota::per_second(500_000).unwrap();
    let new = Quota::per_second(1_000_000).unwrap();
    for algorithm in Algorithm::ALL {
        for change in [Change::Keep, Change::Reset] {
            let name = unique("load");
            let operator = client(d).await;
            let mut handles = Vec::new();
            for _ in 0..4 {
                let handle = client(d)
                    .await
                    .rate_limit(&name, old)
                    .unwrap()
                    .with_algorithm(algorithm)
                    .unwrap();
                let _ = handle.check("warm").await.unwrap();
                handles.push(handle);
            }
            let decide = move |h: nolock::client::RateLimit, id: String| async move {
                h.check(&id).await.unwrap().limit == old.burst()
            };
            let set = || async {
                operator
                    .configs()
                    .set(&name, Spec::rate_limit(algorithm, new), change)
                    .await
                    .unwrap();
            };
            let late = lateness_under_load(handles.clone(), decide, set).await;
            println!(
                "{algorithm} {change:?}: old numbers {late:?} after the change (poll {POLL:?})"
            );
            assert!(
                late < BOUND,
                "{algorithm} {change:?}: old numbers {late:?} after"
            );
            for handle in &handles {
                assert_eq!(handle.check("after").await.unwrap().limit, new.burst());
            }
        }
    }
}

/// The same for a semaphore grown from 4 to 64 permits under 64 tasks that
/// each hold at most one: after the bound, no task finds it full.
async fn a_semaphore_grown_under_load_is_never_full_after_the_bound(d: &Deployment) {
    let name = unique("grow");
    let operator = client(d).await;
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(client(d).await.semaphore(&name, 4, MINUTE).unwrap());
    }
    let decide = |h: nolock::client::Semaphore, id: String| async move {
        let _ = id;
        match h.acquire("shared").await.unwrap() {
            PermitAttempt::Acquired(lease) => {
                let _ = lease.release().await.unwrap();
                false
            }
            PermitAttempt::Full { .. } => true,
        }
    };
    let set = || async {
        operator
            .configs()
            .set(&name, Spec::semaphore(64, MINUTE), Change::Keep)
            .await
            .unwrap();
    };
    let late = lateness_under_load(handles.clone(), decide, set).await;
    println!("semaphore: full by the old size {late:?} after the change (poll {POLL:?})");
    assert!(
        late < BOUND,
        "full by the old size {late:?} after the change"
    );
    assert_eq!(handles[0].permits(), 64);
}

/// Operators on 8 clients change one name at once (new numbers, a block):
/// every change is applied on what the one before left, so neither the
/// numbers nor the switch is lost, and every change got its own epoch.
async fn concurrent_changes_lose_nothing(d: &Deployment) {
    let name = unique("race");
    let first = client(d)
        .await
        .configs()
        .set(&name, Spec::counter(1, MINUTE), Change::Keep)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (configs, name) = (client(d).await.configs(), name.clone());
        tasks.push(tokio::spawn(async move {
            if i == 0 {
                configs.block(Family::Counter, &name).await
            } else {
                configs
                    .set(&name, Spec::counter(10 + i, MINUTE), Change::Keep)
                    .await
            }
        }));
    }
    let mut epochs = Vec::new();
    for task in tasks {
        epochs.push(task.await.unwrap().unwrap().epoch);
    }
    epochs.sort_unstable();
    epochs.dedup();
    assert_eq!(epochs.len(), 8, "one epoch per change");
    assert!(epochs[0] > first.epoch);
    let last = client(d)
        .await
        .configs()
        .get(Family::Counter, &name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(last.epoch, *epochs.last().unwrap());
    assert_eq!(last.mode, Mode::Blocked, "the block was not lost: {last:?}");
    assert!(
        matches!(last.spec, Spec::Counter { limit, .. } if limit > 10),
        "a set was applied: {last:?}"
    );
}

/// `SCRIPT FLUSH` before the registry's scripts run: declaring, reading
/// and changing fall back to `EVAL` and answer as before.
async fn the_registry_survives_a_script_flush(d: &Deployment) {
    let name = unique("flush");
    let client = client(d).await;
    let api = client.counter(&name, 4, MINUTE).unwrap();
    d.flush_scripts_everywhere().await;
    assert_eq!(api.increment("u").await.unwrap().remaining, 3);
    d.flush_scripts_everywhere().await;
    let configs = client.configs();
    configs
        .set(&name, Spec::counter(8, MINUTE), Change::Keep)
        .await
        .unwrap();
    d.flush_scripts_everywhere().await;
    configs.refresh().await.unwrap();
    assert_eq!(api.increment("u").await.unwrap().remaining, 6);
    d.flush_scripts_everywhere().await;
    assert!(configs
        .list()
        .await
        .unwrap()
        .iter()
        .any(|c| c.name == name && c.spec == Spec::counter(8, MINUTE)));
}

async fn foreign_data_at_the_registry_is_named(d: &Deployment) {
    let client = client(d).await;
    let mut conn = client.connection();
    let name = unique("foreign");
    let _: () = redis::cmd("HSET")
        .arg(nolock::config::REGISTRY_KEY)
        .arg(format!("counter:{name}"))
        .arg("garbage")
        .query_async(&mut conn)
        .await
        .unwrap();
    let configs = client.configs();
    match configs.get(Family::Counter, &name).await {
        Err(Error::ForeignConfig { key, field, .. }) => {
            assert_eq!(key, nolock::config::REGISTRY_KEY);
            assert_eq!(field, format!("counter:{name}"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        configs.list().await,
        Err(Error::ForeignConfig { .. })
    ));
    // A handle of that name refuses too, with nothing written.
    let api = client.counter(&name, 5, MINUTE).unwrap();
    match api.increment("u").await {
        Err(Rejection::Failed(Error::ForeignConfig { key, field, .. })) => {
            assert_eq!(key, nolock::config::REGISTRY_KEY);
            assert_eq!(field, format!("counter:{name}"));
        }
        other => panic!("{other:?}"),
    }
    let _: () = redis::cmd("HDEL")
        .arg(nolock::config::REGISTRY_KEY)
        .arg(format!("counter:{name}"))
        .query_async(&mut conn)
        .await
        .unwrap();

    // The registry or its epoch holding another type: named, nothing
    // written. (Set aside under a key of the same slot, and put back.)
    let backup = "{nolock:config}:test-backup";
    let registry = nolock::config::REGISTRY_KEY;
    let epoch = nolock::config::EPOCH_KEY;
    let moved: bool = redis::cmd("EXISTS")
        .arg(registry)
        .query_async(&mut conn)
        .await
        .unwrap();
    if moved {
        let _: () = redis::cmd("RENAME")
            .arg(registry)
            .arg(backup)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg(registry)
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .unwrap();
    match configs.list().await {
        Err(Error::ForeignConfig { key, .. }) => assert_eq!(key, registry),
        other => panic!("{other:?}"),
    }
    match configs
        .set(&unique("x"), Spec::counter(1, MINUTE), Change::Keep)
        .await
    {
        Err(Error::ForeignConfig { key, .. }) => assert_eq!(key, registry),
        other => panic!("{other:?}"),
    }
    let _: () = redis::cmd("DEL")
        .arg(registry)
        .query_async(&mut conn)
        .await
        .unwrap();
    if moved {
        let _: () = redis::cmd("RENAME")
            .arg(backup)
            .arg(registry)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let old_epoch: Option<String> = redis::cmd("GET")
        .arg(epoch)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(epoch)
        .arg("0x10")
        .query_async(&mut conn)
        .await
        .unwrap();
    match configs.list().await {
        Err(Error::ForeignConfig { key, .. }) => assert_eq!(key, epoch),
        other => panic!("{other:?}"),
    }
    let _: () = redis::cmd("SET")
        .arg(epoch)
        .arg(old_epoch.unwrap_or_else(|| "0".to_owned()))
        .query_async(&mut conn)
        .await
        .unwrap();
    configs.list().await.unwrap();
}
