//! A self-renewing lease: a grant kept alive by a background task, with a
//! loss signal.

use std::future::Future;
use std::time::Instant;

use redis::aio::ConnectionLike;
use tokio_util::sync::CancellationToken;

use super::grant::Holder;
use super::{Fence, Grant, LockExtend, LockRelease, Token};
use crate::renew::{Held, Renewer};
use crate::{Error, Loss, Result, Work};

/// A lock that renews itself while you work, and tells you when it is lost.
///
/// A background task (spawned on the current Tokio runtime) extends the lock
/// every `ttl / 3` with the check of [`Grant::extend`]. A renewal that fails
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
    grant: Grant,
    renewer: Renewer,
}

impl Held for Holder {
    async fn extend<C>(&self, conn: &mut C) -> Result<Option<Instant>>
    where
        C: ConnectionLike + Send,
    {
        Ok(match Holder::extend(self, conn).await? {
            LockExtend::Extended { deadline } => Some(deadline),
            LockExtend::Lost => None,
        })
    }

    async fn release<C>(&self, conn: &mut C) -> Result<bool>
    where
        C: ConnectionLike + Send,
    {
        Ok(Holder::release(self, conn).await? == LockRelease::Released)
    }
}

impl Lease {
    /// Keep an existing `grant` (from [`super::Lock::acquire`]) renewed on
    /// `conn`. The first renewal is due `ttl / 3` after the grant was
    /// requested.
    ///
    /// # Errors
    ///
    /// [`Error::NoTimer`] outside a Tokio runtime or on one built without
    /// timers (the renewals could not be scheduled). The grant goes with
    /// the error, so the lock stays held until its TTL: [`super::Lock::lease`]
    /// checks for timers before it acquires, and is the way to avoid that.
    pub fn start<C>(conn: C, grant: Grant) -> Result<Lease>
    where
        C: ConnectionLike + Send + 'static,
    {
        crate::timer::check()?;
        let renewer = Renewer::start(
            conn,
            grant.holder(),
            grant.ttl(),
            grant.sent(),
            grant.deadline(),
        );
        Ok(Lease { grant, renewer })
    }

    /// The resource name the lease is on.
    pub fn resource(&self) -> &str {
        self.grant.resource()
    }

    /// The owner token.
    pub fn token(&self) -> &Token {
        self.grant.token()
    }

    /// The fence of this lease: pass it to every write it protects.
    pub fn fence(&self) -> &Fence {
        self.grant.fence()
    }

    /// The TTL each renewal sets.
    pub fn ttl(&self) -> std::time::Duration {
        self.grant.ttl()
    }

    /// A conservative local bound on the lock's expiry, moved forward by
    /// every confirmed renewal.
    pub fn deadline(&self) -> Instant {
        self.renewer.deadline()
    }

    /// The time left until [`Lease::deadline`] (zero once it has passed).
    pub fn time_left(&self) -> std::time::Duration {
        self.deadline().saturating_duration_since(Instant::now())
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
    /// Redis after this returns. [`LockRelease::Lost`] when the lock had
    /// already expired or been taken.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] / [`Error::Indeterminate`] from the release itself
    /// (the lock then expires at its TTL); [`Error::LeaseLost`] with
    /// [`Loss::RenewalFailed`] if the background task was cancelled (the
    /// runtime is shutting down) or panicked.
    pub async fn release(self) -> Result<LockRelease> {
        let Lease { grant, renewer } = self;
        match renewer.release().await {
            Ok(result) => result.map(|released| {
                if released {
                    LockRelease::Released
                } else {
                    LockRelease::Lost
                }
            }),
            Err(error) => Err(Error::LeaseLost {
                resource: grant.resource().to_owned(),
                fence: grant.fence().number(),
                loss: Loss::RenewalFailed { error },
            }),
        }
    }

    /// Run `work` (given the lease's [`Fence`]) under this lease, then
    /// release it: what became of the hold, in a [`Work`] (see
    /// [`super::Lock::with_lease`]).
    pub async fn run<F, Fut, T>(self, work: F) -> Work<T>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = T>,
    {
        let work = work(self.fence().clone());
        crate::renew::run_under(self, work).await
    }
}

impl crate::renew::Hold for Lease {
    fn renewer(&self) -> &Renewer {
        &self.renewer
    }

    async fn give_back(self) -> Result<bool> {
        Ok(self.release().await? == LockRelease::Released)
    }
}
