//! `Limiter::until_ready` (waits about `retry_after`, few calls per wait)
//! and `Limiter::check_at_most` (partial grants, charged exactly), against a
//! real redis-server.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, Quota};
use nolock::Error;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::time::Instant;

/// A connection that counts the commands sent through it.
#[derive(Clone)]
struct Counting {
    inner: MultiplexedConnection,
    sent: Arc<AtomicUsize>,
}

impl ConnectionLike for Counting {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_command(cmd)
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_commands(cmd, offset, count)
    }
    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[tokio::test]
async fn until_ready_sleeps_for_retry_after_and_sends_few_calls() {
    let redis = support::redis();
    let mut conn = Counting {
        inner: redis.conn().await,
        sent: Arc::default(),
    };
    nolock::Scripts::load(&mut conn.inner).await.unwrap();
    let key = format!("{}wait", support::prefix("until_ready"));
    // One unit every 200 ms, burst 1.
    let limiter = Limiter::new(
        Algorithm::Gcra,
        Quota::per(5, Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
    .with_burst_one();
    assert!(limiter.check(&mut conn, &key, 1).await.unwrap().allowed);

    let sent = conn.sent.load(Ordering::Relaxed);
    let started = Instant::now();
    let far = started + Duration::from_secs(5);
    let d = limiter.until_ready(&mut conn, &key, 1, far).await.unwrap();
    let waited = started.elapsed();
    assert!(d.allowed);
    // retry_after is about 200 ms; jitter adds at most 20 ms.
    assert!(waited >= Duration::from_millis(180), "{waited:?}");
    assert!(waited < Duration::from_millis(600), "{waited:?}");
    let calls = conn.sent.load(Ordering::Relaxed) - sent;
    assert!((2..=3).contains(&calls), "{calls} calls for one wait");

    // A deadline before the next chance: one call, no sleep, the denial back.
    let sent = conn.sent.load(Ordering::Relaxed);
    let started = Instant::now();
    let soon = started + Duration::from_millis(50);
    let d = limiter.until_ready(&mut conn, &key, 1, soon).await.unwrap();
    assert!(!d.allowed && d.retry_after.is_some());
    assert!(started.elapsed() < Duration::from_millis(50));
    assert_eq!(conn.sent.load(Ordering::Relaxed) - sent, 1);

    // Four waiters on one key: each is admitted in turn, about 200 ms apart,
    // and none of them polls.
    let sent = conn.sent.load(Ordering::Relaxed);
    let started = Instant::now();
    let waiters = (0..4).map(|_| {
        let (mut conn, limiter, key) = (conn.clone(), limiter.clone(), key.clone());
        tokio::spawn(async move {
            let d = limiter.until_ready(&mut conn, &key, 1, far).await.unwrap();
            assert!(d.allowed);
        })
    });
    for w in waiters.collect::<Vec<_>>() {
        w.await.unwrap();
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(550),
        "4 units at 5/s: {waited:?}"
    );
    let calls = conn.sent.load(Ordering::Relaxed) - sent;
    assert!(calls <= 4 * 4, "{calls} calls for 4 waiters");
}

trait BurstOne {
    fn with_burst_one(self) -> Self;
}

impl BurstOne for Limiter {
    fn with_burst_one(self) -> Self {
        let quota = self.quota().with_burst(1).unwrap();
        Limiter::new(self.algorithm(), quota).unwrap()
    }
}

fn micros(at: std::time::SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

#[tokio::test]
async fn check_at_most_grants_partially_and_charges_what_it_granted() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = support::prefix("check_at_most");
    // 10 per minute: T = 6 s, so nothing refills during the test.
    let quota = Quota::per_minute(10).unwrap();
    let t_us = 6_000_000;

    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let limiter = Limiter::new(algorithm, quota).unwrap();
        let key = format!("{p}{algorithm}");

        // A full limiter grants 4 of 4 and charges exactly 4.
        let g = limiter.check_at_most(&mut conn, &key, 4).await.unwrap();
        assert_eq!((g.granted, g.state.remaining), (4, 6), "{algorithm}");
        assert!(g.state.allowed && g.state.retry_after.is_none());
        let peek = limiter.peek(&mut conn, &key, 1).await.unwrap();
        assert_eq!(peek.remaining, 6, "{algorithm}");
        match algorithm {
            Algorithm::Gcra => {
                // "<tag>:<TAT>" (lua/lib/tag.lua): T = 6 s, burst 10.
                let stored: String = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let tat = micros(g.state.at) + 4 * t_us;
                assert_eq!(stored, format!("g{t_us}x10:{tat}"));
            }
            _ => {
                // "<tag>:<tokens>:<at>" (lua/lib/bucket.lua).
                let stored: String = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let tokens: Vec<&str> = stored.split(':').collect();
                assert_eq!(
                    tokens[..2],
                    [format!("b{t_us}x10").as_str(), "6"],
                    "{stored}"
                );
            }
        }

        // More than is left: the 6 left, no more.
        let g = limiter.check_at_most(&mut conn, &key, 20).await.unwrap();
        assert_eq!((g.granted, g.state.remaining), (6, 0), "{algorithm}");
        let reset = g.state.reset_after;
        assert!(reset > Duration::from_secs(59) && reset <= Duration::from_secs(60));

        // Empty: nothing granted, nothing written, and when one unit is back.
        let g = limiter.check_at_most(&mut conn, &key, 3).await.unwrap();
        assert_eq!(g.granted, 0);
        assert!(!g.state.allowed);
        let retry = g.state.retry_after.unwrap();
        assert!(retry > Duration::from_millis(5_000) && retry <= Duration::from_secs(6));
        assert!(!limiter.check(&mut conn, &key, 1).await.unwrap().allowed);
    }

    // Windows do not support it, and say so before any I/O.
    let window = Limiter::new(Algorithm::SlidingWindow, quota).unwrap();
    assert!(matches!(
        window.check_at_most(&mut conn, &format!("{p}w"), 1).await,
        Err(Error::InvalidArgument {
            what: "algorithm",
            ..
        })
    ));
}

#[tokio::test]
async fn check_at_most_refuses_foreign_state_and_writes_nothing() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = support::prefix("check_at_most_foreign");
    let quota = Quota::per_minute(10).unwrap();
    let gcra = Limiter::new(Algorithm::Gcra, quota).unwrap();
    for junk in ["007", " 7", "1e3", "-5", "abc"] {
        let key = format!("{p}{junk}");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(junk)
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = gcra.check_at_most(&mut conn, &key, 1).await.unwrap_err();
        assert!(err.is_definite(), "{junk:?}: {err}");
        let (value, ttl): (String, i64) = redis::pipe()
            .get(&key)
            .pttl(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!((value.as_str(), ttl), (junk, -1));
    }
    let bucket = Limiter::new(Algorithm::TokenBucket, quota).unwrap();
    let key = format!("{p}hash");
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(&["tokens", "03", "at", "1"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(bucket
        .check_at_most(&mut conn, &key, 1)
        .await
        .unwrap_err()
        .is_definite());
    let tokens: String = redis::cmd("HGET")
        .arg(&key)
        .arg("tokens")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(tokens, "03");
}

/// Every rate call that sleeps or schedules answers `NoTimer` on a runtime
/// built without timers, and never panics: `until_ready` when it must wait,
/// a `Guard` (its timeout), a `Reservoir` (its background task), and the
/// fence's `Waiters`.
#[test]
fn a_runtime_without_timers_gets_no_timer_never_a_panic() {
    use nolock::fence::Waiters;
    use nolock::policy::{Guard, OnFailure};
    use nolock::rate::Reservoir;

    let server = support::RedisServer::start();
    let (io_only, _driver, conn) = support::io_only_runtime_and_conn(&server);
    io_only.block_on(async {
        let mut conn = conn;
        let key = format!("{}k", support::prefix("no_timer"));
        let limiter = Limiter::new(Algorithm::Gcra, Quota::per_hour(1).unwrap()).unwrap();
        assert!(limiter.check(&mut conn, &key, 1).await.unwrap().allowed);
        // One unit per 2 s, taken: the next is due within the deadline, a
        // wait that would need a timer.
        let every_2s = Limiter::new(
            Algorithm::Gcra,
            Quota::per(1, Duration::from_secs(2)).unwrap(),
        )
        .unwrap();
        let slow = format!("{key}:slow");
        assert!(every_2s.check(&mut conn, &slow, 1).await.unwrap().allowed);
        let deadline = Instant::now() + Duration::from_secs(5);
        assert!(matches!(
            every_2s.until_ready(&mut conn, &slow, 1, deadline).await,
            Err(Error::NoTimer)
        ));
        let guard = Guard::new(Duration::from_millis(50), OnFailure::Closed).unwrap();
        assert!(matches!(
            guard.check(&limiter, &mut conn, &key, 1).await,
            Err(Error::NoTimer)
        ));
        assert!(matches!(
            Reservoir::new(
                conn.clone(),
                limiter.clone(),
                &key,
                1,
                Duration::from_millis(100)
            ),
            Err(Error::NoTimer)
        ));
        assert!(matches!(
            Waiters::new(&server.client()).await,
            Err(Error::NoTimer)
        ));
        // Nothing more was charged: still one unit, owed for the hour.
        let peek = limiter.peek(&mut conn, &key, 1).await.unwrap();
        assert_eq!((peek.allowed, peek.remaining), (false, 0));
    });
}
