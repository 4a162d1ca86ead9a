//! Randomised, seeded runs: client tasks issue random operations of every
//! module while a fault task injects random faults; at the end the state is
//! read back and every module's checker ([`super::history`]) judges the
//! whole history.
//!
//! The seed fixes every random choice (operations, amounts, faults, their
//! timing); the interleaving of tasks is the scheduler's, so a failing seed
//! reproduces the same mix of operations and faults, not the same
//! schedule. `tests/histories.rs` runs short versions in CI;
//! `examples/torture.rs` runs long ones.
//!
//! On one server, clients connect through a [`FaultProxy`] (1 s reply
//! timeout) to a server started with [`DURABLE`] (`appendfsync always`).
//! On the cluster (a fresh 3×2 one: the faults change its topology) they
//! use cluster connections with `retries(0)`; the proxy faults do not apply
//! there (redirects name the nodes themselves).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::rate::{Algorithm, Limiter, Quota};
use nolock::{cas, fence, limits};
use redis::aio::MultiplexedConnection;

use super::clock::{ClockFile, SkewedServer};
use super::cluster::RedisCluster;
use super::deployment::AnyConn;
use super::faults::{self, DURABLE};
use super::history::*;
use super::proxy::FaultProxy;
use super::RedisServer;

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub duration: Duration,
    pub clients: usize,
    pub cluster: bool,
    /// One server only: run it under libfaketime and step its clock forward
    /// (5-200 ms at a time) among the faults. Forward only, so the server's
    /// clock never goes back and every checker keeps its exact bound in
    /// server time; what a clock stepped back does is `tests/clock.rs`'s.
    pub clock: bool,
}

/// Permits of the concurrency limit (holders check).
const PERMITS: u64 = 3;
/// Where the fair semaphores' key numbers start (`Semaphore::fair`).
const FAIR_KEYS: u32 = 1_000_000;
/// Seats of the fenced semaphore (`Semaphore::fenced`).
const SEATS: u64 = 2;
/// The counter's limit per key; a new key every [`EPOCH`].
const COUNTER_LIMIT: u64 = 150;
const EPOCH: Duration = Duration::from_secs(2);
const LONG: Duration = Duration::from_secs(3600);
const INITIAL_BALANCE: i64 = 1000;
const FENCE_TTL: Duration = Duration::from_millis(100);
/// How the fair lock's acquires wait: up to 400 ms, polling. Its tickets
/// live 2 x 400 ms + 1 s = 1.8 s, longer than a waiting call can last
/// (400 ms, and one attempt held up to the 1 s reply timeout) by more than
/// two clock steps of the `clock` runs, so a ticket dies only after its
/// waiter has given up.
const FAIR_WAIT: nolock::Backoff = nolock::Backoff {
    timeout: Duration::from_millis(400),
    initial_delay: Duration::from_millis(2),
    max_delay: Duration::from_millis(400),
};
/// How long a grant waits for a replica's confirmation on the cluster
/// (under the 1 s response timeout of the clients).
const ACK_TIMEOUT: Duration = Duration::from_millis(300);
/// Processes campaigning for the leader role (beside the clients).
const CAMPAIGNERS: usize = 3;
/// GCRA: 200 per second (one unit per 5 ms), burst 10.
const RATE_PER_SECOND: u64 = 200;
const RATE_BURST: u64 = 10;

/// An operation on the concurrency limit (one key per [`EPOCH`]).
#[derive(Debug, Clone)]
pub enum Permit {
    Acquire { key: u32 },
    Release { key: u32 },
}

/// The recorders of one run.
struct Histories {
    counters: Recorder<Increment, limits::Admission>,
    holders: Recorder<Permit, bool>,
    rate: Recorder<RateOp, RateReply>,
    fences: Recorder<FenceOp, FenceReply>,
    /// The same operations on a lock whose fences come from its slot's
    /// counter (`FenceSource::PerSlot`).
    slot_fences: Recorder<FenceOp, FenceReply>,
    /// The same operations on a fair lock (`Lock::fair`), whose acquires
    /// wait in line.
    fair_fences: Recorder<FenceOp, FenceReply>,
    /// The fair lock's waiters, for "no waiter passed over" (one server:
    /// there a joining attempt can be sent alone and timed).
    fair_waits: Mutex<Vec<Waited>>,
    balance: Recorder<BalanceOp, cas::Adjustment>,
    /// The leaders' fenced writes (`fence::Leader` terms).
    leaders: Recorder<FenceOp, FenceReply>,
    /// The fenced semaphore's acquires (its fences come from one counter,
    /// so they increase across seats), and each seat's writes.
    permit_grants: Recorder<FenceOp, FenceReply>,
    seat_writes: Vec<Recorder<FenceOp, FenceReply>>,
    /// Every term a campaigner was elected to: (process, term).
    terms: Mutex<Vec<(usize, u64)>>,
}

struct Keys {
    prefix: String,
}

impl Keys {
    fn counter(&self, epoch: u32) -> String {
        format!("{{{}ctr{epoch}}}", self.prefix)
    }
    fn holders(&self, epoch: u32) -> String {
        format!("{{{}sem{epoch}}}", self.prefix)
    }
    fn rate(&self) -> String {
        format!("{{{}rate}}", self.prefix)
    }
    fn lock(&self) -> String {
        format!("{{{}lock}}", self.prefix)
    }
    fn slot_lock(&self) -> String {
        format!("{{{}slotlock}}", self.prefix)
    }
    fn fair_lock(&self) -> String {
        format!("{{{}fairlock}}", self.prefix)
    }
    fn balance(&self) -> String {
        format!("{{{}bal}}", self.prefix)
    }
    fn role(&self) -> String {
        format!("{{{}role}}", self.prefix)
    }
    fn fenced_semaphore(&self) -> String {
        format!("{{{}fsem}}", self.prefix)
    }
    /// Where seat `seat`'s fenced value lives (`PermitFence::value_key`).
    fn seat_value(&self, seat: u64) -> String {
        nolock::keys::derive(&self.fenced_semaphore(), &format!("value:{seat}"))
    }
    fn all_fixed(&self) -> Vec<String> {
        vec![self.rate(), self.lock(), self.balance(), self.counter(0)]
    }
}

/// Where the run happens.
enum Target {
    Single {
        server: Arc<Mutex<RedisServer>>,
        url: String,
        proxy: FaultProxy,
        /// The server's clock, when it runs under libfaketime.
        clock: Option<ClockFile>,
    },
    Cluster(RedisCluster),
}

