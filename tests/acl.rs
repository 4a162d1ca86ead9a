//! Every module, run as a Redis user that has exactly `nolock::acl::COMMANDS`
//! on its key prefixes and nothing else; and what a missing permission looks
//! like (a definite error, nothing written).

mod support;

use std::time::Duration;

use nolock::cas::{self, Expected};
use nolock::rate::{Algorithm, Check, Limiter, MultiKey, MultiLimiter, Quota};
use nolock::{fence, limits, Batch, Error, Scripts};
use redis::aio::MultiplexedConnection;
use support::RedisServer;

/// A user with `commands` on `acl:*` and `{acl:*`; returns its connection.
async fn user(server: &RedisServer, name: &str, commands: &str) -> MultiplexedConnection {
    user_with_keys(server, name, "", commands).await
}

/// As [`user`], with the key patterns `keys` (ACL rules, `~...`) as well.
async fn user_with_keys(
    server: &RedisServer,
    name: &str,
    keys: &str,
    commands: &str,
) -> MultiplexedConnection {
    let mut admin = server.conn().await;
    let rule =
        format!("on >pw-{name} resetkeys ~acl:* ~{{acl:* {keys} resetchannels -@all {commands}");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg(rule.split_whitespace().collect::<Vec<_>>())
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = server
        .url()
        .replace("redis://", &format!("redis://{name}:pw-{name}@"));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn every_module_runs_with_only_the_documented_permissions() {
    let server = RedisServer::start();
    let mut c = user(&server, "nolock", nolock::acl::COMMANDS).await;
    let c = &mut c;
    // The user really is restricted.
    let denied = redis::cmd("FLUSHALL").query_async::<()>(c).await;
    assert!(denied.is_err());

    Scripts::load(c).await.unwrap();
    let minute = Duration::from_secs(60);

    // limits
    assert!(
        limits::try_increment(c, "acl:l", 2, minute)
            .await
            .unwrap()
            .admitted
    );
    assert!(
        nolock::limits::Counter::new(2, minute)
            .unwrap()
            .try_increment_by(c, "acl:l", 1)
            .await
            .unwrap()
            .admitted
    );
    assert!(
        !limits::try_increment(c, "acl:l", 2, minute)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(limits::peek(c, "acl:l").await.unwrap().count, 2);
    let batch: Batch<_> = (0..3)
        .map(|i| {
            limits::TryIncrement::new(
                &nolock::limits::Counter::new(1, minute).unwrap(),
                &format!("acl:b{i}"),
            )
            .unwrap()
        })
        .collect();
    assert!(batch
        .run(c)
        .await
        .iter()
        .all(|r| r.as_ref().unwrap().admitted));

    // semaphore
    let nolock::semaphore::PermitAttempt::Acquired(mut permit) =
        nolock::semaphore::Semaphore::new(2, minute)
            .unwrap()
            .acquire(c, "acl:sem")
            .await
            .unwrap()
    else {
        panic!("no permit");
    };
    assert_eq!(
        nolock::semaphore::peek(c, "acl:sem").await.unwrap().in_use,
        1
    );
    assert!(matches!(
        permit.extend(c).await.unwrap(),
        nolock::semaphore::PermitExtend::Extended { .. }
    ));
    assert_eq!(
        permit.release(c).await.unwrap(),
        nolock::semaphore::PermitRelease::Released
    );

    // rate: every algorithm, every call; multi-limits; partial grants; batches
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::Calendar {
            support::calendar::room_in_this_minute().await;
        }
        let l = Limiter::new(algorithm, Quota::per_minute(5).unwrap()).unwrap();
        let key = format!("acl:r:{algorithm}");
        let mut charge = l.check(c, &key, 2).await.unwrap();
        assert!(charge.allowed, "{algorithm}");
        assert!(l.peek(c, &key, 1).await.unwrap().allowed);
        let refund = charge.charge_mut().unwrap().refund(c, 1).await.unwrap();
        assert_eq!(refund.credited, 1, "{algorithm}");
        l.reset(c, &key).await.unwrap();
        let mut b = Batch::new();
        b.push(Check::new(&l, &key, 1).unwrap());
        assert!(b.run(c).await[0].as_ref().unwrap().allowed);
    }
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let l = Limiter::new(algorithm, Quota::per_minute(5).unwrap()).unwrap();
        let g = l
            .check_at_most(c, &format!("acl:m:{algorithm}"), 9)
            .await
            .unwrap();
        assert_eq!(g.granted, 5);
    }
    let multi = MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_minute(5).unwrap())
        .unwrap()
        .shared_limit("all", Quota::per_minute(50).unwrap())
        .unwrap();
    assert!(
        multi
            .check(c, MultiKey::new("acl:u").shared("all", "{acl:u}:all"), 1)
            .await
            .unwrap()
            .allowed
    );
    multi
        .reset(c, MultiKey::new("acl:u").shared("all", "{acl:u}:all"))
        .await
        .unwrap();

    // cas
    assert!(
        cas::compare_and_set(c, "acl:c", Expected::Absent, "a", None)
            .await
            .unwrap()
            .is_applied()
    );
    assert!(cas::set_if_absent(c, "acl:c2", "b", Some(minute))
        .await
        .unwrap()
        .is_inserted());
    assert!(cas::compare_and_expire(c, "acl:c", "a", minute)
        .await
        .unwrap()
        .is_applied());
    assert!(cas::compare_and_delete(c, "acl:c", "a")
        .await
        .unwrap()
        .is_applied());
    assert!(cas::set_if_greater(c, "acl:w", 5).await.unwrap().applied);
    assert!(cas::set_if_less(c, "acl:w2", 5).await.unwrap().applied);
    assert!(cas::credit(c, "acl:bal", 10, None)
        .await
        .unwrap()
        .is_applied());
    assert!(cas::debit(c, "acl:bal", 3).await.unwrap().is_applied());
    assert!(cas::set_if_version(c, "acl:v", 0, &"one".to_owned())
        .await
        .unwrap()
        .is_written());
    let v: Option<cas::Versioned<String>> = cas::get_versioned(c, "acl:v").await.unwrap();
    assert!(v.is_some());

    // fence: derived keys land under {acl:...
    let fence::LockAttempt::Acquired(mut grant) = nolock::fence::Lock::new(minute)
        .expect("a valid lock TTL")
        .acquire(c, "acl:job")
        .await
        .unwrap()
    else {
        panic!("not acquired");
    };
    assert!(matches!(
        grant.extend(c).await.unwrap(),
        fence::LockExtend::Extended { .. }
    ));
    assert!(matches!(
        grant.fence().write(c, "x").await.unwrap(),
        fence::Write::Applied
    ));
    assert!(fence::read(c, "acl:job").await.unwrap().is_some());
    assert_eq!(
        grant.release(c).await.unwrap(),
        fence::LockRelease::Released
    );
    let lease = nolock::fence::Lock::new(minute)
        .expect("a valid lock TTL")
        .lease(c.clone(), "acl:lease")
        .await
        .unwrap()
        .acquired()
        .unwrap();
    assert_eq!(lease.release().await.unwrap(), fence::LockRelease::Released);

    // The NOSCRIPT fallback (EVAL) works too.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    let before = nolock::stats().noscript_fallbacks;
    assert!(
        limits::try_increment(c, "acl:after_flush", 1, minute)
            .await
            .unwrap()
            .admitted
    );
    assert!(nolock::stats().noscript_fallbacks > before);
}

