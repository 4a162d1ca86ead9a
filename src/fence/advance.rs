//! Raising a fence counter after it went back: [`advance`], [`AdvanceFence`].

use redis::aio::ConnectionLike;

use super::{Keys, MAX_FENCE};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{Error, Result};

static ADVANCE: Script = embedded!("fence/advance");

/// The outcome of [`advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "check that the counter is where the resource needs it"]
pub struct Advance {
    /// True when the counter was at or below the floor (or missing) and was
    /// raised to one above it.
    pub raised: bool,
    /// The counter afterwards: always above the floor. The next grant's
    /// fence is `counter + 1`.
    pub counter: u64,
}

/// Raise the fence counter of `resource` **above** `floor`; never lower it.
///
/// The recovery step after the counter went back (a restart without
/// persistence, a failover to a replica that had not seen the last grants;
/// [`super::durability`] tells whether your server can do that): pass the
/// highest fence the protected resource has seen (`SELECT max(fence) FROM
/// ...`, or the fence of [`super::read`]). The counter ends at `floor + 1`
/// or above, so:
///
/// * every later grant is above every fence the resource has seen, and the
///   resource accepts the new holder's writes;
/// * every holder of a fence at or below the floor is refused as
///   [`super::Write::Stale`], including two holders a failover gave the
///   same fence (a counter left *at* the floor would still accept both:
///   a write equal to the counter is the newest grant's);
/// * a holder that takes its lock again with the same token keeps its own
///   fence (now stale), never the floor.
///
/// Run it before taking new grants.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`floor` 0),
/// [`Error::OutOfRange`] (at or above `i64::MAX`: the counter, one above,
/// must fit Redis' integer limit). From Redis: [`Error::Redis`] (the counter
/// holds something nolock did not write; nothing was written) and
/// [`Error::Indeterminate`] (safe to retry: advancing past the same floor
/// twice is the same as once).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection, db: &tokio_postgres::Client)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// // At startup: the database has seen fences up to max(fence).
/// let row = db.query_one("SELECT coalesce(max(fence), 0) FROM payouts", &[]).await?;
/// let highest = u64::try_from(row.get::<_, i64>(0))?;
/// if highest > 0 {
///     let advanced = nolock::fence::advance(conn, "payouts", highest).await?;
///     assert!(advanced.counter > highest);
/// }
/// # Ok(()) }
/// ```
pub async fn advance<C>(conn: &mut C, resource: &str, floor: u64) -> Result<Advance>
where
    C: ConnectionLike + Send,
{
    run_one(&AdvanceFence::new(resource, floor)?, conn).await
}

/// [`advance`] as a value, for a [`crate::Batch`] (many resources after a
/// failover) or an operation id.
#[derive(Debug, Clone)]
pub struct AdvanceFence {
    call: Invocation,
}

impl AdvanceFence {
    /// Raise `resource`'s counter above `floor`.
    ///
    /// # Errors
    ///
    /// As [`advance`], before any I/O.
    pub fn new(resource: &str, floor: u64) -> Result<Self> {
        let keys = Keys::of(resource)?;
        if floor == 0 {
            return Err(Error::ZeroLimit { what: "floor" });
        }
        if floor >= MAX_FENCE {
            return Err(Error::OutOfRange {
                what: "floor",
                given: floor,
                max: MAX_FENCE - 1,
            });
        }
        Ok(AdvanceFence {
            call: Invocation::new(&ADVANCE, &[&keys.fence]).arg(floor.to_string()),
        })
    }
}

impl Operation for AdvanceFence {
    type Output = Advance;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: redis::Value) -> Result<Advance> {
        let mut reply = Reply::new(ADVANCE.name(), value)?;
        let raised = reply.flag()?;
        let counter = reply.uint()?;
        reply.finish()?;
        Ok(Advance { raised, counter })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;

    #[test]
    fn advance_takes_a_floor_whose_successor_redis_can_store() {
        let op = AdvanceFence::new("r", 9).unwrap();
        assert_eq!(
            words(op.invocation().command()),
            ["EVALSHA", ADVANCE.sha1(), "1", "{r}:fence", "9"]
        );
        assert!(AdvanceFence::new("r", MAX_FENCE - 1).is_ok());
        assert!(matches!(
            AdvanceFence::new("r", MAX_FENCE),
            Err(Error::OutOfRange { what: "floor", .. })
        ));
        assert!(matches!(
            AdvanceFence::new("r", 0),
            Err(Error::ZeroLimit { what: "floor" })
        ));
        assert!(matches!(AdvanceFence::new("", 1), Err(Error::EmptyKey)));
    }
}
