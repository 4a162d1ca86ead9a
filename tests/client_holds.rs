//! The lock and semaphore handles of `nolock::Client` (`client.lock(..)`,
//! `client.semaphore(..)`) against a real redis-server and the local
//! cluster: ids instead of keys, no connection passed, the fleet-safe
//! advance, and the invariants of the primitives underneath.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nolock::fence::{AdvanceAttempt, LockAttempt, LockRelease, Write};
use nolock::semaphore::{PermitAttempt, PermitRelease};
use nolock::{Backoff, Client, Error, Work};
use support::deployment::{both, Deployment};
use support::{prefix, raw};

const MINUTE: Duration = Duration::from_secs(60);

both!(
    shared: [
        a_lock_is_held_renewed_and_released_by_id,
        sixty_four_tasks_never_hold_one_id_twice_and_fences_rise,
        ids_that_collide_as_raw_keys_never_share_a_lock,
        an_expired_holder_is_refused_after_the_id_is_granted_again,
        advance_never_raises_under_a_live_holder,
        sixty_four_tasks_never_exceed_the_permits,
        a_semaphore_is_held_peeked_and_released_by_id,
    ],
    exclusive: [
        handles_recover_a_script_flush,
    ],
);

async fn client(d: &Deployment) -> Client {
    match d {
        Deployment::Single(server) => Client::connect(server.url()).await.unwrap(),
        Deployment::Cluster(cluster) => Client::connect_cluster(cluster.urls()).await.unwrap(),
    }
}

/// A handle name of its own per test and run (names: letters, digits, `_`,
/// `-`, `.`).
fn name(test: &str) -> String {
    prefix(test)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .trim_start_matches('-')
        .to_owned()
}

/// The lock key of `id` in the lock named `name`, as the client lays it
/// out: what a test reads behind the handle's back.
fn lock_key(name: &str, id: &str) -> String {
    nolock::keys::derive(&format!("{{nolock:lock:{name}:{id}}}"), "lock")
}

