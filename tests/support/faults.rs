//! Server-level faults driven from a test: each one is a plain function on a
//! connection (or a server, or the cluster), so a test or a randomised fault
//! task can call them in any order.
//!
//! | fault | what the server does | what nolock's caller should see |
//! |---|---|---|
//! | [`script_flush`] | forgets every script | nothing (`EVAL` fallback) |
//! | [`client_kill`] | closes every client connection | `Indeterminate` for calls in flight, definite for calls after |
//! | [`client_pause`] | holds writes for a while | slow replies |
//! | [`busy`] | runs a long script; others get `BUSY` | definite `Redis` errors |
//! | [`oom`] | `maxmemory` below use: writes refused | definite `OOM` errors |
//! | [`kill_and_restart`] | `kill -9`, restart from the AOF | `Indeterminate` in flight, then `LOADING` (resent), no lost write |
//! | [`migrate_slot`] | moves a slot to another primary | `ASK`/`TRYAGAIN`/`MOVED`, all resent |
//! | `RedisCluster::failover` | coordinated `CLUSTER FAILOVER` | `MOVED`/`READONLY`, resent |
#![allow(dead_code)]

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::cluster::RedisCluster;
use super::RedisServer;

/// Extra `redis-server` arguments that make every acknowledged write
/// survive `kill -9`.
pub const DURABLE: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

async fn run(conn: &mut MultiplexedConnection, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await
}

/// `SCRIPT FLUSH`.
pub async fn script_flush(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    run(conn, &["SCRIPT", "FLUSH"]).await.map(drop)
}

/// Close every normal client connection but the caller's.
pub async fn client_kill(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    run(conn, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .await
        .map(drop)
}

/// `CLIENT PAUSE <ms> WRITE`: writes (and scripts) wait, reads go on.
pub async fn client_pause(
    conn: &mut MultiplexedConnection,
    pause: Duration,
) -> redis::RedisResult<()> {
    let ms = pause.as_millis().to_string();
    run(conn, &["CLIENT", "PAUSE", &ms, "WRITE"])
        .await
        .map(drop)
}

/// Make the server answer `BUSY` for about `length`: lower the busy-reply
/// threshold to 10 ms and run a script that spins on `TIME`, on a
/// connection of its own. Returns when the script has finished.
pub async fn busy(url: &str, length: Duration) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    run(&mut conn, &["CONFIG", "SET", "busy-reply-threshold", "10"]).await?;
    let spin = "local t = redis.call('TIME') \
                local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1]) \
                repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop \
                return 1";
    let micros = length.as_micros().to_string();
    run(&mut conn, &["EVAL", spin, "0", &micros])
        .await
        .map(drop)
}

/// `maxmemory` at 1 byte for `length`: every write is refused with `OOM`.
pub async fn oom(conn: &mut MultiplexedConnection, length: Duration) -> redis::RedisResult<()> {
    run(conn, &["CONFIG", "SET", "maxmemory", "1"]).await?;
    tokio::time::sleep(length).await;
    run(conn, &["CONFIG", "SET", "maxmemory", "0"])
        .await
        .map(drop)
}

/// `kill -9` the server and start it again on the same port and directory;
/// with [`DURABLE`] arguments it reloads every acknowledged write. Blocks
/// until the server answers `PING` (after loading).
pub fn kill_and_restart(server: &mut RedisServer) {
    server.kill();
    server.restart();
}

/// The node id of the server on `port`.
pub async fn node_id(cluster: &RedisCluster, port: u16) -> String {
    let mut conn = cluster.node(port).await;
    let id: String = redis::cmd("CLUSTER")
        .arg("MYID")
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("CLUSTER MYID on :{port}: {e}"));
    id
}

