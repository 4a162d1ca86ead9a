//! Reading a semaphore: [`peek`], [`Peek`].

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::Usage;
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::{validate, Result};

pub(super) static PEEK: Script = embedded!("semaphore/peek");

/// Read the semaphore at `key` without changing it (expired permits are
/// counted out, not removed).
///
/// Runs with `EVALSHA_RO` (replicas may serve it, and may lag). It reads
/// every permit held: O(permits in use).
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] (not a semaphore)
/// and [`Error::Indeterminate`]. A read is safe to retry.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let usage = nolock::semaphore::peek(conn, "exports").await?;
/// println!("{} running, {} free", usage.holders, usage.free(10));
/// # Ok(()) }
/// ```
pub async fn peek<C>(conn: &mut C, key: &str) -> Result<Usage>
where
    C: ConnectionLike + Send,
{
    run_one(&Peek::new(key)?, conn).await
}

/// [`peek`] as a value, for a [`crate::Batch`].
#[derive(Debug, Clone)]
pub struct Peek {
    call: Invocation,
}

impl Peek {
    /// Read the semaphore at `key`.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`].
    pub fn new(key: &str) -> Result<Self> {
        validate::key(key)?;
        Ok(Peek {
            call: Invocation::new(&PEEK, &[key]),
        })
    }
}

impl Operation for Peek {
    type Output = Usage;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Usage> {
        let mut reply = Reply::new(PEEK.name(), reply)?;
        let usage = Usage {
            in_use: reply.uint()?,
            holders: reply.uint()?,
            next_expiry: u64::try_from(reply.int()?).ok().map(Duration::from_millis),
        };
        reply.finish()?;
        Ok(usage)
    }
}
