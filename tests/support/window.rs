//! The window checker: one rate limit's bound held in **every window** of
//! a history, not only from its start. Every rate checker goes through it
//! (`tests/rate_model.rs`, `tests/rate_settle.rs`, `tests/rate_reservoir.rs`
//! and the torture's [`super::history::check_rate`]); its self-test is
//! `tests/window_checker.rs`.
//!
//! # The invariant
//!
//! A [`History`] lists the events of one limit (burst `b` and emission
//! interval `T` µs, or a window limit `L`) **in the order they took
//! effect** on the server. Times are server times in µs (`RateLimit::at`).
//!
//! * An **admission** (a check that admitted `cost` units at `at`) counts
//!   its cost, less every unit later **credited** by a refund or by a
//!   settlement below the estimate of that same charge (through the charge
//!   or any serialized copy). Credits are *attributed to the admission they
//!   undo*, never counted at the refund's own time, and a window ending at
//!   an admission counts only the credits listed before that admission:
//!   a refund cannot excuse what was admitted before it ran.
//! * **Excess** charged by a settlement above its estimate
//!   (`Settlement::charged`) counts as units at the settlement's server
//!   time: it is charged then.
//! * A **reset** (`Limiter::reset`) starts a new epoch: no window spans a
//!   reset, and a credit of an admission of an earlier epoch makes no room
//!   in a later one.
//! * A **draw** (`Reservoir::check` admitted locally, with no server time)
//!   is known only to lie within `[from, to]` µs of the wall clock (the test
//!   server runs on this machine: one clock). It counts in a window only
//!   when its whole interval lies inside, so a draw never raises a false
//!   alarm.
//! * A **loose credit** (a refund whose admission is not in the history: its
//!   check's answer was lost or forgotten by a failover) may have run at any
//!   instant of `[from, to]` and counts in every window that span meets.
//!
//! [`Bound::Rate`] (GCRA, token bucket, reservoirs): for every `t1 <= t2` of
//! one epoch, `t2` the instant of an admission (or the end of a draw) and
//! `t1` that of any event (the start of a draw),
//!
//! ```text
//! units admitted in [t1, t2] net of the credits attributed to them so far
//!   + excess charged in [t1, t2] + draws inside [t1, t2]
//!   - loose credits that may have run in [t1, t2]
//!   <= b + floor((t2 - t1) / T)
//! ```
//!
//! exact in microseconds (the scripts' schedule rises by `cost × T` per
//! admitted or charged unit, falls by at most `T` per unit credited, and
//! admits only while at most `b × T` ahead of the clock), for every window
//! up to `horizon_us` long.
//!
//! [`Bound::Windows`] (fixed and sliding window): at each admission, in its
//! (epoch, window), the net units admitted so far plus the excess charged
//! so far are at most `L`. A window is named by the caller: the fixed
//! window by its end (`at + reset_after` in ms), the sliding window by
//! `at_ms / period_ms`. (Draws and loose credits need the rate bound.)
//!
//! A sequential test lists events as its calls return. A concurrent one
//! sorts them: each admission at its server time, each credit at the
//! earliest instant it may have run (after its own admission), credits
//! first at one instant, so that a credit counts wherever it might have.
//!
//! O(n × w log w) for `n` events and at most `w` of them in one horizon.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// An admission of a [`History`], for the credits that undo part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Admitted(usize);

/// One event of a history on one limit (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A check admitted `units` at server time `at` µs, in window `window`
    /// (the window algorithms; 0 for the others).
    Admission { at: u64, units: u64, window: u64 },
    /// `units` of `admission` given back (a refund, or a settlement below
    /// the estimate).
    Credit { admission: Admitted, units: u64 },
    /// `units` charged beyond a reservation by a settlement at `at` µs, in
    /// window `window`.
    Excess { at: u64, units: u64, window: u64 },
    /// `Limiter::reset`: a new epoch begins.
    Reset,
    /// `units` served without server time, somewhere in `[from, to]` µs.
    Draw { from: u64, to: u64, units: u64 },
    /// `units` given back of an admission the history does not hold, at
    /// some instant of `[from, to]` µs.
    LooseCredit { from: u64, to: u64, units: u64 },
}

/// The events of one limit, in the order they took effect.
#[derive(Debug, Clone, Default)]
pub struct History {
    events: Vec<Event>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn push(&mut self, event: Event) {
        if let Event::Credit { admission, .. } = event {
            assert!(
                matches!(self.events.get(admission.0), Some(Event::Admission { .. })),
                "a credit of {admission:?}, which is no admission of this history"
            );
        }
        self.events.push(event);
    }

