//! [`Leader`]: one process at a time holds a named role, for a fenced
//! [`Term`]; the others campaign until it is free.
//!
//! Built on the fenced lock alone: a term is a [`Lease`] on the role's
//! name, its number is the lease's [`Fence`], and everything the lock
//! promises (and does not) carries over. No script of its own.
//!
//! Past the house's ~500 lines because of its docs: what a leader may
//! assume is the contract of the election and stays beside its types; the
//! code itself is about 300 lines.

use std::future::Future;
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

#[cfg(doc)]
use super::Write;
use super::{Fence, Keys, Lease, Lock, LockAttempt, LockRelease, Token};
use crate::{Backoff, Error, Loss, Result};

/// Leader election for a named role: among the processes that campaign for
/// it, at most one holds a **term** at a time, and every term has a greater
/// [`Fence`] than the one before.
///
/// A term is a lease ([`Lock::lease`]) on the role's name, renewed every
/// `ttl / 3` in the background. [`Leader::campaign`] keeps campaigning in a
/// background task: it tries to take the lease, and while another process
/// holds it, tries again after a jittered sleep (the campaign backoff, never
/// past the holder's expiry). When the lease is lost ([`Loss::NotHeld`]:
/// it expired or was taken over; [`Loss::RenewalFailed`]: no renewal was
/// confirmed before its deadline), the term ends at once (its
/// [`Term::cancellation_token`]s are cancelled) and the process campaigns
/// again after a backoff. Transitions are published on a
/// [`tokio::sync::watch`] channel as a [`Role`]. [`Campaign::step_down`]
/// (or dropping the [`Campaign`]) ends the term and releases the lease, so
/// another process takes over within one campaign sleep instead of waiting
/// out the TTL. [`Leader::run`] does all of this around a closure.
///
/// An acknowledged lock ([`Lock::acknowledged`]) gives acknowledged terms:
/// a term starts only once a replica has confirmed its grant, so a failover
/// to that replica does not hand the same fence out again.
///
/// # What a leader may assume
///
/// **Only this: a write made through a fence check with the term's fence
/// is refused once a later term exists.** [`Fence::write`] (the value at
/// `{role}:value`, checked against the role's fence counter) answers
/// [`Write::Stale`] as soon as a later term has been *granted*, whether or
/// not it has written; a conditional SQL write (`... WHERE fence < $term`)
/// refuses it once a later term has *written* that row. So two leaders'
/// fenced writes never both land out of order, whatever pauses happen.
/// ([`Fence::write_unbound`] is weaker: an old term's write still lands
/// until a later term has written that key.)
///
/// **Nothing about time.** Between two renewals a leader does not know it is
/// still the leader. [`Term::ended`] and the cancellation tokens fire when a
/// renewal finds the lease gone or when the lease's local deadline (taken
/// before each renewal was sent, less a 1% + 2 ms drift allowance) passes
/// unconfirmed, but only if the process *runs*: a leader stopped by a GC
/// pause, `SIGSTOP`, a stalled VM or a starved runtime past its TTL wakes up
/// still believing it leads, and a second leader may already have been
/// elected. A check of [`Term::is_over`], of the deadline or of the wall
/// clock just before a side effect narrows that window and never closes it.
/// Anything not guarded by a fence (an email, a call to a payment provider,
/// a write to a store that does not compare fences) can be done by two
/// leaders; make it idempotent or fence it at the resource.
///
/// The fence itself is only as good as the counter's promise never to go
/// back: see the module's "Limits of a Redis fence" (persistence,
/// failover, [`Lock::acknowledged`]).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// use nolock::fence::{Leader, Lock, Role, Write};
///
/// let compactor = Leader::new("compactor", Lock::new(Duration::from_secs(10))?)?;
/// let campaign = compactor.campaign(conn.clone())?;
/// let mut roles = campaign.watch();
/// tokio::spawn(async move {
///     while roles.changed().await.is_ok() {
///         match &*roles.borrow_and_update() {
///             Role::Leader(term) => println!("leading, term {}", term.number()),
///             Role::Lost { term, loss } => println!("lost term {}: {loss}", term.number()),
///             other => println!("{other:?}"),
///         }
///     }
/// });
/// while let Some(term) = campaign.elected().await {
///     let mut conn = conn.clone();
///     tokio::select! {
///         _ = term.ended() => continue, // lost: campaigning again
///         written = term.fence().write(&mut conn, "compacted up to 1200") => {
///             if !matches!(written?, Write::Applied) {
///                 continue; // a later term exists: this one is over
///             }
///             break;
///         }
///     }
/// }
/// campaign.step_down().await?; // no one waits out the TTL
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    name: String,
    lock: Lock,
    campaign: Backoff,
}

