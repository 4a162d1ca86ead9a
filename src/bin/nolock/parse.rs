//! The input of `nolock set`: durations, limits, and the [`Spec`] the
//! options describe, refused before connecting when it is not one.

use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;
use nolock::config::{Family, LimitSpec, Per, Spec};
use nolock::rate::Algorithm;

use super::{Failure, SetArgs};

/// One `--member-limit` or `--scope-limit`.
#[derive(Debug, Clone)]
pub(super) struct LimitArg {
    name: String,
    rate: u64,
    period: Duration,
    burst: Option<u64>,
}

pub(super) fn parse_family(s: &str) -> Result<Family, String> {
    s.parse::<Family>().map_err(|e| e.to_string())
}

pub(super) fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    let wanted = s.replace('-', "_");
    Algorithm::ALL
        .into_iter()
        .find(|a| a.name() == wanted)
        .ok_or_else(|| format!("{s:?}: one of gcra, token_bucket, sliding_window, fixed_window"))
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

/// `NAME=RATE/PERIOD[:BURST]`, e.g. `user=10/1s` or `tenant=1000/1m:2000`.
pub(super) fn parse_limit(s: &str) -> Result<LimitArg, String> {
    let bad = |why: &str| format!("{s:?}: {why} (NAME=RATE/PERIOD[:BURST], e.g. user=10/1s:20)");
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
        period: parse_duration(period)?,
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
        let given: [(&str, bool); 9] = [
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
            Family::RateLimit => &["--rate", "--per", "--burst"],
            Family::RateLimits => &["--member-limit", "--scope-limit"],
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
                Spec::RateLimit {
                    algorithm: self.algorithm,
                    rate,
                    period_ms: ms(self.per.ok_or_else(|| need("--per"))?),
                    burst: self.burst.unwrap_or(rate),
                }
            }
            Family::RateLimits => Spec::RateLimits {
                algorithm: self.algorithm,
                limits: self.limits_in_order(matches)?,
            },
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
        Ok(all
            .into_iter()
            .map(|(_, per, l)| LimitSpec {
                name: l.name.clone(),
                per,
                rate: l.rate,
                period_ms: ms(l.period),
                burst: l.burst.unwrap_or(l.rate),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(l.period, Duration::from_secs(1));
        assert_eq!(parse_limit("tenant=1000/1m").unwrap().burst, None);
        for bad in ["user", "user=10", "user=x/1s", "user=10/1s:x", "user=10/1x"] {
            assert!(parse_limit(bad).is_err(), "{bad:?}");
        }
    }
}
