//! Property tests: random sequences of `check` and `peek` (random costs, random
//! pauses) against every algorithm, each answer compared field by field with
//! a reference model written here in plain Rust and driven by the server time
//! the answer reports (`RateLimit::at`). Any off-by-one in `remaining`,
//! `retry_after` or `reset_after` shows up as a minimal failing sequence.
//!
//! Then random histories of checks, refunds (of any earlier admission, any
//! amount, through the charge itself or through a copy of it serialized
//! when it was taken and refunded over a second connection, as another
//! process would) and pauses, each held to the algorithm's bound with every
//! refund counted against the admission it undoes (`check_history`): a
//! refund that gives back more than its charge still holds, or a copy that
//! gives it back a second time, shows up there.
//! Failing cases are kept in `tests/rate_model.proptest-regressions`.

mod support;

use std::time::{Duration, UNIX_EPOCH};

use nolock::rate::{Algorithm, Charge, Limiter, Quota, RateLimit};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use support::{prefix, RedisServer};

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

/// A server, a runtime, a connection and a proptest runner of `cases`
/// cases whose failures are kept beside this file.
fn harness(
    cases: u32,
) -> (
    RedisServer,
    tokio::runtime::Runtime,
    redis::aio::MultiplexedConnection,
    TestRunner,
) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt.block_on(server.conn());
    let config = Config {
        cases,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    (server, rt, conn, TestRunner::new(config))
}

fn conforms_to_the_model(algorithm: Algorithm) {
    let (_server, rt, conn, mut runner) = harness(24);
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

/// One operation of a refund history: a check of `cost`, or a refund of
/// `amount` of the `charge`-th admitted check (modulo their number), after
/// `pause_ms`: through the charge (`copy` false: clamped to what it still
/// holds), or through a copy of it deserialized from what it was when taken
/// (`copy` true: it still believes it holds its whole cost), sent over a
/// second connection.
#[derive(Debug, Clone)]
enum Op {
    Check {
        cost: u64,
        pause_ms: u64,
    },
    Refund {
        charge: usize,
        amount: u64,
        pause_ms: u64,
        copy: bool,
    },
}

fn history(bursty: bool) -> impl Strategy<Value = (Case, Vec<Op>)> {
    case(bursty).prop_flat_map(|c| {
        let burst = c.burst;
        let pause = prop::sample::select(vec![0u64, 0, 1, 5, 15, 40]);
        let op = prop_oneof![
            3 => (1..=burst, pause.clone()).prop_map(|(cost, pause_ms)| Op::Check { cost, pause_ms }),
            2 => (any::<usize>(), 1..=burst, pause, any::<bool>())
                .prop_map(|(charge, amount, pause_ms, copy)| Op::Refund { charge, amount, pause_ms, copy }),
        ];
        (Just(c), prop::collection::vec(op, 1..30))
    })
}

/// An admitted check, its charge (which refunds lower), a serialized copy
/// of the charge as it was taken, and what refunds of either have given
/// back of it.
#[derive(Debug)]
struct Admission {
    decision: RateLimit,
    charge: Charge,
    copy: String,
    cost: u64,
    credited: u64,
}

impl Admission {
    fn at_us(&self) -> u64 {
        self.decision
            .at
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    }
    /// The units the admission still counts for: its cost less everything
    /// any refund of it (the charge's or a copy's) gave back.
    fn net(&self) -> u64 {
        self.cost - self.credited
    }
}

/// The invariant every algorithm states, with each refund counted against
/// the admission it undoes: admitted minus validly refunded units never
/// exceed the bound.
///
/// * GCRA, token bucket: within any span of server time from t1 to t2, at
///   most burst + floor((t2 - t1) / T) units.
/// * Fixed window: at most L units per window (a window is named by its end,
///   `at` + `reset_after` of every admission in it).
/// * Sliding window: at most L units per aligned window.
fn check_history(algorithm: Algorithm, c: &Case, admitted: &[Admission]) -> Result<(), String> {
    let t = (c.period_ms * 1000).div_ceil(c.rate);
    match algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            for (i, first) in admitted.iter().enumerate() {
                let mut sum = 0;
                for last in &admitted[i..] {
                    sum += last.net();
                    let span = last.at_us() - first.at_us();
                    if sum > c.burst + span / t {
                        return Err(format!(
                            "{sum} units in {span} us > burst {} + {span}/{t}",
                            c.burst
                        ));
                    }
                }
            }
        }
        _ => {
            let mut per_window = std::collections::BTreeMap::new();
            for a in admitted {
                let at_ms = a.at_us() / 1000;
                let window = if algorithm == Algorithm::FixedWindow {
                    at_ms + a.decision.reset_after.as_millis() as u64
                } else {
                    at_ms / c.period_ms
                };
                *per_window.entry(window).or_insert(0) += a.net();
            }
            if let Some((w, n)) = per_window.iter().find(|(_, n)| **n > c.rate) {
                return Err(format!("{n} units in window {w} > limit {}", c.rate));
            }
        }
    }
    Ok(())
}