/// The default campaign backoff: sleeps from 10 ms doubling to 500 ms.
const CAMPAIGN: Backoff = Backoff::none();

impl Leader {
    /// Leader election for the role `name`, whose terms are leases of
    /// `lock` (its TTL and acknowledgement) on the resource `name`, with the
    /// default campaign backoff (sleeps from 10 ms doubling to 500 ms).
    ///
    /// The role's keys are the lock's: `{name}:lock`, `{name}:fence` and,
    /// for [`Fence::write`], `{name}:value` (see [`crate::keys::derive`]).
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`] (an empty name);
    /// [`Error::InvalidArgument`] for a lock built [`Lock::with_wait`]:
    /// the campaign spaces its own attempts ([`Leader::with_campaign`]),
    /// and an acquire that waits would delay a step-down.
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::fence::{Leader, Lock};
    /// use nolock::{Backoff, Error};
    ///
    /// let lock = Lock::new(Duration::from_secs(5))?;
    /// assert_eq!(Leader::new("scheduler", lock.clone())?.name(), "scheduler");
    /// assert!(matches!(Leader::new("", lock.clone()), Err(Error::EmptyKey)));
    /// let waiting = lock.with_wait(Backoff::new(Duration::from_secs(1)));
    /// assert!(matches!(Leader::new("scheduler", waiting), Err(Error::InvalidArgument { .. })));
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn new(name: &str, lock: Lock) -> Result<Leader> {
        Keys::of(name)?;
        if !lock.wait().timeout.is_zero() {
            return Err(Error::InvalidArgument {
                what: "lock",
                reason: "a leader's lock must not wait (Lock::with_wait): the campaign spaces \
                         its own attempts (Leader::with_campaign)"
                    .to_owned(),
            });
        }
        Ok(Leader {
            name: name.to_owned(),
            lock,
            campaign: CAMPAIGN,
        })
    }

    /// The same election, whose campaigns sleep per `backoff` between
    /// attempts that find the role held: attempt `n` sleeps a random time up
    /// to `min(max_delay, initial_delay × 2^n)`, and never past the
    /// holder's expiry. The count starts again after each term. A campaign
    /// never gives up, so `backoff.timeout` is not used. A step-down is
    /// noticed by the others within one sleep (`max_delay` at most); each
    /// campaigner sends about `2 / max_delay` acquires a second while the
    /// role is held.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] (`initial_delay` under 1 ms), before any I/O.
    pub fn with_campaign(self, backoff: Backoff) -> Result<Leader> {
        backoff.check()?;
        Ok(Leader {
            campaign: backoff,
            ..self
        })
    }

    /// The role's name (the lock's resource name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock each term is a lease of.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// How campaigns space their attempts.
    pub fn campaign_backoff(&self) -> &Backoff {
        &self.campaign
    }

    /// Start campaigning in a background task (on the current Tokio
    /// runtime) over `conn` and its clones: each term's lease renews on a
    /// clone of its own. The handle's [`Campaign::watch`] publishes every
    /// transition; [`Campaign::elected`] waits for a term.
    ///
    /// The campaign goes on until [`Campaign::step_down`] or until the
    /// handle is dropped; both end the current term and release its lease.
    /// A failed attempt (an error from Redis) is not the end of it: the
    /// error shows in [`Role::Candidate`] and the campaign tries again after
    /// its backoff. The attempts until a term is won share one owner token
    /// ([`Lock::acquire_as`]), so an attempt whose reply was lost (the role
    /// granted, the answer never seen) is won by the next one, with that
    /// grant's fence, rather than leaving the role held by no one until its
    /// TTL. Each term has a token of its own.
    ///
    /// # Errors
    ///
    /// [`Error::NoTimer`] outside a Tokio runtime or on one without timers,
    /// before any I/O.
    pub fn campaign<C>(&self, conn: C) -> Result<Campaign>
    where
        C: ConnectionLike + Clone + Send + 'static,
    {
        crate::timer::check()?;
        let (tx, rx) = watch::channel(Role::Candidate { last_error: None });
        let stop = CancellationToken::new();
        let campaigner = Campaigner {
            conn,
            leader: self.clone(),
            token: None,
            tx,
            stop: stop.clone(),
        };
        Ok(Campaign {
            name: self.name.clone(),
            rx,
            stop: stop.drop_guard(),
            task: tokio::spawn(campaigner.run()),
        })
    }

    /// Campaign ([`Leader::campaign`]) and run `work` with each term won,
    /// until one run of it finishes; then step down and return its output.
    ///
    /// `work` gets the [`Term`]: pass its fence to every write it makes
    /// ([`Fence::write`], or `term.fence().as_i64()` in a conditional SQL
    /// write). When the term is lost, the future `work` returned is dropped
    /// at once (tasks it spawned should watch [`Term::cancellation_token`]),
    /// and the campaign goes on: `work` is called again with the next term
    /// won. Work that finishes as its term is lost still counts as finished;
    /// only its fenced writes say whether they landed in the term.
    ///
    /// # Errors
    ///
    /// [`Error::NoTimer`], before any I/O; from the step-down's release
    /// (the lease then expires at its TTL), as [`Campaign::step_down`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::fence::{Leader, Lock};
    ///
    /// let scheduler = Leader::new("scheduler", Lock::new(Duration::from_secs(10))?)?;
    /// let shutdown = tokio_util::sync::CancellationToken::new();
    /// scheduler
    ///     .run(conn.clone(), |term| {
    ///         let (mut conn, shutdown) = (conn.clone(), shutdown.clone());
    ///         async move {
    ///             loop {
    ///                 tokio::select! {
    ///                     _ = shutdown.cancelled() => return,
    ///                     _ = tokio::time::sleep(Duration::from_secs(1)) => {}
    ///                 }
    ///                 // Only fenced writes are safe: a later term refuses this one.
    ///                 if !term.fence().write(&mut conn, "tick").await.is_ok_and(|w| w.is_applied()) {
    ///                     return;
    ///                 }
    ///             }
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<C, F, Fut, T>(&self, conn: C, mut work: F) -> Result<T>
    where
        C: ConnectionLike + Clone + Send + 'static,
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        let campaign = self.campaign(conn)?;
        loop {
            let Some(term) = campaign.elected().await else {
                // Only a campaign task that died ends the campaign early.
                let fence = campaign.last_fence();
                return Err(match campaign.step_down().await {
                    Err(e) => e,
                    Ok(_) => ended(&self.name, fence, "the campaign task ended"),
                });
            };
            let over = term.cancellation_token();
            let output = tokio::select! {
                // A finished result wins over a loss noticed at the same moment.
                biased;
                output = work(term) => Some(output),
                _ = over.cancelled() => None,
            };
            if let Some(output) = output {
                campaign.step_down().await?;
                return Ok(output);
            }
        }
    }
}

/// One term of a role: its fence, and a signal for its end.
///
/// Clone it freely; every clone is the same term. Two terms compare equal
/// when their fences are equal.
#[derive(Debug, Clone)]
pub struct Term {
    fence: Fence,
    over: CancellationToken,
}

impl PartialEq for Term {
    fn eq(&self, other: &Term) -> bool {
        self.fence == other.fence
    }
}

impl Eq for Term {}

impl Term {
    /// The term's fence (on the role's name): pass it to every write the
    /// leader makes. Later terms have greater fences.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The term's number: its fence's.
    pub fn number(&self) -> u64 {
        self.fence.number()
    }

    /// True once the term is over (lost, stepped down from, or its
    /// campaign dropped). False does not prove it still holds: see
    /// [`Leader`]'s "What a leader may assume".
    pub fn is_over(&self) -> bool {
        self.over.is_cancelled()
    }

    /// Completes when the term is over. Cancel-safe: use it in
    /// `tokio::select!` beside the work.
    pub async fn ended(&self) {
        self.over.cancelled().await;
    }

    /// A token cancelled when the term is over: hand it to tasks spawned
    /// for the work. Cancelling it yourself does not end the term.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.over.child_token()
    }
}

/// Where a [`Campaign`] stands, as published on its
/// [`watch`](Campaign::watch) channel.
///
/// A watch keeps the latest value only: a receiver that looks rarely can
/// miss a short-lived state (a term lost and the next won in between). Every
/// term won is still seen as [`Term::ended`] by whoever holds its [`Term`].
///
/// A campaign publishes the end of a term before it releases the lease, so
/// no other campaign can publish [`Role::Leader`] while this one still
/// does, unless the lease expired first: a process paused (or starved)
/// past its lease's deadline publishes [`Role::Lost`] only when it runs
/// again, and meanwhile another may have won. Its fenced writes are refused
/// (see [`Leader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// Campaigning: not holding a term.
    Candidate {
        /// The error of the last attempt, when it failed (the campaign
        /// tries again after its backoff); `None` when it found the role
        /// held by another process, or has not tried yet.
        last_error: Option<String>,
    },
    /// Holding a term.
    Leader(Term),
    /// The term was lost (its lease expired, was taken over, or could not
    /// be renewed); the campaign tries again after its backoff.
    Lost {
        /// The fence of the lost term.
        term: Fence,
        /// Why it was lost.
        loss: Loss,
    },
    /// The campaign ended ([`Campaign::step_down`], or its handle was
    /// dropped): the last value the channel carries.
    SteppedDown {
        /// The term it held then, now released; `None` when it held none.
        term: Option<Fence>,
    },
}

