//! Rate limiters: GCRA, token bucket, sliding window and fixed window, each
//! one Lua script and one round trip, decided by the Redis server's clock.
//!
//! Build a [`Limiter`] once from an [`Algorithm`] and a [`Quota`], then call
//! [`Limiter::check`] per request. Every algorithm answers with the same
//! [`RateLimit`]: allowed or not, how much is left, when to retry and when the
//! limiter is full again, in milliseconds. An admission also carries a
//! [`Charge`], the receipt that can give its units back ([`Charge::refund`]):
//! it names the limiter and key it was taken on, so a refund cannot be
//! pointed anywhere else, and it is neither `Copy` nor `Clone`; the server
//! keeps a record per charge, so copies of it (serialized, resent) never give
//! back more than it took. [`MultiLimiter`] checks several limits (10 per
//! second *and* 1000 per hour *and* a per-tenant limit) in one script call,
//! all or nothing. [`Limiter::headers`] renders the IETF `RateLimit-Policy`,
//! `RateLimit` and `Retry-After` header values. [`Check`] is
//! [`Limiter::check`] as a value: put many in a [`crate::Batch`] to check a
//! thousand keys in one round trip per server.
//!
//! | call | scripts | what it does |
//! |---|---|---|
//! | [`Limiter::check`] | `lua/rate/<algorithm>/check.lua` | take `cost` if it fits; a denial takes nothing; an admission carries a [`Charge`] |
//! | [`Limiter::peek`] | `lua/rate/<algorithm>/peek.lua` | what `check` would say; read-only (`EVALSHA_RO`) |
//! | [`Charge::refund`] | `lua/rate/<algorithm>/refund.lua` | give units of that charge back (work not done), at most its cost across every copy |
//! | [`Charge::settle`] | the same script | settle the charge at its real cost, once: give back the rest, or charge the excess into debt |
//! | [`Limiter::reset`] | `DEL` | forget the state: the limiter is full |
//! | [`Limiter::check_at_most`] | `lua/rate/{gcra,token_bucket}/check_at_most.lua` | take `min(max, available)`; GCRA and token bucket only |
//! | [`Limiter::until_ready`] | `check`, repeated | sleep the server's `retry_after` (with jitter) until admitted or a deadline |
//!
//! # Choosing an algorithm
//!
//! * [`Algorithm::Gcra`]: smooth rate with a burst; one integer per key. The
//!   default choice for "N per period" on request paths.
//! * [`Algorithm::TokenBucket`]: the same decisions as GCRA, stored as
//!   `"b<T>x<C>:<tokens>:<at>"`; pick it when you want to read tokens in Redis.
//! * [`Algorithm::SlidingWindow`]: "at most N in any window", approximated
//!   by weighting the previous window; what most API gateways do. Suits long
//!   windows (per hour, per day) where a burst of N at once is acceptable.
//! * [`Algorithm::FixedWindow`]: a counter that resets when its window
//!   expires; the cheapest, but up to 2N can pass across a window end.
//!
//! # Time
//!
//! Every decision is made inside the script with the server's clock
//! (`TIME`, microseconds) or the server's key expiry, never the caller's
//! clock, so skewed clients cannot let a burst through. Redis 7 replicates a
//! script's effects, not the script, so reading `TIME` in a writing script is
//! safe on replicas and in the AOF. A client that waits
//! [`RateLimit::retry_after`] and asks again is admitted, if nothing else
//! was admitted in between: `retry_after` is rounded up to the millisecond.
//!
//! # Reserve now, settle later
//!
//! A request whose cost is known only after the work (the tokens of a model
//! call, the bytes of an upload) is checked with an estimate; when the work
//! ends, its charge is settled at the real cost. Below the estimate, the
//! difference is given back under the rules of a refund (only what the
//! charge still holds of the limit). Above it, the excess is charged even
//! if it does not fit (the work already happened): the limit goes into
//! **debt**, checks are denied until the debt has drained, and their
//! `retry_after`, `reset_after`, `debt` and headers say so.
//!
//! * **Once.** A charge is settled once: the call takes it by value, and the
//!   server records the settlement under the charge's id, so a copy of the
//!   charge (serialized, or the same settlement resent after a lost reply)
//!   finds [`Settle::AlreadySettled`] and changes nothing. A settled charge
//!   can no longer be refunded either.
//! * **A deadline.** A reservation that is never settled (the process died)
//!   stays charged at its estimate. After its limiter's settle deadline
//!   ([`Limiter::settle_within`], default [`DEFAULT_SETTLE_WITHIN`] after
//!   the check), it counts as settled at its estimate: a late settlement is
//!   [`Settle::Expired`] and changes nothing, and a late refund gives
//!   nothing back.
//! * **A reset ends it.** [`Limiter::reset`] forgives every charge taken
//!   before it: their refunds give nothing back and their settlements are
//!   [`Settle::Expired`] (otherwise a refund would give back units that
//!   checks after the reset have used).
//! * **Bounded debt.** [`Limiter::with_debt_cap`] caps how far one
//!   settlement may push a limit past empty (default: no cap); the part of
//!   an excess beyond the cap is not charged and is reported as
//!   [`Settlement::uncharged`].
//!
//! How each algorithm holds a debt: GCRA and the token bucket push their
//! schedule past empty, so the debt drains at the limit's own rate (one
//! unit per emission interval). The fixed window counts above its limit
//! until the window ends, which forgets the debt. The sliding window counts
//! above its limit in the current window; in the next one that window
//! weighs as a full one (checks read a previous window as at most the
//! limit), so a debt beyond one window's worth is forgotten there.
//!
//! # Memory
//!
//! Every limiter key a script writes expires when the limiter would be full
//! again (a missing key *means* full), so idle limiters cost nothing. A
//! denied call writes nothing. A refunded or settled charge leaves one
//! small record beside its key (about 100 bytes), kept until the charge has
//! drained or until its deadline ([`Limiter::settle_within`], an hour by
//! default), whichever is later: a settlement of a copy of the charge must
//! still see what a refund gave back. A reset leaves a marker beside each
//! key (the time of the reset, about 60 bytes), kept as long as a charge
//! taken before could still act: until it drained (`burst × T` for GCRA and
//! the token bucket, one window for the fixed window, two for the sliding
//! one) or until the settle deadline, whichever is later.
//!
//! # Example: a request handler
//!
//! ```no_run
//! use std::sync::LazyLock;
//! use nolock::rate::{Algorithm, Limiter, Quota};
//!
//! static API: LazyLock<Limiter> = LazyLock::new(|| {
//!     let quota = Quota::per_second(10).and_then(|q| q.with_burst(20));
//!     quota.and_then(|q| Limiter::new(Algorithm::Gcra, q)).expect("a valid quota")
//! });
//!
//! # async fn handler(conn: &mut redis::aio::MultiplexedConnection, user: &str)
//! #     -> nolock::Result<()> {
//! let decision = API.check(conn, &format!("rl:{user}"), 1).await?;
//! let headers = API.headers(&decision);
//! // Copy into the response: RateLimit-Policy, RateLimit, and on 429 Retry-After.
//! for (name, value) in headers.iter() {
//!     println!("{name}: {value}");
//! }
//! if !decision.allowed {
//!     println!("429 Too Many Requests");
//!     return Ok(());
//! }
//! println!("200 OK, {} left", decision.remaining);
//! # Ok(()) }
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::script::{Invocation, Script};
use crate::{validate, Error, Result};

