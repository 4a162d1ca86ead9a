//! What a rate check does when Redis is slow or down: a per-decision
//! timeout, and a typed fallback that the caller can tell apart from a
//! Redis decision.
//!
//! A [`Guard`] wraps [`Limiter::check`] or [`MultiLimiter::check`]. When the
//! call returns in time, its answer is [`Guarded::Redis`]. When it fails
//! (any Redis error, definite or indeterminate) or takes longer than the
//! timeout, the guard answers by its [`OnFailure`]:
//!
//! | [`OnFailure`] | answer | in the tower layer |
//! |---|---|---|
//! | [`Closed`](OnFailure::Closed) | [`Guarded::Closed`]: deny | `503 Service Unavailable`, `Retry-After: 1` |
//! | [`Open`](OnFailure::Open) | [`Guarded::Open`]: allow, counted | the request passes, no `RateLimit` headers |
//! | [`Local`](OnFailure::Local) | [`Guarded::Local`]: a per-process limiter decides | `429` or pass, as from Redis |
//!
//! Invalid input (an empty key, a cost above the burst) is not a Redis
//! failure: it is returned as the error it is, with no fallback.
//!
//! **A timed-out call may still run.** The timeout stops waiting; it cannot
//! recall a request already sent. A check that timed out may have taken its
//! cost on the server (it is [`Error::Indeterminate`] in all but name), so a
//! fallback decision can follow a Redis charge for the same request.
//!
//! With the `metrics` feature every fallback decision is counted in
//! `nolock_fallback_decisions_total{policy}`; with `tracing` it is a `warn`
//! event.
//!
//! # Example
//!
//! ```no_run
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use nolock::policy::{Guard, Guarded, OnFailure};
//! use nolock::rate::{Algorithm, Limiter, Quota};
//!
//! # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
//! let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(100)?)?;
//! // 4 replicas: each admits 25 per second on its own while Redis is away.
//! let replicas = NonZeroU32::new(4).expect("4 is not zero");
//! let guard = Guard::new(Duration::from_millis(50), OnFailure::Local { replicas })?;
//! match guard.check(&limiter, conn, "rl:user:42", 1).await? {
//!     Guarded::Redis(d) if d.allowed => println!("ok"),
//!     Guarded::Local { decision, cause } => println!("fallback ({cause}): {}", decision.allowed),
//!     other => println!("allowed: {}", other.allowed()),
//! }
//! # Ok(()) }
//! ```
//!
//! [`Limiter::check`]: crate::rate::Limiter::check
//! [`MultiLimiter::check`]: crate::rate::MultiLimiter::check

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::rate::{Decision, Limiter, MultiKey, MultiLimiter, MultiRateLimit};
use crate::{observe, validate, Error, Result};

mod local;

/// What a [`Guard`] answers when Redis errs or is too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnFailure {
    /// Deny. Safe for limits that protect money or a fragile backend; an
    /// outage of Redis becomes an outage of the service.
    Closed,
    /// Allow, and count it (`nolock_fallback_decisions_total`): the service
    /// keeps running unlimited while Redis is away (Upstash's `timeout`).
    Open,
    /// Decide with a limiter in this process, with the quota divided by
    /// `replicas` (rate-limiter-flexible's insurance limiter): each of
    /// `replicas` processes admits its share, so all of them together stay
    /// near the quota. Uneven load balancing makes it looser or stricter.
    Local {
        /// How many processes share the quota.
        replicas: NonZeroU32,
    },
}

/// Why a decision did not come from Redis.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure {
    /// No answer within the guard's timeout.
    Timeout(Duration),
    /// Redis answered with an error or the connection failed
    /// ([`Error::Redis`] or [`Error::Indeterminate`], or an unexpected reply).
    Redis(Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout(t) => write!(f, "no answer from Redis within {t:?}"),
            Failure::Redis(e) => write!(f, "Redis failed: {e}"),
        }
    }
}

/// Where a [`Guarded`] decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecidedBy {
    /// The Redis script decided.
    Redis,
    /// The per-process limiter decided ([`OnFailure::Local`]).
    Local,
    /// Allowed without a decision ([`OnFailure::Open`]).
    Open,
    /// Denied without a decision ([`OnFailure::Closed`]).
    Closed,
}

impl DecidedBy {
    /// `"redis"`, `"local"`, `"fail_open"` or `"fail_closed"`: the label
    /// used in metrics.
    pub const fn name(self) -> &'static str {
        match self {
            DecidedBy::Redis => "redis",
            DecidedBy::Local => "local",
            DecidedBy::Open => "fail_open",
            DecidedBy::Closed => "fail_closed",
        }
    }
}

