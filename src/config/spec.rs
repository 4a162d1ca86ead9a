//! The numbers of a named handle and what is stored with them: [`Family`],
//! [`Spec`] (with [`LimitSpec`] and [`Per`]), [`Mode`], [`Change`] and the
//! stored [`Config`].

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::rate::{Algorithm, Quota};
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
}

impl LimitSpec {
    /// The limit's quota.
    ///
    /// # Errors
    ///
    /// Those of [`Quota::per`] and [`Quota::with_burst`].
    pub fn quota(&self) -> Result<Quota> {
        Quota::per(self.rate, Duration::from_millis(self.period_ms))?.with_burst(self.burst)
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
    /// A rate limit's numbers.
    pub fn rate_limit(algorithm: Algorithm, quota: Quota) -> Spec {
        Spec::RateLimit {
            algorithm,
            rate: quota.rate(),
            period_ms: quota.period().as_millis() as u64,
            burst: quota.burst(),
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
    /// [`Quota::per`] and [`Quota::with_burst`].
    pub fn quota(&self) -> Result<Quota> {
        match self {
            Spec::RateLimit {
                rate,
                period_ms,
                burst,
                ..
            } => Quota::per(*rate, Duration::from_millis(*period_ms))?.with_burst(*burst),
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
    /// multi-limit without limits or with two limits of one name.
    ///
    /// [`Limiter::new`]: crate::rate::Limiter::new
    pub fn validate(&self) -> Result<()> {
        match self {
            Spec::RateLimit { algorithm, .. } => {
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

/// `gcra 100/1min burst 100`, `counter 100/1min`, `semaphore 3 ttl 30s`,
/// `lock ttl 10s`.
impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::RateLimit {
                algorithm,
                rate,
                period_ms,
                burst,
            } => write!(f, "{algorithm} {rate}/{} burst {burst}", millis(*period_ms)),
            Spec::RateLimits { algorithm, limits } => {
                write!(f, "{algorithm}")?;
                for (i, l) in limits.iter().enumerate() {
                    let sep = if i == 0 { " " } else { ", " };
                    let per = match l.per {
                        Per::Member => "member",
                        Per::Scope => "scope",
                    };
                    write!(
                        f,
                        "{sep}{} per {per} {}/{} burst {}",
                        l.name,
                        l.rate,
                        millis(l.period_ms),
                        l.burst
                    )?;
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
