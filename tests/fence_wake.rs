//! A lock's release wakes `fence::Waiters` only when someone waits, on a
//! single server and on the local 3x2 cluster: a release nobody waits for
//! publishes nothing; one a waiter waits for wakes it long before its
//! fallback timer; sixteen waiters in two processes, some of which give up
//! or crash (holding the lock or not), all finish within their timeouts;
//! and a `SCRIPT FLUSH` while they wait changes none of it.
//!
//! Waiters mark the resource's waiting flag (`{r}:waiting`, with a TTL of
//! their longest sleep) with every attempt that finds the lock held, and
//! the release publishes only while it exists (`lua/fence/release.lua`).
//! Every waiter here has a fallback of 30 s, so a lost wake-up shows as a
//! wait of 30 s, against the bounds of a few seconds asserted below.

mod support;

use std::time::{Duration, Instant};

use nolock::fence::{Grant, Lock, LockAttempt, LockRelease, Waiters};
use nolock::Backoff;
use support::deployment::{both, AnyConn, Deployment};
use support::prefix;

both!(
    shared: [
        a_release_wakes_its_waiter_long_before_the_fallback,
        sixteen_waiters_that_give_up_or_crash_never_hang,
    ],
    exclusive: [
        a_release_nobody_waits_for_publishes_nothing,
        waiters_are_woken_across_a_script_flush,
    ],
);

const MINUTE: Duration = Duration::from_secs(60);

/// Without a wake-up, a waiter of this backoff sleeps 30 s at a time.
fn slow(timeout: Duration) -> Backoff {
    Backoff {
        initial_delay: Duration::from_secs(30),
        max_delay: Duration::from_secs(30),
        ..Backoff::new(timeout)
    }
}

fn lock(ttl: Duration) -> Lock {
    Lock::new(ttl).unwrap()
}

