//! [`Reservoir`]: a hot limit decided mostly in this process, from units
//! taken from Redis in batches (see its docs).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Algorithm, Charge, Limiter};
use crate::{timer, validate, Error, Result};
use pool::Pool;

mod pool;

/// The answer of [`Reservoir::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a denied request must be turned away"]
#[non_exhaustive]
pub struct Draw {
    /// True when the units were admitted.
    pub allowed: bool,
    /// True when the decision was made in this process, from units already
    /// held; false when it took a call to Redis.
    pub local: bool,
    /// After a denial: how long until the server has room for the cost, if
    /// nothing else arrives (from the batch call that found too little).
    pub retry_after: Option<Duration>,
}

/// A hot limit decided mostly in this process, from units taken from
/// Redis in batches.
///
/// A limit shared by a whole fleet lives on one key, so on one Redis shard,
/// and one script call per decision makes that shard's single thread the
/// ceiling. A reservoir takes a batch of units in one call
/// ([`Limiter::check_at_most`]: as many as fit, up to the batch) and admits
/// from it locally, without a round trip, until it runs dry. What it did
/// not use goes back (a refund of that batch's [`Charge`]) when it has been
/// held for `hold` (so an idle process returns its units) and when the
/// reservoir is dropped. After a batch comes back short (the limit is
/// drained), it lets units build up on the server for a quarter of a batch
/// before the next call, denying locally meanwhile what it cannot serve.
///
/// **The invariant**: the units admitted locally never exceed the units
/// charged on the server, at any instant, in any number of processes. A
/// unit is admitted only out of a batch the server granted, and a refund
/// takes the unused units out of the pool before the server gives any back.
/// A lost reply of a batch call adds nothing locally (the units it may have
/// taken are lost to the limit until they drain); a process killed while
/// holding units loses at most its pool, which the limit gets back as it
/// drains.
///
/// **The bound in every window**: a batch's units also refill on the
/// server, one per emission interval `T` (exactly the integer microseconds
/// the script is sent, [`Quota::emission_interval`](super::Quota::emission_interval)),
/// whether or not this process uses them. So a batch's unused units
/// **decay** at the limit's rate from when its call was *sent* (the server
/// ran it no earlier): at an instant `τ` a batch of `g` units may serve at
/// most `g - ceil((τ - sent) / T)` more; decayed units leave the pool
/// ([`ReservoirStats::decayed`]). Why that keeps the limit's bound,
/// `burst + floor((t2 - t1) / T)` units in every window `[t1, t2]`, however
/// late a unit is served: GCRA's count (the token bucket's is the same)
/// rests on each unit admitted at `t` holding its own slot (length `T`) of
/// the server's schedule that starts within `[t, t + (burst - 1) × T]`.
/// Unit `j` of a batch holds slot `j`, which starts no earlier than
/// `sent + (j - 1) × T` and, as the server admitted the batch, no later
/// than its own `t + (burst - 1) × T`; a unit served here at `τ` from a
/// slot not begun by `τ` keeps that count, and the cap leaves, at every
/// instant, no more units to serve than such slots, which is Hall's
/// condition for matching each served unit to one. (The request whose call
/// brought the batch is served as the server decided it, at the instant
/// the script ran, when no slot of the batch had begun.)
/// A refund frees the last slots of a batch, so it gives back the unused
/// units less the batch's *lag* (its units decayed when it last served
/// one): the server then keeps `used + lag` slots, enough for every unit
/// served to keep its own (it gives back only what it has not drained,
/// besides). Before the decay, a batch stayed usable here for the whole
/// `hold` after it had refilled on the server: at 10 per second with a 5 s
/// hold, 10 from the server and 8 from a reservoir in the same 2.4 ms.
/// Clocks: the decay is timed by this process's monotonic clock, so it
/// assumes that clock runs no slower than the server's (slower by a
/// fraction `d`, a batch of `g` may serve up to `d × g` more). Cost: a
/// local decision reads that clock once (`Instant::now`, no system call;
/// about 37 ns on the 2-core test machine, where a local decision went
/// from about 45 ns to about 80 ns); and a limit whose `T` is shorter than
/// a round trip loses `round trip / T` units of each batch to it.
///
/// **The trade**: a replica can hold up to its batch while another is
/// denied. The batch adapts to the local rate (about what this process
/// admits in `hold`, at least the cost asked for, at most `max_batch`), so
/// a lightly loaded replica takes little; cap `max_batch` well below the
/// burst when replicas are many. A reservoir's decisions carry no charge:
/// its units cannot be refunded one request at a time.
///
/// Owns a connection, used for its batch calls and, from a background
/// task, to return units held past `hold` and on drop: pass a
/// `ConnectionManager` or a `MultiplexedConnection` (cloned, never
/// blocked). Cheap to share behind an `Arc`; every task of the process
/// draws from one reservoir per key.
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::rate::{Algorithm, Limiter, Quota, Reservoir};
///
/// # async fn run(conn: redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// // The partner API allows 2 000 requests per second across all replicas.
/// let partner = Limiter::new(Algorithm::Gcra, Quota::per_second(2_000)?)?;
/// let reservoir = Reservoir::new(conn, partner, "rl:partner-api", 200, Duration::from_millis(100))?;
/// let draw = reservoir.check(1).await?;
/// if !draw.allowed {
///     println!("over the partner's limit; retry in {:?}", draw.retry_after);
/// }
/// # Ok(()) }
/// ```
pub struct Reservoir<C> {
    inner: Arc<Inner<C>>,
    /// Dropping the reservoir stops the task, which returns every unit.
    _stop: DropGuard,
}

