//! Giving permits back and keeping them: [`Permit::release`],
//! [`Permit::extend`], [`ReleasePermit`], [`ExtendPermit`].

use std::time::Instant;

use redis::aio::ConnectionLike;

use super::{Holding, Permit, PermitExtend, PermitExtension, PermitRelease};
use crate::keys::derive;
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
#[cfg(doc)]
use crate::Error;
use crate::Result;

pub(super) static RELEASE: Script = embedded!("semaphore/release");
pub(super) static EXTEND: Script = embedded!("semaphore/extend");
static RELEASE_FAIR: Script = embedded!("semaphore/release_fair");

impl Permit {
    /// Give the permits back, and only these (their id's members): one
    /// round trip. Consumes the permit.
    ///
    /// [`PermitRelease::Lost`] when some had expired: the work under them
    /// may have run beside one more holder than the semaphore allows.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] (the key holds something that is not a semaphore;
    /// nothing was removed) and [`Error::Indeterminate`] (this call consumes
    /// the permit, so the permits then expire at their TTL; to be able to
    /// resend, release with `ReleasePermit::new(&permit).idempotent(id)`
    /// through [`crate::retry()`] instead, whose resend answers with the first
    /// reply rather than `Lost`).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection, permit: nolock::semaphore::Permit)
    /// #     -> nolock::Result<()> {
    /// use nolock::semaphore::PermitRelease;
    /// if permit.release(conn).await? == PermitRelease::Lost {
    ///     eprintln!("the permit expired while working");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release<C>(self, conn: &mut C) -> Result<PermitRelease>
    where
        C: ConnectionLike + Send,
    {
        run_one(&ReleasePermit::new(&self), conn).await
    }

    /// Set the permits to expire their TTL from now, if they have not
    /// expired: one round trip. Moves [`Permit::deadline`].
    ///
    /// # Errors
    ///
    /// As [`Permit::release`]; an extension is safe to resend.
    pub async fn extend<C>(&mut self, conn: &mut C) -> Result<PermitExtend>
    where
        C: ConnectionLike + Send,
    {
        let answer = run_one(&ExtendPermit::new(self), conn).await?;
        self.apply(&answer)?;
        Ok(answer.outcome())
    }
}

/// [`Permit::release`] as a value: for a [`crate::Batch`], or with an
/// operation id so that a release resent after a lost reply answers with
/// the first reply instead of `Lost`.
#[derive(Debug, Clone)]
pub struct ReleasePermit {
    call: Invocation,
    fair: bool,
}

impl ReleasePermit {
    /// Release `permit`'s permits.
    pub fn new(permit: &Permit) -> Self {
        ReleasePermit {
            call: release_call(&permit.holding),
            fair: permit.holding.fair,
        }
    }
}

pub(super) fn release_call(holding: &Holding) -> Invocation {
    if holding.fair {
        // A fair semaphore's permits: the same removal, then the waiters in
        // line that fit are woken by name.
        let key = holding.key.as_str();
        let (line, alive) = (derive(key, "queue"), derive(key, "queue:alive"));
        return Invocation::new(&RELEASE_FAIR, &[key, &line, &alive])
            .arg(holding.id.as_str())
            .arg(holding.weight);
    }
    Invocation::new(&RELEASE, &[holding.key.as_str()])
        .arg(holding.id.as_str())
        .arg(holding.weight)
}

impl Operation for ReleasePermit {
    type Output = PermitRelease;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<PermitRelease> {
        let script = if self.fair { &RELEASE_FAIR } else { &RELEASE };
        let mut reply = Reply::new(script.name(), reply)?;
        let released = reply.flag()?;
        reply.finish()?;
        Ok(if released {
            PermitRelease::Released
        } else {
            PermitRelease::Lost
        })
    }
}

/// [`Permit::extend`] as a value; its answer, a [`PermitExtension`], is
/// applied with [`Permit::apply`] (to this permit only). The local deadline
/// it answers counts from when the value was built.
#[derive(Debug, Clone)]
pub struct ExtendPermit {
    call: Invocation,
    holding: Holding,
    built: Instant,
}

impl ExtendPermit {
    /// Extend `permit`'s permits by their TTL.
    pub fn new(permit: &Permit) -> Self {
        ExtendPermit {
            call: extend_call(&permit.holding),
            holding: permit.holding.clone(),
            built: Instant::now(),
        }
    }
}

fn extend_call(holding: &Holding) -> Invocation {
    let ttl = u64::try_from(holding.ttl.as_millis()).unwrap_or(u64::MAX);
    if let Some(seat) = holding.seat {
        let seats = super::fenced::seats_key(&holding.key);
        return Invocation::new(&super::fenced::EXTEND_FENCED, &[&holding.key, &seats])
            .arg(holding.id.as_str())
            .arg(seat.seat)
            .arg(seat.fence.to_string())
            .arg(ttl);
    }
    Invocation::new(&EXTEND, &[holding.key.as_str()])
        .arg(holding.id.as_str())
        .arg(holding.weight)
        .arg(ttl)
}

impl Operation for ExtendPermit {
    type Output = PermitExtension;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<PermitExtension> {
        let script = match self.holding.seat {
            Some(_) => &super::fenced::EXTEND_FENCED,
            None => &EXTEND,
        };
        let mut reply = Reply::new(script.name(), reply)?;
        let extended = reply.flag()?;
        reply.finish()?;
        let outcome = if extended {
            PermitExtend::Extended {
                deadline: crate::fence::deadline(self.built, self.holding.ttl),
            }
        } else {
            PermitExtend::Lost
        };
        Ok(PermitExtension::answer(
            self.holding.clone(),
            self.built,
            outcome,
        ))
    }
}

/// The renewal task's calls on a holding (no [`Permit`] there: the lease
/// keeps it).
pub(super) async fn extend_holding<C>(conn: &mut C, holding: &Holding) -> Result<PermitExtend>
where
    C: ConnectionLike + Send,
{
    let op = ExtendPermit {
        call: extend_call(holding),
        holding: holding.clone(),
        built: Instant::now(),
    };
    Ok(run_one(&op, conn).await?.outcome())
}

pub(super) async fn release_holding<C>(conn: &mut C, holding: &Holding) -> Result<PermitRelease>
where
    C: ConnectionLike + Send,
{
    run_one(
        &ReleasePermit {
            call: release_call(holding),
            fair: holding.fair,
        },
        conn,
    )
    .await
}
