//! Histories of concurrent nolock calls, and the invariant each module keeps
//! over a whole history, faults included.
//!
//! A [`Recorder`] stores every call of a run as an [`Event`]: who made it,
//! what it asked, when it was invoked and when it completed (monotonic and
//! wall-clock), and its [`Outcome`]: a value, a definite error (nothing
//! happened) or an indeterminate one (it may have happened). Replies that
//! carry the server's clock ([`nolock::rate::RateLimit::at`]) keep it in the
//! value.
//!
//! The checkers below take the events of one module and the state read back
//! at the end, and return a one-line verdict or the first violation. Each
//! states its invariant in its doc comment; in all of them an indeterminate
//! call counts as "applied or not, whichever the final state needs" (a
//! subset), and a definite error as "not applied".
//!
//! Wall-clock times are compared with the server's `TIME`: the tests run
//! Redis on the same host, so both read the same clock.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::window;

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The call returned a value.
    Ok(T),
    /// A definite error: the operation did not take effect.
    Definite(String),
    /// The operation may or may not have taken effect.
    Indeterminate(String),
}

impl<T> Outcome<T> {
    pub fn from_result(result: &nolock::Result<T>) -> Self
    where
        T: Clone,
    {
        match result {
            Ok(v) => Outcome::Ok(v.clone()),
            Err(e) if e.is_definite() => Outcome::Definite(e.to_string()),
            Err(e) => Outcome::Indeterminate(e.to_string()),
        }
    }

    pub fn ok(&self) -> Option<&T> {
        match self {
            Outcome::Ok(v) => Some(v),
            _ => None,
        }
    }

    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Outcome::Indeterminate(_))
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Ok(_) => "ok",
            Outcome::Definite(_) => "definite",
            Outcome::Indeterminate(_) => "indeterminate",
        }
    }
}

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Event<Op, T> {
    pub process: usize,
    pub op: Op,
    /// Monotonic times since the recorder was made.
    pub invoked: Duration,
    pub completed: Duration,
    /// The same instants on the wall clock, in microseconds since the epoch.
    pub invoked_us: u64,
    pub completed_us: u64,
    pub outcome: Outcome<T>,
}

/// Microseconds since the Unix epoch of a wall-clock time.
pub fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A thread-safe log of events of one module.
pub struct Recorder<Op, T> {
    start: Instant,
    events: Mutex<Vec<Event<Op, T>>>,
}

