//! Operations that run at most once per operation id: [`Idempotent`].
//!
//! Every script that writes has a generated variant (`<name>@once`, built
//! by `build.rs` with `compose::once`) that keeps a record per operation id,
//! in the operation's own cluster slot, for a horizon. The plain call is
//! untouched: same script, same SHA1, same server cost. See the guide
//! chapter `guide::retries` for the guarantee and its limits.

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

use super::compose::{FINGERPRINT_LEN, ONCE_SUFFIX};
use super::{run_one, Invocation, Operation, Script, Scripts};
use crate::{keys, validate, Error, Result};

/// How long a record is kept unless [`Idempotent::horizon`] says otherwise:
/// 5 minutes, longer than any sensible retry loop.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(300);

/// The longest operation id accepted, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// An [`Operation`] that the server applies at most once per operation id,
/// within a horizon: built by [`Operation::idempotent`].
///
/// Sending it again (after [`Error::Indeterminate`], from another process,
/// through [`crate::retry::retry`]) returns the reply of the run that
/// applied it and changes nothing, as long as the record is kept: for
/// [`Idempotent::horizon`] (default [`DEFAULT_HORIZON`]) after that run.
///
/// * **Where the record lives**: at
///   [`keys::derive`]`(first key, "once#<id>")`, a string of the
///   operation's fingerprint (a SHA1 of the script name, keys and
///   arguments, 40 bytes) and its reply packed with MessagePack, with a TTL
///   of the horizon. A reply of integers (a count, a decision) packs into a
///   few dozen bytes, so a record is about 100 bytes with Redis' own
///   overhead; a reply that carries a value (a `SetIfVersion` conflict
///   answers with the stored document, a fenced read with the value) is
///   kept whole, so its record is as large as that value, up to
///   [`crate::MAX_VALUE_LEN`]. The id is scoped by the operation's first key: the same id on
///   two keys names two records. A first key with a `}` but no hash tag
///   derives a record in another slot; such a call is refused with
///   [`Error::CrossSlot`] before I/O (give the key a hash tag).
/// * **The same id for something else** (another operation on the same
///   first key, or other arguments) within the horizon is refused with
///   [`Error::IdReused`], and nothing is written.
/// * **Error replies are not recorded**: a script that refused wrote
///   nothing, so sending again runs it again.
/// * **In a [`crate::Batch`]** each entry may carry its own id.
/// * **Not the same as** [`crate::semaphore::AcquirePermit::with_id`] (the
///   permit's id, which lets a holder re-acquire its own permit) or
///   [`crate::fence::Lock::acquire_as`] (the owner token): those answer from the
///   current state; an operation id replays the first reply.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::limits::TryIncrement;
/// use nolock::retry::{retry, RetryPolicy};
/// use nolock::Operation;
///
/// # async fn run(conn: &mut redis::aio::ConnectionManager, request_id: &str) -> nolock::Result<()> {
/// let op = TryIncrement::new(&nolock::limits::Counter::new(100, Duration::from_secs(60))?, "quota:alice")?
///     .idempotent(request_id)?;
/// // Lost replies are sent again with the same id: counted once.
/// let admission = retry(&RetryPolicy::new(Duration::from_secs(2)), conn, &op).await?;
/// println!("admitted: {}", admission.admitted);
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "an Idempotent operation does nothing until it is run or pushed into a Batch"]
pub struct Idempotent<O> {
    op: O,
    id: String,
    record: String,
    fingerprint: String,
    variant: &'static Script,
    horizon: Duration,
    call: Invocation,
}

impl<O: Operation> Idempotent<O> {
    pub(crate) fn new(op: O, id: String) -> Result<Self> {
        if id.is_empty() || id.len() > MAX_ID_LEN {
            return Err(Error::InvalidArgument {
                what: "operation id",
                reason: format!(
                    "{} bytes; an operation id has 1 to {MAX_ID_LEN} bytes",
                    id.len()
                ),
            });
        }
        let inner = op.invocation();
        let script = inner.script();
        let variant = variant(script)?;
        let (keys, _) = inner.keys_and_args();
        let first = keys
            .first()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .ok_or_else(|| Error::InvalidArgument {
                what: "operation id",
                reason: format!("{} takes no key to keep the record beside", script.name()),
            })?;
        let record = keys::derive(&first, &format!("once#{id}"));
        let fingerprint = fingerprint(inner);
        let horizon = DEFAULT_HORIZON;
        let call = inner.once(variant, &record, &fingerprint, millis(horizon));
        Ok(Idempotent {
            op,
            id,
            record,
            fingerprint,
            variant,
            horizon,
            call,
        })
    }

