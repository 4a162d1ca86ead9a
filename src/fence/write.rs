//! Fenced writes to a Redis resource: [`Fence::write`],
//! [`Fence::write_unbound`], [`read`], [`read_unbound`], [`WriteFenced`],
//! [`ReadFenced`].

use redis::aio::ConnectionLike;

use super::{Fence, FenceSource, Keys};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::{validate, Result};

static WRITE: Script = embedded!("fence/write");
static WRITE_HELD: Script = embedded!("fence/write_held");
static READ: Script = embedded!("fence/read");

/// The outcome of [`Fence::write`] and [`Fence::write_unbound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a stale write means the lease is over: stop the work"]
// Non-exhaustive: it gained `NotGranted` already; every outcome but `Applied`
// means nothing was stored, so a `_` arm can always stop the work.
#[non_exhaustive]
pub enum Write {
    /// The value is stored, with the writer's fence.
    Applied,
    /// A newer grant exists (for [`Fence::write`], whether or not it has
    /// written yet; for [`Fence::write_unbound`], it has written): nothing was stored. The
    /// writer's lease is over (it was paused past its TTL, or lost it); it
    /// must stop and must not retry.
    Stale {
        /// The resource's fence counter, or the fence stored with the value,
        /// whichever refused the write: greater than the writer's.
        current_fence: u64,
    },
    /// The writer's fence is above the resource's fence counter: no grant
    /// ever carried it. Either the fence was not taken from a
    /// [`super::Grant`] (a made-up [`Fence::from_message`]), or the counter
    /// went back (Redis restarted without persistence or failed over to a
    /// lagging replica; see [`super::durability`]). Nothing was stored; the
    /// writer must stop. Only [`Fence::write`] returns this.
    NotGranted {
        /// The resource's fence counter (0 when it does not exist); for a
        /// [`FenceSource::PerSlot`] fence, the fence its lock holds.
        counter: u64,
    },
    /// Only for a [`FenceSource::PerSlot`] fence: the resource's lock no
    /// longer holds it (the lease expired or was released, and no newer
    /// grant holds the lock either; or the lock holds a value nolock did not
    /// write). Nothing was stored; the lease is over: stop.
    Ended,
}

impl Write {
    /// True for [`Write::Applied`].
    pub fn is_applied(&self) -> bool {
        matches!(self, Write::Applied)
    }
}

/// A fenced value as read by [`read`] and [`read_unbound`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Fenced {
    /// The stored value.
    pub value: Vec<u8>,
    /// The fence of the grant that wrote it.
    pub fence: u64,
}

impl Fence {
    /// Store `value` as the protected value of the fence's resource, only
    /// under the newest grant of its lock.
    ///
    /// The value lives in a hash at `keys::derive(resource, "value")`
    /// (fields `value` and `fence`), in the slot of the resource's lock and
    /// counter, so one atomic script compares this fence with the
    /// resource's **fence counter** and writes:
    ///
    /// * equal to the counter (the newest grant): [`Write::Applied`], also
    ///   when that grant writes again (a multi-step update, or a retry after
    ///   [`Error::Indeterminate`]: the repeat is harmless);
    /// * below it: [`Write::Stale`]. A newer grant exists, **even if it has
    ///   not written yet**, so a holder paused past its lease cannot slip a
    ///   write in before its successor's first one;
    /// * above it: [`Write::NotGranted`]. No grant has that fence (see
    ///   there).
    ///
    /// The value is also never written under a fence below the one stored
    /// with it. One round trip. For a value that must live elsewhere
    /// (another slot, a key you name), [`Fence::write_unbound`] is the
    /// weaker form.
    ///
    /// A fence drawn per slot ([`FenceSource::PerSlot`]) is compared with
    /// the fence the resource's **lock** holds instead (a shared counter
    /// says nothing of one resource): equal, [`Write::Applied`]; the lock
    /// holds a greater one, [`Write::Stale`]; a smaller one,
    /// [`Write::NotGranted`]; the lock is free, [`Write::Ended`]. Such a
    /// grant writes only while its lease lives.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::ValueTooLarge`] (above
    /// [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN)). From Redis: [`Error::Redis`]
    /// (the value key is not a hash, a hash without a valid fence field, or
    /// a counter that is not a canonical decimal; nothing was written) and
    /// [`Error::Indeterminate`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant)
    /// #     -> nolock::Result<()> {
    /// use nolock::fence::Write;
    /// match grant.fence().write(conn, "1700").await? {
    ///     Write::Applied => {}
    ///     Write::Stale { current_fence } => {
    ///         eprintln!("superseded by grant {current_fence}; stopping");
    ///         return Ok(());
    ///     }
    ///     Write::NotGranted { counter } => {
    ///         eprintln!("fence above the counter ({counter}): did Redis lose it?");
    ///         return Ok(());
    ///     }
    ///     // `Write` may gain outcomes; only `Applied` stored the value.
    ///     _ => return Ok(()),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn write<C>(&self, conn: &mut C, value: impl AsRef<[u8]>) -> Result<Write>
    where
        C: ConnectionLike + Send,
    {
        run_one(&WriteFenced::new(self, value)?, conn).await
    }

