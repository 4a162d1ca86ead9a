//! Forced failovers on a 3×2 cluster of its own, as a managed Redis or an
//! operator does them when a primary does not answer: `CLUSTER FAILOVER
//! FORCE` (the replica takes over without waiting for the primary to hand
//! over its last writes) and `TAKEOVER` (nor for the other primaries'
//! votes). The old primary keeps running and takes writes until it learns
//! of the new configuration; whatever it accepted meanwhile is thrown away
//! when it resyncs from the new primary. That window is where a plain
//! fenced grant can be handed out twice; an acknowledged grant
//! (`Lock::acknowledged`) is answered only once a replica has it, so it is
//! never in that window. (`tests/fence_failover.rs` shows the loss itself,
//! on a primary killed before its replica caught up.)

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nolock::fence::{Lock, LockAttempt};
use nolock::Scripts;
use support::cluster::RedisCluster;
use support::history::{check_fences, FenceOp, FenceReply, Outcome, Recorder};

/// 4 clients take one fenced lock in turn (TTL 300 ms, acknowledged by 1
/// replica within 300 ms, held 2 ms, released) while the shard's replica takes
/// over with `FORCE`, and then the old primary takes it back with
/// `TAKEOVER`. By the history checker: no fence is granted twice, and
/// every grant is above every grant completed before it was asked for.
/// Grants go on after both failovers, and a grant whose `WAIT` the
/// demotion cut short is not reported as "did not take effect".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_fences_never_go_back_through_force_and_takeover() {
    let cluster = RedisCluster::start();
    let mut setup = cluster.conn().await;
    Scripts::load(&mut setup).await.expect("load scripts");
    let resource = "{forced}:job";
    // A release sent to the old primary in the window is lost with the rest
    // of what it took then: the lock is left to its TTL, kept short here.
    let ttl = Duration::from_millis(300);
    let lock = Lock::new(ttl)
        .expect("a valid TTL")
        .acknowledged(1, Duration::from_millis(300))
        .expect("valid acknowledgement");

    let fences = Arc::new(Recorder::<FenceOp, FenceReply>::new());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for process in 0..4 {
        let (fences, stop, lock) = (fences.clone(), stop.clone(), lock.clone());
        let mut conn = cluster.conn().await;
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut held = None;
                fences
                    .record(process, FenceOp::Acquire, async {
                        match lock.acquire(&mut conn, resource).await? {
                            LockAttempt::Acquired(grant) => {
                                let fence = grant.fence().number();
                                held = Some(grant);
                                Ok(FenceReply::Granted(fence))
                            }
                            _ => Ok(FenceReply::Held),
                        }
                    })
                    .await;
                match held {
                    Some(grant) => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        // A release that fails leaves the lock to its TTL.
                        let _ = grant.release(&mut conn).await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        }));
    }

    let granted = |fences: &Recorder<FenceOp, FenceReply>| {
        fences
            .events()
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Ok(FenceReply::Granted(_))))
            .count()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (first, second) = cluster.failover_with(resource, Some("FORCE")).await;
    let after_force = granted(&fences);
    grants_resume(&fences, after_force, "FORCE").await;
    let (back_from, back_to) = cluster.failover_with(resource, Some("TAKEOVER")).await;
    assert_eq!((back_from, back_to), (second, first));
    let after_takeover = granted(&fences);
    grants_resume(&fences, after_takeover, "TAKEOVER").await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }

    let events = fences.events();
    if std::env::var_os("SHOW_EVENTS").is_some() {
        for e in events.iter().skip(30) {
            eprintln!("{:?} {:?} {:?}", e.invoked, e.completed, e.outcome);
        }
    }
    let verdict = check_fences(&events, None);
    assert!(verdict.is_ok(), "{verdict:?}");
    let total = granted(&fences);
    assert!(after_force > 0, "no grant before FORCE");
    let unacknowledged = events
        .iter()
        .filter(|e| matches!(&e.outcome, Outcome::Indeterminate(why) if why.contains("replica(s) in time")))
        .count();
    let refused: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.outcome {
            Outcome::Definite(why) => Some(why.as_str()),
            _ => None,
        })
        .collect();
    // A WAIT cut short by the demotion (`UNBLOCKED`) comes after the grant:
    // never "did not take effect".
    assert!(
        !refused.iter().any(|why| why.contains("UNBLOCKED")),
        "a grant whose WAIT was cut short reported as definite: {refused:?}"
    );
    eprintln!(
        "{} acquires, {total} granted, {unacknowledged} unacknowledged, {} refused {refused:?}; {}",
        events.len(),
        refused.len(),
        verdict.unwrap_or_default()
    );
}

/// Waits until grants go on after a failover: two more than `before`, and
/// the lock's TTL past the first of them (so a grant lost in the window has
/// expired and been handed out again). A cluster that agreed on its new
/// primary must grant again within 30 s, however loaded the machine; if it
/// does not, the outcomes since say why.
async fn grants_resume(fences: &Recorder<FenceOp, FenceReply>, before: usize, how: &str) {
    let start = std::time::Instant::now();
    let since = fences.events().len();
    loop {
        let events = fences.events();
        let granted = events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Ok(FenceReply::Granted(_))))
            .count();
        if granted >= before + 2 {
            tokio::time::sleep(Duration::from_millis(800)).await;
            return;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let mut seen = std::collections::BTreeMap::<String, usize>::new();
            for e in &events[since..] {
                let kind = match &e.outcome {
                    Outcome::Ok(reply) => format!("{reply:?}"),
                    Outcome::Definite(why) => format!("definite: {why}"),
                    Outcome::Indeterminate(why) => format!("indeterminate: {why}"),
                };
                *seen.entry(kind.chars().take(120).collect()).or_default() += 1;
            }
            panic!("no grant for 30 s after {how} ({granted} in all, {before} before); outcomes since: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
