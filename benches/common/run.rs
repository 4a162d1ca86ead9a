//! One measured run: a scenario, its tasks, and what they saw.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis::aio::ConnectionLike;

use serde::{Deserialize, Serialize};

use super::conn::{connect, Counted};
use super::latency::Latencies;
use super::lock;
use super::ops::{Call, Key, Operation, Variant};
use super::Result;

pub use super::{CAPACITY, LOCK_TTL};
/// Each key's capacity in the pause runs, reached well within the run.
pub const PAUSE_CAPACITY: u64 = 100;
/// The pause runs: one call in 10 pauses for twice the lock's TTL.
pub const PAUSES: Pauses = Pauses {
    every: 10,
    length: Duration::from_millis(60),
    lock_ttl: Duration::from_millis(30),
};

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub operation: Operation,
    pub variant: Variant,
    /// Concurrent tasks, each calling in a loop.
    pub tasks: usize,
    /// 1: every call on one hot key; more: each call picks one at random.
    pub keys: usize,
    pub budget: Budget,
    pub pauses: Option<Pauses>,
}

/// When a run ends.
#[derive(Debug, Clone, Copy)]
pub enum Budget {
    /// Tasks start no call after this long; calls in flight finish.
    For(Duration),
    /// Each task makes exactly this many calls.
    CallsPerTask(usize),
}

/// Holders that pause "now and then" for longer than the lock's TTL.
#[derive(Debug, Clone, Copy)]
pub struct Pauses {
    /// Task `t` pauses on its calls `n` where `(n + t) % every == 0`: one
    /// call in `every`, staggered across tasks so that pauses fall all
    /// through the run, the first on the very first call of task 0. (At
    /// random, a run could see no pause before the capacity is used up,
    /// and then nothing to show.)
    pub every: u64,
    pub length: Duration,
    /// The lock's TTL in these runs (shorter than `length`).
    pub lock_ttl: Duration,
}

impl Scenario {
    /// Throughput: every call admitted, no pauses, for `time`.
    pub fn throughput(
        operation: Operation,
        variant: Variant,
        tasks: usize,
        keys: usize,
        time: Duration,
    ) -> Self {
        Scenario {
            operation,
            variant,
            tasks,
            keys,
            budget: Budget::For(time),
            pauses: None,
        }
    }

    /// Correctness under faults: one key of [`PAUSE_CAPACITY`], `calls` calls
    /// per task (several times the capacity in all), with [`PAUSES`].
    pub fn with_pauses(operation: Operation, variant: Variant, tasks: usize, calls: usize) -> Self {
        Scenario {
            operation,
            variant,
            tasks,
            keys: 1,
            budget: Budget::CallsPerTask(calls),
            pauses: Some(PAUSES),
        }
    }

    /// The `operation` field of the row: what ran, on how many keys, with pauses or not.
    pub fn label(&self) -> String {
        let keys = if self.keys == 1 {
            "1 key".to_owned()
        } else {
            format!("{} keys", self.keys)
        };
        let pauses = if self.pauses.is_some() {
            ", pauses"
        } else {
            ""
        };
        format!("{}, {keys}{pauses}", self.operation.label())
    }

    pub fn capacity(&self) -> u64 {
        if self.pauses.is_some() {
            PAUSE_CAPACITY
        } else {
            CAPACITY
        }
    }

    pub fn lock_ttl(&self) -> Duration {
        self.pauses.map_or(LOCK_TTL, |p| p.lock_ttl)
    }
}

/// The variants of one operation, at one concurrency, on the same keys:
/// compared in one [`alternated`] run.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub scenarios: Vec<Scenario>,
    pub rounds: usize,
}

impl Comparison {
    /// Every variant of `operation` for `time` each, in `rounds` slices.
    pub fn throughput(
        operation: Operation,
        tasks: usize,
        keys: usize,
        time: Duration,
        rounds: usize,
    ) -> Self {
        Comparison {
            scenarios: operation
                .variants()
                .iter()
                .map(|&v| Scenario::throughput(operation, v, tasks, keys, time))
                .collect(),
            rounds,
        }
    }

    /// Every variant but `raw` (the same script as `script`) with [`PAUSES`].
    pub fn with_pauses(operation: Operation, tasks: usize, calls: usize) -> Self {
        Comparison {
            scenarios: operation
                .variants()
                .iter()
                .filter(|&&v| v != Variant::Raw)
                .map(|&v| Scenario::with_pauses(operation, v, tasks, calls))
                .collect(),
            rounds: 1,
        }
    }

    /// E.g. `counter, 1 key, 64 tasks`.
    pub fn label(&self) -> String {
        let (label, tasks) = self
            .scenarios
            .first()
            .map_or((String::new(), 0), |s| (s.label(), s.tasks));
        format!("{label}, {tasks} task{}", if tasks == 1 { "" } else { "s" })
    }

    pub async fn run(
        &self,
        client: &redis::Client,
        progress: impl FnMut(&Scenario),
    ) -> Result<Vec<Measured>> {
        alternated(client, &self.scenarios, self.rounds, progress).await
    }
}

