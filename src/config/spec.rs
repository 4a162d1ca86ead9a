//! The numbers of a named handle and what is stored with them: [`Family`],
//! [`Spec`] (with [`LimitSpec`] and [`Per`]), [`Mode`], [`Change`] and the
//! stored [`Config`].

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::rate::{Algorithm, Period, Quota};
use crate::{Error, Result};

/// The kind of handle a configuration is for. A name is unique within a
/// family: a rate limit and a counter may both be called `api`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// [`client::RateLimit`](crate::client::RateLimit).
    RateLimit,
    /// [`client::RateLimits`](crate::client::RateLimits).
    RateLimits,
    /// [`client::Counter`](crate::client::Counter).
    Counter,
    /// [`client::Semaphore`](crate::client::Semaphore).
    Semaphore,
    /// [`client::Lock`](crate::client::Lock).
    Lock,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 5] = [
        Family::RateLimit,
        Family::RateLimits,
        Family::Counter,
        Family::Semaphore,
        Family::Lock,
    ];

    /// Its name in the registry and on the command line: `rate-limit`,
    /// `rate-limits`, `counter`, `semaphore`, `lock`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Family::RateLimit => "rate-limit",
            Family::RateLimits => "rate-limits",
            Family::Counter => "counter",
            Family::Semaphore => "semaphore",
            Family::Lock => "lock",
        }
    }

    /// Whether [`Change::Reset`] applies (rate limits and counters).
    pub const fn can_reset(self) -> bool {
        matches!(
            self,
            Family::RateLimit | Family::RateLimits | Family::Counter
        )
    }

    /// Whether [`Mode::Unlimited`] applies: every family but locks (a lock
    /// that lets everyone in is no lock).
    pub const fn can_unlimit(self) -> bool {
        !matches!(self, Family::Lock)
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Family {
    type Err = Error;

    fn from_str(s: &str) -> Result<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| Error::InvalidArgument {
                what: "family",
                reason: format!("{s:?}: one of rate-limit, rate-limits, counter, semaphore, lock"),
            })
    }
}

/// Whether a limit of a [`Spec::RateLimits`] is kept per member or per
/// scope (see [`client::Scope`](crate::client::Scope)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    /// One state per member of a scope (a user of a tenant).
    Member,
    /// One state per scope, shared by its members (a tenant).
    Scope,
}

/// One limit of a [`Spec::RateLimits`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSpec {
    /// The limit's name (the policy name of its headers).
    pub name: String,
    /// Per member or per scope.
    pub per: Per,
    /// Units per period.
    pub rate: u64,
    /// The period, in milliseconds.
    pub period_ms: u64,
    /// The burst.
    pub burst: u64,
    /// The calendar period of a limit of [`Algorithm::Calendar`] (a
    /// [`Quota::calendar`]); `None` for every other algorithm. Left out
    /// of the stored JSON when `None`, so configurations stored before
    /// calendar quotas read (and are written) as they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<Period>,
}

impl LimitSpec {
    /// A limit named `name`, kept `per` member or scope, admitting `quota`
    /// (its calendar period included).
    pub fn new(name: impl Into<String>, per: Per, quota: Quota) -> LimitSpec {
        LimitSpec {
            name: name.into(),
            per,
            rate: quota.rate(),
            period_ms: millis_of(quota.period()),
            burst: quota.burst(),
            calendar: quota.calendar_period(),
        }
    }

    /// The limit's quota: [`Quota::calendar`] when it has a calendar
    /// period, else [`Quota::per`] with its burst.
    ///
    /// # Errors
    ///
    /// Those of [`Quota::per`], [`Quota::with_burst`] and
    /// [`Quota::calendar`]; [`Error::InvalidArgument`] when a calendar
    /// limit's `period_ms` or `burst` is not what [`Quota::calendar`]
    /// computes.
    pub fn quota(&self) -> Result<Quota> {
        quota_of(self.rate, self.period_ms, self.burst, self.calendar)
    }
}

