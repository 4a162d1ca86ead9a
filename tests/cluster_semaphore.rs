//! The semaphore on one server and on the local 3×2 Redis Cluster, in the
//! style of `tests/cluster_modules.rs`: one body per behaviour, run on both
//! deployments (`both!`).

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nolock::semaphore::{
    self, AcquirePermit, PermitAttempt, PermitExtend, PermitRelease, ReleasePermit, Semaphore,
};
use nolock::Backoff;
use nolock::Batch;
use support::deployment::{both, run_batch_through_a_flush, Deployment};
use support::prefix;

const MINUTE: Duration = Duration::from_secs(60);

both!(
    shared: [
        acquire_extend_release_on_the_keys_owner,
        racing_holders_never_exceed_the_permits,
        a_permit_lease_renews_on_the_deployment_connection,
        a_batch_of_acquires_spreads_over_the_nodes,
    ],
    exclusive: [
        a_flush_between_batches_of_acquires_is_recovered,
        every_semaphore_call_recovers_a_script_flush_on_every_node,
    ],
);

async fn acquire_extend_release_on_the_keys_owner(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cluster_semaphore");
    let mut owners = BTreeSet::new();
    for n in 0..6 {
        let key = format!("{p}{n}");
        let mut a = Semaphore::new(3, MINUTE)
            .unwrap()
            .acquire_weighted(&mut conn, &key, 2)
            .await
            .unwrap()
            .acquired()
            .unwrap();
        let b = Semaphore::new(3, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap()
            .acquired()
            .unwrap();
        let full = Semaphore::new(3, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap();
        assert!(
            matches!(full, PermitAttempt::Full { in_use: 3, .. }),
            "{full:?}"
        );
        assert!(d.exists(&key).await, "{key} on its owner");
        owners.insert(d.owner_port(&key).await);
        let usage = semaphore::peek(&mut conn, &key).await.unwrap();
        assert_eq!((usage.in_use, usage.holders), (3, 2));
        assert!(matches!(
            a.extend(&mut conn).await.unwrap(),
            PermitExtend::Extended { .. }
        ));
        for permit in [a, b] {
            assert_eq!(
                permit.release(&mut conn).await.unwrap(),
                PermitRelease::Released
            );
        }
        assert!(!d.exists(&key).await, "gone with its last permit");
    }
    assert_eq!(owners.len(), if d.is_cluster() { 3 } else { 1 });
}

async fn racing_holders_never_exceed_the_permits(d: &Deployment) {
    let key = format!("{}s", prefix("cluster_race"));
    let running = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let grants = d
        .race(32, |mut conn| {
            let (key, running, peak) = (key.clone(), running.clone(), peak.clone());
            async move {
                let mut granted = 0u32;
                for _ in 0..5 {
                    let wait = Backoff::new(Duration::from_secs(5));
                    let outcome = Semaphore::new(4, MINUTE)
                        .unwrap()
                        .with_wait(wait)
                        .acquire(&mut conn, &key)
                        .await
                        .unwrap();
                    let PermitAttempt::Acquired(permit) = outcome else {
                        continue;
                    };
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    let released = permit.release(&mut conn).await.unwrap();
                    assert_eq!(released, PermitRelease::Released);
                    granted += 1;
                }
                granted
            }
        })
        .await;
    assert_eq!(
        grants.iter().sum::<u32>(),
        32 * 5,
        "every holder got its turns"
    );
    assert!(peak.load(Ordering::SeqCst) <= 4);
    assert!(!d.exists(&key).await);
}

async fn a_permit_lease_renews_on_the_deployment_connection(d: &Deployment) {
    let conn = d.conn().await;
    let key = format!("{}s", prefix("cluster_permit_lease"));
    let ttl = Duration::from_millis(300);
    let lease = Semaphore::new(1, ttl)
        .unwrap()
        .lease(conn, &key)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(lease.loss(), None, "renewed past three ttls");
    assert!(d.exists(&key).await);
    assert_eq!(lease.release().await.unwrap(), PermitRelease::Released);
    assert!(!d.exists(&key).await);
}

async fn a_batch_of_acquires_spreads_over_the_nodes(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cluster_semaphore_batch");
    let keys: Vec<String> = (0..12).map(|n| format!("{p}{n}")).collect();
    let batch: Batch<AcquirePermit> = keys
        .iter()
        .map(|k| AcquirePermit::new(&Semaphore::new(1, MINUTE).unwrap(), k).unwrap())
        .collect();
    let permits: Vec<_> = batch
        .run(&mut conn)
        .await
        .into_iter()
        .map(|r| r.unwrap().acquired().expect("a free semaphore"))
        .collect();
    // Other holders (fresh ids) find every semaphore full.
    let others: Batch<AcquirePermit> = keys
        .iter()
        .map(|k| AcquirePermit::new(&Semaphore::new(1, MINUTE).unwrap(), k).unwrap())
        .collect();
    let again = others.run(&mut conn).await;
    assert!(again
        .iter()
        .all(|r| matches!(r, Ok(PermitAttempt::Full { .. }))));
    let releases: Batch<ReleasePermit> = permits.iter().map(ReleasePermit::new).collect();
    for r in releases.run(&mut conn).await {
        assert_eq!(r.unwrap(), PermitRelease::Released);
    }
    for k in &keys {
        assert!(!d.exists(k).await);
    }
}

async fn a_flush_between_batches_of_acquires_is_recovered(d: &Deployment) {
    let p = prefix("cluster_semaphore_flush_batch");
    // A value keeps the id drawn when it was built, so each run is the same
    // holder acquiring again: granted again, never a second permit (with
    // permits 1, a second holder would be refused).
    let batch: Batch<AcquirePermit> = (0..9)
        .map(|n| {
            AcquirePermit::new(&Semaphore::new(1, MINUTE).unwrap(), &format!("{p}{n}")).unwrap()
        })
        .collect();
    run_batch_through_a_flush(d, &batch, |_, outcome| outcome.is_acquired()).await;
}

async fn every_semaphore_call_recovers_a_script_flush_on_every_node(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}s", prefix("cluster_semaphore_flush"));
    d.flush_scripts_everywhere().await;
    let mut permit = Semaphore::new(2, MINUTE)
        .unwrap()
        .acquire(&mut conn, &key)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    d.flush_scripts_everywhere().await;
    assert!(matches!(
        permit.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    d.flush_scripts_everywhere().await;
    assert_eq!(semaphore::peek(&mut conn, &key).await.unwrap().in_use, 1);
    d.flush_scripts_everywhere().await;
    assert_eq!(
        permit.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert!(!d.exists(&key).await);
}