impl Role {
    /// True for [`Role::Leader`].
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader(_))
    }

    /// The term held, for [`Role::Leader`].
    pub fn term(&self) -> Option<&Term> {
        match self {
            Role::Leader(term) => Some(term),
            _ => None,
        }
    }
}

/// A campaign running in the background ([`Leader::campaign`]).
///
/// Dropping it never blocks: it stops the campaign, ends the term and the
/// background task makes one best-effort release (if the runtime is
/// shutting down or Redis does not answer, the lease expires at its TTL).
/// [`Campaign::step_down`] does the same and waits for the release.
#[derive(Debug)]
#[must_use = "dropping a campaign steps down at once"]
pub struct Campaign {
    name: String,
    rx: watch::Receiver<Role>,
    /// Dropping it (with the handle) stops the task.
    stop: DropGuard,
    task: JoinHandle<Result<Option<LockRelease>>>,
}

impl Campaign {
    /// The role's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the campaign stands now.
    pub fn role(&self) -> Role {
        self.rx.borrow().clone()
    }

    /// The term held now, if any (and not over).
    pub fn term(&self) -> Option<Term> {
        self.rx.borrow().term().filter(|t| !t.is_over()).cloned()
    }

    /// A receiver of every transition: [`watch::Receiver::changed`]
    /// completes on each, and fails once the campaign has ended (after
    /// [`Role::SteppedDown`]).
    pub fn watch(&self) -> watch::Receiver<Role> {
        self.rx.clone()
    }