impl Target {
    /// The fenced lock of the run: on the cluster, where every primary has a
    /// replica, its grants are acknowledged by one ([`ACK_TIMEOUT`]), so a
    /// failover cannot hand a fence out twice.
    fn lock(&self) -> nolock::Result<fence::Lock> {
        let lock = fence::Lock::new(FENCE_TTL)?;
        match self {
            Target::Single { .. } => Ok(lock),
            Target::Cluster(_) => lock.acknowledged(1, ACK_TIMEOUT),
        }
    }

    /// The fenced semaphore of the run, acknowledged on the cluster as the
    /// lock; its permits last as long as a lock's grant.
    fn fenced_semaphore(&self) -> nolock::Result<nolock::semaphore::Semaphore> {
        let semaphore = nolock::semaphore::Semaphore::new(SEATS, FENCE_TTL)?.fenced();
        match self {
            Target::Single { .. } => Ok(semaphore),
            Target::Cluster(_) => semaphore.acknowledged(1, ACK_TIMEOUT),
        }
    }

    /// The semaphore of the run, acknowledged on the cluster as the lock.
    fn semaphore(&self) -> nolock::Result<nolock::semaphore::Semaphore> {
        let semaphore = nolock::semaphore::Semaphore::new(PERMITS, LONG)?;
        match self {
            Target::Single { .. } => Ok(semaphore),
            Target::Cluster(_) => semaphore.acknowledged(1, ACK_TIMEOUT),
        }
    }

    async fn client_conn(&self) -> Option<AnyConn> {
        match self {
            Target::Single { proxy, .. } => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_millis(500)))
                    .set_response_timeout(Some(Duration::from_secs(1)));
                let client = redis::Client::open(proxy.url()).ok()?;
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .ok()
                    .map(AnyConn::Single)
            }
            Target::Cluster(cluster) => cluster
                .client()
                .get_async_connection()
                .await
                .ok()
                .map(AnyConn::Cluster),
        }
    }

    /// A direct connection for reading the final state (after healing).
    async fn reader(&self) -> AnyConn {
        match self {
            Target::Single { url, .. } => AnyConn::Single(
                redis::Client::open(url.as_str())
                    .expect("url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect to the server"),
            ),
            Target::Cluster(cluster) => AnyConn::Cluster(cluster.conn().await),
        }
    }
}

/// The outcome of one run: what was done, what was injected, and the
/// verdict of each checker.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub cluster: bool,
    pub clock: bool,
    pub elapsed: Duration,
    pub ops: Tally,
    pub faults: BTreeMap<&'static str, u64>,
    pub verdicts: Vec<(&'static str, Result<String, String>)>,
    pub stats: (u64, u64, u64, u64, u64),
    /// Forced failovers' loss windows, and the answered calls in them that
    /// the checkers counted as unknown.
    pub forgotten: (usize, usize),
}

impl Report {
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|(_, v)| v.is_ok())
    }

    /// The summary table: operations by outcome, faults by kind, verdicts.
    pub fn table(&self) -> String {
        let mut out = format!(
            "seed {} on {} for {:.1} s\n\n| operation | ok | definite | indeterminate |\n|---|---:|---:|---:|\n",
            self.seed,
            if self.cluster {
                "the 3x2 cluster (fence grants and permits acknowledged by 1 replica)"
            } else if self.clock {
                "one server (through the fault proxy, its clock stepped forward)"
            } else {
                "one server (through the fault proxy)"
            },
            self.elapsed.as_secs_f64()
        );
        let mut ops: Vec<&str> = self.ops.0.keys().map(|(op, _)| *op).collect();
        ops.dedup();
        for op in ops {
            out.push_str(&format!(
                "| {op} | {} | {} | {} |\n",
                self.ops.get(op, "ok"),
                self.ops.get(op, "definite"),
                self.ops.get(op, "indeterminate")
            ));
        }
        out.push_str("\n| fault | injected |\n|---|---:|\n");
        for (fault, n) in &self.faults {
            out.push_str(&format!("| {fault} | {n} |\n"));
        }
        let (calls, fallbacks, redirects, retries, never_sent) = self.stats;
        out.push_str(&format!(
            "\nengine: {calls} script calls, {fallbacks} NOSCRIPT fallbacks, {redirects} MOVED/READONLY resends, \
             {retries} ASK/TRYAGAIN/CLUSTERDOWN/LOADING/MASTERDOWN resends, {never_sent} never-sent (definite)\n\n"
        ));
        if self.forgotten.0 > 0 {
            out.push_str(&format!(
                "forced failovers: {} loss windows; {} answered calls in them counted as unknown by the checkers\n\n",
                self.forgotten.0, self.forgotten.1
            ));
        }
        out.push_str("| checker | verdict |\n|---|---|\n");
        for (name, verdict) in &self.verdicts {
            match verdict {
                Ok(v) => out.push_str(&format!("| {name} | PASS: {v} |\n")),
                Err(v) => out.push_str(&format!("| {name} | **FAIL**: {v} |\n")),
            }
        }
        out
    }
}

fn epoch_of(start: Instant) -> u32 {
    (start.elapsed().as_millis() / EPOCH.as_millis()) as u32
}

