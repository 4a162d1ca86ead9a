//! Property tests: random sequences of `check` and `peek` (random costs, random
//! pauses) against every algorithm, each answer compared field by field with
//! a reference model written here in plain Rust and driven by the server time
//! the answer reports (`RateLimit::at`). Any off-by-one in `remaining`,
//! `retry_after` or `reset_after` shows up as a minimal failing sequence.
//!
//! Then random receipt histories on every algorithm, with one limit and
//! with a `MultiLimiter` of two: checks; refunds and settlements below, at
//! or above the estimate, of any earlier admission, through the charge or
//! through a copy of it serialized when it was taken and sent over a second
//! connection, as another process would; resets; pauses of up to 40 ms
//! against a settle deadline of 60 ms. After every operation each limit's
//! history is held to its bound in every window (`support::window`: credits
//! attributed to the admission they undo, excess counted when charged, no
//! window across a reset), and each refund and settlement to the direct
//! rules of `run_receipts`. Four hand-written histories go through the same
//! code: a refund in debt, a copy settling after a refund and the drain, a
//! refund after a reset, a refund after the deadline; and a fifth, a
//! reservoir's draws after the server refilled, through the same checker.
//! Failing cases are kept in `tests/rate_model.proptest-regressions`.
//!
//! Why one file of about 1000 lines: both halves are random histories
//! against one server per test with the same runner, and share that
//! regression file (a seed kept by one test is replayed by all of them).

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::rate::{
    Algorithm, Charge, Limiter, MultiCharge, MultiKey, MultiLimiter, Quota, RateLimit, Reservoir,
    Settle, Settlement,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use support::window::{self, Admitted, Bound, History};
use support::{prefix, RedisServer};

type Conn = redis::aio::MultiplexedConnection;

#[derive(Debug, Clone)]
struct Step {
    peek: bool,
    cost: u64,
    pause_ms: u64,
}

#[derive(Debug, Clone)]
struct Case {
    rate: u64,
    period_ms: u64,
    burst: u64,
    steps: Vec<Step>,
}

fn case(bursty: bool) -> impl Strategy<Value = Case> {
    (1u64..8, prop::sample::select(vec![20u64, 50, 100]), 0u64..8).prop_flat_map(
        move |(rate, period_ms, extra)| {
            let burst = if bursty { rate + extra } else { rate };
            let step = (
                any::<bool>(),
                1..=burst,
                prop::sample::select(vec![0u64, 0, 1, 3, 7, 15, 30]),
            )
                .prop_map(|(peek, cost, pause_ms)| Step {
                    peek,
                    cost,
                    pause_ms,
                });
            prop::collection::vec(step, 1..25).prop_map(move |steps| Case {
                rate,
                period_ms,
                burst,
                steps,
            })
        },
    )
}

/// What every algorithm answers, in the units of the reply.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    allowed: bool,
    remaining: u64,
    retry_ms: Option<u64>,
    reset_ms: u64,
}