    /// The **weaker** fenced write, for a value at a key of your choice (in
    /// any slot): compares the fence only with the fence stored with the
    /// value.
    ///
    /// `key` is a hash with the fields `value` and `fence`, written only
    /// through this call. A fence not below the stored one is accepted. What
    /// this form cannot see, because it does not read the lock's counter:
    ///
    /// * a holder paused past its lease still writes (and is told
    ///   [`Write::Applied`]) as long as its successor has not written yet;
    ///   the successor's first write then replaces it;
    /// * a fence no grant carried (above the counter) is accepted, and then
    ///   turns every real fence below it [`Write::Stale`].
    ///
    /// Use [`Fence::write`] unless the value cannot live in the resource's
    /// slot.
    ///
    /// # Errors
    ///
    /// As [`Fence::write`], and [`Error::EmptyKey`] before any I/O.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, grant: nolock::fence::Grant)
    /// #     -> nolock::Result<()> {
    /// let out = grant.fence().write_unbound(conn, "report:latest", "...").await?;
    /// if !out.is_applied() {
    ///     return Ok(()); // a newer grant has written: stop
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn write_unbound<C>(
        &self,
        conn: &mut C,
        key: &str,
        value: impl AsRef<[u8]>,
    ) -> Result<Write>
    where
        C: ConnectionLike + Send,
    {
        run_one(&WriteFenced::unbound(self, key, value)?, conn).await
    }
}

/// [`Fence::write`] and [`Fence::write_unbound`] as values: for a
/// [`crate::Batch`], or with an operation id.
#[derive(Debug, Clone)]
pub struct WriteFenced {
    call: Invocation,
    script: &'static Script,
}

impl WriteFenced {
    /// Write `value` to `fence`'s resource under `fence` ([`Fence::write`]).
    ///
    /// # Errors
    ///
    /// As [`Fence::write`], before any I/O.
    pub fn new(fence: &Fence, value: impl AsRef<[u8]>) -> Result<Self> {
        let keys = Keys::of(fence.resource())?;
        let value = validate::value("value", value.as_ref())?;
        // A slot fence says nothing against the shared counter: it is
        // checked against the fence the lock holds (lua/fence/write_held.lua).
        let (script, check) = match fence.source() {
            FenceSource::PerResource => (&WRITE, &keys.fence),
            FenceSource::PerSlot => (&WRITE_HELD, &keys.lock),
        };
        // Sent as decimal digits; the script compares them as digits, exactly.
        Ok(WriteFenced {
            call: Invocation::new(script, &[&keys.value, check])
                .arg(fence.number().to_string())
                .arg(value),
            script,
        })
    }

    /// Write `value` at `key` under `fence` ([`Fence::write_unbound`]).
    ///
    /// # Errors
    ///
    /// As [`Fence::write_unbound`], before any I/O.
    pub fn unbound(fence: &Fence, key: &str, value: impl AsRef<[u8]>) -> Result<Self> {
        validate::key(key)?;
        let value = validate::value("value", value.as_ref())?;
        Ok(WriteFenced {
            call: Invocation::new(&WRITE, &[key])
                .arg(fence.number().to_string())
                .arg(value),
            script: &WRITE,
        })
    }
}

impl Operation for WriteFenced {
    type Output = Write;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Write> {
        decode_write(self.script, reply)
    }
}

fn decode_write(script: &'static Script, value: redis::Value) -> Result<Write> {
    // fence/write answers statuses 0..3, fence/write_held also 3 (ended).
    let held = std::ptr::eq(script, &WRITE_HELD);
    decode_status(script, value, if held { 4 } else { 3 })
}

/// A fenced write's reply `{status, fence}` (status below `statuses`: 1
/// applied, 0 stale, 2 not granted, 3 ended), as every fenced-write script
/// answers it (`semaphore/write_fenced` too).
pub(crate) fn decode_status(
    script: &'static Script,
    value: redis::Value,
    statuses: i64,
) -> Result<Write> {
    let mut reply = Reply::new(script.name(), value)?;
    let status = reply.code(statuses)?;
    let fence = reply.uint()?;
    reply.finish()?;
    Ok(match status {
        1 => Write::Applied,
        0 => Write::Stale {
            current_fence: fence,
        },
        2 => Write::NotGranted { counter: fence },
        _ => Write::Ended,
    })
}

