//! What is measured: nolock, each peer called through its public API as a new
//! user would, and minimal reference scripts written here for the cost targets.
//!
//! Every peer is built on its own redis-rs version (0.25, 0.29, 0.32, 1.8),
//! so each gets its own connection to the same server.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use nolock::fence::{Lock, LockAttempt, Token};
use nolock::rate::{Algorithm, Limiter, Quota, Reservoir};
use redis::aio::MultiplexedConnection;
use throttle_kit::RateLimitBackend;
use tower::{Layer, ServiceExt};

use crate::measure::{call, decision, Call, Decision, Error};

/// The two regimes of the GCRA table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// A quota no call reaches: every call admits and writes.
    Admit,
    /// 10/s, burst 10 (also the correctness sequence): on a hot key nearly
    /// every call is denied and writes nothing.
    Deny,
}

/// Connections of every client library to the one server.
pub struct Conns {
    pub url: String,
    pub nolock: MultiplexedConnection,
    tower: redis_032::aio::MultiplexedConnection,
    throttle: Arc<throttle_kit::RedisBackend>,
    redis_rate: redis_rate::Limiter,
}

impl Conns {
    pub async fn open(url: &str) -> Result<Conns, Error> {
        let nolock = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let tower = redis_032::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let throttle = throttle_kit::RedisBackend::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let redis_rate = redis_rate::Limiter::new(redis_029::Client::open(url)?);
        Ok(Conns {
            url: url.to_owned(),
            nolock,
            tower,
            throttle: Arc::new(throttle),
            redis_rate,
        })
    }
}

/// A GCRA limiter under test: its name, how it is used, and its check.
pub struct Gcra {
    pub name: &'static str,
    pub how: &'static str,
    pub check: fn(&Conns, Regime) -> Result<Call, Error>,
}

pub const GCRA: [Gcra; 5] = [
    Gcra {
        name: "nolock",
        how: "rate::Limiter (Gcra), server TIME",
        check: nolock_gcra,
    },
    Gcra {
        name: "nolock Reservoir",
        how: "rate::Reservoir over the same limiter: batches of up to 100 units \
              (the burst, if smaller) taken with check_at_most, decided in the process, \
              unused units given back after 100 ms",
        check: nolock_reservoir,
    },
    Gcra {
        name: "tower-rate-limit-redis",
        how: "tower layer, server TIME; 429 + Retry-After (s)",
        check: tower_gcra,
    },
    Gcra {
        name: "throttle-kit",
        how: "RedisBackend, client clock",
        check: throttle_gcra,
    },
    Gcra {
        name: "redis-rate",
        how: "sync Limiter::allow: a new connection per call",
        check: redis_rate_gcra,
    },
];

fn nolock_gcra(conns: &Conns, regime: Regime) -> Result<Call, Error> {
    let quota = match regime {
        Regime::Admit => Quota::per_second(1_000_000)?,
        Regime::Deny => Quota::per_second(10)?.with_burst(10)?,
    };
    let limiter = Limiter::new(Algorithm::Gcra, quota)?;
    let conn = conns.nolock.clone();
    Ok(call(move |key| {
        let (limiter, mut conn) = (limiter.clone(), conn.clone());
        async move {
            let d = limiter.check(&mut conn, &key, 1).await?;
            Ok(decision(d.allowed, Some(d.remaining), d.retry_after))
        }
    }))
}

