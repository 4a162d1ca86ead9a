//! The input of `nolock set`: durations, limits, calendar periods, and
//! the [`Spec`] the options describe, refused before connecting when it is
//! not one.

use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;
use nolock::config::{Family, LimitSpec, Per, Spec};
use nolock::rate::{Algorithm, Period, Quota, Unit, Weekday, Zone};

use super::{Failure, SetArgs};

/// One `--member-limit` or `--scope-limit`.
#[derive(Debug, Clone)]
pub(super) struct LimitArg {
    name: String,
    rate: u64,
    period: LimitPeriod,
    burst: Option<u64>,
}

/// The period of a `--member-limit` or `--scope-limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LimitPeriod {
    /// A duration (`1s`, `1m`): a rolling period.
    Rolling(Duration),
    /// `[N]UNIT` with a unit's full name (`second`, `3months`): a calendar
    /// period.
    Calendar(u32, Unit),
}

/// `--day-start HH:MM`: an hour and a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DayStart(u8, u8);

pub(super) fn parse_family(s: &str) -> Result<Family, String> {
    s.parse::<Family>().map_err(|e| e.to_string())
}

pub(super) fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    let wanted = s.replace('-', "_");
    Algorithm::ALL
        .into_iter()
        .find(|a| a.name() == wanted)
        .ok_or_else(|| {
            format!("{s:?}: one of gcra, token_bucket, sliding_window, fixed_window, calendar")
        })
}

/// `second`, `minute`, `hour`, `day`, `week`, `month` or `year` (or the plural).
pub(super) fn parse_unit(s: &str) -> Result<Unit, String> {
    s.parse::<Unit>().map_err(|e| e.to_string())
}

/// `UTC`, an offset (`+05:30`), an IANA name (`Europe/Berlin`) or a POSIX TZ rule.
pub(super) fn parse_zone(s: &str) -> Result<Zone, String> {
    Zone::parse(s).map_err(|e| e.to_string())
}

/// `monday` .. `sunday` (or `mon` .. `sun`).
pub(super) fn parse_weekday(s: &str) -> Result<Weekday, String> {
    s.parse::<Weekday>().map_err(|e| e.to_string())
}

/// `HH:MM`, from `00:00` to `23:59`.
pub(super) fn parse_day_start(s: &str) -> Result<DayStart, String> {
    let bad = || format!("{s:?}: a time of day is HH:MM, from 00:00 to 23:59");
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    let two = |p: &str| -> Option<u8> {
        (p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit())).then(|| p.parse().ok())?
    };
    match (two(h), two(m)) {
        (Some(h), Some(m)) if h < 24 && m < 60 => Ok(DayStart(h, m)),
        _ => Err(bad()),
    }
}

/// `[N]UNIT` with a unit's full name (`month`, `3months`, `1second`):
/// `None` when the text after the digits is no unit (a duration, then).
fn parse_calendar(s: &str) -> Option<Result<(u32, Unit), String>> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, word) = s.split_at(digits);
    let unit = word.parse::<Unit>().ok()?;
    if number.is_empty() {
        return Some(Ok((1, unit)));
    }
    Some(
        number
            .parse::<u32>()
            .map(|n| (n, unit))
            .map_err(|_| format!("{s:?}: too many {unit}s")),
    )
}

/// `500ms`, `10s`, `1m` or `1min`, `1h`, `1d`: a whole number and a unit.
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let bad = || format!("{s:?}: a duration is a whole number and a unit (500ms, 10s, 1m, 1h, 1d)");
    let n: u64 = number.parse().map_err(|_| bad())?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?}: too long"))
}