    /// An admission of `units` at `at` µs (GCRA, token bucket).
    pub fn admit(&mut self, at: u64, units: u64) -> Admitted {
        self.admit_in(0, at, units)
    }

    /// An admission of `units` at `at` µs in window `window`.
    pub fn admit_in(&mut self, window: u64, at: u64, units: u64) -> Admitted {
        self.push(Event::Admission { at, units, window });
        Admitted(self.events.len() - 1)
    }

    pub fn credit(&mut self, admission: Admitted, units: u64) {
        if units > 0 {
            self.push(Event::Credit { admission, units });
        }
    }

    pub fn excess(&mut self, at: u64, units: u64) {
        self.excess_in(0, at, units);
    }

    pub fn excess_in(&mut self, window: u64, at: u64, units: u64) {
        if units > 0 {
            self.push(Event::Excess { at, units, window });
        }
    }

    pub fn reset(&mut self) {
        self.push(Event::Reset);
    }

    pub fn draw(&mut self, from: u64, to: u64, units: u64) {
        assert!(from <= to, "a draw from {from} to {to}");
        self.push(Event::Draw { from, to, units });
    }

    pub fn loose_credit(&mut self, from: u64, to: u64, units: u64) {
        self.push(Event::LooseCredit { from, to, units });
    }
}

/// Every admission's credits: the index of each and the units credited up
/// to and including it, so that what was credited before any event is one
/// binary search away.
struct Credits(BTreeMap<usize, Vec<(usize, u64)>>);

impl Credits {
    fn new(history: &History) -> Credits {
        let mut credits: BTreeMap<usize, Vec<(usize, u64)>> = BTreeMap::new();
        for (i, e) in history.events.iter().enumerate() {
            if let Event::Credit { admission, units } = *e {
                let list = credits.entry(admission.0).or_default();
                let so_far = list.last().map_or(0, |c| c.1);
                list.push((i, so_far + units));
            }
        }
        Credits(credits)
    }

    /// The units of admission `index` (of `units`) still counted once the
    /// first `before` events took effect.
    fn net(&self, index: usize, units: u64, before: usize) -> u64 {
        let credited =
            self.0
                .get(&index)
                .map_or(0, |list| match list.partition_point(|c| c.0 < before) {
                    0 => 0,
                    n => list[n - 1].1,
                });
        units.saturating_sub(credited)
    }
}

/// What one limit admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// GCRA, token bucket, reservoir: `burst + floor(span / interval_us)`
    /// in every span up to `horizon_us` long.
    Rate {
        burst: u64,
        interval_us: u64,
        horizon_us: u64,
    },
    /// Fixed and sliding window: `limit` per (epoch, window).
    Windows { limit: u64 },
}

impl Bound {
    /// The rate bound over windows up to `(burst + 400) × T` long: the
    /// burst's refill time and 400 intervals more (long runs need a
    /// horizon; a short history can take [`Bound::rate_everywhere`]).
    pub fn rate(burst: u64, interval: Duration) -> Bound {
        let t = interval.as_micros() as u64;
        Bound::Rate {
            burst,
            interval_us: t,
            horizon_us: (burst + 400).saturating_mul(t),
        }
    }

    /// The rate bound over every window, however long (short histories).
    pub fn rate_everywhere(burst: u64, interval: Duration) -> Bound {
        Bound::Rate {
            burst,
            interval_us: interval.as_micros() as u64,
            horizon_us: u64::MAX,
        }
    }

    pub fn windows(limit: u64) -> Bound {
        Bound::Windows { limit }
    }
}

/// A window over the bound: the one most over it (the earliest of those),
/// with the events in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Its first and last instants, µs (one instant for the windows bound:
    /// the admission that went over).
    pub from: u64,
    pub to: u64,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Holds `history` to `bound` in every window: a one-line summary, or the
/// window most over the bound.
pub fn check(history: &History, bound: Bound) -> Result<String, Violation> {
    match bound {
        Bound::Rate {
            burst,
            interval_us,
            horizon_us,
        } => check_rate(history, burst, interval_us.max(1), horizon_us),
        Bound::Windows { limit } => check_windows(history, limit),
    }
}

/// An event that counts units over a span of time: an admission, an
/// excess or a draw.
#[derive(Debug, Clone, Copy)]
struct Span {
    from: u64,
    to: u64,
    epoch: usize,
    index: usize,
}

