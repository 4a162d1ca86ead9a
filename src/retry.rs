//! Sending an operation again until it gets an answer: [`retry`].
//!
//! A call whose reply was lost ([`Error::Indeterminate`]) may or may not
//! have been applied. Sending it again is safe only when the server can
//! tell a resend from a new call: [`retry`] re-sends after a lost reply
//! **only an operation that carries an id** ([`Operation::idempotent`]);
//! the server then answers a resend of an applied operation with the reply
//! it recorded, and applies it exactly once within the id's horizon.
//!
//! Errors in which the server promises that nothing ran and that a moment
//! later may do better are retried for every operation, with or without an
//! id: `BUSY` (another script is running), `LOADING`, `TRYAGAIN`,
//! `CLUSTERDOWN`, `MASTERDOWN`, `MOVED`/`READONLY`/`ASK` beyond the engine's
//! own resends, a refused connection, and a call that never left the
//! client ([`crate::Tracked`]). Nothing else is retried: bad input,
//! [`Error::IdReused`], a script's own refusal, an unexpected reply.
//!
//! The waits are the jittered exponential backoff of [`Backoff`], cut to
//! the policy's deadline; a connection that reconnects
//! (`ConnectionManager`) is what makes a resend after a dropped connection
//! possible at all: a `MultiplexedConnection` whose socket died stays dead.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{ErrorKind, ServerErrorKind};

use crate::script::{run_one, Operation};
use crate::{timer, Backoff, Error, Result};

/// How [`retry`] keeps trying: at most `max_attempts` sends, none after
/// `backoff.timeout` from the first, with [`Backoff`]'s jittered waits.
///
/// ```
/// use std::time::Duration;
/// use nolock::retry::RetryPolicy;
///
/// let policy = RetryPolicy::new(Duration::from_secs(2));
/// assert_eq!(policy.max_attempts, 10);
/// let few = RetryPolicy { max_attempts: 3, ..RetryPolicy::new(Duration::from_millis(500)) };
/// # let _ = few;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The waits between sends (from 10 ms doubling up to 500 ms, each
    /// uniform in `[0, cap]`), and in `timeout` the overall deadline after
    /// the first send: no send starts after it.
    pub backoff: Backoff,
    /// The most sends in all, the first included (at least 1).
    pub max_attempts: u32,
}

impl RetryPolicy {
    /// Up to 10 sends within `deadline`.
    pub const fn new(deadline: Duration) -> Self {
        RetryPolicy {
            backoff: Backoff::new(deadline),
            max_attempts: 10,
        }
    }

    fn check(&self) -> Result<()> {
        self.backoff.check()?;
        if self.max_attempts == 0 {
            return Err(Error::ZeroLimit {
                what: "max_attempts",
            });
        }
        Ok(())
    }
}

impl Default for RetryPolicy {
    /// Up to 10 sends within 2 seconds.
    fn default() -> Self {
        RetryPolicy::new(Duration::from_secs(2))
    }
}

/// Run `op`, and send it again while the error allows (see the module
/// docs) and the policy has attempts and time left. Returns the first
/// answer, or the last error.
///
/// With an id (`op.idempotent(id)?`), a lost reply is sent again and the
/// operation is applied exactly once within its horizon; without one, a
/// lost reply is returned as [`Error::Indeterminate`] at once, as by the
/// plain call. [`crate::stats`]`().retry_resends` counts every resend.
///
/// # Errors
///
/// Before any I/O: [`Error::ZeroDuration`] (a backoff `initial_delay` under
/// 1 ms), [`Error::ZeroLimit`] (`max_attempts` 0), [`Error::NoTimer`] (a
/// runtime without timers). Then the error of the last attempt: those of
/// the operation, [`Error::IdReused`] when the id was recorded for
/// something else.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::{cas::Adjust, retry::{retry, RetryPolicy}, Operation};
///
/// # async fn run(conn: &mut redis::aio::ConnectionManager) -> nolock::Result<()> {
/// // A payment's id makes the debit safe to send again.
/// let debit = Adjust::debit("wallet:7", 250)?.idempotent("payment-81f2")?;
/// let outcome = retry(&RetryPolicy::new(Duration::from_secs(5)), conn, &debit).await?;
/// println!("applied: {}, balance {}", outcome.is_applied(), outcome.balance());
/// # Ok(()) }
/// ```
pub async fn retry<O, C>(policy: &RetryPolicy, conn: &mut C, op: &O) -> Result<O::Output>
where
    O: Operation,
    C: ConnectionLike + Send,
{
    policy.check()?;
    timer::check()?;
    let start = Instant::now();
    let deadline = start + policy.backoff.timeout;
    let has_id = op.operation_id().is_some();
    let mut attempt = 0;
    loop {
        let err = match run_one(op, conn).await {
            Ok(output) => return Ok(output),
            Err(err) => err,
        };
        attempt += 1;
        let now = Instant::now();
        if !worth_retrying(&err, has_id) || attempt >= policy.max_attempts || now >= deadline {
            return Err(err);
        }
        let wait = policy.backoff.delay(attempt - 1).min(deadline - now);
        crate::script::count_retry();
        timer::sleep(wait)?.await;
    }
}