impl From<&RateLimit> for Answer {
    fn from(d: &RateLimit) -> Self {
        Answer {
            allowed: d.allowed,
            remaining: d.remaining,
            retry_ms: d.retry_after.map(|r| r.as_millis() as u64),
            reset_ms: d.reset_after.as_millis() as u64,
        }
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// The state each algorithm keeps, as the scripts document it.
#[derive(Debug, Default)]
enum Model {
    #[default]
    Empty,
    Gcra {
        tat: u64,
    },
    Bucket {
        tokens: u64,
        at: u64,
    },
    Sliding {
        start: u64,
        count: u64,
        previous: u64,
    },
    Fixed {
        count: u64,
        end: u64,
    },
}

fn step(
    model: &mut Model,
    algorithm: Algorithm,
    c: &Case,
    now_us: u64,
    cost: u64,
    peek: bool,
) -> Answer {
    let t = (c.period_ms * 1000).div_ceil(c.rate);
    let now_ms = now_us / 1000;
    match algorithm {
        Algorithm::Gcra => {
            let b = c.burst;
            let tat = match *model {
                Model::Gcra { tat } => tat.max(now_us),
                _ => now_us,
            };
            let fits = tat - now_us + cost * t <= b * t;
            let after = if fits && !peek { tat + cost * t } else { tat };
            if fits && !peek {
                *model = Model::Gcra { tat: after };
            }
            let room = b * t - (after - now_us);
            Answer {
                allowed: fits,
                remaining: room / t,
                retry_ms: (!fits).then(|| ceil_div(cost * t - room, 1000)),
                reset_ms: ceil_div(after - now_us, 1000),
            }
        }
        Algorithm::TokenBucket => {
            let cap = c.burst;
            let (mut k, mut a) = match *model {
                Model::Bucket { tokens, at } => (tokens, at),
                _ => (cap, now_us),
            };
            if now_us > a {
                let add = (now_us - a) / t;
                (k, a) = if k + add >= cap {
                    (cap, now_us)
                } else {
                    (k + add, a + add * t)
                };
            }
            let fits = cost <= k;
            if fits && !peek {
                k -= cost;
                *model = Model::Bucket { tokens: k, at: a };
            }
            Answer {
                allowed: fits,
                remaining: k,
                retry_ms: (!fits).then(|| ceil_div(a + (cost - k) * t - now_us, 1000)),
                reset_ms: if k < cap {
                    ceil_div(a + (cap - k) * t - now_us, 1000)
                } else {
                    0
                },
            }
        }
        Algorithm::SlidingWindow => {
            let (w, l) = (c.period_ms, c.rate);
            let mut cur = now_ms / w * w;
            let (mut count, mut previous) = (0, 0);
            if let Model::Sliding {
                start,
                count: sc,
                previous: sp,
            } = *model
            {
                if start >= cur {
                    (cur, count, previous) = (start, sc, sp);
                } else if start + w == cur {
                    previous = sc;
                }
            }
            let e = now_ms - cur;
            let fits = count + cost <= l && previous * (w - e) <= (l - count - cost) * w;
            if fits && !peek {
                count += cost;
                *model = Model::Sliding {
                    start: cur,
                    count,
                    previous,
                };
            }
            let retry = || {
                let x = l as i64 - count as i64 - cost as i64;
                if x >= 0 && previous > 0 {
                    let e1 = w - (x as u64 * w) / previous;
                    if e1 < w {
                        return e1 - e;
                    }
                }
                if count == 0 {
                    return w - e;
                }
                let e2 = w.saturating_sub((l - cost) * w / count);
                w - e + e2
            };
            Answer {
                allowed: fits,
                remaining: l.saturating_sub(count + ceil_div(previous * (w - e), w)),
                retry_ms: (!fits).then(retry),
                reset_ms: if count > 0 {
                    cur + 2 * w - now_ms
                } else if previous > 0 {
                    cur + w - now_ms
                } else {
                    0
                },
            }
        }
        Algorithm::FixedWindow => {
            let (w, l) = (c.period_ms, c.rate);
            let (mut count, mut end) = match *model {
                Model::Fixed { count, end } if now_ms < end => (count, Some(end)),
                _ => (0, None),
            };
            let fits = count + cost <= l;
            if fits && !peek {
                count += cost;
                let e = *end.get_or_insert(now_ms + w);
                *model = Model::Fixed { count, end: e };
            }
            Answer {
                allowed: fits,
                remaining: l - count,
                retry_ms: (!fits).then(|| end.map_or(0, |e| e - now_ms)),
                reset_ms: match end {
                    Some(e) if count > 0 => e - now_ms,
                    _ => 0,
                },
            }
        }
        _ => unreachable!(),
    }
}

/// A server, a runtime and two connections to the server.
fn setup() -> (RedisServer, tokio::runtime::Runtime, Conn, Conn) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt.block_on(server.conn());
    let other = rt.block_on(server.conn());
    (server, rt, conn, other)
}

/// A proptest runner of `cases` cases whose failures are kept beside this
/// file. Every case sleeps, so shrinking is bounded.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        max_shrink_iters: 300,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    })
}

