//! A self-renewing permit, and running work under one.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tokio_util::sync::CancellationToken;

use super::retry::acquire_with_retry;
use super::{extend, release, Acquire, Extend, Permit, Release};
use crate::renew::{Held, Renewer};
use crate::Backoff;
use crate::Loss;
use crate::{validate, Error, Result};

/// A permit that renews itself while you work, and tells you when it is lost.
///
/// The same machinery as [`crate::fence::Lease`]: a background task (on the
/// current Tokio runtime) extends the permit every `ttl / 3`, tries again
/// through passing failures (`BUSY`, `LOADING`, lost replies) until the
/// permit's deadline, and signals a loss when a renewal finds the permit
/// expired ([`Loss::NotHeld`]) or the deadline passes unconfirmed
/// ([`Loss::RenewalFailed`]). [`PermitLease::release`] stops the renewals
/// and gives the permit back; dropping the lease does the same in the
/// background, without blocking.
///
/// The task owns its connection: pass a clone of a `MultiplexedConnection`
/// or `ConnectionManager`, or a pooled connection.
#[derive(Debug)]
pub struct PermitLease {
    key: String,
    permit: Permit,
    renewer: Renewer,
}

/// What the renewal task of a [`PermitLease`] extends and releases.
struct PermitHeld {
    key: String,
    permit: Permit,
}

impl Held for PermitHeld {
    async fn extend<C>(&self, conn: &mut C) -> Result<Option<Instant>>
    where
        C: ConnectionLike + Send,
    {
        Ok(
            match extend(conn, &self.key, &self.permit, self.permit.ttl).await? {
                Extend::Extended { deadline } => Some(deadline),
                Extend::Lost => None,
            },
        )
    }

    async fn release<C>(&self, conn: &mut C) -> Result<bool>
    where
        C: ConnectionLike + Send,
    {
        Ok(release(conn, &self.key, &self.permit).await? == Release::Released)
    }
}

impl PermitLease {
    /// Take a permit of the semaphore at `key` (waiting per `backoff`, see
    /// [`super::acquire_with_retry`]) and keep it renewed on `conn` until
    /// released or dropped.
    ///
    /// # Errors
    ///
    /// As [`super::acquire_with_retry`]. A semaphore still full when the
    /// backoff runs out is [`Acquire::Full`], not an error.
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime, like `tokio::spawn`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::Backoff;
    /// use nolock::semaphore::{Acquire, PermitLease};
    ///
    /// let Acquire::Acquired(lease) =
    ///     PermitLease::acquire(conn, "exports", 10, Duration::from_secs(10), &Backoff::none()).await?
    /// else {
    ///     return Ok(()); // 10 exports running
    /// };
    /// tokio::select! {
    ///     _ = export() => {}
    ///     loss = lease.lost() => eprintln!("stopped the export: {loss}"),
    /// }
    /// let _ = lease.release().await?;
    /// # Ok(()) }
    /// # async fn export() {}
    /// ```
    pub async fn acquire<C>(
        mut conn: C,
        key: &str,
        permits: u64,
        ttl: Duration,
        backoff: &Backoff,
    ) -> Result<Acquire<PermitLease>>
    where
        C: ConnectionLike + Send + 'static,
    {
        Ok(
            match acquire_with_retry(&mut conn, key, permits, ttl, backoff).await? {
                Acquire::Acquired(permit) => {
                    Acquire::Acquired(PermitLease::start(conn, key, permit)?)
                }
                Acquire::Full {
                    retry_after,
                    in_use,
                } => Acquire::Full {
                    retry_after,
                    in_use,
                },
            },
        )
    }

    /// Keep an existing `permit` of the semaphore at `key` renewed on
    /// `conn`. The first renewal is due `ttl / 3` after it was requested.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`].
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime, like `tokio::spawn`.
    pub fn start<C>(conn: C, key: &str, permit: Permit) -> Result<PermitLease>
    where
        C: ConnectionLike + Send + 'static,
    {
        validate::key(key)?;
        let held = PermitHeld {
            key: key.to_owned(),
            permit: permit.clone(),
        };
        let renewer = Renewer::start(conn, held, permit.ttl, permit.sent, permit.deadline);
        Ok(PermitLease {
            key: key.to_owned(),
            permit,
            renewer,
        })
    }

