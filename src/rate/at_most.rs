//! [`Limiter::check_at_most`]: partial grants, `lua/rate/<algorithm>/check_at_most.lua`.
//!
//! Separate scripts rather than a mode of `check.lua`: `check` is all or
//! nothing across several limits, while a partial grant only makes sense
//! for one limit (which limit's "available" would bound a multi-limit
//! grant?). GCRA and the token bucket support it: their state says exactly
//! how many units fit now. The windows do not: a sliding window's estimate
//! is weighted, and a grant of "what is left" there would be the same
//! script as a fixed window with a loop; ask if you need it.

use redis::aio::ConnectionLike;

use super::state::State;
use super::{Algorithm, Charge, Limiter, Quota, RateLimit};
use crate::script::{embedded, Invocation, Reply, Script};
use crate::{validate, Error, Result};

static GCRA: Script = embedded!("rate/gcra/check_at_most");
static TOKEN_BUCKET: Script = embedded!("rate/token_bucket/check_at_most");

/// The answer of [`Limiter::check_at_most`]: a partial grant.
///
/// Not `Copy` and not `Clone`: when units were granted it carries their
/// [`Charge`] (of cost `granted`), to give back what goes unused.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "only the granted units may be used"]
pub struct Partial {
    /// Units taken by this call: `min(max, available)`, possibly 0.
    pub granted: u64,
    /// The limiter after the call: `allowed` is `granted > 0`, `remaining`
    /// what still fits, `retry_after` (when nothing was granted) how long
    /// until one unit fits. Pass it to [`Limiter::headers`].
    pub state: RateLimit,
    charge: Option<Charge>,
}

impl Partial {
    /// The charge of the granted units, when any were granted.
    pub fn charge_mut(&mut self) -> Option<&mut Charge> {
        self.charge.as_mut()
    }

    /// The charge of the granted units, to keep beyond the answer.
    pub fn into_charge(self) -> Option<Charge> {
        self.charge
    }
}

impl Limiter {
    /// Take as many units as fit now, up to `max`, and charge exactly those
    /// (go-redis/redis_rate's `AllowAtMost`). One script call. A grant of 0
    /// takes nothing.
    ///
    /// Supported by [`Algorithm::Gcra`] and [`Algorithm::TokenBucket`]; the
    /// window algorithms answer [`Error::InvalidArgument`].
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`], [`Error::ZeroLimit`] (`max` 0),
    /// [`Error::OutOfRange`] (`max` above 2^53 - 1),
    /// [`Error::InvalidArgument`] (a window algorithm). From Redis:
    /// [`Error::Redis`] (e.g. the key holds another shape; nothing was
    /// written) and [`Error::Indeterminate`] (units may have been taken).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use nolock::rate::{Algorithm, Limiter, Quota};
    ///
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let sends = Limiter::new(Algorithm::Gcra, Quota::per_second(50)?)?;
    /// let queued = 120;
    /// let grant = sends.check_at_most(conn, "rl:mailer", queued).await?;
    /// println!("send {} now, {} wait", grant.granted, queued - grant.granted);
    /// # Ok(()) }
    /// ```
    pub async fn check_at_most<C>(&self, conn: &mut C, key: &str, max: u64) -> Result<Partial>
    where
        C: ConnectionLike + Send,
    {
        let call = at_most_call(self, key, max)?;
        let issuer = self.issuer(key, max);
        let value = call.run(conn).await?;
        let (granted, state) = decode(
            call.script().name(),
            value,
            self.algorithm(),
            self.quota(),
            max,
        )?;
        crate::observe::decision(self.name(), granted > 0);
        Ok(Partial {
            granted,
            state,
            charge: (granted > 0).then(|| issuer.charge(granted, state.at, state.reset_after)),
        })
    }
}

fn at_most_call(limiter: &Limiter, key: &str, max: u64) -> Result<Invocation> {
    validate::key(key)?;
    let max = validate::positive("max", max)?;
    let script = match limiter.algorithm() {
        Algorithm::Gcra => &GCRA,
        Algorithm::TokenBucket => &TOKEN_BUCKET,
        other => {
            return Err(Error::InvalidArgument {
                what: "algorithm",
                reason: format!("check_at_most supports gcra and token_bucket, not {other}"),
            })
        }
    };
    let quota = limiter.quota();
    let call = Invocation::new(script, &[key])
        .arg(max)
        .arg(quota.interval_us())
        .arg(quota.burst());
    Ok(if limiter.adopts() {
        call.arg(super::ADOPT)
    } else {
        call
    })
}