fn grant(outcome: LockAttempt) -> Grant {
    match outcome {
        LockAttempt::Acquired(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}

fn waiting_key(resource: &str) -> String {
    nolock::keys::derive(resource, "waiting")
}

/// A `Waiters` as a process would open it: on a cluster, through a node
/// that does not own the resource (the release's PUBLISH is broadcast).
async fn waiters(d: &Deployment, resource: &str) -> Waiters {
    let port = match d {
        Deployment::Single(server) => server.port,
        Deployment::Cluster(cluster) => {
            let owner = cluster
                .shard_of(&nolock::keys::derive(resource, "lock"))
                .await;
            cluster
                .ports()
                .into_iter()
                .find(|p| *p != owner.primary && !owner.replicas.contains(p))
                .expect("another shard")
        }
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    Waiters::new(&client).await.unwrap()
}

async fn release(conn: &mut AnyConn, grant: Grant) {
    assert_eq!(grant.release(conn).await.unwrap(), LockRelease::Released);
}

/// Wait (bounded) until the owner of `key` no longer has it.
async fn wait_gone(d: &Deployment, key: &str) {
    let start = Instant::now();
    while d.exists(key).await {
        assert!(start.elapsed() < Duration::from_secs(5), "{key} stayed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The pair costs no PUBLISH while nobody waits; a waiter that gave up
/// leaves its flag for at most its longest sleep, during which a release
/// still publishes, and after which it does not.
async fn a_release_nobody_waits_for_publishes_nothing(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}quiet", prefix("wake"));
    let locks = lock(MINUTE);
    let before = d.calls_on_primaries("publish").await;
    for _ in 0..5 {
        let g = grant(locks.acquire(&mut conn, &resource).await.unwrap());
        release(&mut conn, g).await;
    }
    assert_eq!(d.calls_on_primaries("publish").await, before, "no waiter");
    assert!(!d.exists(&waiting_key(&resource)).await);

    // A waiter that gives up after 300 ms (its sleeps are capped by that).
    let held = grant(locks.acquire(&mut conn, &resource).await.unwrap());
    let waiters = waiters(d, &resource).await;
    let mut waiter_conn = d.conn().await;
    let gave_up = waiters
        .acquire(
            &mut waiter_conn,
            &locks.clone().with_wait(slow(Duration::from_millis(300))),
            &resource,
        )
        .await
        .unwrap();
    assert!(!gave_up.is_acquired());
    assert!(d.exists(&waiting_key(&resource)).await, "the flag it set");
    release(&mut conn, held).await;
    assert_eq!(
        d.calls_on_primaries("publish").await,
        before + 1,
        "its flag still lives"
    );

    // The flag outlived the waiter by at most its longest sleep.
    wait_gone(d, &waiting_key(&resource)).await;
    let g = grant(locks.acquire(&mut conn, &resource).await.unwrap());
    release(&mut conn, g).await;
    assert_eq!(d.calls_on_primaries("publish").await, before + 1);
}

async fn a_release_wakes_its_waiter_long_before_the_fallback(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}woken", prefix("wake"));
    let held = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    let waiters = waiters(d, &resource).await;
    let mut waiter_conn = d.conn().await;
    let name = resource.clone();
    let waiter = tokio::spawn(async move {
        let outcome = waiters
            .acquire(
                &mut waiter_conn,
                &lock(MINUTE).with_wait(slow(MINUTE)),
                &name,
            )
            .await
            .unwrap();
        (grant(outcome), Instant::now())
    });
    // Its first attempt has set the flag (the lock is held for a minute).
    let start = Instant::now();
    while !d.exists(&waiting_key(&resource)).await {
        assert!(start.elapsed() < Duration::from_secs(5), "no flag");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!waiter.is_finished(), "waits while held");
    let fence = held.fence().number();
    let released = Instant::now();
    release(&mut conn, held).await;
    let (got, at) = waiter.await.unwrap();
    assert_eq!(got.fence().number(), fence + 1);
    let took = at.duration_since(released);
    assert!(took < Duration::from_secs(5), "woken after {took:?}");
    release(&mut conn, got).await;
}

/// What one waiter does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    /// Waits up to 20 s, holds the grant 20 ms, releases it.
    Take,
    /// Gives up after 100 ms, before the first release.
    GiveUp,
    /// Its task is aborted while it waits.
    Crash,
    /// Takes the lock and never releases it (a 700 ms TTL).
    CrashHolding,
}

/// The wait of a herd's waiter: a 2 s fallback, and a timeout of 100 ms
/// for those that give up, 20 s for the others.
fn herd(part: Part) -> Backoff {
    let timeout = match part {
        Part::GiveUp => Duration::from_millis(100),
        _ => Duration::from_secs(20),
    };
    Backoff {
        initial_delay: Duration::from_secs(2),
        max_delay: Duration::from_secs(2),
        ..Backoff::new(timeout)
    }
}

/// Two processes (two `Waiters`), eight waiters each. A waiter that gets
/// the lock hands it over at once; waiters that give up or crash leave
/// flags and subscriptions behind; a holder that crashes leaves the lock
/// to its TTL, and only the fallback timers (2 s here) notice that: no
/// release announces it. Every waiter ends within its timeout.
async fn sixteen_waiters_that_give_up_or_crash_never_hang(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}herd", prefix("wake"));
    let ttl = Duration::from_millis(700);
    let held = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    let processes = [waiters(d, &resource).await, waiters(d, &resource).await];
    let parts = [
        Part::Take,
        Part::GiveUp,
        Part::Take,
        Part::Crash,
        Part::Take,
        Part::CrashHolding,
        Part::Take,
        Part::Take,
    ];
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, part) in (0..16).map(|i| (i, parts[i % parts.len()])) {
        let waiters = processes[i % 2].clone();
        let mut c = d.conn().await;
        let name = resource.clone();
        let task = tokio::spawn(async move {
            let locks = lock(ttl).with_wait(herd(part));
            let outcome = waiters.acquire(&mut c, &locks, &name).await.unwrap();
            let ended = start.elapsed();
            match (part, outcome) {
                (Part::GiveUp, outcome) => assert!(!outcome.is_acquired(), "{outcome:?}"),
                (Part::CrashHolding, LockAttempt::Acquired(g)) => drop(g),
                (_, LockAttempt::Acquired(g)) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    release(&mut c, g).await;
                }
                (part, held) => panic!("{part:?} ended without the lock: {held:?}"),
            }
            (part, ended)
        });
        tasks.push((part, task));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (part, task) in &tasks {
        if *part == Part::Crash {
            task.abort();
        }
    }
    release(&mut conn, held).await;

    let mut ended = Vec::new();
    for (part, task) in tasks {
        match task.await {
            Ok(result) => ended.push(result),
            Err(e) if part == Part::Crash && e.is_cancelled() => {}
            Err(e) => panic!("{part:?}: {e}"),
        }
    }
    assert_eq!(ended.len(), 14, "every waiter but the crashed ones ended");
    for (part, at) in ended {
        let bound = herd(part).timeout + Duration::from_millis(500);
        assert!(at < bound, "{part:?} ended after {at:?}");
    }
    assert_eq!(
        processes[0].subscriptions() + processes[1].subscriptions(),
        0
    );
}

/// Script caches emptied while a waiter waits: the release and the
/// waiter's next attempt load their scripts again, and the release still
/// sees the flag and wakes it.
async fn waiters_are_woken_across_a_script_flush(d: &Deployment) {
    let mut conn = d.conn().await;
    let resource = format!("{}flush", prefix("wake"));
    let held = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    let waiters = waiters(d, &resource).await;
    let mut waiter_conn = d.conn().await;
    let name = resource.clone();
    let waiter = tokio::spawn(async move {
        let outcome = waiters
            .acquire(
                &mut waiter_conn,
                &lock(MINUTE).with_wait(slow(MINUTE)),
                &name,
            )
            .await
            .unwrap();
        (grant(outcome), Instant::now())
    });
    let start = Instant::now();
    while !d.exists(&waiting_key(&resource)).await {
        assert!(start.elapsed() < Duration::from_secs(5), "no flag");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    d.flush_scripts_everywhere().await;
    let publishes = d.calls_on_primaries("publish").await;
    let released = Instant::now();
    release(&mut conn, held).await;
    assert_eq!(d.calls_on_primaries("publish").await, publishes + 1);
    let (got, at) = waiter.await.unwrap();
    let took = at.duration_since(released);
    assert!(took < Duration::from_secs(5), "woken after {took:?}");
    release(&mut conn, got).await;
}

/// CPU seconds (user + system) one node has used so far.
async fn cpu_seconds(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = support::raw(conn, &["INFO", "cpu"]).await;
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys")
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

/// What a lock's release costs the 3x2 cluster, with and without a
/// waiter's flag (so with and without the PUBLISH the cluster bus
/// broadcasts to every node): CPU per acquire + release pair, summed over
/// the six nodes and over the five that do not own the lock, alternating
/// the two cases in one run. A measurement, not a check: run it alone,
/// `cargo test --test fence_wake -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the CPU of a lock pair on the cluster with and without waiters"]
async fn cluster_cpu_of_a_release_with_and_without_waiters() {
    let _alone = support::deployment::CLUSTER_ACCESS.write().await;
    let d = Deployment::cluster();
    let Deployment::Cluster(cluster) = &d else {
        unreachable!()
    };
    let mut conn = d.conn().await;
    let resource = format!("{}cost", prefix("wake"));
    let flag = waiting_key(&resource);
    let owner_port = d.owner_port(&flag).await;
    let mut owner = d.owner(&flag).await;
    let locks = lock(MINUTE);
    let pairs = 4000;
    println!(
        "| round | without a waiter | with a waiter's flag | ratio | of it, the 5 other nodes |"
    );
    println!("|---|---:|---:|---:|---|");
    for round in 0..6 {
        let mut per_pair = [(0.0, 0.0); 2];
        // Each case first in every other round: drift falls on both.
        let order = [round % 2 == 1, round % 2 == 0];
        for waiting in order {
            let case = usize::from(waiting);
            if waiting {
                let _: () = support::raw(&mut owner, &["SET", &flag, "1", "PX", "600000"]).await;
            } else {
                let _: i64 = support::raw(&mut owner, &["DEL", &flag]).await;
            }
            let mut nodes = cluster.nodes().await;
            let mut before = Vec::new();
            for (_, c) in nodes.iter_mut() {
                before.push(cpu_seconds(c).await);
            }
            for _ in 0..pairs {
                let g = grant(locks.acquire(&mut conn, &resource).await.unwrap());
                release(&mut conn, g).await;
            }
            let (mut all, mut others) = (0.0, 0.0);
            for ((port, c), was) in nodes.iter_mut().zip(before) {
                let used = cpu_seconds(c).await - was;
                all += used;
                if *port != owner_port {
                    others += used;
                }
            }
            per_pair[case] = (all * 1e6 / pairs as f64, others * 1e6 / pairs as f64);
        }
        let [(without, without_others), (with, with_others)] = per_pair;
        println!(
            "| {round} | {without:.1} µs | {with:.1} µs | {:.2} | {without_others:.1} µs / {with_others:.1} µs |",
            with / without
        );
    }
}
