//! The renewal machinery shared by [`crate::fence::Lease`] and
//! [`crate::semaphore::PermitLease`]: a background task that extends a
//! holding every `ttl / 3`, keeps trying through transient failures until
//! the holding's own deadline, signals a loss, and releases on stop.
//!
//! What is renewed is told by a [`Held`]: its `extend` and `release` calls.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tokio::task::JoinHandle;
use tokio::time::sleep_until;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{Error, Result};

/// Why a [`crate::fence::Lease`] or a [`crate::semaphore::PermitLease`] was
/// lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a lost lease means the work must stop"]
pub enum Loss {
    /// A renewal found the holding gone or under another owner: it expired
    /// (the holder was paused past its TTL) or was deleted, and someone else
    /// may hold it now.
    NotHeld,
    /// No renewal was confirmed before the deadline (the server was
    /// unreachable, busy or slow throughout), or a renewal failed with an
    /// error that retrying cannot fix. The holding may still be there, but
    /// past its deadline it is presumed lost.
    RenewalFailed {
        /// What went wrong (the last error).
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

/// What became of work run under a hold: [`crate::fence::Lock::with_lease`]'s
/// lock or [`crate::semaphore::Semaphore::with_permit`]'s permits.
///
/// A loss is an outcome, not an error: the hold ended (it expired while the
/// holder was paused, or could not be renewed) and someone else may have
/// held it meanwhile. Match every arm; only [`Work::Done`] says the work ran
/// under the hold from its start to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a lost hold means the work may have overlapped another holder's"]
pub enum Work<T> {
    /// The work finished while the hold was kept, and the hold was given back.
    Done(T),
    /// The work finished, but the hold had ended before it did (the release
    /// found it expired or taken over): its output may have been produced
    /// beside another holder. Undo or check it if that matters.
    Overran {
        /// What the work returned.
        output: T,
        /// How the hold ended.
        loss: Loss,
    },
    /// The hold was lost while the work ran, and the work was stopped
    /// (its future dropped) at that moment.
    Stopped(Loss),
    /// The hold could not be taken before the backoff's deadline; the work
    /// never started.
    Busy,
}

impl<T> Work<T> {
    /// The output of work that finished under its hold ([`Work::Done`]).
    pub fn done(self) -> Option<T> {
        match self {
            Work::Done(output) => Some(output),
            _ => None,
        }
    }

    /// The loss, for [`Work::Overran`] and [`Work::Stopped`].
    pub fn loss(&self) -> Option<&Loss> {
        match self {
            Work::Overran { loss, .. } | Work::Stopped(loss) => Some(loss),
            Work::Done(_) | Work::Busy => None,
        }
    }
}

/// A holding the renewal task keeps alive: one lock or one semaphore permit.
pub(crate) trait Held: Send + Sync + 'static {
    /// Extend it: `Some(new local deadline)`, or `None` when it is no longer held.
    fn extend<'a, C>(
        &'a self,
        conn: &'a mut C,
    ) -> impl Future<Output = Result<Option<Instant>>> + Send + 'a
    where
        C: ConnectionLike + Send;

    /// Release it: true when it was still held.
    fn release<'a, C>(&'a self, conn: &'a mut C) -> impl Future<Output = Result<bool>> + Send + 'a
    where
        C: ConnectionLike + Send;
}

/// The handle on a running renewal task.
#[derive(Debug)]
pub(crate) struct Renewer {
    shared: Arc<Shared>,
    /// Dropping it (with the lease) tells the task to release and stop.
    stop: DropGuard,
    task: JoinHandle<Result<bool>>,
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
        if self.state().loss.is_none() {
            crate::observe::lease_lost();
        }
        self.state().loss.get_or_insert(loss);
        self.lost.cancel();
    }
}