/// True when sending `err`'s call again cannot apply it twice and may
/// succeed.
fn worth_retrying(err: &Error, has_id: bool) -> bool {
    match err {
        Error::Indeterminate(_) => has_id,
        Error::Redis(err) => match err.kind() {
            ErrorKind::Server(kind) => matches!(
                kind,
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::ReadOnly
            ),
            ErrorKind::Extension => err.code() == Some("BUSY"),
            // `Error::from_redis` calls an I/O error definite only when
            // nothing was sent: a refused connection or a `Tracked` refusal.
            ErrorKind::Io => true,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn server(kind: ServerErrorKind) -> Error {
        Error::from_redis(redis::RedisError::from((ErrorKind::Server(kind), "x")))
    }

    fn reply(text: &str) -> Error {
        match redis::parse_redis_value(format!("{text}\r\n").as_bytes()).unwrap() {
            redis::Value::ServerError(err) => Error::from_redis(err.into()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lost_replies_are_retried_only_with_an_id() {
        let lost = Error::from_redis(io::Error::from(io::ErrorKind::ConnectionReset).into());
        assert!(matches!(lost, Error::Indeterminate(_)));
        assert!(worth_retrying(&lost, true));
        assert!(!worth_retrying(&lost, false));
    }

    #[test]
    fn nothing_ran_errors_are_retried_with_or_without_an_id() {
        let refused = Error::from_redis(io::Error::from(io::ErrorKind::ConnectionRefused).into());
        for err in [
            reply("-BUSY Redis is busy running a script."),
            reply("-LOADING Redis is loading the dataset in memory"),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::ClusterDown),
            server(ServerErrorKind::MasterDown),
            refused,
        ] {
            assert!(err.is_definite(), "{err}");
            assert!(worth_retrying(&err, false), "{err}");
            assert!(worth_retrying(&err, true), "{err}");
        }
    }

    #[test]
    fn refusals_bad_input_and_reused_ids_are_not_retried() {
        for err in [
            reply("-ERR nolock limits/try_increment: bad limit"),
            reply("-WRONGTYPE Operation against a key holding the wrong kind of value"),
            reply("-NOLOCK_IDREUSED nolock cas/adjust: the operation id was used (k)"),
            reply("-OOM command not allowed when used memory > 'maxmemory'."),
            Error::EmptyKey,
            Error::NoTimer,
            Error::UnexpectedReply {
                script: "x",
                detail: String::new(),
            },
        ] {
            assert!(!worth_retrying(&err, true), "{err}");
        }
    }

    #[tokio::test]
    async fn a_bad_policy_or_no_timer_is_refused_before_io() {
        use crate::script::tests_support::NoIo;
        let op = crate::limits::TryIncrement::new(
            &crate::limits::Counter::new(1, Duration::from_secs(1)).unwrap(),
            "k",
        )
        .unwrap();
        let mut conn = NoIo::default();
        let zero = RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        };
        assert!(matches!(
            retry(&zero, &mut conn, &op).await,
            Err(Error::ZeroLimit { .. })
        ));
        assert_eq!(conn.sent, 0);
    }

    #[test]
    fn no_timer_is_refused_before_io() {
        use crate::script::tests_support::NoIo;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let op = crate::limits::TryIncrement::new(
            &crate::limits::Counter::new(1, Duration::from_secs(1)).unwrap(),
            "k",
        )
        .unwrap();
        let mut conn = NoIo::default();
        let result = rt.block_on(retry(&RetryPolicy::default(), &mut conn, &op));
        assert!(matches!(result, Err(Error::NoTimer)));
        assert_eq!(conn.sent, 0);
    }

    #[tokio::test]
    async fn attempts_are_bounded_and_plain_operations_are_sent_once_after_a_lost_reply() {
        use crate::script::tests_support::NoIo;
        // NoIo answers every send with a client error: indeterminate.
        let op = crate::limits::TryIncrement::new(
            &crate::limits::Counter::new(1, Duration::from_secs(1)).unwrap(),
            "k",
        )
        .unwrap();
        let policy = RetryPolicy {
            max_attempts: 3,
            backoff: Backoff {
                initial_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(2),
                ..Backoff::new(Duration::from_secs(5))
            },
        };
        let mut conn = NoIo::default();
        let err = retry(&policy, &mut conn, &op).await.unwrap_err();
        assert!(matches!(err, Error::Indeterminate(_)));
        assert_eq!(conn.sent, 1, "no id: never sent again");

        let retries = crate::stats().retry_resends;
        let mut conn = NoIo::default();
        let once = op.idempotent("a").unwrap();
        let err = retry(&policy, &mut conn, &once).await.unwrap_err();
        assert!(matches!(err, Error::Indeterminate(_)));
        assert_eq!(conn.sent, 3);
        assert!(crate::stats().retry_resends >= retries + 2);
    }
}