/// Read the value of `resource` written by [`Fence::write`], and the fence
/// that wrote it, or `None` when it has none.
///
/// Runs with `EVALSHA_RO`, so a connection routed to a replica can serve it.
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] (the key is not a
/// fenced value) and [`Error::Indeterminate`] from Redis. Safe to retry.
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
pub async fn read<C>(conn: &mut C, resource: &str) -> Result<Option<Fenced>>
where
    C: ConnectionLike + Send,
{
    run_one(&ReadFenced::new(resource)?, conn).await
}

/// Read a value written by [`Fence::write_unbound`] at `key`.
///
/// # Errors
///
/// As [`read`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let latest = nolock::fence::read_unbound(conn, "report:latest").await?;
/// # Ok(()) }
/// ```
pub async fn read_unbound<C>(conn: &mut C, key: &str) -> Result<Option<Fenced>>
where
    C: ConnectionLike + Send,
{
    run_one(&ReadFenced::unbound(key)?, conn).await
}

/// [`read`] and [`read_unbound`] as values, for a [`crate::Batch`]
/// (read-only: `EVALSHA_RO`, a replica can serve it).
#[derive(Debug, Clone)]
pub struct ReadFenced {
    call: Invocation,
}

impl ReadFenced {
    /// Read `resource`'s value ([`read`]).
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`] before any I/O.
    pub fn new(resource: &str) -> Result<Self> {
        let keys = Keys::of(resource)?;
        Ok(ReadFenced {
            call: Invocation::new(&READ, &[&keys.value]),
        })
    }

    /// Read the value at `key` ([`read_unbound`]).
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`] before any I/O.
    pub fn unbound(key: &str) -> Result<Self> {
        validate::key(key)?;
        Ok(ReadFenced {
            call: Invocation::new(&READ, &[key]),
        })
    }
}

impl Operation for ReadFenced {
    type Output = Option<Fenced>;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<Option<Fenced>> {
        let mut reply = Reply::new(READ.name(), value)?;
        let value = reply.bytes()?;
        let fence = reply.uint()?;
        reply.finish()?;
        Ok(value.map(|value| Fenced { value, fence }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, BulkString, Int};

    fn fence(number: u64) -> Fence {
        Fence::granted("acct", number)
    }

    #[test]
    fn the_fence_is_sent_as_exact_digits() {
        let op = WriteFenced::new(&fence(u64::MAX), b"v").unwrap();
        assert_eq!(
            words(op.invocation().command()),
            [
                "EVALSHA",
                WRITE.sha1(),
                "2",
                "{acct}:value",
                "{acct}:fence",
                "18446744073709551615",
                "v"
            ]
        );
        let op = WriteFenced::unbound(&fence(7), "elsewhere", b"v").unwrap();
        assert_eq!(
            words(op.invocation().command()),
            ["EVALSHA", WRITE.sha1(), "1", "elsewhere", "7", "v"]
        );
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        assert!(matches!(
            WriteFenced::unbound(&fence(1), "", b""),
            Err(crate::Error::EmptyKey)
        ));
        assert!(matches!(ReadFenced::new(""), Err(crate::Error::EmptyKey)));
        assert!(matches!(
            ReadFenced::unbound(""),
            Err(crate::Error::EmptyKey)
        ));
    }

    #[test]
    fn a_value_redis_would_refuse_is_rejected_before_a_command_is_built() {
        // Above proto-max-bulk-len the server drops the connection (and every
        // other request in flight on it); cas refuses such values up front too.
        let big = vec![0u8; crate::MAX_VALUE_LEN + 1];
        assert!(matches!(
            WriteFenced::new(&fence(1), &big),
            Err(crate::Error::ValueTooLarge { what: "value", .. })
        ));
        assert!(WriteFenced::new(&fence(1), &big[..crate::MAX_VALUE_LEN]).is_ok());
    }

    #[test]
    fn replies_decode_to_applied_stale_or_not_granted() {
        let applied = Array(vec![Int(1), BulkString(b"7".to_vec())]);
        assert_eq!(decode_write(&WRITE, applied).unwrap(), Write::Applied);
        let stale = Array(vec![Int(0), BulkString(b"9007199254740993".to_vec())]);
        assert_eq!(
            decode_write(&WRITE, stale).unwrap(),
            Write::Stale {
                current_fence: 9_007_199_254_740_993
            }
        );
        let ahead = Array(vec![Int(2), BulkString(b"0".to_vec())]);
        assert_eq!(
            decode_write(&WRITE, ahead).unwrap(),
            Write::NotGranted { counter: 0 }
        );
        let odd = Array(vec![Int(3), BulkString(b"0".to_vec())]);
        assert!(matches!(
            decode_write(&WRITE, odd.clone()),
            Err(crate::Error::UnexpectedReply { .. })
        ));
        assert_eq!(decode_write(&WRITE_HELD, odd).unwrap(), Write::Ended);
        let beyond = Array(vec![Int(4), BulkString(b"0".to_vec())]);
        assert!(decode_write(&WRITE_HELD, beyond).is_err());
    }

    #[test]
    fn a_slot_fence_is_checked_against_the_lock() {
        let slot = fence(5).with_source(FenceSource::PerSlot);
        assert_eq!(
            words(WriteFenced::new(&slot, "v").unwrap().invocation().command()),
            [
                "EVALSHA",
                WRITE_HELD.sha1(),
                "2",
                "{acct}:value",
                "{acct}:lock",
                "5",
                "v"
            ]
        );
        assert_eq!(
            words(
                WriteFenced::new(&fence(5), "v")
                    .unwrap()
                    .invocation()
                    .command()
            )[4],
            "{acct}:fence"
        );
    }
}
