//! A self-renewing lease: a grant kept alive by a background task, with a
//! loss signal.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tokio_util::sync::CancellationToken;

use super::retry::acquire_with_retry;
use super::{extend, release, Acquire, Extend, Grant, Keys, Release, Token};
use crate::renew::{Held, Renewer};
use crate::Backoff;
use crate::{Error, Result};

use crate::Loss;

/// A lock that renews itself while you work, and tells you when it is lost.
///
/// A background task (spawned on the current Tokio runtime) extends the lock
/// every `ttl / 3` with the token check of [`extend`]. A renewal that fails
/// for a passing reason (`BUSY`, `LOADING`, `TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN`, a refused connection, or a reply lost or late, whose fate
/// is unknown) is tried again shortly after, for as long as the lease's
/// [`Lease::deadline`] allows: a blip does not end a lease with two thirds of
/// its TTL left. The lease is **lost** when a renewal finds the lock gone
/// ([`Loss::NotHeld`]), when the deadline passes with no renewal confirmed,
/// or when a renewal fails in a way retrying cannot fix
/// ([`Loss::RenewalFailed`]): [`Lease::lost`] completes,
/// [`Lease::cancellation_token`]s are cancelled, and [`Lease::loss`] says
/// why. Renewals stop after a loss. A lost lease means another holder may already be running:
/// stop, and rely on the fence ([`Lease::fence`]) at the resource for
/// anything written.
///
/// **Ending a lease**: [`Lease::release`] stops the renewals, waits for the
/// task to finish (no renewal is sent after it returns) and deletes the lock.
/// **Dropping** a lease never blocks: it stops the renewals, and the
/// background task makes one best-effort release on its own (if the runtime
/// is shutting down, or Redis does not answer, the lock simply expires at its
/// TTL). Either way the cancellation tokens are cancelled at the end.
///
/// The task owns its connection: pass a clone of a `MultiplexedConnection` or
/// `ConnectionManager` (cheap; they share one socket), or a pooled
/// connection, which returns to its pool when the lease ends.
#[derive(Debug)]
#[must_use = "dropping a lease releases the lock at once"]
pub struct Lease {
    resource: String,
    grant: Grant,
    renewer: Renewer,
}

/// What the renewal task of a [`Lease`] extends and releases.
struct LockHeld {
    resource: String,
    token: Token,
    ttl: Duration,
}

impl Held for LockHeld {
    async fn extend<C>(&self, conn: &mut C) -> Result<Option<Instant>>
    where
        C: ConnectionLike + Send,
    {
        Ok(
            match extend(conn, &self.resource, &self.token, self.ttl).await? {
                Extend::Extended { deadline } => Some(deadline),
                Extend::Lost => None,
            },
        )
    }

    async fn release<C>(&self, conn: &mut C) -> Result<bool>
    where
        C: ConnectionLike + Send,
    {
        Ok(release(conn, &self.resource, &self.token).await? == Release::Released)
    }
}

impl Lease {
    /// Acquire `resource` for `ttl` (waiting per `backoff` while it is held)
    /// and keep it renewed on `conn` until released or dropped.
    ///
    /// # Errors
    ///
    /// As [`super::acquire_with_retry`]. A lock still held when the backoff
    /// runs out is [`Acquire::Held`], not an error. [`Error::NoTimer`] before
    /// any I/O outside a Tokio runtime or on one built without timers.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::fence::{Acquire, Lease};
    /// use nolock::Backoff;
    ///
    /// let Acquire::Acquired(lease) =
    ///     Lease::acquire(conn.clone(), "reindex", Duration::from_secs(10), &Backoff::none()).await?
    /// else {
    ///     return Ok(()); // someone else is reindexing
    /// };
    /// tokio::select! {
    ///     _ = reindex(lease.fence()) => {}
    ///     loss = lease.lost() => eprintln!("stopped reindexing: {loss}"),
    /// }
    /// lease.release().await?;
    /// # Ok(()) }
    /// # async fn reindex(_fence: u64) {}
    /// ```
    pub async fn acquire<C>(
        mut conn: C,
        resource: &str,
        ttl: Duration,
        backoff: &Backoff,
    ) -> Result<Acquire<Lease>>
    where
        C: ConnectionLike + Send + 'static,
    {
        // The renewals sleep: refuse before taking a lock nobody would renew.
        crate::timer::check()?;
        Ok(
            match acquire_with_retry(&mut conn, resource, ttl, backoff).await? {
                Acquire::Acquired(grant) => Acquire::Acquired(Lease::start(conn, resource, grant)?),
                Acquire::Held { expires_in } => Acquire::Held { expires_in },
            },
        )
    }

    /// Keep an existing `grant` on `resource` (from [`super::acquire`] or
    /// [`super::acquire_as`]) renewed on `conn`. The first renewal is due
    /// `ttl / 3` after the grant was requested.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`]; [`Error::NoTimer`] outside a Tokio runtime or on
    /// one built without timers (the renewals could not be scheduled).
    pub fn start<C>(conn: C, resource: &str, grant: Grant) -> Result<Lease>
    where
        C: ConnectionLike + Send + 'static,
    {
        Keys::of(resource)?;
        crate::timer::check()?;
        let held = LockHeld {
            resource: resource.to_owned(),
            token: grant.token.clone(),
            ttl: grant.ttl,
        };
        let renewer = Renewer::start(conn, held, grant.ttl, grant.sent, grant.deadline);
        Ok(Lease {
            resource: resource.to_owned(),
            grant,
            renewer,
        })
    }

