//! The opt-in local deny cache: an abusive client costs far fewer Redis
//! calls, and the cache never lets through what the server would refuse nor
//! refuses what the server would still refuse anyway.

mod support;

use std::time::{Duration, Instant, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, Quota};
use support::{prefix, RedisServer};

/// The tests read nolock's process-wide call counter to tell a local answer
/// from the server's: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test]
async fn an_abusive_client_costs_a_fraction_of_the_calls_and_nothing_more_is_admitted() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut probe = server.conn().await;
    // 2 per 100 ms (T = 50 ms); the client asks as fast as it can, far
    // above 10x the quota even on a loaded machine.
    let quota = Quota::per(2, Duration::from_millis(100)).unwrap();
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let limiter = Limiter::new(algorithm, quota)
            .unwrap()
            .with_local_deny_cache(1_000);
        let key = format!("{}{algorithm}", prefix("deny_cache"));
        let before = evalsha_calls(&mut probe).await;
        let (mut decisions, mut admitted, mut local) = (0u64, 0u64, 0u64);
        let mut first_at = None;
        let mut last_at = UNIX_EPOCH;
        let start = Instant::now();
        // nolock's own call counter (the tests of this binary run one at a time).
        let mut calls_seen = nolock::stats().calls;
        while start.elapsed() < Duration::from_millis(500) {
            let d = limiter.check(&mut conn, &key, 1).await.unwrap();
            decisions += 1;
            let now_calls = nolock::stats().calls;
            let went_to_server = now_calls > calls_seen;
            calls_seen = now_calls;
            if d.allowed {
                assert!(went_to_server, "the cache never admits");
                admitted += 1;
                first_at.get_or_insert(d.at);
                last_at = d.at;
            } else if !went_to_server {
                local += 1;
                // The server agrees, at any server time before the local
                // denial ends (1 ms for the server's rounding up). Asked for
                // one local denial in 16, to keep the client fast.
                if local % 16 != 1 {
                    tokio::task::yield_now().await;
                    continue;
                }
                let p = limiter.peek(&mut probe, &key, 1).await.unwrap();
                calls_seen = nolock::stats().calls;
                let ends = d.at + d.retry_after.unwrap();
                if p.at + Duration::from_millis(1) < ends {
                    assert!(
                        !p.allowed,
                        "{algorithm}: denied locally until {ends:?}, server admits at {:?}",
                        p.at
                    );
                }
            }
            // As fast as it can: far above 10x the quota.
            tokio::task::yield_now().await;
        }
        let calls = evalsha_calls(&mut probe).await - before;
        let span = last_at
            .duration_since(first_at.unwrap())
            .unwrap()
            .as_micros() as u64;
        // Admissions stay within the limiter's own bound.
        let bound = match algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => 2 + span / 50_000,
            _ => 2 * (span / 100_000 + 2),
        };
        assert!(admitted <= bound, "{algorithm}: {admitted} > {bound}");
        let server_decisions = decisions - local;
        eprintln!(
            "{algorithm}: {decisions} decisions, {admitted} admitted, {local} local, \
             {server_decisions} sent; {calls} script calls with the checking peeks"
        );
        assert!(
            server_decisions * 10 <= decisions,
            "{algorithm}: {server_decisions} of {decisions} decisions went to Redis"
        );
    }
}

/// A client at exactly 10x its quota (one check every 5 ms against 20 per
/// second, burst 1): each admission that leaves the limiter empty is
/// remembered as a denial until the next unit, so Redis sees at most two
/// calls per admission (the admission, and at most one check in the last
/// moments before the next unit: the local denial counts from when the
/// admission was *sent* and gives up the reply's rounding, so it always ends
/// a round trip and a millisecond before the server's) instead of ten.
/// Counted per admission and per decision, which a loaded machine's slower
/// pace does not change.
#[tokio::test]
async fn at_ten_times_the_quota_redis_sees_about_one_call_per_admission() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut probe = server.conn().await;
    let quota = Quota::per_second(20).unwrap().with_burst(1).unwrap();
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let quota = if algorithm == Algorithm::FixedWindow {
            Quota::per(1, Duration::from_millis(50)).unwrap()
        } else {
            quota
        };
        let limiter = Limiter::new(algorithm, quota)
            .unwrap()
            .with_local_deny_cache(16);
        let key = format!("{}{algorithm}", prefix("ten_times"));
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut decisions, mut admitted) = (0u64, 0u64);
        // Counted by this test's own server (the process-wide `stats()`
        // also counts the other test of this binary).
        let before = evalsha_calls(&mut probe).await;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1500) {
            tick.tick().await;
            let d = limiter.check(&mut conn, &key, 1).await.unwrap();
            decisions += 1;
            admitted += u64::from(d.allowed);
        }
        let sent = evalsha_calls(&mut probe).await - before;
        eprintln!(
            "{algorithm}: {decisions} decisions, {admitted} admitted, {sent} sent to Redis \
             ({:.1}% of decisions)",
            100.0 * sent as f64 / decisions as f64
        );
        assert!(admitted >= 10, "{algorithm}: only {admitted} admitted");
        // Without remembering empty admissions every check between two
        // admissions reaches the server: about 10 per admission. With it,
        // only a check that lands in the last moments before the next unit
        // still does.
        assert!(
            sent <= admitted * 2 + 4,
            "{algorithm}: {sent} calls for {admitted} admissions"
        );
        assert!(
            sent * 4 <= decisions,
            "{algorithm}: {sent} calls for {decisions} decisions"
        );
    }
}