/// Run one scenario. Panics only on harness failures (a server that does
/// not come back); checker failures are in the report.
pub async fn run(config: Config) -> Report {
    let target = if config.cluster {
        Target::Cluster(RedisCluster::start())
    } else {
        let (server, clock) = if config.clock {
            let skewed = SkewedServer::start(&DURABLE)
                .unwrap_or_else(|why| panic!("clock steps asked for: {why}"));
            (skewed.server, Some(skewed.clock))
        } else {
            (RedisServer::start_with(&DURABLE), None)
        };
        let url = server.url();
        let proxy = FaultProxy::start(server.port).await;
        Target::Single {
            server: Arc::new(Mutex::new(server)),
            url,
            proxy,
            clock,
        }
    };
    let target = Arc::new(target);
    let keys = Arc::new(Keys {
        prefix: format!("t{}:", config.seed),
    });
    {
        let mut conn = target.reader().await;
        nolock::Scripts::load(&mut conn)
            .await
            .expect("load scripts");
        let credit = cas::credit(&mut conn, &keys.balance(), INITIAL_BALANCE as u64, None).await;
        assert!(credit.expect("initial balance").is_applied());
    }
    let limiter = Arc::new(
        Quota::per_second(RATE_PER_SECOND)
            .and_then(|q| q.with_burst(RATE_BURST))
            .and_then(|q| Limiter::new(Algorithm::Gcra, q))
            .expect("a valid quota"),
    );
    let histories = Arc::new(Histories {
        counters: Recorder::new(),
        holders: Recorder::new(),
        rate: Recorder::new(),
        fences: Recorder::new(),
        slot_fences: Recorder::new(),
        fair_fences: Recorder::new(),
        fair_waits: Mutex::new(Vec::new()),
        balance: Recorder::new(),
        leaders: Recorder::new(),
        permit_grants: Recorder::new(),
        seat_writes: (0..SEATS).map(|_| Recorder::new()).collect(),
        terms: Mutex::new(Vec::new()),
    });
    let before = nolock::stats();
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // The steps given to the server's clock (with `clock` only).
    let server_clock = Arc::new(Mutex::new(ServerClock::default()));
    // The loss windows of forced failovers (cluster only).
    let losses: Arc<Mutex<Vec<LossWindow>>> = Arc::new(Mutex::new(Vec::new()));

    let mut clients = Vec::new();
    for process in 0..config.clients {
        let (target, keys, histories, stop, limiter) = (
            target.clone(),
            keys.clone(),
            histories.clone(),
            stop.clone(),
            limiter.clone(),
        );
        let seed = config.seed.wrapping_add(process as u64 + 1);
        clients.push(tokio::spawn(async move {
            client(
                process, seed, &target, &keys, &histories, &limiter, &stop, start,
            )
            .await
        }));
    }
    for n in 0..CAMPAIGNERS {
        let (target, keys, histories, stop) = (
            target.clone(),
            keys.clone(),
            histories.clone(),
            stop.clone(),
        );
        let process = config.clients + n;
        let seed = config.seed.wrapping_add(process as u64 + 1);
        clients.push(tokio::spawn(async move {
            match &*target {
                Target::Single { proxy, .. } => {
                    // A reconnecting connection: a campaign keeps its
                    // connection across the proxy's cuts.
                    let manager = redis::Client::open(proxy.url())
                        .expect("url")
                        .get_connection_manager_with_config(
                            redis::aio::ConnectionManagerConfig::new()
                                .set_connection_timeout(Some(Duration::from_millis(500)))
                                .set_response_timeout(Some(Duration::from_secs(1))),
                        )
                        .await;
                    if let Ok(conn) = manager {
                        campaigner(process, seed, conn, &target, &keys, &histories, &stop).await
                    }
                }
                Target::Cluster(cluster) => {
                    if let Ok(conn) = cluster.client().get_async_connection().await {
                        campaigner(process, seed, conn, &target, &keys, &histories, &stop).await
                    }
                }
            }
        }));
    }
    let fault_task = {
        let (target, keys, stop) = (target.clone(), keys.clone(), stop.clone());
        let seed = config.seed;
        let (server_clock, losses) = (server_clock.clone(), losses.clone());
        tokio::spawn(
            async move { inject(seed, &target, &keys, &stop, &server_clock, &losses).await },
        )
    };

    tokio::time::sleep(config.duration).await;
    stop.store(true, Relaxed);
    let faults = fault_task.await.expect("fault task");
    for c in clients {
        c.await.expect("client task");
    }
    if let Target::Single { proxy, .. } = &*target {
        proxy.heal();
    }
    let elapsed = start.elapsed();

    // Read back.
    let conn = target.reader().await;
    let h = &histories;
    let mut verdicts = Vec::new();
    // What a forced failover may have forgotten counts as unknown; the
    // acknowledged calls (fence grants, semaphore acquires) keep their
    // answers: a replica had them before they were answered.
    let windows = losses.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let acked_permits = |op: &Permit| matches!(op, Permit::Acquire { .. });
    let acked_grants = |op: &FenceOp| matches!(op, FenceOp::Acquire);
    let slot = |key: String| nolock::keys::slot(&key);
    let (rate_slot, balance_slot) = (slot(keys.rate()), slot(keys.balance()));
    let lock_slot = slot(nolock::keys::derive(&keys.lock(), "lock"));
    let slot_lock_slot = slot(nolock::keys::derive(&keys.slot_lock(), "lock"));

    let counter_events = forgettable(
        h.counters.events(),
        &windows,
        |op| slot(keys.counter(op.key)),
        |_| false,
    );
    let holder_events = forgettable(
        h.holders.events(),
        &windows,
        |op| match op {
            Permit::Acquire { key } | Permit::Release { key } => slot(keys.holders(*key)),
        },
        acked_permits,
    );
    let rate_events = forgettable(h.rate.events(), &windows, |_| rate_slot, |_| false);
    let fence_events = forgettable(h.fences.events(), &windows, |_| lock_slot, acked_grants);
    let slot_fence_events = forgettable(
        h.slot_fences.events(),
        &windows,
        |_| slot_lock_slot,
        acked_grants,
    );
    let fair_lock_slot = slot(nolock::keys::derive(&keys.fair_lock(), "lock"));
    let fair_fence_events = forgettable(
        h.fair_fences.events(),
        &windows,
        |_| fair_lock_slot,
        acked_grants,
    );
    let balance_events = forgettable(h.balance.events(), &windows, |_| balance_slot, |_| false);
    let role_slot = slot(nolock::keys::derive(&keys.role(), "lock"));
    let leader_events = forgettable(h.leaders.events(), &windows, |_| role_slot, |_| false);
    let fsem_slot = slot(keys.fenced_semaphore());
    let permit_events = forgettable(
        h.permit_grants.events(),
        &windows,
        |_| fsem_slot,
        acked_grants,
    );
    let seat_events: Vec<_> = h
        .seat_writes
        .iter()
        .map(|r| forgettable(r.events(), &windows, |_| fsem_slot, |_| false))
        .collect();
    let forgotten = [
        unknown(&counter_events) - unknown(&h.counters.events()),
        unknown(&holder_events) - unknown(&h.holders.events()),
        unknown(&rate_events) - unknown(&h.rate.events()),
        unknown(&fence_events) - unknown(&h.fences.events()),
        unknown(&slot_fence_events) - unknown(&h.slot_fences.events()),
        unknown(&fair_fence_events) - unknown(&h.fair_fences.events()),
        unknown(&balance_events) - unknown(&h.balance.events()),
        unknown(&leader_events) - unknown(&h.leaders.events()),
        unknown(&permit_events) - unknown(&h.permit_grants.events()),
    ]
    .iter()
    .sum::<usize>()
        + seat_events
            .iter()
            .zip(&h.seat_writes)
            .map(|(kept, all)| unknown(kept) - unknown(&all.events()))
            .sum::<usize>();
    let mut by_key: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for e in counter_events.iter().cloned() {
        by_key.entry(e.op.key).or_default().push(e);
    }
    let mut counter_verdict = Ok(format!("{} keys", by_key.len()));
    for (epoch, events) in &by_key {
        let usage = read_retrying(|| {
            let key = keys.counter(*epoch);
            let mut conn = conn.clone();
            async move { limits::peek(&mut conn, &key).await }
        })
        .await;
        if let Err(e) = check_counter(events, usage.count, COUNTER_LIMIT) {
            counter_verdict = Err(format!("key {}: {e}", keys.counter(*epoch)));
            break;
        }
    }
    if let Ok(summary) = &mut counter_verdict {
        let admitted = counter_events
            .iter()
            .filter(|e| e.outcome.ok().is_some_and(|a| a.admitted))
            .count();
        *summary = format!(
            "counters ok: {} keys, {admitted} admitted, every final count = admitted + a subset of the indeterminate, <= {COUNTER_LIMIT}",
            by_key.len()
        );
    }
    verdicts.push(("counters (limits)", counter_verdict));

    verdicts.push((
        "holders (limits as a concurrency limit)",
        holders_verdict(&holder_events),
    ));

    verdicts.push((
        "rate (GCRA)",
        check_rate(
            &rate_events,
            RATE_BURST,
            limiter.quota().emission_interval(),
            &server_clock.lock().unwrap_or_else(|e| e.into_inner()),
        ),
    ));

    let stored = stored_fence(&conn, keys.lock()).await;
    verdicts.push(("fences", check_fences(&fence_events, stored)));
    let stored = stored_fence(&conn, keys.slot_lock()).await;
    verdicts.push((
        "slot fences (FenceSource::PerSlot)",
        check_fences(&slot_fence_events, stored),
    ));

    let stored = stored_fence(&conn, keys.fair_lock()).await;
    let waits = h
        .fair_waits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let order = match passed_over(&waits).first() {
        _ if waits.is_empty() => Ok("order not checked (cluster)".to_owned()),
        Some(first) => Err(first.clone()),
        None => Ok(format!(
            "no waiter passed over: {} waiters, {} granted",
            waits.len(),
            waits.iter().filter(|w| w.granted.is_some()).count()
        )),
    };
    verdicts.push((
        "fair lock (Lock::fair, waiting in line)",
        check_fences(&fair_fence_events, stored).and_then(|f| order.map(|o| format!("{f}; {o}"))),
    ));

    let stored = stored_fence(&conn, keys.role()).await;
    let terms = h.terms.lock().unwrap_or_else(|e| e.into_inner()).clone();
    verdicts.push((
        "leaders (fence::Leader)",
        check_terms(&terms)
            .and_then(|t| check_fences(&leader_events, stored).map(|w| format!("{t}; {w}"))),
    ));

    verdicts.push((
        "fenced permits (Semaphore::fenced)",
        fenced_permits_verdict(&conn, &keys, &permit_events, &seat_events).await,
    ));

    let balance: i64 = read_retrying(|| {
        let key = keys.balance();
        let mut conn = conn.clone();
        async move {
            let v: i64 = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(nolock::Error::Redis)?;
            Ok(v)
        }
    })
    .await;
    verdicts.push((
        "balance (cas)",
        check_balance(&balance_events, INITIAL_BALANCE, balance),
    ));

    let mut ops = Tally::default();
    ops.merge(&tally(&h.counters.events(), |_| "limits::try_increment"));
    ops.merge(&tally(&h.holders.events(), |op| match op {
        Permit::Acquire { .. } => "limits (acquire a permit)",
        Permit::Release { .. } => "limits::release",
    }));
    ops.merge(&tally(&h.rate.events(), |op| match op {
        RateOp::Check { .. } => "rate check",
        RateOp::Refund { .. } => "rate refund",
    }));
    ops.merge(&tally(&h.fences.events(), |op| match op {
        FenceOp::Acquire => "fence::Lock::acquire",
        FenceOp::Write { .. } => "fence::Fence::write",
        FenceOp::Release => "fence::Grant::release",
    }));
    ops.merge(&tally(&h.slot_fences.events(), |op| match op {
        FenceOp::Acquire => "fence::Lock::acquire (slot fences)",
        FenceOp::Write { .. } => "fence::Fence::write (slot fences)",
        FenceOp::Release => "fence::Grant::release (slot fences)",
    }));
    ops.merge(&tally(&h.fair_fences.events(), |op| match op {
        FenceOp::Acquire => "fence::Lock::acquire (fair, waiting)",
        FenceOp::Write { .. } => "fence::Fence::write (fair lock)",
        FenceOp::Release => "fence::Grant::release (fair lock)",
    }));
    ops.merge(&tally(&h.leaders.events(), |_| "fence::Leader term write"));
    ops.merge(&tally(&h.permit_grants.events(), |_| {
        "semaphore::Semaphore::acquire (fenced)"
    }));
    for seat in &h.seat_writes {
        ops.merge(&tally(&seat.events(), |_| "semaphore::Permit::write"));
    }
    ops.merge(&tally(&h.balance.events(), |op| match op {
        BalanceOp::Debit(_) => "cas::debit",
        BalanceOp::Credit(_) => "cas::credit",
    }));
    let after = nolock::stats();
    Report {
        seed: config.seed,
        cluster: config.cluster,
        clock: config.clock,
        elapsed,
        ops,
        faults,
        verdicts,
        forgotten: (windows.len(), forgotten),
        stats: (
            after.calls - before.calls,
            after.noscript_fallbacks - before.noscript_fallbacks,
            after.redirects - before.redirects,
            after.retries - before.retries,
            after.never_sent - before.never_sent,
        ),
    }
}

