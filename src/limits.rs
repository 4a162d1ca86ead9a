//! Bounded counters: "at most `limit` per `window`".
//!
//! A counter is one Redis key holding its count, tagged with the limit and
//! the window that wrote it (`c100x60000:42`), whose TTL is the window. Each
//! call is one Lua script, so reading the count, deciding and writing happen
//! in one atomic step on the server, in one round trip, with no lock:
//!
//! | call | script | what it does |
//! |---|---|---|
//! | [`try_increment`], [`Counter::try_increment`] | `lua/limits/try_increment.lua` | add 1 if the count stays `<= limit` |
//! | [`Counter::try_increment_by`] | same | add `n`, all or nothing |
//! | [`peek`], [`Counter::peek`] | `lua/limits/peek.lua` | read the count and time left; writes nothing |
//!
//! A [`Counter`] holds the limit and the window, built once and shared by
//! every caller of a key (so they agree on them); [`try_increment`] is the
//! one-line form. A counter gives nothing back: units handed back to a key
//! would be units of whatever window holds the key then, which is how
//! counting work in flight with a counter over-admits (below). To give a
//! request's units back, use [`crate::rate::Limiter`] with
//! [`crate::rate::Algorithm::FixedWindow`] (the same window) and refund its
//! charge, which knows its window.
//!
//! **As a fixed-window limit** ("100 requests per minute per user"): call
//! [`try_increment`] per request. The first admitted increment starts the
//! window (sets the key's expiry); when it expires the count starts again
//! from zero. Like every fixed window it allows up to `2 × limit` across a
//! window boundary; [`crate::rate`] offers smoother algorithms.
//!
//! **Not for "at most `limit` at once"** ("at most 10 exports running"): use
//! [`crate::semaphore`]. Counting running work with a counter (increment
//! when it starts, decrement when it ends) over-admits: the counter expires
//! one window after its *first* holder while later holders still run, and
//! their decrements then lower the fresh counter. With a limit of 2, a 1 s
//! window and 600 ms jobs, 12 workers reached 8 running at once within 5 s
//! (`tests/semaphore.rs` runs that recipe beside the semaphore). The
//! semaphore tracks each holder's own expiry instead.
//!
//! A denied call changes nothing, so a client that keeps retrying while denied
//! does not push its own reset further away.
//!
//! **One key, one counter**: a call whose limit or window differs from the
//! ones that wrote the key (another [`Counter`], another [`try_increment`])
//! is refused with [`Error::StateMismatch`], and nothing is written: two
//! callers would otherwise decide one count by two limits. So is any other
//! limit's state ([`crate::rate`], [`crate::semaphore`]). A count written
//! before tags existed is read as it is and tagged at its next increment.
//! To change a counter's numbers under running callers, store them
//! ([`crate::config`], [`crate::Client::counter`]): its handles take the
//! counts over.
//!
//! **Many counters at once**: each call also exists as a value
//! ([`TryIncrement`], [`PeekCounter`]) that checks its input when built; put
//! many in a [`crate::Batch`] to send them in one round trip per server.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use nolock::limits::Counter;
//!
//! # async fn handler(conn: &mut redis::aio::MultiplexedConnection, user: &str)
//! #     -> Result<(), nolock::Error> {
//! let api = Counter::new(100, Duration::from_secs(60))?; // once, at startup
//! let admission = api.try_increment(conn, &format!("limit:{user}")).await?;
//! if !admission.admitted {
//!     let wait = admission.reset_after.unwrap_or_default();
//!     println!("429 Too Many Requests, retry in {} ms", wait.as_millis());
//!     return Ok(());
//! }
//! println!("200 OK; {} left in this window", admission.remaining);
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::rate::{headers, Headers};
use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

static TRY_INCREMENT: Script = embedded!("limits/try_increment");
static PEEK: Script = embedded!("limits/peek");

/// A bounded counter: "at most `limit` per `window`", checked once when
/// built and shared by every caller of a key, so that they agree on both.
/// Cheap to clone. Its name (`"default"` unless [`Counter::named`]) is the
/// policy name in its [headers](Counter::headers).
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::limits::Counter;
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let api = Counter::new(100, Duration::from_secs(60))?;
/// let a = api.try_increment(conn, "api:user:42").await?;
/// let batch = api.try_increment_by(conn, "api:user:42", 20).await?; // a batch of 20 costs 20
/// # let _ = (a, batch);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Counter {
    limit: u64,
    window_ms: u64,
    name: Arc<str>,
    /// Sends "adopt": a counter of other numbers on a key is read as it is
    /// and retagged (a managed handle, whose numbers were changed on
    /// purpose; `lua/lib/tag.lua`).
    adopt: bool,
}

