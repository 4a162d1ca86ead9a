//! Acknowledged permits (`Semaphore::acknowledged`) and grants confirmed on
//! disk (`Lock::acknowledged_on_disk`, `Semaphore::acknowledged_on_disk`,
//! `WAITAOF`), against a primary and a replica whose link the test holds
//! back, then a forced failover (`support::replicated`).
//!
//! A semaphore has no fence: a permit lost in a failover lets one more
//! holder in than it allows, and nothing refuses that holder's work. So
//! "never more holders than permits across a failover" is what the
//! acknowledgement must buy, shown here against its absence.

mod support;

use std::time::{Duration, Instant};

use nolock::fence::{AcquireLock, Lock, LockAttempt};
use nolock::semaphore::{AcquirePermit, PermitAttempt, PermitRelease, Semaphore};
use nolock::{Backoff, Error};
use support::replicated::{pair, pair_with};
use support::{prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

fn one_permit() -> Semaphore {
    Semaphore::new(1, MINUTE).unwrap()
}

/// Without acknowledgement, a permit the replica never received is lost in
/// a failover, and the promoted replica lets a second holder into a
/// semaphore of one.
#[tokio::test]
async fn without_acknowledgement_a_failover_lets_one_holder_too_many_in() {
    let mut pair = pair().await;
    let key = format!("{}payouts", prefix("unacked_permit"));
    pair.link.hold();
    let first = one_permit()
        .acquire(&mut pair.p, &key)
        .await
        .unwrap()
        .acquired()
        .expect("granted on the primary");
    let mut r = pair.fail_over().await;
    let second = one_permit().acquire(&mut r, &key).await.unwrap();
    assert!(
        second.is_acquired(),
        "the promoted replica never saw the first permit"
    );
    // Two holders of a semaphore of one, each believing it is alone.
    assert!(first.deadline() > Instant::now());
}

/// With acknowledgement: unconfirmed permits are refused and released;
/// confirmed permits are on the promoted replica, which turns the next
/// holder away.
#[tokio::test]
async fn acknowledged_permits_survive_a_forced_failover() {
    let mut pair = pair().await;
    let key = format!("{}payouts", prefix("acked_permit"));
    // Generous while the replica is in sync, short while the link is held.
    let acked = one_permit()
        .acknowledged(1, Duration::from_secs(5))
        .unwrap();
    let impatient = one_permit()
        .acknowledged(1, Duration::from_millis(300))
        .unwrap();

    pair.link.hold();
    let err = impatient.acquire(&mut pair.p, &key).await.unwrap_err();
    match &err {
        Error::PermitUnacknowledged {
            key: at,
            asked,
            acknowledged,
            on_disk,
            ..
        } => assert_eq!(
            (at.as_str(), *asked, *acknowledged, *on_disk),
            (key.as_str(), 1, 0, false)
        ),
        other => panic!("{other:?}"),
    }
    assert!(!err.is_definite());
    let usage = acked.peek(&mut pair.p, &key).await.unwrap();
    assert_eq!(usage.in_use, 0, "released on the primary");
    pair.link.release();

    let held = acked
        .acquire(&mut pair.p, &key)
        .await
        .unwrap()
        .acquired()
        .expect("acknowledged once the replica is back");
    pair.link.hold();
    let mut r = pair.fail_over().await;
    let usage = acked.peek(&mut r, &key).await.unwrap();
    assert_eq!(usage.in_use, 1, "the acknowledged permit survived");
    match one_permit().acquire(&mut r, &key).await.unwrap() {
        PermitAttempt::Full { in_use, .. } => assert_eq!(in_use, 1),
        other => panic!("a second holder after the failover: {other:?}"),
    }
    assert_eq!(held.release(&mut r).await.unwrap(), PermitRelease::Released);
}

/// A semaphore that waits keeps asking (same id) while the replica lags,
/// and gets its permit once the replica confirms; nothing is left behind.
#[tokio::test]
async fn a_waiting_acknowledged_semaphore_tries_again_until_the_replica_confirms() {
    let mut pair = pair().await;
    let key = format!("{}exports", prefix("acked_permit_wait"));
    let acked = Semaphore::new(2, MINUTE)
        .unwrap()
        .acknowledged(1, Duration::from_millis(100))
        .unwrap()
        .with_wait(Backoff::new(Duration::from_secs(10)));
    pair.link.hold();
    let link = &pair.link;
    let start = Instant::now();
    let (permit, ()) = tokio::join!(acked.acquire(&mut pair.p, &key), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        link.release();
    });
    let permit = permit.unwrap().acquired().expect("granted once confirmed");
    assert!(start.elapsed() >= Duration::from_millis(500));
    let usage = acked.peek(&mut pair.p, &key).await.unwrap();
    assert_eq!(
        (usage.in_use, usage.holders),
        (1, 1),
        "one holder, no leftovers"
    );
    assert_eq!(
        permit.release(&mut pair.p).await.unwrap(),
        PermitRelease::Released
    );
}

