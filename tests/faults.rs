//! One fault at a time, on one server of the test's own: what the caller
//! sees (a value, a definite `Error::Redis`, or `Error::Indeterminate`) and
//! that the state agrees with it. The randomised mixes are in
//! `tests/histories.rs`.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nolock::{fence, limits, Error, Proxied, Tracked};
use support::faults::{self, DURABLE};
use support::history::{
    check_counter, check_fences, FenceOp, FenceReply, Increment, Outcome, Recorder,
};
use support::proxy::FaultProxy;
use support::{prefix, RedisServer};

const LONG: Duration = Duration::from_secs(600);
const LIMIT: u64 = 1_000_000;

async fn count(server: &RedisServer, key: &str) -> u64 {
    let mut conn = server.conn().await;
    limits::peek(&mut conn, key).await.expect("peek").count
}

/// A connection through the proxy, retried for up to a second while the
/// proxy starts listening again.
async fn through(proxy: &FaultProxy, timeout: Duration) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(timeout));
    let client = redis::Client::open(proxy.url()).expect("url");
    let mut last = None;
    for _ in 0..50 {
        match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(conn) => return conn,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("connect through the proxy: {last:?}");
}

/// 5,000 calls from 50 tasks share one connection; `CLIENT KILL` closes it
/// after about 1,000. Returns the history and the final count.
async fn storm<C>(
    server: &RedisServer,
    conn: C,
) -> (
    Vec<support::history::Event<Increment, limits::Admission>>,
    u64,
)
where
    C: redis::aio::ConnectionLike + Clone + Send + 'static,
{
    let key = format!("{}storm", prefix("faults"));
    let history = Arc::new(Recorder::<Increment, limits::Admission>::new());
    let done = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for process in 0..50 {
        let (mut conn, history, done, key) =
            (conn.clone(), history.clone(), done.clone(), key.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..100 {
                history
                    .record(
                        process,
                        Increment { n: 1, key: 0 },
                        limits::try_increment(&mut conn, &key, LIMIT, LONG),
                    )
                    .await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut admin = server.conn().await;
    while done.load(Ordering::Relaxed) < 1_000 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    faults::client_kill(&mut admin).await.expect("CLIENT KILL");
    for h in handles {
        h.await.expect("task");
    }
    (history.events(), count(server, &key).await)
}

/// After one `CLIENT KILL` in a storm of 5,000 calls on one shared
/// `MultiplexedConnection`, only the calls in flight at the kill (at most
/// one per task, 50) may have run unseen. A plain connection cannot say
/// which calls came later (redis-rs gives them the same error), so about
/// 4,000 are `Indeterminate`; through [`Tracked`] they are refused before
/// anything is sent, as definite errors. Both histories pass the counter
/// checker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_client_kill_only_calls_in_flight_are_indeterminate_when_tracked() {
    let server = RedisServer::start();
    let unknown = |events: &[support::history::Event<Increment, limits::Admission>]| {
        events
            .iter()
            .filter(|e| e.outcome.is_indeterminate())
            .count()
    };

    let (plain, final_count) = storm(&server, server.conn().await).await;
    let verdict = check_counter(&plain, final_count, LIMIT);
    assert!(verdict.is_ok(), "{verdict:?}");

    let (tracked, final_count) = storm(&server, Tracked::new(server.conn().await)).await;
    let verdict = check_counter(&tracked, final_count, LIMIT);
    assert!(verdict.is_ok(), "{verdict:?}");
    let never_sent = tracked
        .iter()
        .filter(|e| matches!(&e.outcome, Outcome::Definite(m) if m.contains("not sent")))
        .count();
    eprintln!(
        "5000 calls, one CLIENT KILL: plain connection {} indeterminate; tracked {} indeterminate, {never_sent} never sent",
        unknown(&plain),
        unknown(&tracked),
    );
    assert!(
        unknown(&plain) >= 3_000,
        "{} indeterminate",
        unknown(&plain)
    );
    assert!(
        unknown(&tracked) <= 50,
        "{} indeterminate",
        unknown(&tracked)
    );
    assert!(never_sent >= 3_000, "{never_sent} never sent");
}

/// The proxy forwards the script, then cuts the connection before the
/// reply: the caller sees `Indeterminate`, and the increment did happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_indeterminate_and_the_call_ran() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port).await;
    let mut conn = Tracked::new(through(&proxy, Duration::from_secs(2)).await);
    let key = format!("{}lost", prefix("faults"));
    let first = limits::try_increment(&mut conn, &key, LIMIT, LONG).await;
    assert!(first.expect("first call").admitted);
    proxy.lose_replies(1);
    let err = limits::try_increment(&mut conn, &key, LIMIT, LONG)
        .await
        .expect_err("the reply is lost");
    assert!(matches!(err, Error::Indeterminate(_)), "{err:?}");
    assert_eq!(proxy.stats().replies_lost, 1);
    assert_eq!(count(&server, &key).await, 2, "the lost call ran");
    // The next call on the dropped connection is never sent: definite.
    let err = limits::try_increment(&mut conn, &key, LIMIT, LONG)
        .await
        .expect_err("the connection is closed");
    assert!(err.is_definite(), "{err:?}");
    assert_eq!(count(&server, &key).await, 2);
}

/// Replies held past the response timeout: `Indeterminate`, and the call
/// ran. Replies delayed below it: plain values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_replies_time_out_as_indeterminate_delayed_ones_arrive() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port).await;
    let mut conn = through(&proxy, Duration::from_millis(300)).await;
    let key = format!("{}held", prefix("faults"));
    proxy.set_delay(Duration::from_millis(100));
    let admitted = limits::try_increment(&mut conn, &key, LIMIT, LONG).await;
    assert!(admitted.expect("a delayed reply").admitted);
    proxy.set_delay(Duration::ZERO);
    proxy.hold();
    let err = limits::try_increment(&mut conn, &key, LIMIT, LONG)
        .await
        .expect_err("the reply is held past the timeout");
    assert!(matches!(err, Error::Indeterminate(_)), "{err:?}");
    proxy.release();
    assert_eq!(count(&server, &key).await, 2, "the timed-out call ran");
}