/// Loose credits, by the instants their spans start and end, with prefix
/// sums: the units of those that meet `[t1, t2]` in O(log n).
struct Loose {
    starts: Vec<u64>,
    start_sums: Vec<u64>,
    ends: Vec<u64>,
    end_sums: Vec<u64>,
}

impl Loose {
    fn new(history: &History) -> Loose {
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        for e in &history.events {
            if let Event::LooseCredit { from, to, units } = *e {
                starts.push((from, units));
                ends.push((to, units));
            }
        }
        let sums = |mut v: Vec<(u64, u64)>| {
            v.sort_unstable();
            let mut sums = vec![0];
            for &(_, u) in &v {
                sums.push(sums.last().unwrap() + u);
            }
            (v.into_iter().map(|(t, _)| t).collect::<Vec<_>>(), sums)
        };
        let (starts, start_sums) = sums(starts);
        let (ends, end_sums) = sums(ends);
        Loose {
            starts,
            start_sums,
            ends,
            end_sums,
        }
    }

    /// Units of the loose credits whose span meets `[t1, t2]`: started by
    /// `t2`, less those that ended before `t1`.
    fn within(&self, t1: u64, t2: u64) -> u64 {
        self.start_sums[self.starts.partition_point(|&s| s <= t2)]
            - self.end_sums[self.ends.partition_point(|&e| e < t1)]
    }
}

fn check_rate(history: &History, burst: u64, t: u64, horizon: u64) -> Result<String, Violation> {
    let events = &history.events;
    let mut spans = Vec::new();
    let mut epoch = 0;
    for (index, e) in events.iter().enumerate() {
        match *e {
            Event::Reset => epoch += 1,
            Event::Admission { at, .. } | Event::Excess { at, .. } => spans.push(Span {
                from: at,
                to: at,
                epoch,
                index,
            }),
            Event::Draw { from, to, .. } => spans.push(Span {
                from,
                to,
                epoch,
                index,
            }),
            Event::Credit { .. } | Event::LooseCredit { .. } => {}
        }
    }
    spans.sort_by_key(|s| (s.epoch, s.to, s.index));
    let loose = Loose::new(history);
    let credits = Credits::new(history);
    let mut windows = 0u64;
    // The least room left in any window, in µs of schedule: (b + span / T -
    // units) × T, as (units - b) × T - span <= 0.
    let mut tightest = i128::MIN;
    // The window most over the bound (in units; ties: the earliest end,
    // then the earliest start) and how many were over.
    let mut worst: Option<(u64, Violation)> = None;
    let mut over_windows = 0u64;
    for end in &spans {
        if matches!(events[end.index], Event::Excess { .. }) {
            continue; // a settlement's excess may run past the bound: a debt
        }
        let t2 = end.to;
        let earliest = t2.saturating_sub(horizon);
        let first = spans.partition_point(|s| (s.epoch, s.to) < (end.epoch, earliest));
        let last = spans.partition_point(|s| (s.epoch, s.to) <= (end.epoch, t2));
        // Units inside [t1, t2] for each start t1, latest start first.
        let mut inside: Vec<(u64, u64, usize)> = spans[first..last]
            .iter()
            .filter(|s| s.from >= earliest)
            .map(|s| {
                let units = match events[s.index] {
                    // Credits listed before the window's last admission.
                    Event::Admission { units, .. } => credits.net(s.index, units, end.index),
                    Event::Excess { units, .. } | Event::Draw { units, .. } => units,
                    _ => unreachable!(),
                };
                (s.from, units, s.index)
            })
            .collect();
        inside.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)));
        let mut units = 0u64;
        let mut here: Option<(u64, usize, u64)> = None;
        for (k, &(t1, u, _)) in inside.iter().enumerate() {
            units += u;
            if inside.get(k + 1).is_some_and(|next| next.0 == t1) {
                continue; // every event starting at t1 first
            }
            windows += 1;
            let span = t2 - t1;
            let loose = loose.within(t1, t2);
            let over = (units as i128 - loose as i128 - burst as i128) * t as i128 - span as i128;
            tightest = tightest.max(over);
            if over > 0 {
                over_windows += 1;
                // Units past b + floor(span / T): at least 1 when over.
                let past = units - loose - burst - span / t;
                if here.is_none_or(|h| past >= h.0) {
                    here = Some((past, k, loose));
                }
            }
        }
        if let Some((past, k, loose)) = here {
            if worst.as_ref().is_none_or(|w| past > w.0) {
                let t1 = inside[k].0;
                let span = t2 - t1;
                let units: u64 = inside[..=k].iter().map(|i| i.1).sum();
                let message = format!(
                    "{units} units{} in [{t1}, {t2}] us (epoch {}): more than burst \
                         {burst} + floor({span} us / {t} us) = {}; in the window: {}",
                    if loose > 0 {
                        format!(" less {loose} of loose credits")
                    } else {
                        String::new()
                    },
                    end.epoch,
                    burst + span / t,
                    describe(history, &inside[..=k])
                );
                worst = Some((
                    past,
                    Violation {
                        from: t1,
                        to: t2,
                        message,
                    },
                ));
            }
        }
    }
    if let Some((_, mut violation)) = worst {
        if over_windows > 1 {
            violation.message +=
                &format!(" ({over_windows} windows over the bound, this one the most)");
        }
        return Err(violation);
    }
    Ok(format!(
        "every window ok: {windows} windows of {} events, closest approach to the bound {}",
        events.len(),
        if tightest == i128::MIN {
            "none".to_owned()
        } else {
            format!("{} us", -tightest)
        }
    ))
}

