//! The one error type of the crate.
//!
//! Three families, kept apart because a caller acts on each differently:
//!
//! * **Bad input** ([`Error::EmptyKey`], [`Error::ZeroLimit`], ...): raised before
//!   anything is sent. Fix the call; retrying will not help.
//! * **Definite Redis failures** ([`Error::Redis`]): the server answered with an
//!   error, so the operation did not take effect (every script validates its
//!   input and reads before its first write). Safe to retry.
//! * **Indeterminate Redis failures** ([`Error::Indeterminate`]): the request may
//!   have been sent and executed, but no answer came back (timeout, connection
//!   lost). nolock never replays a script after one of these; the caller decides.
//!
//! A denied request, a lock held by someone else or a failed condition is a
//! normal return value, never an `Error`.

use std::time::Duration;

use redis::{ErrorKind, RedisError};

/// Everything that can go wrong in a nolock call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key (or resource name) was empty.
    #[error("key must not be empty")]
    EmptyKey,

    /// A limit, capacity or rate was zero: nothing could ever be admitted.
    #[error("{what} must be at least 1")]
    ZeroLimit {
        /// Which argument was zero (`"limit"`, `"n"`, ...).
        what: &'static str,
    },

    /// A duration (window, TTL, period) was zero or below the 1 ms resolution.
    #[error("{what} must be at least 1 ms")]
    ZeroDuration {
        /// Which argument was too short (`"window"`, `"ttl"`, ...).
        what: &'static str,
    },

    /// A duration was longer than Redis accepts for `PEXPIRE` and exact Lua
    /// arithmetic allows.
    #[error("{what} of {given:?} is longer than the maximum of {max:?}")]
    DurationTooLong {
        /// Which argument was too long.
        what: &'static str,
        /// The duration that was passed.
        given: Duration,
        /// The longest duration accepted.
        max: Duration,
    },

    /// An integer argument was above what the script can handle exactly.
    ///
    /// Lua numbers are doubles, so counts and limits are capped at 2^53 - 1.
    #[error("{what} = {given} is above the maximum of {max}")]
    OutOfRange {
        /// Which argument was too large.
        what: &'static str,
        /// The value that was passed.
        given: u64,
        /// The largest value accepted.
        max: u64,
    },

    /// The amount asked for is larger than the limit itself: the request can
    /// never be admitted, however long the caller waits (unlike a denial,
    /// which means "not now").
    #[error("asked for {requested}, but the limit is {limit}: this can never be admitted")]
    InsufficientCapacity {
        /// The amount asked for.
        requested: u64,
        /// The limit it was checked against.
        limit: u64,
    },

    /// The server answered with an error; the operation did not take effect.
    ///
    /// Examples: `WRONGTYPE` (the key holds another type), `OOM`, `READONLY`,
    /// `BUSY`, `NOSCRIPT` after the `EVAL` fallback, a script's own argument
    /// check. Retrying is safe, though it may fail the same way.
    #[error("redis refused the request (it did not take effect): {0}")]
    Redis(#[source] RedisError),

    /// The request may or may not have been executed: the connection failed or
    /// timed out after it could have been sent.
    ///
    /// nolock never replays a script after this. If the operation is
    /// idempotent for you (a read, a release with your own token), retry; if
    /// not (an increment), decide from your own records or read the state back.
    #[error("redis request outcome unknown (it may have taken effect): {0}")]
    Indeterminate(#[source] RedisError),

    /// The server sent a reply of a shape the script never produces. This
    /// points at a version mismatch or a bug in nolock; the operation may have
    /// taken effect.
    #[error("unexpected reply from script {script}: {detail}")]
    UnexpectedReply {
        /// The script that replied.
        script: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },

    /// A [`crate::fence::Lease`] was lost before the work under it finished
    /// (see [`crate::fence::with_lease`]); the work was cancelled and may have
    /// been partly done. Another holder may be running: anything the work
    /// wrote is only safe where a fence check guarded it.
    #[error("the lease on {resource} (fence {fence}) was lost: {loss}")]
    LeaseLost {
        /// The resource name of the lease.
        resource: String,
        /// The fence of the lost grant.
        fence: u64,
        /// Why it was lost.
        loss: crate::fence::Loss,
    },

    /// The operating system's random number generator failed, so no owner
    /// token could be drawn. Nothing was sent.
    #[error("could not draw a random owner token: {0}")]
    Entropy(String),

    /// `SCRIPT LOAD` returned a SHA1 other than the one computed locally.
    #[error("script {script}: server returned SHA1 {server}, expected {local}")]
    ShaMismatch {
        /// The script name (its path under `lua/`).
        script: &'static str,
        /// The SHA1 computed from the embedded source.
        local: String,
        /// The SHA1 the server returned.
        server: String,
    },
}

impl Error {
    /// Classify a redis-rs error by whether the request surely did not run.
    ///
    /// A reply from the server (any server error) is definite. So is a refused
    /// connection: nothing was sent. Everything else on the I/O path (timeout,
    /// reset, broken pipe, a parse failure mid-stream) is indeterminate.
    pub(crate) fn from_redis(err: RedisError) -> Self {
        let definite = match err.kind() {
            ErrorKind::Server(_) | ErrorKind::Extension => true,
            ErrorKind::Client
            | ErrorKind::InvalidClientConfig
            | ErrorKind::AuthenticationFailed
            | ErrorKind::ClusterConnectionNotFound => true,
            ErrorKind::Io => err.is_connection_refusal(),
            _ => false,
        };
        if definite {
            Error::Redis(err)
        } else {
            Error::Indeterminate(err)
        }
    }

    /// True when the operation surely did not take effect, so a retry cannot
    /// apply it twice. False for [`Error::Indeterminate`],
    /// [`Error::UnexpectedReply`] and [`Error::LeaseLost`] (the cancelled work
    /// may have been partly done).
    pub fn is_definite(&self) -> bool {
        !matches!(
            self,
            Error::Indeterminate(_) | Error::UnexpectedReply { .. } | Error::LeaseLost { .. }
        )
    }

    /// True for errors raised by input checks before any I/O.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::EmptyKey
                | Error::ZeroLimit { .. }
                | Error::ZeroDuration { .. }
                | Error::DurationTooLong { .. }
                | Error::OutOfRange { .. }
                | Error::InsufficientCapacity { .. }
        )
    }
}

/// Shorthand for `Result<T, nolock::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn server_errors_are_definite() {
        let err = RedisError::from((ErrorKind::Client, "nope"));
        assert!(matches!(Error::from_redis(err), Error::Redis(_)));
    }

    #[test]
    fn lost_connections_are_indeterminate() {
        for kind in [
            io::ErrorKind::TimedOut,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::UnexpectedEof,
        ] {
            let err = Error::from_redis(RedisError::from(io::Error::from(kind)));
            assert!(matches!(err, Error::Indeterminate(_)), "{kind:?}");
            assert!(!err.is_definite());
        }
    }

    #[test]
    fn refused_connections_are_definite() {
        let err = RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(Error::from_redis(err).is_definite());
    }
}