/// One [`Reservoir`] per key (the rows change keys between rounds), each
/// drawing from the limiter of [`nolock_gcra`]'s regime.
fn nolock_reservoir(conns: &Conns, regime: Regime) -> Result<Call, Error> {
    let quota = match regime {
        Regime::Admit => Quota::per_second(1_000_000)?,
        Regime::Deny => Quota::per_second(10)?.with_burst(10)?,
    };
    let batch = quota.burst().min(100);
    let limiter = Limiter::new(Algorithm::Gcra, quota)?;
    let conn = conns.nolock.clone();
    type Pools = HashMap<String, Arc<Reservoir<MultiplexedConnection>>>;
    let pools: Arc<Mutex<Pools>> = Arc::default();
    Ok(call(move |key| {
        let (limiter, conn, pools) = (limiter.clone(), conn.clone(), pools.clone());
        async move {
            let reservoir = {
                let mut pools = pools.lock().map_err(|_| "a poisoned lock")?;
                match pools.get(&key) {
                    Some(r) => r.clone(),
                    None => {
                        let hold = Duration::from_millis(100);
                        let r = Arc::new(Reservoir::new(conn, limiter, &key, batch, hold)?);
                        pools.insert(key.clone(), r.clone());
                        r
                    }
                }
            };
            let d = reservoir.check(1).await?;
            Ok(decision(d.allowed, None, d.retry_after))
        }
    }))
}

/// tower-rate-limit-redis takes its key from the request: here a header.
#[derive(Clone)]
struct HeaderKey;

