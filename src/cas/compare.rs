//! Compare-and-set, compare-and-delete, compare-and-expire, insert-if-absent:
//! conditional writes on a plain string key, compared byte for byte.

use std::time::Duration;

use redis::{aio::ConnectionLike, Value};

use crate::script::{embedded, native, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

static COMPARE_AND_SET: Script = embedded!("cas/compare_and_set");
static COMPARE_AND_DELETE: Script = embedded!("cas/compare_and_delete");
static COMPARE_AND_EXPIRE: Script = embedded!("cas/compare_and_expire");

/// What [`compare_and_set`] expects to find in the key.
///
/// ```
/// use nolock::cas::Expected;
/// let token = String::from("t-1");
/// assert_eq!(Expected::value(&token), Expected::Value(b"t-1"));
/// assert_ne!(Expected::value(""), Expected::Absent); // empty is a value
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected<'a> {
    /// The key must not exist.
    Absent,
    /// The key must hold exactly these bytes.
    Value(&'a [u8]),
}

impl<'a> Expected<'a> {
    /// Expect the key to hold `value` (a `str`, `String`, `[u8]`, `Vec<u8>`, ...).
    pub fn value<V: AsRef<[u8]> + ?Sized>(value: &'a V) -> Self {
        Expected::Value(value.as_ref())
    }
}

/// The outcome of [`compare_and_set`], [`compare_and_delete`] and
/// [`compare_and_expire`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a mismatch means nothing was written"]
pub enum Outcome {
    /// The key held the expected value; the write, delete or expiry change
    /// was applied.
    Applied,
    /// The key held something else; nothing was changed.
    Mismatch {
        /// What the key holds now: `None` when it does not exist.
        current: Option<Vec<u8>>,
    },
}

impl Outcome {
    /// True for [`Outcome::Applied`].
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied)
    }
}

/// The outcome of [`set_if_absent`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an existing value means nothing was written"]
pub enum Insert {
    /// The key was absent and now holds the value.
    Inserted,
    /// The key already existed and was left alone; this is what it holds.
    Existing(Vec<u8>),
}

impl Insert {
    /// True for [`Insert::Inserted`].
    pub fn is_inserted(&self) -> bool {
        matches!(self, Insert::Inserted)
    }
}

/// Write `new` at `key` only if the key holds `expected` (or, with
/// [`Expected::Absent`], only if it does not exist). One round trip.
///
/// With `ttl: Some(d)` the written value expires after `d` (millisecond
/// precision). With `None` the key keeps the expiry it had (`SET ... KEEPTTL`),
/// so a changed lease stays a lease; a key created from absent then has none.
///
/// On [`Outcome::Mismatch`] nothing was written, and `current` is what the key
/// holds, so a retry loop needs no separate read.
///
/// On Valkey 8.1 and later (when [`crate::Scripts::load`] found it,
/// [`crate::script::Loaded::set_ifeq`]) a call with an expected value runs the native
/// `SET key new IFEQ expected PX ttl|KEEPTTL GET` instead of the script: the
/// same answers, the same errors (`WRONGTYPE` for a key of another type),
/// less server time (`cargo test --test cas_native -- --nocapture` measures
/// both on the server it runs on). A reply that says nothing ran (an
/// older server's `syntax error`, a cluster redirect) sends the script
/// instead, with its resends. The native command is not a script: it is not
/// counted in [`crate::stats`] and has no span. [`CompareAndSet`] (in a
/// batch, with an operation id) always runs the script.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ValueTooLarge`] (`new` or
/// the expected value above 512 MiB), [`Error::ZeroDuration`] and
/// [`Error::DurationTooLong`] for the TTL. From Redis: [`Error::Redis`] (e.g.
/// `WRONGTYPE`: the key holds a hash, list, ...; nothing was written) and
/// [`Error::Indeterminate`].
///
/// # Example
///
/// ```no_run
/// use nolock::cas::{self, Expected, Outcome};
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let outcome = cas::compare_and_set(conn, "job:7", Expected::value("queued"), "running", None).await?;
/// if let Outcome::Mismatch { current } = outcome {
///     println!("someone else moved job 7 to {current:?}");
/// }
/// # Ok(()) }
/// ```
pub async fn compare_and_set<C>(
    conn: &mut C,
    key: &str,
    expected: Expected<'_>,
    new: impl AsRef<[u8]>,
    ttl: Option<Duration>,
) -> Result<Outcome>
where
    C: ConnectionLike + Send,
{
    let op = CompareAndSet::new(key, expected, new.as_ref(), ttl)?;
    if let Expected::Value(expected) = expected {
        if native::set_ifeq() {
            let ttl = ttl_arg(ttl)?;
            if let Some(outcome) = set_ifeq(conn, key, expected, new.as_ref(), ttl).await? {
                return Ok(outcome);
            }
        }
    }
    run_one(&op, conn).await
}