struct Inner<C> {
    limiter: Limiter,
    key: String,
    max_batch: u64,
    hold: Duration,
    /// Batch calls and returns, one at a time.
    conn: tokio::sync::Mutex<C>,
    pool: Mutex<Pool>,
}

/// What a [`Reservoir`] did so far.
///
/// Every unit granted is admitted, held, returned or decayed:
/// `admitted + held + returned + decayed == granted`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReservoirStats {
    /// Units admitted (locally or right after a batch call).
    pub admitted: u64,
    /// Decisions made without a call to Redis.
    pub local: u64,
    /// Batch calls sent to Redis.
    pub batch_calls: u64,
    /// Units granted by batch calls.
    pub granted: u64,
    /// Units taken out of the pool to be given back (the server may have
    /// credited fewer: they drain while held).
    pub returned: u64,
    /// Units that left the pool unused because they had refilled on the
    /// server meanwhile: a batch loses one per emission interval from when
    /// its call was sent (see [`Reservoir`]).
    pub decayed: u64,
}

impl<C> Reservoir<C>
where
    C: ConnectionLike + Send + 'static,
{
    /// A reservoir drawing from `limiter` at `key`, taking batches of at
    /// most `max_batch` units, and giving back what it held unused for
    /// `hold` (and everything when dropped).
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`]; [`Error::InvalidArgument`] for a
    /// window algorithm (partial grants need GCRA or the token bucket);
    /// [`Error::ZeroLimit`] for a `max_batch` of 0;
    /// [`Error::InsufficientCapacity`] for a `max_batch` above the burst;
    /// [`Error::ZeroDuration`] for a `hold` under 1 ms; [`Error::NoTimer`]
    /// outside a tokio runtime with timers (its background task needs one).
    pub fn new(
        conn: C,
        limiter: Limiter,
        key: &str,
        max_batch: u64,
        hold: Duration,
    ) -> Result<Self> {
        validate::key(key)?;
        if !matches!(
            limiter.algorithm(),
            Algorithm::Gcra | Algorithm::TokenBucket
        ) {
            return Err(Error::InvalidArgument {
                what: "algorithm",
                reason: format!(
                    "a reservoir takes partial batches: gcra or token_bucket, not {}",
                    limiter.algorithm()
                ),
            });
        }
        let max_batch = validate::positive("max_batch", max_batch)?;
        if max_batch > limiter.quota().burst() {
            return Err(Error::InsufficientCapacity {
                requested: max_batch,
                limit: limiter.quota().burst(),
            });
        }
        validate::millis("hold", hold)?;
        timer::check()?;
        let limiter_interval_us = limiter.quota().interval_us();
        let inner = Arc::new(Inner {
            limiter,
            key: key.to_owned(),
            max_batch,
            hold,
            conn: tokio::sync::Mutex::new(conn),
            // The interval the batch script is sent (`check_at_most`).
            pool: Mutex::new(Pool::new(limiter_interval_us)),
        });
        let stop = CancellationToken::new();
        tokio::spawn(Inner::keep(Arc::clone(&inner), stop.clone()));
        Ok(Reservoir {
            inner,
            _stop: stop.drop_guard(),
        })
    }

    /// Admit `cost` units: from the units this process holds if it holds
    /// enough (no I/O), else after one batch call for `cost` and what this
    /// process is likely to need in `hold` more. A batch that grants too
    /// little for `cost` is kept for smaller requests, and the request is
    /// denied with the server's `retry_after`.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::ZeroLimit`] (`cost` 0),
    /// [`Error::InsufficientCapacity`] (`cost` above the burst). From Redis,
    /// those of [`Limiter::check_at_most`]; after
    /// [`Error::Indeterminate`] nothing is added locally.
    pub async fn check(&self, cost: u64) -> Result<Draw> {
        let cost = validate::positive("cost", cost)?;
        let burst = self.inner.limiter.quota().burst();
        if cost > burst {
            return Err(Error::InsufficientCapacity {
                requested: cost,
                limit: burst,
            });
        }
        if let Some(draw) = self.inner.pool().local(cost) {
            return Ok(draw);
        }
        let mut conn = self.inner.conn.lock().await;
        // Another task may have filled the pool (or met a denial) while
        // this one waited.
        if let Some(draw) = self.inner.pool().local(cost) {
            return Ok(draw);
        }
        let sent = Instant::now();
        let want = {
            let mut pool = self.inner.pool();
            let want = pool.batch(cost, self.inner.hold, self.inner.max_batch, Instant::now());
            // What the pool lacks for a batch of `want`, at least what it
            // lacks for `cost`.
            want.saturating_sub(pool.units)
                .max(cost - pool.units.min(cost))
        };
        let granted_before = self.inner.pool().stats.granted;
        let partial = self
            .inner
            .limiter
            .check_at_most(&mut *conn, &self.inner.key, want)
            .await?;
        drop(conn);
        let mut pool = self.inner.pool();
        pool.stats.batch_calls += 1;
        pool.stats.granted += partial.granted;
        let retry_after = partial.state.retry_after;
        // The older batches decay to now; the new one serves this request
        // as the server decided it, at the instant the script ran (none of
        // its slots had begun), and decays from the next request on.
        let now = Instant::now();
        pool.decay(now);
        if let Some(charge) = partial.into_charge() {
            pool.add(charge, sent, now);
        }
        let granted = pool.stats.granted - granted_before;
        let allowed = pool.serve(cost);
        // A batch that came back short means the limit is drained: let
        // units build up on the server for a batch of a quarter of what
        // was asked (at least the cost) before the next call, denying
        // here meanwhile what the pool cannot serve; others drawing from
        // the limit lose nothing (the server keeps what accrues). A denial
        // waits at least the server's own `retry_after` (rounded up by the
        // server: its wait is more than that less 1 ms).
        let short = granted < want;
        let mut retry_after = if allowed {
            None
        } else {
            Some(retry_after.unwrap_or(Duration::from_millis(1)))
        };
        if short {
            let refill = (want / 4).max(cost).saturating_sub(pool.units);
            let interval = self.inner.limiter.quota().emission_interval();
            let wait = interval
                .saturating_mul(u32::try_from(refill).unwrap_or(u32::MAX))
                .max(retry_after.unwrap_or_default());
            if let Some(until) = sent.checked_add(wait.saturating_sub(Duration::from_millis(1))) {
                pool.denied = Some((until, 1));
            }
            if !allowed {
                retry_after = Some(wait);
            }
        }
        Ok(Draw {
            allowed,
            local: false,
            retry_after,
        })
    }

    /// Give back every unit held now (as on drop, but waiting for it).
    /// Returns the units the server credited.
    ///
    /// # Errors
    ///
    /// From Redis, those of [`Charge::refund`]; the units are out of the
    /// pool either way (never admitted again here).
    pub async fn flush(&self) -> Result<u64> {
        let batches = self.inner.pool().expire(None, Instant::now());
        self.inner.give_back(batches).await
    }

    /// The units held now, unused and not yet refilled on the server.
    pub fn held(&self) -> u64 {
        let mut pool = self.inner.pool();
        pool.decay(Instant::now());
        pool.units
    }

    /// What the reservoir did so far.
    pub fn stats(&self) -> ReservoirStats {
        self.inner.pool().stats
    }
}

