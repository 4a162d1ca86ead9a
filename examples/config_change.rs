//! How long after a change returns does any process still decide by the
//! old numbers? Measured with 4 processes × 64 tasks under load, on one
//! server and on a 3-primary cluster, with the default poll (250 ms) and
//! with 50 ms.
//!
//! ```text
//! cargo run --release --example config_change
//! ```
//!
//! The example runs itself again as 4 worker processes
//! (`config_change --worker ...`). Each has one `nolock::Client` and 64
//! tasks that check one rate limit in a loop, each task for an id of its
//! own, and keeps, for every decision, the wall-clock time the call was sent
//! and whether it was decided by the old numbers (every answer carries the
//! burst it was decided by: `Admitted::limit`, `Limited::limit`). Once every
//! task decided, the parent waits 300 ms plus a random part of one poll
//! interval (so that the change lands at a random point of the workers'
//! poll cycles), raises the burst with `Configs::set(.., Change::Keep)`,
//! notes the time the call returned, lets the workers run
//! 1.5 s more, and closes their stdin. Each worker then prints one JSON line:
//! its decision counts and the send time of its last decision by the old
//! numbers. The bound of a round is the latest of those, over the 4
//! workers, minus the time the change returned (0 when no call sent after
//! it was decided by the old numbers); a row gives the median and the
//! largest over 5 rounds, each on a fresh name. All processes run on one
//! machine, so their wall clocks are one clock.
//!
//! The numbers to compare it with: a client reads the epoch every poll
//! interval, then the registry when it moved (`TYPE`, `HGETALL`), so the
//! bound is one interval plus those three round trips, and more when a
//! loaded process runs its poll late.
//!
//! Starts its own `redis-server` and a local 3×2 cluster (needs
//! `redis-server` and `redis-cli` on the PATH), unless `REDIS_URL` (a single
//! server) and `REDIS_CLUSTER_URLS` (comma-separated cluster nodes) are set.
//! When the cluster cannot be started it says why and measures the single
//! server only.

#[path = "../tests/support/server.rs"]
mod server;

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::client::Rejection;
use nolock::config::{Change, Spec};
use nolock::rate::{Algorithm, Quota};
use nolock::Client;
use serde::{Deserialize, Serialize};

const WORKERS: usize = 4;
const TASKS: usize = 64;
const ROUNDS: usize = 5;
/// How long the workers run at full load before the change (plus a
/// random part of one poll interval).
const BEFORE: Duration = Duration::from_millis(300);
/// How long they run after it.
const AFTER: Duration = Duration::from_millis(1500);
/// The old and the new burst. The rate is far above what the tasks send,
/// so every call is admitted: the load is the same before and after.
const RATE: u64 = 1_000_000;
const OLD_BURST: u64 = 1_000_000;
const NEW_BURST: u64 = 2_000_000;

const USAGE: &str = "usage: cargo run --release --example config_change

Measures the time from a configuration change returning to the last decision
by the old numbers, with 4 worker processes x 64 tasks, on one server and on a
3-primary cluster, with the default poll (250 ms) and with 50 ms. Uses
$REDIS_URL and $REDIS_CLUSTER_URLS when set; otherwise starts redis-server
processes on free ports.";

/// What a worker reports when its stdin closes.
#[derive(Debug, Serialize, Deserialize)]
struct Report {
    /// Every decision (admitted or limited).
    decisions: u64,
    /// Decisions by the old burst.
    old: u64,
    /// Calls that got no decision (an error from Redis).
    errors: u64,
    /// Send time of the last decision by the old burst, in µs since the
    /// Unix epoch; 0 when there was none.
    last_old_us: u64,
    /// Send times of the first and the last call, in µs since the Unix
    /// epoch: the span the decisions were made in.
    first_us: u64,
    last_us: u64,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn quota(burst: u64) -> Quota {
    Quota::per_second(RATE)
        .and_then(|q| q.with_burst(burst))
        .expect("a valid quota")
}

/// Where the workers and the operator connect.
#[derive(Debug, Clone)]
enum Target {
    Single(String),
    Cluster(Vec<String>),
}

impl Target {
    fn label(&self) -> &'static str {
        match self {
            Target::Single(_) => "single",
            Target::Cluster(_) => "cluster",
        }
    }

    /// `single URL` or `cluster URL,URL,...`: a worker's arguments.
    fn args(&self) -> [String; 2] {
        match self {
            Target::Single(url) => ["single".into(), url.clone()],
            Target::Cluster(urls) => ["cluster".into(), urls.join(",")],
        }
    }

