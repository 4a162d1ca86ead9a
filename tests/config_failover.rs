//! Stored configurations (`nolock::config`) through a failover of the
//! registry's primary on the local 3×2 cluster: a declared configuration
//! survives, an operator's change and block made after the failover reach
//! every handle of two clients within 1 s, and a handle whose first call
//! falls in or after the failover declares and reads its configuration.
//!
//! Each test starts its own cluster: it changes the topology.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nolock::client::{RateLimit, Rejection};
use nolock::config::{Change, Family, Mode, Spec, REGISTRY_KEY};
use nolock::rate::{Algorithm, Quota};
use nolock::{Client, Error};
use support::cluster::RedisCluster;

/// How long every handle may take to follow a change made after the
/// failover.
const FOLLOW: Duration = Duration::from_secs(1);

fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{base}-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// A client with the default poll (250 ms): the bound a deployment gets.
async fn client(cluster: &RedisCluster) -> Client {
    Client::connect_cluster(cluster.urls()).await.unwrap()
}

fn per_minute(n: u64) -> Quota {
    Quota::per_minute(n).unwrap()
}

/// The burst `handle` decides `id` by now (admitted or limited).
async fn burst(handle: &RateLimit, id: &str) -> Result<u64, Error> {
    match handle.check(id).await {
        Ok(admitted) => Ok(admitted.limit),
        Err(Rejection::Limited(limited)) => Ok(limited.limit),
        Err(Rejection::Failed(e)) => Err(e),
        Err(other) => panic!("{other:?}"),
    }
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

/// The stored value of `field`, read from the node `port` itself.
async fn stored_on(cluster: &RedisCluster, port: u16, field: &str) -> Option<String> {
    let mut node = cluster.node(port).await;
    redis::cmd("HGET")
        .arg(REGISTRY_KEY)
        .arg(field)
        .query_async(&mut node)
        .await
        .unwrap()
}

/// Runs `op` again while it fails with an error a failover can cause (a
/// lost or refused request; nothing else), for at most 5 s; answers its
/// result and the errors it saw on the way.
async fn through_failover<T, F, Fut>(mut op: F) -> (T, Vec<String>)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        match op().await {
            Ok(v) => return (v, seen),
            Err(e @ (Error::Indeterminate(_) | Error::Redis(_)))
                if start.elapsed() < Duration::from_secs(5) =>
            {
                seen.push(e.to_string());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("after {:?} and {seen:?}: {e}", start.elapsed()),
        }
    }
}

/// Two clients' handles decide by a declared configuration; the registry's
/// primary fails over; the declaration is on the new primary; an operator
/// changes the numbers, then blocks the name, and both handles follow
/// each within [`FOLLOW`].
///
/// What happens: the operator's client last saw the old topology; every
/// registry read and write is a script (`config/read`, `config/put`), and
/// nolock resends a script's redirect itself, so the `set` and the `block`
/// after the failover succeed at once, with no error on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_after_the_registry_fails_over_reaches_every_handle() {
    let cluster = RedisCluster::start();
    let name = unique("api");
    let field = format!("rate-limit:{name}");
    let (a, b, operator) = (
        client(&cluster).await,
        client(&cluster).await,
        client(&cluster).await,
    );
    let first = a.rate_limit(&name, per_minute(5)).unwrap();
    // Built with other numbers: decides by the declared ones.
    let second = b.rate_limit(&name, per_minute(7)).unwrap();
    assert_eq!(burst(&first, "u").await.unwrap(), 5);
    assert_eq!(burst(&second, "u").await.unwrap(), 5);

    // No `WAIT` before the failover: `CLUSTER FAILOVER` without FORCE or
    // TAKEOVER is coordinated, the replica takes over only once it has
    // every write its primary acknowledged. So the declaration cannot be
    // lost here (with FORCE it could: nolock's registry writes do not
    // `WAIT`), and the test shows it is on the new primary.
    let (old, new) = cluster.failover(REGISTRY_KEY).await;
    let survived = stored_on(&cluster, new, &field).await;
    assert!(
        survived
            .as_deref()
            .is_some_and(|v| v.contains("\"burst\":5")),
        "the declaration on the new primary :{new} (was :{old}): {survived:?}"
    );

    let configs = operator.configs();
    let spec = Spec::rate_limit(Algorithm::Gcra, per_minute(10));
    let (set, errors) = through_failover(|| configs.set(&name, spec.clone(), Change::Keep)).await;
    assert!(errors.is_empty(), "set after the failover: {errors:?}");
    assert_eq!((set.spec, set.mode), (spec, Mode::Normal));
    let started = Instant::now();
    for handle in [&first, &second] {
        let took = within(started, FOLLOW, || async {
            burst(handle, "v").await.is_ok_and(|b| b == 10)
        })
        .await;
        println!("a handle decides by the new numbers {took:?} after the change");
    }
    // Keep, same period: "u" used 2 of 5, so 4 of 10 (less what drained
    // since, one unit per 6 s), and this call takes one more.
    match first.check("u").await {
        Ok(admitted) => assert!((5..=6).contains(&admitted.remaining), "{admitted:?}"),
        other => panic!("{other:?}"),
    }

    let (blocked, errors) = through_failover(|| configs.block(Family::RateLimit, &name)).await;
    assert!(errors.is_empty(), "block after the failover: {errors:?}");
    assert_eq!(blocked.mode, Mode::Blocked);
    let started = Instant::now();
    for handle in [&first, &second] {
        within(started, FOLLOW, || async {
            matches!(
                handle.check("fresh").await,
                Err(Rejection::Limited(ref l)) if l.retry_after.is_none()
            )
        })
        .await;
    }
    let listed = configs.list().await.unwrap();
    let entry = listed
        .iter()
        .find(|c| c.family == Family::RateLimit && c.name == name)
        .expect("listed");
    assert_eq!(entry.mode, Mode::Blocked);
    assert_eq!(
        entry.spec,
        Spec::rate_limit(Algorithm::Gcra, per_minute(10))
    );
}