    /// Wait until the campaign holds a term (at once if it does), and get
    /// it. `None` only if the campaign's task has ended abnormally (the
    /// runtime is shutting down): [`Campaign::step_down`] says why.
    pub async fn elected(&self) -> Option<Term> {
        let mut rx = self.rx.clone();
        loop {
            if let Some(term) = rx.borrow_and_update().term() {
                if !term.is_over() {
                    return Some(term.clone());
                }
            }
            rx.changed().await.ok()?;
        }
    }

    /// Stop campaigning: end the term held (its tokens are cancelled and
    /// [`Role::SteppedDown`] is published first), release its lease, and
    /// wait for the background task. Another campaign can take the role at
    /// once, without waiting out the TTL. An attempt in flight is answered
    /// first (one round trip), and a lease it won is released too.
    ///
    /// `Some(LockRelease::Released)` when a term was held and is released;
    /// `Some(LockRelease::Lost)` when the term's lease had already expired
    /// or been taken over; `None` when no term was held.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] / [`Error::Indeterminate`] from the release (the
    /// lease then expires at its TTL); [`Error::LeaseLost`] with
    /// [`Loss::RenewalFailed`] when the background task was cancelled (the
    /// runtime is shutting down) or panicked; its `fence` is the last
    /// term's, or 0 when none was held.
    pub async fn step_down(self) -> Result<Option<LockRelease>> {
        let fence = self.last_fence();
        let Campaign {
            name, stop, task, ..
        } = self;
        drop(stop);
        match task.await {
            Ok(result) => result,
            Err(join) => Err(ended(
                &name,
                fence,
                &format!("the campaign task ended abnormally: {join}"),
            )),
        }
    }

