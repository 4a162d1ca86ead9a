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
//!   lost). nolock never replays a script after one of these; the caller decides,
//!   or gives the operation an id ([`crate::Operation::idempotent`]) and lets
//!   [`crate::retry::retry`] send it again: the server then applies it once.
//! * **An operation id reused** ([`Error::IdReused`]): the id was already
//!   recorded for another operation or other arguments within its horizon.
//!   Definite (nothing was written) but not bad input the client could have
//!   seen: only the server knows the record. Never retried.
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

    /// A limit, capacity, rate or amount was zero: nothing could ever be
    /// admitted (or moved).
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

    /// Keys that one script must touch together lie in different cluster
    /// slots. Nothing was sent.
    ///
    /// Redis Cluster runs a script only when all its keys share a slot, and
    /// nolock checks this on every deployment so that code tested on one
    /// server does not fail on a cluster. Fix: put the shared part of the keys
    /// in a `{hash tag}`, e.g. `{tenant:7}:user:42` and `{tenant:7}:all`.
    #[error(
        "keys {first:?} (slot {first_slot}) and {second:?} (slot {second_slot}) are in different \
         cluster slots, so one script cannot touch both; give them a shared {{hash tag}}, \
         e.g. \"{{tenant:7}}:user:42\" and \"{{tenant:7}}:all\""
    )]
    CrossSlot {
        /// The key that set the slot.
        first: String,
        /// Its slot.
        first_slot: u16,
        /// The key in another slot.
        second: String,
        /// Its slot.
        second_slot: u16,
    },

    /// An argument is malformed in a way the other input variants do not
    /// describe (a bad name, a duplicate, a missing key, a burst that an
    /// algorithm cannot honour). Nothing was sent.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument (`"name"`, `"shared keys"`, `"quota"`, ...).
        what: &'static str,
        /// What is wrong with it, and how to fix it.
        reason: String,
    },

    /// A value (or expected value) is longer than Redis stores in one string
    /// ([`crate::MAX_VALUE_LEN`], 512 MiB).
    #[error("{what} is {len} bytes, above the maximum of {max}")]
    ValueTooLarge {
        /// Which argument was too long (`"value"`, `"expected"`).
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The longest accepted.
        max: usize,
    },

    /// A range of allowed values holds no value at all (e.g. `5..5`, or a
    /// floor above the ceiling).
    #[error("{what} is an empty range")]
    EmptyRange {
        /// Which argument was empty (`"bounds"`).
        what: &'static str,
    },

    /// A value could not be serialized (serde) before sending; nothing was sent.
    #[error("could not encode the value: {0}")]
    Encode(#[source] serde_json::Error),

    /// A stored value could not be deserialized into the type asked for; the
    /// operation wrote nothing. The key holds data written by another type
    /// or program.
    #[error("could not decode the stored value: {0}")]
    Decode(#[source] serde_json::Error),

    /// An integer stored in Redis would leave the 64-bit signed range; nothing
    /// was written. Unlike a refused debit (a value), this is never expected
    /// in normal operation: the amounts or the stored state are wrong.
    #[error(
        "{what} {value} {delta:+} would overflow a 64-bit signed integer; nothing was written"
    )]
    Overflow {
        /// What would overflow (`"balance"`, `"version"`).
        what: &'static str,
        /// The stored value, unchanged.
        value: i64,
        /// The change that was refused.
        delta: i64,
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
    /// (see [`crate::fence::Lease`]); the work was cancelled and may have
    /// been partly done. Another holder may be running: anything the work
    /// wrote is only safe where a fence check guarded it.
    #[error("the lease on {resource} (fence {fence}) was lost: {loss}")]
    LeaseLost {
        /// The resource name of the lease.
        resource: String,
        /// The fence of the lost grant.
        fence: u64,
        /// Why it was lost.
        loss: crate::Loss,
    },

    /// A [`crate::fence::Lock::acknowledged`] lock was granted on the primary
    /// but fewer replicas than asked confirmed the grant within the timeout
    /// (or the `WAIT` itself failed, e.g. `UNBLOCKED` when a failover
    /// demoted the node: counted as 0 confirmations); with
    /// [`crate::fence::Lock::acknowledged_on_disk`], also when the primary's
    /// own append-only file did not have it on disk in time:
    /// a failover (or a crash) now could lose it and hand its fence out
    /// again. No grant is returned; nolock released the lock at once (if
    /// that release did not get through, the lock expires at its TTL). The
    /// fence number was used up. Not definite: try again later, or read it
    /// as the replicas being behind (see [`crate::fence::durability`]).
    #[error("the grant on {resource} (fence {fence}) reached {acknowledged} of {asked} replica(s){} in time; released{}", disk_note(.on_disk), replica_note(.connected, .asked))]
    Unacknowledged {
        /// The resource name.
        resource: String,
        /// The fence the unconfirmed grant had.
        fence: u64,
        /// How many replicas were asked to confirm.
        asked: u64,
        /// How many did (`WAIT`'s answer; `WAITAOF`'s count of replicas).
        acknowledged: u64,
        /// True when the append-only files on disk were asked for
        /// (`WAITAOF`): the primary's own must have it too.
        on_disk: bool,
        /// How many replicas the server had connected when the wait fell
        /// short (`INFO replication`), when it said: `Some(0)` means the
        /// server has no replica, so no acknowledged grant can ever be
        /// confirmed there (a development server). `None` on a cluster
        /// connection or where `info` is not allowed.
        connected: Option<u64>,
    },

    /// A [`crate::semaphore::Semaphore::acknowledged`] semaphore granted
    /// permits on the primary, but fewer replicas than asked confirmed them
    /// within the timeout (as [`Error::Unacknowledged`] for a lock): a
    /// failover now could lose them and let more holders in than the
    /// semaphore allows. No permit is returned; nolock released them at
    /// once (if that release did not get through, they expire at their
    /// TTL). Not definite: try again, under the same id or a new one.
    #[error("the permits at {key} reached {acknowledged} of {asked} replica(s){} in time; released{}", disk_note(.on_disk), replica_note(.connected, .asked))]
    PermitUnacknowledged {
        /// The semaphore's key.
        key: String,
        /// How many replicas were asked to confirm.
        asked: u64,
        /// How many did.
        acknowledged: u64,
        /// True when the append-only files on disk were asked for.
        on_disk: bool,
        /// How many replicas the server had connected, when it said (as
        /// for [`Error::Unacknowledged`]).
        connected: Option<u64>,
    },

    /// A call needed to wait (a cluster redirect's resend, a retry's backoff,
    /// a lease's renewals) but the Tokio runtime has no timers (build it with
    /// `enable_time()` or `enable_all()`), or there is no runtime. Checked
    /// before any I/O where the call can (retries, leases); after a `MOVED`
    /// or `READONLY` reply, which ran nothing. Nothing was written.
    #[error(
        "nolock needs to wait but the Tokio runtime has no timers: build it with enable_time()"
    )]
    NoTimer,

    /// The renewal task of a [`crate::semaphore::PermitLease`] ended
    /// abnormally, so its release could not be confirmed
    /// ([`crate::semaphore::PermitLease::release`]); the permit expires at
    /// its TTL. (A permit lost while work runs is an outcome, not an error:
    /// see [`crate::Work`].)
    #[error("the permit of semaphore {key} was lost: {loss}")]
    PermitLost {
        /// The semaphore's key.
        key: String,
        /// Why it was lost.
        loss: crate::renew::Loss,
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

    /// No script of that name in the [`crate::script::ScriptDir`] asked.
    /// Nothing was sent. [`crate::checked_script!`] makes a misspelt name a
    /// compile error instead.
    #[error("no script named {name:?} in this script directory")]
    UnknownScript {
        /// The name asked for (a path under the directory, without `.lua`).
        name: String,
    },

    /// A script of a [`crate::script::ScriptDir`] cannot be used: it
    /// includes a helper that does not exist, includes one twice, or its
    /// name has characters other than `[A-Za-z0-9_/-]`. Nothing was sent.
    #[error("script {script}: {reason}")]
    ScriptSource {
        /// The file, under the directory.
        script: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An operation id ([`crate::Operation::idempotent`]) was already
    /// recorded, within its horizon, for another operation or the same
    /// operation with other arguments. Nothing was written and no recorded
    /// reply was returned: answering with the other operation's reply would
    /// be wrong. Definite; not retried by [`crate::retry::retry`]. Give each
    /// distinct operation its own id.
    #[error("operation id reused for a different operation: {detail}")]
    IdReused {
        /// The server's message: the script and the operation's first key
        /// (never the id, nor the record key derived from it).
        detail: String,
    },

    /// A permit was acquired, extended or released with a weight other
    /// than the one its id holds unexpired on the server (a permit rebuilt
    /// with [`crate::semaphore::Semaphore::restore`] and the wrong weight,
    /// or one id acquired with two weights). Definite: nothing was written,
    /// and the holding keeps all its permits. Not retried: the same call
    /// fails the same way; restore the permit with the weight it was
    /// granted ([`crate::semaphore::Permit::weight`]).
    #[error("permit weight does not match the holding: {detail}")]
    PermitWeightMismatch {
        /// The server's message: the script and the semaphore's key (never
        /// the permit id).
        detail: String,
    },

    /// A receipt was given an answer about another receipt:
    /// [`crate::fence::Grant::apply`] an extension of another grant (or
    /// the same resource under another token), or
    /// [`crate::semaphore::Permit::apply`] one of another permit (or the
    /// same id with another weight or TTL). Nothing changed; no I/O.
    #[error("an extension's answer about another {receipt} was not applied to this one")]
    ForeignAnswer {
        /// What refused it: `"grant"` or `"permit"`.
        receipt: &'static str,
    },

    /// A script's reply does not decode into the type asked for
    /// ([`crate::script::Call`]). The script **ran**: whatever it wrote
    /// stays written, so this is not a definite error. Fix the type (or
    /// the script) rather than retrying.
    #[error("the reply of script {script} does not decode into {target}: {detail}")]
    ReplyType {
        /// The script that replied.
        script: &'static str,
        /// The Rust type asked for.
        target: &'static str,
        /// Why the reply did not fit.
        detail: String,
    },

    /// No configuration is stored under this name ([`crate::config`]).
    /// Nothing was written.
    #[error("no {family} named {name:?} is stored")]
    UnknownConfig {
        /// The family asked for (`rate-limit`, `counter`, ...).
        family: &'static str,
        /// The name asked for.
        name: String,
    },

    /// The registry of named configurations holds, at `key` (and `field`,
    /// when one field is the problem), something nolock did not write.
    /// Nothing was written.
    #[error("foreign data at configuration key {key} {field}: {reason}")]
    ForeignConfig {
        /// The registry key.
        key: String,
        /// The field, empty when the key itself is the problem.
        field: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A handle asked to [`insist`](crate::client::RateLimit::insist) on its
    /// own numbers, and the server holds other numbers under its name.
    /// Nothing was written.
    #[error("{family} {name:?} is stored as `{stored}`, this process has `{ours}`")]
    ConfigMismatch {
        /// The handle's family.
        family: &'static str,
        /// The handle's name.
        name: String,
        /// The stored numbers.
        stored: String,
        /// This process's numbers.
        ours: String,
    },

    /// An operator blocked this name ([`crate::config::Configs::block`]):
    /// a semaphore or a lock grants nothing until it is unblocked. Nothing
    /// was written.
    #[error("{family} {name:?} is blocked by its stored configuration")]
    Blocked {
        /// The handle's family.
        family: &'static str,
        /// The handle's name.
        name: String,
    },

    /// The state at a key was written by another limit: another algorithm,
    /// or the same algorithm with other numbers (another quota, window,
    /// capacity or semaphore size). Definite: nothing was written. Not
    /// retried: the same call fails the same way.
    ///
    /// Each state keeps a tag of what wrote it (`g100000x10` for GCRA with
    /// an interval of 100 000 µs and a burst of 10; `guide::configuration`
    /// lists them all), so two processes built with other numbers cannot
    /// read one state two ways. Fix: give each limit its own key, or change
    /// the numbers through a stored configuration
    /// ([`crate::config::Configs::set`]), whose handles adopt the state.
    #[error("the state was written by another limit: {detail}")]
    StateMismatch {
        /// The server's message: the script, the key, the stored tag and
        /// this call's.
        detail: String,
    },

    /// A calendar quota's call reached a server whose clock is outside the
    /// periods the call computed (the client's estimate of the server's
    /// time was off by more than a period); nothing was written.
    ///
    /// The refusal carries the server's time, which corrects the estimate:
    /// the calls of [`rate::Limiter`](crate::rate::Limiter),
    /// [`rate::MultiLimiter`](crate::rate::MultiLimiter) and their charges
    /// build the call again once by themselves. An operation in a
    /// [`Batch`](crate::Batch) returns it: build the operation again and
    /// send it once more.
    #[error("the server's clock is outside the calendar periods this call computed: {detail}")]
    PeriodMismatch {
        /// The server's message: the script, its time in ms and the key.
        detail: String,
    },

    /// A compare-and-set kept losing to other writers; nothing was written.
    /// Retry later.
    #[error("the {what} kept changing under this call; nothing was written")]
    Contended {
        /// What kept changing.
        what: &'static str,
    },
}

/// The error code of a calendar script whose server clock is outside the
/// periods sent (`lua/lib/calendar.lua`).
pub(crate) const PERIOD_MISMATCH: &str = "NOLOCK_PERIOD";

/// The error code of a script refusing a state another limit wrote (`lua/lib/tag.lua`).
pub(crate) const STATE_MISMATCH: &str = "NOLOCK_STATE";

impl Error {
    /// Classify a redis-rs error by whether the request surely did not run.
    ///
    /// A reply from the server (any server error) is definite. So is a refused
    /// connection, or a connection found closed before the request was
    /// handed to it: nothing was sent. Everything else on the I/O path (timeout,
    /// reset, broken pipe, a parse failure mid-stream) is indeterminate.
    pub(crate) fn from_redis(err: RedisError) -> Self {
        if err.code() == Some(crate::script::ID_REUSED) {
            return Error::IdReused {
                detail: err.detail().unwrap_or_default().to_owned(),
            };
        }
        if err.code() == Some(STATE_MISMATCH) {
            return Error::StateMismatch {
                detail: err.detail().unwrap_or_default().to_owned(),
            };
        }
        if err.code() == Some(PERIOD_MISMATCH) {
            let detail = err.detail().unwrap_or_default().to_owned();
            crate::rate::saw_server_time_in(&detail);
            return Error::PeriodMismatch { detail };
        }
        if err.code() == Some(crate::semaphore::WEIGHT_MISMATCH) {
            return Error::PermitWeightMismatch {
                detail: err.detail().unwrap_or_default().to_owned(),
            };
        }
        let definite = match err.kind() {
            ErrorKind::Server(_) | ErrorKind::Extension => true,
            // Raised while connecting or routing, before a request exists.
            ErrorKind::InvalidClientConfig
            | ErrorKind::AuthenticationFailed
            | ErrorKind::ClusterConnectionNotFound => true,
            // redis-rs also uses `Client` for failures after a request was
            // handed to the connection (the cluster connection's "request
            // wasn't handled due to internal failure"), so it cannot promise
            // the script did not run. A call refused by `Tracked` after its
            // connection dropped is marked as never sent.
            ErrorKind::Io => err.is_connection_refusal() || crate::script::is_never_sent(&err),
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
    /// [`Error::UnexpectedReply`], [`Error::ReplyType`] (the script ran) and
    /// [`Error::LeaseLost`] (the cancelled work may have been partly done)
    /// and [`Error::Unacknowledged`] / [`Error::PermitUnacknowledged`] (a
    /// grant was made, then given back).
    pub fn is_definite(&self) -> bool {
        if let Error::ReplyType { .. } = self {
            return false; // the script ran; only its reply did not fit
        }
        !matches!(
            self,
            Error::Indeterminate(_)
                | Error::UnexpectedReply { .. }
                | Error::LeaseLost { .. }
                | Error::PermitLost { .. }
                | Error::Unacknowledged { .. }
                | Error::PermitUnacknowledged { .. }
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
                | Error::CrossSlot { .. }
                | Error::InvalidArgument { .. }
                | Error::ValueTooLarge { .. }
                | Error::EmptyRange { .. }
                | Error::Encode(_)
                | Error::UnknownScript { .. }
                | Error::ScriptSource { .. }
                | Error::ForeignAnswer { .. }
        )
    }
}

/// The words an acknowledgement error adds when it asked for the disk.
fn disk_note(on_disk: &bool) -> &'static str {
    if *on_disk {
        " and disk"
    } else {
        ""
    }
}

fn replica_note(connected: &Option<u64>, asked: &u64) -> String {
    match *connected {
        Some(0) => "; the server has no replica connected: acknowledged grants need one \
                    (a development server has none; drop `acknowledged` there)"
            .to_owned(),
        Some(n) if n < *asked => format!("; the server has only {n} replica(s) connected"),
        _ => String::new(),
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
        let err = RedisError::from((ErrorKind::Server(redis::ServerErrorKind::ReadOnly), "nope"));
        assert!(matches!(Error::from_redis(err), Error::Redis(_)));
        let err = RedisError::from((ErrorKind::AuthenticationFailed, "nope"));
        assert!(matches!(Error::from_redis(err), Error::Redis(_)));
    }

    #[test]
    fn client_side_failures_may_have_sent_the_request() {
        let err = RedisError::from((ErrorKind::Client, "request wasn't handled"));
        assert!(matches!(Error::from_redis(err), Error::Indeterminate(_)));
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
    fn cross_slot_says_how_to_fix_the_keys() {
        let err = Error::CrossSlot {
            first: "a".into(),
            first_slot: crate::keys::slot("a"),
            second: "b".into(),
            second_slot: crate::keys::slot("b"),
        };
        assert!(err.is_invalid_input() && err.is_definite());
        let text = err.to_string();
        assert!(text.contains(r#""a" (slot 15495)"#), "{text}");
        assert!(
            text.contains("hash tag") && text.contains("{tenant:7}:all"),
            "{text}"
        );
    }

    #[test]
    fn a_reused_id_is_definite_and_not_bad_input() {
        let reply = redis::parse_redis_value(
            b"-NOLOCK_IDREUSED nolock limits/try_increment: the operation id was used (k)\r\n",
        )
        .unwrap();
        let redis::Value::ServerError(err) = reply else {
            panic!("{reply:?}")
        };
        let err = Error::from_redis(err.into());
        assert!(
            matches!(&err, Error::IdReused { detail } if detail.contains("(k)")),
            "{err}"
        );
        assert!(err.is_definite() && !err.is_invalid_input());
    }

    #[test]
    fn a_state_of_another_limit_is_definite_and_named_by_its_code() {
        let reply = redis::parse_redis_value(
            b"-NOLOCK_STATE nolock rate/gcra/check: k holds state written by f1000x5, not g100x10; nothing was written\r\n",
        )
        .unwrap();
        let redis::Value::ServerError(err) = reply else {
            panic!("{reply:?}")
        };
        let err = Error::from_redis(err.into());
        assert!(
            matches!(&err, Error::StateMismatch { detail } if detail.contains("k holds state written by f1000x5, not g100x10")),
            "{err}"
        );
        assert!(err.is_definite() && !err.is_invalid_input());
    }

    #[test]
    fn a_weight_mismatch_is_definite_and_named_by_its_code() {
        let reply = redis::parse_redis_value(
            b"-NOLOCK_WEIGHT nolock semaphore/extend: k holds this permit id with another weight\r\n",
        )
        .unwrap();
        let redis::Value::ServerError(err) = reply else {
            panic!("{reply:?}")
        };
        let err = Error::from_redis(err.into());
        assert!(
            matches!(&err, Error::PermitWeightMismatch { detail } if detail.contains("semaphore/extend: k ")),
            "{err}"
        );
        assert!(err.is_definite() && !err.is_invalid_input());
        let foreign = Error::ForeignAnswer { receipt: "grant" };
        assert!(foreign.is_definite() && foreign.is_invalid_input());
    }

    #[test]
    fn refused_connections_are_definite() {
        let err = RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(Error::from_redis(err).is_definite());
    }
}