#[tokio::test]
async fn a_missing_permission_is_a_definite_error_with_nothing_written() {
    let server = RedisServer::start();
    // Everything but SET, which a token bucket's check calls after deciding.
    let without: String = nolock::acl::COMMANDS
        .split_whitespace()
        .filter(|c| *c != "+set")
        .collect::<Vec<_>>()
        .join(" ");
    let mut c = user(&server, "partial", &without).await;
    let l = Limiter::new(Algorithm::TokenBucket, Quota::per_minute(5).unwrap()).unwrap();
    let err = l.check(&mut c, "acl:tb", 1).await.unwrap_err();
    assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");
    // A key outside the granted patterns is refused before the script runs.
    let mut full = user(&server, "full", nolock::acl::COMMANDS).await;
    let err = l.check(&mut full, "other:tb", 1).await.unwrap_err();
    assert!(err.is_definite(), "{err}");
    let exists: u64 = redis::cmd("EXISTS")
        .arg("other:tb")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    assert_eq!(exists, 0);
}

/// An acknowledged lock or semaphore run by a user without `wait`: the
/// refusal is the answer (`Error::Redis`, `NOPERM`), never "0 replicas"
/// retried forever, and the grant is released. With
/// `nolock::acl::ACKNOWLEDGED_COMMANDS` added, the `WAIT` runs (no replica
/// here, so it is answered `Unacknowledged`).
#[tokio::test]
async fn an_acknowledged_grant_without_the_wait_permission_is_refused_and_released() {
    let server = RedisServer::start();
    let mut c = user(&server, "nowait", nolock::acl::COMMANDS).await;
    let lock = fence::Lock::new(Duration::from_secs(60))
        .unwrap()
        .acknowledged(1, Duration::from_millis(20))
        .unwrap();
    let err = lock.acquire(&mut c, "acl:job").await.unwrap_err();
    assert!(
        matches!(&err, Error::Redis(e) if e.code() == Some("NOPERM")),
        "{err:?}"
    );
    let plain = fence::Lock::new(Duration::from_secs(60)).unwrap();
    let again = plain.acquire(&mut c, "acl:job").await.unwrap();
    let grant = again.acquired().expect("the refused grant was released");
    let _ = grant.release(&mut c).await.unwrap();

    let semaphore = nolock::semaphore::Semaphore::new(1, Duration::from_secs(60))
        .unwrap()
        .acknowledged(1, Duration::from_millis(20))
        .unwrap();
    let err = semaphore.acquire(&mut c, "acl:pool").await.unwrap_err();
    assert!(matches!(&err, Error::Redis(_)), "{err:?}");
    assert_eq!(semaphore.peek(&mut c, "acl:pool").await.unwrap().in_use, 0);

    let rules = format!(
        "{} {}",
        nolock::acl::COMMANDS,
        nolock::acl::ACKNOWLEDGED_COMMANDS
    );
    let mut w = user(&server, "withwait", &rules).await;
    let err = lock.acquire(&mut w, "acl:job").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unacknowledged {
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Slot fences write their slot's counter, outside the application's key
/// prefixes: without the pattern `acl`'s docs give, an acquire is a
/// definite error with nothing held; with it, a grant, its fenced write and
/// its release run.
#[tokio::test]
async fn slot_fences_need_the_documented_key_pattern_and_nothing_else() {
    let server = RedisServer::start();
    let lock = fence::Lock::new(Duration::from_secs(10))
        .unwrap()
        .with_fence_source(fence::FenceSource::PerSlot);
    let resource = "acl:slot:job";
    let mut admin = server.conn().await;

    let mut without = user(&server, "noslot", nolock::acl::COMMANDS).await;
    let err = lock.acquire(&mut without, resource).await.unwrap_err();
    assert!(err.is_definite(), "{err}");
    let held: Option<String> = redis::cmd("GET")
        .arg(nolock::keys::derive(resource, "lock"))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(held, None, "nothing held after the refusal");

    let mut with =
        user_with_keys(&server, "slot", "~{*}!nolock:fences", nolock::acl::COMMANDS).await;
    let grant = lock
        .acquire(&mut with, resource)
        .await
        .unwrap()
        .acquired()
        .expect("a free lock");
    assert_eq!(
        grant.fence().write(&mut with, "v").await.unwrap(),
        fence::Write::Applied
    );
    assert_eq!(
        grant.release(&mut with).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// Fenced permits write their slot's counter too: without the pattern, an
/// acquire is a definite error with nothing held; with it (and nothing
/// else), a permit, its fenced write, extension and release run.
#[tokio::test]
async fn fenced_permits_need_the_documented_key_pattern_and_nothing_else() {
    use nolock::semaphore::{PermitExtend, PermitRelease, Semaphore};
    let server = RedisServer::start();
    let exporters = Semaphore::new(2, Duration::from_secs(10)).unwrap().fenced();
    let key = "acl:exporters";
    let mut admin = server.conn().await;

    let mut without = user(&server, "nofence", nolock::acl::COMMANDS).await;
    let err = exporters.acquire(&mut without, key).await.unwrap_err();
    assert!(err.is_definite(), "{err}");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(key)
        .arg(nolock::keys::derive(key, "seats"))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(exists, 0, "nothing held after the refusal");

    let mut with = user_with_keys(
        &server,
        "fenced",
        "~{*}!nolock:fences",
        nolock::acl::COMMANDS,
    )
    .await;
    let mut permit = exporters
        .acquire(&mut with, key)
        .await
        .unwrap()
        .acquired()
        .expect("a free semaphore");
    assert_eq!(
        permit.write(&mut with, "v").await.unwrap(),
        fence::Write::Applied
    );
    assert!(matches!(
        permit.extend(&mut with).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert_eq!(
        permit.release(&mut with).await.unwrap(),
        PermitRelease::Released
    );
}