impl<Op: Clone, T: Clone> Default for Recorder<Op, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Op: Clone, T: Clone> Recorder<Op, T> {
    pub fn new() -> Self {
        Recorder {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Run `call`, record it, and return its outcome.
    pub async fn record<F>(&self, process: usize, op: Op, call: F) -> Outcome<T>
    where
        F: std::future::Future<Output = nolock::Result<T>>,
    {
        let invoked = self.start.elapsed();
        let invoked_us = micros(SystemTime::now());
        let result = call.await;
        let completed = self.start.elapsed();
        let completed_us = micros(SystemTime::now());
        let outcome = Outcome::from_result(&result);
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Event {
                process,
                op,
                invoked,
                completed,
                invoked_us,
                completed_us,
                outcome: outcome.clone(),
            });
        outcome
    }

    pub fn events(&self) -> Vec<Event<Op, T>> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Calls per operation kind and outcome kind: `(op, outcome) -> n`.
pub fn tally<Op, T>(events: &[Event<Op, T>], op_kind: impl Fn(&Op) -> &'static str) -> Tally {
    let mut tally = Tally::default();
    for e in events {
        *tally
            .0
            .entry((op_kind(&e.op), e.outcome.kind()))
            .or_default() += 1;
    }
    tally
}

/// Counts keyed by `(operation, outcome)`.
#[derive(Debug, Default, Clone)]
pub struct Tally(pub BTreeMap<(&'static str, &'static str), u64>);

impl Tally {
    pub fn get(&self, op: &str, outcome: &str) -> u64 {
        self.0
            .iter()
            .filter(|((o, k), _)| *o == op && *k == outcome)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn merge(&mut self, other: &Tally) {
        for (k, n) in &other.0 {
            *self.0.entry(*k).or_default() += n;
        }
    }
}

/// True when adding some subset of `deltas` to 0 gives `target`. The
/// checkers use it for "plus some subset of the indeterminate calls".
/// A bitset over every sum in reach (from the sum of the negative deltas to
/// that of the positive ones): linear in the deltas times that span / 64,
/// so the tens of thousands of unknown calls that forced failovers leave in
/// a long run are checked in well under a second.
pub fn subset_sum_reaches(deltas: &[i64], target: i64) -> bool {
    let low: i64 = deltas.iter().filter(|d| **d < 0).sum();
    let high: i64 = deltas.iter().filter(|d| **d > 0).sum();
    if target < low || target > high {
        return false;
    }
    // Bit i stands for the sum low + i.
    let span = (high - low) as usize + 1;
    let mut reach = vec![0u64; span.div_ceil(64)];
    let zero = (-low) as usize;
    reach[zero / 64] |= 1 << (zero % 64);
    for &d in deltas {
        let shift = d.unsigned_abs() as usize;
        if shift == 0 {
            continue;
        }
        let before = reach.clone();
        let (words, bits) = (shift / 64, shift % 64);
        for (i, word) in reach.iter_mut().enumerate() {
            // Sums s + d for every reachable s: shift up for d > 0, down
            // for d < 0.
            let moved = if d > 0 {
                let lo = i.checked_sub(words).map_or(0, |j| before[j] << bits);
                let carry = match i.checked_sub(words + 1) {
                    Some(j) if bits > 0 => before[j] >> (64 - bits),
                    _ => 0,
                };
                lo | carry
            } else {
                let hi = before.get(i + words).map_or(0, |w| w >> bits);
                let carry = match before.get(i + words + 1) {
                    Some(w) if bits > 0 => w << (64 - bits),
                    _ => 0,
                };
                hi | carry
            };
            *word |= moved;
        }
    }
    let at = (target - low) as usize;
    reach[at / 64] >> (at % 64) & 1 == 1
}

// ---------------------------------------------------------------------------
// Counters: limits::try_increment_by on one key, one window for the run.

#[derive(Debug, Clone)]
pub struct Increment {
    pub n: u64,
    /// Which counter, when a run uses several (check each on its own).
    pub key: u32,
}

/// **Counter invariant.** With one window for the whole run, the final
/// count equals the sum of the admitted increments plus the increments of
/// some subset of the indeterminate calls, and never exceeds the limit.
/// Every admitted reply's count is at most the limit, and no two admitted
/// replies report the same count (each admission moved the counter to a
/// count of its own).
pub fn check_counter(
    events: &[Event<Increment, nolock::limits::Admission>],
    final_count: u64,
    limit: u64,
) -> Result<String, String> {
    let mut admitted = 0u64;
    let mut seen = std::collections::BTreeSet::new();
    let mut unknown = Vec::new();
    for e in events {
        match &e.outcome {
            Outcome::Ok(a) if a.admitted => {
                admitted += e.op.n;
                if a.count > limit {
                    return Err(format!(
                        "admitted with count {} > limit {limit}: {e:?}",
                        a.count
                    ));
                }
                if !seen.insert(a.count) {
                    return Err(format!("two admissions report count {}: {e:?}", a.count));
                }
            }
            Outcome::Indeterminate(_) => unknown.push(e.op.n as i64),
            _ => {}
        }
    }
    if final_count > limit {
        return Err(format!("final count {final_count} > limit {limit}"));
    }
    let extra = final_count as i64 - admitted as i64;
    if !subset_sum_reaches(&unknown, extra) {
        return Err(format!(
            "final count {final_count} is not {admitted} admitted plus a subset of {} indeterminate increments {unknown:?}",
            unknown.len()
        ));
    }
    Ok(format!(
        "counter ok: final {final_count} = {admitted} admitted + {extra} of {} indeterminate",
        unknown.len()
    ))
}

// ---------------------------------------------------------------------------
// Holders: a limit used as a concurrency limit (acquire = try_increment,
// release = limits::release). The semaphore's checker hooks in here.

/// One holding as the client saw it: from the moment its acquire returned
/// admitted to the moment its release was invoked (monotonic times). The
/// server's holding starts earlier and ends later, so client-side
/// intervals overlap no more than the server's.
#[derive(Debug, Clone, Copy)]
pub struct Holding {
    pub from: Duration,
    pub until: Duration,
}

/// **Holders invariant** (concurrency limits, and the semaphore when it
/// lands: feed it the intervals between an acquire's reply and its
/// release's invocation): at no instant do more than `permits` holdings
/// overlap.
pub fn check_holders(holdings: &[Holding], permits: u64) -> Result<String, String> {
    let mut edges: Vec<(Duration, i64)> = Vec::new();
    for h in holdings {
        edges.push((h.from, 1));
        edges.push((h.until, -1));
    }
    // At equal instants, releases first: a release invoked before an acquire
    // returned freed its permit before that acquire ran.
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0i64, 0i64);
    for (t, d) in edges {
        now += d;
        if now > permits as i64 {
            return Err(format!("{now} holders at {t:?}, permits {permits}"));
        }
        most = most.max(now);
    }
    Ok(format!(
        "holders ok: at most {most} of {permits} permits held at once, {} holdings",
        holdings.len()
    ))
}

// ---------------------------------------------------------------------------
// Rate limiters: GCRA (and token bucket, which decides the same) on one key.

#[derive(Debug, Clone)]
pub enum RateOp {
    Check { cost: u64 },
    Refund { amount: u64 },
}

#[derive(Debug, Clone)]
pub enum RateReply {
    Decision(nolock::rate::RateLimit),
    /// Units given back.
    Refunded(u64),
}

/// A span in which a forced failover may have forgotten answered writes:
/// client µs from, to, and the slot ranges of the shard that failed over.
#[derive(Debug, Clone)]
pub struct LossWindow {
    pub from: u64,
    pub to: u64,
    pub slots: Vec<(u16, u16)>,
}

/// The history as forced failovers leave it: a call answered while one of
/// `windows` was open, on a key (`slot_of`) in that window's shard, may have
/// been forgotten by the promoted replica, so its answer (`Ok`) counts as
/// `Indeterminate`; calls `kept` (acknowledged by a replica before they
/// answered) keep theirs. Every checker judges what is left as it judges a
/// lost reply.
pub fn forgettable<Op: Clone, T: Clone>(
    events: Vec<Event<Op, T>>,
    windows: &[LossWindow],
    slot_of: impl Fn(&Op) -> u16,
    kept: impl Fn(&Op) -> bool,
) -> Vec<Event<Op, T>> {
    events
        .into_iter()
        .map(|mut e| {
            let open = windows.iter().any(|w| {
                e.invoked_us <= w.to
                    && e.completed_us >= w.from
                    && w.slots
                        .iter()
                        .any(|&(a, b)| (a..=b).contains(&slot_of(&e.op)))
            });
            if open && !kept(&e.op) && matches!(e.outcome, Outcome::Ok(_)) {
                e.outcome = Outcome::Indeterminate("in a forced failover's loss window".into());
            }
            e
        })
        .collect()
}

/// The server's clock against this process's, for checkers that compare a
/// server time (a decision's `at`) with a client time (a call's invocation
/// and completion): the offsets a test gave the server's clock, with when.
/// Without steps, the two clocks are one (one machine).
#[derive(Debug, Clone, Default)]
pub struct ServerClock {
    /// Each step: the client times (µs) from when it was asked until the
    /// server was seen to follow, and the offsets (µs) before and after.
    steps: Vec<(u64, u64, i64, i64)>,
}

impl ServerClock {
    /// Records a step from `before` to `after` µs of offset, asked at
    /// `asked` and seen by `seen` (client µs since the epoch).
    pub fn step(&mut self, asked: u64, seen: u64, before: i64, after: i64) {
        self.steps.push((asked, seen, before, after));
    }

    /// The server times (µs) the client time `t` may have been: one value
    /// between steps, the span of both offsets while one took effect.
    pub fn range(&self, t: u64) -> (u64, u64) {
        let mut offset = (0i64, 0i64);
        for &(asked, seen, before, after) in &self.steps {
            if t >= seen {
                offset = (after, after);
            } else if t >= asked {
                offset = (before.min(after), before.max(after));
            }
        }
        let at = |o: i64| (t as i64 + o).max(0) as u64;
        (at(offset.0), at(offset.1))
    }
}

/// **Rate invariant** (GCRA / token bucket with burst `b` and emission
/// interval `T`), held by the shared window checker
/// ([`super::window`], whose doc states it in full): for any two instants
/// `t1 <= t2` of server time, `t2` an admission's (checked for every window
/// up to `(b + 400) * T` long), the units admitted at server times in
/// `[t1, t2]`, less the units credited back of those admissions by refunds
/// that may have run by `t2`, are at most `b + (t2 - t1) / T`. Exact in
/// microseconds: the script's theoretical arrival time rises by `cost * T`
/// per admission, falls by at most `credited * T` per refund (never below
/// the server clock, and only by the part of its charge not yet drained),
/// and admits only while it is at most `b * T` ahead of the server clock.
///
/// A refund undoes the latest check of its process (the torture refunds a
/// check right after it). An answered refund credits what it answered, an
/// indeterminate one may have credited its whole amount; either counts for
/// the windows that end at or after the earliest server time its invocation
/// may have had (`clock` takes client times to server times: the
/// decisions' times are the server's). A refund whose check is not in the
/// history as an admission (its answer was forgotten by a failover) is
/// counted in every window its span may meet.
pub fn check_rate(
    events: &[Event<RateOp, RateReply>],
    burst: u64,
    interval: Duration,
    clock: &ServerClock,
) -> Result<String, String> {
    // Admissions by server time, and refunds by the earliest server time
    // they may have run at, with what each may have credited.
    enum Item {
        Admission { at: u64, cost: u64, event: usize },
        Credit { of: usize, units: u64 },
    }
    let mut items: Vec<(u64, u8, usize, Item)> = Vec::new();
    let mut last_check: BTreeMap<usize, usize> = BTreeMap::new();
    let mut loose = Vec::new();
    let (mut refunds, mut unknown) = (0, 0);
    for (i, e) in events.iter().enumerate() {
        match (&e.op, &e.outcome) {
            (RateOp::Check { cost }, outcome) => {
                last_check.insert(e.process, i);
                if let Outcome::Ok(RateReply::Decision(d)) = outcome {
                    if d.allowed {
                        let at = micros(d.at);
                        let admission = Item::Admission {
                            at,
                            cost: *cost,
                            event: i,
                        };
                        items.push((at, 1, i, admission));
                    }
                }
            }
            (RateOp::Refund { amount }, outcome) => {
                let units = match outcome {
                    Outcome::Ok(RateReply::Refunded(credited)) => *credited,
                    Outcome::Indeterminate(_) => *amount,
                    _ => continue,
                };
                refunds += 1;
                let from = clock.range(e.invoked_us).0;
                let to = match outcome {
                    Outcome::Indeterminate(_) => {
                        unknown += 1;
                        u64::MAX
                    }
                    _ => clock.range(e.completed_us).1,
                };
                let admitted = last_check.get(&e.process).and_then(|&c| {
                    match &events[c].outcome {
                        Outcome::Ok(RateReply::Decision(d)) if d.allowed => Some(micros(d.at)),
                        _ => None,
                    }
                    .map(|at| (c, at))
                });
                match admitted {
                    // It ran after its check: a credit that would count
                    // from before its admission counts from just after it.
                    Some((c, at)) if from <= at => {
                        items.push((at, 2, i, Item::Credit { of: c, units }))
                    }
                    Some((c, _)) => items.push((from, 0, i, Item::Credit { of: c, units })),
                    None => loose.push((from, to, units)),
                }
            }
        }
    }
    // At one instant: credits that may have run by then, the admissions,
    // then credits of those admissions.
    items.sort_by_key(|&(t, rank, i, _)| (t, rank, i));
    let mut history = window::History::new();
    let mut admitted = BTreeMap::new();
    let mut seen: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (_, _, _, item) in &items {
        match *item {
            Item::Admission { at, cost, event } => {
                admitted.insert(event, history.admit(at, cost));
                seen.entry(at).or_default().push(event);
            }
            Item::Credit { of, units } => history.credit(admitted[&of], units),
        }
    }
    let admissions = admitted.len();
    for (from, to, units) in &loose {
        history.loose_credit(*from, *to, *units);
    }
    match window::check(&history, window::Bound::rate(burst, interval)) {
        Ok(verdict) => Ok(format!(
            "rate ok: {admissions} admissions, {refunds} refunds ({unknown} indeterminate, {} of \
             forgotten checks); {verdict}",
            loose.len()
        )),
        Err(v) => {
            // Each admission in the window: server time, cost, and the
            // client's invoked/completed wall times.
            let clients: Vec<String> = seen
                .range(v.from..=v.to)
                .flat_map(|(at, es)| {
                    es.iter().map(move |&i| {
                        let e = &events[i];
                        format!("{at} ({}..{})", e.invoked_us, e.completed_us)
                    })
                })
                .collect();
            Err(format!("{v}; client times of its admissions: {clients:?}"))
        }
    }
}

// ---------------------------------------------------------------------------
// Fences: Lock::acquire on one resource, Fence::write to its value.

#[derive(Debug, Clone)]
pub enum FenceOp {
    Acquire,
    Write { fence: u64, value: String },
    Release,
}

#[derive(Debug, Clone)]
pub enum FenceReply {
    Granted(u64),
    Held,
    Applied,
    Stale(u64),
    /// The write's fence was never granted (refused, nothing written).
    NotGranted,
    /// A slot fence's lease had ended (nothing written).
    Ended,
    Released,
}

/// **Fence invariant.** (1) Grants are strictly increasing in grant order:
/// when one acquire returned fence `a` before another was invoked, and that
/// one returned fence `b`, then `a < b`; no fence is granted twice. This
/// holds across restarts with `appendfsync always` and coordinated
/// failovers. (2) A write with a stale fence is never applied: when a write
/// with fence `a` was applied before a write with fence `b` was invoked,
/// and that one was applied too, `a <= b`; and the fence stored at the end
/// is the greatest applied one, or that of an indeterminate write above it,
/// with that write's value.
pub fn check_fences(
    events: &[Event<FenceOp, FenceReply>],
    stored: Option<(u64, String)>,
) -> Result<String, String> {
    // (1) grants in real-time order.
    let mut grants: Vec<(Duration, Duration, u64)> = events
        .iter()
        .filter_map(|e| match e.outcome {
            Outcome::Ok(FenceReply::Granted(f)) => Some((e.invoked, e.completed, f)),
            _ => None,
        })
        .collect();
    let mut fences: Vec<u64> = grants.iter().map(|g| g.2).collect();
    fences.sort_unstable();
    if let Some(w) = fences.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("fence {} granted twice", w[0]));
    }
    grants.sort_by_key(|g| g.1);
    let mut prefix_max = Vec::with_capacity(grants.len());
    let mut most = 0;
    for g in &grants {
        most = most.max(g.2);
        prefix_max.push(most);
    }
    for g in &grants {
        // Grants that completed before this one was invoked.
        let before = grants.partition_point(|h| h.1 < g.0);
        if before > 0 && prefix_max[before - 1] >= g.2 {
            return Err(format!(
                "fence {} granted after a grant of fence {} had returned",
                g.2,
                prefix_max[before - 1]
            ));
        }
    }
    // (2) applied writes never go back.
    let mut applied: Vec<(Duration, Duration, u64)> = events
        .iter()
        .filter_map(|e| match (&e.op, &e.outcome) {
            (FenceOp::Write { fence, .. }, Outcome::Ok(FenceReply::Applied)) => {
                Some((e.invoked, e.completed, *fence))
            }
            _ => None,
        })
        .collect();
    applied.sort_by_key(|w| w.1);
    let mut prefix = Vec::with_capacity(applied.len());
    let mut most_applied = 0;
    for w in &applied {
        most_applied = most_applied.max(w.2);
        prefix.push(most_applied);
    }
    for w in &applied {
        let before = applied.partition_point(|v| v.1 < w.0);
        if before > 0 && prefix[before - 1] > w.2 {
            return Err(format!(
                "stale write with fence {} applied after fence {} was",
                w.2,
                prefix[before - 1]
            ));
        }
    }
    match stored {
        None if applied.is_empty() => {}
        None => return Err("writes were applied but the fenced key is gone".into()),
        Some((fence, value)) => {
            if fence < most_applied {
                return Err(format!(
                    "stored fence {fence} < applied fence {most_applied}"
                ));
            }
            let candidate = events.iter().any(|e| match (&e.op, &e.outcome) {
                (FenceOp::Write { fence: f, value: v }, Outcome::Ok(FenceReply::Applied))
                | (FenceOp::Write { fence: f, value: v }, Outcome::Indeterminate(_)) => {
                    *f == fence && *v == value
                }
                _ => false,
            });
            if !candidate {
                return Err(format!(
                    "stored ({fence}, {value:?}) is no applied or indeterminate write"
                ));
            }
        }
    }
    Ok(format!(
        "fences ok: {} grants strictly increasing, {} applied writes never stale",
        grants.len(),
        applied.len()
    ))
}

