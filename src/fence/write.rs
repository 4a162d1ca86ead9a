//! Fenced writes to a Redis resource.

use redis::aio::ConnectionLike;

use crate::script::{embedded, Invocation, Reply, Script};
use crate::{validate, Error, Result};

static WRITE: Script = embedded!("fence/write");
static READ: Script = embedded!("fence/read");

/// The outcome of [`write()`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a stale write means the lease is over: stop the work"]
pub enum Write {
    /// The value is stored, with the writer's fence.
    Applied,
    /// A newer grant has already written: nothing was stored. The writer's
    /// lease is over (it was paused past its TTL, or lost it); it must stop
    /// and must not retry.
    Stale {
        /// The fence stored with the resource, greater than the writer's.
        current_fence: u64,
    },
}

/// A fenced resource as read by [`read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    /// The stored value.
    pub value: Vec<u8>,
    /// The fence of the grant that wrote it.
    pub fence: u64,
}

/// Store `value` at `key` with `fence`, unless the resource already carries a
/// greater fence.
///
/// `key` is the protected resource itself (e.g. `balance:42`), a hash with the
/// fields `value` and `fence`, written only through this function; it is
/// independent of the lock's resource name. An **equal** fence is accepted, so
/// the holder of one grant may write several times (a multi-step update, or a
/// retry after [`Error::Indeterminate`]: the repeat is harmless). A lower
/// fence is refused with [`Write::Stale`]. One round trip; compare and write
/// are atomic.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`fence == 0`:
/// no grant has fence 0), [`Error::ValueTooLarge`] (above
/// [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN)). From Redis: [`Error::Redis`] (the key is not a
/// hash, or a hash without a valid fence field; nothing was written) and
/// [`Error::Indeterminate`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant)
/// #     -> nolock::Result<()> {
/// use nolock::fence::{self, Write};
/// match fence::write(conn, "balance:42", grant.fence, "1700").await? {
///     Write::Applied => {}
///     Write::Stale { current_fence } => {
///         eprintln!("superseded by grant {current_fence}; stopping");
///         return Ok(());
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn write<C>(conn: &mut C, key: &str, fence: u64, value: impl AsRef<[u8]>) -> Result<Write>
where
    C: ConnectionLike + Send,
{
    let call = write_call(key, fence, value.as_ref())?;
    let reply = call.run(conn).await?;
    decode_write(reply)
}

fn write_call(key: &str, fence: u64, value: &[u8]) -> Result<Invocation> {
    validate::key(key)?;
    if fence == 0 {
        return Err(Error::ZeroLimit { what: "fence" });
    }
    let value = validate::value("value", value)?;
    // Sent as decimal digits; the script compares them as digits, exactly.
    Ok(Invocation::new(&WRITE, &[key])
        .arg(fence.to_string())
        .arg(value))
}

fn decode_write(value: redis::Value) -> Result<Write> {
    let mut reply = Reply::new(WRITE.name(), value)?;
    let applied = reply.flag()?;
    let current_fence = reply.uint()?;
    reply.finish()?;
    Ok(if applied {
        Write::Applied
    } else {
        Write::Stale { current_fence }
    })
}

/// Read the fenced resource at `key`: its value and the fence that wrote it,
/// or `None` when it does not exist.
///
/// Runs with `EVALSHA_RO`, so a connection routed to a replica can serve it.
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] (the key is not a
/// fenced resource) and [`Error::Indeterminate`] from Redis. Safe to retry.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// if let Some(balance) = nolock::fence::read(conn, "balance:42").await? {
///     println!("{} (written under fence {})", String::from_utf8_lossy(&balance.value), balance.fence);
/// }
/// # Ok(()) }
/// ```
pub async fn read<C>(conn: &mut C, key: &str) -> Result<Option<Fenced>>
where
    C: ConnectionLike + Send,
{
    validate::key(key)?;
    let value = Invocation::new(&READ, &[key]).run(conn).await?;
    let mut reply = Reply::new(READ.name(), value)?;
    let value = reply.bytes()?;
    let fence = reply.uint()?;
    reply.finish()?;
    Ok(value.map(|value| Fenced { value, fence }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn the_fence_is_sent_as_exact_digits() {
        let call = write_call("acct", u64::MAX, b"v").unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                WRITE.sha1(),
                "1",
                "acct",
                "18446744073709551615",
                "v"
            ]
        );
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        assert!(matches!(write_call("", 1, b""), Err(Error::EmptyKey)));
        assert!(matches!(
            write_call("k", 0, b""),
            Err(Error::ZeroLimit { what: "fence" })
        ));
    }

    #[test]
    fn a_value_redis_would_refuse_is_rejected_before_a_command_is_built() {
        // Above proto-max-bulk-len the server drops the connection (and every
        // other request in flight on it); cas refuses such values up front too.
        let big = vec![0u8; crate::MAX_VALUE_LEN + 1];
        assert!(matches!(
            write_call("k", 1, &big),
            Err(Error::ValueTooLarge { what: "value", .. })
        ));
        assert!(write_call("k", 1, &big[..crate::MAX_VALUE_LEN]).is_ok());
    }

    #[test]
    fn replies_decode_to_applied_or_stale() {
        let applied = Array(vec![Int(1), BulkString(b"7".to_vec())]);
        assert_eq!(decode_write(applied).unwrap(), Write::Applied);
        let stale = Array(vec![Int(0), BulkString(b"9007199254740993".to_vec())]);
        assert_eq!(
            decode_write(stale).unwrap(),
            Write::Stale {
                current_fence: 9_007_199_254_740_993
            }
        );
    }
}
