//! HTTP header values for rate-limit decisions, per the IETF draft
//! *RateLimit header fields for HTTP* (draft-ietf-httpapi-ratelimit-headers,
//! revisions 08 to 11), plus `Retry-After` (RFC 9110).
//!
//! Pure functions over a limiter and its answer, with no web framework
//! dependency: copy the strings into your response.
//!
//! * `RateLimit-Policy: "name";q=Q;w=W`: the quota. `q` is the most admitted
//!   at once (the quota's burst; its rate for the windows) and `w` the seconds
//!   it takes to earn `q` back, `burst × period / rate` (the period, for the
//!   windows), rounded up. The draft has no sub-second windows: 10 per 100 ms
//!   is advertised as `q=10;w=1`, a slower rate than the real one, so clients
//!   that follow it stay inside the limit.
//! * `RateLimit: "name";r=R;t=T`: the service limit now. `r` is
//!   [`RateLimit::remaining`]. `t` is the effective window in whole seconds,
//!   rounded up: after a denial, [`RateLimit::retry_after`] (the request is
//!   refused for that long, and `Retry-After` then names the same moment, as
//!   the draft asks); otherwise [`RateLimit::reset_after`], when the limiter is
//!   full again, or for a calendar quota the time left in its period
//!   ([`RateLimit::period_end`]): the quota starts again then, however
//!   little was used.
//! * `Retry-After: S`: only after a denial; [`RateLimit::retry_after`] in
//!   whole seconds, rounded up, so a client that honours it is admitted.
//!
//! Several limits ([`MultiLimiter::headers`](super::MultiLimiter::headers))
//! are listed in one field, separated by `", "`, as structured-field lists
//! are serialized (RFC 8941).

use std::time::Duration;

use super::{Quota, RateLimit};

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: &str = "RateLimit-Policy";
/// `RateLimit`.
pub const RATELIMIT: &str = "RateLimit";
/// `Retry-After`.
pub const RETRY_AFTER: &str = "Retry-After";

/// The header values for one decision, ready to copy into a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Headers {
    /// The `RateLimit-Policy` value, e.g. `"default";q=100;w=60`.
    pub policy: String,
    /// The `RateLimit` value, e.g. `"default";r=50;t=30`.
    pub rate_limit: String,
    /// The `Retry-After` value in seconds, e.g. `30`; `None` when the request
    /// was admitted.
    pub retry_after: Option<String>,
}

impl Headers {
    /// `(name, value)` for every header to send, in the order
    /// `RateLimit-Policy`, `RateLimit`, `Retry-After` (when set).
    ///
    /// ```
    /// use nolock::rate::Headers;
    ///
    /// let h = Headers {
    ///     policy: r#""default";q=10;w=1"#.into(),
    ///     rate_limit: r#""default";r=0;t=1"#.into(),
    ///     retry_after: Some("1".into()),
    /// };
    /// let names: Vec<_> = h.iter().map(|(name, _)| name).collect();
    /// assert_eq!(names, ["RateLimit-Policy", "RateLimit", "Retry-After"]);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            Some((RATELIMIT_POLICY, self.policy.as_str())),
            Some((RATELIMIT, self.rate_limit.as_str())),
            self.retry_after.as_deref().map(|v| (RETRY_AFTER, v)),
        ]
        .into_iter()
        .flatten()
    }
}

/// Whole seconds, rounded up: the `delay-seconds` of `Retry-After` and the
/// draft's `t` and `w` parameters.
///
/// ```
/// use std::time::Duration;
/// use nolock::rate::headers::delay_seconds;
///
/// assert_eq!(delay_seconds(Duration::ZERO), 0);
/// assert_eq!(delay_seconds(Duration::from_millis(1)), 1);
/// assert_eq!(delay_seconds(Duration::from_millis(1000)), 1);
/// assert_eq!(delay_seconds(Duration::from_millis(1001)), 2);
/// ```
pub fn delay_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The `Retry-After` value for a wait: whole seconds, rounded up, at least 1
/// (a denied request is never retried "now").
pub(crate) fn retry_after_value(wait: Duration) -> String {
    delay_seconds(wait).max(1).to_string()
}

/// One `RateLimit-Policy` list member. Names are checked to be plain ASCII
/// (`Limiter::named`), so they need no escaping as structured-field strings.
pub(crate) fn policy_item(name: &str, quota: &Quota) -> String {
    // w = burst × period / rate, rounded up to whole seconds, with exact integers.
    let numerator = u128::from(quota.burst()) * quota.period().as_millis();
    let denominator = u128::from(quota.rate()) * 1000;
    let window = numerator.div_ceil(denominator).max(1);
    format!("\"{name}\";q={};w={window}", quota.burst())
}

/// One `RateLimit-Policy` list member for "at most `limit` per `window`" (a
/// bounded counter): the window in whole seconds, rounded up, at least 1.
pub(crate) fn window_policy_item(name: &str, limit: u64, window: Duration) -> String {
    format!("\"{name}\";q={limit};w={}", delay_seconds(window).max(1))
}

/// One `RateLimit` list member.
pub(crate) fn rate_limit_item(name: &str, limit: &RateLimit) -> String {
    remaining_item(name, limit.remaining, effective_window(limit))
}

