//! Monotonic integers: values that only move up (high-water marks) or only
//! move down (low-water marks).

use redis::{aio::ConnectionLike, Value};

use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Result};

static WATERMARK: Script = embedded!("cas/watermark");

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
    run_one(&SetIfGreater::new(key, value)?, conn).await
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
    run_one(&SetIfLess::new(key, value)?, conn).await
}

/// The operation values of the two directions: a checked call, decoded as a
/// [`Watermark`].
macro_rules! watermark_op {
    ($name:ident, $direction:literal, $call:ident) => {
        #[doc = concat!("[`", stringify!($call), "`] as a value, for a [`crate::Batch`] or an operation id.")]
        #[derive(Debug, Clone)]
        pub struct $name {
            call: Invocation,
        }

        impl $name {
            #[doc = concat!("Store `value` at `key` if it is ", $direction, " than what is there (see [`", stringify!($call), "`]).")]
            ///
            /// # Errors
            ///
            /// [`crate::Error::EmptyKey`] before any I/O.
            pub fn new(key: &str, value: i64) -> Result<Self> {
                Ok($name {
                    call: watermark_call(key, value, $direction)?,
                })
            }
        }

        impl Operation for $name {
            type Output = Watermark;

            fn invocation(&self) -> &Invocation {
                &self.call
            }

            fn decode(&self, reply: Value) -> Result<Watermark> {
                decode_watermark(reply)
            }
        }
    };
}

watermark_op!(SetIfGreater, "greater", set_if_greater);
watermark_op!(SetIfLess, "less", set_if_less);

/// Both directions run `lua/cas/watermark.lua`; `direction` is `"greater"`
/// or `"less"`.
fn watermark_call(key: &str, value: i64, direction: &'static str) -> Result<Invocation> {
    validate::key(key)?;
    Ok(Invocation::new(&WATERMARK, &[key])
        .arg(value)
        .arg(direction))
}

/// `{applied, stored}`, stored as a decimal string.
fn decode_watermark(value: Value) -> Result<Watermark> {
    let mut reply = Reply::new(WATERMARK.name(), value)?;
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
        let call = watermark_call("k", i64::MIN, "less").unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                WATERMARK.sha1(),
                "1",
                "k",
                "-9223372036854775808",
                "less"
            ]
        );
        assert!(matches!(
            watermark_call("", 1, "greater"),
            Err(Error::EmptyKey)
        ));
    }

    #[test]
    fn stored_values_decode_exactly() {
        let mark = decode_watermark(Array(vec![
            Int(0),
            BulkString(b"9223372036854775807".to_vec()),
        ]))
        .unwrap();
        assert_eq!(
            mark,
            Watermark {
                applied: false,
                value: i64::MAX
            }
        );
        assert!(decode_watermark(Array(vec![Int(1)])).is_err());
    }
}
