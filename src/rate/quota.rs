//! [`Quota`]: how much a limiter admits, checked once when it is built.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Period;
use crate::{validate, Error, Result};

/// The longest period, and the longest burst refill time, a [`Quota`] accepts:
/// 2^51 µs, about 71 years.
///
/// The scripts keep instants as integer microseconds since the Unix epoch in
/// Lua numbers, which are doubles and exact up to 2^53. "Now plus the time to
/// refill a whole burst" stays below that bound until about the year 2200.
pub const MAX_PERIOD: Duration = Duration::from_micros(1 << 51);

/// A rate (`rate` units per `period`) and a burst (the most admitted at once).
///
/// Every [`Algorithm`](super::Algorithm) reads the same quota:
///
/// * **GCRA and token bucket**: one unit comes back every *emission interval*
///   `T = period / rate`; a full limiter admits `burst` units back to back.
///   The burst defaults to the rate ("10 per second" admits 10 at once, then
///   one every 100 ms); [`Quota::with_burst`] changes it.
/// * **Sliding and fixed windows**: at most `rate` units per window of
///   `period`. Windows have no separate burst, so
///   [`Limiter::new`](super::Limiter::new) rejects a quota whose burst differs
///   from its rate for them.
///
/// # Precision
///
/// Rounding never lets more through than asked. The emission interval is
/// computed from the period in microseconds (a sub-microsecond rest counts as
/// a whole one) and kept in whole microseconds, **rounded up**: it is exact
/// whenever `rate` divides the period in microseconds (10 per second is
/// exactly 100 000 µs), and otherwise makes the limiter stricter by less than
/// 1 µs per unit (3 per second admits one unit every 333 334 µs; 1000 per
/// 1.999 ms, one every 2 µs). The windows count in whole milliseconds, so
/// their length is also **rounded up** (1000 per 1.999 ms becomes 1000 per
/// 2 ms, never 1000 per 1 ms). A period under 1 ms is rejected, and so is a
/// rate above one unit per microsecond of period, rather than silently slowed
/// down: count in coarser units.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use nolock::rate::Quota;
///
/// # fn main() -> nolock::Result<()> {
/// let q = Quota::per_second(10)?.with_burst(20)?;
/// assert_eq!(q.emission_interval(), Duration::from_millis(100));
/// assert_eq!(q.fill_time(), Duration::from_secs(2)); // empty to full
///
/// assert!(Quota::per_second(0).is_err());
/// assert!(Quota::per(10, Duration::ZERO).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "QuotaParts", into = "QuotaParts")]
pub struct Quota {
    rate: u64,
    period_ms: u64,
    burst: u64,
    /// `ceil(period / rate)` in microseconds, at least 1.
    interval_us: u64,
    /// The calendar period of a [`Quota::calendar`].
    calendar: Option<Period>,
}

impl Quota {
    /// `rate` units per `period`, with a burst equal to the rate.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`rate` 0), [`Error::OutOfRange`] (`rate` above
    /// 2^53 - 1, or above one per microsecond of `period`),
    /// [`Error::ZeroDuration`] (`period` under 1 ms),
    /// [`Error::DurationTooLong`] (`period` above [`MAX_PERIOD`]).
    pub fn per(rate: u64, period: Duration) -> Result<Quota> {
        let rate = validate::positive("rate", rate)?;
        if period > MAX_PERIOD {
            return Err(Error::DurationTooLong {
                what: "period",
                given: period,
                max: MAX_PERIOD,
            });
        }
        validate::millis("period", period)?; // at least 1 ms
                                             // Rounded up: a shorter period would admit more. Below MAX_PERIOD, so
                                             // the cast cannot truncate.
        let period_us = period.as_nanos().div_ceil(1000) as u64;
        if rate > period_us {
            return Err(Error::OutOfRange {
                what: "rate (at most one unit per microsecond of the period)",
                given: rate,
                max: period_us,
            });
        }
        Quota {
            rate,
            period_ms: period_us.div_ceil(1000),
            burst: rate,
            interval_us: period_us.div_ceil(rate),
            calendar: None,
        }
        .checked()
    }

    /// `rate` units per second. See [`Quota::per`].
    ///
    /// # Errors
    ///
    /// As [`Quota::per`].
    pub fn per_second(rate: u64) -> Result<Quota> {
        Quota::per(rate, Duration::from_secs(1))
    }

