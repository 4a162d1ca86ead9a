//! Acknowledged grants (`fence::Lock::acknowledged`) against a primary and a
//! replica: a grant is handed out only once a replica has it, so a primary
//! killed right after a grant (before asynchronous replication caught up)
//! cannot make the promoted replica hand the same fence out again.
//!
//! The replica replicates through the fault proxy, which can hold the
//! replication stream back; the primary is killed with SIGKILL, and the
//! replica is promoted with `REPLICAOF NO ONE` (`support::replicated`): the
//! forced failover of a managed Redis, on one machine.

mod support;

use std::time::{Duration, Instant};

use nolock::fence::{self, FenceSource, Leader, Lock, LockAttempt, LockRelease, Write};
use nolock::Error;
use support::replicated::pair;
use support::{prefix, raw};

const MINUTE: Duration = Duration::from_secs(60);

fn lock_key(resource: &str) -> String {
    nolock::keys::derive(resource, "lock")
}

/// Without acknowledgement, a grant the replica never received is lost in a
/// failover, and the promoted replica hands the same fence out again: two
/// holders with one fence. This is what acknowledged grants close.
#[tokio::test]
async fn without_acknowledgement_a_failover_hands_a_fence_out_twice() {
    let mut pair = pair().await;
    let resource = format!("{}job", prefix("unacked_failover"));
    let plain = Lock::new(MINUTE).unwrap();
    pair.link.hold();
    let first = plain
        .acquire(&mut pair.p, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("granted on the primary");
    let mut r = pair.fail_over().await;
    let second = plain
        .acquire(&mut r, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("the promoted replica never saw the first grant");
    assert_eq!(
        first.fence().number(),
        second.fence().number(),
        "the same fence, twice"
    );
}

/// With acknowledgement, a grant the replica does not confirm is refused
/// (and released), and every grant handed out survives the failover: its
/// lock is still held on the promoted replica, and the next fence is above.
#[tokio::test]
async fn acknowledged_grants_survive_a_forced_failover() {
    let mut pair = pair().await;
    let resource = format!("{}job", prefix("acked_failover"));
    // Generous while the replica is in sync (a loaded CI machine can take a
    // while to confirm), short while the link is held.
    let acked = Lock::new(MINUTE)
        .unwrap()
        .acknowledged(1, Duration::from_secs(5))
        .unwrap();
    let impatient = acked
        .clone()
        .acknowledged(1, Duration::from_millis(300))
        .unwrap();

    // Replica in sync: the grant comes back, and the replica has it.
    let granted = acked
        .acquire(&mut pair.p, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("acknowledged");
    let mut r = pair.replica.conn().await;
    let on_replica: Option<String> = raw(&mut r, &["GET", &lock_key(&resource)]).await;
    assert_eq!(
        on_replica,
        Some(format!(
            "{}:{}",
            granted.fence().number(),
            granted.token().as_str()
        ))
    );
    assert_eq!(
        granted.release(&mut pair.p).await.unwrap(),
        LockRelease::Released
    );

    // The replication stream is held back: the grant is not confirmed in
    // time, so it is refused and released; nobody holds fence 2.
    pair.link.hold();
    let err = impatient.acquire(&mut pair.p, &resource).await.unwrap_err();
    match &err {
        Error::Unacknowledged {
            fence,
            asked,
            acknowledged,
            ..
        } => assert_eq!((*fence, *asked, *acknowledged), (2, 1, 0)),
        other => panic!("{other:?}"),
    }
    assert!(!err.is_definite());
    let lock: Option<String> = raw(&mut pair.p, &["GET", &lock_key(&resource)]).await;
    assert_eq!(lock, None, "released on the primary");
    pair.link.release();

    // Confirmed again; then the link stalls and the primary dies: the grant
    // its caller holds is on the promoted replica all the same.
    let held = acked
        .acquire(&mut pair.p, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("acknowledged once the replica is back");
    pair.link.hold();
    let mut r = pair.fail_over().await;
    let on_replica: Option<String> = raw(&mut r, &["GET", &lock_key(&resource)]).await;
    assert_eq!(
        on_replica,
        Some(format!(
            "{}:{}",
            held.fence().number(),
            held.token().as_str()
        )),
        "the acknowledged grant survived the failover"
    );
    match Lock::new(MINUTE)
        .unwrap()
        .acquire(&mut r, &resource)
        .await
        .unwrap()
    {
        LockAttempt::Held { .. } => {}
        other => panic!("a second holder after the failover: {other:?}"),
    }
    assert_eq!(held.release(&mut r).await.unwrap(), LockRelease::Released);
    let next = Lock::new(MINUTE)
        .unwrap()
        .acquire(&mut r, &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    assert_eq!(next.fence().number(), 4, "fences never go back");
}

/// A lock that waits keeps trying while the replica lags, and gets its
/// grant once the replica confirms.
#[tokio::test]
async fn a_waiting_acknowledged_lock_tries_again_until_the_replica_confirms() {
    let mut pair = pair().await;
    let resource = format!("{}job", prefix("acked_wait"));
    let acked = Lock::new(MINUTE)
        .unwrap()
        .acknowledged(1, Duration::from_millis(100))
        .unwrap()
        .with_wait(nolock::Backoff::new(Duration::from_secs(10)));
    pair.link.hold();
    let link = &pair.link;
    let start = Instant::now();
    let (grant, ()) = tokio::join!(acked.acquire(&mut pair.p, &resource), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        link.release();
    });
    let grant = grant.unwrap().acquired().expect("granted once confirmed");
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    // The unconfirmed attempts used fences up; the grant is the newest.
    let counter: String = raw(
        &mut pair.p,
        &["GET", &nolock::keys::derive(&resource, "fence")],
    )
    .await;
    assert_eq!(counter, grant.fence().number().to_string());
    assert!(grant.fence().number() > 1, "{}", grant.fence().number());
}

/// Slot fences (`FenceSource::PerSlot`) under the same forced failover: an
/// acknowledged grant is on the promoted replica, and so is the slot's
/// counter, so the next grant there (of this resource, and of another
/// resource in the same slot) draws a greater fence than any handed out
/// before the failover. A grant the replica did not confirm was never
/// handed out.
#[tokio::test]
async fn acknowledged_slot_fences_survive_a_forced_failover() {
    let mut pair = pair().await;
    // One hash tag: both resources' locks share the slot, so one counter.
    let tag = format!("{{{}slot}}", prefix("acked_slot_failover"));
    let (job, other) = (format!("{tag}job"), format!("{tag}other"));
    let acked = Lock::new(MINUTE)
        .unwrap()
        .with_fence_source(FenceSource::PerSlot)
        .acknowledged(1, Duration::from_secs(5))
        .unwrap();
    let first = acked
        .acquire(&mut pair.p, &other)
        .await
        .unwrap()
        .acquired()
        .expect("acknowledged");
    let held = acked
        .acquire(&mut pair.p, &job)
        .await
        .unwrap()
        .acquired()
        .expect("acknowledged");
    assert!(held.fence().number() > first.fence().number());
    let mut handed_out = vec![first.fence().number(), held.fence().number()];
    assert_eq!(
        first.release(&mut pair.p).await.unwrap(),
        LockRelease::Released
    );

    // The stream is held back: a grant of the other resource is not
    // confirmed in time, so it is refused and nobody holds its fence.
    pair.link.hold();
    let impatient = acked
        .clone()
        .acknowledged(1, Duration::from_millis(300))
        .unwrap();
    match impatient.acquire(&mut pair.p, &other).await {
        Err(Error::Unacknowledged { .. }) => {}
        Ok(attempt) => handed_out.extend(attempt.acquired().map(|g| g.fence().number())),
        Err(other) => panic!("{other:?}"),
    }
    let mut r = pair.fail_over().await;
    let plain = Lock::new(MINUTE)
        .unwrap()
        .with_fence_source(FenceSource::PerSlot);
    match plain.acquire(&mut r, &job).await.unwrap() {
        LockAttempt::Held { .. } => {}
        other => panic!("a second holder after the failover: {other:?}"),
    }
    let next = plain
        .acquire(&mut r, &other)
        .await
        .unwrap()
        .acquired()
        .expect("free on the promoted replica");
    let highest = handed_out.iter().max().copied().unwrap_or(0);
    assert!(
        next.fence().number() > highest,
        "the slot counter went back: {} after {handed_out:?} were handed out",
        next.fence().number(),
    );
    assert_eq!(held.release(&mut r).await.unwrap(), LockRelease::Released);
    let again = plain
        .acquire(&mut r, &job)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    assert!(again.fence().number() > next.fence().number());
}

/// A leader elected with acknowledged terms, then its primary killed and
/// the replica promoted (`Leader` on an acknowledged `Lock`): the old
/// leader's term ends (its renewals fail) within about the TTL, the next
/// term, won on the promoted replica, is greater, and the old term's fenced
/// write there is refused while the value it wrote before the failover is
/// kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_leader_is_replaced_after_a_forced_failover() {
    let ttl = Duration::from_secs(1);
    let quick = nolock::Backoff {
        timeout: Duration::ZERO,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(20),
    };
    let mut pair = pair().await;
    let name = format!("{}role", prefix("leader_failover"));
    let acked = Lock::new(ttl)
        .unwrap()
        .acknowledged(1, Duration::from_millis(500))
        .unwrap();
    let election = Leader::new(&name, acked)
        .unwrap()
        .with_campaign(quick)
        .unwrap();
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(2)));
    let to_primary = pair
        .primary
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let old = election.campaign(to_primary).unwrap();
    let old_term = tokio::time::timeout(Duration::from_secs(5), old.elected())
        .await
        .expect("elected")
        .expect("campaigning");
    assert_eq!(
        old_term.fence().write(&mut pair.p, "old").await.unwrap(),
        Write::Applied
    );
    let synced: i64 = raw(&mut pair.p, &["WAIT", "1", "5000"]).await;
    assert_eq!(synced, 1, "the replica has the old term's value");

    pair.link.hold();
    let cut = Instant::now();
    let mut r = pair.fail_over().await;
    tokio::time::timeout(3 * ttl, old_term.ended())
        .await
        .expect("the old term ends once no renewal is confirmed");
    let noticed = cut.elapsed();

    // The promoted replica has no replica of its own: the next campaigner
    // runs unacknowledged there.
    let after = Leader::new(&name, Lock::new(ttl).unwrap())
        .unwrap()
        .with_campaign(quick)
        .unwrap();
    let rival = after.campaign(pair.replica.conn().await).unwrap();
    let new_term = tokio::time::timeout(5 * ttl, rival.elected())
        .await
        .expect("a new leader on the promoted replica")
        .expect("campaigning");
    assert!(
        new_term.number() > old_term.number(),
        "term {} after term {}",
        new_term.number(),
        old_term.number()
    );
    assert_eq!(
        old_term.fence().write(&mut r, "old, late").await.unwrap(),
        Write::Stale {
            current_fence: new_term.number()
        }
    );
    let stored = fence::read(&mut r, &name).await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"old"[..], old_term.number())
    );
    assert_eq!(
        new_term.fence().write(&mut r, "new").await.unwrap(),
        Write::Applied
    );
    assert!(!old.role().is_leader(), "{:?}", old.role());
    eprintln!("old term over {noticed:?} after the failover (TTL {ttl:?})");
    drop(old);
    assert_eq!(
        rival.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
}