/// The draft's `t`: the retry after a denial; otherwise when the limit is
/// full again, which for a calendar period is its end.
fn effective_window(limit: &RateLimit) -> Duration {
    if let Some(retry) = limit.retry_after {
        return retry;
    }
    let to_end = limit
        .period_end
        .and_then(|end| end.duration_since(limit.at).ok());
    to_end.map_or(limit.reset_after, |d| d.max(limit.reset_after))
}

/// One `RateLimit` list member from its parts: `remaining` units, and the
/// effective `window` in whole seconds, rounded up.
pub(crate) fn remaining_item(name: &str, remaining: u64, window: Duration) -> String {
    format!("\"{name}\";r={remaining};t={}", delay_seconds(window))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::{Algorithm, Limiter};
    use std::time::UNIX_EPOCH;

    fn limiter(algorithm: Algorithm, quota: Quota, name: &str) -> Limiter {
        Limiter::new(algorithm, quota).unwrap().named(name).unwrap()
    }

    fn state(allowed: bool, remaining: u64, retry_ms: Option<u64>, reset_ms: u64) -> RateLimit {
        RateLimit {
            allowed,
            limit: 0,
            remaining,
            retry_after: retry_ms.map(Duration::from_millis),
            reset_after: Duration::from_millis(reset_ms),
            at: UNIX_EPOCH,
            debt: 0,
            period_end: None,
        }
    }

    #[test]
    fn an_admitted_request() {
        let l = limiter(
            Algorithm::FixedWindow,
            Quota::per_minute(100).unwrap(),
            "default",
        );
        let h = l.headers(&state(true, 50, None, 30_000));
        assert_eq!(h.policy, r#""default";q=100;w=60"#);
        assert_eq!(h.rate_limit, r#""default";r=50;t=30"#);
        assert_eq!(h.retry_after, None);
        assert_eq!(h.iter().count(), 2);
    }

    #[test]
    fn a_denied_request_names_the_same_moment_twice() {
        let l = limiter(Algorithm::Gcra, Quota::per_second(10).unwrap(), "api");
        // 100 ms until one unit is back; 1 s until full.
        let h = l.headers(&state(false, 0, Some(100), 1000));
        assert_eq!(h.policy, r#""api";q=10;w=1"#);
        assert_eq!(h.rate_limit, r#""api";r=0;t=1"#);
        assert_eq!(h.retry_after.as_deref(), Some("1"));
        let pairs: Vec<_> = h.iter().collect();
        assert_eq!(
            pairs,
            [
                ("RateLimit-Policy", r#""api";q=10;w=1"#),
                ("RateLimit", r#""api";r=0;t=1"#),
                ("Retry-After", "1"),
            ]
        );
    }

    #[test]
    fn bursts_advertise_the_time_to_earn_them_back() {
        // 10 per second, burst 20: 20 units per 2 s.
        let q = Quota::per_second(10).unwrap().with_burst(20).unwrap();
        let l = limiter(Algorithm::TokenBucket, q, "burst");
        assert_eq!(
            l.headers(&state(true, 20, None, 0)).policy,
            r#""burst";q=20;w=2"#
        );
        // 7 per minute: exact, not 7 × ceil(60 s / 7).
        let l = limiter(Algorithm::Gcra, Quota::per_minute(7).unwrap(), "odd");
        assert_eq!(
            l.headers(&state(true, 7, None, 0)).policy,
            r#""odd";q=7;w=60"#
        );
        // Sub-second windows round up to 1 s.
        let q = Quota::per(10, Duration::from_millis(100)).unwrap();
        let l = limiter(Algorithm::SlidingWindow, q, "fast");
        let h = l.headers(&state(true, 9, None, 150));
        assert_eq!(h.policy, r#""fast";q=10;w=1"#);
        assert_eq!(h.rate_limit, r#""fast";r=9;t=1"#);
    }

    #[test]
    fn a_full_limiter_has_no_effective_window() {
        let l = limiter(Algorithm::Gcra, Quota::per_hour(1000).unwrap(), "h");
        assert_eq!(
            l.headers(&state(true, 1000, None, 0)).rate_limit,
            r#""h";r=1000;t=0"#
        );
    }

    #[test]
    fn a_calendar_period_advertises_the_time_left_in_it() {
        use crate::rate::Period;
        let q = Quota::calendar(10_000, Period::MONTH).unwrap();
        let l = limiter(Algorithm::Calendar, q, "month");
        // Nothing used yet, 2.5 days left in the month.
        let mut fresh = state(true, 10_000, None, 0);
        fresh.period_end = Some(UNIX_EPOCH + Duration::from_secs(216_000));
        let h = l.headers(&fresh);
        assert_eq!(h.rate_limit, r#""month";r=10000;t=216000"#);
        // The longest month (31 days and 3 hours for offset changes).
        assert_eq!(h.policy, r#""month";q=10000;w=2689200"#);
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_value(Duration::from_millis(1)), "1");
        assert_eq!(retry_after_value(Duration::from_millis(2_000)), "2");
        assert_eq!(retry_after_value(Duration::from_millis(2_001)), "3");
        assert_eq!(retry_after_value(Duration::ZERO), "1");
    }
}