    /// `rate` units per minute. See [`Quota::per`].
    ///
    /// # Errors
    ///
    /// As [`Quota::per`].
    pub fn per_minute(rate: u64) -> Result<Quota> {
        Quota::per(rate, Duration::from_secs(60))
    }

    /// `rate` units per hour. See [`Quota::per`].
    ///
    /// # Errors
    ///
    /// As [`Quota::per`].
    pub fn per_hour(rate: u64) -> Result<Quota> {
        Quota::per(rate, Duration::from_secs(3600))
    }

    /// `limit` units per calendar [`Period`]: a month, a day in a customer's
    /// zone, a quarter, or "per second" as wall-clock seconds. For
    /// [`Algorithm::Calendar`](super::Algorithm::Calendar) only, which counts
    /// up to `limit` per period and starts again at the period's end.
    ///
    /// The quota's [`period`](Quota::period) is [`Period::longest`] (the
    /// `w` of its `RateLimit-Policy` header); its burst is the limit.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`limit` 0), [`Error::OutOfRange`] (above
    /// 2^53 - 1, or above one unit per microsecond of the period).
    ///
    /// # Example
    ///
    /// ```
    /// use nolock::rate::{Period, Quota, Zone};
    ///
    /// # fn main() -> nolock::Result<()> {
    /// let monthly = Quota::calendar(10_000, Period::MONTH.in_zone(Zone::fixed(3600)?))?;
    /// assert_eq!(monthly.rate(), 10_000);
    /// assert!(monthly.calendar_period().is_some());
    /// assert!(Quota::calendar(0, Period::DAY).is_err());
    /// # Ok(()) }
    /// ```
    pub fn calendar(limit: u64, period: Period) -> Result<Quota> {
        let quota = Quota::per(limit, period.longest())?;
        Ok(Quota {
            calendar: Some(period),
            ..quota
        })
    }

    /// The calendar period of a [`Quota::calendar`]; `None` for every other
    /// quota.
    pub const fn calendar_period(&self) -> Option<Period> {
        self.calendar
    }

    /// The same rate with another burst: the most a full limiter admits at
    /// once (GCRA and token bucket only).
    ///
    /// In GCRA terms the tolerance is `τ = (burst - 1) × T`: a call may arrive
    /// up to τ ahead of its theoretical schedule.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] (`burst` 0), [`Error::OutOfRange`] (above 2^53 - 1),
    /// [`Error::DurationTooLong`] when refilling the whole burst would take
    /// longer than [`MAX_PERIOD`].
    pub fn with_burst(self, burst: u64) -> Result<Quota> {
        let burst = validate::positive("burst", burst)?;
        Quota { burst, ..self }.checked()
    }

    fn checked(self) -> Result<Quota> {
        let fill = u128::from(self.burst) * u128::from(self.interval_us);
        if fill > MAX_PERIOD.as_micros() {
            return Err(Error::DurationTooLong {
                what: "burst refill time (burst × period / rate)",
                given: Duration::from_micros(u64::try_from(fill).unwrap_or(u64::MAX)),
                max: MAX_PERIOD,
            });
        }
        Ok(self)
    }

    /// `rate` units per `period` with `burst`, checked like [`Quota::per`]
    /// and [`Quota::with_burst`] but in a `const` context, where a bad
    /// number is a compile error instead of a run-time one. [`quota!`]
    /// expands to it inside `const { }`; call it directly only where a
    /// panic is what you want.
    ///
    /// # Panics
    ///
    /// When [`Quota::per`] or [`Quota::with_burst`] would answer an error
    /// (at compile time, in a `const` context).
    ///
    /// [`quota!`]: crate::quota!
    pub const fn new_const(rate: u64, period: Duration, burst: u64) -> Quota {
        assert!(rate > 0, "a quota's rate must be at least 1");
        assert!(burst > 0, "a quota's burst must be at least 1");
        assert!(
            rate <= validate::MAX_INTEGER && burst <= validate::MAX_INTEGER,
            "a quota's rate and burst are at most 2^53 - 1"
        );
        let max_us = MAX_PERIOD.as_micros();
        let nanos = period.as_nanos();
        assert!(nanos >= 1_000_000, "a quota's period is at least 1 ms");
        assert!(
            nanos <= max_us * 1000,
            "a quota's period is at most MAX_PERIOD"
        );
        // At most 2^51, so the cast cannot truncate.
        let period_us = nanos.div_ceil(1000) as u64;
        assert!(
            rate <= period_us,
            "a quota's rate is at most one unit per microsecond of its period"
        );
        let interval_us = period_us.div_ceil(rate);
        assert!(
            (burst as u128) * (interval_us as u128) <= max_us,
            "refilling a quota's burst must take at most MAX_PERIOD"
        );
        Quota {
            rate,
            period_ms: period_us.div_ceil(1000),
            burst,
            interval_us,
            calendar: None,
        }
    }