/// A run's results: the row that is printed, and what explains it.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The printed row, derived from the fields below.
    pub row: Row,
    pub scenario: Scenario,
    /// Completed calls (admitted or denied); failed calls are in `errors`.
    pub calls: u64,
    pub admitted: u64,
    pub elapsed: Duration,
    /// Requests sent (lock retries and `WATCH` conflicts included).
    pub round_trips: u64,
    pub over_admissions: u64,
    pub lost_updates: u64,
    /// Calls that failed (a lock not acquired in time, a Redis error).
    pub errors: u64,
    pub first_error: Option<String>,
    /// Admissions the server recorded beyond what callers were told: only
    /// possible after errors; reported so that nothing is hidden.
    pub unexplained: u64,
    pub latencies: Latencies,
}

impl Measured {
    pub fn round_trips_per_call(&self) -> f64 {
        self.round_trips as f64 / self.calls.max(1) as f64
    }

    /// Add another slice of the same scenario (see [`alternated`]).
    fn absorb(&mut self, other: Measured) {
        self.calls += other.calls;
        self.admitted += other.admitted;
        self.elapsed += other.elapsed;
        self.round_trips += other.round_trips;
        self.over_admissions += other.over_admissions;
        self.lost_updates += other.lost_updates;
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
        self.unexplained += other.unexplained;
        self.latencies.merge(other.latencies);
        self.row = self.to_row();
    }

    fn to_row(&self) -> Row {
        let micros = |d: Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
        Row {
            operation: self.scenario.label(),
            variant: self.scenario.variant,
            tasks: self.scenario.tasks,
            ops_per_sec: (self.calls as f64 / self.elapsed.as_secs_f64()).round(),
            p50_us: micros(self.latencies.percentile(0.50)),
            p99_us: micros(self.latencies.percentile(0.99)),
            over_admissions: self.over_admissions,
            lost_updates: self.lost_updates,
        }
    }
}

/// Run the variants of one comparison in `rounds` alternated slices of their
/// time (`script, lock, ..., script, lock, ...`), so that a change in the
/// machine's load falls on all of them alike, and merge each one's slices.
/// `progress` is called before each slice. Runs with a call budget are not
/// sliced.
pub async fn alternated(
    client: &redis::Client,
    scenarios: &[Scenario],
    rounds: usize,
    mut progress: impl FnMut(&Scenario),
) -> Result<Vec<Measured>> {
    let mut merged: Vec<Option<Measured>> = vec![None; scenarios.len()];
    for round in 0..rounds.max(1) {
        for (scenario, slot) in scenarios.iter().zip(&mut merged) {
            let mut slice = *scenario;
            match scenario.budget {
                Budget::For(time) => slice.budget = Budget::For(time / rounds.max(1) as u32),
                Budget::CallsPerTask(_) if round > 0 => continue,
                Budget::CallsPerTask(_) => {}
            }
            progress(scenario);
            let measured = run(client, &slice).await?;
            match slot {
                Some(total) => total.absorb(measured),
                None => *slot = Some(measured),
            }
        }
    }
    Ok(merged.into_iter().flatten().collect())
}

