//! One row of a table: `calls` calls over `tasks` tasks, timed on the client
//! and read back from the server's `INFO commandstats`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send>>;

/// What a rate limiter answered, in the fields every peer can express.
/// `None` where the peer does not report the field.
#[derive(Debug, Clone, Copy, Default)]
pub struct Decision {
    pub allowed: bool,
    pub remaining: Option<u64>,
    pub retry_after: Option<Duration>,
}

pub fn decision(allowed: bool, remaining: Option<u64>, retry_after: Option<Duration>) -> Decision {
    Decision {
        allowed,
        remaining,
        retry_after,
    }
}

/// One operation on one key: a rate check, or a lock + unlock pair.
pub type Call = Arc<dyn Fn(String) -> BoxFuture<Decision> + Send + Sync>;

pub fn call<F, Fut>(f: F) -> Call
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Decision, Error>> + Send + 'static,
{
    Arc::new(move |key| Box::pin(f(key)))
}

/// The keys a row's tasks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// All tasks on one hot key.
    Shared,
    /// One key per task (uncontended lock pairs).
    PerTask,
}

/// One measurement of one row.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub ops_per_s: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Server time per call: `usec` of the commands sent, from `INFO commandstats`.
    pub server_us: f64,
    /// Commands sent per call: the round trips, for one client.
    pub commands: f64,
}

/// The commands a script call shows up as. Commands run inside a script are
/// counted in `INFO commandstats` too, and their time is already in the
/// script's own, so only the commands a client sends are summed.
pub const SCRIPT: &[&str] = &["evalsha", "eval"];

/// `CONFIG RESETSTAT`, then `calls` calls of `op` spread over `tasks` tasks;
/// server time and command count summed over `sent`, the commands `op` sends.
pub async fn measure(
    admin: &MultiplexedConnection,
    op: &Call,
    sent: &[&str],
    key: &str,
    keys: Keys,
    calls: usize,
    tasks: usize,
) -> Result<Sample, Error> {
    let mut admin = admin.clone();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut admin)
        .await?;
    let per_task = calls / tasks;
    let start = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let op = op.clone();
        let key = match keys {
            Keys::Shared => key.to_owned(),
            Keys::PerTask => format!("{key}:{task}"),
        };
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t = Instant::now();
                op(key.clone()).await?;
                latencies.push(t.elapsed());
            }
            Ok::<_, Error>(latencies)
        }));
    }
    let mut latencies = Vec::with_capacity(calls);
    for handle in handles {
        latencies.extend(handle.await??);
    }
    let elapsed = start.elapsed();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await?;
    let (mut usec, mut commands) = (0.0, 0.0);
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if !sent.contains(&name) {
            continue;
        }
        usec += field(stats, "usec=");
        commands += field(stats, "calls=");
    }
    latencies.sort();
    let n = latencies.len() as f64;
    Ok(Sample {
        ops_per_s: n / elapsed.as_secs_f64(),
        p50: latencies[latencies.len() / 2],
        p99: latencies[latencies.len() * 99 / 100],
        server_us: usec / n,
        commands: commands / n,
    })
}

fn field(stats: &str, name: &str) -> f64 {
    stats
        .split(',')
        .find_map(|part| part.strip_prefix(name))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Minimum and median of each figure over the rounds.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub ops_per_s: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub server_us_min: f64,
    pub server_us_median: f64,
    pub commands: f64,
}

pub fn summarize(samples: &[Sample]) -> Summary {
    fn median<T: Copy>(mut v: Vec<T>, cmp: impl Fn(&T, &T) -> std::cmp::Ordering) -> (T, T) {
        v.sort_by(cmp);
        (v[0], v[v.len() / 2])
    }
    let f = |get: fn(&Sample) -> f64| median(samples.iter().map(get).collect(), f64::total_cmp);
    let d = |get: fn(&Sample) -> Duration| median(samples.iter().map(get).collect(), Ord::cmp).1;
    let (server_us_min, server_us_median) = f(|s| s.server_us);
    Summary {
        ops_per_s: f(|s| s.ops_per_s).1,
        p50: d(|s| s.p50),
        p99: d(|s| s.p99),
        server_us_min,
        server_us_median,
        commands: f(|s| s.commands).1,
    }
}
