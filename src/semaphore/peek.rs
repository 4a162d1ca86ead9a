//! Reading a semaphore: [`PeekSemaphore`].

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{Semaphore, SemaphoreUsage};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::{validate, Result};

pub(super) static PEEK: Script = embedded!("semaphore/peek");

/// Permits in use, holders and the next expiry of the semaphore at `key`;
/// writes nothing (`EVALSHA_RO`, a replica can serve it). A read needs no
/// configuration, so it is also this free function.
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] when the key holds
/// something that is not a semaphore (every member is checked).
pub async fn peek<C>(conn: &mut C, key: &str) -> Result<SemaphoreUsage>
where
    C: ConnectionLike + Send,
{
    run_one(&PeekSemaphore::new(key)?, conn).await
}

/// [`super::Semaphore::peek`] as a value, for a [`crate::Batch`]: read-only
/// (`EVALSHA_RO`), so a replica can serve it.
#[derive(Debug, Clone)]
pub struct PeekSemaphore {
    call: Invocation,
}

impl PeekSemaphore {
    /// Read the semaphore at `key`.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`] before any I/O.
    pub fn new(key: &str) -> Result<Self> {
        validate::key(key)?;
        Ok(PeekSemaphore {
            call: Invocation::new(&PEEK, &[key]),
        })
    }

    /// Read it as `semaphore` does: a set tagged with another size is
    /// refused ([`Error::StateMismatch`]) unless `semaphore` adopts.
    pub(super) fn sized(semaphore: &Semaphore, key: &str) -> Result<Self> {
        validate::key(key)?;
        let mut call = Invocation::new(&PEEK, &[key]).arg(semaphore.permits());
        if semaphore.adopts() {
            call = call.arg("adopt");
        }
        Ok(PeekSemaphore { call })
    }
}

impl Operation for PeekSemaphore {
    type Output = SemaphoreUsage;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<SemaphoreUsage> {
        let mut reply = Reply::new(PEEK.name(), reply)?;
        let usage = SemaphoreUsage {
            in_use: reply.uint()?,
            holders: reply.uint()?,
            next_expiry: u64::try_from(reply.int()?).ok().map(Duration::from_millis),
        };
        reply.finish()?;
        Ok(usage)
    }
}
