//! The `rate`, `cas` and `fence` suites, a representative subset per
//! operation, run twice: once against a single `redis-server` and once
//! against the local 3×2 Redis Cluster (shared by the tests of this file).
//!
//! Same pattern as `tests/cluster.rs`: each body takes a [`Deployment`],
//! `both!` makes a `single::` and a `cluster::` test of it, bodies isolate
//! themselves by key prefix, and the ones that flush script caches or count
//! commands run alone on the cluster.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nolock::cas::{self, Adjust, Adjustment, Expected, Insert, Outcome, Update, Versioned};
use nolock::fence::{self, AdvanceAttempt, Fence, LockAttempt, LockExtend, LockRelease, Write};
use nolock::rate::{Algorithm, Check, Limiter, MultiKey, MultiLimiter, Quota};
use nolock::Backoff;
use nolock::{Batch, Error};
use redis::aio::MultiplexedConnection;
use support::deployment::{both, run_batch_through_a_flush, Deployment};
use support::{keys, prefix, raw};

fn fence_of(resource: &str, number: u64) -> Fence {
    Fence::from_message(resource, number).unwrap()
}

const MINUTE: Duration = Duration::from_secs(60);

both!(
    shared: [
        every_rate_algorithm_counts_down_denies_and_refunds_on_the_keys_owner,
        a_multi_limit_with_derived_and_shared_keys_is_all_or_nothing,
        versioned_values_write_once_per_version,
        debit_and_credit_stay_within_their_bounds,
        compare_and_set_family_and_watermarks,
        concurrent_debits_never_overdraw,
        fence_acquire_extend_release_and_fences_rise,
        fenced_writes_refuse_older_fences,
        advance_waits_for_no_holder_and_force_advance_does_not,
        a_lease_renews_on_the_deployment_connection,
        a_waiter_is_woken_by_a_release_through_any_node,
        a_batch_of_rate_checks_gives_the_same_results_as_single_calls,
        a_batch_of_adjustments_gives_the_same_results_as_single_calls,
    ],
    exclusive: [
        a_multi_limit_across_slots_is_refused_before_anything_is_sent,
        every_module_recovers_a_script_flush_on_every_node,
        a_flush_between_batches_of_rate_checks_is_recovered,
        a_flush_between_batches_of_adjustments_is_recovered,
    ],
);