    /// Units per period.
    pub const fn rate(&self) -> u64 {
        self.rate
    }

    /// The period as the windows count it: in whole milliseconds, rounded up.
    pub const fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    /// The most admitted at once (the limit reported in every
    /// [`RateLimit`](super::RateLimit)).
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// `T`: how long one unit takes to come back, `period / rate` rounded up
    /// to the microsecond.
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_micros(self.interval_us)
    }

    /// `burst × T`: how long an empty GCRA limiter or token bucket takes to be
    /// full again. For the windows, this is the period.
    pub const fn fill_time(&self) -> Duration {
        // Bounded by MAX_PERIOD when the quota was built.
        Duration::from_micros(self.burst * self.interval_us)
    }

    pub(super) const fn interval_us(&self) -> u64 {
        self.interval_us
    }

    pub(super) const fn period_ms(&self) -> u64 {
        self.period_ms
    }
}

/// A [`Quota`] as serde sees it: its four numbers, checked on the way in.
#[derive(Serialize, Deserialize)]
struct QuotaParts {
    rate: u64,
    period_ms: u64,
    burst: u64,
    interval_us: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    calendar: Option<Period>,
}

impl From<Quota> for QuotaParts {
    fn from(q: Quota) -> Self {
        QuotaParts {
            rate: q.rate,
            period_ms: q.period_ms,
            burst: q.burst,
            interval_us: q.interval_us,
            calendar: q.calendar,
        }
    }
}

impl TryFrom<QuotaParts> for Quota {
    type Error = Error;

    /// Only what [`Quota::per`] and [`Quota::with_burst`] can build: some
    /// period in microseconds rounds to both the interval and the window.
    fn try_from(p: QuotaParts) -> Result<Quota> {
        if let Some(period) = p.calendar {
            let quota = Quota::calendar(p.rate, period)?;
            if (quota.period_ms, quota.burst, quota.interval_us)
                != (p.period_ms, p.burst, p.interval_us)
            {
                return Err(Error::InvalidArgument {
                    what: "quota",
                    reason: format!(
                        "{} per {period} is not the quota Quota::calendar builds",
                        p.rate
                    ),
                });
            }
            return Ok(quota);
        }
        let rate = validate::positive("rate", p.rate)?;
        validate::positive("burst", p.burst)?;
        // period_us in (interval - 1) × rate + 1 ..= interval × rate, and in
        // (period_ms - 1) × 1000 + 1 ..= period_ms × 1000.
        let by_interval = (
            u128::from(p.interval_us.saturating_sub(1)) * u128::from(rate) + 1,
            u128::from(p.interval_us) * u128::from(rate),
        );
        let by_window = (
            u128::from(p.period_ms.saturating_sub(1)) * 1000 + 1,
            u128::from(p.period_ms) * 1000,
        );
        let low = by_interval.0.max(by_window.0).max(1000);
        let high = by_interval.1.min(by_window.1).min(MAX_PERIOD.as_micros());
        if p.interval_us == 0 || low > high {
            return Err(Error::InvalidArgument {
                what: "quota",
                reason: format!(
                    "{} per {} ms with an interval of {} µs is no quota Quota::per builds",
                    p.rate, p.period_ms, p.interval_us
                ),
            });
        }
        Quota {
            rate,
            period_ms: p.period_ms,
            burst: p.burst,
            interval_us: p.interval_us,
            calendar: None,
        }
        .checked()
    }
}

