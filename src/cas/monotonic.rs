//! Monotonic integers: values that only move up (high-water marks) or only
//! move down (low-water marks).

use redis::{aio::ConnectionLike, Value};

use crate::script::{embedded, Invocation, Reply, Script};
use crate::{validate, Result};

static SET_IF_GREATER: Script = embedded!("cas/set_if_greater");
static SET_IF_LESS: Script = embedded!("cas/set_if_less");

/// The outcome of [`set_if_greater`] and [`set_if_less`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a stale value was not stored"]
pub struct Watermark {
    /// True when the value was stored (the key was missing, or the value
    /// moved it in the allowed direction).
    pub applied: bool,
    /// The value stored after the call: the new one when applied, else the
    /// one that was kept.
    pub value: i64,
}

/// Store `value` at `key` only if it is greater than the stored integer (or
/// the key is missing). One round trip.
///
/// For high-water marks: the last processed offset, the newest timestamp or
/// sequence number seen. However many writers race, in whatever order, the
/// stored value never goes down. An equal value is not stored. The
/// comparison is exact over all of `i64`; the key's expiry is kept.
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O. [`Error::Redis`] when the key holds
/// something other than a decimal `i64` (it is left alone);
/// [`Error::Indeterminate`] (a retry is safe: storing the same mark twice
/// is harmless).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let mark = nolock::cas::set_if_greater(conn, "orders:last-seq", 1042).await?;
/// println!("applied: {}, high-water mark: {}", mark.applied, mark.value);
/// # Ok(()) }
/// ```
///
/// [`Error::EmptyKey`]: crate::Error::EmptyKey
/// [`Error::Redis`]: crate::Error::Redis
/// [`Error::Indeterminate`]: crate::Error::Indeterminate
pub async fn set_if_greater<C>(conn: &mut C, key: &str, value: i64) -> Result<Watermark>
where
    C: ConnectionLike + Send,
{
    let call = watermark_call(&SET_IF_GREATER, key, value)?;
    decode_watermark(&SET_IF_GREATER, call.run(conn).await?)
}

/// Store `value` at `key` only if it is less than the stored integer (or the
/// key is missing). One round trip.
///
/// For low-water marks: the earliest deadline, the lowest bid, the oldest
/// pending sequence number. The stored value never goes up; an equal value is
/// not stored. Exact over all of `i64`; the key's expiry is kept.
///
/// # Errors
///
/// As [`set_if_greater`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let best = nolock::cas::set_if_less(conn, "auction:9:lowest-bid", 1_250).await?;
/// if !best.applied {
///     println!("outbid: the lowest bid is {}", best.value);
/// }
/// # Ok(()) }
/// ```
pub async fn set_if_less<C>(conn: &mut C, key: &str, value: i64) -> Result<Watermark>
where
    C: ConnectionLike + Send,
{
    let call = watermark_call(&SET_IF_LESS, key, value)?;
    decode_watermark(&SET_IF_LESS, call.run(conn).await?)
}

fn watermark_call(script: &'static Script, key: &str, value: i64) -> Result<Invocation> {
    validate::key(key)?;
    Ok(Invocation::new(script, &[key]).arg(value))
}

/// `{applied, stored}`, stored as a decimal string.
fn decode_watermark(script: &'static Script, value: Value) -> Result<Watermark> {
    let mut reply = Reply::new(script.name(), value)?;
    let mark = Watermark {
        applied: reply.flag()?,
        value: reply.int()?,
    };
    reply.finish()?;
    Ok(mark)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use crate::Error;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn the_command_carries_the_value_in_decimal() {
        let call = watermark_call(&SET_IF_LESS, "k", i64::MIN).unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                SET_IF_LESS.sha1(),
                "1",
                "k",
                "-9223372036854775808"
            ]
        );
        assert!(matches!(
            watermark_call(&SET_IF_GREATER, "", 1),
            Err(Error::EmptyKey)
        ));
    }

    #[test]
    fn stored_values_decode_exactly() {
        let mark = decode_watermark(
            &SET_IF_GREATER,
            Array(vec![Int(0), BulkString(b"9223372036854775807".to_vec())]),
        )
        .unwrap();
        assert_eq!(
            mark,
            Watermark {
                applied: false,
                value: i64::MAX
            }
        );
        assert!(decode_watermark(&SET_IF_GREATER, Array(vec![Int(1)])).is_err());
    }
}