impl Counter {
    /// At most `limit` per `window` (millisecond precision).
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`], [`Error::OutOfRange`] (limit above 2^53 - 1),
    /// [`Error::ZeroDuration`] (under 1 ms), [`Error::DurationTooLong`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::limits::Counter;
    ///
    /// assert!(Counter::new(100, Duration::from_secs(60)).is_ok());
    /// assert!(Counter::new(0, Duration::from_secs(60)).is_err());
    /// assert!(Counter::new(100, Duration::ZERO).is_err());
    /// ```
    pub fn new(limit: u64, window: Duration) -> Result<Counter> {
        Ok(Counter {
            limit: validate::positive("limit", limit)?,
            window_ms: validate::millis("window", window)?,
            name: Arc::from("default"),
            adopt: false,
        })
    }

    /// The same counter, reading a key's counter of other numbers as it is
    /// and retagging it with its own (the "adopt" argument of
    /// `lua/lib/tag.lua`): for a handle whose stored numbers were changed
    /// on purpose ([`crate::config`]).
    pub(crate) fn adopting(mut self) -> Self {
        self.adopt = true;
        self
    }

    /// The same counter under another name: the policy name in the
    /// `RateLimit-Policy` and `RateLimit` headers. The name is not part of
    /// any key.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `name` is 1 to 64 characters of
    /// ASCII letters, digits, `_`, `-`, `.` and `:` (as
    /// [`crate::rate::Limiter::named`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::limits::Counter;
    ///
    /// let api = Counter::new(100, Duration::from_secs(60))?.named("api")?;
    /// assert_eq!(api.name(), "api");
    /// assert!(Counter::new(100, Duration::from_secs(60))?.named("a b").is_err());
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn named(self, name: &str) -> Result<Counter> {
        Ok(Counter {
            name: Arc::from(crate::rate::valid_name(name)?),
            ..self
        })
    }

    /// The policy name in the headers (`"default"` unless named).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limit.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The window, in whole milliseconds.
    pub const fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// Add 1 to the counter at `key` if that keeps it at most the limit.
    ///
    /// The first admitted increment sets the key to expire after the window.
    /// A denied call consumes nothing (the one write it can make: giving the
    /// window to a counter found without any expiry, which would otherwise
    /// deny forever). One round trip.
    ///
    /// # Errors
    ///
    /// Before any I/O: [`Error::EmptyKey`]. From Redis:
    /// [`Error::StateMismatch`] when the key holds a counter of another limit
    /// or window, or another limit's state (nothing was written);
    /// [`Error::Redis`] (for example `WRONGTYPE` when the key holds something
    /// else; nothing was written) and [`Error::Indeterminate`] (the increment
    /// may have been applied; it is not retried: give a [`TryIncrement`] an
    /// operation id to resend it safely).
    pub async fn try_increment<C>(&self, conn: &mut C, key: &str) -> Result<Admission>
    where
        C: ConnectionLike + Send,
    {
        run_one(&TryIncrement::new(self, key)?, conn).await
    }

    /// Add `n` to the counter at `key` if that keeps it at most the limit;
    /// all or nothing.
    ///
    /// # Errors
    ///
    /// As [`Counter::try_increment`], plus [`Error::ZeroLimit`] for `n == 0`
    /// and [`Error::InsufficientCapacity`] when `n` is above the limit (it
    /// could never be admitted, which is different from "not now").
    pub async fn try_increment_by<C>(&self, conn: &mut C, key: &str, n: u64) -> Result<Admission>
    where
        C: ConnectionLike + Send,
    {
        run_one(&TryIncrement::by(self, key, n)?, conn).await
    }

    /// Read the counter at `key` without changing it, as [`peek`], but
    /// only a counter of this limit and window.
    ///
    /// # Errors
    ///
    /// As [`peek`], and [`Error::StateMismatch`] when the key holds a
    /// counter of another limit or window.
    pub async fn peek<C>(&self, conn: &mut C, key: &str) -> Result<CounterUsage>
    where
        C: ConnectionLike + Send,
    {
        run_one(&PeekCounter::of(self, key)?, conn).await
    }