/// Fenced permits: the acquires' fences strictly increase (one counter for
/// every seat), and on each seat no stale write applies and the stored
/// value is the greatest applied one ([`check_fences`] per seat).
async fn fenced_permits_verdict(
    conn: &AnyConn,
    keys: &Keys,
    grants: &[Event<FenceOp, FenceReply>],
    seats: &[Vec<Event<FenceOp, FenceReply>>],
) -> Result<String, String> {
    let mut summary = check_fences(grants, None)?;
    for (i, writes) in seats.iter().enumerate() {
        let seat = i as u64 + 1;
        let stored = read_retrying(|| {
            let (key, mut conn) = (keys.seat_value(seat), conn.clone());
            async move { fence::read_unbound(&mut conn, &key).await }
        })
        .await
        .map(|f| (f.fence, String::from_utf8_lossy(&f.value).into_owned()));
        let verdict = check_fences(writes, stored).map_err(|e| format!("seat {seat}: {e}"))?;
        summary.push_str(&format!("; seat {seat}: {verdict}"));
    }
    Ok(summary)
}

/// The fenced value at `key` and its fence, read as [`read_retrying`].
async fn stored_fence(conn: &AnyConn, key: String) -> Option<(u64, String)> {
    read_retrying(|| {
        let (key, mut conn) = (key.clone(), conn.clone());
        async move { fence::read(&mut conn, &key).await }
    })
    .await
    .map(|f| (f.fence, String::from_utf8_lossy(&f.value).into_owned()))
}

