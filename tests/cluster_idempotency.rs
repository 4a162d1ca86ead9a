//! Operation ids on one server and on the local 3×2 Redis Cluster
//! (`both!`): the record lands in the operation's slot, on the node that
//! owns it, and a resend is answered from it there.

mod support;

use std::time::Duration;

use nolock::cas::Adjust;
use nolock::limits::{self, TryIncrement};
use nolock::rate::{Algorithm, MultiCheck, MultiKey, MultiLimiter, Quota};
use nolock::retry::{retry, RetryPolicy};
use nolock::{keys, Batch, Error, Operation};
use support::deployment::{both, run_batch_through_a_flush, Deployment};
use support::prefix;

const MINUTE: Duration = Duration::from_secs(60);

both!(
    shared: [
        an_id_d_operation_keeps_its_record_in_its_own_slot,
        a_batch_of_id_d_entries_over_several_nodes_replays_per_entry,
    ],
    exclusive: [a_flushed_batch_of_id_d_entries_is_recovered_without_double_counting],
);

async fn an_id_d_operation_keeps_its_record_in_its_own_slot(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cluster_idem");
    for n in 0..6 {
        let key = format!("{p}{n}");
        let op = TryIncrement::new(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &key)
            .unwrap()
            .idempotent(format!("req-{n}"))
            .unwrap();
        assert_eq!(keys::slot(op.record_key()), keys::slot(&key));
        let first = retry(&RetryPolicy::default(), &mut conn, &op)
            .await
            .unwrap();
        let again = op.run(&mut conn).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(limits::peek(&mut conn, &key).await.unwrap().count, 1);
        assert!(
            d.exists(op.record_key()).await,
            "the record on {key}'s owner"
        );
        let other = TryIncrement::by(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &key, 2)
            .unwrap()
            .idempotent(format!("req-{n}"))
            .unwrap();
        assert!(matches!(
            other.run(&mut conn).await,
            Err(Error::IdReused { .. })
        ));
    }

    // A multi-limit check: the record sits beside the first limit's key.
    let limits = MultiLimiter::new(Algorithm::Gcra)
        .limit("second", Quota::per_second(5).unwrap())
        .unwrap()
        .shared_limit("tenant", Quota::per_hour(100).unwrap())
        .unwrap();
    let user = format!("{{{p}t}}:u1");
    let all = format!("{{{p}t}}:all");
    let op = MultiCheck::new(&limits, MultiKey::new(&user).shared("tenant", &all), 1)
        .unwrap()
        .idempotent("m")
        .unwrap();
    let first = op.run(&mut conn).await.unwrap();
    assert_eq!(op.run(&mut conn).await.unwrap(), first);
    assert_eq!(keys::slot(op.record_key()), keys::slot(&all));
    let peek = limits
        .peek(&mut conn, MultiKey::new(&user).shared("tenant", &all), 1)
        .await
        .unwrap();
    assert_eq!(peek.limits[1].remaining, 99, "charged once");

    // A key with a `}` but no hash tag cannot keep its record in its slot:
    // refused before anything is sent.
    let odd = format!("{p}a}}b");
    let op = TryIncrement::new(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &odd)
        .unwrap()
        .idempotent("x")
        .unwrap();
    let err = op.run(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::CrossSlot { .. }), "{err}");
    assert!(!d.exists(&odd).await);
}

async fn a_batch_of_id_d_entries_over_several_nodes_replays_per_entry(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("cluster_idem");
    let batch: Batch<_> = (0..12)
        .map(|n| {
            Adjust::credit(&format!("{p}w{n}"), 10, None)
                .unwrap()
                .idempotent("deposit-1")
                .unwrap()
        })
        .collect();
    let mut owners = std::collections::BTreeSet::new();
    for run in 0..3 {
        for (n, result) in batch.run(&mut conn).await.into_iter().enumerate() {
            assert_eq!(result.unwrap().balance(), 10, "run {run}, entry {n}");
        }
    }
    for n in 0..12 {
        let key = format!("{p}w{n}");
        assert_eq!(d.get(&key).await.as_deref(), Some("10"));
        owners.insert(d.owner_port(&key).await);
    }
    if d.is_cluster() {
        assert!(owners.len() > 1, "the batch spread over the nodes");
    }
}

async fn a_flushed_batch_of_id_d_entries_is_recovered_without_double_counting(d: &Deployment) {
    let p = prefix("cluster_idem");
    let batch: Batch<_> = (0..8)
        .map(|n| {
            TryIncrement::new(
                &nolock::limits::Counter::new(100, MINUTE).unwrap(),
                &format!("{p}{n}"),
            )
            .unwrap()
            .idempotent("once")
            .unwrap()
        })
        .collect();
    // Every run answers count 1: the flushed run too (loaded, then replayed).
    run_batch_through_a_flush(d, &batch, |_, a| a.admitted && a.count == 1).await;
}