impl Renewer {
    /// Spawn the task: `held` was granted for `ttl` by a request sent at
    /// `sent`, valid until `deadline`; renewals go over `conn`.
    pub(crate) fn start<C, H>(
        conn: C,
        held: H,
        ttl: Duration,
        sent: Instant,
        deadline: Instant,
    ) -> Renewer
    where
        C: ConnectionLike + Send + 'static,
        H: Held,
    {
        let shared = Arc::new(Shared {
            lost: CancellationToken::new(),
            state: Mutex::new(State {
                deadline,
                loss: None,
            }),
        });
        let stop = CancellationToken::new();
        let renewal = Renewal {
            conn,
            held,
            ttl,
            shared: Arc::clone(&shared),
            stop: stop.clone(),
        };
        let first = sent.checked_add(renewal_period(ttl)).unwrap_or(sent);
        let task = tokio::spawn(renewal.run(first));
        Renewer {
            shared,
            stop: stop.drop_guard(),
            task,
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.shared.state().deadline
    }

    pub(crate) fn loss(&self) -> Option<Loss> {
        self.shared.state().loss.clone()
    }

    pub(crate) async fn lost(&self) -> Loss {
        self.shared.lost.cancelled().await;
        self.loss().unwrap_or(Loss::NotHeld)
    }

    pub(crate) fn cancellation_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Stop renewing, wait for the task, and release: `Ok(true)` when the
    /// holding was still ours. A task that ended abnormally (cancelled at
    /// runtime shutdown, or panicked) is described by the `Err(String)`.
    pub(crate) async fn release(self) -> std::result::Result<Result<bool>, String> {
        let Renewer { stop, task, .. } = self;
        drop(stop);
        task.await
            .map_err(|join| format!("the renewal task ended abnormally: {join}"))
    }
}

/// Renewals every third of the TTL: one may run up to two periods late and
/// still land before the holding expires.
pub(crate) fn renewal_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// The pause before trying a failed renewal again: short against the time
/// left, so several tries fit before the deadline.
fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

/// An error after which trying the renewal again can succeed: the server
/// was busy, loading, between cluster states, or the request's fate is
/// unknown (a timeout, a dropped or refused connection). Anything else (a
/// script's own refusal, `WRONGTYPE`, `NOPERM`) will fail the same way.
fn is_transient(err: &Error) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    match err {
        Error::Indeterminate(_) => true,
        Error::Redis(e) => match e.kind() {
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask,
            ) => true,
            // `BUSY` (a long script) has no kind of its own in redis-rs.
            ErrorKind::Extension => e.code() == Some("BUSY"),
            ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
            _ => false,
        },
        _ => false,
    }
}

/// The background task.
struct Renewal<C, H> {
    conn: C,
    held: H,
    ttl: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl<C, H> Renewal<C, H>
where
    C: ConnectionLike + Send,
    H: Held,
{
    async fn run(mut self, first: Instant) -> Result<bool> {
        let result = match self.renew(first).await {
            Some(loss @ Loss::NotHeld) => {
                // Nothing left to release.
                self.shared.lose(loss);
                Ok(false)
            }
            Some(loss) => {
                self.shared.lose(loss);
                // The holding may still be ours; release it (owner-checked,
                // so harmless if not) once the lease is released or dropped.
                self.stop.cancelled().await;
                self.held.release(&mut self.conn).await
            }
            None => self.held.release(&mut self.conn).await,
        };
        self.shared.lost.cancel();
        result
    }

    /// Renew until stopped (`None`) or lost.
    ///
    /// A renewal that fails transiently ([`is_transient`]) is tried again
    /// after a short pause, for as long as the current deadline allows: one
    /// `BUSY` reply or one slow reply must not end a lease with two thirds of
    /// its TTL left. The lease is lost when a renewal finds it gone, when a
    /// renewal fails for good, or when the deadline passes unconfirmed.
    async fn renew(&mut self, first: Instant) -> Option<Loss> {
        let period = renewal_period(self.ttl);
        let mut next = first;
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                _ = sleep_until(next.into()) => {}
            }
            let deadline = self.shared.state().deadline;
            if Instant::now() >= deadline {
                return Some(Loss::RenewalFailed {
                    error: deadline_passed(last_error.as_deref()),
                });
            }
            let sent = Instant::now();
            let outcome = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                // A renewal still unanswered at the deadline has failed.
                _ = sleep_until(deadline.into()) => {
                    return Some(Loss::RenewalFailed {
                        error: deadline_passed(Some("no reply")),
                    });
                }
                result = self.held.extend(&mut self.conn) => result,
            };
            match outcome {
                Ok(Some(deadline)) => {
                    self.shared.state().deadline = deadline;
                    last_error = None;
                    next = sent.checked_add(period).unwrap_or(sent);
                }
                Ok(None) => return Some(Loss::NotHeld),
                Err(err) if is_transient(&err) => {
                    last_error = Some(err.to_string());
                    let retry = Instant::now() + retry_delay(self.ttl);
                    next = retry.min(deadline);
                }
                Err(err) => {
                    return Some(Loss::RenewalFailed {
                        error: err.to_string(),
                    })
                }
            }
        }
    }
}