    /// The `RateLimit-Policy`, `RateLimit` and (when denied) `Retry-After`
    /// header values for an answer of this counter. See
    /// [`crate::rate::headers`]:
    ///
    /// * `RateLimit-Policy: "name";q=<limit>;w=<window>`, the window in whole
    ///   seconds, rounded up (a 500 ms window is advertised as `w=1`);
    /// * `RateLimit: "name";r=<remaining>;t=<reset>`, the time until the
    ///   window resets in whole seconds, rounded up;
    /// * `Retry-After: <reset>` after a denial, rounded up and at least 1: a
    ///   denied increment fits again only in the next window, so a client
    ///   that honours it finds a fresh count.
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::limits::{Admission, Counter};
    ///
    /// let api = Counter::new(100, Duration::from_secs(60))?.named("api")?;
    /// let denied = Admission {
    ///     admitted: false,
    ///     count: 100,
    ///     limit: 100,
    ///     remaining: 0,
    ///     reset_after: Some(Duration::from_millis(12_001)),
    /// };
    /// let h = api.headers(&denied);
    /// assert_eq!(h.policy, r#""api";q=100;w=60"#);
    /// assert_eq!(h.rate_limit, r#""api";r=0;t=13"#);
    /// assert_eq!(h.retry_after.as_deref(), Some("13")); // 12.001 s, rounded up
    /// # Ok::<(), nolock::Error>(())
    /// ```
    pub fn headers(&self, admission: &Admission) -> Headers {
        // `None` (a counter without expiry) never comes from nolock's
        // scripts; it is read as "no window to wait for".
        let reset = admission.reset_after.unwrap_or_default();
        Headers {
            policy: headers::window_policy_item(&self.name, self.limit, self.window()),
            rate_limit: headers::remaining_item(&self.name, admission.remaining, reset),
            retry_after: (!admission.admitted).then(|| headers::retry_after_value(reset)),
        }
    }
}

/// The outcome of [`try_increment`]: admitted or not, with the counter's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a denied request must be turned away"]
pub struct Admission {
    /// True when the increment was applied.
    pub admitted: bool,
    /// The counter after the call (unchanged when denied).
    pub count: u64,
    /// The limit the call was checked against.
    pub limit: u64,
    /// How much more fits before the limit: `limit - count` (0 when the
    /// counter is at or above the limit, e.g. after the limit was lowered).
    pub remaining: u64,
    /// Time until the window resets: the key's PTTL + 1 ms, the first moment
    /// the counter is gone (at most `window + 1 ms`). `None` only if the
    /// counter has no expiry, which nolock never leaves behind.
    pub reset_after: Option<Duration>,
}

/// A counter read by [`peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct CounterUsage {
    /// The current count (0 when the key does not exist).
    pub count: u64,
    /// Time until the window resets; `None` when there is no counter.
    pub reset_after: Option<Duration>,
}

impl CounterUsage {
    /// How much more fits under `limit`.
    pub fn remaining(&self, limit: u64) -> u64 {
        limit.saturating_sub(self.count)
    }
}

/// Add 1 to the counter at `key` if that keeps it at most `limit` per
/// `window`: the one-line form of [`Counter::try_increment`].
///
/// # Errors
///
/// Those of [`Counter::new`] and [`Counter::try_increment`].
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// use std::time::Duration;
/// let a = nolock::limits::try_increment(conn, "api:user:42", 100, Duration::from_secs(60)).await?;
/// assert!(a.count <= 100);
/// # Ok(()) }
/// ```
pub async fn try_increment<C>(
    conn: &mut C,
    key: &str,
    limit: u64,
    window: Duration,
) -> Result<Admission>
where
    C: ConnectionLike + Send,
{
    Counter::new(limit, window)?.try_increment(conn, key).await
}

/// [`Counter::try_increment`] and [`Counter::try_increment_by`] as a value,
/// for a [`crate::Batch`] or an operation id. The input is checked when it
/// is built.
///
/// ```
/// use std::time::Duration;
/// use nolock::limits::{Counter, TryIncrement};
///
/// let api = Counter::new(100, Duration::from_secs(60))?;
/// let op = TryIncrement::new(&api, "api:user:42")?;
/// assert!(TryIncrement::by(&api, "api:user:42", 101).is_err()); // could never fit
/// # let _ = op;
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TryIncrement {
    call: Invocation,
    limit: u64,
}

impl TryIncrement {
    /// Add 1 to the counter at `key` if that keeps it at most the limit.
    ///
    /// # Errors
    ///
    /// As [`Counter::try_increment`] before any I/O.
    pub fn new(counter: &Counter, key: &str) -> Result<Self> {
        Self::by(counter, key, 1)
    }