/// Fenced permits (`Semaphore::fenced`) under the same forced failover:
/// an acknowledged permit keeps its seat on the promoted replica (its write
/// still applies there), a permit the replica did not confirm was never
/// handed out, and the next grant's fence is above every fence handed out
/// before the failover.
#[tokio::test]
async fn acknowledged_fenced_permits_survive_a_forced_failover() {
    use nolock::semaphore::{PermitAttempt, Semaphore};
    let mut pair = pair().await;
    let key = format!("{}exports", prefix("acked_permit_failover"));
    let acked = Semaphore::new(2, MINUTE)
        .unwrap()
        .fenced()
        .acknowledged(1, Duration::from_secs(5))
        .unwrap();
    let held = acked
        .acquire(&mut pair.p, &key)
        .await
        .unwrap()
        .acquired()
        .expect("acknowledged");
    let seat = held.fence().expect("a fenced permit");
    assert_eq!(seat.seat(), 1);
    let mut handed_out = vec![seat.number()];

    pair.link.hold();
    let impatient = acked
        .clone()
        .acknowledged(1, Duration::from_millis(300))
        .unwrap();
    match impatient.acquire(&mut pair.p, &key).await {
        Err(Error::PermitUnacknowledged { .. }) => {}
        Ok(attempt) => handed_out.extend(
            attempt
                .acquired()
                .and_then(|p| p.fence().map(|f| f.number())),
        ),
        Err(other) => panic!("{other:?}"),
    }
    let mut r = pair.fail_over().await;
    assert_eq!(
        held.write(&mut r, "after the failover").await.unwrap(),
        Write::Applied,
        "the acknowledged permit kept its seat"
    );
    let plain = Semaphore::new(2, MINUTE).unwrap().fenced();
    let next = match plain.acquire(&mut r, &key).await.unwrap() {
        PermitAttempt::Acquired(p) => p,
        other => panic!("{other:?}"),
    };
    let next_seat = next.fence().expect("a fenced permit");
    let highest = handed_out.iter().max().copied().unwrap_or(0);
    assert_eq!(next_seat.seat(), 2, "seat 1 is still held");
    assert!(
        next_seat.number() > highest,
        "fence {} after {handed_out:?} were handed out",
        next_seat.number()
    );
    match plain.acquire(&mut r, &key).await.unwrap() {
        PermitAttempt::Full { .. } => {}
        other => panic!("a third holder of two seats: {other:?}"),
    }
}
