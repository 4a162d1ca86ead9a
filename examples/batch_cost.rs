//! What batching and a cluster buy, measured in one run.
//!
//! 1. One connection to one server: `limits::try_increment` one call at a
//!    time, the same calls from concurrent tasks sharing the connection, and
//!    the same calls as `Batch`es.
//! 2. The same client concurrency against one server and against a 3-primary
//!    cluster: single calls, then batches.
//!
//! ```text
//! cargo run --release --example batch_cost
//! ```
//!
//! Starts its own `redis-server` and a local 3×2 cluster (needs
//! `redis-server` and `redis-cli` on the PATH), unless `REDIS_URL` (a single
//! server) and `REDIS_CLUSTER_URLS` (comma-separated cluster nodes) are set.
//! Keys are written under `nolock-bench:`. Numbers depend on the machine: on
//! one small box the client, the server(s) and the cluster bus all compete
//! for the same cores.

#[path = "../tests/support/server.rs"]
mod server;

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::time::{Duration, Instant};

use nolock::limits::{self, TryIncrement};
use nolock::{Batch, BatchConnection};
use redis::aio::ConnectionLike;

const OPS: usize = 20_000;
const BATCH: usize = 1_000;
const TASKS: usize = 64;
const WINDOW: Duration = Duration::from_secs(600);

fn key(run: &str, i: usize) -> String {
    format!("nolock-bench:{run}:{}:{i}", std::process::id())
}

/// `OPS` single calls, one at a time.
async fn sequential<C: ConnectionLike + Send>(conn: &mut C, run: &str) -> f64 {
    let start = Instant::now();
    for i in 0..OPS {
        let a = limits::try_increment(conn, &key(run, i % 5_000), u64::MAX >> 12, WINDOW)
            .await
            .expect("try_increment");
        assert!(a.admitted);
    }
    OPS as f64 / start.elapsed().as_secs_f64()
}

/// `OPS` single calls from `TASKS` tasks sharing clones of one connection.
async fn concurrent<C>(conn: &C, run: &str) -> f64
where
    C: ConnectionLike + Send + Clone + 'static,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let mut conn = conn.clone();
        let run = run.to_owned();
        tasks.push(tokio::spawn(async move {
            for i in (t..OPS).step_by(TASKS) {
                let a =
                    limits::try_increment(&mut conn, &key(&run, i % 5_000), u64::MAX >> 12, WINDOW)
                        .await
                        .expect("try_increment");
                assert!(a.admitted);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    OPS as f64 / start.elapsed().as_secs_f64()
}

/// `OPS` operations as batches of `BATCH`, sent by `tasks` tasks at once.
async fn batched<C>(conn: &C, run: &str, tasks: usize) -> f64
where
    C: BatchConnection + Clone + 'static,
{
    let batches: Vec<Batch<TryIncrement>> = (0..OPS / BATCH)
        .map(|b| {
            (0..BATCH)
                .map(|i| {
                    TryIncrement::new(
                        &nolock::limits::Counter::new(u64::MAX >> 12, WINDOW).expect("valid"),
                        &key(run, (b * BATCH + i) % 5_000),
                    )
                    .expect("valid")
                })
                .collect()
        })
        .collect();
    let batches = std::sync::Arc::new(batches);
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut conn = conn.clone();
        let batches = batches.clone();
        handles.push(tokio::spawn(async move {
            for batch in batches.iter().skip(t).step_by(tasks) {
                for result in batch.run(&mut conn).await {
                    assert!(result.expect("batch entry").admitted);
                }
            }
        }));
    }
    for handle in handles {
        handle.await.expect("task");
    }
    OPS as f64 / start.elapsed().as_secs_f64()
}

fn row(what: &str, ops_per_sec: f64, base: f64) {
    println!(
        "{what:<58} {:>10.0} ops/s  {:>5.1}x",
        ops_per_sec,
        ops_per_sec / base
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (single_url, _server) = server::url_from_env_or_start();
    let (_cluster, cluster_urls) = match std::env::var("REDIS_CLUSTER_URLS") {
        Ok(urls) if !urls.is_empty() => (None, urls.split(',').map(String::from).collect()),
        _ => {
            let cluster = cluster::RedisCluster::start();
            let urls = cluster.urls();
            (Some(cluster), urls)
        }
    };

    let mut single = redis::Client::open(single_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut clustered = redis::cluster::ClusterClient::builder(cluster_urls)
        .retries(0)
        .build()?
        .get_async_connection()
        .await?;
    nolock::Scripts::load(&mut single).await?;
    nolock::Scripts::load(&mut clustered).await?;
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut single)
        .await?;
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();

    // Warm up connections and the allocator on both deployments.
    sequential(&mut single, "warm").await;
    concurrent(&clustered, "warm").await;

    println!(
        "limits::try_increment, {OPS} operations per row, {} CPUs, Redis {version}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("\n1. One connection, one server");
    let seq = sequential(&mut single, "seq").await;
    row("one call at a time", seq, seq);
    let conc = concurrent(&single, "conc").await;
    row(
        &format!("single calls from {TASKS} tasks sharing the connection"),
        conc,
        seq,
    );
    let batch1 = batched(&single, "batch1", 1).await;
    row(&format!("batches of {BATCH}, one at a time"), batch1, seq);

    println!("\n2. Same client concurrency: one server vs 3-primary cluster");
    let single_conc = concurrent(&single, "s-conc").await;
    row(
        &format!("one server, single calls, {TASKS} tasks"),
        single_conc,
        single_conc,
    );
    let cluster_conc = concurrent(&clustered, "c-conc").await;
    row(
        &format!("cluster, single calls, {TASKS} tasks"),
        cluster_conc,
        single_conc,
    );
    let single_batch = batched(&single, "s-batch", 4).await;
    row(
        &format!("one server, batches of {BATCH}, 4 tasks"),
        single_batch,
        single_conc,
    );
    let cluster_batch = batched(&clustered, "c-batch", 4).await;
    row(
        &format!("cluster, batches of {BATCH}, 4 tasks"),
        cluster_batch,
        single_conc,
    );
    let stats = nolock::stats();
    println!(
        "\nnolock::stats(): {} calls, {} batches, {} NOSCRIPT fallbacks, {} redirects",
        stats.calls, stats.batches, stats.noscript_fallbacks, stats.redirects
    );
    Ok(())
}