    /// Keep the record for `horizon` after the run that applied the
    /// operation (default [`DEFAULT_HORIZON`]): a resend within it is
    /// answered from the record, a resend after it applies the operation
    /// again. Make it longer than the longest time a retry may still come.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] (under 1 ms), [`Error::DurationTooLong`]
    /// (above [`crate::MAX_TTL`]); nothing is sent.
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::{cas::Adjust, Operation};
    ///
    /// let op = Adjust::debit("wallet:7", 250)?
    ///     .idempotent("payment-81f2")?
    ///     .horizon(Duration::from_secs(3600))?;
    /// assert_eq!(op.id(), "payment-81f2");
    /// assert!(Adjust::debit("wallet:7", 250)?.idempotent("p")?.horizon(Duration::ZERO).is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn horizon(mut self, horizon: Duration) -> Result<Self> {
        let ms = validate::millis("horizon", horizon)?;
        self.horizon = Duration::from_millis(ms);
        self.call = self
            .op
            .invocation()
            .once(self.variant, &self.record, &self.fingerprint, ms);
        Ok(self)
    }

    /// The operation id (its `Debug` shows `<redacted>`: keep it out of
    /// logs too).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key of the record (see the type docs); it holds the id.
    pub fn record_key(&self) -> &str {
        &self.record
    }

    /// How long the record is kept.
    pub fn horizon_duration(&self) -> Duration {
        self.horizon
    }

    /// The operation without its id.
    pub fn inner(&self) -> &O {
        &self.op
    }

    /// Run it: one round trip, as the plain operation (`EVALSHA` of the
    /// variant, with the same `NOSCRIPT` fallback and resends).
    ///
    /// # Errors
    ///
    /// Those of the plain operation, and [`Error::IdReused`] when the id is
    /// recorded for something else. After [`Error::Indeterminate`] run it
    /// again (or use [`crate::retry::retry`]): the first run's reply comes
    /// back if it was applied.
    pub async fn run<C>(&self, conn: &mut C) -> Result<O::Output>
    where
        C: ConnectionLike + Send,
    {
        run_one(self, conn).await
    }
}

impl<O: Operation> Operation for Idempotent<O> {
    type Output = O::Output;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<O::Output> {
        self.op.decode(reply)
    }

    fn operation_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

impl<O: fmt::Debug> fmt::Debug for Idempotent<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The id, and the record key derived from it, are left out: an id
        // known to others could be claimed by them first (crate::observe).
        f.debug_struct("Idempotent")
            .field("op", &self.op)
            .field("id", &crate::observe::Redacted)
            .field("horizon", &self.horizon)
            .finish_non_exhaustive()
    }
}

/// The at-most-once variant of `script`: only of nolock's own scripts (a
/// script of yours may share a name with one, so the source must match).
fn variant(script: &Script) -> Result<&'static Script> {
    let ours = Scripts::get(script.name()).is_some_and(|s| s.sha1() == script.sha1());
    let variant = Scripts::get(&format!("{}{ONCE_SUFFIX}", script.name())).filter(|_| ours);
    variant.ok_or_else(|| Error::InvalidArgument {
        what: "operation id",
        reason: format!(
            "script {} has no at-most-once variant: it is read-only (running it again \
             changes nothing), already carries an id, or is not one of nolock's",
            script.name()
        ),
    })
}

