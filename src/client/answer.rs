//! What a limit handle answers: [`Admitted`] when the call goes through,
//! [`Rejection`] when it does not (limited, or Redis could not decide).
//! Both carry the HTTP headers of the decision.

use std::fmt;
use std::time::Duration;

use crate::rate::Headers;
use crate::Error;

/// A call a limit let through, with what is left.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an admission carries the headers to send"]
pub struct Admitted {
    /// The most the limit admits at once.
    pub limit: u64,
    /// How many units fit now, after this call's cost was taken.
    pub remaining: u64,
    /// How long until the limit is full again, if nothing else arrives.
    pub reset_after: Duration,
    pub(crate) headers: Headers,
}

impl Admitted {
    /// The `RateLimit-Policy` and `RateLimit` headers of the decision.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
}

/// A call a limit turned away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// The most the limit admits at once.
    pub limit: u64,
    /// How long until this same call would be admitted, if nothing else
    /// arrives; `None` when it never would be (its cost is above the limit).
    pub retry_after: Option<Duration>,
    /// How long until the limit is full again, if nothing else arrives.
    pub reset_after: Duration,
    pub(crate) headers: Headers,
}

impl Limited {
    /// The `RateLimit-Policy`, `RateLimit` and `Retry-After` headers of the
    /// decision (`Retry-After` in whole seconds, rounded up, at least 1).
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
}

/// Why a call did not go through: the limit turned it away, or nolock could
/// not decide (Redis down, slow, or the input was refused).
///
/// A handler can return it with `?`: with the `axum` feature it is a
/// response (`429` with the headers, or `503`).
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// The limit is reached.
    Limited(Limited),
    /// No decision: the error says why.
    Failed(Error),
}

impl Rejection {
    /// The limit's answer, when the limit turned the call away.
    pub fn limited(&self) -> Option<&Limited> {
        match self {
            Rejection::Limited(limited) => Some(limited),
            Rejection::Failed(_) => None,
        }
    }
}

impl From<Error> for Rejection {
    fn from(err: Error) -> Self {
        Rejection::Failed(err)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Limited(l) => match l.retry_after {
                Some(wait) => write!(f, "rate limited: retry after {wait:?}"),
                None => write!(f, "rate limited: the cost is above the limit ({})", l.limit),
            },
            Rejection::Failed(err) => write!(f, "no rate-limit decision: {err}"),
        }
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Rejection::Limited(_) => None,
            Rejection::Failed(err) => Some(err),
        }
    }
}