async fn a_lock_is_held_renewed_and_released_by_id(d: &Deployment) {
    let client = client(d).await;
    let name = name("holds_lock");
    let ttl = Duration::from_millis(300);
    let locks = client.lock(&name, ttl).unwrap();
    assert_eq!(
        (locks.name(), locks.ttl(), locks.replicas()),
        (name.as_str(), ttl, None)
    );

    let LockAttempt::Acquired(lease) = locks.acquire("tenant-1").await.unwrap() else {
        panic!("a free id is granted");
    };
    assert_eq!(lease.fence().number(), 1);
    assert!(d.exists(&lock_key(&name, "tenant-1")).await);
    // Renewed past several TTLs: another acquire keeps finding it held.
    tokio::time::sleep(ttl * 3).await;
    assert!(!lease.is_lost(), "{:?}", lease.loss());
    match locks.acquire("tenant-1").await.unwrap() {
        LockAttempt::Held { expires_in } => assert!(expires_in.unwrap() <= ttl),
        other => panic!("expected Held, got {other:?}"),
    }
    // Another id is another lock.
    let other = locks.acquire("tenant-2").await.unwrap().acquired().unwrap();
    assert_eq!(other.fence().number(), 1);
    // The Redis-side fenced write, with no connection passed.
    assert_eq!(
        locks.write(lease.fence(), "a").await.unwrap(),
        Write::Applied
    );
    let stored = locks.read("tenant-1").await.unwrap().unwrap();
    assert_eq!((stored.value.as_slice(), stored.fence), (&b"a"[..], 1));
    assert_eq!(locks.read("tenant-3").await.unwrap(), None);
    // A fence of another lock's name is refused before anything is sent.
    let foreign = client.lock(&format!("{name}x"), ttl).unwrap();
    assert!(matches!(
        foreign.write(lease.fence(), "b").await,
        Err(Error::InvalidArgument { what: "fence", .. })
    ));
    assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
    assert_eq!(other.release().await.unwrap(), LockRelease::Released);
    assert!(!d.exists(&lock_key(&name, "tenant-1")).await);

    // with_lease: the work gets the next fence; the lock is free after.
    let out = locks
        .with_lease("tenant-1", |fence| async move { fence.number() })
        .await
        .unwrap();
    assert_eq!(out, Work::Done(2));
    assert!(!d.exists(&lock_key(&name, "tenant-1")).await);
    // Busy while someone else holds it.
    let held = locks.acquire("tenant-1").await.unwrap().acquired().unwrap();
    let busy = locks.with_lease("tenant-1", |_| async {}).await.unwrap();
    assert_eq!(busy, Work::Busy);
    let _ = held.release().await.unwrap();

    // Bad input, before anything is sent.
    for bad in ["", "a b", "-x", "x:y", &"n".repeat(65)] {
        assert!(
            matches!(
                client.lock(bad, ttl),
                Err(Error::InvalidArgument { what: "name", .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        client.lock("ok", Duration::ZERO),
        Err(Error::ZeroDuration { .. })
    ));
    assert!(matches!(
        locks.clone().acknowledged(0, Duration::from_millis(10)),
        Err(Error::ZeroLimit { .. })
    ));
    let too_long = "x".repeat(nolock::client::MAX_ID_LEN + 1);
    for id in ["", too_long.as_str()] {
        assert!(matches!(
            locks.acquire(id).await,
            Err(Error::InvalidArgument { what: "id", .. })
        ));
        assert!(matches!(
            locks.with_lease(id, |_| async {}).await,
            Err(Error::InvalidArgument { what: "id", .. })
        ));
        assert!(matches!(
            locks.advance(id, 1).await,
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            locks.force_advance(id, 1).await,
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            locks.read(id).await,
            Err(Error::InvalidArgument { .. })
        ));
    }
    assert!(matches!(
        locks.advance("t", 0).await,
        Err(Error::ZeroLimit { what: "floor" })
    ));
    assert!(matches!(
        locks.force_advance("t", u64::MAX).await,
        Err(Error::OutOfRange { what: "floor", .. })
    ));
}

/// 64 tasks race for one id, each holding it briefly: never two holders at
/// once, and the fences of the grants rise strictly, in the order the
/// grants held the lock.
async fn sixty_four_tasks_never_hold_one_id_twice_and_fences_rise(d: &Deployment) {
    let client = client(d).await;
    let locks = client
        .lock(&name("holds_race"), MINUTE)
        .unwrap()
        .with_wait(Backoff::new(Duration::from_secs(30)));
    let inside = Arc::new(AtomicU64::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (locks, inside, fences, barrier) = (
                locks.clone(),
                inside.clone(),
                fences.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                locks
                    .with_lease("shared", |fence| async move {
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        fences.lock().unwrap().push(fence.number());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), Work::Done(()));
    }
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), 64);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences rise in the order of the holds: {fences:?}"
    );
}

/// Ids that would give the same raw key if pasted in (`}` ends a hash tag,
/// `%7D` is how it is escaped) are different locks.
async fn ids_that_collide_as_raw_keys_never_share_a_lock(d: &Deployment) {
    let client = client(d).await;
    let locks = client.lock(&name("holds_ids"), MINUTE).unwrap();
    let ids = ["a}b", "a%7Db", "a", "a}", "{a}", "a:b", "a}:b"];
    let mut leases = Vec::new();
    for id in ids {
        match locks.acquire(id).await.unwrap() {
            LockAttempt::Acquired(lease) => {
                assert_eq!(lease.fence().number(), 1, "{id:?}: a lock of its own");
                leases.push(lease);
            }
            held => panic!("{id:?} shares a lock with another id: {held:?}"),
        }
    }
    let resources: HashSet<String> = leases.iter().map(|l| l.resource().to_owned()).collect();
    assert_eq!(resources.len(), ids.len());
    for lease in leases {
        assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
    }
}

/// A holder whose lease expired (its process paused: no renewals) writes
/// nothing once the id is granted again: the fence refuses it.
async fn an_expired_holder_is_refused_after_the_id_is_granted_again(d: &Deployment) {
    let client = client(d).await;
    let name = name("holds_paused");
    let ttl = Duration::from_millis(100);
    let locks = client.lock(&name, ttl).unwrap();
    // The paused holder: a runtime of its own, blocked (renewals included)
    // for three TTLs after the grant.
    let paused = {
        let locks = locks.clone();
        let (granted_tx, granted_rx) = std::sync::mpsc::channel();
        let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let lease = locks.acquire("job").await.unwrap().acquired().unwrap();
                granted_tx.send(lease.fence().clone()).unwrap();
                // The pause: nothing on this runtime runs.
                resume_rx.recv().unwrap();
                let write = locks.write(lease.fence(), "late").await.unwrap();
                (write, lease.release().await.unwrap())
            })
        });
        (granted_rx.recv().unwrap(), resume_tx, thread)
    };
    let (old_fence, resume, thread) = paused;
    tokio::time::sleep(ttl * 3).await;
    let LockAttempt::Acquired(new) = locks.acquire("job").await.unwrap() else {
        panic!("the paused holder's lease expired");
    };
    assert!(new.fence().number() > old_fence.number());
    resume.send(()).unwrap();
    let (write, release) = tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        write,
        Write::Stale {
            current_fence: new.fence().number()
        }
    );
    assert_eq!(release, LockRelease::Lost, "the new holder's lock stays");
    assert_eq!(
        locks.write(new.fence(), "now").await.unwrap(),
        Write::Applied
    );
    assert_eq!(new.release().await.unwrap(), LockRelease::Released);
}