/// The events of a window, in time order, as `kind@at:units`.
fn describe(history: &History, inside: &[(u64, u64, usize)]) -> String {
    let mut shown: Vec<_> = inside.to_vec();
    shown.sort_by_key(|&(t, _, i)| (t, i));
    let all = shown.len();
    let mut parts: Vec<String> = shown
        .iter()
        .take(40)
        .map(|&(_, units, i)| match history.events[i] {
            Event::Admission {
                at, units: cost, ..
            } if units != cost => format!("admitted@{at}:{cost}-{}", cost - units),
            Event::Admission { at, .. } => format!("admitted@{at}:{units}"),
            Event::Excess { at, .. } => format!("excess@{at}:{units}"),
            Event::Draw { from, to, .. } => format!("draw@{from}..{to}:{units}"),
            _ => unreachable!(),
        })
        .collect();
    if all > parts.len() {
        parts.push(format!("... {} more", all - parts.len()));
    }
    format!("[{}]", parts.join(", "))
}

fn check_windows(history: &History, limit: u64) -> Result<String, Violation> {
    let mut sums: BTreeMap<(usize, u64), u64> = BTreeMap::new();
    let mut counted: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
    let mut epoch = 0;
    let mut fullest = 0;
    for (i, e) in history.events.iter().enumerate() {
        match *e {
            Event::Reset => epoch += 1,
            Event::Admission { at, units, window } => {
                let sum = sums.entry((epoch, window)).or_default();
                *sum += units;
                counted.insert(i, (epoch, window));
                fullest = fullest.max(*sum);
                if *sum > limit {
                    let message = format!(
                        "{sum} units (net of credits, with excess) in window {window} of epoch \
                         {epoch} at {at} us: more than the limit {limit}; in it: [{}]",
                        window_events(history, i, (epoch, window)).join(", ")
                    );
                    return Err(Violation {
                        from: at,
                        to: at,
                        message,
                    });
                }
            }
            Event::Credit { admission, units } => {
                if let Some(key) = counted.get(&admission.0) {
                    let sum = sums.get_mut(key).expect("counted");
                    *sum = sum.saturating_sub(units);
                }
            }
            Event::Excess { units, window, .. } => {
                *sums.entry((epoch, window)).or_default() += units;
            }
            Event::Draw { .. } | Event::LooseCredit { .. } => {
                panic!("draws and loose credits need a rate bound: {e:?}")
            }
        }
    }
    Ok(format!(
        "every window ok: {} windows, the fullest at {fullest} of {limit}",
        sums.len()
    ))
}

/// The admissions (with what was credited of them) and excess of one
/// (epoch, window) among the first `last + 1` events.
fn window_events(history: &History, last: usize, of: (usize, u64)) -> Vec<String> {
    let credits = Credits::new(history);
    let mut epoch = 0;
    let mut seen = Vec::new();
    for (j, e) in history.events[..=last].iter().enumerate() {
        match *e {
            Event::Reset => epoch += 1,
            Event::Admission { at, units, window } if (epoch, window) == of => {
                let net = credits.net(j, units, last + 1);
                seen.push(if net == units {
                    format!("admitted@{at}:{units}")
                } else {
                    format!("admitted@{at}:{units}-{}", units - net)
                });
            }
            Event::Excess { at, units, window } if (epoch, window) == of => {
                seen.push(format!("excess@{at}:{units}"))
            }
            _ => {}
        }
    }
    seen
}