/// A decision under a [`Guard`]: from Redis, or a fallback and its cause.
#[derive(Debug)]
#[must_use = "a denied request must be turned away"]
// Non-exhaustive like `OnFailure`: a new policy brings a new kind of answer.
#[non_exhaustive]
pub enum Guarded<T> {
    /// Redis decided in time.
    Redis(T),
    /// Redis failed; the per-process limiter decided.
    Local {
        /// The local decision, in the same shape as Redis's.
        decision: T,
        /// Why Redis did not decide.
        cause: Failure,
    },
    /// Redis failed; allowed by [`OnFailure::Open`].
    Open {
        /// Why Redis did not decide.
        cause: Failure,
    },
    /// Redis failed; denied by [`OnFailure::Closed`].
    Closed {
        /// Why Redis did not decide.
        cause: Failure,
    },
}

impl<T> Guarded<T> {
    /// Where the decision came from.
    pub fn source(&self) -> DecidedBy {
        match self {
            Guarded::Redis(_) => DecidedBy::Redis,
            Guarded::Local { .. } => DecidedBy::Local,
            Guarded::Open { .. } => DecidedBy::Open,
            Guarded::Closed { .. } => DecidedBy::Closed,
        }
    }

    /// The limiter's answer (from Redis or the local limiter); `None` for
    /// [`Guarded::Open`] and [`Guarded::Closed`], which decided nothing.
    pub fn decision(&self) -> Option<&T> {
        match self {
            Guarded::Redis(d) | Guarded::Local { decision: d, .. } => Some(d),
            Guarded::Open { .. } | Guarded::Closed { .. } => None,
        }
    }

    /// Why Redis did not decide; `None` for [`Guarded::Redis`].
    pub fn cause(&self) -> Option<&Failure> {
        match self {
            Guarded::Redis(_) => None,
            Guarded::Local { cause, .. } | Guarded::Open { cause } | Guarded::Closed { cause } => {
                Some(cause)
            }
        }
    }
}

impl Guarded<Decision> {
    /// True when the request may go ahead.
    pub fn allowed(&self) -> bool {
        self.decision()
            .map_or(self.source() == DecidedBy::Open, |d| d.allowed)
    }
}

impl Guarded<MultiRateLimit> {
    /// True when the request may go ahead.
    pub fn allowed(&self) -> bool {
        self.decision()
            .map_or(self.source() == DecidedBy::Open, |d| d.allowed)
    }
}

/// A per-decision timeout and an [`OnFailure`], around rate checks. Cheap to
/// clone (the local limiter's state is shared); build one per limit and keep
/// it, since [`OnFailure::Local`] remembers its keys in it.
#[derive(Debug, Clone)]
pub struct Guard {
    timeout: Duration,
    on_failure: OnFailure,
    local: Arc<local::Local>,
}