    fn parse(kind: &str, urls: &str) -> Option<Target> {
        match kind {
            "single" => Some(Target::Single(urls.to_owned())),
            "cluster" => Some(Target::Cluster(urls.split(',').map(String::from).collect())),
            _ => None,
        }
    }

    async fn client(&self, poll: Duration) -> nolock::Result<Client> {
        let client = match self {
            Target::Single(url) => Client::connect(url.as_str()).await?,
            Target::Cluster(urls) => {
                Client::connect_cluster(urls.iter().map(String::as_str)).await?
            }
        };
        client.config_poll(poll)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--worker") => match worker(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker: {e}");
                ExitCode::FAILURE
            }
        },
        Some("-h" | "--help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("unknown argument {other:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
        None => match parent() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("config_change: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `--worker single|cluster URLS POLL_MS NAME`: one client, 64 tasks, until
/// stdin closes; prints `ready` once every task decided, then the report.
fn worker(args: &[String]) -> Result<(), String> {
    let [kind, urls, poll_ms, name] = args else {
        return Err(format!("worker arguments: {args:?}"));
    };
    let target = Target::parse(kind, urls).ok_or_else(|| format!("deployment {kind:?}"))?;
    let poll = Duration::from_millis(poll_ms.parse().map_err(|e| format!("poll: {e}"))?);
    // One thread per worker: 4 workers and the servers share the machine.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let report = runtime.block_on(run_worker(target, poll, name))?;
    let line = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    println!("{line}");
    Ok(())
}

async fn run_worker(target: Target, poll: Duration, name: &str) -> Result<Report, String> {
    let client = target.client(poll).await.map_err(|e| e.to_string())?;
    let handle = client
        .rate_limit(name, quota(OLD_BURST))
        .map_err(|e| e.to_string())?;
    // Declares the name (or reads it), and starts the poll.
    let _ = handle.check("warm").await.map_err(|e| e.to_string())?;

    let stop = Arc::new(AtomicBool::new(false));
    // The parent closes stdin to stop the worker.
    std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::Relaxed);
        }
    });
    let counts: Arc<[AtomicU64; 6]> = Arc::new(Default::default());
    let (decisions, old, errors, last_old, first, last) = (0, 1, 2, 3, 4, 5);
    counts[first].store(u64::MAX, Ordering::Relaxed);
    let warm = Arc::new(tokio::sync::Barrier::new(TASKS + 1));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (handle, stop, counts, warm) = (
            handle.clone(),
            Arc::clone(&stop),
            Arc::clone(&counts),
            Arc::clone(&warm),
        );
        let id = format!("{}-{t}", std::process::id());
        tasks.push(tokio::spawn(async move {
            let mut waited = false;
            while !stop.load(Ordering::Relaxed) {
                let sent = now_us();
                let limit = match handle.check(&id).await {
                    Ok(admitted) => Some(admitted.limit),
                    Err(Rejection::Limited(limited)) => Some(limited.limit),
                    Err(_) => None,
                };
                let Some(limit) = limit else {
                    counts[errors].fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                counts[decisions].fetch_add(1, Ordering::Relaxed);
                counts[first].fetch_min(sent, Ordering::Relaxed);
                counts[last].fetch_max(sent, Ordering::Relaxed);
                if limit == OLD_BURST {
                    counts[old].fetch_add(1, Ordering::Relaxed);
                    counts[last_old].fetch_max(sent, Ordering::Relaxed);
                }
                if !waited {
                    waited = true;
                    warm.wait().await;
                }
            }
        }));
    }
    warm.wait().await;
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    for task in tasks {
        task.await.map_err(|e| e.to_string())?;
    }
    let get = |i: usize| counts[i].load(Ordering::Relaxed);
    Ok(Report {
        decisions: get(decisions),
        old: get(old),
        errors: get(errors),
        last_old_us: get(last_old),
        first_us: get(first),
        last_us: get(last),
    })
}