/// Read the final state, waiting out a server still loading or a cluster
/// still settling.
async fn read_retrying<T, F, Fut>(mut read: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = nolock::Result<T>>,
{
    let mut last = None;
    for _ in 0..100 {
        match read().await {
            Ok(v) => return v,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not read the final state: {last:?}");
}

fn holders_verdict(events: &[Event<Permit, bool>]) -> Result<String, String> {
    // Pair each admitted acquire with the same process's next release of
    // the same key; an acquire without one holds until the end.
    let end = events.iter().map(|e| e.completed).max().unwrap_or_default() + Duration::from_secs(1);
    let mut by_key: BTreeMap<u32, Vec<Holding>> = BTreeMap::new();
    let mut sorted: Vec<_> = events.iter().collect();
    sorted.sort_by_key(|e| e.invoked);
    let mut open: BTreeMap<(usize, u32), Duration> = BTreeMap::new();
    for e in sorted {
        match (&e.op, &e.outcome) {
            (Permit::Acquire { key }, Outcome::Ok(true)) => {
                open.insert((e.process, *key), e.completed);
            }
            (Permit::Release { key }, _) => {
                if let Some(from) = open.remove(&(e.process, *key)) {
                    by_key.entry(*key).or_default().push(Holding {
                        from,
                        until: e.invoked,
                    });
                }
            }
            _ => {}
        }
    }
    for ((_, key), from) in open {
        by_key
            .entry(key)
            .or_default()
            .push(Holding { from, until: end });
    }
    let mut total = 0;
    for (key, holdings) in &by_key {
        total += holdings.len();
        check_holders(holdings, PERMITS).map_err(|e| format!("key {key}: {e}"))?;
    }
    Ok(format!(
        "holders ok: {total} holdings over {} keys, never more than {PERMITS} at once",
        by_key.len()
    ))
}

#[allow(clippy::too_many_arguments)]
async fn client(
    process: usize,
    seed: u64,
    target: &Target,
    keys: &Keys,
    h: &Histories,
    limiter: &Limiter,
    stop: &AtomicBool,
    start: Instant,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut conn: Option<AnyConn> = None;
    while !stop.load(Relaxed) {
        let Some(c) = conn.as_mut() else {
            conn = target.client_conn().await;
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        };
        // One random operation (or a short sequence of one module).
        let dead = match rng.u32(0..100) {
            0..=29 => {
                let epoch = epoch_of(start);
                let n = rng.u64(1..=3);
                let key = keys.counter(epoch);
                let o = h
                    .counters
                    .record(
                        process,
                        Increment { n, key: epoch },
                        nolock::limits::Counter::new(COUNTER_LIMIT, LONG)
                            .unwrap()
                            .try_increment_by(c, &key, n),
                    )
                    .await;
                lost(&o)
            }
            30..=44 => {
                // One in three waits in line on a fair semaphore of its own
                // keys (numbered from FAIR_KEYS), judged by the same
                // holders checker.
                let fair = rng.u32(0..3) == 0;
                let epoch = epoch_of(start) + if fair { FAIR_KEYS } else { 0 };
                let key = keys.holders(epoch);
                let mut held = None;
                let o = h
                    .holders
                    .record(process, Permit::Acquire { key: epoch }, async {
                        let sem = match fair {
                            true => target.semaphore()?.fair().with_wait(FAIR_WAIT),
                            false => target.semaphore()?,
                        };
                        sem.acquire(c, &key).await.map(|a| {
                            held = a.acquired();
                            held.is_some()
                        })
                    })
                    .await;
                match (o, held) {
                    (Outcome::Ok(true), Some(permit)) => {
                        tokio::time::sleep(Duration::from_millis(rng.u64(0..10))).await;
                        let r = h
                            .holders
                            .record(process, Permit::Release { key: epoch }, async {
                                permit
                                    .release(c)
                                    .await
                                    .map(|r| r == nolock::semaphore::PermitRelease::Released)
                            })
                            .await;
                        lost(&r)
                    }
                    (o, _) => lost(&o),
                }
            }
            45..=64 => {
                let cost = rng.u64(1..=3);
                let key = keys.rate();
                let mut charge = None;
                let o = h
                    .rate
                    .record(process, RateOp::Check { cost }, async {
                        limiter.check(c, &key, cost).await.map(|d| {
                            let (info, taken) = d.into_parts();
                            charge = taken;
                            RateReply::Decision(info)
                        })
                    })
                    .await;
                match (o, charge) {
                    (o @ Outcome::Ok(_), Some(mut charge)) if rng.u32(0..5) == 0 => {
                        let r = h
                            .rate
                            .record(process, RateOp::Refund { amount: cost }, async {
                                charge
                                    .refund(c, cost)
                                    .await
                                    .map(|r| RateReply::Refunded(r.credited))
                            })
                            .await;
                        drop(o);
                        lost(&r)
                    }
                    (o, _) => lost(&o),
                }
            }
            65..=72 => {
                let lock = target.lock();
                fenced(process, &mut rng, c, lock, &keys.lock(), &h.fences).await
            }
            73..=79 => {
                let lock = target
                    .lock()
                    .map(|l| l.with_fence_source(fence::FenceSource::PerSlot));
                fenced(
                    process,
                    &mut rng,
                    c,
                    lock,
                    &keys.slot_lock(),
                    &h.slot_fences,
                )
                .await
            }
            80..=87 => fenced_permit(process, &mut rng, c, target, keys, h).await,
            88..=93 => fair_waiter(process, &mut rng, c, target, keys, h).await,
            _ => {
                let amount = rng.u64(1..=5);
                let key = keys.balance();
                let o = if rng.bool() {
                    h.balance
                        .record(
                            process,
                            BalanceOp::Debit(amount),
                            cas::debit(c, &key, amount),
                        )
                        .await
                } else {
                    h.balance
                        .record(
                            process,
                            BalanceOp::Credit(amount),
                            cas::credit(c, &key, amount, None),
                        )
                        .await
                };
                lost(&o)
            }
        };
        if dead && matches!(target, Target::Single { .. }) {
            // A multiplexed connection does not come back: make a new one.
            conn = None;
        }
        if conn.is_some() && rng.u32(0..10) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.u64(0..3))).await;
        }
    }
}