/// All connections cut and new ones refused: calls on the cut (tracked)
/// connection are definite (never sent), connecting fails, and once the proxy accepts
/// again a new connection works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_and_refused_connections_send_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port).await;
    let mut conn = Tracked::new(through(&proxy, Duration::from_secs(2)).await);
    let key = format!("{}cut", prefix("faults"));
    let first = limits::try_increment(&mut conn, &key, LIMIT, LONG).await;
    assert!(first.expect("first call").admitted);
    proxy.refuse();
    proxy.cut_all();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The first call finds the socket closed; redis-rs cannot say whether it
    // was written, so it is indeterminate. It marks the connection dropped.
    let err = limits::try_increment(&mut conn, &key, LIMIT, LONG)
        .await
        .expect_err("the connection is cut");
    assert!(conn.is_dropped(), "{err:?}");
    for _ in 0..10 {
        let err = limits::try_increment(&mut conn, &key, LIMIT, LONG)
            .await
            .expect_err("the connection is cut");
        assert!(err.is_definite(), "{err:?}");
    }
    let refused = redis::Client::open(proxy.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await;
    assert!(refused.is_err_and(|e| e.is_connection_refusal()));
    proxy.accept();
    let mut conn = through(&proxy, Duration::from_secs(2)).await;
    let admitted = limits::try_increment(&mut conn, &key, LIMIT, LONG).await;
    assert_eq!(admitted.expect("after accept").count, 2);
}