/// Decodes `{granted, now, state}`: the limit's raw state after the call
/// (as the check scripts return it), answered as a check of one unit, so
/// that `remaining`, `retry_after`, `reset_after` and `debt` follow the same
/// formulas as [`Limiter::check`]'s.
fn decode(
    script: &'static str,
    value: redis::Value,
    algorithm: Algorithm,
    quota: &Quota,
    max: u64,
) -> Result<(u64, RateLimit)> {
    let mut reply = Reply::new(script, value)?;
    let granted = reply.uint()?;
    let now = reply.uint()?;
    let state = State::read(algorithm, &mut reply)?;
    reply.finish()?;
    let answer = if granted <= max {
        state.answer(quota, now, 1, granted > 0)
    } else {
        None
    };
    match answer {
        // Nothing granted must mean that one unit does not fit.
        Some(answer) if answer.allowed == (granted > 0) => Ok((granted, answer)),
        _ => Err(Error::UnexpectedReply {
            script,
            detail: format!("granted {granted} of {max} at {now} with {state:?}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::Int;
    use std::time::Duration;

    #[test]
    fn builds_one_call_for_gcra_and_token_bucket_only() {
        let q = Quota::per_second(10).unwrap().with_burst(20).unwrap();
        let gcra = Limiter::new(Algorithm::Gcra, q).unwrap();
        let call = at_most_call(&gcra, "k", 50).unwrap();
        assert_eq!(
            words(call.command()),
            ["EVALSHA", GCRA.sha1(), "1", "k", "50", "100000", "20"]
        );
        let tb = Limiter::new(Algorithm::TokenBucket, q).unwrap();
        assert_eq!(
            at_most_call(&tb, "k", 1).unwrap().script().name(),
            "rate/token_bucket/check_at_most"
        );
        let window = Limiter::new(Algorithm::FixedWindow, Quota::per_second(10).unwrap()).unwrap();
        assert!(matches!(
            at_most_call(&window, "k", 1),
            Err(Error::InvalidArgument {
                what: "algorithm",
                ..
            })
        ));
        assert!(matches!(
            at_most_call(&gcra, "k", 0),
            Err(Error::ZeroLimit { what: "max" })
        ));
        assert!(matches!(at_most_call(&gcra, "", 1), Err(Error::EmptyKey)));
    }

    #[test]
    fn decodes_grants_and_refuses_inconsistent_ones() {
        // 10 per second, burst 10: T = 100 ms.
        let q = Quota::per_second(10).unwrap();
        let arr = |v: &[i64]| redis::Value::Array(v.iter().map(|&x| Int(x)).collect());
        let now = 1_000_000_000_000;
        let gcra = |v: &[i64], max| decode("t", arr(v), Algorithm::Gcra, &q, max);
        // 7 granted, none left: the TAT is a full burst ahead.
        let (granted, state) = gcra(&[7, now, now + 1_000_000], 20).unwrap();
        assert_eq!((granted, state.allowed, state.remaining), (7, true, 0));
        assert_eq!((state.retry_after, state.debt), (None, 0));
        assert_eq!(state.reset_after, Duration::from_millis(1000));
        // Nothing granted: one unit fits in 100 ms.
        let (_, none) = gcra(&[0, now, now + 1_000_000], 20).unwrap();
        assert_eq!(none.retry_after, Some(Duration::from_millis(100)));
        assert!(!none.allowed);
        // A settlement left 3 units of debt: it says so, and waits them out.
        let (_, owed) = gcra(&[0, now, now + 1_300_000], 20).unwrap();
        assert_eq!((owed.debt, owed.remaining), (3, 0));
        assert_eq!(owed.retry_after, Some(Duration::from_millis(400)));
        assert!(
            gcra(&[0, now, now], 20).is_err(),
            "a unit fit, none granted"
        );
        assert!(
            gcra(&[21, now, now + 1_000_000], 20).is_err(),
            "more than max"
        );
        assert!(gcra(&[1, now, now - 1], 20).is_err(), "TAT behind now");
        assert!(gcra(&[1, now], 20).is_err(), "short reply");
        let bucket = |v: &[i64]| decode("t", arr(v), Algorithm::TokenBucket, &q, 20);
        let (granted, state) = bucket(&[7, now, 0, now]).unwrap();
        assert_eq!((granted, state.remaining, state.debt), (7, 0, 0));
        // An empty bucket whose refill starts 250 ms from now owes 3 tokens.
        let (_, owed) = bucket(&[0, now, 0, now + 250_000]).unwrap();
        assert_eq!((owed.allowed, owed.debt), (false, 3));
        assert_eq!(owed.retry_after, Some(Duration::from_millis(350)));
        assert!(bucket(&[0, now, 11, now]).is_err(), "above capacity");
        assert!(
            bucket(&[0, now, 2, now]).is_err(),
            "tokens left, none granted"
        );
    }
}