impl Guard {
    /// Wait at most `timeout` for each decision, then act by `on_failure`.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] when `timeout` is under 1 ms.
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::policy::{Guard, OnFailure};
    ///
    /// let guard = Guard::new(Duration::from_millis(25), OnFailure::Open)?;
    /// assert_eq!(guard.on_failure(), OnFailure::Open);
    /// assert!(Guard::new(Duration::ZERO, OnFailure::Closed).is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn new(timeout: Duration, on_failure: OnFailure) -> Result<Guard> {
        validate::millis("timeout", timeout)?;
        Ok(Guard::unchecked(timeout, on_failure))
    }

    /// [`Guard::new`] for a timeout known to be valid.
    pub(crate) fn unchecked(timeout: Duration, on_failure: OnFailure) -> Guard {
        let replicas = match on_failure {
            OnFailure::Local { replicas } => u64::from(replicas.get()),
            OnFailure::Closed | OnFailure::Open => 1,
        };
        Guard {
            timeout,
            on_failure,
            local: Arc::new(local::Local::new(replicas)),
        }
    }

    /// The per-decision timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What happens when Redis fails.
    pub fn on_failure(&self) -> OnFailure {
        self.on_failure
    }

    /// [`Limiter::check`] within the timeout, or the fallback.
    ///
    /// # Errors
    ///
    /// Only invalid input, before any I/O (as [`Limiter::check`]): Redis
    /// failures become fallback decisions. Under [`OnFailure::Local`], a
    /// cost above the local share of the burst (the burst divided by the
    /// replicas, at least one) is [`Error::InsufficientCapacity`] when the
    /// fallback decides: it could never be admitted locally, so no
    /// `retry_after` is promised. [`Error::NoTimer`] on a runtime without
    /// timers (the timeout could not run), before any I/O.
    pub async fn check<C>(
        &self,
        limiter: &Limiter,
        conn: &mut C,
        key: &str,
        cost: u64,
    ) -> Result<Guarded<Decision>>
    where
        C: ConnectionLike + Send,
    {
        let quota = *limiter.quota();
        self.run(limiter.check(conn, key, cost), || {
            let (_, mut limits) = self.local.decide(&[(key, &quota)], cost)?;
            let decided = limits.pop().ok_or_else(|| Error::UnexpectedReply {
                script: "policy/local",
                detail: "no limit decided".into(),
            })?;
            // Nothing was taken in Redis: a local decision carries no charge.
            Ok(Decision::uncharged(decided))
        })
        .await
    }

    /// [`MultiLimiter::check`] within the timeout, or the fallback (the local
    /// limiter keeps one state per derived key, all or nothing as in Redis).
    ///
    /// # Errors
    ///
    /// As [`Guard::check`].
    pub async fn check_multi<C>(
        &self,
        limiter: &MultiLimiter,
        conn: &mut C,
        key: impl Into<MultiKey>,
        cost: u64,
    ) -> Result<Guarded<MultiRateLimit>>
    where
        C: ConnectionLike + Send,
    {
        let key = key.into();
        let keys = limiter.keys(&key)?;
        self.run(limiter.check(conn, key, cost), || {
            let limits: Vec<(&str, _)> = keys
                .iter()
                .map(String::as_str)
                .zip(limiter.quotas())
                .collect();
            let (allowed, limits) = self.local.decide(&limits, cost)?;
            Ok(MultiRateLimit::uncharged(allowed, limits))
        })
        .await
    }

    async fn run<T, F>(&self, call: F, local: impl FnOnce() -> Result<T>) -> Result<Guarded<T>>
    where
        F: Future<Output = Result<T>>,
    {
        // The timeout needs a timer: on a runtime without one, say so
        // before anything is sent.
        let timeout = crate::timer::sleep(self.timeout)?;
        let result = tokio::select! {
            result = call => Some(result),
            _ = timeout => None,
        };
        let cause = match result {
            Some(Ok(decision)) => return Ok(Guarded::Redis(decision)),
            Some(Err(err)) if err.is_invalid_input() => return Err(err),
            Some(Err(err)) => Failure::Redis(err),
            None => Failure::Timeout(self.timeout),
        };
        let guarded = match self.on_failure {
            OnFailure::Closed => Guarded::Closed { cause },
            OnFailure::Open => Guarded::Open { cause },
            OnFailure::Local { .. } => Guarded::Local {
                decision: local()?,
                cause,
            },
        };
        if let Some(cause) = guarded.cause() {
            observe::fallback(guarded.source().name(), cause);
        }
        Ok(guarded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::{Algorithm, Quota};
    use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, Value};

    /// A connection whose every request fails, as if Redis were down.
    #[derive(Default)]
    struct NoIo {
        sent: usize,
    }

    impl ConnectionLike for NoIo {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
            self.sent += 1;
            Box::pin(async { Err((ErrorKind::Io, "down").into()) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a Pipeline,
            _: usize,
            _: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            self.sent += 1;
            Box::pin(async { Err((ErrorKind::Io, "down").into()) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    #[tokio::test]
    async fn each_policy_answers_for_a_failed_redis() {
        let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(4).unwrap()).unwrap();
        let ms = Duration::from_millis(100);
        let two = NonZeroU32::new(2).unwrap();
        let mut conn = NoIo::default();

        let closed = Guard::new(ms, OnFailure::Closed).unwrap();
        let g = closed.check(&limiter, &mut conn, "k", 1).await.unwrap();
        assert!(!g.allowed() && g.source() == DecidedBy::Closed && g.decision().is_none());
        assert!(matches!(g.cause(), Some(Failure::Redis(_))));

        let open = Guard::new(ms, OnFailure::Open).unwrap();
        let g = open.check(&limiter, &mut conn, "k", 1).await.unwrap();
        assert!(g.allowed() && g.source() == DecidedBy::Open);

        let local = Guard::new(ms, OnFailure::Local { replicas: two }).unwrap();
        let mut allowed = 0;
        for _ in 0..5 {
            let g = local.check(&limiter, &mut conn, "k", 1).await.unwrap();
            assert_eq!(g.source(), DecidedBy::Local);
            allowed += usize::from(g.allowed());
        }
        assert_eq!(allowed, 2, "4 per second over 2 replicas: a burst of 2");

        // Invalid input is an error, not a fallback, and nothing is sent.
        let before = conn.sent;
        assert!(matches!(
            local.check(&limiter, &mut conn, "", 1).await,
            Err(Error::EmptyKey)
        ));
        assert_eq!(conn.sent, before);
    }

    #[tokio::test]
    async fn multi_limits_fall_back_all_or_nothing() {
        let limiter = MultiLimiter::new(Algorithm::Gcra)
            .limit("user", Quota::per_second(2).unwrap())
            .unwrap()
            .shared_limit("all", Quota::per_second(100).unwrap())
            .unwrap();
        let one = NonZeroU32::new(1).unwrap();
        let guard = Guard::new(
            Duration::from_millis(50),
            OnFailure::Local { replicas: one },
        )
        .unwrap();
        let mut conn = NoIo::default();
        let mut allowed = 0;
        for _ in 0..3 {
            let g = guard
                .check_multi(
                    &limiter,
                    &mut conn,
                    MultiKey::new("{t}:u").shared("all", "{t}:all"),
                    1,
                )
                .await
                .unwrap();
            allowed += usize::from(g.allowed());
            if !g.allowed() {
                assert_eq!(g.decision().unwrap().denied_by, Some(0));
            }
        }
        assert_eq!(allowed, 2);
    }
}
