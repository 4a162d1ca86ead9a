//! Giving permits back and keeping them: [`release`], [`ReleasePermit`], [`extend`].

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

#[cfg(doc)]
use super::PermitLease;
use super::{ttl_millis, Extend, Permit, Release};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::{validate, Result};

pub(super) static RELEASE: Script = embedded!("semaphore/release");
pub(super) static EXTEND: Script = embedded!("semaphore/extend");

/// Give back `permit`'s permits of the semaphore at `key`, and only those.
///
/// Never removes another holder's permit, however late it arrives. Declared
/// `allow-oom`, so it works on a full server. Safe to retry after
/// [`Error::Indeterminate`] (a repeat answers [`Release::Lost`]).
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::Redis`] (the key holds
/// something that is not a semaphore) and [`Error::Indeterminate`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit)
/// #     -> nolock::Result<()> {
/// use nolock::semaphore::{self, Release};
/// if semaphore::release(conn, "exports", &permit).await? == Release::Lost {
///     eprintln!("ran past the permit's ttl: another export may have run alongside");
/// }
/// # Ok(()) }
/// ```
pub async fn release<C>(conn: &mut C, key: &str, permit: &Permit) -> Result<Release>
where
    C: ConnectionLike + Send,
{
    run_one(&ReleasePermit::new(key, permit)?, conn).await
}

/// [`release`] as a value, for a [`crate::Batch`].
#[derive(Debug, Clone)]
pub struct ReleasePermit {
    call: Invocation,
}

impl ReleasePermit {
    /// Give back `permit`'s permits of the semaphore at `key`.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`].
    pub fn new(key: &str, permit: &Permit) -> Result<Self> {
        validate::key(key)?;
        Ok(ReleasePermit {
            call: Invocation::new(&RELEASE, &[key])
                .arg(permit.id.as_str())
                .arg(permit.weight),
        })
    }
}

impl Operation for ReleasePermit {
    type Output = Release;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Release> {
        let mut reply = Reply::new(RELEASE.name(), reply)?;
        let released = reply.flag()?;
        reply.finish()?;
        Ok(if released {
            Release::Released
        } else {
            Release::Lost
        })
    }
}

/// Set `permit`'s permits to expire `ttl` from now, only if none has expired.
///
/// An expired permit is not brought back (its place may be someone else's).
/// Declared `allow-oom`. [`PermitLease`] calls this every `ttl / 3`.
///
/// # Errors
///
/// [`Error::EmptyKey`], [`Error::ZeroDuration`], [`Error::DurationTooLong`]
/// before any I/O; [`Error::Redis`] and [`Error::Indeterminate`] (an
/// extension is idempotent: retrying is safe).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit)
/// #     -> nolock::Result<()> {
/// use nolock::semaphore::{self, Extend};
/// if let Extend::Lost = semaphore::extend(conn, "exports", &permit, permit.ttl).await? {
///     return Ok(()); // stop: the permit expired
/// }
/// # Ok(()) }
/// ```
pub async fn extend<C>(conn: &mut C, key: &str, permit: &Permit, ttl: Duration) -> Result<Extend>
where
    C: ConnectionLike + Send,
{
    validate::key(key)?;
    let ttl_ms = ttl_millis(ttl)?;
    let sent = Instant::now();
    let value = Invocation::new(&EXTEND, &[key])
        .arg(permit.id.as_str())
        .arg(permit.weight)
        .arg(ttl_ms)
        .run(conn)
        .await?;
    let mut reply = Reply::new(EXTEND.name(), value)?;
    let extended = reply.flag()?;
    reply.finish()?;
    Ok(if extended {
        Extend::Extended {
            deadline: crate::fence::deadline(sent, Duration::from_millis(ttl_ms)),
        }
    } else {
        Extend::Lost
    })
}
