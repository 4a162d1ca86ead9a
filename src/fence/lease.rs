//! A self-renewing lease: a grant kept alive by a background task, with a
//! loss signal.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tokio::task::JoinHandle;
use tokio::time::sleep_until;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::retry::acquire_with_retry;
use super::{extend, release, Acquire, Backoff, Extend, Grant, Keys, Release, Token};
use crate::{Error, Result};

/// Why a [`Lease`] was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a lost lease means the work must stop"]
pub enum Loss {
    /// A renewal found the lock gone or under another token: it expired (the
    /// holder was paused past its TTL) or was deleted, and someone else may
    /// hold it now.
    NotHeld,
    /// A renewal failed (an error, or no reply before the lease's deadline).
    /// The lock may still be there, but a failure can also mean the server
    /// restarted or failed over and lost it, so it is presumed lost.
    RenewalFailed {
        /// What went wrong.
        error: String,
    },
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::NotHeld => f.write_str("the lock expired or was taken over"),
            Loss::RenewalFailed { error } => write!(f, "a renewal failed: {error}"),
        }
    }
}

/// A lock that renews itself while you work, and tells you when it is lost.
///
/// A background task (spawned on the current Tokio runtime) extends the lock
/// every `ttl / 3` with the token check of [`extend`]. When a renewal finds
/// the lock gone, fails, or gets no reply before the current deadline, the
/// lease is **lost**: [`Lease::lost`] completes, [`Lease::cancellation_token`]s
/// are cancelled, and [`Lease::loss`] says why. A failed renewal counts as a
/// loss at once, without waiting for the deadline: the failure may be the
/// server restarting or failing over, which can lose the lock. Renewals stop
/// after a loss. A lost lease means another holder may already be running:
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
    shared: Arc<Shared>,
    /// Dropping it (with the lease) tells the task to release and stop.
    stop: DropGuard,
    task: JoinHandle<Result<Release>>,
}

#[derive(Debug)]
struct Shared {
    lost: CancellationToken,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    deadline: Instant,
    loss: Option<Loss>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock; if something did, the state
        // is still a plain pair of values.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lose(&self, loss: Loss) {
        self.state().loss.get_or_insert(loss);
        self.lost.cancel();
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
    /// use nolock::fence::{Acquire, Backoff, Lease};
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
        let shared = Arc::new(Shared {
            lost: CancellationToken::new(),
            state: Mutex::new(State {
                deadline: grant.deadline,
                loss: None,
            }),
        });
        let stop = CancellationToken::new();
        let renewal = Renewal {
            conn,
            resource: resource.to_owned(),
            token: grant.token.clone(),
            ttl: grant.ttl,
            shared: Arc::clone(&shared),
            stop: stop.clone(),
        };
        let first = grant
            .sent
            .checked_add(renewal_period(grant.ttl))
            .unwrap_or(grant.sent);
        let task = tokio::spawn(renewal.run(first));
        Ok(Lease {
            resource: resource.to_owned(),
            grant,
            shared,
            stop: stop.drop_guard(),
            task,
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
        self.shared.state().deadline
    }

    pub(crate) fn grant(&self) -> &Grant {
        &self.grant
    }

    /// Why the lease was lost, or `None` while it holds.
    pub fn loss(&self) -> Option<Loss> {
        self.shared.state().loss.clone()
    }

    /// True once the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Completes when the lease is lost, with the reason. Cancel-safe: use
    /// it in `tokio::select!` beside the work.
    pub async fn lost(&self) -> Loss {
        self.shared.lost.cancelled().await;
        self.loss().unwrap_or(Loss::NotHeld)
    }

    /// A token cancelled when the lease is lost, released or dropped: hand it
    /// to tasks spawned for the work. Cancelling it yourself does not affect
    /// the lease.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
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
            stop,
            task,
            ..
        } = self;
        drop(stop);
        match task.await {
            Ok(result) => result,
            Err(join) => Err(Error::LeaseLost {
                resource,
                fence: grant.fence,
                loss: Loss::RenewalFailed {
                    error: format!("the renewal task ended abnormally: {join}"),
                },
            }),
        }
    }
}

/// Renewals every third of the TTL: one may run up to two periods late and
/// still land before the lock expires.
fn renewal_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// The background task of a [`Lease`].
struct Renewal<C> {
    conn: C,
    resource: String,
    token: Token,
    ttl: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl<C> Renewal<C>
where
    C: ConnectionLike + Send,
{
    async fn run(mut self, first: Instant) -> Result<Release> {
        let result = match self.renew(first).await {
            Some(loss @ Loss::NotHeld) => {
                // Nothing left to release.
                self.shared.lose(loss);
                Ok(Release::Lost)
            }
            Some(loss) => {
                self.shared.lose(loss);
                // The lock may still be ours; release it (token-checked, so
                // harmless if not) once the lease is released or dropped.
                self.stop.cancelled().await;
                release(&mut self.conn, &self.resource, &self.token).await
            }
            None => release(&mut self.conn, &self.resource, &self.token).await,
        };
        self.shared.lost.cancel();
        result
    }

    /// Renew until the lease is stopped (`None`) or lost.
    async fn renew(&mut self, first: Instant) -> Option<Loss> {
        let period = renewal_period(self.ttl);
        let mut next = first;
        loop {
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                _ = sleep_until(next.into()) => {}
            }
            let deadline = self.shared.state().deadline;
            let sent = Instant::now();
            let outcome = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                // A renewal still unanswered at the deadline has failed.
                _ = sleep_until(deadline.into()) => Err(Loss::RenewalFailed {
                    error: "no reply before the lease's deadline".into(),
                }),
                result = extend(&mut self.conn, &self.resource, &self.token, self.ttl) => {
                    result.map_err(|e| Loss::RenewalFailed { error: e.to_string() })
                }
            };
            match outcome {
                Ok(Extend::Extended { deadline }) => {
                    self.shared.state().deadline = deadline;
                    next = sent.checked_add(period).unwrap_or(sent);
                }
                Ok(Extend::Lost) => return Some(Loss::NotHeld),
                Err(loss) => return Some(loss),
            }
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
/// use nolock::fence::{self, Backoff};
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_come_every_third_of_the_ttl() {
        assert_eq!(
            renewal_period(Duration::from_millis(300)),
            Duration::from_millis(100)
        );
        assert_eq!(
            renewal_period(Duration::from_millis(1)),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn losses_explain_themselves() {
        assert_eq!(
            Loss::NotHeld.to_string(),
            "the lock expired or was taken over"
        );
        let e = Loss::RenewalFailed {
            error: "timed out".into(),
        };
        assert_eq!(e.to_string(), "a renewal failed: timed out");
    }
}
