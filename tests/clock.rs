//! The server's clock stepped and skewed, on rate limiters, the semaphore
//! and the fenced lock: what still holds, as numbers the guide states
//! (`guide::survives`).
//!
//! Every limiter decides by the server's clock (`TIME`, key expiry). A
//! server whose clock steps **forward** by Δ sees every stored instant Δ
//! older: GCRA and the token bucket refill Δ / T units at once (never more
//! than the burst), a window may end early. So in any real span d, at most
//! `burst + (d + Δ) / T` units pass (windows: a window's `L` may be granted
//! again when the step ends it early). A clock stepped **back** by Δ makes
//! a limiter deny longer (up to Δ more) and never admit more. A failover to
//! a replica whose clock is Δ ahead acts as a forward step of Δ.
//!
//! Permits and locks end at a server time (a score, a key expiry): a
//! forward step of Δ ends them up to Δ early in real time, unseen by their
//! holders' local deadlines (so a semaphore can run up to twice
//! its size for up to Δ; a lock's fence still refuses the old holder's
//! writes); a backward step makes them last up to Δ longer.
//!
//! The servers run under libfaketime (`tests/support/clock.rs`); where it
//! cannot run, the tests say so and skip (fail under `CI=true`).

mod support;

use std::time::{Duration, Instant};

use nolock::rate::{Algorithm, Limiter, Quota};
use support::clock::{skewed_or_skip, SkewedServer};
use support::prefix;

type Conn = redis::aio::MultiplexedConnection;

/// GCRA and token bucket: 100 per second, burst 10 (T = 10 ms); windows:
/// 10 per 100 ms.
fn limiter(algorithm: Algorithm) -> Limiter {
    let quota = match algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            Quota::per_second(100).unwrap().with_burst(10).unwrap()
        }
        _ => Quota::per(10, Duration::from_millis(100)).unwrap(),
    };
    Limiter::new(algorithm, quota).unwrap()
}

/// Checks of one unit as fast as they come for `span`; the units admitted.
async fn admitted_for(conn: &mut Conn, l: &Limiter, key: &str, span: Duration) -> u64 {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < span {
        n += u64::from(l.check(conn, key, 1).await.unwrap().allowed);
    }
    n
}

async fn connect(s: &SkewedServer) -> Conn {
    s.server.conn().await
}

#[tokio::test]
async fn a_forward_step_refills_at_most_its_length_and_never_more_than_the_burst() {
    let Some(clock) = skewed_or_skip("forward step", &[]) else {
        return;
    };
    let mut conn = connect(&clock).await;
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let l = limiter(algorithm);
        let key = format!("{}{algorithm}", prefix("forward"));
        // Empty the limiter, then step the server 30 ms ahead. The span d
        // starts before the limiter is emptied: the real time the step
        // itself takes on a loaded machine refills too.
        let start = Instant::now();
        assert!(l.check(&mut conn, &key, 10).await.unwrap().allowed);
        clock.set(0.030);
        let extra = admitted_for(&mut conn, &l, &key, Duration::from_millis(10)).await;
        let d = start.elapsed().as_micros() as u64;
        // At most (d + Δ) / T, plus one unit for the span's rounding.
        let bound = (d + 30_000) / 10_000 + 1;
        assert!(extra <= bound, "{algorithm}: {extra} > {bound}");
        assert!(extra >= 3, "{algorithm}: the step did refill ({extra})");
        // A step of an hour refills no more than the burst.
        clock.set(3600.0);
        let burst = admitted_for(&mut conn, &l, &key, Duration::from_millis(5)).await;
        assert!(burst <= 10 + 1, "{algorithm}: {burst} past a burst of 10");
        clock.set(0.0);
    }
}