/// The handle's advance is the fleet-safe one: a live holder keeps writing;
/// without a holder it raises above the floor; force_advance raises anyway.
async fn advance_never_raises_under_a_live_holder(d: &Deployment) {
    let client = client(d).await;
    let locks = client.lock(&name("holds_advance"), MINUTE).unwrap();
    let lease = locks.acquire("t").await.unwrap().acquired().unwrap();
    let seen = lease.fence().number();
    let held = locks.advance("t", seen).await.unwrap();
    assert!(
        matches!(held, AdvanceAttempt::Held { counter, expires_in: Some(_) } if counter == seen),
        "{held:?}"
    );
    assert_eq!(
        locks.write(lease.fence(), "v").await.unwrap(),
        Write::Applied
    );
    let forced = locks.force_advance("t", seen).await.unwrap();
    assert_eq!((forced.raised, forced.counter), (true, seen + 1));
    assert!(matches!(
        locks.write(lease.fence(), "w").await.unwrap(),
        Write::Stale { .. }
    ));
    let _ = lease.release().await.unwrap();
    let free = locks.advance("t", 40).await.unwrap().advanced().unwrap();
    assert_eq!((free.raised, free.counter), (true, 41));
    let next = locks.acquire("t").await.unwrap().acquired().unwrap();
    assert_eq!(next.fence().number(), 42);
    let _ = next.release().await.unwrap();
}

/// 64 tasks on a semaphore of 3 permits per id: never more than 3 inside.
async fn sixty_four_tasks_never_exceed_the_permits(d: &Deployment) {
    let client = client(d).await;
    let permits = 3;
    let exports = client
        .semaphore(&name("holds_sem_race"), permits, MINUTE)
        .unwrap()
        .with_wait(Backoff::new(Duration::from_secs(30)));
    let inside = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (exports, inside, most, barrier) = (
                exports.clone(),
                inside.clone(),
                most.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                exports
                    .with_permit("tenant", |_| async move {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), Work::Done(()));
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= permits, "{most} holders at once");
    assert!(most > 1, "the race never overlapped: {most}");
    assert_eq!(exports.peek("tenant").await.unwrap().in_use, 0);
}

async fn a_semaphore_is_held_peeked_and_released_by_id(d: &Deployment) {
    let client = client(d).await;
    let name = name("holds_sem");
    let exports = client.semaphore(&name, 2, MINUTE).unwrap();
    assert_eq!(
        (exports.name(), exports.permits(), exports.ttl()),
        (name.as_str(), 2, MINUTE)
    );
    let a = exports.acquire("t1").await.unwrap().acquired().unwrap();
    let b = exports.acquire("t1").await.unwrap().acquired().unwrap();
    match exports.acquire("t1").await.unwrap() {
        PermitAttempt::Full { in_use, .. } => assert_eq!(in_use, 2),
        other => panic!("expected Full, got {other:?}"),
    }
    // Another id has its own permits; ids colliding as raw keys too.
    for id in ["t2", "t1}", "t1%7D"] {
        let other = exports.acquire(id).await.unwrap().acquired();
        assert!(other.is_some(), "{id:?} shares permits with t1");
        let _ = other.unwrap().release().await.unwrap();
    }
    let usage = exports.peek("t1").await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (2, 2));
    assert!(usage.next_expiry.is_some());
    assert_eq!(a.release().await.unwrap(), PermitRelease::Released);
    let out = exports.with_permit("t1", |_| async { 7 }).await.unwrap();
    assert_eq!(out, Work::Done(7));
    assert_eq!(b.release().await.unwrap(), PermitRelease::Released);
    assert_eq!(exports.peek("t1").await.unwrap().in_use, 0);

    // Bad input, before anything is sent.
    assert!(matches!(
        client.semaphore("bad name", 2, MINUTE),
        Err(Error::InvalidArgument { what: "name", .. })
    ));
    assert!(matches!(
        client.semaphore("ok", 0, MINUTE),
        Err(Error::ZeroLimit { .. })
    ));
    assert!(matches!(
        client.semaphore("ok", 2, Duration::ZERO),
        Err(Error::ZeroDuration { .. })
    ));
    assert!(matches!(
        exports.acquire("").await,
        Err(Error::InvalidArgument { what: "id", .. })
    ));
    assert!(matches!(
        exports.with_permit("", |_| async {}).await,
        Err(Error::InvalidArgument { what: "id", .. })
    ));
    assert!(matches!(
        exports.peek("").await,
        Err(Error::InvalidArgument { what: "id", .. })
    ));
}

