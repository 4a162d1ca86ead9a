//! `rate::Reservoir`: a hot limit decided locally from batches taken from
//! Redis. Four reservoirs (four connections, as four processes) and 64 tasks
//! on one limit never admit more than the limit's bound by the server
//! clock (at every sampled instant and over the run), and never more
//! locally than the server granted them; an idle
//! reservoir gives its units back, a dropped one at once; a killed process
//! loses at most its batch; a lost reply of a batch call adds nothing.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nolock::rate::{Algorithm, Limiter, Quota, Reservoir, ReservoirStats};
use nolock::Error;
use support::proxy::FaultProxy;
use support::{prefix, RedisServer};

type Conn = redis::aio::MultiplexedConnection;

async fn server_micros(conn: &mut Conn) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1_000_000 + us
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_and_64_tasks_never_admit_more_than_the_limit() {
    let server = RedisServer::start();
    let mut probe = server.conn().await;
    // 2 000 per second, burst 100: T = 500 us.
    let limiter = Limiter::new(
        Algorithm::Gcra,
        Quota::per_second(2_000).unwrap().with_burst(100).unwrap(),
    )
    .unwrap();
    let key = prefix("hot");
    let mut reservoirs = Vec::new();
    for _ in 0..4 {
        let conn = server.conn().await;
        reservoirs.push(Arc::new(
            Reservoir::new(conn, limiter.clone(), &key, 50, Duration::from_millis(50)).unwrap(),
        ));
    }
    let start_us = server_micros(&mut probe).await;
    let admitted = Arc::new(AtomicU64::new(0));
    let draws = Arc::new(std::sync::Mutex::new(Vec::new()));
    let begin = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..64 {
        let r = Arc::clone(&reservoirs[t % 4]);
        let admitted = Arc::clone(&admitted);
        let draws = Arc::clone(&draws);
        tasks.push(tokio::spawn(async move {
            while begin.elapsed() < Duration::from_millis(600) {
                // Every 100 ms: for 5 ms one task of the first reservoir
                // draws now and then (its reservoir takes a batch and keeps
                // most of it); all rest until 40 ms (the server refills
                // meanwhile); all draw for 10 ms; all rest past the hold.
                let phase = begin.elapsed().as_millis() as u64 % 100;
                let (rest, slowly) = match phase {
                    0..5 if t == 0 => (0, true),
                    0..40 => (40 - phase, false),
                    40..50 => (0, false),
                    _ => (100 - phase, false),
                };
                if rest > 0 {
                    tokio::time::sleep(Duration::from_millis(rest)).await;
                    continue;
                }
                let cost = 1 + fastrand::u64(0..3);
                // The draw happened somewhere between these two instants.
                let from = now_us();
                if r.check(cost).await.unwrap().allowed {
                    let to = now_us();
                    admitted.fetch_add(cost, Ordering::Relaxed);
                    draws.lock().unwrap().push((from, to, cost));
                }
                match fastrand::u16(0..200) {
                    _ if slowly => tokio::time::sleep(Duration::from_millis(1)).await,
                    0..=9 => tokio::time::sleep(Duration::from_millis(fastrand::u64(1..20))).await,
                    10 if t != 0 => break, // a request dropped: the task ends early
                    _ => tokio::task::yield_now().await,
                }
            }
        }));
    }
    // Sampled while it runs: no reservoir ever admitted more than it was
    // granted and has not returned, and all of them together never more
    // than the limit's bound at that instant by the server clock (the
    // count is read before the server's time, which can only widen it).
    let sampling = {
        let reservoirs = reservoirs.clone();
        let admitted = Arc::clone(&admitted);
        let mut clock = server.conn().await;
        tokio::spawn(async move {
            for _ in 0..60 {
                for r in &reservoirs {
                    let s = r.stats();
                    assert!(
                        s.admitted + r.held() + s.returned <= s.granted,
                        "{s:?}, held {}",
                        r.held()
                    );
                }
                let so_far = admitted.load(Ordering::Relaxed);
                let bound = 100 + (server_micros(&mut clock).await - start_us) / 500;
                assert!(so_far <= bound, "{so_far} admitted > {bound} by then");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    sampling.await.unwrap();
    let end_us = server_micros(&mut probe).await;
    let total = admitted.load(Ordering::Relaxed);
    let bound = 100 + (end_us - start_us) / 500;
    let calls: u64 = reservoirs.iter().map(|r| r.stats().batch_calls).sum();
    let decided: u64 = reservoirs
        .iter()
        .map(|r| r.stats().local + r.stats().batch_calls)
        .sum();
    eprintln!(
        "{total} units admitted (bound {bound}), {calls} batch calls for {decided} decisions"
    );
    assert!(total <= bound, "{total} admitted > {bound}");
    assert!(total > bound / 4, "the limit was used: {total} of {bound}");
    let by_stats: u64 = reservoirs.iter().map(|r| r.stats().admitted).sum();
    assert_eq!(by_stats, total);
    // And in every window of the run, not only from its start.
    let draws = draws.lock().unwrap();
    match hold_every_window(&draws, limiter.quota()) {
        Ok(verdict) => eprintln!("{verdict}"),
        Err(e) => panic!("{e}"),
    }
}

/// Holds reservoir draws, each `(from, to, units)` on the wall clock in µs,
/// to the quota's bound in every window up to `(burst + 400) × T` long that
/// holds their whole intervals (`support::window`). The test's server runs
/// on this machine, so the wall clock is the server's.
fn hold_every_window(draws: &[(u64, u64, u64)], quota: &Quota) -> Result<String, String> {
    use support::window::{check, Bound, History};
    let mut history = History::new();
    for &(from, to, units) in draws {
        history.draw(from, to, units);
    }
    check(
        &history,
        Bound::rate(quota.burst(), quota.emission_interval()),
    )
    .map(|verdict| format!("{} draws: {verdict}", draws.len()))
    .map_err(|v| format!("reservoir draws over the bound: {v}"))
}

/// The wall clock in µs since the epoch.
fn now_us() -> u64 {
    support::history::micros(std::time::SystemTime::now())
}

#[tokio::test]
async fn an_idle_or_dropped_reservoir_gives_its_units_back() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // An hour-long quota: nothing drains, so every unit's way shows.
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_hour(100).unwrap()).unwrap();
    let key = prefix("idle");
    let r = Reservoir::new(
        server.conn().await,
        limiter.clone(),
        &key,
        40,
        Duration::from_millis(30),
    )
    .unwrap();
    // Build up a local rate, so batches grow past the cost.
    for _ in 0..30 {
        let _ = r.check(1).await.unwrap();
    }
    let held = r.held();
    assert!(held > 0, "a batch larger than the cost is held");
    let admitted = r.stats().admitted;
    let before = limiter.peek(&mut conn, &key, 1).await.unwrap().remaining;
    assert_eq!(before, 100 - admitted - held);
    // Idle for its hold and one tick: back on the server.
    tokio::time::sleep(Duration::from_millis(30 + 10 + 10)).await;
    assert_eq!(r.held(), 0);
    assert_eq!(
        limiter.peek(&mut conn, &key, 1).await.unwrap().remaining,
        100 - admitted
    );

    // Dropped while holding: its task gives everything back.
    let r = Reservoir::new(
        server.conn().await,
        limiter.clone(),
        &key,
        40,
        Duration::from_secs(60),
    )
    .unwrap();
    for _ in 0..30 {
        let _ = r.check(1).await.unwrap();
    }
    let (held, admitted_2) = (r.held(), r.stats().admitted);
    assert!(held > 0);
    drop(r);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        limiter.peek(&mut conn, &key, 1).await.unwrap().remaining,
        100 - admitted - admitted_2
    );
}

#[test]
fn a_killed_process_loses_at_most_its_batch_and_the_limit_recovers() {
    let server = RedisServer::start();
    // 100 per second, burst 100: T = 10 ms; a batch of 40 drains in 400 ms.
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(100).unwrap()).unwrap();
    let key = prefix("killed");
    let doomed = tokio::runtime::Runtime::new().unwrap();
    let held = doomed.block_on(async {
        let r = Reservoir::new(
            server.conn().await,
            limiter.clone(),
            &key,
            40,
            Duration::from_secs(60),
        )
        .unwrap();
        for _ in 0..30 {
            let _ = r.check(1).await.unwrap();
        }
        let held = r.held();
        std::mem::forget(r); // the process dies: no drop, no return
        held
    });
    doomed.shutdown_background();
    assert!(held > 0 && held <= 40);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut conn = server.conn().await;
        let now = limiter.peek(&mut conn, &key, 1).await.unwrap();
        assert!(
            now.remaining <= 100 - held,
            "{now:?}: the held units are not back"
        );
        tokio::time::sleep(now.reset_after + Duration::from_millis(5)).await;
        assert_eq!(
            limiter.peek(&mut conn, &key, 1).await.unwrap().remaining,
            100,
            "recovered"
        );
    });
}