fn conforms_to_the_model(algorithm: Algorithm) {
    let (_server, rt, conn, _) = setup();
    let mut runner = runner(24);
    let bursty = matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket);
    runner
        .run(&case(bursty), |c| {
            let quota = Quota::per(c.rate, Duration::from_millis(c.period_ms))
                .unwrap()
                .with_burst(c.burst)
                .unwrap();
            let limiter = Limiter::new(algorithm, quota).unwrap();
            let key = format!("{}{algorithm}", prefix("model"));
            let mut model = Model::Empty;
            let mut conn = conn.clone();
            rt.block_on(async {
                for (i, s) in c.steps.iter().enumerate() {
                    tokio::time::sleep(Duration::from_millis(s.pause_ms)).await;
                    let d = if s.peek {
                        limiter.peek(&mut conn, &key, s.cost).await
                    } else {
                        limiter.check(&mut conn, &key, s.cost).await.map(|d| *d)
                    }
                    .unwrap();
                    let now_us = d.at.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
                    let want = step(&mut model, algorithm, &c, now_us, s.cost, s.peek);
                    prop_assert_eq!(Answer::from(&d), want, "step {}: {:?}", i, s);
                    prop_assert_eq!(d.limit, c.burst);
                }
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn gcra_conforms_to_the_model() {
    conforms_to_the_model(Algorithm::Gcra);
}

#[test]
fn token_bucket_conforms_to_the_model() {
    conforms_to_the_model(Algorithm::TokenBucket);
}

#[test]
fn sliding_window_conforms_to_the_model() {
    conforms_to_the_model(Algorithm::SlidingWindow);
}

#[test]
fn fixed_window_conforms_to_the_model() {
    conforms_to_the_model(Algorithm::FixedWindow);
}

/// One limit of a receipt history's limiter.
#[derive(Debug, Clone)]
struct Spec {
    rate: u64,
    period_ms: u64,
    burst: u64,
}

impl Spec {
    fn quota(&self) -> Quota {
        Quota::per(self.rate, Duration::from_millis(self.period_ms))
            .unwrap()
            .with_burst(self.burst)
            .unwrap()
    }
}

/// What a settlement asks for, relative to the charge's cost.
#[derive(Debug, Clone, Copy)]
enum Actual {
    Below(u64),
    Equal,
    Above(u64),
}

/// One operation of a receipt history, after `pause_ms`. `charge` picks an
/// earlier admission counting back from the latest (0), modulo their
/// number. `copy`: through a copy of the charge serialized when it was
/// taken (it still believes it holds its whole cost), over a second
/// connection, as another process would; else through the charge itself
/// (or a copy, once the charge was spent settling).
#[derive(Debug, Clone)]
enum Op {
    Check {
        cost: u64,
        pause_ms: u64,
    },
    Refund {
        charge: usize,
        amount: u64,
        copy: bool,
        pause_ms: u64,
    },
    Settle {
        charge: usize,
        actual: Actual,
        copy: bool,
        pause_ms: u64,
    },
    Reset {
        pause_ms: u64,
    },
}

impl Op {
    fn pause_ms(&self) -> u64 {
        match *self {
            Op::Check { pause_ms, .. }
            | Op::Refund { pause_ms, .. }
            | Op::Settle { pause_ms, .. }
            | Op::Reset { pause_ms } => pause_ms,
        }
    }
}

/// `limits` random limits (windows: burst = rate) and a history of every
/// receipt operation on them.
fn receipts(bursty: bool, limits: usize) -> impl Strategy<Value = (Vec<Spec>, Vec<Op>)> {
    let spec = (
        1u64..8,
        prop::sample::select(vec![20u64, 50, 100, 1_000]),
        0u64..8,
    )
        .prop_map(move |(rate, period_ms, extra)| Spec {
            rate,
            period_ms,
            burst: if bursty { rate + extra } else { rate },
        });
    prop::collection::vec(spec, limits).prop_flat_map(|specs| {
        let most = specs.iter().map(|s| s.burst).min().unwrap();
        let pause = prop::sample::select(vec![0u64, 0, 1, 3, 7, 15, 25, 40]);
        let actual = prop_oneof![
            (1..=most).prop_map(Actual::Below),
            Just(Actual::Equal),
            (1..=most).prop_map(Actual::Above),
        ];
        let op = prop_oneof![
            4 => (1..=most, pause.clone()).prop_map(|(cost, pause_ms)| Op::Check { cost, pause_ms }),
            2 => (0usize..6, 1..=most, any::<bool>(), pause.clone()).prop_map(
                |(charge, amount, copy, pause_ms)| Op::Refund { charge, amount, copy, pause_ms }
            ),
            2 => (0usize..6, actual, any::<bool>(), pause.clone()).prop_map(
                |(charge, actual, copy, pause_ms)| Op::Settle { charge, actual, copy, pause_ms }
            ),
            1 => pause.prop_map(|pause_ms| Op::Reset { pause_ms }),
        ];
        (Just(specs), prop::collection::vec(op, 1..40))
    })
}

/// The limiter of a receipt history: one limit, or a `MultiLimiter` of
/// several (a per-user limit, then shared ones), every one checked.
enum Limits {
    One(Limiter, String),
    Multi(MultiLimiter, MultiKey),
}

/// A charge of either.
enum Receipt {
    One(Charge),
    Multi(MultiCharge),
}

/// What a settlement answered, one settlement per limit.
#[derive(Debug)]
enum SettleAnswer {
    Settled(Vec<Settlement>),
    Already,
    Expired,
}

fn settled<S: std::fmt::Debug>(
    answer: Settle<S>,
    each: impl FnOnce(S) -> Vec<Settlement>,
) -> SettleAnswer {
    match answer {
        Settle::Settled(s) => SettleAnswer::Settled(each(s)),
        Settle::AlreadySettled => SettleAnswer::Already,
        Settle::Expired => SettleAnswer::Expired,
        other => panic!("a settlement answer this test does not know: {other:?}"),
    }
}

impl Limits {
    fn new(algorithm: Algorithm, specs: &[Spec], within: Duration, tag: &str) -> Limits {
        if let [one] = specs {
            let limiter = Limiter::new(algorithm, one.quota())
                .unwrap()
                .settle_within(within)
                .unwrap();
            return Limits::One(limiter, tag.to_owned());
        }
        let mut limiter = MultiLimiter::new(algorithm);
        let mut key = MultiKey::new(&format!("{{{tag}}}:user"));
        for (i, spec) in specs.iter().enumerate() {
            let name = format!("l{i}");
            limiter = if i == 0 {
                limiter.limit(&name, spec.quota())
            } else {
                key = key.shared(&name, &format!("{{{tag}}}:{name}"));
                limiter.shared_limit(&name, spec.quota())
            }
            .unwrap();
        }
        Limits::Multi(limiter.settle_within(within).unwrap(), key)
    }

    /// Whether the check admitted, each limit's answer, and the charge.
    async fn check(&self, conn: &mut Conn, cost: u64) -> (bool, Vec<RateLimit>, Option<Receipt>) {
        match self {
            Limits::One(l, key) => {
                let d = l.check(conn, key, cost).await.unwrap();
                let allowed = d.allowed;
                let (answer, charge) = d.into_parts();
                (allowed, vec![answer], charge.map(Receipt::One))
            }
            Limits::Multi(l, key) => {
                let d = l.check(conn, key.clone(), cost).await.unwrap();
                let (allowed, answers) = (d.allowed, d.limits.clone());
                (allowed, answers, d.into_charge().map(Receipt::Multi))
            }
        }
    }

    async fn reset(&self, conn: &mut Conn) {
        match self {
            Limits::One(l, key) => l.reset(conn, key).await.unwrap(),
            Limits::Multi(l, key) => l.reset(conn, key.clone()).await.unwrap(),
        }
    }

    fn copy(&self, receipt: &Receipt) -> String {
        match receipt {
            Receipt::One(c) => serde_json::to_string(c).unwrap(),
            Receipt::Multi(c) => serde_json::to_string(c).unwrap(),
        }
    }

    fn revive(&self, copy: &str) -> Receipt {
        match self {
            Limits::One(..) => Receipt::One(serde_json::from_str(copy).unwrap()),
            Limits::Multi(..) => Receipt::Multi(serde_json::from_str(copy).unwrap()),
        }
    }
}

impl Receipt {
    fn cost(&self) -> u64 {
        match self {
            Receipt::One(c) => c.cost(),
            Receipt::Multi(c) => c.cost(),
        }
    }

    fn held(&self) -> u64 {
        match self {
            Receipt::One(c) => c.held(),
            Receipt::Multi(c) => c.held(),
        }
    }

    fn at_us(&self) -> u64 {
        let at = match self {
            Receipt::One(c) => c.at(),
            Receipt::Multi(c) => c.at(),
        };
        micros(at)
    }

    /// Units credited on each limit.
    async fn refund(&mut self, conn: &mut Conn, amount: u64) -> Vec<u64> {
        match self {
            Receipt::One(c) => vec![c.refund(conn, amount).await.unwrap().credited],
            Receipt::Multi(c) => {
                let refunds = c.refund(conn, amount).await.unwrap();
                refunds.iter().map(|r| r.credited).collect()
            }
        }
    }

    async fn settle(self, conn: &mut Conn, actual: u64) -> SettleAnswer {
        match self {
            Receipt::One(c) => settled(c.settle(conn, actual).await.unwrap(), |s| vec![s]),
            Receipt::Multi(c) => settled(c.settle(conn, actual).await.unwrap(), |s| s),
        }
    }
}

/// An admitted check of a receipt history and what became of it.
struct Taken {
    /// `None` once spent settling.
    receipt: Option<Receipt>,
    /// Serialized when it was taken.
    copy: String,
    cost: u64,
    epoch: usize,
    /// The first instant (µs) past its settle deadline: the scripts expire
    /// a charge when `now_ms > floor(at / 1000) + settle_within_ms`.
    deadline_us: u64,
    settled: bool,
    /// Per limit: every unit credited of it, by the charge or any copy.
    credited: Vec<u64>,
    /// Per limit: its admission in that limit's history.
    admitted: Vec<Admitted>,
}

/// Around a deadline, the reply's time is taken inside the script and the
/// wall clock's outside it: only this far from it is a call judged.
const SLACK_US: u64 = 3_000;

fn micros(t: SystemTime) -> u64 {
    support::history::micros(t)
}

fn now_us() -> u64 {
    micros(SystemTime::now())
}

/// The window a decision counts in: the fixed window by its end, the
/// calendar period by the end its answer names, the sliding window by its
/// aligned number (0 for GCRA and token bucket).
fn window_of(algorithm: Algorithm, spec: &Spec, d: &RateLimit) -> u64 {
    let at_ms = micros(d.at) / 1000;
    match algorithm {
        Algorithm::FixedWindow => at_ms + d.reset_after.as_millis() as u64,
        Algorithm::Calendar => d.period_end.map_or(0, |end| micros(end) / 1000),
        Algorithm::SlidingWindow => at_ms / spec.period_ms,
        _ => 0,
    }
}

fn bound(algorithm: Algorithm, spec: &Spec) -> Bound {
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::Calendar => {
            Bound::windows(spec.rate)
        }
        _ => Bound::rate_everywhere(spec.burst, spec.quota().emission_interval()),
    }
}

/// Runs `ops` on `algorithm` with the limits `specs` (charges settle within
/// `within`), holds every limit's history to its bound in every window
/// (`support::window`) after each operation, and checks the direct rules
/// of each refund and settlement:
///
/// * the units credited of one charge, by every copy, never pass its cost;
/// * a settlement asks to charge exactly `max(0, actual - held)` on each
///   limit, `held` being its cost less every unit any copy had credited of
///   it (a forgotten refund record shows here);
/// * a refund or settlement of a charge taken before a reset gives nothing
///   (a refund credits 0, a settlement answers `Expired`), as does one after
///   the charge's settle deadline, or of a charge settled already;
/// * a settlement answers `Settled` at most once, never after its deadline
///   by the server time of its reply.
async fn run_receipts(
    algorithm: Algorithm,
    specs: &[Spec],
    within: Duration,
    ops: &[Op],
    conn: &mut Conn,
    other: &mut Conn,
) -> Result<(), TestCaseError> {
    let tag = format!("{}{algorithm}", prefix("receipts"));
    let limits = Limits::new(algorithm, specs, within, &tag);
    let within_ms = within.as_millis() as u64;
    let mut histories = vec![History::new(); specs.len()];
    let mut taken: Vec<Taken> = Vec::new();
    let mut epoch = 0;
    for (step, op) in ops.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(op.pause_ms())).await;
        let pick = |k: usize, n: usize| n - 1 - k % n;
        match *op {
            Op::Check { cost, .. } => {
                let (allowed, answers, receipt) = limits.check(conn, cost).await;
                prop_assert_eq!(allowed, receipt.is_some());
                if let Some(receipt) = receipt {
                    prop_assert_eq!((receipt.cost(), receipt.held()), (cost, cost));
                    let at_us = receipt.at_us();
                    let admitted = answers
                        .iter()
                        .zip(specs)
                        .zip(&mut histories)
                        .map(|((d, spec), h)| {
                            h.admit_in(window_of(algorithm, spec, d), micros(d.at), cost)
                        })
                        .collect();
                    taken.push(Taken {
                        copy: limits.copy(&receipt),
                        receipt: Some(receipt),
                        cost,
                        epoch,
                        deadline_us: (at_us / 1000 + within_ms + 1) * 1000,
                        settled: false,
                        credited: vec![0; specs.len()],
                        admitted,
                    });
                }
            }
            Op::Refund {
                charge,
                amount,
                copy,
                ..
            } => {
                if taken.is_empty() {
                    continue;
                }
                let n = taken.len();
                let t = &mut taken[pick(charge, n)];
                let invoked = now_us();
                let credited = match &mut t.receipt {
                    Some(receipt) if !copy => {
                        let amount = amount.min(receipt.held());
                        if amount == 0 {
                            continue; // refunded in full already
                        }
                        let held = receipt.held();
                        let credited = receipt.refund(conn, amount).await;
                        let most = credited.iter().copied().max().unwrap_or(0);
                        prop_assert!(most <= amount, "{:?} credited for {}", credited, amount);
                        // It holds what it held less what was credited: on
                        // several limits, the most any limit still holds.
                        if let [one] = credited[..] {
                            prop_assert_eq!(receipt.held(), held - one);
                        } else {
                            prop_assert!((held - most..=held).contains(&receipt.held()));
                        }
                        credited
                    }
                    _ => {
                        let mut copy = limits.revive(&t.copy);
                        copy.refund(other, amount.min(t.cost)).await
                    }
                };
                let late = invoked >= t.deadline_us + SLACK_US;
                let gave = credited.iter().any(|&c| c > 0);
                prop_assert!(
                    !(gave && t.epoch < epoch),
                    "a refund of a charge taken before a reset credited {:?}: \
                     a reset makes earlier charges give nothing back",
                    credited
                );
                prop_assert!(
                    !(gave && late),
                    "a refund {} us after the charge's settle deadline credited {:?}: \
                     past its deadline a charge gives nothing back",
                    invoked - t.deadline_us,
                    credited
                );
                prop_assert!(
                    !(gave && t.settled),
                    "a refund of a settled charge credited {:?}",
                    credited
                );
                for (l, &c) in credited.iter().enumerate() {
                    t.credited[l] += c;
                    prop_assert!(
                        t.credited[l] <= t.cost,
                        "{} credited on limit {} for a charge of {}",
                        t.credited[l],
                        l,
                        t.cost
                    );
                    histories[l].credit(t.admitted[l], c);
                }
            }
            Op::Settle {
                charge,
                actual,
                copy,
                ..
            } => {
                if taken.is_empty() {
                    continue;
                }
                let n = taken.len();
                let t = &mut taken[pick(charge, n)];
                let actual = match actual {
                    Actual::Below(k) => t.cost.saturating_sub(k),
                    Actual::Equal => t.cost,
                    Actual::Above(k) => t.cost + k,
                };
                let receipt = match t.receipt.take() {
                    Some(receipt) if !copy => receipt,
                    kept => {
                        t.receipt = kept;
                        limits.revive(&t.copy)
                    }
                };
                let answer = receipt
                    .settle(if copy { &mut *other } else { &mut *conn }, actual)
                    .await;
                let completed = now_us();
                match &answer {
                    SettleAnswer::Settled(each) => {
                        prop_assert!(!t.settled, "a charge settled twice: {:?}", answer);
                        prop_assert!(
                            t.epoch == epoch,
                            "a settlement of a charge taken before a reset settled {:?}: \
                             after a reset it answers Expired",
                            each
                        );
                        let at = micros(each[0].state.at);
                        prop_assert!(
                            at < t.deadline_us + SLACK_US,
                            "settled {} us after the charge's deadline by the server clock",
                            at.saturating_sub(t.deadline_us)
                        );
                        for (l, s) in each.iter().enumerate() {
                            let held = t.cost - t.credited[l];
                            prop_assert_eq!(
                                s.charged + s.uncharged,
                                actual.saturating_sub(held),
                                "limit {}: a settlement at {} of a charge of {} that still \
                                 holds {} ({} credited by refunds) must charge the difference; {:?}",
                                l,
                                actual,
                                t.cost,
                                held,
                                t.credited[l],
                                s
                            );
                            prop_assert!(s.credited <= held.saturating_sub(actual), "{:?}", s);
                            t.credited[l] += s.credited;
                            histories[l].credit(t.admitted[l], s.credited);
                            let window = window_of(algorithm, &specs[l], &s.state);
                            histories[l].excess_in(window, micros(s.state.at), s.charged);
                        }
                        t.settled = true;
                    }
                    SettleAnswer::Already => {
                        prop_assert!(t.settled, "AlreadySettled, but it never was");
                    }
                    SettleAnswer::Expired => {
                        prop_assert!(
                            t.settled || t.epoch < epoch || completed + SLACK_US >= t.deadline_us,
                            "Expired {} us before the charge's deadline",
                            t.deadline_us - completed
                        );
                    }
                }
            }
            Op::Reset { .. } => {
                limits.reset(conn).await;
                epoch += 1;
                for h in &mut histories {
                    h.reset();
                }
            }
        }
        for (l, (h, spec)) in histories.iter().zip(specs).enumerate() {
            if let Err(e) = window::check(h, bound(algorithm, spec)) {
                prop_assert!(
                    false,
                    "{} limit {}: {} (after step {}: {:?})",
                    algorithm,
                    l,
                    e,
                    step,
                    op
                );
            }
        }
    }
    Ok(())
}

/// Random receipt histories on `limits` limits of `algorithm`, whose
/// charges settle within 60 ms, so that pauses of up to 40 ms put some
/// refunds and settlements past the deadline.
fn receipts_hold_every_window(algorithm: Algorithm, limits: usize) {
    let (_server, rt, conn, other) = setup();
    let mut runner = runner(10);
    let bursty = matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket);
    runner
        .run(&receipts(bursty, limits), |(specs, ops)| {
            let (mut conn, mut other) = (conn.clone(), other.clone());
            let within = Duration::from_millis(60);
            rt.block_on(run_receipts(
                algorithm, &specs, within, &ops, &mut conn, &mut other,
            ))
        })
        .unwrap();
}