/// Milliseconds of a quota's period (below `MAX_PERIOD`, so it fits).
fn millis_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The quota of stored numbers. A calendar quota's `period_ms` and
/// `burst` are derived ([`Period::longest`] and the limit): they are
/// stored for readers that do not know calendars, and must agree.
fn quota_of(rate: u64, period_ms: u64, burst: u64, calendar: Option<Period>) -> Result<Quota> {
    let Some(period) = calendar else {
        return Quota::per(rate, Duration::from_millis(period_ms))?.with_burst(burst);
    };
    let quota = Quota::calendar(rate, period)?;
    let want = (millis_of(quota.period()), quota.burst());
    if (period_ms, burst) != want {
        return Err(Error::InvalidArgument {
            what: "spec",
            reason: format!(
                "{rate} per {period} has period_ms {} and burst {}, not {period_ms} and {burst}",
                want.0, want.1
            ),
        });
    }
    Ok(quota)
}

/// Refuses a calendar period without [`Algorithm::Calendar`]: the handle
/// would refuse it. The calendar algorithm without a period counts in runs
/// of the quota's period from the epoch (wall-clock seconds).
fn calendar_matches(algorithm: Algorithm, calendar: Option<&Period>, what: &str) -> Result<()> {
    match (algorithm, calendar) {
        (Algorithm::Calendar, _) | (_, None) => Ok(()),
        (other, Some(period)) => Err(Error::InvalidArgument {
            what: "spec",
            reason: format!(
                "{what} has a calendar period ({period}), which only algorithm calendar \
                 takes, not {other}"
            ),
        }),
    }
}

/// The numbers of one named handle, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Spec {
    /// A [`client::RateLimit`](crate::client::RateLimit).
    RateLimit {
        /// How it decides.
        algorithm: Algorithm,
        /// Units per period.
        rate: u64,
        /// The period, in milliseconds.
        period_ms: u64,
        /// The burst.
        burst: u64,
        /// The calendar period of [`Algorithm::Calendar`] (see
        /// [`LimitSpec::calendar`]); left out of the stored JSON when
        /// `None`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        calendar: Option<Period>,
    },
    /// A [`client::RateLimits`](crate::client::RateLimits).
    RateLimits {
        /// How every limit decides.
        algorithm: Algorithm,
        /// The limits, in order.
        limits: Vec<LimitSpec>,
    },
    /// A [`client::Counter`](crate::client::Counter).
    Counter {
        /// At most this many per window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// A [`client::Semaphore`](crate::client::Semaphore).
    Semaphore {
        /// Permits per id.
        permits: u64,
        /// A permit's time to live, in milliseconds.
        ttl_ms: u64,
    },
    /// A [`client::Lock`](crate::client::Lock).
    Lock {
        /// A lease's time to live, in milliseconds.
        ttl_ms: u64,
    },
}

impl Spec {
    /// A rate limit's numbers, a calendar quota's period included
    /// ([`Quota::calendar_period`]).
    ///
    /// ```
    /// use nolock::config::Spec;
    /// use nolock::rate::{Algorithm, Period, Quota};
    ///
    /// # fn main() -> nolock::Result<()> {
    /// let monthly = Spec::rate_limit(Algorithm::Calendar, Quota::calendar(10_000, Period::MONTH)?);
    /// assert_eq!(monthly.to_string(), "calendar 10000 per 1 month in UTC from 00:00");
    /// assert_eq!(monthly.quota()?.calendar_period(), Some(Period::MONTH));
    /// monthly.validate()?;
    /// # Ok(()) }
    /// ```
    pub fn rate_limit(algorithm: Algorithm, quota: Quota) -> Spec {
        Spec::RateLimit {
            algorithm,
            rate: quota.rate(),
            period_ms: millis_of(quota.period()),
            burst: quota.burst(),
            calendar: quota.calendar_period(),
        }
    }

    /// A counter's numbers (the window in whole milliseconds).
    pub fn counter(limit: u64, window: Duration) -> Spec {
        Spec::Counter {
            limit,
            window_ms: window.as_millis() as u64,
        }
    }