/// One acquire on `key` with `lock`, and when granted a fenced write
/// (sometimes after a pause past the TTL, so that a newer grant overtakes
/// it), recorded in `fences`. True when the connection was lost.
async fn fenced(
    process: usize,
    rng: &mut fastrand::Rng,
    c: &mut AnyConn,
    lock: nolock::Result<fence::Lock>,
    key: &str,
    fences: &Recorder<FenceOp, FenceReply>,
) -> bool {
    fenced_as(process, rng, c, lock, key, fences, None, &mut None).await
}

/// [`fenced`] under `token` when given (a waiter keeping its place in a
/// fair lock's line, which then also releases its grant), noting the
/// grant's fence and when it was answered.
#[allow(clippy::too_many_arguments)]
async fn fenced_as(
    process: usize,
    rng: &mut fastrand::Rng,
    c: &mut AnyConn,
    lock: nolock::Result<fence::Lock>,
    key: &str,
    fences: &Recorder<FenceOp, FenceReply>,
    token: Option<&fence::Token>,
    answered: &mut Option<(u64, Instant)>,
) -> bool {
    let mut granted = None;
    let mut held = None;
    let o = fences
        .record(process, FenceOp::Acquire, async {
            let attempt = match token {
                Some(token) => lock?.acquire_as(c, key, token).await?,
                None => lock?.acquire(c, key).await?,
            };
            Ok(match attempt.acquired() {
                Some(g) => {
                    let f = g.fence().number();
                    granted = Some(g.fence().clone());
                    *answered = Some((f, Instant::now()));
                    if token.is_some() {
                        held = Some(g);
                    }
                    FenceReply::Granted(f)
                }
                None => FenceReply::Held,
            })
        })
        .await;
    let mut dead = lost(&o);
    if let (Outcome::Ok(FenceReply::Granted(f)), Some(granted)) = (o, granted) {
        if rng.u32(0..4) == 0 {
            tokio::time::sleep(FENCE_TTL + Duration::from_millis(20)).await;
        }
        let value = format!("p{process}:f{f}");
        let op = FenceOp::Write {
            fence: f,
            value: value.clone(),
        };
        let w = fences
            .record(process, op, async {
                granted.write(c, &value).await.map(fence_reply)
            })
            .await;
        dead = lost(&w);
    }
    // A waiter in line hands the lock on when done (the others wait for
    // its expiry): the line moves at the pace of the work.
    if let (false, Some(grant)) = (dead, held) {
        dead = grant.release(c).await.is_err_and(|e| !e.is_definite());
    }
    dead
}

/// One acquire of the fenced semaphore, and when granted a write under the
/// permit to its seat's value (sometimes after a pause past the TTL, so
/// that the seat goes to another holder first), then sometimes a release.
/// True when the connection was lost.
async fn fenced_permit(
    process: usize,
    rng: &mut fastrand::Rng,
    c: &mut AnyConn,
    target: &Target,
    keys: &Keys,
    h: &Histories,
) -> bool {
    let key = keys.fenced_semaphore();
    let mut granted = None;
    let o = h
        .permit_grants
        .record(process, FenceOp::Acquire, async {
            let attempt = target.fenced_semaphore()?.acquire(c, &key).await?;
            Ok(match attempt.acquired() {
                Some(permit) => {
                    let fence = permit.fence().map_or(0, |f| f.number());
                    granted = Some(permit);
                    FenceReply::Granted(fence)
                }
                None => FenceReply::Held,
            })
        })
        .await;
    let Some(permit) = granted else {
        return lost(&o);
    };
    let Some(seat) = permit.fence() else {
        unreachable!("a fenced semaphore's permit carries a fence")
    };
    if rng.u32(0..4) == 0 {
        tokio::time::sleep(FENCE_TTL + Duration::from_millis(20)).await;
    }
    let value = format!("p{process}:f{}", seat.number());
    let op = FenceOp::Write {
        fence: seat.number(),
        value: value.clone(),
    };
    let Some(writes) = usize::try_from(seat.seat() - 1)
        .ok()
        .and_then(|i| h.seat_writes.get(i))
    else {
        unreachable!("seat {} of {SEATS}", seat.seat())
    };
    let w = writes
        .record(process, op, async {
            seat.write(c, &value).await.map(fence_reply)
        })
        .await;
    if lost(&w) {
        return true;
    }
    if rng.bool() {
        return permit.release(c).await.is_err_and(|e| !e.is_definite());
    }
    false
}