mod at_most;
mod calendar;
mod charge;
mod deny_cache;
mod fixed_window;
mod gcra;
pub mod headers;
mod limiter;
mod multi;
mod quota;
mod reservoir;
mod settle;
mod sliding_window;
mod state;
mod token_bucket;
mod wait;

pub use at_most::Partial;
pub(crate) use calendar::saw_server_time_in;
pub use calendar::{Period, Unit, Weekday, Zone};
pub use charge::{Charge, MultiCharge, MultiRefundCharge, RefundCharge, DEFAULT_SETTLE_WITHIN};
pub use headers::Headers;
pub(crate) use limiter::valid_name;
pub use limiter::{Check, Decision, Limiter};
pub use multi::{MultiCheck, MultiKey, MultiLimiter, MultiRateLimit};
pub use quota::{Quota, MAX_PERIOD};
pub use reservoir::{Draw, Reservoir, ReservoirStats};
pub use settle::{MultiSettleCharge, Settle, SettleCharge, Settlement};

/// How a limiter decides. All four take the same [`Quota`] and answer with the
/// same [`RateLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm: a smooth rate with a burst.
    ///
    /// **State**: one string per key, the *theoretical arrival time* TAT, in
    /// integer microseconds since the Unix epoch by the server clock: the
    /// instant at which the limiter is full again. Missing or past means
    /// full; the key expires at TAT.
    ///
    /// **Numbers**: with `T = period / rate` (the emission interval) and
    /// `b = burst`, a call of cost `c` at `now` fits when
    /// `max(TAT, now) - now + c × T <= b × T`, and then moves TAT to
    /// `max(TAT, now) + c × T`. The tolerance is `τ = (b - 1) × T`. For 10 per
    /// second with burst 20: T = 100 ms, τ = 1.9 s; a full limiter admits 20
    /// at once, then one every 100 ms, and an idle one is full 2 s after its
    /// last admission. In any span of `d`, at most `b + floor(d / T)` units
    /// pass.
    Gcra,

    /// Token bucket: `burst` tokens of capacity, one more every `T = period /
    /// rate`.
    ///
    /// **State**: a string per key, `"b<T>x<C>:<tokens>:<at>"`: its tag (see
    /// [`crate::guide::configuration`]), `tokens` (whole tokens in the bucket) and
    /// `at` (integer microseconds since the Unix epoch, server clock: refill
    /// is credited up to this instant; the part of an interval not yet worth a
    /// token is kept by not moving `at` past it). Missing means full; the key
    /// expires when the bucket is full again.
    ///
    /// Its decisions are exactly GCRA's for the same quota (`TAT = at +
    /// (burst - tokens) × T`); it stores two numbers instead of one. A hash
    /// `{tokens, at[, by]}` (the form before 2026-12-05) is read the same way
    /// and replaced at its next write.
    TokenBucket,

    /// Sliding window counter: at most `rate` per `period`, counted over the
    /// current window plus the previous one, weighted by how much of it is
    /// still inside the last `period`.
    ///
    /// **State**: a string per key, `"s<w>x<L>:<start>:<count>:<previous>"`:
    /// its tag, `start` (integer milliseconds since the Unix
    /// epoch, server clock: the start of the current window, a multiple of
    /// the period), `count` (units admitted in it) and `previous` (units
    /// admitted in the window before). The key expires at `start + 2 ×
    /// period`. A hash `{start, count, previous[, by]}` (the form before
    /// 2026-12-05) is read the same way and replaced at its next write.
    ///
    /// **Numbers**: with `e` milliseconds into the current window of length
    /// `w`, the estimate is `previous × (w - e) / w + count`, and a call of
    /// cost `c` fits when `estimate + c <= rate`. Exact integer arithmetic
    /// needs `rate × period in ms <= 2^53 - 1` (a day allows 10^8 per day).
    SlidingWindow,

    /// Fixed window: a counter that admits `rate` per window; the first
    /// admission opens the window `[now, now + period)`, whose end is the
    /// key's expiry.
    ///
    /// **State**: a string per key, the integer count of the current window;
    /// its expiry (`PEXPIRETIME`, ms since the Unix epoch) is the window's
    /// end, which the script compares with `TIME`. This is the bounded
    /// counter of [`crate::limits`], with several keys per call and the common
    /// result. Windows start at first use, so different users' windows do not
    /// all end at once; up to `2 × rate` can pass within one period across a
    /// window end.
    FixedWindow,

    /// Calendar quota: at most `limit` per calendar [`Period`] (a month in
    /// a customer's zone, a day from 06:00, a quarter), starting again at
    /// each period's end. Takes quotas built by [`Quota::calendar`], and
    /// quotas of a duration, which count in runs of that duration from the
    /// Unix epoch: `Quota::per_second(10)` is 10 per wall-clock second, the
    /// same instant everywhere (a window whose end every client knows).
    ///
    /// **Time**: the client computes the boundaries of three periods
    /// around its estimate of the server's clock, from the zone's rules
    /// (`rate::calendar`); the script counts in the one holding the
    /// server's `TIME`. A client whose clock is off by hours therefore
    /// counts in the period the server is in, never the next one early;
    /// when its estimate is off by more than a period, the server refuses,
    /// sends its time, and the call is built again once (the estimate is
    /// kept from every reply, so this happens at most on a process's first
    /// call after its clock jumped).
    ///
    /// **State**: a string per key, `"k<h>x<limit>:<count>"`, where `h` is
    /// a hash of the period's definition without its zone (the kind of
    /// period, not where it starts); its expiry is the period's end, so a
    /// month's key is gone when the month is. A stored period that has not
    /// ended is counted in even when a client computed another end (two
    /// processes with other zone data, or a customer whose zone changed):
    /// one period is never counted twice at once.
    ///
    /// **Answers**: [`RateLimit::period_end`] is the period's end;
    /// `retry_after` of a denial is the time left until it, and so is
    /// `reset_after` once anything was counted. Refunds give back only
    /// within the charge's period; a settlement's excess is charged to the
    /// current period (debt until it ends).
    ///
    /// Compared with a [`SlidingWindow`](Algorithm::SlidingWindow) of 30
    /// days: a calendar month resets everyone at once, on a date a customer
    /// can read on an invoice, and allows up to `2 × limit` across a
    /// period's end; a rolling window never resets at once and never
    /// allows more than about `limit` in any 30 days, but its "reset" is
    /// a moving estimate.
    Calendar,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Calendar,
    ];

    /// The algorithm's name, as in its script paths (`"gcra"`, `"token_bucket"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Calendar => "calendar",
        }
    }

    fn scripts(self) -> &'static Scripts3 {
        match self {
            Algorithm::Gcra => &gcra::SCRIPTS,
            Algorithm::TokenBucket => &token_bucket::SCRIPTS,
            Algorithm::SlidingWindow => &sliding_window::SCRIPTS,
            Algorithm::FixedWindow => &fixed_window::SCRIPTS,
            Algorithm::Calendar => &CALENDAR,
        }
    }

    /// The numbers each script takes per limit: two of its quota; a
    /// calendar's six (its tag number, its limit, and the boundaries of
    /// three periods around the server's time as best known now).
    fn params(self, quota: &Quota) -> Result<Params> {
        let two = |[a, b]: [u64; 2]| Params {
            len: 2,
            values: [a, b, 0, 0, 0, 0],
        };
        Ok(match self {
            Algorithm::Gcra => two(gcra::params(quota)),
            Algorithm::TokenBucket => two(token_bucket::params(quota)),
            Algorithm::SlidingWindow => two(sliding_window::params(quota)),
            Algorithm::FixedWindow => two(fixed_window::params(quota)),
            Algorithm::Calendar => {
                let period = calendar_of(quota)?;
                let [b0, b1, b2, b3] = period.candidates(calendar::server_now_ms())?;
                Params {
                    len: 6,
                    values: [period.tag_number(), quota.rate(), b0, b1, b2, b3],
                }
            }
        })
    }

    /// Checks what a [`Quota`] cannot check alone: whether this algorithm
    /// can honour it.
    fn accept(self, quota: &Quota) -> Result<()> {
        match self {
            Algorithm::Gcra | Algorithm::TokenBucket => Ok(()),
            Algorithm::SlidingWindow => sliding_window::accept(quota),
            Algorithm::FixedWindow => fixed_window::accept(quota),
            // A period is a window: its burst must be its rate. A quota of
            // a duration counts in runs of it from the epoch, in whole units.
            Algorithm::Calendar => {
                fixed_window::accept(quota).and_then(|()| calendar_of(quota).map(drop))
            }
        }
        .and_then(|()| match (self, quota.calendar_period()) {
            (Algorithm::Calendar, _) | (_, None) => Ok(()),
            (_, Some(period)) => Err(Error::InvalidArgument {
                what: "quota",
                reason: format!(
                    "a quota per calendar period ({period}) is for Algorithm::Calendar, not {self}"
                ),
            }),
        })
    }
}