/// **Term invariant** (`fence::Leader`): no term is given to two
/// campaigners, and each campaigner's terms strictly increase in the order
/// it was elected to them. (That two leaders' writes never both apply out
/// of order is [`check_fences`] over the leaders' writes.)
pub fn check_terms(terms: &[(usize, u64)]) -> Result<String, String> {
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    let mut last: BTreeMap<usize, u64> = BTreeMap::new();
    for &(process, term) in terms {
        if let Some(other) = seen.insert(term, process) {
            return Err(format!(
                "term {term} given to processes {other} and {process}"
            ));
        }
        if let Some(before) = last.insert(process, term) {
            if term <= before {
                return Err(format!(
                    "process {process} was elected to term {term} after term {before}"
                ));
            }
        }
    }
    Ok(format!(
        "{} terms, each to one campaigner, increasing",
        terms.len()
    ))
}

// ---------------------------------------------------------------------------
// Balances: cas::debit / cas::credit on one key.

#[derive(Debug, Clone)]
pub enum BalanceOp {
    Debit(u64),
    Credit(u64),
}

/// **Balance invariant.** final = initial − applied debits + applied
/// credits ± the amounts of some subset of the indeterminate calls; a
/// refused debit or a definite error is never applied; no reply and no
/// final balance is below zero.
pub fn check_balance(
    events: &[Event<BalanceOp, nolock::cas::Adjustment>],
    initial: i64,
    final_balance: i64,
) -> Result<String, String> {
    let mut known = initial;
    let mut unknown = Vec::new();
    for e in events {
        let delta = match e.op {
            BalanceOp::Debit(a) => -(a as i64),
            BalanceOp::Credit(a) => a as i64,
        };
        match &e.outcome {
            Outcome::Ok(nolock::cas::Adjustment::Applied { balance }) => {
                if *balance < 0 {
                    return Err(format!("balance {balance} below zero: {e:?}"));
                }
                known += delta;
            }
            Outcome::Indeterminate(_) => unknown.push(delta),
            _ => {}
        }
    }
    if final_balance < 0 {
        return Err(format!("final balance {final_balance} below zero"));
    }
    if !subset_sum_reaches(&unknown, final_balance - known) {
        return Err(format!(
            "final balance {final_balance} is not {known} plus a subset of {} indeterminate deltas {unknown:?}",
            unknown.len()
        ));
    }
    Ok(format!(
        "balance ok: final {final_balance} = {known} known {:+} of {} indeterminate",
        final_balance - known,
        unknown.len()
    ))
}