/// Handles whose first call (the one that declares) is sent while the
/// registry's primary fails over, and one whose first call comes after it
/// on a client that last saw the old topology.
///
/// What happens: declaring is a script, and nolock follows a script's
/// redirect itself, so in these runs every first call, in the failover or
/// after it on the stale client, decided at once with no error. A call in
/// the switch could still get `Error::Indeterminate` (a lost reply) or
/// `Error::Redis` (refused); nolock does not resend it, but declaring is
/// "store unless stored", so the test sends it again and then requires the
/// same numbers. Every handle decides by the numbers it declared, and
/// those are stored on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_call_in_or_after_the_failover_declares_and_reads() {
    let cluster = RedisCluster::start();
    let during = client(&cluster).await;
    let after = client(&cluster).await;
    // The stale client has made calls before: its slot map is the old one.
    let warm = after.rate_limit(&unique("warm"), per_minute(3)).unwrap();
    assert_eq!(burst(&warm, "u").await.unwrap(), 3);

    let failover = cluster.failover(REGISTRY_KEY);
    let first_calls = async {
        // A fresh name every 20 ms for the length of the failover (its
        // switch takes well under a second; 40 calls cover it).
        let mut outcomes = Vec::new();
        for i in 0..40u64 {
            let name = unique("during");
            let handle = during.rate_limit(&name, per_minute(100 + i)).unwrap();
            outcomes.push((name, 100 + i, burst(&handle, "u").await));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        outcomes
    };
    let ((_, new), outcomes) = tokio::join!(failover, first_calls);
    let failed: Vec<String> = outcomes
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    println!(
        "first calls during the failover: {} decided, errors {failed:?}",
        outcomes.len() - failed.len()
    );
    for (name, declared, outcome) in &outcomes {
        let field = format!("rate-limit:{name}");
        match outcome {
            Ok(b) => {
                // Acknowledged before or after the switch: on the new
                // primary.
                assert_eq!(b, declared);
                let stored = stored_on(&cluster, new, &field).await;
                assert!(
                    stored.is_some_and(|v| v.contains(&format!("\"burst\":{declared}"))),
                    "{name}"
                );
            }
            Err(e) => {
                assert!(
                    matches!(e, Error::Indeterminate(_) | Error::Redis(_)),
                    "{name}: {e}"
                );
                // Again, with a handle of the same numbers: declares them,
                // or reads what an attempt whose reply was lost stored
                // (the same numbers).
                let handle = during.rate_limit(name, per_minute(*declared)).unwrap();
                let (b, _) = through_failover(|| burst(&handle, "u")).await;
                assert_eq!(b, *declared, "{name}");
            }
        }
    }

    // After the failover, on the client that saw the old topology.
    let name = unique("after");
    let handle = after.rate_limit(&name, per_minute(9)).unwrap();
    let (b, errors) = through_failover(|| burst(&handle, "u")).await;
    println!("first call after the failover: errors on the way {errors:?}");
    assert_eq!(b, 9);
    let config = handle.config().await.unwrap();
    assert_eq!(
        config.spec,
        Spec::rate_limit(Algorithm::Gcra, per_minute(9))
    );
    // Another client reads the same stored numbers.
    let other = during.rate_limit(&name, per_minute(1)).unwrap();
    assert_eq!(burst(&other, "w").await.unwrap(), 9);
    assert_eq!(
        during
            .configs()
            .get(Family::RateLimit, &name)
            .await
            .unwrap(),
        Some(config)
    );
}