/// The period an [`Algorithm::Calendar`] limit counts in: a calendar
/// quota's, or for a quota of a duration, runs of that duration from the
/// Unix epoch (wall-clock seconds for `Quota::per_second`).
fn calendar_of(quota: &Quota) -> Result<Period> {
    match quota.calendar_period() {
        Some(period) => Ok(period),
        None => Period::elapsed(quota.period_ms()),
    }
}

/// The scripts of [`Algorithm::Calendar`].
static CALENDAR: Scripts3 = Scripts3 {
    check: crate::script::embedded!("rate/calendar/check"),
    peek: crate::script::embedded!("rate/calendar/peek"),
    refund: crate::script::embedded!("rate/calendar/refund"),
};

/// The numbers a rate script takes for one limit (see [`Algorithm::params`]).
#[derive(Debug, Clone, Copy)]
struct Params {
    len: usize,
    values: [u64; 6],
}

impl Params {
    fn as_slice(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The three scripts of one algorithm.
#[derive(Debug)]
struct Scripts3 {
    check: Script,
    peek: Script,
    refund: Script,
}

/// What a rate limiter said, the same for every [`Algorithm`]: the
/// information of a decision, without the power to refund (that is the
/// [`Charge`] an admission carries beside it, in [`Decision`] and
/// [`MultiRateLimit`]).
///
/// Durations have millisecond precision and are rounded up, so waiting
/// exactly `retry_after` is enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a denied request must be turned away"]
#[non_exhaustive]
pub struct RateLimit {
    /// True when the request was admitted (its cost was taken). From
    /// [`Limiter::peek`]: true when it would be.
    pub allowed: bool,
    /// The most the limiter admits at once: the quota's burst (its rate, for
    /// the windows).
    pub limit: u64,
    /// How many units fit right now: a request of cost `remaining` or less
    /// would be admitted next, if nothing else arrives. For
    /// [`Limiter::check`] this is after the call's cost was taken; for
    /// [`Limiter::peek`], before.
    pub remaining: u64,
    /// How long until this same request would be admitted, if nothing else
    /// arrives. `None` when it was admitted.
    pub retry_after: Option<Duration>,
    /// How long until the limiter is full again (`remaining == limit`), if
    /// nothing else arrives. Zero when it is full.
    pub reset_after: Duration,
    /// When the decision was made, by the Redis server's clock (microsecond
    /// precision). Add `reset_after` to it for an absolute reset time that
    /// does not depend on the caller's clock.
    pub at: SystemTime,
    /// Units charged beyond empty: a settlement above its reservation
    /// ([`Charge::settle`]) may push a limit past what it admits, and checks
    /// are then denied until this debt has drained (`retry_after` and
    /// `reset_after` count it). 0 otherwise. GCRA and token bucket: the
    /// units until the limit is merely empty again; windows: the units
    /// counted above the limit in the current window.
    pub debt: u64,
    /// The end of the window or calendar period the decision counted in,
    /// by the server's clock: for [`Algorithm::Calendar`] always (the
    /// period's end, also when nothing was counted in it yet), for
    /// [`Algorithm::FixedWindow`] while a window is open; `None` otherwise.
    pub period_end: Option<SystemTime>,
}

impl RateLimit {
    /// The time left in the window or calendar period the decision counted
    /// in, from the decision, by the server's clock: [`RateLimit::period_end`]
    /// less [`RateLimit::at`], rounded up to the millisecond. `None` where
    /// there is no period.
    ///
    /// ```
    /// # fn check(d: nolock::rate::RateLimit) {
    /// if let Some(left) = d.time_left_in_period() {
    ///     println!("{} left for {left:?}", d.remaining);
    /// }
    /// # }
    /// ```
    pub fn time_left_in_period(&self) -> Option<Duration> {
        let left = self.period_end?.duration_since(self.at).unwrap_or_default();
        let ms = left.as_nanos().div_ceil(1_000_000);
        Some(Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)))
    }
}

