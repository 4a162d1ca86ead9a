//! A network partition between a holder and the server (both directions
//! held by the fault proxy, then healed), during a fenced lease and a
//! semaphore permit lease: the holder is told of the loss before the server
//! lets the hold go, so a holder that stops at the loss signal (as the docs
//! say) never works past the server's expiry.

mod support;

use std::time::{Duration, Instant};

use nolock::fence::Lock;
use nolock::semaphore::Semaphore;
use nolock::Loss;
use support::proxy::FaultProxy;
use support::{prefix, raw, RedisServer};

const TTL: Duration = Duration::from_millis(600);

/// The server's remaining TTL of the lock when the loss is signalled: the
/// loss comes first, with margin, and the lock still expires on its own.
#[tokio::test]
async fn a_partitioned_lease_is_lost_before_the_server_lets_it_go() {
    let server = RedisServer::start();
    let mut direct = server.conn().await;
    let proxy = FaultProxy::start(server.port).await;
    let through = redis::Client::open(proxy.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let resource = format!("{}r", prefix("partition_lease"));
    let lock_key = nolock::keys::derive(&resource, "lock");
    let lease = Lock::new(TTL)
        .unwrap()
        .lease(through, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("free");
    // Let a renewal or two land, then cut the network.
    tokio::time::sleep(TTL / 2).await;
    proxy.partition();
    let cut = Instant::now();
    let loss = tokio::time::timeout(TTL * 3, lease.lost())
        .await
        .expect("the loss is signalled");
    assert!(matches!(loss, Loss::RenewalFailed { .. }), "{loss:?}");
    let pttl: i64 = raw(&mut direct, &["PTTL", &lock_key]).await;
    assert!(
        pttl > 0,
        "the server let the lock go before the holder was told ({:?} after the cut)",
        cut.elapsed()
    );
    assert!(Instant::now() <= lease.deadline() + Duration::from_millis(150));
    // Heal: whatever renewal was queued may land, but never revives a
    // lock that expired; the lock is gone within a TTL.
    proxy.heal();
    drop(lease);
    let start = Instant::now();
    loop {
        let exists: i64 = raw(&mut direct, &["EXISTS", &lock_key]).await;
        if exists == 0 {
            break;
        }
        assert!(start.elapsed() < TTL * 3, "the lock outlived its TTL");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The same for a permit: its score on the server (its expiry, server
/// clock) is still ahead when the permit lease reports the loss.
#[tokio::test]
async fn a_partitioned_permit_is_lost_before_the_server_expires_it() {
    let server = RedisServer::start();
    let mut direct = server.conn().await;
    let proxy = FaultProxy::start(server.port).await;
    let through = redis::Client::open(proxy.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = format!("{}s", prefix("partition_permit"));
    let lease = Semaphore::new(1, TTL)
        .unwrap()
        .lease(through, &key)
        .await
        .unwrap()
        .acquired()
        .expect("free");
    tokio::time::sleep(TTL / 2).await;
    proxy.partition();
    let loss = tokio::time::timeout(TTL * 3, lease.lost())
        .await
        .expect("the loss is signalled");
    assert!(matches!(loss, Loss::RenewalFailed { .. }), "{loss:?}");
    let (secs, micros): (String, String) = {
        let t: Vec<String> = raw(&mut direct, &["TIME"]).await;
        (t[0].clone(), t[1].clone())
    };
    let now_ms = secs.parse::<u64>().unwrap() * 1000 + micros.parse::<u64>().unwrap() / 1000;
    let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut direct)
        .await
        .unwrap();
    // The permit, after the semaphore's tag ("by:m1", score 0).
    let members: Vec<(String, f64)> = members
        .into_iter()
        .filter(|(m, _)| !m.starts_with("by:"))
        .collect();
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(
        members[0].1 as u64 > now_ms,
        "the permit expired on the server ({}) before the loss was signalled ({now_ms})",
        members[0].1
    );
    proxy.heal();
}