#[tokio::test]
async fn a_backward_step_denies_longer_and_never_admits_more() {
    let Some(clock) = skewed_or_skip("backward step", &[]) else {
        return;
    };
    let mut conn = connect(&clock).await;
    // Δ = 1 s, 2 s, and 60 s (a managed server whose clock was a minute
    // ahead, then corrected).
    for delta in [1.0_f64, 2.0, 60.0] {
        for algorithm in Algorithm::ALL {
            let l = limiter(algorithm);
            let key = format!("{}{algorithm}:{delta}", prefix("backward"));
            assert!(
                l.check(&mut conn, &key, 10).await.unwrap().allowed,
                "{algorithm}"
            );
            clock.set(-delta);
            // For 200 ms of real time: nothing more passes (the server
            // thinks less time went by than did).
            let later = admitted_for(&mut conn, &l, &key, Duration::from_millis(200)).await;
            assert_eq!(later, 0, "{algorithm}, Δ {delta} s");
            let d = l.check(&mut conn, &key, 1).await.unwrap();
            let wait = d.retry_after.expect("denied");
            let step = Duration::from_secs_f64(delta);
            // Up to Δ more than the limiter's own wait (a unit, a window).
            assert!(
                wait <= step + Duration::from_millis(200),
                "{algorithm}, Δ {delta} s: {wait:?}"
            );
            if algorithm != Algorithm::SlidingWindow {
                // Stored instants are absolute: the answer counts the step.
                assert!(
                    wait + Duration::from_millis(300) >= step,
                    "{algorithm}, Δ {delta} s: {wait:?}"
                );
            }
            // The sliding window reads a window that starts in its future
            // as the current one (e = 0): its retry_after can be short by up
            // to Δ, and asking again is denied until its clock has caught
            // up.
            clock.set(0.0);
        }
    }
}

/// A forward step of 2 s or 60 s (a server whose clock was behind, then
/// corrected, or a failover to a replica that far ahead): GCRA and the
/// token bucket refill at most their burst, the windows at most their limit
/// per window the span touches, whatever Δ.
#[tokio::test]
async fn a_forward_step_of_seconds_or_a_minute_admits_at_most_one_burst_more() {
    let Some(clock) = skewed_or_skip("forward steps", &[]) else {
        return;
    };
    let mut conn = connect(&clock).await;
    for delta in [2.0_f64, 60.0] {
        for algorithm in Algorithm::ALL {
            let l = limiter(algorithm);
            let key = format!("{}{algorithm}:{delta}", prefix("forward-step"));
            let start = Instant::now();
            assert!(l.check(&mut conn, &key, 10).await.unwrap().allowed);
            clock.set(delta);
            let extra = admitted_for(&mut conn, &l, &key, Duration::from_millis(20)).await;
            let d = start.elapsed().as_micros() as u64;
            // GCRA, token bucket: one burst (10) refilled by the step, plus
            // what 100/s gives in d, plus rounding. Windows: 10 for each
            // window the span touches (the stepped clock's current one, and
            // one more per boundary crossed).
            let bound = match algorithm {
                Algorithm::Gcra | Algorithm::TokenBucket => 10 + d / 10_000 + 1,
                _ => 10 * (d / 100_000 + 2),
            };
            assert!(
                extra <= bound,
                "{algorithm}, Δ {delta} s: {extra} > {bound}"
            );
            assert!(
                extra >= 10,
                "{algorithm}, Δ {delta} s: the step did refill ({extra})"
            );
            clock.set(0.0);
        }
    }
}