/// What a refund gave back on one limit ([`Charge::refund`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refund may give back less than asked (the charge drained, or its window ended)"]
pub struct Refund {
    /// The units of the charge given back: at most the amount asked, and
    /// only what the charge still holds of the limit (0 once the charge has
    /// drained or its window ended). For GCRA and the token bucket a unit
    /// partly drained counts as given back.
    pub credited: u64,
    /// How many units fit right now, after the refund.
    pub remaining: u64,
}

/// Validates a cost against every limit: at least 1, at most each burst.
fn validate_cost(cost: u64, quotas: &[Quota]) -> Result<u64> {
    let cost = validate::positive("cost", cost)?;
    for quota in quotas {
        if cost > quota.burst() {
            return Err(Error::InsufficientCapacity {
                requested: cost,
                limit: quota.burst(),
            });
        }
    }
    Ok(cost)
}

/// The last argument of a call that adopts a state of other numbers of its
/// algorithm (`lua/lib/tag.lua`): sent by the handles of stored
/// configurations, whose numbers change only by a declared change.
const ADOPT: &str = "adopt";

/// `script KEYS... first (params)... [adopt]`: the layout every rate
/// script takes.
fn invocation(
    script: &'static Script,
    algorithm: Algorithm,
    keys: &[&str],
    quotas: &[Quota],
    first: u64,
    adopt: bool,
) -> Result<Invocation> {
    let mut call = Invocation::new(script, keys).arg(first);
    for quota in quotas {
        for value in algorithm.params(quota)?.as_slice() {
            call = call.arg(*value);
        }
    }
    if adopt {
        call = call.arg(ADOPT);
    }
    Ok(call)
}