/// `SET key new IFEQ expected PX ttl|KEEPTTL GET` (arguments already
/// checked): the value found decides, as in the script. `None` when the
/// server ran nothing and the script should go instead.
async fn set_ifeq<C>(
    conn: &mut C,
    key: &str,
    expected: &[u8],
    new: &[u8],
    ttl: u64,
) -> Result<Option<Outcome>>
where
    C: ConnectionLike + Send,
{
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(new).arg("IFEQ").arg(expected);
    if ttl > 0 {
        cmd.arg("PX").arg(ttl);
    } else {
        cmd.arg("KEEPTTL");
    }
    cmd.arg("GET");
    match conn
        .req_packed_command(&cmd)
        .await
        .and_then(Value::extract_error)
    {
        Ok(Value::Nil) => Ok(Some(Outcome::Mismatch { current: None })),
        Ok(Value::BulkString(found)) if found == expected => Ok(Some(Outcome::Applied)),
        Ok(Value::BulkString(found)) => Ok(Some(Outcome::Mismatch {
            current: Some(found),
        })),
        Ok(other) => Err(Error::UnexpectedReply {
            script: "SET IFEQ",
            detail: format!("{other:?}"),
        }),
        Err(err) if native::is_unsupported_option(&err) || crate::script::is_resendable(&err) => {
            Ok(None)
        }
        Err(err) => Err(Error::from_redis(err)),
    }
}

/// [`compare_and_set`] as a value: for a [`crate::Batch`], or with an
/// operation id ([`Operation::idempotent`]) so that a write resent after a
/// lost reply answers with the first reply (a plain resend of an applied
/// write would find its own value and answer `Mismatch`). Checked when built.
///
/// ```
/// use nolock::cas::{CompareAndSet, Expected};
/// use nolock::Operation;
///
/// let op = CompareAndSet::new("job:7", Expected::value("queued"), "running", None)?
///     .idempotent("job-7:start")?;
/// assert!(CompareAndSet::new("", Expected::Absent, "x", None).is_err());
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct CompareAndSet {
    call: Invocation,
}

impl CompareAndSet {
    /// Write `new` at `key` only if it holds `expected` (see
    /// [`compare_and_set`]).
    ///
    /// # Errors
    ///
    /// As [`compare_and_set`] before any I/O.
    pub fn new(
        key: &str,
        expected: Expected<'_>,
        new: impl AsRef<[u8]>,
        ttl: Option<Duration>,
    ) -> Result<Self> {
        Ok(CompareAndSet {
            call: compare_and_set_call(key, expected, new.as_ref(), ttl)?,
        })
    }
}

impl Operation for CompareAndSet {
    type Output = Outcome;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<Outcome> {
        decode_outcome(&COMPARE_AND_SET, reply)
    }
}

pub(super) fn compare_and_set_call(
    key: &str,
    expected: Expected<'_>,
    new: &[u8],
    ttl: Option<Duration>,
) -> Result<Invocation> {
    validate::key(key)?;
    let new = validate::value("value", new)?;
    let ttl = ttl_arg(ttl)?;
    let call = Invocation::new(&COMPARE_AND_SET, &[key]).arg(new).arg(ttl);
    Ok(match expected {
        Expected::Absent => call,
        Expected::Value(expected) => call.arg(validate::value("expected", expected)?),
    })
}