/// A cached denial never outlives the server's: with a unit every 5 ms,
/// a server peek that says the unit fits is never followed by a local
/// denial. (The server rounds `retry_after` up to the millisecond; a cache
/// that counted the whole rounded value denied about 1% of these on GCRA
/// and the token bucket and 6% on the fixed window.)
#[tokio::test]
async fn a_local_denial_never_follows_a_server_peek_that_fits() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let quota = Quota::per(1, Duration::from_millis(5)).unwrap();
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let limiter = Limiter::new(algorithm, quota)
            .unwrap()
            .with_local_deny_cache(16);
        let key = format!("{}{algorithm}", prefix("deny_edge"));
        let (mut local, mut wrong) = (0u32, 0u32);
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1500) {
            let fits = limiter.peek(&mut conn, &key, 1).await.unwrap().allowed;
            let calls = nolock::stats().calls;
            let d = limiter.check(&mut conn, &key, 1).await.unwrap();
            if !d.allowed && nolock::stats().calls == calls {
                local += 1;
                if fits {
                    wrong += 1;
                }
            }
        }
        assert!(local > 0, "{algorithm}: the cache answered some checks");
        assert_eq!(
            wrong, 0,
            "{algorithm}: {wrong} of {local} local denials after a fitting peek"
        );
    }
}

/// A refund through the limiter's own charge, and the limiter's reset, make
/// room the cache did not know of: both forget the key's cached denial, so
/// the next check asks the server and is admitted.
#[tokio::test]
async fn a_refund_or_reset_through_the_limiter_forgets_its_cached_denial() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let limiter = Limiter::new(algorithm, Quota::per_minute(10).unwrap())
            .unwrap()
            .with_local_deny_cache(16);
        let key = format!("{}{algorithm}", prefix("deny_refund"));
        let mut all = limiter.check(&mut conn, &key, 10).await.unwrap();
        assert!(all.allowed);
        assert!(!limiter.check(&mut conn, &key, 1).await.unwrap().allowed);
        let calls = nolock::stats().calls;
        assert!(!limiter.check(&mut conn, &key, 1).await.unwrap().allowed);
        if algorithm != Algorithm::SlidingWindow {
            assert_eq!(nolock::stats().calls, calls, "{algorithm}: denied locally");
        }
        let r = all
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 10)
            .await
            .unwrap();
        assert_eq!(r.credited, 10, "{algorithm}");
        let d = limiter.check(&mut conn, &key, 1).await.unwrap();
        assert!(d.allowed, "{algorithm}: admitted after the refund: {d:?}");

        // Empty it again, be denied (cached), reset: admitted at once.
        let _ = limiter.check(&mut conn, &key, 9).await.unwrap();
        assert!(!limiter.check(&mut conn, &key, 1).await.unwrap().allowed);
        limiter.reset(&mut conn, &key).await.unwrap();
        let d = limiter.check(&mut conn, &key, 1).await.unwrap();
        assert!(d.allowed, "{algorithm}: admitted after the reset: {d:?}");
    }
}

/// A calendar limit that is spent is denied in the process until its
/// period ends: after the admission that left nothing, further checks
/// never reach Redis, and none is admitted.
#[tokio::test]
async fn a_spent_calendar_period_is_denied_locally_until_it_ends() {
    use nolock::rate::Period;
    let _turn = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let key = format!("{}cal", prefix("deny_calendar"));
    let month = Limiter::new(
        Algorithm::Calendar,
        Quota::calendar(3, Period::MONTH).unwrap(),
    )
    .unwrap()
    .with_local_deny_cache(100);
    let last = month.check(&mut conn, &key, 3).await.unwrap();
    assert!(last.allowed && last.remaining == 0);
    let before = evalsha_calls(&mut conn).await;
    for _ in 0..50 {
        let d = month.check(&mut conn, &key, 1).await.unwrap();
        assert!(!d.allowed);
        let retry = d.retry_after.unwrap();
        assert!(retry <= last.reset_after, "{retry:?} within the period");
    }
    // INFO itself is no EVALSHA: every denial was local.
    assert_eq!(evalsha_calls(&mut conn).await, before);
    assert!(!month.peek(&mut conn, &key, 1).await.unwrap().allowed);
}