/// The `check` (or `peek`) call for these limits. Keys must be validated.
fn decide_call(
    algorithm: Algorithm,
    peek: bool,
    keys: &[&str],
    quotas: &[Quota],
    cost: u64,
    adopt: bool,
) -> Result<Invocation> {
    let cost = validate_cost(cost, quotas)?;
    let scripts = algorithm.scripts();
    let script = if peek { &scripts.peek } else { &scripts.check };
    invocation(script, algorithm, keys, quotas, cost, adopt)
}

/// A decision on one or more limits, before charges are attached.
#[derive(Debug)]
struct Decided {
    allowed: bool,
    denied_by: Option<usize>,
    limits: Vec<RateLimit>,
}

impl Decided {
    fn at(&self) -> SystemTime {
        self.limits.first().map_or(UNIX_EPOCH, |l| l.at)
    }

    fn resets(&self) -> Vec<Duration> {
        self.limits.iter().map(|l| l.reset_after).collect()
    }
}

/// Decodes a check's or peek's `{admitted, now, raw state per limit}` into
/// one answer per limit ([`state`]), for `cost`.
fn decode_decision(
    script: &'static str,
    value: redis::Value,
    algorithm: Algorithm,
    quotas: &[Quota],
    cost: u64,
    peek: bool,
) -> Result<Decided> {
    let (allowed, _, limits) = state::decode(script, value, algorithm, quotas, cost, peek)?;
    let denied_by = limits.iter().position(|limit| !limit.allowed);
    if allowed != denied_by.is_none() {
        return Err(Error::UnexpectedReply {
            script,
            detail: format!("admitted = {allowed}, but limit {denied_by:?} did not fit"),
        });
    }
    Ok(Decided {
        allowed,
        denied_by,
        limits,
    })
}