#[tokio::test]
async fn a_lost_batch_reply_adds_nothing_locally() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port).await;
    let mut direct = server.conn().await;
    nolock::Scripts::load(&mut direct).await.unwrap();
    let through = proxy.manager().await;
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_hour(100).unwrap()).unwrap();
    let key = prefix("lost_batch");
    let r = Reservoir::new(through, limiter.clone(), &key, 40, Duration::from_secs(60)).unwrap();
    proxy.lose_replies(1);
    let err = r.check(1).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate(_)), "{err}");
    assert_eq!(
        r.held(),
        0,
        "nothing the server may have granted is used here"
    );
    let charged = 100 - limiter.peek(&mut direct, &key, 1).await.unwrap().remaining;
    assert!(charged >= 1, "the lost call did run");
    assert_eq!(r.stats().admitted, 0);
    // The next call works through the new connection.
    assert!(r.check(1).await.unwrap().allowed);
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let server = RedisServer::start();
    let gcra = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let window = Limiter::new(Algorithm::FixedWindow, Quota::per_second(10).unwrap()).unwrap();
    let conn = || async { server.conn().await };
    let ms = Duration::from_millis(10);
    assert!(matches!(
        Reservoir::new(conn().await, gcra.clone(), "", 5, ms),
        Err(Error::EmptyKey)
    ));
    assert!(matches!(
        Reservoir::new(conn().await, window, "k", 5, ms),
        Err(Error::InvalidArgument {
            what: "algorithm",
            ..
        })
    ));
    assert!(matches!(
        Reservoir::new(conn().await, gcra.clone(), "k", 0, ms),
        Err(Error::ZeroLimit { .. })
    ));
    assert!(matches!(
        Reservoir::new(conn().await, gcra.clone(), "k", 11, ms),
        Err(Error::InsufficientCapacity { .. })
    ));
    assert!(Reservoir::new(conn().await, gcra.clone(), "k", 5, Duration::ZERO).is_err());
    let r = Reservoir::new(conn().await, gcra, "k", 5, ms).unwrap();
    assert!(matches!(r.check(0).await, Err(Error::ZeroLimit { .. })));
    assert!(matches!(
        r.check(11).await,
        Err(Error::InsufficientCapacity { .. })
    ));
    assert_eq!(r.stats().batch_calls, 0);
}