fn grant(outcome: LockAttempt) -> fence::Grant {
    match outcome {
        LockAttempt::Acquired(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}

// ---------------------------------------------------------------- rate

async fn every_rate_algorithm_counts_down_denies_and_refunds_on_the_keys_owner(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("rate_algorithms");
    let mut owners = BTreeSet::new();
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        if algorithm == Algorithm::Calendar {
            support::calendar::room_in_this_minute().await;
        }
        let limiter = Limiter::new(algorithm, Quota::per_minute(3).unwrap()).unwrap();
        // Several keys per algorithm, so that every primary serves some.
        for n in 0..3 {
            let key = format!("{p}{i}:{n}");
            let mut last = None;
            for remaining in [2, 1, 0] {
                let r = limiter.check(&mut conn, &key, 1).await.unwrap();
                assert!(r.allowed, "{algorithm} {key}");
                assert_eq!((r.limit, r.remaining), (3, remaining), "{algorithm}");
                last = Some(r);
            }
            let denied = limiter.check(&mut conn, &key, 1).await.unwrap();
            assert!(
                !denied.allowed && denied.retry_after.is_some(),
                "{algorithm}"
            );
            assert_eq!(denied.remaining, 0);
            let peek = limiter.peek(&mut conn, &key, 1).await.unwrap();
            assert!(!peek.allowed, "{algorithm}: peek agrees");

            let back = last
                .as_mut()
                .and_then(|d: &mut nolock::rate::Decision| d.charge_mut())
                .unwrap()
                .refund(&mut conn, 1)
                .await;
            assert_eq!(back.unwrap().remaining, 1, "{algorithm}");
            let again = limiter.check(&mut conn, &key, 1).await.unwrap();
            assert_eq!((again.allowed, again.remaining), (true, 0), "{algorithm}");
            assert!(d.exists(&key).await, "{key} on its owner");
            owners.insert(d.owner_port(&key).await);

            limiter.reset(&mut conn, &key).await.unwrap();
            assert!(!d.exists(&key).await, "reset");
        }
    }
    assert_eq!(owners.len(), if d.is_cluster() { 3 } else { 1 });
}

async fn a_multi_limit_with_derived_and_shared_keys_is_all_or_nothing(d: &Deployment) {
    let mut conn = d.conn().await;
    let tag = format!("{{{}}}", prefix("multi"));
    let (u1, u2, all) = (
        format!("{tag}:u1"),
        format!("{tag}:u2"),
        format!("{tag}:all"),
    );
    let multi = MultiLimiter::new(Algorithm::FixedWindow)
        .limit("minute", Quota::per_minute(3).unwrap())
        .unwrap()
        .limit("hour", Quota::per_hour(5).unwrap())
        .unwrap()
        .shared_limit("tenant", Quota::per_hour(4).unwrap())
        .unwrap();

    for _ in 0..3 {
        let r = multi
            .check(&mut conn, MultiKey::new(&u1).shared("tenant", &all), 1)
            .await
            .unwrap();
        assert!(r.allowed);
    }
    let r = multi
        .check(&mut conn, MultiKey::new(&u1).shared("tenant", &all), 1)
        .await
        .unwrap();
    assert_eq!((r.allowed, r.denied_by), (false, Some(0)), "minute is full");
    assert_eq!(r.limits[2].remaining, 1, "the tenant was not charged");

    let mut u2_last = multi
        .check(&mut conn, MultiKey::new(&u2).shared("tenant", &all), 1)
        .await
        .unwrap();
    assert!(u2_last.allowed, "the tenant's last unit");
    let r = multi
        .check(&mut conn, MultiKey::new(&u2).shared("tenant", &all), 1)
        .await
        .unwrap();
    assert_eq!((r.allowed, r.denied_by), (false, Some(2)), "tenant is full");
    assert_eq!(
        (r.limits[0].remaining, r.limits[1].remaining),
        (2, 4),
        "u2's own limits were not charged by the denial"
    );
    let peek = multi
        .peek(&mut conn, MultiKey::new(&u2).shared("tenant", &all), 1)
        .await
        .unwrap();
    assert_eq!(peek.denied_by, Some(2));

    // Every key of both users lives on one node: the tag's owner.
    let owner = d.owner_port(&all).await;
    for key in multi
        .keys(&MultiKey::new(&u1).shared("tenant", &all))
        .unwrap()
        .into_iter()
        .chain(
            multi
                .keys(&MultiKey::new(&u2).shared("tenant", &all))
                .unwrap(),
        )
    {
        assert_eq!(d.owner_port(&key).await, owner, "{key}");
        assert!(d.exists(&key).await, "{key}");
    }

    // Refund gives the tenant room again, and reset forgets a user.
    let refunds = u2_last
        .charge_mut()
        .unwrap()
        .refund(&mut conn, 1)
        .await
        .unwrap();
    let remaining: Vec<_> = refunds.iter().map(|r| r.remaining).collect();
    assert_eq!(remaining, [3, 5, 1]);
    assert!(
        multi
            .check(&mut conn, MultiKey::new(&u2).shared("tenant", &all), 1)
            .await
            .unwrap()
            .allowed
    );
    multi
        .reset(&mut conn, MultiKey::new(&u1).shared("tenant", &all))
        .await
        .unwrap();
    for key in multi
        .keys(&MultiKey::new(&u1).shared("tenant", &all))
        .unwrap()
    {
        assert!(!d.exists(&key).await, "{key} reset");
    }

    // Derived keys only: an untagged user key becomes the tag of its limits.
    let plain = format!("{}user", prefix("multi_plain"));
    let derived = MultiLimiter::new(Algorithm::Gcra)
        .limit("second", Quota::per_second(10).unwrap())
        .unwrap()
        .limit("minute", Quota::per_minute(100).unwrap())
        .unwrap();
    let r = derived.check(&mut conn, &plain, 2).await.unwrap();
    assert_eq!((r.allowed, r.limits[0].remaining), (true, 8));
    for key in derived.keys(&(&plain).into()).unwrap() {
        assert_eq!(
            key,
            nolock::keys::derive(&plain, key.rsplit(':').next().unwrap())
        );
        assert!(d.exists(&key).await, "{key}");
    }
}

async fn a_multi_limit_across_slots_is_refused_before_anything_is_sent(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cross_slot");
    let user = format!("{{{p}a}}:user");
    // A shared key whose tag hashes to another slot than the user's.
    let shared = (0..)
        .map(|i| format!("{{{p}b{i}}}:all"))
        .find(|k| nolock::keys::slot(k) != nolock::keys::slot(&user))
        .unwrap();
    let multi = MultiLimiter::new(Algorithm::Gcra)
        .limit("second", Quota::per_second(10).unwrap())
        .unwrap()
        .shared_limit("tenant", Quota::per_second(100).unwrap())
        .unwrap();
    // Alone on the deployment: command counts are this test's.
    let counted = ["evalsha", "evalsha_ro", "eval", "eval_ro", "del"];
    let mut before = Vec::new();
    for cmd in counted {
        before.push(d.calls_on_primaries(cmd).await);
    }

    let errors = [
        multi
            .check(&mut conn, MultiKey::new(&user).shared("tenant", &shared), 1)
            .await
            .unwrap_err(),
        multi
            .peek(&mut conn, MultiKey::new(&user).shared("tenant", &shared), 1)
            .await
            .unwrap_err(),
        multi
            .reset(&mut conn, MultiKey::new(&user).shared("tenant", &shared))
            .await
            .unwrap_err(),
    ];
    for err in &errors {
        match err {
            Error::CrossSlot {
                first,
                first_slot,
                second,
                second_slot,
            } => {
                assert_eq!(*first, nolock::keys::derive(&user, "second"));
                assert_eq!(*second, shared);
                assert_ne!(first_slot, second_slot);
            }
            other => panic!("expected CrossSlot, got {other}"),
        }
        assert!(err.is_invalid_input() && err.is_definite());
        assert!(err.to_string().contains("hash tag"), "{err}");
    }

    for mut node in d.nodes().await {
        assert!(keys(&mut node, &format!("*{p}*")).await.is_empty());
    }
    for (cmd, before) in counted.into_iter().zip(before) {
        assert_eq!(
            d.calls_on_primaries(cmd).await,
            before,
            "{cmd}: nothing sent"
        );
    }
}

// ---------------------------------------------------------------- cas

async fn versioned_values_write_once_per_version(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}cfg", prefix("versioned"));
    let v1 = vec!["eu".to_owned()];
    let v2 = vec!["eu".to_owned(), "us".to_owned()];

    let none: Option<Versioned<Vec<String>>> = cas::get_versioned(&mut conn, &key).await.unwrap();
    assert_eq!(none, None);
    let w = cas::set_if_version(&mut conn, &key, 0, &v1).await.unwrap();
    assert_eq!(w, Update::Written { version: 1 });
    let stale = cas::set_if_version(&mut conn, &key, 0, &v2).await.unwrap();
    assert_eq!(
        stale,
        Update::Conflict {
            current: Some(Versioned {
                value: v1.clone(),
                version: 1
            })
        }
    );
    let w = cas::set_if_version(&mut conn, &key, 1, &v2).await.unwrap();
    assert_eq!(w, Update::Written { version: 2 });
    let read = cas::get_versioned::<Vec<String>, _>(&mut conn, &key)
        .await
        .unwrap();
    assert_eq!(
        read,
        Some(Versioned {
            value: v2,
            version: 2
        })
    );
    assert!(d.exists(&key).await);
}

