//! [`Limiter::check_at_most`]: partial grants, `lua/rate/<algorithm>/check_at_most.lua`.
//!
//! Separate scripts rather than a mode of `check.lua`: `check` is all or
//! nothing across several limits, while a partial grant only makes sense
//! for one limit (which limit's "available" would bound a multi-limit
//! grant?). GCRA and the token bucket support it: their state says exactly
//! how many units fit now. The windows do not: a sliding window's estimate
//! is weighted, and a grant of "what is left" there would be the same
//! script as a fixed window with a loop; ask if you need it.

use std::time::{Duration, UNIX_EPOCH};

use redis::aio::ConnectionLike;

use super::{Algorithm, Charge, Limiter, RateLimit};
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
        let (granted, state) = decode(call.script().name(), value, self.quota().burst(), max)?;
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
    Ok(Invocation::new(script, &[key])
        .arg(max)
        .arg(quota.interval_us())
        .arg(quota.burst()))
}

/// Decodes `{granted, now, remaining, retry_after, reset_after}`.
fn decode(
    script: &'static str,
    value: redis::Value,
    limit: u64,
    max: u64,
) -> Result<(u64, RateLimit)> {
    let mut reply = Reply::new(script, value)?;
    let granted = reply.uint()?;
    let at = UNIX_EPOCH + Duration::from_micros(reply.uint()?);
    let remaining = reply.uint()?;
    let retry = reply.int()?;
    let reset = reply.uint()?;
    reply.finish()?;
    let retry_after = match (granted, u64::try_from(retry)) {
        (1.., _) if retry == -1 && granted <= max => None,
        (0, Ok(ms)) => Some(Duration::from_millis(ms)),
        _ => {
            return Err(Error::UnexpectedReply {
                script,
                detail: format!("granted {granted} of {max} with retry_after = {retry}"),
            })
        }
    };
    Ok((
        granted,
        RateLimit {
            allowed: granted > 0,
            limit,
            remaining,
            retry_after,
            reset_after: Duration::from_millis(reset),
            at,
            debt: 0,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::Quota;
    use crate::script::words;
    use redis::Value::Int;

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
        let arr = |v: [i64; 5]| redis::Value::Array(v.iter().map(|&x| Int(x)).collect());
        let (granted, state) = decode("t", arr([7, 1_000_000, 0, -1, 1000]), 10, 20).unwrap();
        assert_eq!((granted, state.allowed, state.remaining), (7, true, 0));
        assert_eq!(state.retry_after, None);
        let (_, none) = decode("t", arr([0, 1_000_000, 0, 100, 1000]), 10, 20).unwrap();
        assert_eq!(none.retry_after, Some(Duration::from_millis(100)));
        assert!(!none.allowed);
        assert!(decode("t", arr([0, 1, 0, -1, 0]), 10, 20).is_err());
        assert!(decode("t", arr([3, 1, 0, 5, 0]), 10, 20).is_err());
        assert!(
            decode("t", arr([21, 1, 0, -1, 0]), 10, 20).is_err(),
            "more than max"
        );
    }
}