fn refunds_never_let_more_through(algorithm: Algorithm) {
    let (server, rt, conn, mut runner) = harness(12);
    let other = rt.block_on(server.conn());
    let bursty = matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket);
    runner
        .run(&history(bursty), |(c, ops)| {
            let quota = Quota::per(c.rate, Duration::from_millis(c.period_ms))
                .unwrap()
                .with_burst(c.burst)
                .unwrap();
            let limiter = Limiter::new(algorithm, quota).unwrap();
            let key = format!("{}{algorithm}", prefix("refunds"));
            let mut conn = conn.clone();
            let mut other = other.clone();
            let mut admitted: Vec<Admission> = Vec::new();
            rt.block_on(async {
                for op in &ops {
                    match *op {
                        Op::Check { cost, pause_ms } => {
                            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                            let d = limiter.check(&mut conn, &key, cost).await.unwrap();
                            prop_assert_eq!(d.allowed, d.charge().is_some());
                            let (decision, charge) = d.into_parts();
                            if let Some(charge) = charge {
                                prop_assert_eq!((charge.cost(), charge.held()), (cost, cost));
                                admitted.push(Admission {
                                    decision,
                                    copy: serde_json::to_string(&charge).unwrap(),
                                    charge,
                                    cost,
                                    credited: 0,
                                });
                            }
                        }
                        Op::Refund {
                            charge,
                            amount,
                            pause_ms,
                            copy,
                        } => {
                            if admitted.is_empty() {
                                continue;
                            }
                            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                            let i = charge % admitted.len();
                            let a = &mut admitted[i];
                            let r = if copy {
                                // A copy as it was taken: it still claims the whole cost.
                                let mut copy: Charge = serde_json::from_str(&a.copy).unwrap();
                                let amount = amount.min(copy.held());
                                copy.refund(&mut other, amount).await.unwrap()
                            } else {
                                let amount = amount.min(a.charge.held());
                                if amount == 0 {
                                    continue; // refunded in full already
                                }
                                let held = a.charge.held();
                                let r = a.charge.refund(&mut conn, amount).await.unwrap();
                                prop_assert!(r.credited <= amount, "{:?} for {}", r, amount);
                                prop_assert_eq!(a.charge.held(), held - r.credited);
                                r
                            };
                            a.credited += r.credited;
                            prop_assert!(
                                a.credited <= a.cost,
                                "{} credited for a charge of {} (copy: {})",
                                a.credited,
                                a.cost,
                                copy
                            );
                        }
                    }
                    if let Err(e) = check_history(algorithm, &c, &admitted) {
                        let seen: Vec<_> = admitted
                            .iter()
                            .map(|a| (a.at_us() % 100_000_000, a.net(), a.credited))
                            .collect();
                        prop_assert!(false, "{}: {} after {:?}: {:?}", algorithm, e, op, seen);
                    }
                }
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn gcra_refunds_never_let_more_through() {
    refunds_never_let_more_through(Algorithm::Gcra);
}

#[test]
fn token_bucket_refunds_never_let_more_through() {
    refunds_never_let_more_through(Algorithm::TokenBucket);
}

#[test]
fn sliding_window_refunds_never_let_more_through() {
    refunds_never_let_more_through(Algorithm::SlidingWindow);
}

#[test]
fn fixed_window_refunds_never_let_more_through() {
    refunds_never_let_more_through(Algorithm::FixedWindow);
}
