//! From a script's raw state to the answer: every number of a [`RateLimit`]
//! computed here, in Rust, from what the check or peek script returned.
//!
//! The scripts decide and write; they return only the state that decided
//! (`{admitted, now, state per limit}`), since on a hot key the server's
//! single thread is the ceiling and the client has cycles to spare. The
//! formulas are the ones each script's header states, on the same integers
//! (microseconds, milliseconds), so the answers are exactly what the
//! scripts used to compute; `tests/rate_model.rs` holds them to a model
//! written apart from both.
//!
//! Per limit, by algorithm (see [`Algorithm`] for what is stored):
//!
//! | algorithm | state returned |
//! |---|---|
//! | GCRA | `tat`: TAT after the call, at least now (µs) |
//! | token bucket | `tokens`, `at`: after refill and charge |
//! | sliding window | `start` (ms), `count`, `previous`: rolled to now, clamped to the limit |
//! | fixed window | `count`, `end` (ms, 0 when there is no window) |

use std::time::{Duration, UNIX_EPOCH};

use super::{Algorithm, Quota, RateLimit};
use crate::script::Reply;
use crate::{Error, Result};

/// One limit's state as a script returned it, read from `reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
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

impl State {
    /// Reads one limit's fields of `algorithm` from `reply`.
    pub(super) fn read(algorithm: Algorithm, reply: &mut Reply) -> Result<State> {
        Ok(match algorithm {
            Algorithm::Gcra => State::Gcra { tat: reply.uint()? },
            Algorithm::TokenBucket => State::Bucket {
                tokens: reply.uint()?,
                at: reply.uint()?,
            },
            Algorithm::SlidingWindow => State::Sliding {
                start: reply.uint()?,
                count: reply.uint()?,
                previous: reply.uint()?,
            },
            // A calendar limit's state is a fixed window's: a count and the
            // end of the period it counts in.
            Algorithm::FixedWindow | Algorithm::Calendar => State::Fixed {
                count: reply.uint()?,
                end: reply.uint()?,
            },
        })
    }

    /// The answer for `cost` at server time `now` (µs): `applied` when the
    /// state already includes the call's cost (an admitted check), false
    /// for a denial or a peek. `None` when the state is not one the script
    /// can return (a reply to refuse).
    pub(super) fn answer(
        self,
        quota: &Quota,
        now: u64,
        cost: u64,
        applied: bool,
    ) -> Option<RateLimit> {
        let at = UNIX_EPOCH + Duration::from_micros(now);
        let ms = Duration::from_millis;
        let period_end = match self {
            State::Fixed { end, .. } if end > 0 => Some(UNIX_EPOCH + Duration::from_millis(end)),
            _ => None,
        };
        let (fits, remaining, retry, reset, debt) = match self {
            State::Gcra { tat } => {
                let (t, b) = (i128::from(quota.interval_us()), i128::from(quota.burst()));
                let (tat, now_, cost) = (i128::from(tat), i128::from(now), i128::from(cost));
                let ahead = tat - now_;
                // A stored TAT is at most now + 2^51 (a lowered burst may
                // leave it beyond b x T); never behind now.
                if !(0..=1 << 51).contains(&ahead) {
                    return None;
                }
                let before = if applied { ahead - cost * t } else { ahead };
                let fits = applied || before + cost * t <= b * t;
                let room = b * t - ahead;
                let remaining = if room > 0 { room / t } else { 0 };
                let retry = (!fits).then(|| ceil_ms(cost * t - room));
                let debt = if room < 0 { ceil_div(-room, t) } else { 0 };
                (fits, remaining, retry, ceil_ms(ahead), debt)
            }
            State::Bucket { tokens, at: from } => {
                let (t, cap) = (i128::from(quota.interval_us()), i128::from(quota.burst()));
                let (k, a, now_) = (i128::from(tokens), i128::from(from), i128::from(now));
                // `at` may be ahead of now after the clock stepped back.
                if k > cap {
                    return None;
                }
                let fits = applied || i128::from(cost) <= k;
                let retry = (!fits).then(|| ceil_ms(a + (i128::from(cost) - k) * t - now_));
                let full = a + (cap - k) * t - now_;
                let reset = if k < cap && full > 0 {
                    ceil_ms(full)
                } else {
                    0
                };
                // An empty bucket whose refill starts in the future is in debt.
                let debt = if k == 0 && a > now_ {
                    ceil_div(a - now_, t)
                } else {
                    0
                };
                (fits, k, retry, reset, debt)
            }
            State::Sliding {
                start,
                count,
                previous,
            } => {
                let (w, l) = (i128::from(quota.period_ms()), i128::from(quota.rate()));
                let (s, count, p) = (i128::from(start), i128::from(count), i128::from(previous));
                let (now_ms, cost) = (i128::from(now / 1000), i128::from(cost));
                if applied && count < cost {
                    return None;
                }
                // Counts above the limit (a lowered limit, or a debt) weigh
                // as the limit, as the scripts clamp them.
                let (c, p) = (count.min(l), p.min(l));
                let e = (now_ms - s).max(0).min(w);
                let before = if applied { c - cost } else { c };
                let fits =
                    applied || (before + cost <= l && p * (w - e) <= (l - before - cost) * w);
                let remaining = (l - c - ceil_div(p * (w - e), w)).max(0);
                let retry = (!fits).then(|| {
                    let x = l - c - cost;
                    let e1 = if x >= 0 && p > 0 { w - x * w / p } else { w };
                    if e1 < w {
                        e1 - e
                    } else if c == 0 {
                        w - e
                    } else {
                        w - e + (w - (l - cost) * w / c).max(0)
                    }
                });
                let reset = if c > 0 {
                    s + 2 * w - now_ms
                } else if p > 0 {
                    s + w - now_ms
                } else {
                    0
                };
                (fits, remaining, retry, reset.max(0), (count - l).max(0))
            }
            State::Fixed { count, end } => {
                let (l, c, e) = (i128::from(quota.rate()), i128::from(count), i128::from(end));
                let (now_ms, cost) = (i128::from(now / 1000), i128::from(cost));
                if (e != 0 && e <= now_ms) || (e == 0 && c != 0) {
                    return None;
                }
                let fits = applied || cost <= l - c;
                let retry = (!fits).then(|| e - now_ms);
                let reset = if e != 0 && c > 0 { e - now_ms } else { 0 };
                (fits, (l - c).max(0), retry, reset, (c - l).max(0))
            }
        };
        Some(RateLimit {
            allowed: fits,
            limit: quota.burst(),
            remaining: u64::try_from(remaining).ok()?,
            retry_after: match retry {
                Some(r) => Some(ms(u64::try_from(r).ok()?)),
                None => None,
            },
            reset_after: ms(u64::try_from(reset).ok()?),
            at,
            debt: u64::try_from(debt).ok()?,
            period_end,
        })
    }
}