static RESET: Script = crate::script::embedded!("rate/reset");

/// The key beside `key` that holds the server time of its latest reset
/// (`lua/rate/reset.lua`), read by every refund and settlement.
fn reset_marker(key: &str) -> String {
    crate::keys::derive(key, "reset")
}

impl Algorithm {
    /// How long after a reset a charge taken before it could still give
    /// units back, in milliseconds (at least 1): GCRA and the token bucket
    /// drain a charge within `burst × T`; a fixed window's charge counts in
    /// its window, a sliding window's in its window and the next.
    fn refund_horizon_ms(self, quota: &Quota) -> u64 {
        let ms = match self {
            Algorithm::Gcra | Algorithm::TokenBucket => quota
                .burst()
                .saturating_mul(quota.interval_us())
                .div_ceil(1000),
            // A calendar quota's period is its longest period.
            Algorithm::FixedWindow | Algorithm::Calendar => quota.period_ms(),
            Algorithm::SlidingWindow => quota.period_ms().saturating_mul(2),
        };
        ms.max(1)
    }
}

/// `lua/rate/reset.lua` on `keys` (one per quota): deletes every state (a
/// missing key is a full limiter, for every algorithm) and marks each key
/// reset now, so that no charge taken before can give anything back or
/// settle. A marker is kept while such a charge could still act: until it
/// drained ([`Algorithm::refund_horizon_ms`]) and, for the resetting
/// limiter's charges, until their settle deadline (`terms`).
async fn reset<C>(
    conn: &mut C,
    algorithm: Algorithm,
    quotas: &[Quota],
    terms: &charge::Terms,
    keys: &[&str],
) -> Result<()>
where
    C: ConnectionLike + Send,
{
    crate::script::run_one(&reset_call(algorithm, quotas, terms, keys), conn)
        .await
        .map(drop)
}