    /// The fence of the term held now or last released.
    fn last_fence(&self) -> Option<u64> {
        match &*self.rx.borrow() {
            Role::Leader(term) => Some(term.number()),
            Role::SteppedDown { term } => term.as_ref().map(Fence::number),
            Role::Candidate { .. } | Role::Lost { .. } => None,
        }
    }
}

fn ended(name: &str, fence: Option<u64>, error: &str) -> Error {
    Error::LeaseLost {
        resource: name.to_owned(),
        fence: fence.unwrap_or(0),
        loss: Loss::RenewalFailed {
            error: error.to_owned(),
        },
    }
}

/// The background task of a [`Campaign`].
struct Campaigner<C> {
    conn: C,
    leader: Leader,
    /// The owner token of the current series of attempts.
    token: Option<Token>,
    tx: watch::Sender<Role>,
    stop: CancellationToken,
}

impl<C> Campaigner<C>
where
    C: ConnectionLike + Clone + Send + 'static,
{
    async fn run(mut self) -> Result<Option<LockRelease>> {
        let mut attempt: u32 = 0;
        loop {
            if self.stop.is_cancelled() {
                return Ok(self.stepped_down(None));
            }
            // Not raced against `stop`: an acquire dropped in flight could
            // leave a lease no one releases, held until its TTL.
            let pause = match self.attempt().await {
                Ok(LockAttempt::Acquired(lease)) => {
                    attempt = 0;
                    if let Some(released) = self.lead(lease).await {
                        return released.map(Some);
                    }
                    self.leader.campaign.delay(0)
                }
                Ok(LockAttempt::Held { expires_in }) => {
                    self.candidate(None);
                    let pause = self.leader.campaign.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    // Try again as soon as the holder's lease expires.
                    expires_in.map_or(pause, |left| pause.min(left.max(Duration::from_millis(1))))
                }
                Err(e) => {
                    self.candidate(Some(e.to_string()));
                    let pause = self.leader.campaign.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    pause
                }
            };
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return Ok(self.stepped_down(None)),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One attempt at the role. Every attempt of one series (until a term
    /// is won) goes under one token, so an attempt whose reply was lost is
    /// recognised by the next (the same grant) instead of leaving the role
    /// held by nobody until its TTL. A term's token is not used again: a
    /// later attempt must not re-enter a lost term's lease with its fence.
    async fn attempt(&mut self) -> Result<LockAttempt<Lease>> {
        let token = match self.token.take() {
            Some(token) => token,
            None => Token::random()?,
        };
        let mut conn = self.conn.clone();
        let outcome = self
            .leader
            .lock
            .acquire_as(&mut conn, &self.leader.name, &token)
            .await;
        Ok(match outcome {
            Ok(LockAttempt::Acquired(grant)) => LockAttempt::Acquired(Lease::start(conn, grant)?),
            Ok(LockAttempt::Held { expires_in }) => {
                self.token = Some(token);
                LockAttempt::Held { expires_in }
            }
            Err(e) => {
                self.token = Some(token);
                return Err(e);
            }
        })
    }

    /// Hold the term of `lease` until it is lost (`None`) or the campaign
    /// stops (the release's outcome).
    async fn lead(&mut self, lease: Lease) -> Option<Result<LockRelease>> {
        let over = lease.cancellation_token();
        let fence = lease.fence().clone();
        if !self.stop.is_cancelled() {
            self.tx.send_replace(Role::Leader(Term {
                fence: fence.clone(),
                over: over.clone(),
            }));
        }
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => {
                // The term ends, and says so, before anyone else can win.
                over.cancel();
                self.stepped_down(Some(fence));
                Some(lease.release().await)
            }
            loss = lease.lost() => {
                over.cancel();
                self.tx.send_replace(Role::Lost { term: fence, loss });
                // Dropping it makes one best-effort release (the lease may
                // still be ours after a failed renewal).
                drop(lease);
                None
            }
        }
    }

    fn candidate(&self, last_error: Option<String>) {
        let role = Role::Candidate { last_error };
        self.tx.send_if_modified(|now| {
            if *now == role {
                return false;
            }
            *now = role;
            true
        });
    }

    fn stepped_down(&self, term: Option<Fence>) -> Option<LockRelease> {
        self.tx.send_replace(Role::SteppedDown { term });
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> Lock {
        Lock::new(Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_sent() {
        assert!(matches!(Leader::new("", lock()), Err(Error::EmptyKey)));
        let waiting = lock().with_wait(Backoff::new(Duration::from_millis(5)));
        assert!(matches!(
            Leader::new("r", waiting),
            Err(Error::InvalidArgument { what: "lock", .. })
        ));
        let zero = Backoff {
            initial_delay: Duration::ZERO,
            ..Backoff::none()
        };
        let leader = Leader::new("r", lock()).unwrap();
        assert!(matches!(
            leader.clone().with_campaign(zero),
            Err(Error::ZeroDuration {
                what: "initial_delay"
            })
        ));
        assert_eq!(leader.campaign_backoff(), &CAMPAIGN);
        assert_eq!(leader.lock().ttl(), Duration::from_secs(1));
    }

    #[test]
    fn terms_are_equal_by_fence_and_roles_say_who_leads() {
        let fence = Fence::from_message("r", 3).unwrap();
        let a = Term {
            fence: fence.clone(),
            over: CancellationToken::new(),
        };
        let b = Term {
            fence,
            over: CancellationToken::new(),
        };
        assert_eq!(a, b);
        let leading = Role::Leader(a.clone());
        assert!(leading.is_leader());
        assert_eq!(leading.term().map(Term::number), Some(3));
        assert!(!Role::Candidate { last_error: None }.is_leader());
        let child = a.cancellation_token();
        child.cancel();
        assert!(!a.is_over(), "cancelling a child does not end the term");
        a.over.cancel();
        assert!(
            a.is_over() && !b.is_over(),
            "each term value has its own signal here"
        );
    }
}
