//! A throwaway local Redis Cluster: 3 primaries with 1 replica each.
//!
//! [`RedisCluster::start`] spawns six `redis-server --cluster-enabled yes`
//! processes on free ports, joins them with `redis-cli --cluster create
//! --cluster-replicas 1`, and returns only when every node reports
//! `cluster_state:ok`, every node's `CLUSTER SLOTS` shows three slot ranges
//! with one replica each, and every replica's link to its primary is up. Every
//! step is bounded; a failed attempt is torn down and retried on new ports.
//!
//! Each node runs under a small `sh` guard that reads its stdin: when the
//! cluster is dropped, or the test process dies in any way, the pipe closes and
//! the guard kills the node. So even a cluster kept in a `static` (shared by
//! the tests of one file, see [`RedisCluster::shared`]) never outlives its
//! test binary. Node logs are printed when a cluster is dropped during a panic.
//!
//! Shared by the integration tests and the examples (`#[path]`-included next
//! to `server.rs`), so it uses only std, redis and tokio.
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use super::server::{install_hint, ping, redis_server_binary};

/// Nodes in the cluster: the first three become primaries, the last three
/// their replicas (that is how `redis-cli --cluster create` assigns them).
const NODES: usize = 6;
const PRIMARIES: usize = 3;

/// How long a node may be unreachable before the others mark it failed (and
/// the window of a manual failover is a small multiple of it).
const NODE_TIMEOUT_MS: &str = "3000";

/// One node: the `sh` guard process and the port of the `redis-server` it runs.
#[derive(Debug)]
struct Node {
    port: u16,
    guard: Option<Child>,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
}

