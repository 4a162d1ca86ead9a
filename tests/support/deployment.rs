//! One test body, two deployments: a single `redis-server` or the 3×2
//! cluster, behind one connection type.
//!
//! [`AnyConn`] is also a worked example of a user's own connection wrapper:
//! it implements `ConnectionLike` by delegation and `nolock::BatchConnection`
//! by saying when it is a cluster.

use nolock::{Batch, BatchConnection, Operation};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::cluster::RedisCluster;
use super::{command_calls, RedisServer};

/// Where a test body runs.
pub enum Deployment {
    /// A server of its own: command counts on it are the test's alone.
    Single(RedisServer),
    /// The cluster shared by the tests of this binary: isolate by key prefix.
    Cluster(&'static RedisCluster),
}

impl Deployment {
    pub fn single() -> Self {
        Deployment::Single(RedisServer::start())
    }

    pub fn cluster() -> Self {
        Deployment::Cluster(RedisCluster::shared())
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Deployment::Cluster(_))
    }

    /// A connection as an application would hold it.
    pub async fn conn(&self) -> AnyConn {
        match self {
            Deployment::Single(server) => AnyConn::Single(server.conn().await),
            Deployment::Cluster(cluster) => AnyConn::Cluster(cluster.conn().await),
        }
    }

    /// A plain connection to the primary that owns `key`.
    pub async fn owner(&self, key: &str) -> MultiplexedConnection {
        match self {
            Deployment::Single(server) => server.conn().await,
            Deployment::Cluster(cluster) => cluster.node(cluster.shard_of(key).await.primary).await,
        }
    }

    /// The port of the primary that owns `key`.
    pub async fn owner_port(&self, key: &str) -> u16 {
        match self {
            Deployment::Single(server) => server.port,
            Deployment::Cluster(cluster) => cluster.shard_of(key).await.primary,
        }
    }

    /// Plain connections to every node: primaries and replicas.
    pub async fn nodes(&self) -> Vec<MultiplexedConnection> {
        match self {
            Deployment::Single(server) => vec![server.conn().await],
            Deployment::Cluster(cluster) => {
                cluster.nodes().await.into_iter().map(|(_, c)| c).collect()
            }
        }
    }

    /// Plain connections to every primary.
    pub async fn primaries(&self) -> Vec<MultiplexedConnection> {
        match self {
            Deployment::Single(server) => vec![server.conn().await],
            Deployment::Cluster(cluster) => {
                let mut conns = Vec::new();
                for shard in cluster.shards().await {
                    conns.push(cluster.node(shard.primary).await);
                }
                conns
            }
        }
    }

    /// `calls` of `cmd` summed over every primary.
    pub async fn calls_on_primaries(&self, cmd: &str) -> u64 {
        let mut total = 0;
        for mut conn in self.primaries().await {
            total += command_calls(&mut conn, cmd).await;
        }
        total
    }

    /// `GET key` on the primary that owns it.
    pub async fn get(&self, key: &str) -> Option<String> {
        let mut owner = self.owner(key).await;
        super::raw(&mut owner, &["GET", key]).await
    }

    /// True when the primary that owns `key` has it.
    pub async fn exists(&self, key: &str) -> bool {
        let mut owner = self.owner(key).await;
        super::raw::<i64>(&mut owner, &["EXISTS", key]).await == 1
    }

    /// Runs `call` in `tasks` tasks spread over 4 connections, released
    /// together by a barrier, and returns their outputs in task order.
    pub async fn race<T, F, Fut>(&self, tasks: usize, call: F) -> Vec<T>
    where
        F: Fn(AnyConn) -> Fut,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let mut conns = Vec::new();
        for _ in 0..4 {
            conns.push(self.conn().await);
        }
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(tasks));
        let handles: Vec<_> = (0..tasks)
            .map(|i| {
                let work = call(conns[i % conns.len()].clone());
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    work.await
                })
            })
            .collect();
        let mut outputs = Vec::with_capacity(tasks);
        for handle in handles {
            outputs.push(handle.await.expect("a racing task panicked"));
        }
        outputs
    }

    /// `SCRIPT FLUSH` on every node.
    pub async fn flush_scripts_everywhere(&self) {
        for mut conn in self.nodes().await {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .expect("SCRIPT FLUSH");
        }
    }
}