/// One waiter's history: when its first attempt was sent and when it
/// returned with its ticket in line, and how it ended.
#[derive(Debug, Clone, Copy)]
pub struct Waited {
    pub start: Instant,
    pub enqueued: Option<Instant>,
    /// The fence and when the grant was answered.
    pub granted: Option<(u64, Instant)>,
    /// When the waiter was killed (its future dropped), if it was.
    pub crashed: Option<Instant>,
}

/// "No waiter passed over": a waiter `j` granted while an earlier waiter
/// `i` (whose ticket was in line before `j`'s first attempt was sent) was
/// still alive must come after `i`: `i` was granted first (smaller fence).
/// `i` is certainly alive at `j`'s grant when it had not crashed by the
/// time `j`'s grant was answered. Returns every violation.
pub fn passed_over(history: &[Waited]) -> Vec<String> {
    let mut violations = Vec::new();
    for (i, a) in history.iter().enumerate() {
        let Some(enqueued) = a.enqueued else { continue };
        for (j, b) in history.iter().enumerate() {
            let Some((fence_b, answered_b)) = b.granted else {
                continue;
            };
            if i == j || enqueued >= b.start {
                continue;
            }
            let alive = a.crashed.is_none_or(|c| c > answered_b);
            let before = a.granted.is_some_and(|(fence_a, _)| fence_a < fence_b);
            if alive && !before {
                violations.push(format!(
                    "waiter {j} (fence {fence_b}) was granted before waiter {i}, in line earlier: {a:?}"
                ));
            }
        }
    }
    violations
}