async fn debit_and_credit_stay_within_their_bounds(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}stock", prefix("balance"));

    let refused = cas::debit(&mut conn, &key, 1).await.unwrap();
    assert_eq!(refused, Adjustment::Insufficient { balance: 0 });
    assert!(!d.exists(&key).await, "a refused debit creates nothing");

    let c = cas::credit(&mut conn, &key, 10, Some(12)).await.unwrap();
    assert_eq!(c, Adjustment::Applied { balance: 10 });
    let c = cas::credit(&mut conn, &key, 3, Some(12)).await.unwrap();
    assert_eq!(c, Adjustment::AboveCeiling { balance: 10 });
    let t = cas::debit(&mut conn, &key, 4).await.unwrap();
    assert_eq!(t, Adjustment::Applied { balance: 6 });
    let t = cas::debit(&mut conn, &key, 7).await.unwrap();
    assert_eq!(t, Adjustment::Insufficient { balance: 6 });
    let t = cas::adjust(&mut conn, &key, -8, -5..).await.unwrap();
    assert_eq!(t, Adjustment::Applied { balance: -2 }, "an overdraft line");

    assert_eq!(d.get(&key).await.as_deref(), Some("-2"));
}

async fn compare_and_set_family_and_watermarks(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("compare");
    let (job, idem, mark) = (format!("{p}job"), format!("{p}idem"), format!("{p}mark"));

    let set = cas::compare_and_set(&mut conn, &job, Expected::Absent, "queued", None);
    assert_eq!(set.await.unwrap(), Outcome::Applied);
    let moved = cas::compare_and_set(&mut conn, &job, Expected::value("queued"), "running", None);
    assert_eq!(moved.await.unwrap(), Outcome::Applied);
    let late = cas::compare_and_set(&mut conn, &job, Expected::value("queued"), "running", None);
    assert_eq!(
        late.await.unwrap(),
        Outcome::Mismatch {
            current: Some(b"running".to_vec())
        }
    );
    let expire = cas::compare_and_expire(&mut conn, &job, "running", MINUTE);
    assert_eq!(expire.await.unwrap(), Outcome::Applied);
    let mut owner = d.owner(&job).await;
    let ttl: i64 = raw(&mut owner, &["PTTL", &job]).await;
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    let wrong = cas::compare_and_delete(&mut conn, &job, "queued")
        .await
        .unwrap();
    assert!(!wrong.is_applied());
    let deleted = cas::compare_and_delete(&mut conn, &job, "running").await;
    assert_eq!(deleted.unwrap(), Outcome::Applied);
    assert!(!d.exists(&job).await);

    let first = cas::set_if_absent(&mut conn, &idem, "201", Some(MINUTE)).await;
    assert_eq!(first.unwrap(), Insert::Inserted);
    let retry = cas::set_if_absent(&mut conn, &idem, "other", None).await;
    assert_eq!(retry.unwrap(), Insert::Existing(b"201".to_vec()));

    let m = cas::set_if_greater(&mut conn, &mark, 10).await.unwrap();
    assert!(m.applied && m.value == 10);
    let m = cas::set_if_greater(&mut conn, &mark, 7).await.unwrap();
    assert!(!m.applied && m.value == 10);
    let m = cas::set_if_less(&mut conn, &mark, 7).await.unwrap();
    assert!(m.applied && m.value == 7);
}