/// A [`Quota`] from literals, checked at compile time: it cannot fail at run
/// time, so it needs no `?`.
///
/// `quota!(RATE per second)`, `per minute`, `per hour`, `per day`, or
/// `per DURATION_EXPR` (a `const` `Duration`), optionally followed by
/// `, burst N`. A zero rate, a zero burst or a period under 1 ms does not
/// compile.
///
/// ```
/// use std::time::Duration;
/// use nolock::{quota, rate::Quota};
///
/// const PER_USER: Quota = quota!(100 per minute);
/// assert_eq!(PER_USER, Quota::per_minute(100).unwrap());
/// let bursty = quota!(10 per second, burst 20);
/// assert_eq!(bursty, Quota::per_second(10).unwrap().with_burst(20).unwrap());
/// let odd = quota!(3 per Duration::from_millis(1500));
/// assert_eq!(odd.rate(), 3);
/// ```
///
/// ```compile_fail
/// let never = nolock::quota!(0 per second); // a zero rate does not compile
/// ```
#[macro_export]
macro_rules! quota {
    ($rate:literal per second $(, burst $burst:literal)?) => {
        $crate::quota!(@build $rate, ::std::time::Duration::from_secs(1) $(, $burst)?)
    };
    ($rate:literal per minute $(, burst $burst:literal)?) => {
        $crate::quota!(@build $rate, ::std::time::Duration::from_secs(60) $(, $burst)?)
    };
    ($rate:literal per hour $(, burst $burst:literal)?) => {
        $crate::quota!(@build $rate, ::std::time::Duration::from_secs(3600) $(, $burst)?)
    };
    ($rate:literal per day $(, burst $burst:literal)?) => {
        $crate::quota!(@build $rate, ::std::time::Duration::from_secs(86_400) $(, $burst)?)
    };
    ($rate:literal per $period:expr $(, burst $burst:literal)?) => {
        $crate::quota!(@build $rate, $period $(, $burst)?)
    };
    (@build $rate:literal, $period:expr) => {
        const { $crate::rate::Quota::new_const($rate, $period, $rate) }
    };
    (@build $rate:literal, $period:expr, $burst:literal) => {
        const { $crate::rate::Quota::new_const($rate, $period, $burst) }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_const_constructor_agrees_with_the_checked_one() {
        let periods = [
            Duration::from_millis(1),
            Duration::from_micros(1999),
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_millis(1500),
            Duration::from_secs(86_400),
        ];
        for period in periods {
            for rate in [1, 3, 7, 10, 100, 1000] {
                for burst in [1, rate, 2 * rate + 1] {
                    let checked = Quota::per(rate, period).and_then(|q| q.with_burst(burst));
                    match checked {
                        Ok(q) => assert_eq!(Quota::new_const(rate, period, burst), q),
                        Err(_) => {
                            let panicked =
                                std::panic::catch_unwind(|| Quota::new_const(rate, period, burst));
                            assert!(panicked.is_err(), "{rate} per {period:?}, burst {burst}");
                        }
                    }
                }
            }
        }
        for (rate, period, burst) in [
            (0, Duration::from_secs(1), 1),
            (1, Duration::from_secs(1), 0),
            (1, Duration::from_micros(999), 1),
            (1, MAX_PERIOD + Duration::from_micros(1), 1),
        ] {
            assert!(std::panic::catch_unwind(|| Quota::new_const(rate, period, burst)).is_err());
        }
        assert_eq!(
            crate::quota!(100 per minute),
            Quota::per_minute(100).unwrap()
        );
        assert_eq!(
            crate::quota!(5 per day).period(),
            Duration::from_secs(86_400)
        );
    }

    #[test]
    fn intervals_are_exact_or_rounded_up() {
        let q = Quota::per_second(10).unwrap();
        assert_eq!((q.rate(), q.burst(), q.interval_us()), (10, 10, 100_000));
        assert_eq!(Quota::per_second(3).unwrap().interval_us(), 333_334);
        let q = Quota::per(1_000, Duration::from_millis(1)).unwrap();
        assert_eq!(q.interval_us(), 1);
        assert_eq!(q.period(), Duration::from_millis(1));
    }

    #[test]
    fn rounding_is_never_permissive() {
        // 1000 per 1.999 ms once became 1000 per 1 ms (twice the rate).
        let q = Quota::per(1_000, Duration::from_micros(1_999)).unwrap();
        assert_eq!(q.interval_us(), 2, "1.999 µs rounds up");
        assert_eq!(q.period(), Duration::from_millis(2), "the window rounds up");
        assert_eq!(q.period_ms(), 2);
        // A sub-microsecond rest counts as a whole microsecond.
        let q = Quota::per(1, Duration::from_nanos(1_000_001)).unwrap();
        assert_eq!((q.interval_us(), q.period_ms()), (1_001, 2));
        let q = Quota::per(3, Duration::from_nanos(2_000_001)).unwrap();
        assert_eq!(q.interval_us(), 667);
        // Exact periods stay exact.
        let q = Quota::per(7, Duration::from_millis(7)).unwrap();
        assert_eq!((q.interval_us(), q.period_ms()), (1_000, 7));
        // For every period and rate: never more than `rate` per period.
        for period_ns in [1_000_000u64, 1_000_001, 1_999_999, 2_500_000, 999_999_999] {
            for rate in [1u64, 2, 3, 7, 999, 1_000] {
                let period = Duration::from_nanos(period_ns);
                let q = Quota::per(rate, period).unwrap();
                assert!(
                    u128::from(rate) * u128::from(q.interval_us()) * 1000 >= u128::from(period_ns)
                );
                assert!(q.period() >= period, "{period:?} {rate}");
            }
        }
    }

    #[test]
    fn bad_quotas_are_rejected_by_name() {
        let s = Duration::from_secs(1);
        assert!(matches!(
            Quota::per(0, s),
            Err(Error::ZeroLimit { what: "rate" })
        ));
        assert!(matches!(
            Quota::per(1, Duration::from_micros(900)),
            Err(Error::ZeroDuration { what: "period" })
        ));
        assert!(matches!(
            Quota::per(1, MAX_PERIOD + Duration::from_millis(1)),
            Err(Error::DurationTooLong { what: "period", .. })
        ));
        assert!(matches!(
            Quota::per(1_001, Duration::from_millis(1)),
            Err(Error::OutOfRange {
                given: 1_001,
                max: 1_000,
                ..
            })
        ));
        assert!(matches!(
            Quota::per(u64::MAX, s),
            Err(Error::OutOfRange { what: "rate", .. })
        ));
        let q = Quota::per_second(10).unwrap();
        assert!(matches!(
            q.with_burst(0),
            Err(Error::ZeroLimit { what: "burst" })
        ));
        // 2^40 units, one every 100 ms: more than 71 years to refill.
        assert!(matches!(
            q.with_burst(1 << 40),
            Err(Error::DurationTooLong { .. })
        ));
        assert!(q.with_burst(1 << 20).is_ok());
    }

    #[test]
    fn quotas_round_trip_through_serde_and_forged_ones_are_refused() {
        for q in [
            Quota::per_second(10).unwrap().with_burst(20).unwrap(),
            Quota::per(3, Duration::from_micros(1_000_500)).unwrap(),
            Quota::per(1_000, Duration::from_micros(1_999)).unwrap(),
            Quota::per(1, MAX_PERIOD).unwrap(),
        ] {
            let json = serde_json::to_string(&q).unwrap();
            assert_eq!(serde_json::from_str::<Quota>(&json).unwrap(), q, "{json}");
        }
        for forged in [
            r#"{"rate":10,"period_ms":1000,"burst":10,"interval_us":1}"#,
            r#"{"rate":0,"period_ms":1000,"burst":10,"interval_us":100000}"#,
            r#"{"rate":10,"period_ms":1000,"burst":0,"interval_us":100000}"#,
            r#"{"rate":10,"period_ms":0,"burst":10,"interval_us":0}"#,
        ] {
            assert!(serde_json::from_str::<Quota>(forged).is_err(), "{forged}");
        }
    }

    #[test]
    fn fill_time_is_burst_intervals() {
        let q = Quota::per_minute(60).unwrap().with_burst(5).unwrap();
        assert_eq!(q.emission_interval(), Duration::from_secs(1));
        assert_eq!(q.fill_time(), Duration::from_secs(5));
        assert!(Quota::per(1, MAX_PERIOD).is_ok());
    }
}