/// Takes a batch of `batch` units from a full limit into `r`, using one of
/// them: a first call of `first` units (no local rate yet: a batch of just
/// that), a pause of `pause`, then a call of one unit whose batch the local
/// rate sizes to `batch` (the largest allowed). Answers when that call
/// began (its batch was sent a little later).
async fn take_a_batch(r: &Reservoir<Conn>, first: u64, pause: Duration, batch: u64) -> Instant {
    assert!(r.check(first).await.unwrap().allowed);
    tokio::time::sleep(pause).await;
    let began = Instant::now();
    let d = r.check(1).await.unwrap();
    assert!(d.allowed && !d.local, "{d:?}");
    let s = r.stats();
    assert_eq!((s.batch_calls, s.granted), (2, first + batch), "{s:?}");
    assert_eq!(r.held() + r.stats().decayed, batch - 1);
    began
}

/// Waits until the limit at `key` is full again by the server: every unit
/// taken so far has refilled there.
async fn until_full(limiter: &Limiter, conn: &mut Conn, key: &str, every: Duration) {
    let burst = limiter.quota().burst();
    let begin = Instant::now();
    while limiter.peek(conn, key, 1).await.unwrap().remaining < burst {
        assert!(begin.elapsed() < Duration::from_secs(10), "never refilled");
        tokio::time::sleep(every).await;
    }
}

/// Once the limit is full again on the server, another client takes a whole
/// burst; then the reservoir, which must hold none of its unused units any
/// more (all decayed), is asked for as many. Answers the units the
/// reservoir admitted without a call and its stats before it was asked;
/// checks the window's bound by the server clock over everything admitted.
async fn a_full_burst_then_the_reservoir(
    limiter: &Limiter,
    r: &Reservoir<Conn>,
    key: &str,
    server: &RedisServer,
) -> (u64, ReservoirStats) {
    let mut other = server.conn().await;
    let burst = limiter.quota().burst();
    let t_us = limiter.quota().emission_interval().as_micros() as u64;
    let start_us = server_micros(&mut other).await;
    let fresh = limiter.check(&mut other, key, burst).await.unwrap();
    assert!(fresh.allowed, "the server had refilled: {fresh:?}");
    let held = r.held();
    let s = r.stats();
    assert_eq!(
        held, 0,
        "the reservoir still holds {held} units that refilled on the server: {s:?}"
    );
    assert_eq!(s.admitted + s.returned + s.decayed, s.granted, "{s:?}");
    let unused = s.granted - s.admitted;
    let (mut local, mut by_server) = (0, 0);
    for _ in 0..unused {
        let d = r.check(1).await.unwrap();
        match (d.allowed, d.local) {
            (true, true) => local += 1,
            (true, false) => by_server += 1,
            _ => {}
        }
    }
    let end_us = server_micros(&mut other).await;
    let bound = burst + (end_us - start_us) / t_us;
    assert!(
        burst + local + by_server <= bound,
        "{burst} fresh + {local} local + {by_server} granted by the server in {} us > bound {bound}",
        end_us - start_us
    );
    (local, s)
}