/// Write `value` at `key` only if the key does not exist; otherwise return
/// what it holds. One round trip: `INSERT ... ON CONFLICT DO NOTHING` plus
/// the read of the existing row.
///
/// `ttl: Some(d)` makes the inserted value expire after `d`; `None` stores it
/// without expiry. An existing key is never changed (its expiry neither).
///
/// This is the idempotency-key pattern: the first request stores its result
/// (or a "pending" marker, replaced later with [`compare_and_set`]); a retry
/// gets [`Insert::Existing`] with the stored result instead of doing the
/// work again. See the [module docs](crate::cas) for the whole pattern.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ValueTooLarge`],
/// [`Error::ZeroDuration`], [`Error::DurationTooLong`]. From Redis:
/// [`Error::Redis`] (e.g. `WRONGTYPE`) and [`Error::Indeterminate`] (the
/// value may have been inserted: call again, and an [`Insert::Existing`]
/// holding your own value means it was).
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::cas::{self, Insert};
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let day = Some(Duration::from_secs(86_400));
/// match cas::set_if_absent(conn, "idem:7f3a", r#"{"status":201}"#, day).await? {
///     Insert::Inserted => println!("first time: stored"),
///     Insert::Existing(previous) => println!("retry: {}", String::from_utf8_lossy(&previous)),
/// }
/// # Ok(()) }
/// ```
pub async fn set_if_absent<C>(
    conn: &mut C,
    key: &str,
    value: impl AsRef<[u8]>,
    ttl: Option<Duration>,
) -> Result<Insert>
where
    C: ConnectionLike + Send,
{
    run_one(&SetIfAbsent::new(key, value, ttl)?, conn).await
}

/// [`set_if_absent`] as a value, for a [`crate::Batch`] or an operation id.
#[derive(Debug, Clone)]
pub struct SetIfAbsent {
    call: Invocation,
}

impl SetIfAbsent {
    /// Write `value` at `key` only if the key does not exist.
    ///
    /// # Errors
    ///
    /// As [`set_if_absent`] before any I/O.
    pub fn new(key: &str, value: impl AsRef<[u8]>, ttl: Option<Duration>) -> Result<Self> {
        // compare_and_set with nothing expected is exactly insert-if-absent.
        Ok(SetIfAbsent {
            call: compare_and_set_call(key, Expected::Absent, value.as_ref(), ttl)?,
        })
    }
}

impl Operation for SetIfAbsent {
    type Output = Insert;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<Insert> {
        // On a mismatch the key exists, so `current` is always present.
        match decode_outcome(&COMPARE_AND_SET, reply)? {
            Outcome::Applied => Ok(Insert::Inserted),
            Outcome::Mismatch {
                current: Some(existing),
            } => Ok(Insert::Existing(existing)),
            Outcome::Mismatch { current: None } => Err(Error::UnexpectedReply {
                script: COMPARE_AND_SET.name(),
                detail: "mismatch on an absent key".into(),
            }),
        }
    }
}

/// Delete `key` only if it holds `expected`. One round trip.
///
/// The safe release of a token-held key: a plain `DEL` after your lease
/// expired would delete the next holder's key. [`Outcome::Mismatch`] with
/// `current: None` means the key was already gone (expired or deleted).
///
/// The script declares `allow-oom`: releasing works, and frees memory, on a
/// server that is out of memory.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ValueTooLarge`]. From Redis:
/// [`Error::Redis`] (e.g. `WRONGTYPE`) and [`Error::Indeterminate`] (a retry
/// is safe: it deletes only while the key still holds `expected`).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, token: &str) -> nolock::Result<()> {
/// let released = nolock::cas::compare_and_delete(conn, "report:lease", token).await?;
/// if !released.is_applied() {
///     println!("the lease had already expired or passed on: {released:?}");
/// }
/// # Ok(()) }
/// ```
pub async fn compare_and_delete<C>(
    conn: &mut C,
    key: &str,
    expected: impl AsRef<[u8]>,
) -> Result<Outcome>
where
    C: ConnectionLike + Send,
{
    run_one(&CompareAndDelete::new(key, expected)?, conn).await
}