/// An acknowledged lock or semaphore cannot be turned into an operation
/// value (a batch would run it with no confirmation), before anything is
/// sent.
#[test]
fn acknowledged_primitives_refuse_operation_values() {
    let lock = Lock::new(MINUTE)
        .unwrap()
        .acknowledged(1, Duration::from_millis(50))
        .unwrap();
    assert!(matches!(
        AcquireLock::new(&lock, "job"),
        Err(Error::InvalidArgument { what: "lock", .. })
    ));
    let semaphore = one_permit()
        .acknowledged_on_disk(0, Duration::from_millis(50))
        .unwrap();
    assert!(matches!(
        AcquirePermit::new(&semaphore, "k"),
        Err(Error::InvalidArgument {
            what: "semaphore",
            ..
        })
    ));
    assert!(AcquireLock::new(&Lock::new(MINUTE).unwrap(), "job").is_ok());
    assert!(AcquirePermit::new(&one_permit(), "k").is_ok());
}

/// True when the server has `WAITAOF` (Redis 7.2 and later; Valkey reports
/// a `redis_version` of 7.2.4).
async fn has_waitaof(conn: &mut redis::aio::MultiplexedConnection) -> bool {
    let info: String = raw(conn, &["INFO", "server"]).await;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .expect("redis_version")
        .trim();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (7, 2)
}