/// A worker process, killed if it is still running when dropped.
struct Worker {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(target: &Target, poll: Duration, name: &str) -> Result<Worker, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .arg("--worker")
            .args(target.args())
            .arg(poll.as_millis().to_string())
            .arg(name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("worker: {e}"))?;
        let out = BufReader::new(child.stdout.take().ok_or("worker stdout")?);
        Ok(Worker { child, out })
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        self.out.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.is_empty() {
            return Err("a worker exited early (see its error above)".into());
        }
        Ok(line.trim().to_owned())
    }

    /// Closes stdin and reads the report.
    fn finish(mut self) -> Result<Report, String> {
        drop(self.child.stdin.take());
        let line = self.line()?;
        let report = serde_json::from_str(&line).map_err(|e| format!("{line:?}: {e}"))?;
        let _ = self.child.wait();
        Ok(report)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One round's outcome.
struct Round {
    /// Last decision by the old numbers after the change returned; zero
    /// when none.
    bound: Duration,
    decisions_per_sec: f64,
    old_after: bool,
    errors: u64,
}

fn round(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    poll: Duration,
    name: &str,
) -> Result<Round, String> {
    let operator = runtime
        .block_on(target.client(poll))
        .map_err(|e| e.to_string())?;
    let mut workers = (0..WORKERS)
        .map(|_| Worker::spawn(target, poll, name))
        .collect::<Result<Vec<_>, _>>()?;
    for worker in &mut workers {
        let line = worker.line()?;
        if line != "ready" {
            return Err(format!("a worker said {line:?}"));
        }
    }
    // At a random point of the workers' poll cycle: they all started
    // polling when they declared, so a fixed pause would land the change
    // at the same phase every round and measure one point of the range.
    let phase = Duration::from_micros(fastrand::u64(0..poll.as_micros() as u64));
    std::thread::sleep(BEFORE + phase);
    let spec = Spec::rate_limit(Algorithm::Gcra, quota(NEW_BURST));
    runtime
        .block_on(operator.configs().set(name, spec, Change::Keep))
        .map_err(|e| e.to_string())?;
    let changed = now_us();
    std::thread::sleep(AFTER);
    let reports = workers
        .into_iter()
        .map(Worker::finish)
        .collect::<Result<Vec<_>, _>>()?;
    let last_old = reports.iter().map(|r| r.last_old_us).max().unwrap_or(0);
    let decisions_per_sec = reports
        .iter()
        .map(|r| r.decisions as f64 / (r.last_us.saturating_sub(r.first_us) as f64 / 1e6))
        .sum();
    Ok(Round {
        bound: Duration::from_micros(last_old.saturating_sub(changed)),
        decisions_per_sec,
        old_after: last_old > changed,
        errors: reports.iter().map(|r| r.errors).sum(),
    })
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn parent() -> Result<(), String> {
    let (single_url, _server) = server::url_from_env_or_start();
    let mut targets = vec![Target::Single(single_url)];
    let _cluster = match std::env::var("REDIS_CLUSTER_URLS") {
        Ok(urls) if !urls.is_empty() => {
            targets.push(Target::Cluster(urls.split(',').map(String::from).collect()));
            None
        }
        // `RedisCluster::start` panics with the reason after 3 attempts.
        _ => match std::panic::catch_unwind(cluster::RedisCluster::start) {
            Ok(cluster) => {
                targets.push(Target::Cluster(cluster.urls()));
                Some(cluster)
            }
            Err(why) => {
                let why = why
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| why.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("no cluster, measuring the single server only: {why}");
                None
            }
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;

    println!(
        "{WORKERS} processes x {TASKS} tasks, one rate limit, burst {OLD_BURST} -> {NEW_BURST} \
         (Change::Keep); {ROUNDS} rounds per row; {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("bound: last decision by the old numbers, after the change returned\n");
    println!(
        "{:<10} {:>8} {:>13} {:>14} {:>14} {:>10}",
        "deployment", "poll", "decisions/s", "bound median", "bound max", "rounds>0"
    );
    for target in &targets {
        for poll in [nolock::config::DEFAULT_POLL, Duration::from_millis(50)] {
            let mut bounds = Vec::new();
            let (mut rate, mut late, mut errors) = (0.0, 0, 0);
            for r in 0..ROUNDS {
                let name = format!(
                    "config-change-{}-{}-{}ms-{r}",
                    std::process::id(),
                    target.label(),
                    poll.as_millis()
                );
                let round = round(&runtime, target, poll, &name)?;
                bounds.push(round.bound);
                rate += round.decisions_per_sec / ROUNDS as f64;
                late += usize::from(round.old_after);
                errors += round.errors;
            }
            let max = bounds.iter().copied().max().unwrap_or_default();
            println!(
                "{:<10} {:>8} {:>13.0} {:>14} {:>14} {:>7}/{ROUNDS}{}",
                target.label(),
                ms(poll),
                rate,
                ms(median(bounds)),
                ms(max),
                late,
                if errors > 0 {
                    format!("  ({errors} calls failed)")
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