/// One waiter of the fair lock: [`fenced`] with a lock that waits in line.
/// On one server its first attempt is sent alone (a joining attempt, an
/// operation value under the waiter's token) and timed, then the waiting
/// acquire keeps that place; the waiter goes into `fair_waits` for "no
/// waiter passed over". A waiter whose call ended without a grant counts
/// as gone from then on (it left the line, or its ticket dies after).
async fn fair_waiter(
    process: usize,
    rng: &mut fastrand::Rng,
    c: &mut AnyConn,
    target: &Target,
    keys: &Keys,
    h: &Histories,
) -> bool {
    let key = keys.fair_lock();
    let lock = target.lock().map(|l| l.fair().with_wait(FAIR_WAIT));
    let (Ok(fair), Ok(token)) = (&lock, fence::Token::random()) else {
        return false;
    };
    if !matches!(target, Target::Single { .. }) {
        return fenced(process, rng, c, lock, &key, &h.fair_fences).await;
    }
    let start = Instant::now();
    let mut first = None;
    let o = h
        .fair_fences
        .record(process, FenceOp::Acquire, async {
            let mut batch = nolock::Batch::new();
            batch.push(fence::AcquireLock::with_token(fair, &key, &token)?);
            let Some(attempt) = batch.run(c).await.pop() else {
                unreachable!("a batch of one answers one reply")
            };
            Ok(match attempt?.acquired() {
                Some(g) => {
                    let f = g.fence().number();
                    first = Some(g);
                    FenceReply::Granted(f)
                }
                None => FenceReply::Held,
            })
        })
        .await;
    let enqueued = Instant::now();
    if let Some(grant) = first {
        // Free with nobody in line: granted at once; not a waiter.
        return grant.release(c).await.is_err_and(|e| !e.is_definite());
    }
    if !matches!(o, Outcome::Ok(FenceReply::Held)) {
        return lost(&o);
    }
    let mut answered = None;
    let dead = fenced_as(
        process,
        rng,
        c,
        lock,
        &key,
        &h.fair_fences,
        Some(&token),
        &mut answered,
    )
    .await;
    let ended = Instant::now();
    h.fair_waits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Waited {
            start,
            enqueued: Some(enqueued),
            granted: answered,
            crashed: answered.is_none().then_some(ended),
        });
    dead
}

/// A fenced write's answer as the fence checker reads it.
fn fence_reply(w: fence::Write) -> FenceReply {
    match w {
        fence::Write::Applied => FenceReply::Applied,
        fence::Write::Stale { current_fence } => FenceReply::Stale(current_fence),
        fence::Write::NotGranted { .. } => FenceReply::NotGranted,
        fence::Write::Ended => FenceReply::Ended,
        // `Write` is non_exhaustive: a new outcome needs a place in the
        // fence checker before torture runs it.
        other => unreachable!("fence::Write {other:?} unknown to the checker"),
    }
}

/// One campaigner for the role: campaigns, and while elected writes with
/// its term's fence (sometimes after a pause past the TTL, so that a later
/// term overtakes it), then steps down or drops its campaign and starts
/// again.
async fn campaigner<C>(
    process: usize,
    seed: u64,
    conn: C,
    target: &Target,
    keys: &Keys,
    h: &Histories,
    stop: &AtomicBool,
) where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut rng = fastrand::Rng::with_seed(seed);
    let Ok(leader) = target
        .lock()
        .and_then(|lock| fence::Leader::new(&keys.role(), lock))
    else {
        return;
    };
    while !stop.load(Relaxed) {
        let Ok(campaign) = leader.campaign(conn.clone()) else {
            return;
        };
        let until = Instant::now() + Duration::from_millis(rng.u64(200..1500));
        let mut last = None;
        while !stop.load(Relaxed) && Instant::now() < until {
            let term = tokio::select! {
                term = campaign.elected() => term,
                _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
            };
            let Some(term) = term else { break };
            let f = term.number();
            if last != Some(f) {
                last = Some(f);
                h.terms
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((process, f));
            }
            if rng.u32(0..4) == 0 {
                tokio::time::sleep(FENCE_TTL + Duration::from_millis(20)).await;
            }
            let value = format!("l{process}:f{f}");
            let mut c = conn.clone();
            let op = FenceOp::Write {
                fence: f,
                value: value.clone(),
            };
            let _ = h
                .leaders
                .record(process, op, async {
                    term.fence().write(&mut c, &value).await.map(fence_reply)
                })
                .await;
            tokio::time::sleep(Duration::from_millis(rng.u64(0..20))).await;
        }
        if rng.bool() {
            let _ = campaign.step_down().await;
        }
    }
}

/// How many calls of `events` have an unknown outcome.
fn unknown<Op, T>(events: &[Event<Op, T>]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Indeterminate(_)))
        .count()
}

/// True when the call's connection may be dead: an indeterminate outcome,
/// or a definite error raised because the connection had closed.
fn lost<T>(o: &Outcome<T>) -> bool {
    match o {
        Outcome::Indeterminate(_) => true,
        Outcome::Definite(e) => e.contains("not sent"),
        Outcome::Ok(_) => false,
    }
}

/// The fault task: a random fault every 100-400 ms until `stop`.
async fn inject(
    seed: u64,
    target: &Target,
    keys: &Keys,
    stop: &AtomicBool,
    server_clock: &Mutex<ServerClock>,
    losses: &Mutex<Vec<LossWindow>>,
) -> BTreeMap<&'static str, u64> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_fa17);
    let mut done: BTreeMap<&'static str, u64> = BTreeMap::new();
    // The server clock's offset so far (clock steps only move it forward).
    let mut offset = 0.0;
    while !stop.load(Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.u64(100..400))).await;
        if stop.load(Relaxed) {
            break;
        }
        let name = match target {
            Target::Single {
                clock: Some(clock), ..
            } if rng.u32(0..100) < 15 => {
                let before = offset;
                offset += rng.u64(5..=200) as f64 / 1000.0;
                let set = clock.setter(offset);
                let asked = micros(std::time::SystemTime::now());
                let result = tokio::task::spawn_blocking(move || set.apply())
                    .await
                    .expect("clock task");
                let seen = match result {
                    Ok(()) => micros(std::time::SystemTime::now()),
                    // Not seen yet: it may take effect at any time from now.
                    Err(_) => u64::MAX,
                };
                let us = |seconds: f64| (seconds * 1e6).round() as i64;
                server_clock.lock().unwrap_or_else(|e| e.into_inner()).step(
                    asked,
                    seen,
                    us(before),
                    us(offset),
                );
                match result {
                    Ok(()) => "clock step forward 5-200 ms (libfaketime)",
                    Err(_) => "clock step forward (not seen in 5 s: a fault in the way)",
                }
            }
            Target::Single {
                server, url, proxy, ..
            } => single_fault(&mut rng, server, url, proxy).await,
            Target::Cluster(cluster) => cluster_fault(&mut rng, cluster, keys, losses).await,
        };
        *done.entry(name).or_default() += 1;
    }
    done
}

async fn direct(url: &str) -> Option<MultiplexedConnection> {
    redis::Client::open(url)
        .ok()?
        .get_multiplexed_async_connection()
        .await
        .ok()
}