impl Node {
    fn spawn(port: u16, dir: PathBuf) -> Result<Node, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let conf = dir.join("nodes.conf");
        let log = dir.join("redis.log");
        // `read` returns when our end of the pipe closes (drop or process
        // death); the guard then kills the server and waits for it.
        let script = r#""$0" "$@" & pid=$!; read _unused; kill -9 "$pid" 2>/dev/null; wait "$pid""#;
        let mut guard = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(redis_server_binary())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .arg("--cluster-config-file")
            .arg(&conf)
            .args(["--cluster-node-timeout", NODE_TIMEOUT_MS])
            // No automatic failover when a noisy box stalls a primary: tests
            // change the topology only on purpose, with `CLUSTER FAILOVER`
            // (which this setting still allows).
            .args(["--cluster-replica-no-failover", "yes"])
            .args(["--save", "", "--appendonly", "no"])
            // Full syncs start at once instead of after the default 5 s.
            .args(["--repl-diskless-sync-delay", "0"])
            // `CLUSTER SLOTS` lists a replica only once its replication offset
            // is above 0, which on an idle primary takes one replication ping
            // (every 10 s by default).
            .args(["--repl-ping-replica-period", "1"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("sh: {e}"))?;
        let stdin = guard.stdin.take();
        let mut node = Node {
            port,
            guard: Some(guard),
            stdin,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping(port) {
                return Ok(node);
            }
            if let Some(Ok(Some(status))) = node.guard.as_mut().map(|g| g.try_wait()) {
                return Err(format!(
                    "node :{port} exited with {status} ({}): {}",
                    install_hint(),
                    node.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!("node :{port} did not answer PING: {}", node.log()))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    fn stop(&mut self) {
        // Closing the pipe makes the guard kill the server.
        drop(self.stdin.take());
        if let Some(mut guard) = self.guard.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = guard.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = guard.kill();
            let _ = guard.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running 3×2 cluster, stopped on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

/// A port `p` such that `p` and its cluster bus port `p + 10000` are both
/// free, below the kernel's ephemeral range so that outgoing connections of
/// other tests do not take them.
fn free_port_pair(taken: &[u16]) -> u16 {
    static NEXT: Mutex<u32> = Mutex::new(0);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    if *next == 0 {
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
        *next = seed.wrapping_mul(2_654_435_761);
    }
    for _ in 0..10_000 {
        *next = next.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let port = 20_000 + ((*next >> 8) % 2_700) as u16;
        if taken.contains(&port) {
            continue;
        }
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair in 20000..22700 / 30000..32700");
}

/// Remove the directories of clusters whose test process is gone (a shared
/// cluster is never dropped, so nothing else removes its directory).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("nolock-cluster-"))
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let alive = std::path::Path::new("/proc").join(pid).exists();
        if std::path::Path::new("/proc/self").exists() && !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Run `redis-cli` with `args`, killing it after `timeout`.
fn redis_cli(args: &[String], timeout: Duration) -> Result<String, String> {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out_file =
        std::env::temp_dir().join(format!("nolock-cli-{}-{run}.out", std::process::id()));
    let out = std::fs::File::create(&out_file).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut child = Command::new("redis-cli")
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("redis-cli: {e} (install redis-tools)"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    match status {
        Some(s) if s.success() => Ok(output),
        Some(s) => Err(format!("redis-cli {args:?} exited with {s}: {output}")),
        None => Err(format!("redis-cli {args:?} timed out: {output}")),
    }
}

/// A blocking query to one node, with a short timeout; `None` on any failure.
fn query<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut conn).ok()
}

/// A field of an `INFO`-style `key:value` text.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// Poll `ready` every 50 ms until it holds or `timeout` passes.
fn wait_until(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl RedisCluster {
    /// Start a cluster of 3 primaries and 3 replicas and wait until it is
    /// fully up. Panics (with the node logs) after 3 failed attempts.
    pub fn start() -> Self {
        let mut last_error = String::new();
        for attempt in 1..=3 {
            match Self::try_start() {
                Ok(cluster) => return cluster,
                Err(e) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "cluster start attempt {attempt} failed: {e}"
                    );
                    last_error = e;
                }
            }
        }
        panic!("redis cluster did not start after 3 attempts: {last_error}");
    }

    /// One cluster shared by the tests of one test binary, started by the
    /// first caller. It is never dropped: its nodes stop when the test
    /// process exits (their guards see the pipe close). Tests sharing it must
    /// isolate themselves with key prefixes and must not change the topology.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(RedisCluster::start)
    }

    fn try_start() -> Result<Self, String> {
        remove_stale_dirs();
        let mut ports = Vec::new();
        for _ in 0..NODES {
            ports.push(free_port_pair(&ports));
        }
        let dir = std::env::temp_dir().join(format!(
            "nolock-cluster-{}-{}",
            std::process::id(),
            ports[0]
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            dir: dir.clone(),
        };
        for &port in &ports {
            cluster
                .nodes
                .push(Node::spawn(port, dir.join(port.to_string()))?);
        }

        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        redis_cli(&args, Duration::from_secs(30)).map_err(|e| cluster.describe(&e))?;

        if !wait_until(Duration::from_secs(30), || cluster.is_ready()) {
            return Err(cluster.describe("cluster not ready within 30 s"));
        }
        Ok(cluster)
    }

    /// True when every node is ok, sees every slot range with one replica,
    /// and every replica is in sync with its primary.
    fn is_ready(&self) -> bool {
        self.nodes.iter().all(|node| {
            let info: Option<String> = query(node.port, &["CLUSTER", "INFO"]);
            let ok = info
                .as_deref()
                .and_then(|i| info_field(i, "cluster_state"))
                .is_some_and(|s| s == "ok");
            let slots: Option<Vec<Vec<redis::Value>>> = query(node.port, &["CLUSTER", "SLOTS"]);
            // [start, end, primary, replica]: one replica per range.
            let replicated = slots.is_some_and(|ranges| {
                ranges.len() == PRIMARIES && ranges.iter().all(|range| range.len() == 4)
            });
            let replication: Option<String> = query(node.port, &["INFO", "replication"]);
            let linked = replication.as_deref().is_some_and(|r| {
                info_field(r, "role") != Some("slave")
                    || info_field(r, "master_link_status") == Some("up")
            });
            ok && replicated && linked
        })
    }

    fn describe(&self, error: &str) -> String {
        let mut text = format!("{error}\n");
        for node in &self.nodes {
            let log = node.log();
            let tail: Vec<_> = log.lines().rev().take(30).collect();
            text.push_str(&format!("---- node :{} (last lines) ----\n", node.port));
            for line in tail.iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// The ports of all six nodes.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `redis://127.0.0.1:<port>/` for every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }

    /// A cluster client configured the way nolock's docs recommend: redis-rs
    /// retries off (`retries(0)`), so that no script is ever replayed after a
    /// lost reply; nolock follows redirects itself.
    pub fn client(&self) -> ClusterClient {
        ClusterClient::builder(self.urls())
            .retries(0)
            .build()
            .expect("valid cluster urls")
    }

    /// A cluster connection from [`Self::client`].
    pub async fn conn(&self) -> ClusterConnection {
        self.client()
            .get_async_connection()
            .await
            .expect("connect to test cluster")
    }

    /// A plain connection to one node.
    pub async fn node(&self, port: u16) -> MultiplexedConnection {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .expect("valid url")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to node :{port}: {e}"))
    }

    /// A connection to one node for administration (slot moves), whose
    /// replies may be slow: Valkey 8+ answers `CLUSTER SETSLOT` only once
    /// the node's replicas have it (up to 2 s when one is paused), past the
    /// 500 ms that a plain connection waits.
    pub async fn admin_node(&self, port: u16) -> MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(std::time::Duration::from_secs(15)));
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .expect("valid url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap_or_else(|e| panic!("connect to node :{port}: {e}"))
    }

    /// A plain connection to every node, with its port.
    pub async fn nodes(&self) -> Vec<(u16, MultiplexedConnection)> {
        let mut conns = Vec::new();
        for port in self.ports() {
            conns.push((port, self.node(port).await));
        }
        conns
    }

    /// The current roles: `(primary port, replica ports, slot ranges)` per
    /// shard, as node `port` sees them.
    pub async fn shards(&self) -> Vec<Shard> {
        let mut conn = self.node(self.nodes[0].port).await;
        let slots: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
            .expect("CLUSTER SLOTS");
        let mut shards: Vec<Shard> = Vec::new();
        for range in slots {
            let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).unwrap_or(-1);
            let port_of = |v: &redis::Value| {
                let parts: Vec<redis::Value> = redis::from_redis_value(v.clone()).unwrap();
                int(&parts[1]) as u16
            };
            let (start, end) = (int(&range[0]) as u16, int(&range[1]) as u16);
            let primary = port_of(&range[2]);
            let replicas: Vec<u16> = range[3..].iter().map(port_of).collect();
            match shards.iter_mut().find(|s| s.primary == primary) {
                Some(shard) => shard.slots.push((start, end)),
                None => shards.push(Shard {
                    primary,
                    replicas,
                    slots: vec![(start, end)],
                }),
            }
        }
        shards
    }

    /// The shard that owns `key`'s slot.
    pub async fn shard_of(&self, key: &str) -> Shard {
        let slot = nolock::keys::slot(key);
        self.shards()
            .await
            .into_iter()
            .find(|s| s.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .expect("every slot is covered")
    }

    /// `SCRIPT FLUSH` on every node, primaries and replicas.
    pub async fn flush_scripts_everywhere(&self) {
        for (port, mut conn) in self.nodes().await {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("SCRIPT FLUSH on :{port}: {e}"));
        }
    }

    /// Promote the replica of `key`'s shard with a coordinated `CLUSTER
    /// FAILOVER` and wait until the roles have switched everywhere and the
    /// cluster is ok again. Returns `(old primary, new primary)`.
    pub async fn failover(&self, key: &str) -> (u16, u16) {
        self.failover_with(key, None).await
    }

    /// [`RedisCluster::failover`] with `CLUSTER FAILOVER FORCE` (the replica
    /// does not wait for the primary to hand over its last writes) or
    /// `TAKEOVER` (nor for the other primaries' votes), as a managed Redis
    /// or an operator does when the primary does not answer.
    pub async fn failover_with(&self, key: &str, how: Option<&str>) -> (u16, u16) {
        // Right after an earlier failover, the node asked may not list the
        // demoted primary as a replica yet: wait until it does.
        let start = Instant::now();
        let shard = loop {
            let shard = self.shard_of(key).await;
            if !shard.replicas.is_empty() {
                break shard;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{}",
                self.describe(&format!("the shard of {key} has no replica"))
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (old, new) = (shard.primary, shard.replicas[0]);
        let mut replica = self.node(new).await;
        let mut failover = redis::cmd("CLUSTER");
        failover.arg("FAILOVER");
        if let Some(how) = how {
            failover.arg(how);
        }
        let _: () = failover
            .query_async(&mut replica)
            .await
            .unwrap_or_else(|e| panic!("CLUSTER FAILOVER {how:?} on :{new}: {e}"));
        let switched = tokio::task::spawn_blocking({
            let ports = self.ports();
            move || {
                wait_until(Duration::from_secs(30), || {
                    let role = |port: u16| {
                        query::<String>(port, &["INFO", "replication"])
                            .and_then(|i| info_field(&i, "role").map(String::from))
                    };
                    let roles_switched = role(new).as_deref() == Some("master")
                        && role(old).as_deref() == Some("slave");
                    let old_linked = query::<String>(old, &["INFO", "replication"])
                        .is_some_and(|i| info_field(&i, "master_link_status") == Some("up"));
                    // Every node must agree that `new` is the primary of the
                    // range and that the cluster is ok.
                    let agreed = ports.iter().all(|&port| {
                        let ok = query::<String>(port, &["CLUSTER", "INFO"])
                            .is_some_and(|i| info_field(&i, "cluster_state") == Some("ok"));
                        let slots: Option<Vec<Vec<redis::Value>>> =
                            query(port, &["CLUSTER", "SLOTS"]);
                        let sees_new = slots.is_some_and(|ranges| {
                            ranges.iter().any(|range| {
                                let primary: Option<Vec<redis::Value>> =
                                    redis::from_redis_value(range[2].clone()).ok();
                                primary.is_some_and(|p| {
                                    redis::from_redis_value::<i64>(p[1].clone()).ok()
                                        == Some(i64::from(new))
                                })
                            })
                        });
                        ok && sees_new
                    });
                    roles_switched && old_linked && agreed
                })
            }
        })
        .await
        .expect("failover wait task");
        assert!(
            switched,
            "{}",
            self.describe(&format!("failover :{old} -> :{new} did not complete"))
        );
        (old, new)
    }

    /// The last lines of every node's log.
    pub fn logs(&self) -> String {
        self.describe("cluster logs")
    }
}

/// One shard as `CLUSTER SLOTS` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub primary: u16,
    pub replicas: Vec<u16>,
    pub slots: Vec<(u16, u16)>,
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = writeln!(
                std::io::stderr(),
                "{}",
                self.describe("cluster dropped during a panic")
            );
        }
        for node in &mut self.nodes {
            node.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