/// `NAME=RATE/PERIOD[:BURST]`, e.g. `user=10/1s` or `tenant=1000/1m:2000`;
/// or with a calendar period, `NAME=RATE/[N]UNIT`, e.g. `user=10/second`
/// or `tenant=100000/month` (no burst: a calendar limit's burst is its rate).
pub(super) fn parse_limit(s: &str) -> Result<LimitArg, String> {
    let bad = |why: &str| {
        format!(
            "{s:?}: {why} (NAME=RATE/PERIOD[:BURST], e.g. user=10/1s:20, \
             or NAME=RATE/[N]UNIT for a calendar period, e.g. tenant=100000/month)"
        )
    };
    let (name, rest) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
    let (rate, rest) = rest.split_once('/').ok_or_else(|| bad("no '/'"))?;
    let (period, burst) = match rest.split_once(':') {
        Some((period, burst)) => (period, Some(burst)),
        None => (rest, None),
    };
    Ok(LimitArg {
        name: name.to_owned(),
        rate: rate
            .parse()
            .map_err(|_| bad("the rate is not a whole number"))?,
        period: match parse_calendar(period) {
            Some(calendar) => {
                if burst.is_some() {
                    return Err(bad("a calendar limit has no burst: it is its rate"));
                }
                let (every, unit) = calendar?;
                LimitPeriod::Calendar(every, unit)
            }
            None => LimitPeriod::Rolling(parse_duration(period).map_err(|e| {
                format!("{e}; or a calendar unit: second, minute, hour, day, week, month, year")
            })?),
        },
        burst: burst
            .map(|b| {
                b.parse()
                    .map_err(|_| bad("the burst is not a whole number"))
            })
            .transpose()?,
    })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl SetArgs {
    /// The spec these options describe, refusing options of another family.
    pub(super) fn spec(&self, matches: Option<&ArgMatches>) -> Result<Spec, Failure> {
        let family = self.family;
        let given: [(&str, bool); 14] = [
            ("--calendar", self.calendar.is_some()),
            ("--every", self.every.is_some()),
            ("--zone", self.zone.is_some()),
            ("--day-start", self.day_start.is_some()),
            ("--week-start", self.week_start.is_some()),
            ("--rate", self.rate.is_some()),
            ("--per", self.per.is_some()),
            ("--burst", self.burst.is_some()),
            ("--member-limit", !self.member_limit.is_empty()),
            ("--scope-limit", !self.scope_limit.is_empty()),
            ("--limit", self.limit.is_some()),
            ("--window", self.window.is_some()),
            ("--permits", self.permits.is_some()),
            ("--ttl", self.ttl.is_some()),
        ];
        let allowed: &[&str] = match family {
            Family::RateLimit => &[
                "--rate",
                "--per",
                "--burst",
                "--calendar",
                "--every",
                "--zone",
                "--day-start",
                "--week-start",
            ],
            Family::RateLimits => &[
                "--member-limit",
                "--scope-limit",
                "--zone",
                "--day-start",
                "--week-start",
            ],
            Family::Counter => &["--limit", "--window"],
            Family::Semaphore => &["--permits", "--ttl"],
            Family::Lock => &["--ttl"],
        };
        let algorithm_given = matches
            .and_then(|m| m.value_source("algorithm"))
            .is_some_and(|source| source == ValueSource::CommandLine);
        if algorithm_given && !matches!(family, Family::RateLimit | Family::RateLimits) {
            return Err(Failure::usage(format!(
                "--algorithm does not apply to a {family} (it takes {})",
                allowed.join(", ")
            )));
        }
        if let Some((option, _)) = given
            .iter()
            .find(|(option, set)| *set && !allowed.contains(option))
        {
            return Err(Failure::usage(format!(
                "{option} does not apply to a {family} (it takes {})",
                allowed.join(", ")
            )));
        }
        let need = |option: &str| Failure::usage(format!("a {family} needs {option}"));
        let spec = match family {
            Family::RateLimit => {
                let rate = self.rate.ok_or_else(|| need("--rate"))?;
                match self.calendar {
                    Some(unit) => {
                        if let Some((option, _)) = given
                            .iter()
                            .find(|(o, set)| *set && matches!(*o, "--per" | "--burst"))
                        {
                            return Err(Failure::usage(format!(
                                "{option} does not apply to a calendar period: \
                                 the limit is --rate per --calendar period"
                            )));
                        }
                        let period = self.period(unit, self.every.unwrap_or(1))?;
                        self.zone_options_apply(&[period])?;
                        let algorithm = if algorithm_given {
                            self.algorithm
                        } else {
                            Algorithm::Calendar
                        };
                        Spec::rate_limit(algorithm, Quota::calendar(rate, period)?)
                    }
                    None => {
                        let calendar_only = ["--every", "--zone", "--day-start", "--week-start"];
                        if let Some((option, _)) = given
                            .iter()
                            .find(|(o, set)| *set && calendar_only.contains(o))
                        {
                            return Err(Failure::usage(format!(
                                "{option} needs --calendar UNIT \
                                 (second, minute, hour, day, week, month or year)"
                            )));
                        }
                        if self.algorithm == Algorithm::Calendar {
                            return Err(need("--calendar UNIT with --algorithm calendar"));
                        }
                        Spec::RateLimit {
                            algorithm: self.algorithm,
                            rate,
                            period_ms: ms(self.per.ok_or_else(|| need("--per"))?),
                            burst: self.burst.unwrap_or(rate),
                            calendar: None,
                        }
                    }
                }
            }
            Family::RateLimits => {
                let limits = self.limits_in_order(matches)?;
                let calendars: Vec<Period> = limits.iter().filter_map(|l| l.calendar).collect();
                self.zone_options_apply(&calendars)?;
                // Calendar periods are for the calendar algorithm: chosen
                // when they are written and no algorithm is.
                let algorithm = if !algorithm_given && !calendars.is_empty() {
                    Algorithm::Calendar
                } else {
                    self.algorithm
                };
                Spec::RateLimits { algorithm, limits }
            }
            Family::Counter => Spec::Counter {
                limit: self.limit.ok_or_else(|| need("--limit"))?,
                window_ms: ms(self.window.ok_or_else(|| need("--window"))?),
            },
            Family::Semaphore => Spec::Semaphore {
                permits: self.permits.ok_or_else(|| need("--permits"))?,
                ttl_ms: ms(self.ttl.ok_or_else(|| need("--ttl"))?),
            },
            Family::Lock => Spec::Lock {
                ttl_ms: ms(self.ttl.ok_or_else(|| need("--ttl"))?),
            },
        };
        // Checked as the handle checks it, before connecting.
        spec.validate()?;
        Ok(spec)
    }

    /// `every` `unit`s, on the wall clock of `--zone`, from `--day-start`
    /// and (weeks) `--week-start`.
    fn period(&self, unit: Unit, every: u32) -> Result<Period, Failure> {
        let mut period = Period::new(unit, every)?;
        if let Some(zone) = self.zone {
            period = period.in_zone(zone);
        }
        if let Some(day) = self.week_start {
            period = period.weeks_start_on(day);
        }
        if let Some(DayStart(hour, minute)) = self.day_start {
            period = period.days_start_at(hour, minute)?;
        }
        Ok(period)
    }

    /// Refuses `--zone`, `--day-start` and `--week-start` when no period
    /// takes them (seconds, minutes and hours count elapsed time; only
    /// weeks have a first day), rather than ignoring them.
    fn zone_options_apply(&self, periods: &[Period]) -> Result<(), Failure> {
        let calendar_days = periods
            .iter()
            .any(|p| !matches!(p.unit(), Unit::Second | Unit::Minute | Unit::Hour));
        let weeks = periods.iter().any(|p| p.unit() == Unit::Week);
        let refused = [
            ("--zone", self.zone.is_some(), calendar_days),
            ("--day-start", self.day_start.is_some(), calendar_days),
            ("--week-start", self.week_start.is_some(), weeks),
        ];
        if let Some((option, ..)) = refused.iter().find(|(_, set, takes)| *set && !takes) {
            let takes = if *option == "--week-start" {
                "weeks"
            } else {
                "days, weeks, months and years (seconds, minutes and hours count elapsed time)"
            };
            return Err(Failure::usage(format!(
                "{option} applies to calendar periods of {takes}"
            )));
        }
        Ok(())
    }

    /// The limits in the order given on the command line: handles compare
    /// the stored limits with their own in order.
    fn limits_in_order(&self, matches: Option<&ArgMatches>) -> Result<Vec<LimitSpec>, Failure> {
        let indices = |id: &str, n: usize| -> Vec<usize> {
            matches
                .and_then(|m| m.indices_of(id))
                .map(|i| i.collect())
                .unwrap_or_else(|| (0..n).collect())
        };
        let mut all: Vec<(usize, Per, &LimitArg)> = Vec::new();
        for (per, id, limits) in [
            (Per::Member, "member_limit", &self.member_limit),
            (Per::Scope, "scope_limit", &self.scope_limit),
        ] {
            let at = indices(id, limits.len());
            all.extend(limits.iter().enumerate().map(|(i, l)| {
                // Without indices, members first, then scopes.
                let place = at.get(i).copied().unwrap_or(i);
                (place, per, l)
            }));
        }
        if all.is_empty() {
            return Err(Failure::usage(
                "rate-limits need --member-limit or --scope-limit (NAME=RATE/PERIOD[:BURST])",
            ));
        }
        all.sort_by_key(|(place, per, _)| (*place, *per == Per::Scope));
        all.into_iter()
            .map(|(_, per, l)| {
                Ok(match l.period {
                    LimitPeriod::Rolling(period) => LimitSpec {
                        name: l.name.clone(),
                        per,
                        rate: l.rate,
                        period_ms: ms(period),
                        burst: l.burst.unwrap_or(l.rate),
                        calendar: None,
                    },
                    LimitPeriod::Calendar(every, unit) => {
                        let period = self.period(unit, every)?;
                        LimitSpec::new(l.name.as_str(), per, Quota::calendar(l.rate, period)?)
                    }
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_start_at_a_time_of_day() {
        assert_eq!(parse_day_start("06:00"), Ok(DayStart(6, 0)));
        assert_eq!(parse_day_start("23:59"), Ok(DayStart(23, 59)));
        for bad in ["24:00", "6:00", "06:60", "0600", "", "06:00:00"] {
            assert!(parse_day_start(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_take_a_whole_number_and_a_unit() {
        let ok = [
            ("500ms", 500),
            ("10s", 10_000),
            ("1m", 60_000),
            ("1min", 60_000),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            ("0s", 0),
        ];
        for (text, ms) in ok {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for bad in [
            "",
            "10",
            "s",
            "1.5s",
            "-1s",
            "10 s",
            "10S",
            "1w",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_duration("18446744073709551615d").is_err());
    }

    #[test]
    fn limits_parse_with_an_optional_burst() {
        let l = parse_limit("user=10/1s:20").unwrap();
        assert_eq!((l.name.as_str(), l.rate, l.burst), ("user", 10, Some(20)));
        assert_eq!(l.period, LimitPeriod::Rolling(Duration::from_secs(1)));
        assert_eq!(parse_limit("tenant=1000/1m").unwrap().burst, None);
        let calendar = [
            ("user=10/second", 1, Unit::Second),
            ("t=100000/month", 1, Unit::Month),
            ("q=5000/3months", 3, Unit::Month),
        ];
        for (text, every, unit) in calendar {
            let l = parse_limit(text).unwrap();
            assert_eq!(l.period, LimitPeriod::Calendar(every, unit), "{text}");
        }
        for bad in [
            "user",
            "user=10",
            "user=x/1s",
            "user=10/1s:x",
            "user=10/1x",
            "user=10/month:20",
            "user=10/fortnight",
            "user=10/99999999999months",
        ] {
            assert!(parse_limit(bad).is_err(), "{bad:?}");
        }
    }
}