async fn single_fault(
    rng: &mut fastrand::Rng,
    server: &Arc<Mutex<RedisServer>>,
    url: &str,
    proxy: &FaultProxy,
) -> &'static str {
    let short = Duration::from_millis(rng.u64(50..300));
    match rng.u32(0..100) {
        0..=11 => {
            proxy.lose_replies(rng.u64(1..=3));
            "proxy: lose a reply (cut after the request)"
        }
        12..=21 => {
            proxy.set_delay(Duration::from_millis(rng.u64(5..100)));
            tokio::time::sleep(short).await;
            proxy.set_delay(Duration::ZERO);
            "proxy: delay replies"
        }
        22..=25 => {
            proxy.hold();
            tokio::time::sleep(Duration::from_millis(rng.u64(200..1500))).await;
            proxy.release();
            "proxy: hold replies (past the 1 s timeout at times)"
        }
        26..=29 => {
            proxy.partition();
            tokio::time::sleep(Duration::from_millis(rng.u64(200..1500))).await;
            proxy.heal();
            "proxy: partition both ways, then heal"
        }
        30..=37 => {
            proxy.refuse();
            proxy.cut_all();
            tokio::time::sleep(short).await;
            proxy.accept();
            "proxy: cut all + refuse connections"
        }
        38..=45 => {
            proxy.cut_all();
            "proxy: cut all connections"
        }
        46..=55 => {
            if let Some(mut c) = direct(url).await {
                let _ = faults::script_flush(&mut c).await;
            }
            "SCRIPT FLUSH"
        }
        56..=65 => {
            if let Some(mut c) = direct(url).await {
                let _ = faults::client_kill(&mut c).await;
            }
            "CLIENT KILL"
        }
        66..=73 => {
            if let Some(mut c) = direct(url).await {
                let _ = faults::client_pause(&mut c, short).await;
            }
            tokio::time::sleep(short).await;
            "CLIENT PAUSE WRITE"
        }
        74..=81 => {
            let _ = faults::busy(url, short).await;
            "BUSY (a long script)"
        }
        82..=89 => {
            if let Some(mut c) = direct(url).await {
                let _ = faults::oom(&mut c, short).await;
            }
            "OOM (maxmemory 1)"
        }
        _ => {
            let server = server.clone();
            tokio::task::spawn_blocking(move || {
                let mut s = server.lock().unwrap_or_else(|e| e.into_inner());
                faults::kill_and_restart(&mut s);
            })
            .await
            .expect("restart task");
            "kill -9 + restart (appendfsync always)"
        }
    }
}

async fn cluster_fault(
    rng: &mut fastrand::Rng,
    cluster: &RedisCluster,
    keys: &Keys,
    losses: &Mutex<Vec<LossWindow>>,
) -> &'static str {
    let fixed = keys.all_fixed();
    let key = &fixed[rng.usize(0..fixed.len())];
    let short = Duration::from_millis(rng.u64(50..300));
    let owner = cluster.shard_of(key).await.primary;
    let url = format!("redis://127.0.0.1:{owner}/");
    match rng.u32(0..100) {
        0..=19 => {
            cluster.flush_scripts_everywhere().await;
            "SCRIPT FLUSH (every node)"
        }
        20..=39 => {
            if let Some(mut c) = direct(&url).await {
                let _ = faults::client_kill(&mut c).await;
            }
            "CLIENT KILL (a primary)"
        }
        40..=54 => {
            if let Some(mut c) = direct(&url).await {
                let _ = faults::client_pause(&mut c, short).await;
            }
            tokio::time::sleep(short).await;
            "CLIENT PAUSE WRITE (a primary)"
        }
        55..=64 => {
            let _ = faults::busy(&url, short).await;
            "BUSY (a primary)"
        }
        65..=84 => {
            let slot = nolock::keys::slot(key);
            let others: Vec<u16> = cluster
                .shards()
                .await
                .into_iter()
                .map(|s| s.primary)
                .filter(|&p| p != owner)
                .collect();
            let to = others[rng.usize(0..others.len())];
            faults::migrate_slot(cluster, slot, to, Duration::from_millis(rng.u64(0..50))).await;
            "slot migration"
        }
        85..=91 => match faults::try_failover(cluster, key).await {
            Ok(_) => "CLUSTER FAILOVER",
            Err(_) => "CLUSTER FAILOVER (timed out, no switch)",
        },
        _ => forced_failover(rng, cluster, key, owner, losses).await,
    }
}

/// `CLUSTER FAILOVER FORCE` or `TAKEOVER` of `key`'s shard, under load: the
/// replica takes over without the primary's last writes, which the old
/// primary answered until it learned. The loss window recorded runs from
/// just before the old primary's replication offset was read to when every
/// node names the new primary; it starts 10 s earlier when the promoted
/// replica had not received all of that offset (its `second_repl_offset`
/// says where it took over).
async fn forced_failover(
    rng: &mut fastrand::Rng,
    cluster: &RedisCluster,
    key: &str,
    owner: u16,
    losses: &Mutex<Vec<LossWindow>>,
) -> &'static str {
    let how = if rng.bool() { "FORCE" } else { "TAKEOVER" };
    let slots = cluster.shard_of(key).await.slots;
    let now = || micros(std::time::SystemTime::now());
    let asked = now();
    let sent = faults::replication_offset(owner, "master_repl_offset").await;
    let result = faults::try_failover_with(cluster, key, Some(how)).await;
    let agreed = now();
    let (window, name) = match result {
        Ok((_, new)) => {
            let took_over = faults::replication_offset(new, "second_repl_offset").await;
            match (sent, took_over) {
                (Some(sent), Some(took_over)) if took_over > sent => (
                    (asked, agreed),
                    "CLUSTER FAILOVER FORCE/TAKEOVER (loss window from the ask)",
                ),
                _ => (
                    (asked.saturating_sub(10_000_000), agreed),
                    "CLUSTER FAILOVER FORCE/TAKEOVER (replica behind: window from 10 s before)",
                ),
            }
        }
        // A manual failover that has not switched in 10 s never will (the
        // replica gives it up after 5 s, CLUSTER_MF_TIMEOUT); TAKEOVER
        // switches at once or not at all.
        Err(_) => (
            (asked, agreed),
            "CLUSTER FAILOVER FORCE/TAKEOVER (no switch within 10 s)",
        ),
    };
    let (from, to) = window;
    losses
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(LossWindow { from, to, slots });
    name
}