/// What one task saw.
struct Seen {
    latencies: Vec<u64>,
    admitted: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

/// What one task does: copied into each.
#[derive(Clone, Copy)]
struct Plan {
    operation: Operation,
    variant: Variant,
    capacity: u64,
    lock_ttl: Duration,
    pauses: Option<Pauses>,
    deadline: Option<Instant>,
    calls: Option<usize>,
}

/// Run `scenario` against the server behind `client`, on keys of its own,
/// which it deletes afterwards.
pub async fn run(client: &redis::Client, scenario: &Scenario) -> Result<Measured> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let prefix = format!(
        "nolock-bench:{}:{}:",
        std::process::id(),
        RUNS.fetch_add(1, Relaxed)
    );
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..scenario.keys)
            .map(|i| Key::new(format!("{prefix}{i}")))
            .collect(),
    );
    let capacity = scenario.capacity();
    let (operation, variant) = (scenario.operation, scenario.variant);

    // Set-up and checks go through a connection of their own, not counted.
    let mut admin = connect(client).await?;
    nolock::Scripts::load(&mut admin).await?;
    lock::prepare(&mut admin).await?;
    operation
        .setup(variant, &mut admin, &keys, capacity)
        .await?;

    // One multiplexed connection shared by every task, as an application
    // shares it; `watch` needs one per task, since `WATCH` is per connection.
    let round_trips = Arc::new(AtomicU64::new(0));
    let shared = connect(client).await?;
    let mut conns = Vec::with_capacity(scenario.tasks);
    for _ in 0..scenario.tasks {
        let conn = if variant == Variant::Watch {
            connect(client).await?
        } else {
            shared.clone()
        };
        conns.push(Counted::new(conn, round_trips.clone()));
    }

    let started = SystemTime::now();
    let start = Instant::now();
    let plan = Plan {
        operation,
        variant,
        capacity,
        lock_ttl: scenario.lock_ttl(),
        pauses: scenario.pauses,
        deadline: match scenario.budget {
            Budget::For(time) => Some(start + time),
            Budget::CallsPerTask(_) => None,
        },
        calls: match scenario.budget {
            Budget::For(_) => None,
            Budget::CallsPerTask(n) => Some(n),
        },
    };
    let handles: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(id, conn)| tokio::spawn(task(id as u64, conn, plan, keys.clone())))
        .collect();
    let mut seen = Vec::with_capacity(handles.len());
    for handle in handles {
        seen.push(handle.await?);
    }
    let elapsed = start.elapsed();
    let round_trips = round_trips.load(Relaxed);

    let recorded = operation
        .recorded(variant, &mut admin, &keys, capacity, started)
        .await?;
    let semaphore_faults = if operation == Operation::Semaphore {
        Some(super::semaphore::faults(variant, &mut admin, &keys).await?)
    } else {
        None
    };
    delete_keys(&mut admin, &prefix).await?;

    let mut admitted = vec![0u64; keys.len()];
    let mut latencies = Vec::new();
    let (mut errors, mut first_error) = (0, None);
    for s in seen {
        for (total, n) in admitted.iter_mut().zip(&s.admitted) {
            *total += n;
        }
        latencies.extend(s.latencies);
        errors += s.errors;
        first_error = first_error.or(s.first_error);
    }
    let allowance = operation.allowance(capacity, elapsed);
    let over_admissions = admitted.iter().map(|&a| a.saturating_sub(allowance)).sum();
    let lost_updates = admitted
        .iter()
        .zip(&recorded)
        .map(|(&a, &r)| a.saturating_sub(r))
        .sum();
    let unexplained = admitted
        .iter()
        .zip(&recorded)
        .map(|(&a, &r)| r.saturating_sub(a))
        .sum();

    // The semaphore's faults are counted while holders run, not from totals.
    let (over_admissions, lost_updates, unexplained) = match semaphore_faults {
        Some((over, drift)) => (over, drift, 0),
        None => (over_admissions, lost_updates, unexplained),
    };

    let mut measured = Measured {
        row: Row::default(),
        scenario: *scenario,
        calls: latencies.len() as u64,
        admitted: admitted.iter().sum(),
        elapsed,
        round_trips,
        over_admissions,
        lost_updates,
        errors,
        first_error,
        unexplained,
        latencies: Latencies::new(latencies),
    };
    measured.row = measured.to_row();
    Ok(measured)
}

async fn task<C: ConnectionLike + Send>(
    id: u64,
    mut conn: C,
    plan: Plan,
    keys: Arc<Vec<Key>>,
) -> Seen {
    // Key choice comes from a seed per task, so every variant meets the same
    // keys; lock jitter and tokens draw from another.
    let mut schedule = fastrand::Rng::with_seed(0x5eed_0000 + id);
    let mut rng = fastrand::Rng::with_seed(0xbac0_0000 + id);
    let mut seen = Seen {
        latencies: Vec::with_capacity(plan.calls.unwrap_or(4096)),
        admitted: vec![0; keys.len()],
        errors: 0,
        first_error: None,
    };
    for n in 0u64.. {
        if plan.calls.is_some_and(|calls| n >= calls as u64)
            || plan.deadline.is_some_and(|d| Instant::now() >= d)
        {
            break;
        }
        let k = if keys.len() == 1 {
            0
        } else {
            schedule.usize(..keys.len())
        };
        let pause = plan
            .pauses
            .filter(|p| (n + id).is_multiple_of(p.every))
            .map(|p| p.length);
        let call = Call {
            key: &keys[k],
            capacity: plan.capacity,
            lock_ttl: plan.lock_ttl,
            pause,
        };
        let begun = Instant::now();
        match plan
            .operation
            .call(plan.variant, call, &mut conn, &mut rng)
            .await
        {
            Ok(admitted) => {
                seen.latencies.push(begun.elapsed().as_nanos() as u64);
                seen.admitted[k] += u64::from(admitted);
            }
            Err(e) => {
                seen.errors += 1;
                seen.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    seen
}

/// Delete every key under `prefix` (the run's data and locks).
async fn delete_keys<C: ConnectionLike + Send>(conn: &mut C, prefix: &str) -> Result<()> {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            redis::cmd("UNLINK").arg(&keys).exec_async(conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// One row of the comparison: what `--json` prints, field for field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// What ran: `"counter, 1 key"`, `"debit, 1000 keys"`, `"counter, 1 key, pauses"`.
    pub operation: String,
    pub variant: Variant,
    /// Concurrent tasks.
    pub tasks: usize,
    /// Completed calls per second (admitted or denied).
    pub ops_per_sec: f64,
    /// Latency of one call as its caller sees it (retries, backoff and any
    /// injected pause included), in microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
    /// Admissions beyond what the key allowed.
    pub over_admissions: u64,
    /// Admissions the callers were told about that the server's state does
    /// not show (a write overwritten by a stale one).
    pub lost_updates: u64,
}