    /// The semaphore's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The permit as granted.
    pub fn permit(&self) -> &Permit {
        &self.permit
    }

    /// A conservative local bound on the permit's expiry, moved forward by
    /// every confirmed renewal.
    pub fn deadline(&self) -> Instant {
        self.renewer.deadline()
    }

    /// Why the permit was lost, or `None` while it holds.
    pub fn loss(&self) -> Option<Loss> {
        self.renewer.loss()
    }

    /// True once the permit is lost.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Completes when the permit is lost, with the reason. Cancel-safe.
    pub async fn lost(&self) -> Loss {
        self.renewer.lost().await
    }

    /// A token cancelled when the permit is lost, released or dropped.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.renewer.cancellation_token()
    }

    /// Stop renewing and give the permit back if it is still held.
    ///
    /// Returns once the background task has ended (no renewal is sent
    /// after this returns). [`Release::Lost`] when it had already expired.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] / [`Error::Indeterminate`] from the release itself
    /// (the permit then expires at its TTL); [`Error::PermitLost`] if the
    /// background task was cancelled (runtime shutdown) or panicked.
    pub async fn release(self) -> Result<Release> {
        let PermitLease { key, renewer, .. } = self;
        match renewer.release().await {
            Ok(result) => result.map(|released| {
                if released {
                    Release::Released
                } else {
                    Release::Lost
                }
            }),
            Err(error) => Err(Error::PermitLost {
                key,
                loss: Loss::RenewalFailed { error },
            }),
        }
    }
}

/// Run `work` under a permit of the semaphore at `key` (of size `permits`):
/// acquire it (waiting per `backoff`), keep it renewed, **cancel the work**
/// (drop its future) if the permit is lost, and release it when the work
/// ends.
///
/// Returns `Ok(Some(output))` when the work finished, `Ok(None)` when the
/// semaphore stayed full until `backoff.timeout`, and [`Error::PermitLost`]
/// when the permit was lost first (the work may have been partly done).
///
/// # Errors
///
/// [`Error::PermitLost`]; otherwise as [`super::acquire_with_retry`].
///
/// # Panics
///
/// When called outside a Tokio runtime, like `tokio::spawn`.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::Backoff;
///
/// let out = nolock::semaphore::with_permit(
///     conn,
///     "payments:tenant:7",
///     3,
///     Duration::from_secs(10),
///     &Backoff::new(Duration::from_secs(2)),
///     |_permit| async { 42 },
/// )
/// .await?;
/// assert!(out.is_none() || out == Some(42));
/// # Ok(()) }
/// ```
pub async fn with_permit<C, F, Fut, T>(
    conn: C,
    key: &str,
    permits: u64,
    ttl: Duration,
    backoff: &Backoff,
    work: F,
) -> Result<Option<T>>
where
    C: ConnectionLike + Send + 'static,
    F: FnOnce(Permit) -> Fut,
    Fut: Future<Output = T>,
{
    let lease = match PermitLease::acquire(conn, key, permits, ttl, backoff).await? {
        Acquire::Acquired(lease) => lease,
        Acquire::Full { .. } => return Ok(None),
    };
    let lost = lease.cancellation_token();
    let work = work(lease.permit().clone());
    let output = tokio::select! {
        // A finished result wins over a loss noticed at the same moment.
        biased;
        output = work => Some(output),
        _ = lost.cancelled() => None,
    };
    match output {
        Some(output) => {
            // The work is done; a failed release only leaves the permit to its TTL.
            let _ = lease.release().await;
            Ok(Some(output))
        }
        None => Err(Error::PermitLost {
            key: lease.key().to_owned(),
            loss: lease.loss().unwrap_or(Loss::NotHeld),
        }),
    }
}