fn deadline_passed(last_error: Option<&str>) -> String {
    match last_error {
        Some(error) => format!("no renewal confirmed before the deadline (last: {error})"),
        None => "no renewal confirmed before the deadline".into(),
    }
}

/// A hold that work can run under ([`run_under`]): the fenced lease and the
/// permit lease.
pub(crate) trait Hold: Sized {
    /// Its renewal task.
    fn renewer(&self) -> &Renewer;

    /// Stop renewing and give it back: true when it was still held.
    fn give_back(self) -> impl Future<Output = Result<bool>>;
}

/// Run `work` under `hold`, then give it back: what became of the hold, in
/// a [`Work`]. The work's future is dropped as soon as the hold is lost.
pub(crate) async fn run_under<H, Fut, T>(hold: H, work: Fut) -> Work<T>
where
    H: Hold,
    Fut: Future<Output = T>,
{
    let lost = hold.renewer().cancellation_token();
    let output = tokio::select! {
        // A finished result wins over a loss noticed at the same moment.
        biased;
        output = work => Some(output),
        _ = lost.cancelled() => None,
    };
    let Some(output) = output else {
        // `hold` drops here: its task makes a best-effort release without
        // making the caller wait for an unreachable server.
        return Work::Stopped(hold.renewer().loss().unwrap_or(Loss::NotHeld));
    };
    if let Some(loss) = hold.renewer().loss() {
        return Work::Overran { output, loss };
    }
    match hold.give_back().await {
        Ok(true) => Work::Done(output),
        Ok(false) => Work::Overran {
            output,
            loss: Loss::NotHeld,
        },
        // The release's fate is unknown: the hold may still be there (it
        // expires at its TTL), but nothing says it lasted to the end.
        Err(e) => Work::Overran {
            output,
            loss: Loss::RenewalFailed {
                error: e.to_string(),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::RedisError;

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
        assert_eq!(
            retry_delay(Duration::from_millis(600)),
            Duration::from_millis(30)
        );
        assert_eq!(
            retry_delay(Duration::from_secs(60)),
            Duration::from_millis(100)
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

    #[test]
    fn busy_loading_and_lost_replies_are_worth_another_try() {
        use redis::{ErrorKind, ServerErrorKind as K};
        for kind in [K::BusyLoading, K::TryAgain, K::ClusterDown, K::MasterDown] {
            let err = Error::from_redis(RedisError::from((ErrorKind::Server(kind), "x")));
            assert!(is_transient(&err), "{kind:?}");
        }
        for kind in [K::ResponseError, K::NoPerm] {
            let err = Error::from_redis(RedisError::from((ErrorKind::Server(kind), "x")));
            assert!(!is_transient(&err), "{kind:?}");
        }
        let ext = |code: &str| Error::from_redis(redis::make_extension_error(code.into(), None));
        assert!(is_transient(&ext("BUSY")));
        assert!(!is_transient(&ext("WRONGTYPE")) && !is_transient(&ext("OOM")));
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(is_transient(&Error::from_redis(timeout)));
        assert!(!is_transient(&Error::EmptyKey));
    }
}
