//! Taking permits: [`AcquirePermit`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{fenced, Holding, Permit, PermitAttempt, PermitId, Semaphore};
use crate::keys::derive;
use crate::script::{embedded, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

pub(super) static ACQUIRE: Script = embedded!("semaphore/acquire");
static ACQUIRE_FAIR: Script = embedded!("semaphore/acquire_fair");

/// [`Semaphore::acquire`] as a value, for a [`crate::Batch`] (many keys in
/// one round trip per server) or an operation id. The input is checked when
/// it is built, and the holder's id is drawn then (or given, with
/// [`AcquirePermit::with_id`]): running the value again after a lost reply
/// asks for the same holder's permits, never a second set.
///
/// ```
/// use std::time::Duration;
/// use nolock::semaphore::{AcquirePermit, Semaphore};
///
/// let exports = Semaphore::new(10, Duration::from_secs(30))?;
/// let op = AcquirePermit::new(&exports, "exports:running")?;
/// assert!(AcquirePermit::weighted(&exports, "exports:running", 11).is_err()); // never fits
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct AcquirePermit {
    call: Invocation,
    script: &'static Script,
    holding: Holding,
    pub(super) built: Instant,
    /// A fair waiter's "leave" call ([`Semaphore::fair`]).
    leave: Option<Box<Invocation>>,
    /// A fair waiter's place in line as this attempt answered (1 = first;
    /// 0 = not in line).
    place: Option<Arc<AtomicU64>>,
}

impl AcquirePermit {
    /// One permit of `semaphore` at `key`, under a fresh id.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`] before any I/O.
    pub fn new(semaphore: &Semaphore, key: &str) -> Result<Self> {
        Self::weighted(semaphore, key, 1)
    }

    /// `weight` permits at once, under a fresh id.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire_weighted`] before any I/O.
    pub fn weighted(semaphore: &Semaphore, key: &str, weight: u64) -> Result<Self> {
        semaphore.check(key, weight)?;
        Self::with_id(semaphore, key, &PermitId::random()?, weight)
    }

    /// `weight` permits under `id`. While `id` still holds its permits
    /// unexpired, running this again grants them again with a fresh expiry
    /// (no second set): after an [`Error::Indeterminate`], retry with the
    /// same id to learn whether the first call took them.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire_weighted`] before any I/O (without
    /// [`Error::Entropy`]); [`Error::InvalidArgument`] for an acknowledged
    /// semaphore ([`Semaphore::acknowledged`]), whose permits only its own
    /// acquires confirm: a value run in a batch would hand out permits no
    /// replica confirmed.
    pub fn with_id(semaphore: &Semaphore, key: &str, id: &PermitId, weight: u64) -> Result<Self> {
        if semaphore.is_acknowledged() {
            return Err(Error::InvalidArgument {
                what: "semaphore",
                reason: "an acknowledged semaphore's permits are confirmed only by its own \
                         acquire (Semaphore::acquire, acquire_as, lease, with_permit), \
                         not as an operation value"
                    .to_owned(),
            });
        }
        Self::build(semaphore, key, id, weight)
    }

    /// [`AcquirePermit::with_id`] for the semaphore's own acquires, which
    /// confirm acknowledged permits themselves.
    pub(super) fn build(
        semaphore: &Semaphore,
        key: &str,
        id: &PermitId,
        weight: u64,
    ) -> Result<Self> {
        let ttl_ms = semaphore.check(key, weight)?;
        let holding = Holding {
            key: key.to_owned(),
            id: id.clone(),
            weight,
            ttl: Duration::from_millis(ttl_ms),
            seat: None,
            fair: semaphore.is_fair(),
        };
        if semaphore.is_fenced() {
            let seats = fenced::seats_key(key);
            let counter = crate::fence::slot_counter(crate::keys::slot(key));
            let call = Invocation::new(&fenced::ACQUIRE_FENCED, &[key, &seats, counter])
                .arg(id.as_str())
                .arg(semaphore.permits())
                .arg(ttl_ms);
            return Ok(AcquirePermit {
                call,
                script: &fenced::ACQUIRE_FENCED,
                holding,
                built: Instant::now(),
                leave: None,
                place: None,
            });
        }
        if semaphore.is_fair() {
            return Self::build_fair(semaphore, holding, ttl_ms);
        }
        let mut call = Invocation::new(&ACQUIRE, &[key])
            .arg(id.as_str())
            .arg(semaphore.permits())
            .arg(weight)
            .arg(ttl_ms);
        if semaphore.adopts() {
            call = call.arg("adopt");
        }
        Ok(AcquirePermit {
            call,
            script: &ACQUIRE,
            holding,
            built: Instant::now(),
            leave: None,
            place: None,
        })
    }

    /// A fair semaphore's attempt (`semaphore/acquire_fair`): joins the
    /// line when the semaphore waits, tries without joining when it does not.
    fn build_fair(semaphore: &Semaphore, holding: Holding, ttl_ms: u64) -> Result<Self> {
        let key = holding.key.as_str();
        let (line, alive) = (derive(key, "queue"), derive(key, "queue:alive"));
        let names = [key, line.as_str(), alive.as_str()];
        let joins = !semaphore.wait().timeout.is_zero();
        let life_ms = u64::try_from(semaphore.ticket_life().as_millis()).unwrap_or(u64::MAX);
        let call = |mode: &str, life: u64| {
            let mut call = Invocation::new(&ACQUIRE_FAIR, &names)
                .arg(holding.id.as_str())
                .arg(semaphore.permits())
                .arg(holding.weight)
                .arg(ttl_ms)
                .arg(mode)
                .arg(life);
            if semaphore.adopts() {
                call = call.arg("adopt");
            }
            call
        };
        let (call, leave) = if joins {
            (call("join", life_ms), Some(Box::new(call("leave", 0))))
        } else {
            (call("try", 0), None)
        };
        Ok(AcquirePermit {
            call,
            script: &ACQUIRE_FAIR,
            holding,
            built: Instant::now(),
            place: leave.as_ref().map(|_| Arc::default()),
            leave,
        })
    }

    /// A fair waiter's way out of the line (`None` for other attempts).
    pub(super) fn leave(&self) -> Option<LeaveLine> {
        self.leave
            .as_deref()
            .map(|call| LeaveLine { call: call.clone() })
    }

    /// A fair waiter's place in line as this attempt answered (1 = first),
    /// if it is in one.
    pub(super) fn place_in_line(&self) -> Option<u64> {
        self.place
            .as_ref()
            .map(|place| place.load(Ordering::Relaxed))
            .filter(|&place| place > 0)
    }

    /// The id the permits are (or would be) held under.
    pub fn id(&self) -> &PermitId {
        &self.holding.id
    }
}

impl Operation for AcquirePermit {
    type Output = PermitAttempt;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<PermitAttempt> {
        let mut reply = Reply::new(self.script.name(), reply)?;
        let outcome = if reply.flag()? {
            let _in_use = reply.uint()?;
            let mut holding = self.holding.clone();
            if std::ptr::eq(self.script, &fenced::ACQUIRE_FENCED) {
                let seat = reply.uint()?;
                let fence = reply.uint()?;
                holding.seat = Some(fenced::Seat { seat, fence });
            }
            PermitAttempt::Acquired(Permit::granted(
                holding,
                self.built,
                crate::fence::deadline(self.built, self.holding.ttl),
            ))
        } else {
            let full = PermitAttempt::Full {
                retry_after: Duration::from_millis(reply.uint()?),
                in_use: reply.uint()?,
            };
            if std::ptr::eq(self.script, &ACQUIRE_FAIR) {
                let position = reply.uint()?;
                if let Some(place) = &self.place {
                    place.store(position, Ordering::Relaxed);
                }
            }
            full
        };
        reply.finish()?;
        Ok(outcome)
    }
}

/// A fair waiter leaving its line (`semaphore/acquire_fair`, mode "leave").
#[derive(Debug)]
pub(super) struct LeaveLine {
    call: Invocation,
}

impl Operation for LeaveLine {
    type Output = ();

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<()> {
        let mut reply = Reply::new(ACQUIRE_FAIR.name(), value)?;
        let _ = reply.flag()?;
        let _ = reply.uint()?;
        let _ = reply.uint()?;
        let _ = reply.uint()?;
        reply.finish()
    }
}

/// Validates a key, a weight of `permits` and a TTL: the TTL in ms.
pub(super) fn check(key: &str, permits: u64, weight: u64, ttl: Duration) -> Result<u64> {
    validate::key(key)?;
    super::check_permits(permits, weight)?;
    super::ttl_millis(ttl)
}
