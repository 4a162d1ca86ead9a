//! A primary and one replica in sync, the replica's link through the fault
//! proxy (`support::proxy`), which can hold the replication stream back (the
//! replica keeps running and answering, it only stops receiving); and the
//! forced failover of a managed Redis on one machine: the primary killed
//! with SIGKILL, the replica promoted with `REPLICAOF NO ONE`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use super::proxy::FaultProxy;
use super::{raw, RedisServer};

/// A primary and its replica, the replica's link through a proxy.
pub struct Pair {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub link: FaultProxy,
    /// A connection to the primary.
    pub p: MultiplexedConnection,
}

/// A pair of plain servers.
pub async fn pair() -> Pair {
    pair_with(&[]).await
}

/// A pair whose servers both get `args` (e.g. `--appendonly yes`).
pub async fn pair_with(args: &[&str]) -> Pair {
    let primary = RedisServer::start_with(args);
    let link = FaultProxy::start(primary.port).await;
    let port = link.port.to_string();
    let mut replica_args = vec!["--replicaof", "127.0.0.1", &port];
    replica_args.extend_from_slice(args);
    let replica = RedisServer::start_with(&replica_args);
    // Acknowledged calls wait up to their timeout (5 s in the suites) in
    // one round trip: the connection's response timeout must be longer
    // (`Lock::acknowledged`); redis-rs's default is 500 ms, which a loaded
    // machine's first confirmation can outlast.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let mut p = primary
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect to the primary");
    // The first sync: WAIT 1 answers 1 once the replica is attached.
    let start = Instant::now();
    loop {
        let acked: i64 = raw(&mut p, &["WAIT", "1", "100"]).await;
        if acked == 1 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no replica sync");
    }
    Pair {
        primary,
        replica,
        link,
        p,
    }
}

impl Pair {
    /// The primary dies with what the replica has not received; the replica
    /// is promoted. A connection to it.
    pub async fn fail_over(&mut self) -> MultiplexedConnection {
        self.primary.kill();
        self.link.cut_all();
        let mut r = self.replica.conn().await;
        let _: () = raw(&mut r, &["REPLICAOF", "NO", "ONE"]).await;
        r
    }
}
