//! A self-renewing permit, and running work under one.

use std::future::Future;
use std::time::Instant;

use redis::aio::ConnectionLike;
use tokio_util::sync::CancellationToken;

use super::release::{extend_holding, release_holding};
use super::{Holding, Permit, PermitExtend, PermitId, PermitRelease};
use crate::renew::{Held, Renewer};
use crate::{Error, Loss, Result, Work};

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
#[must_use = "dropping the lease releases the permit"]
pub struct PermitLease {
    permit: Permit,
    renewer: Renewer,
}

/// What the renewal task of a [`PermitLease`] extends and releases.
struct PermitHeld(Holding);

impl Held for PermitHeld {
    async fn extend<C>(&self, conn: &mut C) -> Result<Option<Instant>>
    where
        C: ConnectionLike + Send,
    {
        Ok(match extend_holding(conn, &self.0).await? {
            PermitExtend::Extended { deadline } => Some(deadline),
            PermitExtend::Lost => None,
        })
    }

    async fn release<C>(&self, conn: &mut C) -> Result<bool>
    where
        C: ConnectionLike + Send,
    {
        Ok(release_holding(conn, &self.0).await? == PermitRelease::Released)
    }
}

impl PermitLease {
    /// Keep `permit` renewed on `conn`. The first renewal is due `ttl / 3`
    /// after the permit was requested.
    ///
    /// # Errors
    ///
    /// [`Error::NoTimer`] outside a Tokio runtime or on one built without
    /// timers (the renewals could not be scheduled). The permit goes with
    /// the error, so it stays held until its TTL: [`super::Semaphore::lease`]
    /// checks for timers before it acquires, and is the way to avoid that.
    pub fn start<C>(conn: C, permit: Permit) -> Result<PermitLease>
    where
        C: ConnectionLike + Send + 'static,
    {
        crate::timer::check()?;
        let held = PermitHeld(permit.holding.clone());
        let renewer = Renewer::start(conn, held, permit.holding.ttl, permit.sent, permit.deadline);
        Ok(PermitLease { permit, renewer })
    }

    /// The semaphore's key.
    pub fn key(&self) -> &str {
        self.permit.key()
    }

    /// The permit, as granted (its deadline moves with [`PermitLease::deadline`]).
    pub fn permit(&self) -> &Permit {
        &self.permit
    }

    /// The current local deadline: the latest confirmed renewal's.
    pub fn deadline(&self) -> Instant {
        self.renewer.deadline()
    }

    /// The time left until [`PermitLease::deadline`] (zero once it has
    /// passed).
    pub fn time_left(&self) -> std::time::Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// Why the permit was lost, once it has been.
    pub fn loss(&self) -> Option<Loss> {
        self.renewer.loss()
    }

    /// True once the permit is lost.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Wait until the permit is lost (forever, if it never is).
    pub async fn lost(&self) -> Loss {
        self.renewer.lost().await
    }

    /// A token cancelled when the permit is lost: hand it to the work.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.renewer.cancellation_token()
    }

    /// Stop the renewals and give the permit back.
    ///
    /// # Errors
    ///
    /// From Redis, as [`Permit::release`] (the permit then expires at its
    /// TTL); [`Error::PermitLost`] if the renewal task itself failed.
    pub async fn release(self) -> Result<PermitRelease> {
        let PermitLease { permit, renewer } = self;
        match renewer.release().await {
            Ok(result) => result.map(|released| {
                if released {
                    PermitRelease::Released
                } else {
                    PermitRelease::Lost
                }
            }),
            Err(error) => Err(Error::PermitLost {
                key: permit.holding.key,
                loss: Loss::RenewalFailed { error },
            }),
        }
    }

    /// Run `work` (given the holder's id) under this lease, then release
    /// it: what became of the hold, in a [`Work`].
    pub async fn run<F, Fut, T>(self, work: F) -> Work<T>
    where
        F: FnOnce(PermitId) -> Fut,
        Fut: Future<Output = T>,
    {
        let work = work(self.permit.id().clone());
        crate::renew::run_under(self, work).await
    }
}

impl crate::renew::Hold for PermitLease {
    fn renewer(&self) -> &Renewer {
        &self.renewer
    }

    async fn give_back(self) -> Result<bool> {
        Ok(self.release().await? == PermitRelease::Released)
    }
}