    /// A semaphore's numbers.
    pub fn semaphore(permits: u64, ttl: Duration) -> Spec {
        Spec::Semaphore {
            permits,
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    /// A lock's numbers.
    pub fn lock(ttl: Duration) -> Spec {
        Spec::Lock {
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    /// The family these numbers are for.
    pub fn family(&self) -> Family {
        match self {
            Spec::RateLimit { .. } => Family::RateLimit,
            Spec::RateLimits { .. } => Family::RateLimits,
            Spec::Counter { .. } => Family::Counter,
            Spec::Semaphore { .. } => Family::Semaphore,
            Spec::Lock { .. } => Family::Lock,
        }
    }

    /// A rate limit's quota.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for another family; those of
    /// [`LimitSpec::quota`].
    pub fn quota(&self) -> Result<Quota> {
        match self {
            Spec::RateLimit {
                rate,
                period_ms,
                burst,
                calendar,
                ..
            } => quota_of(*rate, *period_ms, *burst, *calendar),
            other => Err(Error::InvalidArgument {
                what: "spec",
                reason: format!("a {} has no quota", other.family()),
            }),
        }
    }

    /// Checks the numbers as the handle would, before anything is written.
    ///
    /// # Errors
    ///
    /// Those of the handle's constructor ([`Quota::per`], [`Limiter::new`]
    /// for a window algorithm whose burst differs from its rate,
    /// [`crate::limits::Counter::new`], [`crate::semaphore::Semaphore::new`],
    /// [`crate::fence::Lock::new`]); [`Error::InvalidArgument`] for a
    /// multi-limit without limits or with two limits of one name, for
    /// [`Algorithm::Calendar`] without a calendar period, and for a
    /// calendar period with another algorithm.
    ///
    /// [`Limiter::new`]: crate::rate::Limiter::new
    pub fn validate(&self) -> Result<()> {
        match self {
            Spec::RateLimit {
                algorithm,
                calendar,
                ..
            } => {
                calendar_matches(*algorithm, calendar.as_ref(), "a rate limit")?;
                crate::rate::Limiter::new(*algorithm, self.quota()?)?;
            }
            Spec::RateLimits { algorithm, limits } => {
                if limits.is_empty() {
                    return Err(Error::InvalidArgument {
                        what: "spec",
                        reason: "rate limits need at least one limit".into(),
                    });
                }
                // The multi-limiter checks each name and refuses a repeated one.
                let mut multi = crate::rate::MultiLimiter::new(*algorithm);
                for limit in limits {
                    let what = format!("the limit {:?}", limit.name);
                    calendar_matches(*algorithm, limit.calendar.as_ref(), &what)?;
                    multi = multi.shared_limit(&limit.name, limit.quota()?)?;
                }
            }
            Spec::Counter { limit, window_ms } => {
                crate::limits::Counter::new(*limit, Duration::from_millis(*window_ms))?;
            }
            Spec::Semaphore { permits, ttl_ms } => {
                crate::semaphore::Semaphore::new(*permits, Duration::from_millis(*ttl_ms))?;
            }
            Spec::Lock { ttl_ms } => {
                crate::fence::Lock::new(Duration::from_millis(*ttl_ms))?;
            }
        }
        Ok(())
    }
}

pub(super) fn millis(ms: u64) -> String {
    let d = Duration::from_millis(ms);
    match ms {
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}min", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{d:?}"),
    }
}

/// `gcra 100/1min burst 100`, `calendar 10000 per 1 month in Europe/Berlin
/// from 00:00` (a calendar limit's burst is its limit, so it is not
/// shown), `counter 100/1min`, `semaphore 3 ttl 30s`, `lock ttl 10s`.
impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::RateLimit {
                algorithm,
                rate,
                calendar: Some(period),
                ..
            } => write!(f, "{algorithm} {rate} per {period}"),
            Spec::RateLimit {
                algorithm,
                rate,
                period_ms,
                burst,
                calendar: None,
            } => write!(f, "{algorithm} {rate}/{} burst {burst}", millis(*period_ms)),
            Spec::RateLimits { algorithm, limits } => {
                write!(f, "{algorithm}")?;
                for (i, l) in limits.iter().enumerate() {
                    let sep = if i == 0 { " " } else { ", " };
                    let per = match l.per {
                        Per::Member => "member",
                        Per::Scope => "scope",
                    };
                    match &l.calendar {
                        Some(period) => {
                            write!(f, "{sep}{} per {per} {} per {period}", l.name, l.rate)?
                        }
                        None => write!(
                            f,
                            "{sep}{} per {per} {}/{} burst {}",
                            l.name,
                            l.rate,
                            millis(l.period_ms),
                            l.burst
                        )?,
                    }
                }
                Ok(())
            }
            Spec::Counter { limit, window_ms } => {
                write!(f, "counter {limit}/{}", millis(*window_ms))
            }
            Spec::Semaphore { permits, ttl_ms } => {
                write!(f, "semaphore {permits} ttl {}", millis(*ttl_ms))
            }
            Spec::Lock { ttl_ms } => write!(f, "lock ttl {}", millis(*ttl_ms)),
        }
    }
}