/// The SHA1 (lowercase hex) of the script name, the keys and the arguments,
/// each behind its length, so that no two different calls share it.
fn fingerprint(call: &Invocation) -> String {
    let mut sha = sha1_smol::Sha1::new();
    let mut word = |bytes: &[u8]| {
        sha.update(&(bytes.len() as u64).to_be_bytes());
        sha.update(bytes);
    };
    let (keys, args) = call.keys_and_args();
    word(call.script().name().as_bytes());
    word(&(keys.len() as u64).to_be_bytes());
    for k in keys.iter().chain(&args) {
        word(k);
    }
    let hex = sha.digest().to_string();
    debug_assert_eq!(hex.len(), FINGERPRINT_LEN);
    hex
}

fn millis(horizon: Duration) -> u64 {
    horizon.as_millis().try_into().unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;

    static ECHO: Script = Script::embedded("limits/try_increment", "return 1");

    #[test]
    fn a_variant_call_appends_the_record_key_fingerprint_and_horizon() {
        let op = crate::limits::TryIncrement::new(
            &crate::limits::Counter::new(10, Duration::from_secs(60)).unwrap(),
            "{u}:q",
        )
        .unwrap();
        let plain = words(op.invocation().command());
        let once = op.clone().idempotent("req-1").unwrap();
        let sent = words(once.invocation().command());
        let variant = Scripts::get("limits/try_increment@once").unwrap();
        assert_eq!(sent[0], "EVALSHA");
        assert_eq!(sent[1], variant.sha1());
        assert_eq!(sent[2], "2");
        assert_eq!(sent[3], "{u}:q");
        assert_eq!(sent[4], keys::derive("{u}:q", "once#req-1"));
        assert_eq!(sent[5..8], plain[4..7]);
        assert_eq!(sent[8].len(), FINGERPRINT_LEN);
        assert_eq!(sent[9], "300000");
        assert_eq!(sent.len(), 10);
        assert_eq!(once.operation_id(), Some("req-1"));
        assert_eq!(op.operation_id(), None);
        let longer = once.horizon(Duration::from_secs(1)).unwrap();
        assert_eq!(words(longer.invocation().command())[9], "1000");
        assert_eq!(keys::slot(longer.record_key()), keys::slot("{u}:q"));
    }

    #[test]
    fn fingerprints_differ_with_any_key_or_argument_and_only_then() {
        let call = |keys: &[&str], args: &[&str]| {
            let mut c = Invocation::new(&ECHO, keys);
            for a in args {
                c = c.arg(*a);
            }
            fingerprint(&c)
        };
        let base = call(&["a"], &["1", "2"]);
        assert_eq!(base, call(&["a"], &["1", "2"]));
        for other in [
            call(&["a"], &["1", "3"]),
            call(&["a"], &["12"]),
            call(&["a", "1"], &["2"]),
            call(&["b"], &["1", "2"]),
            call(&["a"], &["1", "2", ""]),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn bad_ids_and_read_only_scripts_are_refused_before_io() {
        let op = || {
            crate::limits::TryIncrement::new(
                &crate::limits::Counter::new(1, Duration::from_secs(1)).unwrap(),
                "k",
            )
            .unwrap()
        };
        for id in [String::new(), "x".repeat(MAX_ID_LEN + 1)] {
            let err = op().idempotent(id).unwrap_err();
            assert!(err.is_invalid_input(), "{err}");
        }
        assert!(op().idempotent("x".repeat(MAX_ID_LEN)).is_ok());
        let peek = crate::limits::PeekCounter::new("k").unwrap();
        assert!(peek.idempotent("x").is_err());
        let twice = op().idempotent("a").unwrap().idempotent("b");
        assert!(twice.is_err(), "an id'd operation takes no second id");
        // A script of someone else's under the name of one of nolock's.
        static IMPOSTOR: Script = Script::embedded("limits/try_increment", "return 1");
        let call = crate::script::Call::<i64>::new(&IMPOSTOR, &["k"]);
        assert!(call.idempotent("a").is_err());
        let ours = Scripts::get("limits/try_increment").unwrap();
        assert!(crate::script::Call::<i64>::new(ours, &["k"])
            .idempotent("a")
            .is_ok());
        assert!(op()
            .idempotent("a")
            .unwrap()
            .horizon(Duration::from_micros(10))
            .is_err());
    }
}