    /// Add `n` to the counter at `key` if that keeps it at most the limit;
    /// all or nothing.
    ///
    /// # Errors
    ///
    /// As [`Counter::try_increment_by`] before any I/O.
    pub fn by(counter: &Counter, key: &str, n: u64) -> Result<Self> {
        validate::key(key)?;
        let n = validate::positive("n", n)?;
        if n > counter.limit {
            return Err(Error::InsufficientCapacity {
                requested: n,
                limit: counter.limit,
            });
        }
        let mut call = Invocation::new(&TRY_INCREMENT, &[key])
            .arg(counter.limit)
            .arg(counter.window_ms)
            .arg(n);
        if counter.adopt {
            call = call.arg("adopt");
        }
        Ok(TryIncrement {
            call,
            limit: counter.limit,
        })
    }
}

impl Operation for TryIncrement {
    type Output = Admission;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<Admission> {
        let mut reply = Reply::new(TRY_INCREMENT.name(), reply)?;
        let admitted = reply.flag()?;
        let count = reply.uint()?;
        let reset_after = pttl(reply.int()?);
        reply.finish()?;
        Ok(Admission {
            admitted,
            count,
            limit: self.limit,
            remaining: self.limit.saturating_sub(count),
            reset_after,
        })
    }
}

/// Read the counter at `key` without changing it, whatever its limit and
/// window. A read needs neither, so it is also this free function
/// ([`Counter::peek`] reads only its own).
///
/// Runs with `EVALSHA_RO`, so it can be served by a replica: on a cluster
/// connection built with a replica read strategy (redis-rs
/// `ClusterClientBuilder::read_routing_strategy`), it is. A replica may lag
/// its primary by a few writes.
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O; [`Error::StateMismatch`] when the
/// key holds another limit's state (not a counter), [`Error::Redis`] (e.g.
/// `WRONGTYPE`) and [`Error::Indeterminate`] from Redis. A read is safe to
/// retry.
pub async fn peek<C>(conn: &mut C, key: &str) -> Result<CounterUsage>
where
    C: ConnectionLike + Send,
{
    run_one(&PeekCounter::new(key)?, conn).await
}

/// [`peek`] as a value, for a [`crate::Batch`]. In a batch on a cluster it is
/// sent to the key's primary, with the batch's other operations.
#[derive(Debug, Clone)]
pub struct PeekCounter {
    call: Invocation,
}

impl PeekCounter {
    /// Read the counter at `key` without changing it.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`].
    pub fn new(key: &str) -> Result<Self> {
        validate::key(key)?;
        Ok(PeekCounter {
            call: Invocation::new(&PEEK, &[key]),
        })
    }

    /// Read the counter at `key` only if `counter`'s numbers wrote it (or
    /// any counter, when `counter` adopts).
    pub(crate) fn of(counter: &Counter, key: &str) -> Result<Self> {
        validate::key(key)?;
        let mut call = Invocation::new(&PEEK, &[key])
            .arg(counter.limit)
            .arg(counter.window_ms);
        if counter.adopt {
            call = call.arg("adopt");
        }
        Ok(PeekCounter { call })
    }
}

impl Operation for PeekCounter {
    type Output = CounterUsage;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: redis::Value) -> Result<CounterUsage> {
        let mut reply = Reply::new(PEEK.name(), reply)?;
        let usage = CounterUsage {
            count: reply.uint()?,
            reset_after: pttl(reply.int()?),
        };
        reply.finish()?;
        Ok(usage)
    }
}