/// On disk: with `appendonly yes` on both servers, a lock and a semaphore
/// confirmed by the primary's AOF and the replica's are granted; with the
/// replica's link held they are refused and released. Where the server has
/// no `WAITAOF` (Redis 7.0) the acquire says so as `Error::Redis`, and
/// nothing stays held.
#[tokio::test]
async fn grants_confirmed_on_disk_need_the_aof_of_the_primary_and_the_replicas() {
    let mut pair = pair_with(&["--appendonly", "yes", "--appendfsync", "everysec"]).await;
    let resource = format!("{}ledger", prefix("on_disk"));
    let key = format!("{}exports", prefix("on_disk"));
    let lock = Lock::new(MINUTE)
        .unwrap()
        .acknowledged_on_disk(1, Duration::from_secs(5))
        .unwrap();
    let semaphore = one_permit()
        .acknowledged_on_disk(1, Duration::from_secs(5))
        .unwrap();
    if !has_waitaof(&mut pair.p).await {
        let err = lock.acquire(&mut pair.p, &resource).await.unwrap_err();
        assert!(
            matches!(&err, Error::Redis(e) if e.to_string().to_lowercase().contains("unknown command")),
            "{err:?}"
        );
        let plain = Lock::new(MINUTE).unwrap();
        let free = plain.acquire(&mut pair.p, &resource).await.unwrap();
        assert!(free.is_acquired(), "released");
        let err = semaphore.acquire(&mut pair.p, &key).await.unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "{err:?}");
        assert_eq!(semaphore.peek(&mut pair.p, &key).await.unwrap().in_use, 0);
        eprintln!("no WAITAOF on this server: refused as Error::Redis, nothing held");
        return;
    }
    // `appendfsync everysec` fsyncs within a second: longer than redis-rs's
    // default response timeout (500 ms), which would lose the answer.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    pair.p = pair
        .primary
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    // A replica that has just synced confirms nothing on disk until its
    // append-only file has been rewritten: about 5 s here. Each probe waits
    // longer than the `everysec` period: Redis 7.4 and 8.0 fsync at once for
    // a waiting WAITAOF, Redis 8.2 waits for the next scheduled fsync, so a
    // 200 ms probe after each new write never saw one there (measured: 8 s of
    // `SET` + `WAITAOF 1 0 200` answered local 0 on 37 of 39 probes on 8.2.3,
    // on none of 48,000 on 7.4.1).
    let start = Instant::now();
    loop {
        let _: () = raw(&mut pair.p, &["SET", &format!("{key}:probe"), "1"]).await;
        let counts: Vec<i64> = raw(&mut pair.p, &["WAITAOF", "1", "1", "2500"]).await;
        if counts == [1, 1] {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replica's AOF never confirmed: {counts:?}"
        );
    }
    eprintln!("the replica's AOF confirmed after {:?}", start.elapsed());
    let grant = lock
        .acquire(&mut pair.p, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("confirmed on disk");
    let permit = semaphore
        .acquire(&mut pair.p, &key)
        .await
        .unwrap()
        .acquired()
        .expect("confirmed on disk");
    let _ = grant.release(&mut pair.p).await.unwrap();
    let _ = permit.release(&mut pair.p).await.unwrap();

    pair.link.hold();
    let impatient = Lock::new(MINUTE)
        .unwrap()
        .acknowledged_on_disk(1, Duration::from_millis(200))
        .unwrap();
    match impatient.acquire(&mut pair.p, &resource).await.unwrap_err() {
        Error::Unacknowledged {
            asked,
            acknowledged,
            on_disk,
            ..
        } => assert_eq!((asked, acknowledged, on_disk), (1, 0, true)),
        other => panic!("{other:?}"),
    }
    // The primary's own AOF alone (0 replicas) still confirms.
    let local = Lock::new(MINUTE)
        .unwrap()
        .acknowledged_on_disk(0, Duration::from_secs(5))
        .unwrap();
    let grant = local
        .acquire(&mut pair.p, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("the primary's AOF confirms");
    let _ = grant.release(&mut pair.p).await.unwrap();
    pair.link.release();
}

/// `WAITAOF` on a server without `appendonly`: refused as `Error::Redis`
/// naming the setting, the grant released, never a grant nothing confirmed.
#[tokio::test]
async fn on_disk_without_appendonly_is_refused_and_releases() {
    let server = RedisServer::start_with(&["--appendonly", "no"]);
    let mut conn = server.conn().await;
    let resource = format!("{}ledger", prefix("no_aof"));
    let lock = Lock::new(MINUTE)
        .unwrap()
        .acknowledged_on_disk(0, Duration::from_millis(100))
        .unwrap();
    let err = lock.acquire(&mut conn, &resource).await.unwrap_err();
    let Error::Redis(e) = &err else {
        panic!("{err:?}")
    };
    let text = e.to_string().to_lowercase();
    assert!(
        text.contains("appendonly") || text.contains("unknown command"),
        "{text}"
    );
    match Lock::new(MINUTE)
        .unwrap()
        .acquire(&mut conn, &resource)
        .await
        .unwrap()
    {
        LockAttempt::Acquired(_) => {}
        other => panic!("the refused grant was left held: {other:?}"),
    }
}

/// The first acknowledged acquire on a server that has not loaded the
/// scripts (`SCRIPT FLUSH`, a restart, a failover) costs one wait, not two:
/// the `WAIT` in the first pipeline runs its whole timeout although the
/// script did not (`NOSCRIPT`), so the wait after the fallback gets only
/// what is left of the timeout. With no replica, every wait times out:
/// the acquire answers "unacknowledged" within the timeout and a round
/// trip or two, and leaves nothing held.
///
/// The server enforces a wait's timeout at its cron tick (`1000 / hz` ms):
/// at the default `hz 10` an idle server answers `WAIT 1 150` after about
/// 190 ms and `WAIT 1 1` after about 90 ms. At `hz 100` the tick is 10 ms,
/// so what is measured is the library's waits, not the server's clock.
#[tokio::test]
async fn the_first_acknowledged_acquire_after_a_script_flush_costs_one_wait() {
    let server = RedisServer::start_with(&["--hz", "100"]);
    let mut conn = server.conn().await;
    let timeout = Duration::from_millis(150);
    // A round trip or two of a loaded machine, not a second wait.
    let slack = Duration::from_millis(120);
    let resource = format!("{}ledger", prefix("flushed_lock"));
    let key = format!("{}exports", prefix("flushed_permit"));

    let lock = Lock::new(MINUTE).unwrap().acknowledged(1, timeout).unwrap();
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let start = Instant::now();
    let err = lock.acquire(&mut conn, &resource).await.unwrap_err();
    let took = start.elapsed();
    match &err {
        Error::Unacknowledged {
            asked,
            acknowledged,
            on_disk,
            connected,
            ..
        } => assert_eq!(
            (*asked, *acknowledged, *on_disk, *connected),
            (1, 0, false, Some(0))
        ),
        other => panic!("{other:?}"),
    }
    // The message says why, so a development server's failure is not a
    // mystery: there is no replica to confirm anything.
    assert!(err.to_string().contains("no replica connected"), "{err}");
    assert!(
        took < timeout + slack,
        "the lock's first acquire took {took:?} for a timeout of {timeout:?}"
    );
    match Lock::new(MINUTE)
        .unwrap()
        .acquire(&mut conn, &resource)
        .await
        .unwrap()
    {
        LockAttempt::Acquired(_) => {}
        other => panic!("the unacknowledged grant was left held: {other:?}"),
    }

    let semaphore = one_permit().acknowledged(1, timeout).unwrap();
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let start = Instant::now();
    let err = semaphore.acquire(&mut conn, &key).await.unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(
            &err,
            Error::PermitUnacknowledged {
                asked: 1,
                acknowledged: 0,
                on_disk: false,
                connected: Some(0),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        took < timeout + slack,
        "the semaphore's first acquire took {took:?} for a timeout of {timeout:?}"
    );
    assert_eq!(semaphore.peek(&mut conn, &key).await.unwrap().in_use, 0);
}