impl<C> Inner<C>
where
    C: ConnectionLike + Send + 'static,
{
    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        // Nothing panics while holding it; a poisoned pool is still counts.
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refunds the unused units of `batches`; the credited total.
    async fn give_back(&self, batches: Vec<(Charge, u64)>) -> Result<u64> {
        let mut credited = 0;
        let mut first_error = None;
        let mut conn = self.conn.lock().await;
        for (mut charge, left) in batches {
            if left == 0 {
                continue;
            }
            match charge.refund(&mut *conn, left).await {
                Ok(r) => credited += r.credited,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(credited),
        }
    }

    /// The background task: every quarter of `hold`, return the batches
    /// held longer than `hold` and those that can serve nothing more; when
    /// stopped, return everything.
    async fn keep(self: Arc<Self>, stop: CancellationToken) {
        let tick = (self.hold / 4).max(Duration::from_millis(1));
        loop {
            let Ok(sleep) = timer::sleep(tick) else {
                break;
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = sleep => {}
            }
            let now = Instant::now();
            let cutoff = now.checked_sub(self.hold).unwrap_or(now);
            let due = self.pool().expire(Some(cutoff), now);
            // A failed return leaves the units to drain on the server.
            let _ = self.give_back(due).await;
        }
        let all = self.pool().expire(None, Instant::now());
        let _ = self.give_back(all).await;
    }
}

impl<C> fmt::Debug for Reservoir<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservoir")
            .field("limiter", &self.inner.limiter)
            .field("key", &self.inner.key)
            .field("max_batch", &self.inner.max_batch)
            .field("hold", &self.inner.hold)
            .finish_non_exhaustive()
    }
}