/// A switch an operator sets per name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Decided by the numbers.
    #[default]
    Normal,
    /// Everything is refused, without a call to Redis: a rate limit or a
    /// counter answers [`Rejection::Limited`](crate::client::Rejection)
    /// with no `retry_after`; a semaphore or a lock answers
    /// [`Error::Blocked`].
    Blocked,
    /// Everything is admitted, without a call to Redis, and counted in the
    /// metric `nolock_unlimited_total` (rate limits, counters and
    /// semaphores; never a lock).
    Unlimited,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Normal => "normal",
            Mode::Blocked => "blocked",
            Mode::Unlimited => "unlimited",
        })
    }
}

/// What [`Configs::set`](super::Configs::set) does to the state every id already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Keep it, and decide it by the new numbers (see the module docs for
    /// what that means per algorithm).
    Keep,
    /// Start every id afresh (rate limits and counters only).
    Reset,
}

/// One named configuration, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    /// Its family.
    pub family: Family,
    /// Its name.
    pub name: String,
    /// Its numbers.
    pub spec: Spec,
    /// Its switch.
    pub mode: Mode,
    /// How many times it was reset ([`Change::Reset`]); part of every key
    /// when above 0.
    pub generation: u64,
    /// The registry epoch of its latest change.
    pub epoch: u64,
    /// When it was last changed, milliseconds since the Unix epoch by the
    /// server's clock.
    pub changed_at_ms: u64,
}

impl Config {
    /// When it was last changed, by the server's clock.
    pub fn changed_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.changed_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_read_as_an_operator_writes_them() {
        let quota = Quota::per_minute(100).unwrap();
        assert_eq!(
            Spec::rate_limit(Algorithm::Gcra, quota).to_string(),
            "gcra 100/1min burst 100"
        );
        assert_eq!(
            Spec::semaphore(3, Duration::from_secs(30)).to_string(),
            "semaphore 3 ttl 30s"
        );
        assert_eq!(
            Spec::lock(Duration::from_millis(1500)).to_string(),
            "lock ttl 1.5s"
        );
        let day = Period::DAY.days_start_at(6, 0).unwrap();
        let daily = Spec::rate_limit(Algorithm::Calendar, Quota::calendar(500, day).unwrap());
        assert_eq!(
            daily.to_string(),
            "calendar 500 per 1 day in UTC from 06:00"
        );
        daily.validate().unwrap();
        let Spec::RateLimit {
            rate,
            period_ms,
            burst,
            ..
        } = daily
        else {
            unreachable!()
        };
        // Stored as Quota::calendar computes them; anything else is refused.
        assert_eq!((rate, burst), (500, 500));
        assert_eq!(period_ms, day.longest().as_millis() as u64);
        assert!(quota_of(500, period_ms + 1, 500, Some(day)).is_err());
        assert!(quota_of(500, period_ms, 499, Some(day)).is_err());
        assert!(Spec::counter(0, Duration::from_secs(1)).validate().is_err());
        assert!(Spec::RateLimits {
            algorithm: Algorithm::Gcra,
            limits: vec![]
        }
        .validate()
        .is_err());
        assert_eq!("semaphore".parse::<Family>().unwrap(), Family::Semaphore);
        assert!("semaphores".parse::<Family>().is_err());
    }
}