/// [`compare_and_delete`] as a value, for a [`crate::Batch`] or an
/// operation id.
#[derive(Debug, Clone)]
pub struct CompareAndDelete {
    call: Invocation,
}

impl CompareAndDelete {
    /// Delete `key` only if it holds `expected`.
    ///
    /// # Errors
    ///
    /// As [`compare_and_delete`] before any I/O.
    pub fn new(key: &str, expected: impl AsRef<[u8]>) -> Result<Self> {
        Ok(CompareAndDelete {
            call: compare_and_delete_call(key, expected.as_ref())?,
        })
    }
}

impl Operation for CompareAndDelete {
    type Output = Outcome;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<Outcome> {
        decode_outcome(&COMPARE_AND_DELETE, reply)
    }
}

pub(super) fn compare_and_delete_call(key: &str, expected: &[u8]) -> Result<Invocation> {
    validate::key(key)?;
    let expected = validate::value("expected", expected)?;
    Ok(Invocation::new(&COMPARE_AND_DELETE, &[key]).arg(expected))
}

/// Make `key` expire `ttl` from now, only if it holds `expected`. One round
/// trip.
///
/// The safe extension of a token-held lease: a plain `PEXPIRE` after your
/// lease expired would extend the next holder's. `ttl` replaces the current
/// expiry, so it can shorten it too. The script declares `allow-oom`.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ValueTooLarge`],
/// [`Error::ZeroDuration`], [`Error::DurationTooLong`]. From Redis:
/// [`Error::Redis`] and [`Error::Indeterminate`] (a retry is safe).
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, token: &str) -> nolock::Result<()> {
/// let kept = nolock::cas::compare_and_expire(conn, "report:lease", token, Duration::from_secs(30)).await?;
/// if !kept.is_applied() {
///     println!("lease lost; stop before writing anything");
/// }
/// # Ok(()) }
/// ```
pub async fn compare_and_expire<C>(
    conn: &mut C,
    key: &str,
    expected: impl AsRef<[u8]>,
    ttl: Duration,
) -> Result<Outcome>
where
    C: ConnectionLike + Send,
{
    run_one(&CompareAndExpire::new(key, expected, ttl)?, conn).await
}

/// [`compare_and_expire`] as a value, for a [`crate::Batch`] or an
/// operation id.
#[derive(Debug, Clone)]
pub struct CompareAndExpire {
    call: Invocation,
}

impl CompareAndExpire {
    /// Set `key` to expire after `ttl` only if it holds `expected`.
    ///
    /// # Errors
    ///
    /// As [`compare_and_expire`] before any I/O.
    pub fn new(key: &str, expected: impl AsRef<[u8]>, ttl: Duration) -> Result<Self> {
        Ok(CompareAndExpire {
            call: compare_and_expire_call(key, expected.as_ref(), ttl)?,
        })
    }
}

impl Operation for CompareAndExpire {
    type Output = Outcome;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<Outcome> {
        decode_outcome(&COMPARE_AND_EXPIRE, reply)
    }
}

pub(super) fn compare_and_expire_call(
    key: &str,
    expected: &[u8],
    ttl: Duration,
) -> Result<Invocation> {
    validate::key(key)?;
    let expected = validate::value("expected", expected)?;
    let ttl = validate::millis("ttl", ttl)?;
    Ok(Invocation::new(&COMPARE_AND_EXPIRE, &[key])
        .arg(expected)
        .arg(ttl))
}

/// An optional TTL as the scripts' argument: milliseconds, 0 for none.
fn ttl_arg(ttl: Option<Duration>) -> Result<u64> {
    ttl.map_or(Ok(0), |ttl| validate::millis("ttl", ttl))
}

/// `{1}` or `{0, current-or-nil}`.
pub(super) fn decode_outcome(script: &'static Script, value: Value) -> Result<Outcome> {
    let mut reply = Reply::new(script.name(), value)?;
    let outcome = if reply.flag()? {
        Outcome::Applied
    } else {
        Outcome::Mismatch {
            current: reply.bytes()?,
        }
    };
    reply.finish()?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use crate::MAX_TTL;
    use redis::Value::{Array, BulkString, Int, Nil};

    #[test]
    fn compare_and_set_sends_new_ttl_then_the_expected_value() {
        let call = compare_and_set_call(
            "k",
            Expected::value("old"),
            b"new",
            Some(Duration::from_millis(1500)),
        )
        .unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                COMPARE_AND_SET.sha1(),
                "1",
                "k",
                "new",
                "1500",
                "old"
            ]
        );
        // Expecting absence sends no third argument; no TTL is 0.
        let call = compare_and_set_call("k", Expected::Absent, b"", None).unwrap();
        assert_eq!(
            words(call.command()),
            ["EVALSHA", COMPARE_AND_SET.sha1(), "1", "k", "", "0"]
        );
        // An expected empty value is a value, not absence.
        let call = compare_and_set_call("k", Expected::value(""), b"x", None).unwrap();
        assert_eq!(words(call.command()).len(), 7);
    }

    #[test]
    fn delete_and_expire_send_the_expected_value() {
        let call = compare_and_delete_call("k", b"tok").unwrap();
        assert_eq!(
            words(call.command()),
            ["EVALSHA", COMPARE_AND_DELETE.sha1(), "1", "k", "tok"]
        );
        let call = compare_and_expire_call("k", b"tok", Duration::from_secs(2)).unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                COMPARE_AND_EXPIRE.sha1(),
                "1",
                "k",
                "tok",
                "2000"
            ]
        );
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        let some = Some(Duration::from_secs(1));
        assert!(matches!(
            compare_and_set_call("", Expected::Absent, b"v", some),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            compare_and_set_call("k", Expected::Absent, b"v", Some(Duration::ZERO)),
            Err(Error::ZeroDuration { what: "ttl" })
        ));
        assert!(matches!(
            compare_and_set_call("k", Expected::Absent, b"v", Some(MAX_TTL * 2)),
            Err(Error::DurationTooLong { what: "ttl", .. })
        ));
        assert!(matches!(
            compare_and_expire_call("k", b"v", Duration::from_micros(10)),
            Err(Error::ZeroDuration { what: "ttl" })
        ));
        assert!(matches!(
            compare_and_delete_call("", b"v"),
            Err(Error::EmptyKey)
        ));
        let big = vec![0u8; crate::MAX_VALUE_LEN + 1];
        assert!(matches!(
            compare_and_set_call("k", Expected::Absent, &big, None),
            Err(Error::ValueTooLarge { what: "value", .. })
        ));
        assert!(matches!(
            compare_and_set_call("k", Expected::value(&big), b"v", None),
            Err(Error::ValueTooLarge {
                what: "expected",
                ..
            })
        ));
        assert!(matches!(
            compare_and_delete_call("k", &big),
            Err(Error::ValueTooLarge { .. })
        ));
    }

    #[test]
    fn outcomes_decode_with_the_current_value() {
        let d = |v| decode_outcome(&COMPARE_AND_SET, Array(v));
        assert_eq!(d(vec![Int(1)]).unwrap(), Outcome::Applied);
        assert_eq!(
            d(vec![Int(0), BulkString(b"x".to_vec())]).unwrap(),
            Outcome::Mismatch {
                current: Some(b"x".to_vec())
            }
        );
        assert_eq!(
            d(vec![Int(0), Nil]).unwrap(),
            Outcome::Mismatch { current: None }
        );
        assert!(d(vec![Int(1), Nil]).is_err(), "extra field");
        assert!(d(vec![Int(0)]).is_err(), "missing field");
    }
}