fn reset_call(
    algorithm: Algorithm,
    quotas: &[Quota],
    terms: &charge::Terms,
    keys: &[&str],
) -> ResetCall {
    let markers: Vec<String> = keys.iter().map(|k| reset_marker(k)).collect();
    let mut all: Vec<&str> = keys.to_vec();
    all.extend(markers.iter().map(String::as_str));
    let settle_ms = u64::try_from(terms.settle_within.as_millis()).unwrap_or(u64::MAX);
    let mut call = Invocation::new(&RESET, &all);
    for quota in quotas {
        call = call.arg(algorithm.refund_horizon_ms(quota).max(settle_ms));
    }
    ResetCall(call)
}

/// The reset script's call: its reply (the server time) is not needed.
#[derive(Debug)]
struct ResetCall(Invocation);

impl crate::script::Operation for ResetCall {
    type Output = ();

    fn invocation(&self) -> &Invocation {
        &self.0
    }

    fn decode(&self, reply: redis::Value) -> Result<()> {
        let mut reply = crate::script::Reply::new(self.0.script().name(), reply)?;
        let _now = reply.uint()?;
        reply.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, Int};

    fn q(rate: u64, ms: u64) -> Quota {
        Quota::per(rate, Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn a_reset_marks_each_key_for_as_long_as_its_charges_could_give_back() {
        let quotas = [q(10, 1000).with_burst(20).unwrap(), q(5, 60_000)];
        let keys = ["{t}:a", "{t}:b"];
        // Deadlines shorter than the drain: the drain decides.
        let terms = charge::Terms {
            settle_within: Duration::from_millis(1),
            ..charge::Terms::default()
        };
        let call = |alg: Algorithm| words(reset_call(alg, &quotas, &terms, &keys).0.command());
        let mut want = vec!["EVALSHA", RESET.sha1(), "4", "{t}:a", "{t}:b"];
        let (ma, mb) = (reset_marker("{t}:a"), reset_marker("{t}:b"));
        want.extend([ma.as_str(), mb.as_str()]);
        // GCRA and the token bucket: burst x T (20 x 100 ms, 5 x 12 s).
        for alg in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let mut w = want.clone();
            w.extend(["2000", "60000"]);
            assert_eq!(call(alg), w, "{alg}");
        }
        let windows = [q(10, 1000), q(5, 60_000)];
        let fixed = words(
            reset_call(Algorithm::FixedWindow, &windows, &terms, &keys)
                .0
                .command(),
        );
        let sliding = words(
            reset_call(Algorithm::SlidingWindow, &windows, &terms, &keys)
                .0
                .command(),
        );
        assert_eq!(fixed[7..], ["1000", "60000"]);
        assert_eq!(sliding[7..], ["2000", "120000"]);
        assert_eq!(ma, "{t}#5:{t}:a:reset");
        // The default deadline, an hour, outlasts these drains: the marker
        // stays until the limiter's charges could no longer settle.
        let default = charge::Terms::default();
        let hour = words(
            reset_call(Algorithm::Gcra, &quotas, &default, &keys)
                .0
                .command(),
        );
        assert_eq!(hour[7..], ["3600000", "3600000"]);
    }

    #[test]
    fn each_algorithm_sends_cost_then_two_numbers_per_limit() {
        let quotas = [q(10, 1000).with_burst(20).unwrap(), q(5, 60_000)];
        let expect = |alg: Algorithm, script: &Script, a: [&str; 4]| {
            let call = decide_call(alg, false, &["k1", "k2"], &quotas, 3, false).unwrap();
            let mut want = vec!["EVALSHA", script.sha1(), "2", "k1", "k2", "3"];
            want.extend(a);
            assert_eq!(words(call.command()), want, "{alg}");
        };
        expect(
            Algorithm::Gcra,
            &gcra::SCRIPTS.check,
            ["100000", "20", "12000000", "5"],
        );
        expect(
            Algorithm::TokenBucket,
            &token_bucket::SCRIPTS.check,
            ["100000", "20", "12000000", "5"],
        );
        expect(
            Algorithm::SlidingWindow,
            &sliding_window::SCRIPTS.check,
            ["1000", "10", "60000", "5"],
        );
        expect(
            Algorithm::FixedWindow,
            &fixed_window::SCRIPTS.check,
            ["1000", "10", "60000", "5"],
        );
        let peek = decide_call(Algorithm::Gcra, true, &["k"], &quotas[..1], 1, false).unwrap();
        assert_eq!(words(peek.command())[0], "EVALSHA_RO");
        assert_eq!(words(peek.command())[1], gcra::SCRIPTS.peek.sha1());
    }

    #[test]
    fn costs_are_checked_against_every_limit() {
        let quotas = [q(10, 1000), q(3, 1000)];
        assert!(matches!(
            decide_call(Algorithm::Gcra, false, &["a", "b"], &quotas, 0, false),
            Err(Error::ZeroLimit { what: "cost" })
        ));
        assert!(matches!(
            decide_call(Algorithm::Gcra, false, &["a", "b"], &quotas, 4, false),
            Err(Error::InsufficientCapacity {
                requested: 4,
                limit: 3
            })
        ));
    }

    #[test]
    fn decisions_decode_per_limit() {
        // GCRA, 10/s and 2/s, a denied cost of 1 at N: the first limit's TAT
        // is 300 ms ahead (7 fit), the second's a full second (none fits).
        const N: i64 = 1_700_000_000_123_456;
        let reply = Array(vec![Int(0), Int(N), Int(N + 300_000), Int(N + 1_000_000)]);
        let quotas = [q(10, 1000), q(2, 1000)];
        let d = decode_decision("t", reply, Algorithm::Gcra, &quotas, 1, false).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.denied_by, Some(1));
        let at = UNIX_EPOCH + Duration::from_micros(N as u64);
        assert_eq!(
            d.limits[0],
            RateLimit {
                allowed: true,
                limit: 10,
                remaining: 7,
                retry_after: None,
                reset_after: Duration::from_millis(300),
                at,
                debt: 0,
                period_end: None,
            }
        );
        assert_eq!(d.limits[1].retry_after, Some(Duration::from_millis(500)));
        assert_eq!(d.limits[1].reset_after, Duration::from_millis(1000));
    }

    #[test]
    fn inconsistent_replies_are_errors() {
        let gcra = |v: Vec<i64>| {
            let reply = Array(v.into_iter().map(Int).collect());
            decode_decision("t", reply, Algorithm::Gcra, &[q(1, 1000)], 1, false)
        };
        assert!(gcra(vec![0, 5, 5]).is_err(), "denied, yet it fits");
        assert!(gcra(vec![1, 5, 4]).is_err(), "a TAT behind now");
        assert!(gcra(vec![1, 5]).is_err(), "short");
        assert!(gcra(vec![1, 5, 1_000_005, 0]).is_err(), "long");
        assert!(gcra(vec![1, 5, 1_000_005]).unwrap().allowed);
    }
}