/// `BUSY` and `OOM` are definite and change nothing; `CLIENT PAUSE` only
/// delays. Through [`Proxied`], the same `BUSY` is `Indeterminate`: behind
/// a real proxy an error reply can hide a script that ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_oom_and_pause_on_one_server_and_behind_a_proxy() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut proxied = Proxied::new(server.conn().await);
    let mut admin = server.conn().await;
    let key = format!("{}busy", prefix("faults"));

    let url = server.url();
    let busy = tokio::spawn(async move { faults::busy(&url, Duration::from_millis(800)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = limits::try_increment(&mut conn, &key, LIMIT, LONG)
        .await
        .expect_err("BUSY");
    assert!(
        matches!(&err, Error::Redis(e) if e.to_string().contains("BUSY")),
        "{err:?}"
    );
    let err = limits::try_increment(&mut proxied, &key, LIMIT, LONG)
        .await
        .expect_err("BUSY through the proxy");
    assert!(matches!(err, Error::Indeterminate(_)), "{err:?}");
    busy.await.expect("busy task").expect("busy script");
    assert_eq!(count(&server, &key).await, 0);

    let oom = tokio::spawn({
        let mut admin = server.conn().await;
        async move { faults::oom(&mut admin, Duration::from_millis(500)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = limits::try_increment(&mut conn, &key, LIMIT, LONG)
        .await
        .expect_err("OOM");
    assert!(
        matches!(&err, Error::Redis(e) if e.to_string().contains("OOM")),
        "{err:?}"
    );
    oom.await.expect("oom task").expect("oom");
    assert_eq!(count(&server, &key).await, 0);

    faults::client_pause(&mut admin, Duration::from_millis(300))
        .await
        .expect("CLIENT PAUSE");
    let started = std::time::Instant::now();
    let admitted = limits::try_increment(&mut conn, &key, LIMIT, LONG).await;
    assert!(admitted.expect("after the pause").admitted);
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(count(&server, &key).await, 1);
}

/// `kill -9` and a restart from the AOF (`appendfsync always`) while 4
/// clients increment a counter and take two fenced locks, one drawing from
/// its own counter and one from its slot's (`FenceSource::PerSlot`): every
/// acknowledged increment survives, and both locks' fences keep rising
/// across the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_restart_keeps_counts_and_fences_rising() {
    let server = Arc::new(Mutex::new(RedisServer::start_with(&DURABLE)));
    let url = server.lock().expect("server").url();
    let key = format!("{}restart", prefix("faults"));
    let lock = format!("{}lock", prefix("faults"));
    let counters = Arc::new(Recorder::<Increment, limits::Admission>::new());
    let fences = Arc::new(Recorder::<FenceOp, FenceReply>::new());
    // Another resource, fenced from the slot counter it shares with every
    // resource of its slot.
    let slot_lock = format!("{}slot_lock", prefix("faults"));
    let slot_fences = Arc::new(Recorder::<FenceOp, FenceReply>::new());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for process in 0..4 {
        let (counters, fences, stop, key, lock, url) = (
            counters.clone(),
            fences.clone(),
            stop.clone(),
            key.clone(),
            lock.clone(),
            url.clone(),
        );
        let (slot_fences, slot_lock) = (slot_fences.clone(), slot_lock.clone());
        tasks.push(tokio::spawn(async move {
            let client = redis::Client::open(url).expect("url");
            let mut conn = None;
            while !stop.load(Ordering::Relaxed) {
                let Some(c) = conn.as_mut() else {
                    conn = client.get_multiplexed_async_connection().await.ok();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let o = counters
                    .record(
                        process,
                        Increment { n: 1, key: 0 },
                        limits::try_increment(c, &key, LIMIT, LONG),
                    )
                    .await;
                let short = fence::Lock::new(Duration::from_millis(20)).expect("ttl");
                let f = fences
                    .record(process, FenceOp::Acquire, granted(&short, c, &lock))
                    .await;
                let by_slot = short.with_fence_source(fence::FenceSource::PerSlot);
                let s = slot_fences
                    .record(process, FenceOp::Acquire, granted(&by_slot, c, &slot_lock))
                    .await;
                if [&f, &s].iter().any(|r| !matches!(r, Outcome::Ok(_)))
                    || !matches!(o, Outcome::Ok(_))
                {
                    conn = None; // reconnect after the restart
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restart = server.clone();
    tokio::task::spawn_blocking(move || {
        faults::kill_and_restart(&mut restart.lock().expect("server"))
    })
    .await
    .expect("restart");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("client");
    }
    let events = counters.events();
    let (before, after): (Vec<_>, Vec<_>) = fences
        .events()
        .into_iter()
        .filter(|e| matches!(e.outcome, Outcome::Ok(FenceReply::Granted(_))))
        .partition(|e| e.completed < Duration::from_millis(300));
    assert!(
        !before.is_empty() && !after.is_empty(),
        "grants on both sides of the restart"
    );
    let client = server.lock().expect("server").client();
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let stored = limits::peek(&mut conn, &key).await.expect("peek").count;
    let verdict = check_counter(&events, stored, LIMIT);
    assert!(verdict.is_ok(), "{verdict:?}");
    for (name, recorded) in [("per resource", &fences), ("per slot", &slot_fences)] {
        let events = recorded.events();
        let after = events
            .iter()
            .filter(|e| e.completed > Duration::from_millis(300))
            .filter(|e| matches!(e.outcome, Outcome::Ok(FenceReply::Granted(_))))
            .count();
        assert!(after > 0, "{name}: grants after the restart");
        let verdict = check_fences(&events, None);
        assert!(verdict.is_ok(), "{name}: {verdict:?}");
    }
}

/// One acquire of `resource`, as the fence history records it.
async fn granted(
    lock: &fence::Lock,
    conn: &mut redis::aio::MultiplexedConnection,
    resource: &str,
) -> nolock::Result<FenceReply> {
    lock.acquire(conn, resource)
        .await
        .map(|a| match a.acquired() {
            Some(g) => FenceReply::Granted(g.fence().number()),
            None => FenceReply::Held,
        })
}