/// The time until a key with this PTTL is gone; `None` for "no key" (-2) or
/// "no expiry" (-1).
///
/// Redis keeps a key through the very millisecond its expiry names (it expires
/// once the clock is *past* it), so the key is gone PTTL + 1 ms from now: a
/// caller that waits exactly `reset_after` finds a fresh window.
fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .map(|ms| Duration::from_millis(ms.saturating_add(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(limit: u64, window: Duration) -> Counter {
        Counter::new(limit, window).unwrap()
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        let w = Duration::from_secs(1);
        assert!(matches!(
            TryIncrement::new(&counter(1, w), ""),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            Counter::new(0, w),
            Err(Error::ZeroLimit { what: "limit" })
        ));
        assert!(matches!(
            TryIncrement::by(&counter(1, w), "k", 0),
            Err(Error::ZeroLimit { what: "n" })
        ));
        assert!(matches!(
            TryIncrement::by(&counter(2, w), "k", 3),
            Err(Error::InsufficientCapacity {
                requested: 3,
                limit: 2
            })
        ));
        assert!(matches!(
            Counter::new(1, Duration::ZERO),
            Err(Error::ZeroDuration { what: "window" })
        ));
        assert!(matches!(
            Counter::new(1, Duration::MAX),
            Err(Error::DurationTooLong { what: "window", .. })
        ));
        assert!(matches!(PeekCounter::new(""), Err(Error::EmptyKey)));
    }

    #[test]
    fn the_commands_carry_their_arguments() {
        let five = counter(5, Duration::from_millis(1500));
        let op = TryIncrement::by(&five, "k", 2).unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            ["EVALSHA", TRY_INCREMENT.sha1(), "1", "k", "5", "1500", "2"]
        );
        let op = TryIncrement::new(&five, "k").unwrap();
        assert_eq!(crate::script::words(op.invocation().command())[6], "1");
        let op = PeekCounter::new("k").unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k"]
        );
        let op = PeekCounter::of(&five, "k").unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k", "5", "1500"]
        );
    }

    #[test]
    fn an_adopting_counter_sends_adopt_last() {
        let five = counter(5, Duration::from_millis(1500)).adopting();
        let op = TryIncrement::by(&five, "k", 2).unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            [
                "EVALSHA",
                TRY_INCREMENT.sha1(),
                "1",
                "k",
                "5",
                "1500",
                "2",
                "adopt"
            ]
        );
        let op = PeekCounter::of(&five, "k").unwrap();
        assert_eq!(
            crate::script::words(op.invocation().command()),
            ["EVALSHA_RO", PEEK.sha1(), "1", "k", "5", "1500", "adopt"]
        );
    }

    fn admission(admitted: bool, remaining: u64, reset_ms: Option<u64>) -> Admission {
        Admission {
            admitted,
            count: 10 - remaining,
            limit: 10,
            remaining,
            reset_after: reset_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn headers_round_every_time_up() {
        let c = counter(10, Duration::from_millis(60_500))
            .named("api")
            .unwrap();
        // Admitted: no Retry-After; 1 ms past a whole second counts as the next one.
        let h = c.headers(&admission(true, 4, Some(30_001)));
        assert_eq!(h.policy, r#""api";q=10;w=61"#);
        assert_eq!(h.rate_limit, r#""api";r=4;t=31"#);
        assert_eq!(h.retry_after, None);
        // Exactly whole seconds stay as they are.
        let h = c.headers(&admission(true, 4, Some(30_000)));
        assert_eq!(h.rate_limit, r#""api";r=4;t=30"#);
        // Denied: Retry-After is the reset, rounded up (as_secs() would say 0).
        let h = c.headers(&admission(false, 0, Some(999)));
        assert_eq!(h.rate_limit, r#""api";r=0;t=1"#);
        assert_eq!(h.retry_after.as_deref(), Some("1"));
        let h = c.headers(&admission(false, 0, Some(2_001)));
        assert_eq!(h.retry_after.as_deref(), Some("3"));
        // Never "retry now", even for a window found without expiry.
        let h = c.headers(&admission(false, 0, None));
        assert_eq!(h.rate_limit, r#""api";r=0;t=0"#);
        assert_eq!(h.retry_after.as_deref(), Some("1"));
    }

    #[test]
    fn sub_second_windows_advertise_one_second() {
        let c = counter(5, Duration::from_millis(100));
        let h = c.headers(&admission(true, 4, Some(101)));
        assert_eq!(h.policy, r#""default";q=5;w=1"#);
        assert_eq!(h.rate_limit, r#""default";r=4;t=1"#);
    }

    #[test]
    fn names_are_checked_and_change_no_key() {
        let c = counter(3, Duration::from_secs(1));
        assert_eq!(c.name(), "default");
        assert!(matches!(
            c.clone().named("a b"),
            Err(Error::InvalidArgument { what: "name", .. })
        ));
        let named = c.clone().named("api").unwrap();
        assert_ne!(named, c);
        let words = |c: &Counter| {
            let op = TryIncrement::new(c, "k").unwrap();
            crate::script::words(op.invocation().command())
        };
        assert_eq!(words(&named), words(&c));
    }

    #[test]
    fn admissions_decode_with_saturating_remaining() {
        use redis::Value::Int;
        let op = TryIncrement::new(&counter(3, Duration::from_secs(1)), "k").unwrap();
        let a = op
            .decode(redis::Value::Array(vec![Int(0), Int(5), Int(10)]))
            .unwrap();
        assert_eq!(
            a,
            Admission {
                admitted: false,
                count: 5,
                limit: 3,
                remaining: 0,
                reset_after: Some(Duration::from_millis(11))
            }
        );
    }
}