#[test]
fn gcra_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::Gcra, 1);
}

#[test]
fn token_bucket_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::TokenBucket, 1);
}

#[test]
fn sliding_window_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::SlidingWindow, 1);
}

#[test]
fn fixed_window_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::FixedWindow, 1);
}

/// Periods of the spec's length from the epoch (`Quota::per` under
/// `Algorithm::Calendar`): refunds only within the charge's period, a
/// settlement's excess into the period the server is in.
#[test]
fn calendar_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::Calendar, 1);
}

#[test]
fn calendar_multi_limit_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::Calendar, 2);
}

#[test]
fn gcra_multi_limit_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::Gcra, 2);
}

#[test]
fn token_bucket_multi_limit_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::TokenBucket, 2);
}

#[test]
fn sliding_window_multi_limit_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::SlidingWindow, 2);
}

#[test]
fn fixed_window_multi_limit_receipts_hold_the_bound_in_every_window() {
    receipts_hold_every_window(Algorithm::FixedWindow, 2);
}

/// Runs one hand-written history on each of `algorithms` through
/// [`run_receipts`]; fails with every algorithm's failure.
fn each_holds(algorithms: &[Algorithm], specs: &[Spec], within: Duration, ops: &[Op]) {
    let (_server, rt, mut conn, mut other) = setup();
    let failures: Vec<String> = algorithms
        .iter()
        .filter_map(|&algorithm| {
            let specs: Vec<Spec> = specs
                .iter()
                .map(|s| Spec {
                    burst: match algorithm {
                        Algorithm::Gcra | Algorithm::TokenBucket => s.burst,
                        _ => s.rate,
                    },
                    ..s.clone()
                })
                .collect();
            rt.block_on(run_receipts(
                algorithm, &specs, within, ops, &mut conn, &mut other,
            ))
            .err()
            .map(|e| format!("{algorithm}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const HOUR_MS: u64 = 3_600_000;

fn per_hour(rate: u64) -> Spec {
    Spec {
        rate,
        period_ms: HOUR_MS,
        burst: rate,
    }
}

fn check(cost: u64) -> Op {
    Op::Check { cost, pause_ms: 0 }
}

fn refund(charge: usize, amount: u64, pause_ms: u64) -> Op {
    Op::Refund {
        charge,
        amount,
        copy: false,
        pause_ms,
    }
}

/// 10 per hour: A takes 5, B takes 5, B settles at 8 (3 into debt), A
/// refunds 5. The limit is then 2 from full (5 + 3 charged), so of six
/// checks of 1, two fit.
#[test]
fn a_refund_in_debt_makes_no_room_at_once() {
    let ops = [
        check(5),
        check(5),
        Op::Settle {
            charge: 0,
            actual: Actual::Above(3),
            copy: false,
            pause_ms: 0,
        },
        refund(1, 5, 0),
        check(1),
        check(1),
        check(1),
        check(1),
        check(1),
        check(1),
    ];
    each_holds(
        &Algorithm::ALL,
        &[per_hour(10)],
        Duration::from_millis(HOUR_MS),
        &ops,
    );
}

/// 10 per 100 ms (T = 10 ms): a charge of 5 refunds 3, waits until it has
/// drained (its window ended), then a copy settles at 5: the 3 refunded
/// are owed again.
#[test]
fn a_copy_settling_after_the_charge_drained_remembers_its_refunds() {
    let ops = [
        check(5),
        refund(0, 3, 0),
        Op::Settle {
            charge: 0,
            actual: Actual::Equal,
            copy: true,
            pause_ms: 250,
        },
    ];
    let spec = Spec {
        rate: 10,
        period_ms: 100,
        burst: 10,
    };
    each_holds(&Algorithm::ALL, &[spec], Duration::from_secs(5), &ops);
}

/// 10 per hour: A takes 5, the limiter is reset, B takes 10, A refunds 5
/// (nothing: A was taken before the reset), C asks for 5 (denied).
#[test]
fn a_refund_after_a_reset_gives_nothing_back() {
    let ops = [
        check(5),
        Op::Reset { pause_ms: 0 },
        check(10),
        refund(1, 5, 0),
        check(5),
    ];
    each_holds(
        &Algorithm::ALL,
        &[per_hour(10)],
        Duration::from_millis(HOUR_MS),
        &ops,
    );
}

/// Charges settle within 40 ms: a refund 80 ms after its check (through
/// the charge, then a copy) gives nothing back.
#[test]
fn a_refund_after_the_settle_deadline_gives_nothing_back() {
    let ops = [
        check(5),
        refund(0, 2, 80),
        Op::Refund {
            charge: 0,
            amount: 3,
            copy: true,
            pause_ms: 0,
        },
    ];
    each_holds(
        &Algorithm::ALL,
        &[per_hour(10)],
        Duration::from_millis(40),
        &ops,
    );
}

/// A Reservoir on 10 per second, burst 10 (T = 100 ms), batches of up to
/// 10 held 5 s: it takes the whole burst from the server and serves 2.
/// After a second the server has refilled; a direct check takes 10, and
/// the reservoir may not serve the 8 it still holds (they refilled on the
/// server). Its draws (each known to lie within the call) and the direct
/// admission go through the window checker.
#[test]
fn a_reservoir_serves_no_unit_the_server_has_refilled() {
    let (_server, rt, mut conn, other) = setup();
    rt.block_on(async {
        let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
        let key = prefix("reservoir_refilled");
        let r = Reservoir::new(other, limiter.clone(), &key, 10, Duration::from_secs(5)).unwrap();
        let mut history = History::new();
        let mut draws = 0;
        for _ in 0..2 {
            let from = now_us();
            if r.check(1).await.unwrap().allowed {
                history.draw(from, now_us(), 1);
                draws += 1;
            }
        }
        let (held, granted) = (r.held(), r.stats().granted);
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        let direct = limiter.check(&mut conn, &key, 10).await.unwrap();
        assert!(direct.allowed, "the server refilled: {:?}", *direct);
        history.admit(micros(direct.at), 10);
        for _ in 0..8 {
            let from = now_us();
            if r.check(1).await.unwrap().allowed {
                history.draw(from, now_us(), 1);
                draws += 1;
            }
        }
        let bound = Bound::rate(10, limiter.quota().emission_interval());
        if let Err(e) = window::check(&history, bound) {
            panic!(
                "{e} (the reservoir was granted {granted} and held {held} after its first 2 \
                 draws; {draws} draws in all)"
            );
        }
    });
}