async fn concurrent_debits_never_overdraw(d: &Deployment) {
    let key = format!("{{{}}}:balance", prefix("concurrent_debits"));
    let mut conn = d.conn().await;
    let c = cas::credit(&mut conn, &key, 60, None).await.unwrap();
    assert!(c.is_applied());
    let results = d
        .race(100, |mut conn| {
            let key = key.clone();
            async move { cas::debit(&mut conn, &key, 1).await.unwrap() }
        })
        .await;
    let mut balances_after = BTreeSet::new();
    let mut refused = 0;
    for result in results {
        match result {
            Adjustment::Applied { balance } => {
                assert!(balances_after.insert(balance), "{balance} seen twice")
            }
            Adjustment::Insufficient { balance } => {
                assert_eq!(balance, 0);
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(balances_after, (0..60).collect());
    assert_eq!(refused, 40);
    assert_eq!(d.get(&key).await.as_deref(), Some("0"));
}

// ---------------------------------------------------------------- fence

async fn fence_acquire_extend_release_and_fences_rise(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}report", prefix("fence"));
    let lock = nolock::keys::derive(&resource, "lock");
    let counter = nolock::keys::derive(&resource, "fence");
    assert_eq!(d.owner_port(&lock).await, d.owner_port(&counter).await);

    let mut last = 0;
    for round in 1..=3 {
        let mut g = grant(
            nolock::fence::Lock::new(MINUTE)
                .expect("a valid lock TTL")
                .acquire(&mut conn, &resource)
                .await
                .unwrap(),
        );
        assert!(
            g.fence().number() > last,
            "round {round}: {} after {last}",
            g.fence().number()
        );
        last = g.fence().number();
        let held = nolock::fence::Lock::new(MINUTE)
            .expect("a valid lock TTL")
            .acquire(&mut conn, &resource)
            .await
            .unwrap();
        assert!(matches!(held, LockAttempt::Held { expires_in: Some(t) } if t <= MINUTE));

        let extended = g.extend(&mut conn).await;
        assert!(matches!(extended.unwrap(), LockExtend::Extended { .. }));
        let held_by = format!("{}:{}", g.fence().number(), g.token().as_str());
        assert_eq!(d.get(&lock).await.as_deref(), Some(held_by.as_str()));

        // The grant's calls as values, so that they can be sent again.
        let (release, extend) = (fence::ReleaseLock::new(&g), fence::ExtendLock::new(&g));
        let released = g.release(&mut conn).await;
        assert_eq!(released.unwrap(), LockRelease::Released);
        let mut again = nolock::Batch::new();
        again.push(release);
        let again = again.run(&mut conn).await.pop().unwrap();
        assert_eq!(again.unwrap(), LockRelease::Lost);
        let mut lost = nolock::Batch::new();
        lost.push(extend);
        let lost = lost.run(&mut conn).await.pop().unwrap();
        assert_eq!(lost.unwrap().outcome(), LockExtend::Lost);
        assert!(!d.exists(&lock).await);
    }
    assert_eq!(last, 3);
    assert_eq!(d.get(&counter).await.as_deref(), Some("3"));
}

/// `advance` reads the lock and the counter on the node that owns both
/// (one slot), leaves a live holder alone, and raises once it is gone;
/// `force_advance` raises under it.
async fn advance_waits_for_no_holder_and_force_advance_does_not(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}payout", prefix("advance"));
    let lock = nolock::fence::Lock::new(MINUTE).expect("a valid lock TTL");
    let g = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    let held = fence::advance(&mut conn, &resource, 1).await.unwrap();
    assert!(
        matches!(
            held,
            AdvanceAttempt::Held {
                counter: 1,
                expires_in: Some(_)
            }
        ),
        "{held:?}"
    );
    assert_eq!(
        g.fence().write(&mut conn, "a").await.unwrap(),
        Write::Applied
    );
    let forced = fence::force_advance(&mut conn, &resource, 1).await.unwrap();
    assert_eq!((forced.raised, forced.counter), (true, 2));
    assert_eq!(
        g.fence().write(&mut conn, "b").await.unwrap(),
        Write::Stale { current_fence: 2 }
    );
    assert_eq!(g.release(&mut conn).await.unwrap(), LockRelease::Released);
    let free = fence::advance(&mut conn, &resource, 9).await.unwrap();
    assert_eq!(
        free,
        AdvanceAttempt::Advanced(fence::Advance {
            raised: true,
            counter: 10
        })
    );
    assert_eq!(
        d.get(&nolock::keys::derive(&resource, "fence"))
            .await
            .as_deref(),
        Some("10")
    );
}

async fn fenced_writes_refuse_older_fences(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}balance", prefix("fenced_write"));

    assert_eq!(fence::read(&mut conn, &resource).await.unwrap(), None);
    let first = grant(
        nolock::fence::Lock::new(MINUTE)
            .expect("a valid lock TTL")
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    let first_fence = first.fence().number();
    let r = first.release(&mut conn).await;
    assert_eq!(r.unwrap(), LockRelease::Released);
    let g = grant(
        nolock::fence::Lock::new(MINUTE)
            .expect("a valid lock TTL")
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert_eq!((first_fence, g.fence().number()), (1, 2));
    let w = fence_of(&resource, 2).write(&mut conn, "a").await.unwrap();
    assert_eq!(w, Write::Applied);
    let w = fence_of(&resource, 2).write(&mut conn, "b").await.unwrap();
    assert_eq!(w, Write::Applied, "the same grant writes again");
    let w = fence_of(&resource, 1)
        .write(&mut conn, "late")
        .await
        .unwrap();
    assert_eq!(w, Write::Stale { current_fence: 2 });
    let w = fence_of(&resource, 3)
        .write(&mut conn, "never granted")
        .await;
    assert_eq!(w.unwrap(), Write::NotGranted { counter: 2 });
    let read = fence::read(&mut conn, &resource).await.unwrap().unwrap();
    assert_eq!((read.value.as_slice(), read.fence), (&b"b"[..], 2));
    assert!(d.exists(&nolock::keys::derive(&resource, "value")).await);

    // The weaker form, at a key in another slot.
    let key = format!("{}elsewhere", prefix("fenced_write"));
    let w = fence_of("unbound", 2)
        .write_unbound(&mut conn, &key, "a")
        .await
        .unwrap();
    assert_eq!(w, Write::Applied);
    let w = fence_of("unbound", 1)
        .write_unbound(&mut conn, &key, "late")
        .await
        .unwrap();
    assert_eq!(w, Write::Stale { current_fence: 2 });
    let read = fence::read_unbound(&mut conn, &key).await.unwrap().unwrap();
    assert_eq!((read.value.as_slice(), read.fence), (&b"a"[..], 2));
}

async fn a_lease_renews_on_the_deployment_connection(d: &Deployment) {
    let conn = d.conn().await;
    let resource = format!("{}r", prefix("lease"));
    let lock = nolock::keys::derive(&resource, "lock");
    let mut owner = d.owner(&lock).await;
    let ttl = Duration::from_millis(300);

    let lease = nolock::fence::Lock::new(ttl)
        .expect("a valid lock TTL")
        .lease(conn, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("a free lock");
    let first_deadline = lease.deadline();
    // Hold it for more than 3 TTLs: the renewals keep the lock.
    let start = Instant::now();
    while start.elapsed() < 3 * ttl + Duration::from_millis(100) {
        let holder: Option<String> = raw(&mut owner, &["GET", &lock]).await;
        assert_eq!(
            holder,
            Some(format!(
                "{}:{}",
                lease.fence().number(),
                lease.token().as_str()
            )),
            "lapsed after {:?}",
            start.elapsed()
        );
        assert!(!lease.is_lost(), "{:?}", lease.loss());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(lease.deadline() > first_deadline, "renewed");
    assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
    assert!(!d.exists(&lock).await);
}

// ---------------------------------------------------------------- all

async fn a_waiter_is_woken_by_a_release_through_any_node(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}job", prefix("woken"));
    // On a cluster, listen on a node that does not own the resource: PUBLISH
    // in a script is broadcast over the cluster bus.
    let port = match d {
        Deployment::Single(server) => server.port,
        Deployment::Cluster(cluster) => {
            let owner = cluster
                .shard_of(&nolock::keys::derive(&resource, "lock"))
                .await;
            cluster
                .ports()
                .into_iter()
                .find(|p| *p != owner.primary && !owner.replicas.contains(p))
                .expect("another shard")
        }
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let waiters = fence::Waiters::new(&client).await.unwrap();
    let held = grant(
        nolock::fence::Lock::new(MINUTE)
            .expect("a valid lock TTL")
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    // Without the wake-up, the waiter would sleep 20 s.
    let slow = Backoff {
        initial_delay: Duration::from_secs(20),
        max_delay: Duration::from_secs(20),
        ..Backoff::new(Duration::from_secs(30))
    };
    let mut waiter_conn = d.conn().await;
    let resource2 = resource.clone();
    let waiter = tokio::spawn(async move {
        let out = waiters
            .acquire(
                &mut waiter_conn,
                &fence::Lock::new(MINUTE).unwrap().with_wait(slow),
                &resource2,
            )
            .await;
        (out.unwrap(), std::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "waits while held");
    let released = std::time::Instant::now();
    let held_fence = held.fence().number();
    let r = held.release(&mut conn).await;
    assert_eq!(r.unwrap(), LockRelease::Released);
    let (outcome, got) = waiter.await.unwrap();
    assert_eq!(grant(outcome).fence().number(), held_fence + 1);
    assert!(got.duration_since(released) < Duration::from_secs(10));
}

/// Script caches emptied on every node, then one call of each module's main
/// operations: each runs exactly once, after a `SCRIPT LOAD` pipelined to
/// its node the first time a script is needed there (never as `EVAL`).
async fn every_module_recovers_a_script_flush_on_every_node(d: &Deployment) {
    let mut conn = d.conn().await;
    // One tag: every key on one node, whose `SCRIPT LOAD`s this test can count.
    let tag = format!("{{{}}}", prefix("flush_modules"));
    let key = |part: &str| format!("{tag}:{part}");
    let mut owner = d.owner(&tag).await;
    let evals = |mut c: MultiplexedConnection| async move {
        support::command_calls(&mut c, "eval").await
            + support::command_calls(&mut c, "eval_ro").await
    };
    let loads = |mut c: MultiplexedConnection| async move {
        support::command_calls(&mut c, "script|load").await
    };
    d.flush_scripts_everywhere().await;
    let before = evals(owner.clone()).await;
    let loads_before = loads(owner.clone()).await;

    // rate: gcra/check (twice: the second finds it cached), sliding_window/check
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_minute(5).unwrap()).unwrap();
    for remaining in [4, 3] {
        let r = limiter.check(&mut conn, &key("rl"), 1).await.unwrap();
        assert_eq!((r.allowed, r.remaining), (true, remaining), "ran once");
    }
    let multi = MultiLimiter::new(Algorithm::SlidingWindow)
        .limit("minute", Quota::per_minute(5).unwrap())
        .unwrap()
        .shared_limit("all", Quota::per_minute(9).unwrap())
        .unwrap();
    let r = multi
        .check(
            &mut conn,
            MultiKey::new(&key("u")).shared("all", &key("all")),
            2,
        )
        .await;
    assert_eq!(r.unwrap().remaining(), 3);

    // cas: set_if_version, get_versioned (read-only), adjust (credit, debit)
    let w = cas::set_if_version(&mut conn, &key("v"), 0, &7u32).await;
    assert_eq!(w.unwrap(), Update::Written { version: 1 });
    let v = cas::get_versioned::<u32, _>(&mut conn, &key("v")).await;
    assert_eq!(
        v.unwrap(),
        Some(Versioned {
            value: 7,
            version: 1
        })
    );
    let c = cas::credit(&mut conn, &key("b"), 5, None).await.unwrap();
    assert_eq!(c, Adjustment::Applied { balance: 5 });
    let t = cas::debit(&mut conn, &key("b"), 2).await.unwrap();
    assert_eq!(t, Adjustment::Applied { balance: 3 });

    // fence: acquire, extend, write, read (read-only), release
    let resource = key("job");
    let mut g = grant(
        nolock::fence::Lock::new(MINUTE)
            .expect("a valid lock TTL")
            .acquire(&mut conn, &resource)
            .await
            .unwrap(),
    );
    assert_eq!(g.fence().number(), 1);
    let e = g.extend(&mut conn).await;
    assert!(matches!(e.unwrap(), LockExtend::Extended { .. }));
    let w = g.fence().write(&mut conn, "x").await;
    assert_eq!(w.unwrap(), Write::Applied);
    let read = fence::read(&mut conn, &resource).await.unwrap().unwrap();
    assert_eq!(read.fence, 1);
    let r = g.release(&mut conn).await;
    assert_eq!(r.unwrap(), LockRelease::Released);

    // Alone on the deployment: one SCRIPT LOAD per script, on the tag's node.
    let scripts = [
        "gcra/check",
        "sliding_window/check",
        "set_if_version",
        "get_versioned",
        "adjust",
        "acquire",
        "extend",
        "write",
        "read",
        "release",
    ];
    assert_eq!(
        loads(owner.clone()).await - loads_before,
        scripts.len() as u64
    );
    assert_eq!(evals(owner.clone()).await, before, "no EVAL");
    for name in [
        "rate/gcra/check",
        "cas/adjust",
        "fence/acquire",
        "fence/read",
    ] {
        let script = nolock::Scripts::all()
            .iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("{name}"));
        let cached: Vec<bool> = raw(&mut owner, &["SCRIPT", "EXISTS", script.sha1()]).await;
        assert_eq!(cached, [true], "{name} loaded again");
    }
}

// ---------------------------------------------------------------- batches

/// 1,000 rate checks in one batch and the same 1,000 as single calls, on two
/// key sets of the same shape, decide the same. Keys repeat (4 uses of 250
/// keys, costs 1 to 3 against a burst of 3), so order inside the batch
/// matters; hourly quotas keep a few seconds of test from refilling a unit.
async fn a_batch_of_rate_checks_gives_the_same_results_as_single_calls(d: &Deployment) {
    let mut conn = d.conn().await;
    let limiters: Vec<Limiter> = [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ]
    .into_iter()
    .map(|a| Limiter::new(a, Quota::per_hour(3).unwrap()).unwrap())
    .collect();
    let entry = |p: &str, i: usize| {
        let k = i % 250;
        (&limiters[k % 3], format!("{p}{k}"), 1 + (i % 3) as u64)
    };
    let (batched, single) = (prefix("rate_batched"), prefix("rate_single"));
    let batch: Batch<Check> = (0..1000)
        .map(|i| {
            let (limiter, key, cost) = entry(&batched, i);
            Check::new(limiter, &key, cost).unwrap()
        })
        .collect();
    let batch_results = batch.run(&mut conn).await;

    let mut single_results = Vec::new();
    for i in 0..1000 {
        let (limiter, key, cost) = entry(&single, i);
        single_results.push(limiter.check(&mut conn, &key, cost).await.unwrap());
    }
    assert_eq!(batch_results.len(), 1000);
    let mut allowed = 0;
    for (i, (b, s)) in batch_results.into_iter().zip(&single_results).enumerate() {
        let b = b.unwrap_or_else(|e| panic!("entry {i}: {e}"));
        assert_eq!(
            (b.allowed, b.limit, b.remaining, b.retry_after.is_some()),
            (s.allowed, s.limit, s.remaining, s.retry_after.is_some()),
            "entry {i}"
        );
        allowed += u64::from(b.allowed);
    }
    assert!(allowed > 250 && allowed < 1000, "{allowed}: a mix of both");
    for k in [0, 1, 2, 249] {
        assert!(
            d.exists(&format!("{batched}{k}")).await,
            "key {k} on its owner"
        );
    }
}

/// The kinds of balance change the adjustment batch test makes.
#[derive(Clone, Copy)]
enum Change {
    Credit(u64, i64),
    Debit(u64),
    Overdraft(i64, i64),
}

/// 1,000 debits, credits and adjustments in one batch and as single calls,
/// on two key sets of the same shape (200 balances, 5 changes each), give
/// the same outcomes in the same order and leave the same balances.
async fn a_batch_of_adjustments_gives_the_same_results_as_single_calls(d: &Deployment) {
    let mut conn = d.conn().await;
    let change = |i: usize| {
        let k = i % 200;
        let change = match i / 200 {
            0 => Change::Credit(5, 8),
            1 => Change::Debit(3 + (k % 3) as u64),
            2 => Change::Credit(4, 8),
            3 => Change::Debit(4),
            _ => Change::Overdraft(-3 - (k % 4) as i64, -2),
        };
        (k, change)
    };
    let (batched, single) = (prefix("adjust_batched"), prefix("adjust_single"));
    let batch: Batch<Adjust> = (0..1000)
        .map(|i| {
            let (k, change) = change(i);
            let key = format!("{batched}{k}");
            match change {
                Change::Credit(amount, ceiling) => Adjust::credit(&key, amount, Some(ceiling)),
                Change::Debit(amount) => Adjust::debit(&key, amount),
                Change::Overdraft(delta, floor) => Adjust::new(&key, delta, floor..),
            }
            .unwrap()
        })
        .collect();
    let batch_results = batch.run(&mut conn).await;

    let mut single_results = Vec::new();
    for i in 0..1000 {
        let (k, change) = change(i);
        let key = format!("{single}{k}");
        let result = match change {
            Change::Credit(amount, ceiling) => {
                cas::credit(&mut conn, &key, amount, Some(ceiling)).await
            }
            Change::Debit(amount) => cas::debit(&mut conn, &key, amount).await,
            Change::Overdraft(delta, floor) => cas::adjust(&mut conn, &key, delta, floor..).await,
        };
        single_results.push(result.unwrap());
    }
    let mut applied = 0;
    for (i, (b, s)) in batch_results.into_iter().zip(&single_results).enumerate() {
        let b = b.unwrap_or_else(|e| panic!("entry {i}: {e}"));
        assert_eq!(b, *s, "entry {i}");
        applied += u64::from(b.is_applied());
    }
    assert!(applied > 200 && applied < 1000, "{applied}: a mix of both");
    for k in [0, 1, 2, 3, 199] {
        let key = format!("{batched}{k}");
        let expected = single_results[800 + k].balance().to_string();
        assert_eq!(d.get(&key).await, Some(expected), "{key}");
    }
}

async fn a_flush_between_batches_of_rate_checks_is_recovered(d: &Deployment) {
    let p = prefix("rate_flush");
    let quota = Quota::per_hour(10).unwrap();
    let gcra = Limiter::new(Algorithm::Gcra, quota).unwrap();
    let fixed = Limiter::new(Algorithm::FixedWindow, quota).unwrap();
    let batch: Batch<Check> = (0..500)
        .map(|i| {
            let limiter = if i % 2 == 0 { &gcra } else { &fixed };
            Check::new(limiter, &format!("{p}{i}"), 2).unwrap()
        })
        .collect();
    // Each run takes 2 more: no check ran twice, none was lost.
    run_batch_through_a_flush(d, &batch, |run, r| {
        r.allowed && r.remaining == 8 - 2 * run as u64
    })
    .await;
}

async fn a_flush_between_batches_of_adjustments_is_recovered(d: &Deployment) {
    let p = prefix("adjust_flush");
    let keys: Vec<String> = (0..500).map(|i| format!("{p}{i}")).collect();
    let batch: Batch<Adjust> = keys
        .iter()
        .map(|k| Adjust::credit(k, 5, None).unwrap())
        .collect();
    run_batch_through_a_flush(d, &batch, |run, a| {
        *a == Adjustment::Applied {
            balance: 5 * (run as i64 + 1),
        }
    })
    .await;
    for key in keys.iter().step_by(50) {
        assert_eq!(d.get(key).await.as_deref(), Some("15"), "{key}");
    }
}

// ---------------------------------------------------------------- durability

/// `fence::cluster_durability` reads every primary, each on its own: one
/// primary whose fsync is skipped during rewrites is named as such, the
/// others not, and every primary with a replica can go back by failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_durability_reads_every_primary() {
    let _cache = support::deployment::CLUSTER_ACCESS.read().await;
    let cluster = support::cluster::RedisCluster::shared();
    let mut conn = cluster.conn().await;
    let shards = cluster.shards().await;
    let weakened = shards[0].primary;
    let mut node = cluster.node(weakened).await;
    let set = |value: &'static str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("no-appendfsync-on-rewrite").arg(value);
        cmd
    };
    let _: () = set("yes").query_async(&mut node).await.unwrap();
    let reports = fence::cluster_durability(&mut conn).await;
    let _: () = set("no").query_async(&mut node).await.unwrap();
    let reports = reports.unwrap();

    let mut primaries: Vec<u16> = shards.iter().map(|s| s.primary).collect();
    primaries.sort_unstable();
    let ports: Vec<u16> = reports
        .iter()
        .map(|(node, _)| node.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let mut sorted = ports.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, primaries, "one report per primary: {reports:?}");
    for (port, (node, report)) in ports.iter().zip(&reports) {
        assert_eq!(report.role, "master", "{node}");
        assert!(report.connected_replicas >= 1, "{node}: {report:?}");
        assert!(report.failover_can_go_back() && report.fences_can_go_back());
        assert_eq!(
            report.no_appendfsync_on_rewrite,
            Some(*port == weakened),
            "{node}"
        );
        // The cluster's nodes run without persistence.
        assert!(
            matches!(
                report.restart,
                fence::Restart::LosesAll | fence::Restart::LosesSinceSnapshot
            ),
            "{node}: {report:?}"
        );
    }
}