#[tokio::test]
async fn a_failover_to_a_replica_ahead_acts_as_a_forward_step() {
    let Some(primary) = skewed_or_skip("failover skew (primary)", &[]) else {
        return;
    };
    let port = primary.server.port.to_string();
    let Some(replica) = skewed_or_skip(
        "failover skew (replica)",
        &["--replicaof", "127.0.0.1", &port],
    ) else {
        return;
    };
    replica.set(0.050);
    let mut p = connect(&primary).await;
    let mut r = connect(&replica).await;
    let l = limiter(Algorithm::Gcra);
    let key = prefix("failover_skew");
    // Wait for the replica's first sync.
    let mut acked = 0;
    for _ in 0..100 {
        let _: () = redis::cmd("SET")
            .arg("ping")
            .arg(1)
            .query_async(&mut p)
            .await
            .unwrap();
        acked = redis::cmd("WAIT")
            .arg(1)
            .arg(100)
            .query_async(&mut p)
            .await
            .unwrap();
        if acked >= 1 {
            break;
        }
    }
    assert_eq!(acked, 1, "the replica synced");
    // The span starts before the limiter is emptied (the WAIT and the
    // promotion take real time, which refills too).
    let start = Instant::now();
    assert!(l.check(&mut p, &key, 10).await.unwrap().allowed);
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(400)
        .query_async(&mut p)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica has the TAT");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut r)
        .await
        .unwrap();
    let extra = admitted_for(&mut r, &l, &key, Duration::from_millis(10)).await;
    let d = start.elapsed().as_micros() as u64;
    let bound = (d + 50_000) / 10_000 + 1;
    assert!(extra <= bound, "{extra} > {bound}");
    assert!(extra >= 5, "the replica's clock is 50 ms ahead: {extra}");
}