    /// The resource name the lease is on.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The owner token.
    pub fn token(&self) -> &Token {
        &self.grant.token
    }

    /// The fencing token of this lease: pass it to every write it protects.
    pub fn fence(&self) -> u64 {
        self.grant.fence
    }

    /// The TTL each renewal sets.
    pub fn ttl(&self) -> Duration {
        self.grant.ttl
    }

    /// A conservative local bound on the lock's expiry, moved forward by
    /// every confirmed renewal.
    pub fn deadline(&self) -> Instant {
        self.renewer.deadline()
    }

    pub(crate) fn grant(&self) -> &Grant {
        &self.grant
    }

    /// Why the lease was lost, or `None` while it holds.
    pub fn loss(&self) -> Option<Loss> {
        self.renewer.loss()
    }

    /// True once the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Completes when the lease is lost, with the reason. Cancel-safe: use
    /// it in `tokio::select!` beside the work.
    pub async fn lost(&self) -> Loss {
        self.renewer.lost().await
    }

    /// A token cancelled when the lease is lost, released or dropped: hand it
    /// to tasks spawned for the work. Cancelling it yourself does not affect
    /// the lease.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.renewer.cancellation_token()
    }

    /// Stop renewing and delete the lock if it is still ours.
    ///
    /// Returns once the background task has ended, so no renewal reaches
    /// Redis after this returns. [`Release::Lost`] when the lock had already
    /// expired or been taken.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] / [`Error::Indeterminate`] from the release itself
    /// (the lock then expires at its TTL); [`Error::LeaseLost`] with
    /// [`Loss::RenewalFailed`] if the background task was cancelled (the
    /// runtime is shutting down) or panicked.
    pub async fn release(self) -> Result<Release> {
        let Lease {
            resource,
            grant,
            renewer,
        } = self;
        match renewer.release().await {
            Ok(result) => result.map(|released| {
                if released {
                    Release::Released
                } else {
                    Release::Lost
                }
            }),
            Err(error) => Err(Error::LeaseLost {
                resource,
                fence: grant.fence,
                loss: Loss::RenewalFailed { error },
            }),
        }
    }
}

/// Run `work` under a lease on `resource`: acquire it (waiting per
/// `backoff`), keep it renewed, **cancel the work** (drop its future) if the
/// lease is lost, and release it when the work ends.
///
/// `work` gets the [`Grant`]; pass `grant.fence` to every write it makes.
/// Returns `Ok(Some(output))` when the work finished (even if the release
/// after it failed: the lock then expires at its TTL), `Ok(None)` when the
/// lock stayed held by someone else until `backoff.timeout`, and
/// [`Error::LeaseLost`] when the lease was lost first.
///
/// Dropping a future stops it at its next `.await`; work it spawned keeps
/// running. For that, use [`Lease`] and its [`Lease::cancellation_token`].
///
/// # Errors
///
/// [`Error::LeaseLost`]; otherwise as [`Lease::acquire`] (including
/// [`Error::NoTimer`] before any I/O on a runtime without timers).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::fence;
/// use nolock::Backoff;
///
/// let mut writer = conn.clone();
/// let outcome = fence::with_lease(
///     conn,
///     "balance:42:lock",
///     Duration::from_secs(5),
///     &Backoff::new(Duration::from_secs(1)),
///     |grant| async move { fence::write(&mut writer, "balance:42", grant.fence, "1700").await },
/// )
/// .await?;
/// match outcome {
///     Some(write) => println!("{:?}", write?),
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
pub async fn with_lease<C, F, Fut, T>(
    conn: C,
    resource: &str,
    ttl: Duration,
    backoff: &Backoff,
    work: F,
) -> Result<Option<T>>
where
    C: ConnectionLike + Send + 'static,
    F: FnOnce(Grant) -> Fut,
    Fut: Future<Output = T>,
{
    let lease = match Lease::acquire(conn, resource, ttl, backoff).await? {
        Acquire::Acquired(lease) => lease,
        Acquire::Held { .. } => return Ok(None),
    };
    let lost = lease.cancellation_token();
    let work = work(lease.grant().clone());
    let output = tokio::select! {
        // A finished result wins over a loss noticed at the same moment.
        biased;
        output = work => Some(output),
        _ = lost.cancelled() => None,
    };
    match output {
        Some(output) => {
            // The work is done; a failed release only leaves the lock to its TTL.
            let _ = lease.release().await;
            Ok(Some(output))
        }
        None => Err(Error::LeaseLost {
            resource: lease.resource().to_owned(),
            fence: lease.fence(),
            loss: lease.loss().unwrap_or(Loss::NotHeld),
        }),
        // `lease` drops here: its task makes a best-effort release without
        // making the caller wait for an unreachable server.
    }
}