/// Microseconds to milliseconds, rounded up (never below 0).
fn ceil_ms(us: i128) -> i128 {
    ceil_div(us.max(0), 1000)
}

fn ceil_div(a: i128, b: i128) -> i128 {
    (a + b - 1).div_euclid(b)
}

/// Reads `{admitted, now, state...}` of `algorithm` for `quotas` and
/// answers each limit for `cost`. `peek`: nothing was charged.
pub(super) fn decode(
    script: &'static str,
    value: redis::Value,
    algorithm: Algorithm,
    quotas: &[Quota],
    cost: u64,
    peek: bool,
) -> Result<(bool, u64, Vec<RateLimit>)> {
    let mut reply = Reply::new(script, value)?;
    let admitted = reply.flag()?;
    let now = reply.uint()?;
    if algorithm == Algorithm::Calendar {
        super::calendar::saw_server_time(now);
    }
    let applied = admitted && !peek;
    let mut limits = Vec::with_capacity(quotas.len());
    for quota in quotas {
        let state = State::read(algorithm, &mut reply)?;
        let answer =
            state
                .answer(quota, now, cost, applied)
                .ok_or_else(|| Error::UnexpectedReply {
                    script,
                    detail: format!("{state:?} at {now} for a cost of {cost}"),
                })?;
        limits.push(answer);
    }
    reply.finish()?;
    Ok((admitted, now, limits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(rate: u64, ms: u64, burst: u64) -> Quota {
        Quota::per(rate, Duration::from_millis(ms))
            .unwrap()
            .with_burst(burst)
            .unwrap()
    }

    const N: u64 = 1_700_000_000_000_000;

    /// The scripts' former per-limit answers, ported verbatim from their
    /// Lua (`gcra_answer`, the bucket's, the windows'), in f64 as Lua
    /// computed them: the raw-state answers must equal them.
    fn lua_gcra(
        tat: u64,
        now: u64,
        cost: u64,
        step: u64,
        b: u64,
        fits: bool,
    ) -> (bool, u64, i64, u64) {
        let (t, now, step, b, cost) = (tat as f64, now as f64, step as f64, b as f64, cost as f64);
        let room = b * step - (t - now);
        let remaining = if room > 0.0 {
            (room / step).floor()
        } else {
            0.0
        };
        let reset = ((t - now) / 1000.0).ceil() as u64;
        if fits {
            (true, remaining as u64, -1, reset)
        } else {
            (
                false,
                remaining as u64,
                ((cost * step - room) / 1000.0).ceil() as i64,
                reset,
            )
        }
    }

    fn lua_bucket(
        k: u64,
        a: u64,
        now: u64,
        cost: u64,
        step: u64,
        cap: u64,
        fits: bool,
    ) -> (bool, u64, i64, u64) {
        let (kf, af, nowf, stepf, capf, costf) = (
            k as f64,
            a as f64,
            now as f64,
            step as f64,
            cap as f64,
            cost as f64,
        );
        let retry = if fits {
            -1
        } else {
            ((af + (costf - kf) * stepf - nowf) / 1000.0).ceil() as i64
        };
        let mut reset = 0;
        if k < cap {
            let full = af + (capf - kf) * stepf - nowf;
            if full > 0.0 {
                reset = (full / 1000.0).ceil() as u64;
            }
        }
        (fits, k, retry, reset)
    }

    #[allow(clippy::too_many_arguments)] // the Lua's own locals, one by one
    fn lua_sliding(
        cur: u64,
        c: u64,
        p: u64,
        now_ms: u64,
        cost: u64,
        w: u64,
        l: u64,
        fits: bool,
    ) -> (bool, u64, i64, u64) {
        let (cur, c, p, now, cost, w, l) = (
            cur as i64,
            c as i64,
            p as i64,
            now_ms as i64,
            cost as i64,
            w as i64,
            l as i64,
        );
        let e = (now - cur).max(0);
        let remaining = (l - c - ((p * (w - e)) as f64 / w as f64).ceil() as i64).max(0);
        let mut retry = -1;
        if !fits {
            let x = l - c - cost;
            let mut e1 = w;
            if x >= 0 && p > 0 {
                e1 = w - ((x * w) as f64 / p as f64).floor() as i64;
            }
            retry = if e1 < w {
                e1 - e
            } else if c == 0 {
                w - e
            } else {
                let e2 = (w - (((l - cost) * w) as f64 / c as f64).floor() as i64).max(0);
                w - e + e2
            };
        }
        let reset = if c > 0 {
            cur + 2 * w - now
        } else if p > 0 {
            cur + w - now
        } else {
            0
        };
        (fits, remaining as u64, retry, reset as u64)
    }

    fn ours(d: &RateLimit) -> (bool, u64, i64, u64) {
        (
            d.allowed,
            d.remaining,
            d.retry_after.map_or(-1, |r| r.as_millis() as i64),
            d.reset_after.as_millis() as u64,
        )
    }

    proptest! {
        #[test]
        fn gcra_answers_as_the_script_did(
            rate in 1u64..50, ms in 1u64..5000, extra in 0u64..20,
            ahead_frac in 0u64..=1000, cost_frac in 1u64..=100, peek: bool,
        ) {
            let quota = q(rate, ms, rate + extra);
            let (t, b) = (quota.interval_us(), quota.burst());
            let cost = (b * cost_frac).div_ceil(100).max(1);
            let before = b * t * ahead_frac / 1000; // TAT - now, before the call
            let fits = before + cost * t <= b * t;
            let applied = fits && !peek;
            let tat = N + before + if applied { cost * t } else { 0 };
            let d = State::Gcra { tat }.answer(&quota, N, cost, applied).unwrap();
            prop_assert_eq!(ours(&d), lua_gcra(tat, N, cost, t, b, fits));
        }

        #[test]
        fn the_bucket_answers_as_the_script_did(
            rate in 1u64..50, ms in 1u64..5000, extra in 0u64..20,
            tokens_frac in 0u64..=100, since in 0u64..1_000_000, cost_frac in 1u64..=100, peek: bool,
        ) {
            let quota = q(rate, ms, rate + extra);
            let (t, cap) = (quota.interval_us(), quota.burst());
            let cost = (cap * cost_frac).div_ceil(100).max(1);
            let k = cap * tokens_frac / 100;
            // After refill, `at` is within one interval of now (or now when full).
            let a = if k == cap { N } else { N - since % t };
            let fits = cost <= k;
            let applied = fits && !peek;
            let k_after = if applied { k - cost } else { k };
            let d = State::Bucket { tokens: k_after, at: a }.answer(&quota, N, cost, applied).unwrap();
            prop_assert_eq!(ours(&d), lua_bucket(k_after, a, N, cost, t, cap, fits));
        }

        #[test]
        fn the_sliding_window_answers_as_the_script_did(
            rate in 1u64..50, ms in 1u64..5000, into in 0u64..5000,
            count_frac in 0u64..=100, previous_frac in 0u64..=100, cost_frac in 1u64..=100, peek: bool,
        ) {
            let quota = q(rate, ms, rate);
            let (w, l) = (quota.period_ms(), quota.rate());
            let now_ms = N / 1000;
            let cur = now_ms / w * w;
            let now_ms = cur + into % w;
            let now = now_ms * 1000 + 123;
            let (c, p) = (l * count_frac / 100, l * previous_frac / 100);
            let cost = (l * cost_frac).div_ceil(100).max(1);
            let e = now_ms - cur;
            let fits = c + cost <= l && p * (w - e) <= (l - c - cost) * w;
            let applied = fits && !peek;
            let c_after = if applied { c + cost } else { c };
            let d = State::Sliding { start: cur, count: c_after, previous: p }
                .answer(&quota, now, cost, applied)
                .unwrap();
            prop_assert_eq!(ours(&d), lua_sliding(cur, c_after, p, now_ms, cost, w, l, fits));
        }

        #[test]
        fn the_fixed_window_answers_as_the_script_did(
            rate in 1u64..50, ms in 1u64..5000, left in 1u64..5000,
            count_frac in 0u64..=100, cost_frac in 1u64..=100, peek: bool,
        ) {
            let quota = q(rate, ms, rate);
            let l = quota.rate();
            let now_ms = N / 1000;
            let c = l * count_frac / 100;
            let end = if c == 0 { 0 } else { now_ms + left };
            let cost = (l * cost_frac).div_ceil(100).max(1);
            let fits = cost <= l - c;
            let applied = fits && !peek;
            let (c_after, end_after) = match (applied, end) {
                (true, 0) => (cost, now_ms + quota.period_ms()),
                (true, e) => (c + cost, e),
                (false, e) => (c, e),
            };
            let d = State::Fixed { count: c_after, end: end_after }.answer(&quota, N, cost, applied).unwrap();
            let retry = if fits { -1 } else { (end_after - now_ms) as i64 };
            let reset = if end_after != 0 && c_after > 0 { end_after - now_ms } else { 0 };
            prop_assert_eq!(ours(&d), (fits, l.saturating_sub(c_after), retry, reset));
        }
    }

    #[test]
    fn states_no_script_returns_are_refused() {
        let quota = q(10, 1000, 10);
        assert!(State::Gcra { tat: N - 1 }
            .answer(&quota, N, 1, false)
            .is_none());
        assert!(State::Gcra { tat: N + (1 << 52) }
            .answer(&quota, N, 1, false)
            .is_none());
        // A TAT beyond the burst (the burst was lowered): denied, not refused.
        let far = State::Gcra { tat: N + 3_000_000 }
            .answer(&quota, N, 1, false)
            .unwrap();
        assert_eq!((far.allowed, far.remaining), (false, 0));
        assert_eq!(far.retry_after, Some(Duration::from_millis(2_100)));
        assert!(State::Bucket { tokens: 11, at: N }
            .answer(&quota, N, 1, false)
            .is_none());
        // An admission whose count is below its own cost.
        assert!(State::Sliding {
            start: N / 1000,
            count: 0,
            previous: 0
        }
        .answer(&quota, N, 1, true)
        .is_none());
        // Debt: 2 units past the limit of 10 in this window.
        let owed = State::Sliding {
            start: N / 1000,
            count: 12,
            previous: 0,
        }
        .answer(&quota, N, 1, false)
        .unwrap();
        assert_eq!((owed.allowed, owed.remaining, owed.debt), (false, 0, 2));
        assert_eq!(far.debt, 20, "3 s of a 1 s burst of 10: 20 units owed");
        let bucket = State::Bucket {
            tokens: 0,
            at: N + 250_000,
        }
        .answer(&quota, N, 1, false)
        .unwrap();
        assert_eq!(
            (bucket.debt, bucket.retry_after),
            (3, Some(Duration::from_millis(350)))
        );
        assert!(State::Fixed { count: 1, end: 0 }
            .answer(&quota, N, 1, false)
            .is_none());
        assert!(State::Fixed {
            count: 1,
            end: N / 1000
        }
        .answer(&quota, N, 1, false)
        .is_none());
    }
}