/// Cluster tests hold it for reading while they run; the ones that need the
/// cluster to themselves hold it for writing: those that empty script caches
/// or check what is cached (so a flush never lands in the middle of another
/// test, and no other test's `EVAL` re-caches a script between a flush and
/// the call that must find it missing), and those that count commands.
pub static CLUSTER_ACCESS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Makes a `single::` and a `cluster::` test of each body
/// (`async fn body(d: &Deployment)` in the calling file). `shared` bodies
/// run side by side on the cluster; `exclusive` ones alone
/// ([`CLUSTER_ACCESS`]).
#[allow(unused_macros)]
macro_rules! both {
    (shared: [$($shared:ident),* $(,)?], exclusive: [$($exclusive:ident),* $(,)?] $(,)?) => {
        mod single {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() {
                    super::$shared(&$crate::support::deployment::Deployment::single()).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $exclusive() {
                    super::$exclusive(&$crate::support::deployment::Deployment::single()).await
                }
            )*
        }
        mod cluster {
            use $crate::support::deployment::{Deployment, LogsOnPanic, CLUSTER_ACCESS};
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() {
                    let _cache = CLUSTER_ACCESS.read().await;
                    let d = Deployment::cluster();
                    let _logs = LogsOnPanic(&d);
                    super::$shared(&d).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $exclusive() {
                    let _cache = CLUSTER_ACCESS.write().await;
                    let d = Deployment::cluster();
                    let _logs = LogsOnPanic(&d);
                    super::$exclusive(&d).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both;

/// Runs `batch` three times, with `SCRIPT FLUSH` on every node before the
/// second run. Every entry's output must pass `expect(run, output)` (run 0,
/// 1, 2), so each run shows that every entry ran exactly once more; the
/// flushed run sends each entry once more (it got `NOSCRIPT` and did not
/// run) after a `SCRIPT LOAD` of its script on its node, never as `EVAL`,
/// and the third run needs no load. Counts commands: hold the deployment
/// alone.
pub async fn run_batch_through_a_flush<O, F>(d: &Deployment, batch: &Batch<O>, expect: F)
where
    O: Operation,
    O::Output: std::fmt::Debug,
    F: Fn(usize, &O::Output) -> bool,
{
    let mut conn = d.conn().await;
    nolock::Scripts::load(&mut conn).await.expect("SCRIPT LOAD");
    for run in 0..3 {
        if run == 1 {
            d.flush_scripts_everywhere().await;
        }
        let evals_before = d.calls_on_primaries("eval").await;
        let loads_before = d.calls_on_primaries("script|load").await;
        let results = batch.run(&mut conn).await;
        assert_eq!(results.len(), batch.len());
        for (i, result) in results.iter().enumerate() {
            match result {
                Ok(output) => assert!(expect(run, output), "run {run}, entry {i}: {output:?}"),
                Err(e) => panic!("run {run}, entry {i}: {e}"),
            }
        }
        let evals = d.calls_on_primaries("eval").await - evals_before;
        assert_eq!(evals, 0, "run {run}: EVALs");
        // The flushed run: one SCRIPT LOAD per script and primary, not one
        // per entry (at most 3 primaries; these batches use 1 or 2 scripts).
        let loads = d.calls_on_primaries("script|load").await - loads_before;
        match run {
            1 => assert!(
                (1..=3 * 2).contains(&loads),
                "run 1: {loads} SCRIPT LOADs for {} entries",
                batch.len()
            ),
            _ => assert_eq!(loads, 0, "run {run}: SCRIPT LOADs"),
        }
    }
}

/// Prints the shared cluster's node logs if the test panics (the shared
/// cluster itself is never dropped, so its own drop cannot).
pub struct LogsOnPanic<'a>(pub &'a Deployment);

impl Drop for LogsOnPanic<'_> {
    fn drop(&mut self) {
        if let (true, Deployment::Cluster(cluster)) = (std::thread::panicking(), self.0) {
            eprintln!("{}", cluster.logs());
        }
    }
}

/// A single-server or cluster connection.
#[derive(Clone)]
pub enum AnyConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for AnyConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AnyConn::Single(c) => c.req_packed_command(cmd),
            AnyConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            AnyConn::Single(c) => c.req_packed_commands(pipe, offset, count),
            AnyConn::Cluster(c) => c.req_packed_commands(pipe, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConn::Single(c) => c.get_db(),
            AnyConn::Cluster(c) => c.get_db(),
        }
    }
}

impl BatchConnection for AnyConn {
    fn as_cluster(&mut self) -> Option<&mut ClusterConnection> {
        match self {
            AnyConn::Single(_) => None,
            AnyConn::Cluster(c) => Some(c),
        }
    }
}
