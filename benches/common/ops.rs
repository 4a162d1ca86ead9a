//! The operations under test, each written every way it is compared.
//!
//! | operation | `script` | `lock` and `watch`: the client reads, decides, writes |
//! |---|---|---|
//! | counter | `nolock::limits::try_increment(key, capacity, 1 h)` | `GET` count; admit if below capacity; `SET` count + 1 |
//! | rate limit | `nolock::rate::Limiter` (GCRA, server clock) | GCRA: `GET` the theoretical arrival time; admit if within the burst; `SET` it one interval later |
//! | debit | `nolock::cas::debit` | `GET` balance; admit if at least 7; `SET` balance - 7 |
//! | semaphore | `nolock::semaphore` acquire, work, release | a count of running holders under the lock (see [`super::semaphore`]) |
//!
//! `raw` (counter only) sends the very script that `try_increment` runs, as
//! a hand-written redis-rs `EVALSHA`.
//!
//! The `lock` and `watch` variants share [`Operation::decide`], the decision
//! the script makes inside Redis, moved to the client.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, Quota};
use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

pub use super::subject::{Call, Key, Variant};
use super::{lock, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// A bounded counter: admit while the count is below the capacity.
    Counter,
    /// A GCRA rate limit: a burst of `capacity`, then one per [`RATE_INTERVAL`].
    RateLimit,
    /// A guarded debit: take [`DEBIT_AMOUNT`] only if the balance covers it.
    Debit,
    /// At most [`super::semaphore::PERMITS`] holders at once.
    Semaphore,
}

/// The counter's window: far longer than any run, so no run sees it reset.
pub const COUNTER_WINDOW: Duration = Duration::from_secs(3600);
/// The rate limit's emission interval: one more request per second after the
/// burst ([`Operation::allowance`] counts those). Not longer: `nolock::rate`
/// refuses a burst that takes more than about 71 years to refill, and the
/// throughput runs use bursts of up to 10^9 so that they never deny.
pub const RATE_INTERVAL: Duration = Duration::from_secs(1);
/// What one debit takes; a key opens with `capacity * DEBIT_AMOUNT`.
pub const DEBIT_AMOUNT: u64 = 7;
/// A `watch` call gives up (an error in the run's counts) after this many conflicts.
const WATCH_ATTEMPTS: u32 = 100_000;

/// The SHA1 of `lua/limits/try_increment.lua`, for the `raw` variant.
static TRY_INCREMENT_SHA1: LazyLock<String> = LazyLock::new(|| {
    nolock::Scripts::get("limits/try_increment")
        .map(|script| script.sha1().to_owned())
        .unwrap_or_default()
});