/// Move `slot` from its owner to the primary on port `to`, the way
/// `redis-cli --cluster reshard` does: `SETSLOT IMPORTING` on the target,
/// `SETSLOT MIGRATING` on the source, `MIGRATE` the keys in batches (waiting
/// `pause` between batches, to keep the slot half-moved for a while), then
/// `SETSLOT NODE` on every primary. Returns the source's port.
pub async fn migrate_slot(cluster: &RedisCluster, slot: u16, to: u16, pause: Duration) -> u16 {
    let shards = cluster.shards().await;
    let from = shards
        .iter()
        .find(|s| s.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
        .expect("every slot is covered")
        .primary;
    if from == to {
        return from;
    }
    let (from_id, to_id) = (node_id(cluster, from).await, node_id(cluster, to).await);
    let slot_arg = slot.to_string();
    let mut source = cluster.admin_node(from).await;
    let mut target = cluster.admin_node(to).await;
    let setslot = |state: &'static str, id: String| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        cmd
    };
    let _: () = setslot("IMPORTING", from_id.clone())
        .query_async(&mut target)
        .await
        .unwrap_or_else(|e| panic!("SETSLOT IMPORTING on :{to}: {e}"));
    let _: () = setslot("MIGRATING", to_id.clone())
        .query_async(&mut source)
        .await
        .unwrap_or_else(|e| panic!("SETSLOT MIGRATING on :{from}: {e}"));
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(&slot_arg)
            .arg(2)
            .query_async(&mut source)
            .await
            .unwrap_or_else(|e| panic!("GETKEYSINSLOT on :{from}: {e}"));
        if keys.is_empty() {
            break;
        }
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(to)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        let _: redis::Value = migrate
            .query_async(&mut source)
            .await
            .unwrap_or_else(|e| panic!("MIGRATE {keys:?} :{from} -> :{to}: {e}"));
        tokio::time::sleep(pause).await;
    }
    tokio::time::sleep(pause).await;
    // The target first, so that the source's MOVED never points at a node
    // that does not yet own the slot.
    let _: () = setslot("NODE", to_id.clone())
        .query_async(&mut target)
        .await
        .unwrap_or_else(|e| panic!("SETSLOT NODE on :{to}: {e}"));
    let _: () = setslot("NODE", to_id.clone())
        .query_async(&mut source)
        .await
        .unwrap_or_else(|e| panic!("SETSLOT NODE on :{from}: {e}"));
    for shard in shards {
        if shard.primary != from && shard.primary != to {
            let mut other = cluster.node(shard.primary).await;
            let _: () = setslot("NODE", to_id.clone())
                .query_async(&mut other)
                .await
                .unwrap_or_else(|e| panic!("SETSLOT NODE on :{}: {e}", shard.primary));
        }
    }
    from
}

/// A field of `INFO replication` on the node at `port`, as a number.
pub async fn replication_offset(port: u16, field: &str) -> Option<i64> {
    let mut conn = try_node(port).await?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

async fn try_node(port: u16) -> Option<MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .ok()
}

/// A coordinated `CLUSTER FAILOVER` of `key`'s shard that gives up (without
/// panicking) when the roles have not switched everywhere within 10 s, as
/// happens when the primary is busy when the replica asks. Returns
/// `(old primary, new primary)` once every node reports the new one.
pub async fn try_failover(cluster: &RedisCluster, key: &str) -> Result<(u16, u16), String> {
    try_failover_with(cluster, key, None).await
}

/// [`try_failover`] with `FORCE` or `TAKEOVER` (`how`): the replica takes
/// over without waiting for the primary's last writes, which the old
/// primary may have answered and the new one never receives. Once it
/// returns, every node names the new primary, the old one included, so it
/// takes no more writes.
pub async fn try_failover_with(
    cluster: &RedisCluster,
    key: &str,
    how: Option<&str>,
) -> Result<(u16, u16), String> {
    let shard = cluster.shard_of(key).await;
    let old = shard.primary;
    let new = *shard.replicas.first().ok_or("the shard has no replica")?;
    let mut replica = try_node(new).await.ok_or("replica unreachable")?;
    let mut failover = redis::cmd("CLUSTER");
    failover.arg("FAILOVER");
    if let Some(how) = how {
        failover.arg(how);
    }
    let _: () = failover
        .query_async(&mut replica)
        .await
        .map_err(|e| format!("CLUSTER FAILOVER {how:?} on :{new}: {e}"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut agreed = true;
        for port in cluster.ports() {
            let Some(mut conn) = try_node(port).await else {
                agreed = false;
                break;
            };
            let slots: redis::RedisResult<Vec<Vec<redis::Value>>> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await;
            let sees_new = slots.is_ok_and(|ranges| {
                ranges.iter().any(|range| {
                    redis::from_redis_value::<Vec<redis::Value>>(range[2].clone())
                        .ok()
                        .and_then(|p| redis::from_redis_value::<i64>(p[1].clone()).ok())
                        == Some(i64::from(new))
                })
            });
            let info: redis::RedisResult<String> = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await;
            let ok = info.is_ok_and(|i| i.contains("cluster_state:ok"));
            if !(sees_new && ok) {
                agreed = false;
                break;
            }
        }
        if agreed {
            return Ok((old, new));
        }
    }
    Err(format!(
        "failover :{old} -> :{new} did not complete within 10 s"
    ))
}
