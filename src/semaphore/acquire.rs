//! Taking permits: [`acquire`], [`acquire_weighted`], [`TryAcquire`].

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

#[cfg(doc)]
use super::{acquire_with_retry, MAX_PERMITS, MAX_PERMIT_TTL};
use super::{check_permits, ttl_millis, Acquire, Permit, PermitId};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::{validate, Result};

pub(super) static ACQUIRE: Script = embedded!("semaphore/acquire");

/// Take one permit of the semaphore at `key` (of size `permits`) for `ttl`,
/// if one is free.
///
/// One round trip. A full semaphore is not an error: it returns
/// [`Acquire::Full`] with when a permit will surely come back. Expired
/// permits are reclaimed first.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] and
/// [`Error::OutOfRange`] (`permits` 0 or above [`MAX_PERMITS`]),
/// [`Error::ZeroDuration`], [`Error::DurationTooLong`] (`ttl` above
/// [`MAX_PERMIT_TTL`]), [`Error::Entropy`]. From Redis: [`Error::Redis`]
/// (`OOM`, or the key holds something that is not a semaphore; nothing was
/// written) and [`Error::Indeterminate`] (the permit may have been taken
/// under an id you never saw; it expires after `ttl`. [`acquire_with_retry`]
/// retries with the same id).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::semaphore::{self, Acquire, Release};
///
/// match semaphore::acquire(conn, "payments:tenant:7", 3, Duration::from_secs(10)).await? {
///     Acquire::Acquired(permit) => {
///         // ... call the payment provider ...
///         if semaphore::release(conn, "payments:tenant:7", &permit).await? == Release::Lost {
///             eprintln!("the permit expired while working");
///         }
///     }
///     Acquire::Full { retry_after, .. } => println!("3 calls running; retry in {retry_after:?}"),
/// }
/// # Ok(()) }
/// ```
pub async fn acquire<C>(conn: &mut C, key: &str, permits: u64, ttl: Duration) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    run_one(&TryAcquire::new(key, permits, ttl)?, conn).await
}

/// Take `weight` permits at once, all or nothing (a big job that counts as
/// three small ones).
///
/// # Errors
///
/// As [`acquire`], plus [`Error::ZeroLimit`] for `weight == 0` and
/// [`Error::InsufficientCapacity`] when `weight > permits` (never possible,
/// unlike "not now").
pub async fn acquire_weighted<C>(
    conn: &mut C,
    key: &str,
    permits: u64,
    weight: u64,
    ttl: Duration,
) -> Result<Acquire>
where
    C: ConnectionLike + Send,
{
    run_one(&TryAcquire::weighted(key, permits, weight, ttl)?, conn).await
}

/// [`acquire`] and [`acquire_weighted`] as a value, for a [`crate::Batch`],
/// or with an id of your own ([`TryAcquire::with_id`]). The input is checked
/// when it is built.
///
/// The permit's deadline counts from when the value was **built**, so build
/// it just before running it (an earlier build only makes the deadline more
/// conservative).
///
/// ```
/// use std::time::Duration;
/// use nolock::semaphore::TryAcquire;
///
/// let op = TryAcquire::new("exports", 10, Duration::from_secs(30))?;
/// assert!(TryAcquire::weighted("exports", 10, 11, Duration::from_secs(30)).is_err());
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TryAcquire {
    call: Invocation,
    id: PermitId,
    weight: u64,
    ttl: Duration,
    pub(super) built: Instant,
}

impl TryAcquire {
    /// One permit of `permits`, for `ttl`, under a fresh random id.
    ///
    /// # Errors
    ///
    /// As [`acquire`] before any I/O.
    pub fn new(key: &str, permits: u64, ttl: Duration) -> Result<Self> {
        Self::weighted(key, permits, 1, ttl)
    }

    /// `weight` permits of `permits` at once, for `ttl`, under a fresh id.
    ///
    /// # Errors
    ///
    /// As [`acquire_weighted`] before any I/O.
    pub fn weighted(key: &str, permits: u64, weight: u64, ttl: Duration) -> Result<Self> {
        Self::check(key, permits, weight, ttl)?;
        Self::with_id(key, &PermitId::random()?, permits, weight, ttl)
    }

    /// As [`TryAcquire::weighted`], under `id`. While `id` still holds its
    /// permits unexpired, running this again grants them again with a fresh
    /// expiry (no second set): after an [`Error::Indeterminate`], retry with
    /// the same id to learn whether the first call took them.
    ///
    /// # Errors
    ///
    /// As [`acquire_weighted`] before any I/O (without [`Error::Entropy`]).
    pub fn with_id(
        key: &str,
        id: &PermitId,
        permits: u64,
        weight: u64,
        ttl: Duration,
    ) -> Result<Self> {
        let ttl_ms = Self::check(key, permits, weight, ttl)?;
        let call = Invocation::new(&ACQUIRE, &[key])
            .arg(id.as_str())
            .arg(permits)
            .arg(weight)
            .arg(ttl_ms);
        Ok(TryAcquire {
            call,
            id: id.clone(),
            weight,
            ttl: Duration::from_millis(ttl_ms),
            built: Instant::now(),
        })
    }

    pub(super) fn check(key: &str, permits: u64, weight: u64, ttl: Duration) -> Result<u64> {
        validate::key(key)?;
        check_permits(permits, weight)?;
        ttl_millis(ttl)
    }

    /// The id the permit is (or would be) held under.
    pub fn id(&self) -> &PermitId {
        &self.id
    }
}

impl Operation for TryAcquire {
    type Output = Acquire;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Acquire> {
        let mut reply = Reply::new(ACQUIRE.name(), reply)?;
        let outcome = if reply.flag()? {
            let _in_use = reply.uint()?;
            Acquire::Acquired(Permit {
                id: self.id.clone(),
                weight: self.weight,
                ttl: self.ttl,
                deadline: crate::fence::deadline(self.built, self.ttl),
                sent: self.built,
            })
        } else {
            Acquire::Full {
                retry_after: Duration::from_millis(reply.uint()?),
                in_use: reply.uint()?,
            }
        };
        reply.finish()?;
        Ok(outcome)
    }
}