/// After `SCRIPT FLUSH` on every node, every call of both handles loads its
/// script again and answers as before.
async fn handles_recover_a_script_flush(d: &Deployment) {
    let client = client(d).await;
    let lock_name = name("holds_flush");
    let locks = client.lock(&lock_name, MINUTE).unwrap();
    let exports = client
        .semaphore(&name("holds_flush_sem"), 1, MINUTE)
        .unwrap();
    d.flush_scripts_everywhere().await;
    let lease = locks.acquire("t").await.unwrap().acquired().unwrap();
    d.flush_scripts_everywhere().await;
    assert_eq!(
        locks.write(lease.fence(), "v").await.unwrap(),
        Write::Applied
    );
    d.flush_scripts_everywhere().await;
    assert!(matches!(
        locks.advance("t", 1).await.unwrap(),
        AdvanceAttempt::Held { .. }
    ));
    d.flush_scripts_everywhere().await;
    assert_eq!(locks.read("t").await.unwrap().unwrap().value, b"v");
    d.flush_scripts_everywhere().await;
    assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
    d.flush_scripts_everywhere().await;
    let permit = exports.acquire("t").await.unwrap().acquired().unwrap();
    d.flush_scripts_everywhere().await;
    assert_eq!(exports.peek("t").await.unwrap().in_use, 1);
    d.flush_scripts_everywhere().await;
    assert_eq!(permit.release().await.unwrap(), PermitRelease::Released);
    d.flush_scripts_everywhere().await;
    assert_eq!(
        locks
            .with_lease("t", |f| async move { f.number() })
            .await
            .unwrap(),
        Work::Done(2)
    );
    // And the counters were untouched by the flushes.
    let counter_key = nolock::keys::derive(&format!("{{nolock:lock:{lock_name}:t}}"), "fence");
    let mut owner = d.owner(&counter_key).await;
    let counter: String = raw(&mut owner, &["GET", &counter_key]).await;
    assert_eq!(counter, "2");
}

/// Issue 34, hazard 3: an acknowledged lock on a server without a replica
/// answers the documented error within about its timeout, and leaves
/// nothing held; the same for an acknowledged semaphore.
#[tokio::test]
async fn acknowledged_handles_without_a_replica_fail_plainly_and_hold_nothing() {
    let d = Deployment::single();
    let client = client(&d).await;
    let name = name("holds_ack");
    let timeout = Duration::from_millis(100);
    let locks = client
        .lock(&name, MINUTE)
        .unwrap()
        .acknowledged(1, timeout)
        .unwrap();
    let started = std::time::Instant::now();
    let err = locks.acquire("t").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unacknowledged {
                acknowledged: 0,
                asked: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(started.elapsed() < timeout * 5, "{:?}", started.elapsed());
    assert!(!d.exists(&lock_key(&name, "t")).await, "nothing held");
    let out = locks.with_lease("t", |_| async {}).await;
    assert!(matches!(out, Err(Error::Unacknowledged { .. })), "{out:?}");
    assert!(!d.exists(&lock_key(&name, "t")).await, "nothing held");

    let sem_name = format!("{name}-sem");
    let exports = client
        .semaphore(&sem_name, 2, MINUTE)
        .unwrap()
        .acknowledged(1, timeout)
        .unwrap();
    let err = exports.acquire("t").await.unwrap_err();
    assert!(matches!(err, Error::PermitUnacknowledged { .. }), "{err}");
    assert_eq!(exports.peek("t").await.unwrap().in_use, 0, "nothing held");
}