impl Operation {
    pub const ALL: [Operation; 4] = [
        Operation::Counter,
        Operation::RateLimit,
        Operation::Debit,
        Operation::Semaphore,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Operation::Counter => "counter",
            Operation::RateLimit => "rate limit",
            Operation::Debit => "debit",
            Operation::Semaphore => "semaphore",
        }
    }

    /// The variants that can run today.
    pub fn variants(self) -> &'static [Variant] {
        match self {
            Operation::Counter => &[Variant::Script, Variant::Raw, Variant::Lock, Variant::Watch],
            Operation::RateLimit => &[Variant::Script, Variant::Lock, Variant::Watch],
            Operation::Debit => &[Variant::Script, Variant::Lock, Variant::Watch],
            Operation::Semaphore => &[Variant::Script, Variant::Lock],
        }
    }

    /// The most admissions one key may give in a run that lasted `elapsed`.
    pub fn allowance(self, capacity: u64, elapsed: Duration) -> u64 {
        match self {
            Operation::Counter | Operation::Debit => capacity,
            Operation::RateLimit => {
                capacity + (elapsed.as_micros() / RATE_INTERVAL.as_micros()) as u64
            }
            // Holders come and go: over-admissions are counted while they
            // run ([`super::semaphore::faults`]), not from totals.
            Operation::Semaphore => u64::MAX,
        }
    }

    fn opening_balance(capacity: u64) -> u64 {
        capacity * DEBIT_AMOUNT
    }

    /// Write each key's starting state (the debit's opening balances).
    pub async fn setup<C: ConnectionLike + Send>(
        self,
        variant: Variant,
        conn: &mut C,
        keys: &[Key],
        capacity: u64,
    ) -> Result<()> {
        let _ = variant; // every variant of the debit starts from the same balances
        if self == Operation::Debit {
            for chunk in keys.chunks(500) {
                let mut mset = redis::cmd("MSET");
                for key in chunk {
                    mset.arg(&key.data).arg(Self::opening_balance(capacity));
                }
                mset.exec_async(conn).await?;
            }
        }
        Ok(())
    }

    /// One call, written as `variant`: was it admitted?
    pub async fn call<C: ConnectionLike + Send>(
        self,
        variant: Variant,
        call: Call<'_>,
        conn: &mut C,
        rng: &mut fastrand::Rng,
    ) -> Result<bool> {
        if self == Operation::Semaphore {
            return super::semaphore::call(variant, call, conn, rng).await;
        }
        match variant {
            Variant::Script => {
                let admitted = self.script(call, conn).await?;
                pause(call.pause).await;
                Ok(admitted)
            }
            Variant::Raw => {
                let admitted = self.raw(call, conn).await?;
                pause(call.pause).await;
                Ok(admitted)
            }
            Variant::Lock => self.locked(call, conn, rng).await,
            Variant::Watch => self.watched(call, conn).await,
        }
    }

    /// The library call.
    async fn script<C: ConnectionLike + Send>(self, call: Call<'_>, conn: &mut C) -> Result<bool> {
        let key = call.key.data.as_str();
        match self {
            Operation::Counter => {
                let a =
                    nolock::limits::try_increment(conn, key, call.capacity, COUNTER_WINDOW).await?;
                Ok(a.admitted)
            }
            Operation::Debit => {
                let outcome = nolock::cas::debit(conn, key, DEBIT_AMOUNT).await?;
                Ok(outcome.is_applied())
            }
            // GCRA, as the lock and WATCH versions below, decided on the
            // server's clock: a burst of `capacity`, then one per interval.
            // The state is the same TAT in microseconds, so `recorded` reads
            // both alike. Building the limiter is a few checks, no I/O.
            Operation::RateLimit => {
                let quota = Quota::per(1, RATE_INTERVAL)?.with_burst(call.capacity)?;
                let limiter = Limiter::new(Algorithm::Gcra, quota)?;
                Ok(limiter.check(conn, key, 1).await?.allowed)
            }
            Operation::Semaphore => Err("the semaphore runs in super::semaphore".into()),
        }
    }

    /// `try_increment`'s own script, as a hand-written redis-rs `EVALSHA`.
    async fn raw<C: ConnectionLike + Send>(self, call: Call<'_>, conn: &mut C) -> Result<bool> {
        if self != Operation::Counter {
            return Err(format!("no raw variant for the {}", self.label()).into());
        }
        let (admitted, _count, _pttl): (i64, u64, i64) = redis::cmd("EVALSHA")
            .arg(TRY_INCREMENT_SHA1.as_str())
            .arg(1)
            .arg(&call.key.data)
            .arg(call.capacity)
            .arg(COUNTER_WINDOW.as_millis() as u64)
            .arg(1)
            .query_async(conn)
            .await?;
        Ok(admitted == 1)
    }

    /// Under a lock: acquire, `GET`, decide, `SET`, release.
    async fn locked<C: ConnectionLike + Send>(
        self,
        call: Call<'_>,
        conn: &mut C,
        rng: &mut fastrand::Rng,
    ) -> Result<bool> {
        let token = lock::acquire(conn, &call.key.lock, call.lock_ttl, rng).await?;
        let stored: Option<i64> = redis::cmd("GET")
            .arg(&call.key.data)
            .query_async(conn)
            .await?;
        let write = self.decide(&call.key.data, stored, call.capacity);
        // A GC pause, a slow query: the lease can run out right here.
        pause(call.pause).await;
        if let Some(write) = &write {
            write.exec_async(conn).await?;
        }
        // `false` (lost the lock) would come too late to undo the write.
        lock::release(conn, &call.key.lock, &token).await?;
        Ok(write.is_some())
    }

    /// Optimistic: `WATCH`, `GET`, decide, then `MULTI`/`SET`/`EXEC` in one
    /// pipeline; `EXEC` fails if the key changed since `WATCH`, and we retry.
    /// `WATCH` belongs to a connection, so each `watch` task has its own.
    async fn watched<C: ConnectionLike + Send>(self, call: Call<'_>, conn: &mut C) -> Result<bool> {
        let mut pause_once = call.pause;
        for _ in 0..WATCH_ATTEMPTS {
            redis::cmd("WATCH")
                .arg(&call.key.data)
                .exec_async(conn)
                .await?;
            let stored: Option<i64> = redis::cmd("GET")
                .arg(&call.key.data)
                .query_async(conn)
                .await?;
            let Some(write) = self.decide(&call.key.data, stored, call.capacity) else {
                redis::cmd("UNWATCH").exec_async(conn).await?;
                return Ok(false);
            };
            pause(pause_once.take()).await;
            let exec: Value = redis::pipe()
                .atomic()
                .add_command(write)
                .query_async(conn)
                .await?;
            if exec != Value::Nil {
                return Ok(true);
            }
        }
        Err(format!("WATCH lost {WATCH_ATTEMPTS} times in a row").into())
    }

    /// The decision the script makes inside Redis, made by the client from
    /// the value it read: the write that admits, or `None` to deny.
    pub fn decide(self, key: &str, stored: Option<i64>, capacity: u64) -> Option<Cmd> {
        let capacity = capacity as i64;
        let mut set = redis::cmd("SET");
        set.arg(key);
        match self {
            Operation::Counter => {
                let count = stored.unwrap_or(0);
                if count >= capacity {
                    return None;
                }
                set.arg(count + 1);
                match stored {
                    None => set.arg("PX").arg(COUNTER_WINDOW.as_millis() as u64),
                    Some(_) => set.arg("KEEPTTL"),
                };
            }
            Operation::RateLimit => {
                // GCRA on the client's clock, in microseconds: the theoretical
                // arrival time (TAT) moves one interval per admission and may
                // run at most `burst` intervals ahead of now.
                let now = now_micros();
                let interval = RATE_INTERVAL.as_micros() as i64;
                let tat = stored.unwrap_or(now).max(now) + interval;
                if tat - now > capacity * interval {
                    return None;
                }
                let ttl_ms = (tat - now + 999) / 1000;
                set.arg(tat).arg("PX").arg(ttl_ms);
            }
            Operation::Debit => {
                let balance = stored.unwrap_or(0);
                if balance < DEBIT_AMOUNT as i64 {
                    return None;
                }
                set.arg(balance - DEBIT_AMOUNT as i64);
            }
            // Two critical sections, not one decision: see super::semaphore.
            Operation::Semaphore => return None,
        }
        Some(set)
    }

    /// How many admissions the server's state shows at each key, to compare
    /// with how many the callers were told: a difference is a lost update.
    /// `started` is the wall clock just before the run's first call.
    pub async fn recorded<C: ConnectionLike + Send>(
        self,
        variant: Variant,
        conn: &mut C,
        keys: &[Key],
        capacity: u64,
        started: SystemTime,
    ) -> Result<Vec<u64>> {
        if self == Operation::Semaphore {
            return Ok(vec![0; keys.len()]);
        }
        let mut stored: Vec<Option<i64>> = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(500) {
            let mut mget = redis::cmd("MGET");
            for key in chunk {
                mget.arg(&key.data);
            }
            let values: Vec<Option<String>> = mget.query_async(conn).await?;
            // nolock's states carry their tag ("c100x60000:7", lua/lib/tag.lua);
            // the lock-based versions store the bare number.
            for value in values {
                stored.push(match value {
                    None => None,
                    Some(v) => {
                        let number = v.rsplit(':').next().unwrap_or_default();
                        let parsed: i64 = number
                            .parse()
                            .map_err(|_| format!("{v:?} holds no number"))?;
                        Some(parsed)
                    }
                });
            }
        }
        let started = micros_since_epoch(started);
        let interval = RATE_INTERVAL.as_micros() as i64;
        let count = |value: Option<i64>| -> u64 {
            match (self, variant) {
                (Operation::Counter, _) => value.unwrap_or(0).max(0) as u64,
                (Operation::Debit, _) => {
                    let balance = value.unwrap_or(0).max(0) as u64;
                    Self::opening_balance(capacity).saturating_sub(balance) / DEBIT_AMOUNT
                }
                // Admissions come far faster than one per interval, so the
                // TAT never falls behind the clock: it sits one interval past
                // the first call per admission it recorded.
                (Operation::RateLimit, _) => value.map_or(0, |tat| {
                    let intervals = (tat - started) as f64 / interval as f64;
                    intervals.round().max(0.0) as u64
                }),
                // Not a total: run() takes the semaphore's faults from
                // super::semaphore::faults instead.
                (Operation::Semaphore, _) => 0,
            }
        };
        Ok(stored.into_iter().map(count).collect())
    }
}

async fn pause(length: Option<Duration>) {
    if let Some(length) = length {
        tokio::time::sleep(length).await;
    }
}

fn micros_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

pub fn now_micros() -> i64 {
    micros_since_epoch(SystemTime::now())
}