impl tower_rate_limit_redis::KeyResolver for HeaderKey {
    type Key = String;
    type ErrorBody = ();
    fn key<T>(&self, req: &Request<T>) -> Result<String, Response<()>> {
        req.headers()
            .get("x-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| Response::new(()))
    }
}

fn tower_gcra(conns: &Conns, regime: Regime) -> Result<Call, Error> {
    // capacity is a u16 and the interval whole milliseconds: the roomiest quota is 1000/s, burst 65535.
    let (capacity, interval) = match regime {
        Regime::Admit => (u16::MAX, Duration::from_millis(1)),
        Regime::Deny => (10, Duration::from_millis(100)),
    };
    let layer = tower_rate_limit_redis::RateLimitLayer::builder()
        .conn(conns.tower.clone())
        .key_resolver(HeaderKey)
        .capacity(capacity)
        .emission_interval(interval)
        .build();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    Ok(call(move |key| {
        let service = service.clone();
        async move {
            let request = Request::builder().header("x-key", key).body(())?;
            let response = service.oneshot(request).await?;
            let allowed = match response.status() {
                StatusCode::OK => true,
                StatusCode::TOO_MANY_REQUESTS => false,
                other => return Err(format!("tower-rate-limit-redis: {other}").into()),
            };
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .map(Duration::from_secs);
            Ok(Decision {
                allowed,
                remaining: None,
                retry_after,
            })
        }
    }))
}

fn throttle_gcra(conns: &Conns, regime: Regime) -> Result<Call, Error> {
    // It works in whole milliseconds: per_second(10^6) would be a 0 ms interval.
    let quota = match regime {
        Regime::Admit => throttle_kit::Quota::from_parts(Duration::from_millis(1), 1_000_000),
        Regime::Deny => throttle_kit::Quota::per_second(10),
    };
    let backend = conns.throttle.clone();
    Ok(call(move |key| {
        let backend = backend.clone();
        async move {
            // Fails open: a Redis error comes back as an admission.
            let d = backend.check(&key, &quota).await;
            Ok(decision(d.allowed, Some(d.remaining), d.retry_after))
        }
    }))
}

fn redis_rate_gcra(conns: &Conns, regime: Regime) -> Result<Call, Error> {
    let limit = match regime {
        Regime::Admit => redis_rate::Limit::new(1_000_000, 1_000_000, 1),
        Regime::Deny => redis_rate::Limit::new(10, 10, 1),
    };
    let limiter = conns.redis_rate.clone();
    Ok(call(move |key| {
        let (limiter, limit) = (limiter.clone(), limit.clone());
        async move {
            // Its API is blocking: run it off the async workers.
            let d = tokio::task::spawn_blocking(move || limiter.allow(&key, &limit)).await??;
            Ok(decision(
                !d.limited,
                Some(d.remaining as u64),
                d.retry_after,
            ))
        }
    }))
}

// ---- Reference scripts for the server-cost targets (written here) ----

/// The design card's bounded counter: GET, compare, INCR, EXPIRE.
/// KEYS[1] counter; ARGV limit, window ms, n. Reply {admitted, count}.
const CARD_COUNTER: &str = r"
local limit, window, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count + n > limit then return {0, count} end
count = redis.call('INCRBY', KEYS[1], n)
if count == n then redis.call('PEXPIRE', KEYS[1], window) end
return {1, count}
";

/// SET NX PX, then INCR of the fence counter. KEYS lock, counter; ARGV token, ttl ms.
/// Reply: the fence, or 0 when the lock is held.
const REF_ACQUIRE: &str = r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
return redis.call('INCR', KEYS[2])
";

/// Token-checked release. KEYS lock; ARGV token. Reply 1 when released.
const REF_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
";

pub const TTL: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_secs(3600);

/// `limits::try_increment` with room (`admit`) or at its limit.
pub fn nolock_counter(conns: &Conns, admit: bool) -> Call {
    let limit = if admit { 1 << 50 } else { 1 };
    let conn = conns.nolock.clone();
    call(move |key| {
        let mut conn = conn.clone();
        async move {
            let a = nolock::limits::try_increment(&mut conn, &key, limit, WINDOW).await?;
            Ok(decision(a.admitted, Some(a.remaining), None))
        }
    })
}

/// [`CARD_COUNTER`], the same way.
pub fn card_counter(conns: &Conns, admit: bool) -> Call {
    let limit: u64 = if admit { 1 << 50 } else { 1 };
    let script = Arc::new(redis::Script::new(CARD_COUNTER));
    let conn = conns.nolock.clone();
    call(move |key| {
        let (script, mut conn) = (script.clone(), conn.clone());
        async move {
            let (admitted, count): (bool, u64) = script
                .key(key)
                .arg(limit)
                .arg(WINDOW.as_millis() as u64)
                .arg(1)
                .invoke_async(&mut conn)
                .await?;
            Ok(decision(admitted, Some(limit - count), None))
        }
    })
}

/// `Lock::acquire` + `Grant::release`: one pair per call.
pub fn nolock_fence(conns: &Conns) -> Call {
    let conn = conns.nolock.clone();
    let lock = Lock::new(TTL).expect("a valid TTL");
    call(move |key| {
        let (mut conn, lock) = (conn.clone(), lock.clone());
        async move {
            let LockAttempt::Acquired(grant) = lock.acquire(&mut conn, &key).await? else {
                return Err(format!("{key} is held").into());
            };
            let _ = grant.release(&mut conn).await?;
            Ok(Decision::default())
        }
    })
}

/// [`REF_ACQUIRE`] + [`REF_RELEASE`]: one pair per call.
pub fn reference_fence(conns: &Conns) -> Call {
    let scripts = Arc::new((
        redis::Script::new(REF_ACQUIRE),
        redis::Script::new(REF_RELEASE),
    ));
    let conn = conns.nolock.clone();
    call(move |key| {
        let (scripts, mut conn) = (scripts.clone(), conn.clone());
        async move {
            let (lock, counter) = (format!("{{{key}}}:lock"), format!("{{{key}}}:fence"));
            let token = Token::random()?;
            let fence: u64 = scripts
                .0
                .key(&lock)
                .key(&counter)
                .arg(token.as_str())
                .arg(TTL.as_millis() as u64)
                .invoke_async(&mut conn)
                .await?;
            if fence == 0 {
                return Err(format!("{key} is held").into());
            }
            let _: u64 = scripts
                .1
                .key(&lock)
                .arg(token.as_str())
                .invoke_async(&mut conn)
                .await?;
            Ok(Decision::default())
        }
    })
}

/// rslock's `lock` (`SET NX PX`) + `unlock` (its token-checked script).
pub fn rslock_pair(conns: &Conns) -> Call {
    let manager = rslock::LockManager::new(vec![conns.url.clone()]);
    call(move |key| {
        let manager = manager.clone();
        async move {
            let lock = manager.lock(key.as_str(), TTL).await?;
            manager.unlock(&lock).await;
            Ok(Decision::default())
        }
    })
}