#[tokio::test]
async fn a_reservoir_never_serves_units_that_refilled_on_the_server() {
    let server = RedisServer::start();
    let mut probe = server.conn().await;
    // 10 per second, burst 10 (T = 100 ms), held 5 s: far longer than the
    // second in which a batch of 10 refills on the server.
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let key = prefix("refilled");
    let r = Reservoir::new(
        server.conn().await,
        limiter.clone(),
        &key,
        10,
        Duration::from_secs(5),
    )
    .unwrap();
    // After the first unit has refilled: a rate of about 9 per second, a
    // batch of 45 capped at 10.
    take_a_batch(&r, 1, Duration::from_millis(110), 10).await;
    assert!(
        r.check(1).await.unwrap().local,
        "a second unit of the batch"
    );
    assert_eq!(r.held(), 8);
    until_full(&limiter, &mut probe, &key, Duration::from_millis(20)).await;
    let (local, s) = a_full_burst_then_the_reservoir(&limiter, &r, &key, &server).await;
    assert_eq!(
        (s.granted, s.admitted, s.decayed, s.returned),
        (11, 3, 8, 0)
    );
    // A new batch needs 100 ms of refill: every decision here went to the
    // server, which had nothing.
    assert_eq!(
        local, 0,
        "the reservoir served {local} units locally that had refilled on the server"
    );
}

#[tokio::test]
async fn a_reservoir_with_compare_settings_never_serves_refilled_units() {
    let server = RedisServer::start();
    let mut probe = server.conn().await;
    // compare's settings: 2 000 per second, burst 100 (T = 500 us), batches
    // of at most 50, held 50 ms; a batch of 50 refills in 25 ms.
    let limiter = Limiter::new(
        Algorithm::Gcra,
        Quota::per_second(2_000).unwrap().with_burst(100).unwrap(),
    )
    .unwrap();
    let key = prefix("refilled_compare");
    let r = Reservoir::new(
        server.conn().await,
        limiter.clone(),
        &key,
        50,
        Duration::from_millis(50),
    )
    .unwrap();
    // The second call follows the first at once: a high local rate, the
    // largest batch.
    take_a_batch(&r, 5, Duration::ZERO, 50).await;
    // A second unit of the batch, if the machine let this task run within
    // the 500 us before the second slot began.
    let _ = r.check(1).await.unwrap();
    until_full(&limiter, &mut probe, &key, Duration::from_millis(1)).await;
    // Here a unit refills every 500 us: the reservoir's next batch call
    // may get a few, which it may serve locally; the window's bound holds
    // over all of them.
    let (_, s) = a_full_burst_then_the_reservoir(&limiter, &r, &key, &server).await;
    assert!(s.decayed >= 48, "{s:?}");
}

#[tokio::test]
async fn a_refund_never_frees_the_slots_of_units_served_late() {
    let server = RedisServer::start();
    let mut other = server.conn().await;
    // 5 per second, burst 10 (T = 200 ms): a batch of 10 refills in 2 s.
    let limiter = Limiter::new(
        Algorithm::Gcra,
        Quota::per_second(5).unwrap().with_burst(10).unwrap(),
    )
    .unwrap();
    let t_us = 200_000;
    let key = prefix("late");
    let r = Reservoir::new(
        server.conn().await,
        limiter.clone(),
        &key,
        10,
        Duration::from_secs(5),
    )
    .unwrap();
    let began = take_a_batch(&r, 1, Duration::from_millis(250), 10).await;
    // 1.1 s after the send, 6 of the batch's slots have begun: 4 of its 9
    // unused units may still be served, late (from slots 7 to 10).
    tokio::time::sleep_until((began + Duration::from_millis(1_100)).into()).await;
    let start_us = server_micros(&mut other).await;
    let late = r.held();
    assert!(late > 0, "units left to serve late");
    for _ in 0..late {
        let d = r.check(1).await.unwrap();
        assert!(d.allowed && d.local, "{d:?}");
    }
    // Given back 200 ms later: the server must keep the slots of those
    // units, so the unused units that had decayed by then do not go back.
    tokio::time::sleep_until((began + Duration::from_millis(1_300)).into()).await;
    let credited = r.flush().await.unwrap();
    let fresh = limiter
        .check_at_most(&mut other, &key, 10)
        .await
        .unwrap()
        .granted;
    let end_us = server_micros(&mut other).await;
    let bound = 10 + (end_us - start_us) / t_us;
    assert!(
        late + fresh <= bound,
        "{late} served late + {fresh} fresh (the refund credited {credited}) in {} us > bound {bound}",
        end_us - start_us
    );
}