/// The semaphore scores each permit with its expiry on the server clock.
/// A forward step of Δ ends every permit Δ early in real time (its holder's
/// local deadline, which counts from the client's clock, does not see it):
/// a permit of TTL `t` lives at least `t - Δ` of real time. A backward step
/// of Δ makes it live up to `t + Δ`, never less than `t`.
#[tokio::test]
async fn a_step_moves_a_permits_end_by_its_length() {
    let Some(clock) = skewed_or_skip("semaphore step", &[]) else {
        return;
    };
    let mut conn = connect(&clock).await;
    let ttl = Duration::from_millis(1_500);
    let semaphore = nolock::semaphore::Semaphore::new(1, ttl).unwrap();
    for step in [0.8_f64, -0.8] {
        let key = format!("{}semaphore", prefix("clock-permit"));
        let attempt = semaphore.acquire(&mut conn, &key).await.unwrap();
        let held = attempt.acquired().expect("a free semaphore");
        let taken = Instant::now();
        clock.set(step);
        // Another holder asks every 10 ms until the permit has ended.
        let lived = loop {
            let asked = taken.elapsed();
            let other = semaphore.acquire(&mut conn, &key).await.unwrap();
            if let Some(permit) = other.acquired() {
                let _ = permit.release(&mut conn).await.unwrap();
                break asked;
            }
            assert!(
                taken.elapsed() < Duration::from_secs(4),
                "the permit never ends"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let delta = Duration::from_secs_f64(step.abs());
        let slack = Duration::from_millis(60);
        if step > 0.0 {
            // Early by about Δ: at least t - Δ, less than t.
            assert!(lived + slack >= ttl - delta, "{lived:?}");
            assert!(lived < ttl, "{lived:?}: the step did not end it early");
            // Its holder still believed it held it.
            assert!(
                held.deadline() > Instant::now(),
                "the local deadline saw the step"
            );
        } else {
            // Late by about Δ, never early.
            assert!(lived + Duration::from_millis(10) >= ttl, "{lived:?}");
            assert!(lived <= ttl + delta + slack * 5, "{lived:?}");
        }
        clock.set(0.0);
    }
}

/// A fenced lock's TTL is a key expiry on the server clock, so a forward
/// step of Δ hands the lock to the next holder up to Δ early, while the
/// first still believes it holds it. The fence still decides: the newer
/// grant's fence is greater, and the first holder's writes are refused
/// from then on.
#[tokio::test]
async fn a_forward_step_ends_a_lock_early_and_the_fence_still_refuses_the_old_holder() {
    use nolock::fence::{Lock, LockAttempt, Write};
    let Some(clock) = skewed_or_skip("lock step", &[]) else {
        return;
    };
    let mut conn = connect(&clock).await;
    let ttl = Duration::from_millis(1_500);
    let lock = Lock::new(ttl).unwrap();
    let resource = format!("{}job", prefix("clock-lock"));
    let LockAttempt::Acquired(first) = lock.acquire(&mut conn, &resource).await.unwrap() else {
        panic!("a free lock");
    };
    let taken = Instant::now();
    let written = first.fence().write(&mut conn, "first").await.unwrap();
    assert_eq!(written, Write::Applied);
    clock.set(1.0);
    let (lived, second) = loop {
        let asked = taken.elapsed();
        if let LockAttempt::Acquired(g) = lock.acquire(&mut conn, &resource).await.unwrap() {
            break (asked, g);
        }
        assert!(
            taken.elapsed() < Duration::from_secs(3),
            "the lock never ends"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(lived < ttl, "{lived:?}: not early");
    assert!(
        lived + Duration::from_millis(60) >= ttl - Duration::from_secs(1),
        "{lived:?}"
    );
    // Both believe they hold it; the fence tells them apart.
    assert!(first.deadline() > Instant::now());
    assert!(second.fence().number() > first.fence().number());
    let written = second.fence().write(&mut conn, "second").await.unwrap();
    assert_eq!(written, Write::Applied);
    let late = first.fence().write(&mut conn, "late").await.unwrap();
    assert!(matches!(late, Write::Stale { .. }), "{late:?}");
    clock.set(0.0);
}

/// A renewing lease under a forward step: every renewal sets a fresh TTL on
/// the stepped clock, so only the period the step fell in is shortened.
/// A step shorter than what is left of that period (at least 2/3 of the
/// TTL, renewals being every TTL/3) is survived, with the lock held
/// throughout; a longer one ends the lock on the server at once, and the
/// holder hears it at its next renewal (within TTL/3), while the fence
/// refuses its writes as soon as someone else holds the lock.
#[tokio::test]
async fn a_renewing_lease_survives_a_step_within_its_ttl_and_hears_a_longer_one() {
    use nolock::fence::{Lock, LockAttempt, Write};
    let Some(clock) = skewed_or_skip("lease step", &[]) else {
        return;
    };
    let conn = connect(&clock).await;
    let mut other = connect(&clock).await;
    let ttl = Duration::from_millis(1_500);
    let lock = Lock::new(ttl).unwrap();
    let resource = format!("{}job", prefix("clock-lease"));
    let LockAttempt::Acquired(lease) = lock.lease(conn.clone(), &resource).await.unwrap() else {
        panic!("a free lock");
    };

    // +0.8 s (under 2/3 of 1.5 s) three times over 3 s: never lost, never
    // free for another.
    for step in [0.8, 1.6, 2.4] {
        clock.set(step);
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            assert!(lease.loss().is_none(), "lost after a step to +{step} s");
            let attempt = lock.acquire(&mut other, &resource).await.unwrap();
            assert!(
                matches!(attempt, LockAttempt::Held { .. }),
                "free while leased, at +{step} s: {attempt:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // +10 s at once: the lock ends on the server; the lease hears it at its
    // next renewal, within TTL/3 (+ slack for a loaded machine).
    clock.set(12.4);
    let stepped = Instant::now();
    let second = loop {
        if let LockAttempt::Acquired(g) = lock.acquire(&mut other, &resource).await.unwrap() {
            break g;
        }
        assert!(stepped.elapsed() < Duration::from_secs(1), "never free");
    };
    let loss = tokio::time::timeout(ttl / 3 + Duration::from_millis(700), lease.lost())
        .await
        .expect("the lease heard of its loss within a renewal period");
    eprintln!("lost {:?} after the step: {loss:?}", stepped.elapsed());
    assert!(second.fence().number() > lease.fence().number());
    assert_eq!(
        second.fence().write(&mut other, "second").await.unwrap(),
        Write::Applied
    );
    let late = lease.fence().write(&mut other, "late").await.unwrap();
    assert!(matches!(late, Write::Stale { .. }), "{late:?}");
    clock.set(0.0);
}
