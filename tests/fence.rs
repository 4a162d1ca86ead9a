//! `nolock::fence` against a real redis-server.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{
    self, AdvanceAttempt, Fence, Lock, LockAttempt, LockExtend, LockRelease, Token, Write,
};
use nolock::Error;
use nolock::{Backoff, Loss, Work};
use redis::aio::MultiplexedConnection;
use support::{command_calls, keys, prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

fn lock_key(resource: &str) -> String {
    nolock::keys::derive(resource, "lock")
}

fn fence_key(resource: &str) -> String {
    nolock::keys::derive(resource, "fence")
}

fn lock(ttl: Duration) -> Lock {
    Lock::new(ttl).unwrap()
}

fn fence_of(resource: &str, number: u64) -> Fence {
    Fence::from_message(resource, number).unwrap()
}

/// The lock value of a grant: its fence, then its token.
fn held_by(grant: &fence::Grant) -> String {
    format!("{}:{}", grant.fence().number(), grant.token().as_str())
}

fn grant(outcome: LockAttempt) -> fence::Grant {
    match outcome {
        LockAttempt::Acquired(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}

/// Wait (bounded) until the server has expired `key`.
async fn wait_gone(conn: &mut MultiplexedConnection, key: &str) {
    let start = Instant::now();
    loop {
        let exists: i64 = raw(conn, &["EXISTS", key]).await;
        if exists == 0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{key} never expired"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn acquire_grants_increasing_fences_and_reports_a_held_lock() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}r", prefix("acquire"));

    let before = Instant::now();
    let first = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(first.fence().number(), 1, "fences start at 1");
    assert_eq!(first.ttl(), MINUTE);
    assert!(first.deadline() > before && first.deadline() <= Instant::now() + MINUTE);
    let holder: String = raw(&mut conn, &["GET", &lock_key(&resource)]).await;
    assert_eq!(
        holder,
        format!("1:{}", first.token().as_str()),
        "the fence, then the token"
    );
    let pttl: i64 = raw(&mut conn, &["PTTL", &lock_key(&resource)]).await;
    assert!(pttl > 55_000 && pttl <= 60_000, "{pttl}");
    let counter_ttl: i64 = raw(&mut conn, &["PTTL", &fence_key(&resource)]).await;
    assert_eq!(counter_ttl, -1, "the fence counter never expires");

    // Held: a value, not an error, and nothing written.
    match lock(MINUTE).acquire(&mut conn, &resource).await.unwrap() {
        LockAttempt::Held { expires_in } => {
            let left = expires_in.expect("the lock has a TTL");
            assert!(
                left <= MINUTE && left > MINUTE - Duration::from_secs(5),
                "{left:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let counter: String = raw(&mut conn, &["GET", &fence_key(&resource)]).await;
    assert_eq!(counter, "1", "a refused acquire does not move the counter");

    let first_token = first.token().clone();
    assert_eq!(
        first.release(&mut conn).await.unwrap(),
        LockRelease::Released
    );
    assert_eq!(
        keys(&mut conn, &lock_key(&resource)).await,
        Vec::<String>::new()
    );
    let second = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(second.fence().number(), 2);
    assert_ne!(second.token(), &first_token);
}

#[tokio::test]
async fn acquire_as_is_idempotent_for_the_holder_of_the_token() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}r", prefix("acquire_as"));
    let token = Token::random().unwrap();

    let short = Duration::from_secs(5);
    let first = grant(
        lock(short)
            .acquire_as(&mut conn, &resource, &token)
            .await
            .unwrap(),
    );
    // A retry (say after a lost reply) finds its own lock: same fence, new TTL.
    let again = grant(
        lock(MINUTE)
            .acquire_as(&mut conn, &resource, &token)
            .await
            .unwrap(),
    );
    assert_eq!(again.fence().number(), first.fence().number());
    let pttl: i64 = raw(&mut conn, &["PTTL", &lock_key(&resource)]).await;
    assert!(pttl > 55_000, "TTL set again: {pttl}");
    let counter: String = raw(&mut conn, &["GET", &fence_key(&resource)]).await;
    assert_eq!(
        counter,
        first.fence().number().to_string(),
        "no second increment"
    );

    let other = Token::random().unwrap();
    assert!(!lock(MINUTE)
        .acquire_as(&mut conn, &resource, &other)
        .await
        .unwrap()
        .is_acquired());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_tasks_hold_the_lock_one_at_a_time_with_increasing_fences() {
    const TASKS: usize = 50;
    const ROUNDS: usize = 4;
    let redis = support::redis();
    let resource = format!("{}r", prefix("mutex"));
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(redis.conn().await);
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let max_holders = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let backoff = Backoff {
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(20),
        ..Backoff::new(Duration::from_secs(60))
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let mut conn = conns[i % conns.len()].clone();
        let (resource, holders, max_holders, fences, barrier) = (
            resource.clone(),
            holders.clone(),
            max_holders.clone(),
            fences.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            for _ in 0..ROUNDS {
                let outcome = lock(MINUTE)
                    .with_wait(backoff)
                    .acquire(&mut conn, &resource)
                    .await
                    .unwrap();
                let grant = grant(outcome);
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                max_holders.fetch_max(now, Ordering::SeqCst);
                // Inside the critical section, pushes happen in grant order.
                fences.lock().unwrap().push(grant.fence().number());
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(
                    grant.release(&mut conn).await.unwrap(),
                    LockRelease::Released
                );
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        max_holders.load(Ordering::SeqCst),
        1,
        "never two holders at once"
    );
    let fences = fences.lock().unwrap().clone();
    let expected: Vec<u64> = (1..=(TASKS * ROUNDS) as u64).collect();
    assert_eq!(
        fences, expected,
        "one fence per grant, strictly increasing, no gaps"
    );
}

#[tokio::test]
async fn a_paused_holder_is_fenced_out_and_cannot_touch_the_new_lock() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("paused");
    let resource = format!("{p}payout");
    let ttl = Duration::from_millis(200);

    let mut a = grant(lock(ttl).acquire(&mut conn, &resource).await.unwrap());
    // A is paused (GC, stalled VM) past its TTL ...
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    wait_gone(&mut conn, &lock_key(&resource)).await;
    // ... and B takes over and writes.
    let b = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert!(b.fence().number() > a.fence().number());
    assert_eq!(
        b.fence().write(&mut conn, "paid by B").await.unwrap(),
        Write::Applied
    );

    // A wakes up and carries on as if it still held the lock.
    assert_eq!(
        a.fence().write(&mut conn, "paid by A").await.unwrap(),
        Write::Stale {
            current_fence: b.fence().number()
        }
    );
    assert_eq!(a.extend(&mut conn).await.unwrap(), LockExtend::Lost);
    assert_eq!(a.release(&mut conn).await.unwrap(), LockRelease::Lost);

    let holder: String = raw(&mut conn, &["GET", &lock_key(&resource)]).await;
    assert_eq!(holder, held_by(&b), "B's lock survived A's release");
    let pttl: i64 = raw(&mut conn, &["PTTL", &lock_key(&resource)]).await;
    assert!(pttl > 55_000, "A's extend did not touch B's TTL: {pttl}");
    let stored = fence::read(&mut conn, &resource).await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"paid by B"[..], b.fence().number())
    );
}

#[tokio::test]
async fn extend_resets_the_ttl_but_never_revives_an_expired_lock() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}r", prefix("extend"));

    let mut g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    // Most of the TTL has gone by.
    let _: () = raw(&mut conn, &["PEXPIRE", &lock_key(&resource), "100"]).await;
    let before = Instant::now();
    match g.extend(&mut conn).await.unwrap() {
        LockExtend::Extended { deadline } => {
            assert!(
                deadline > before + Duration::from_secs(55) && deadline <= Instant::now() + MINUTE
            );
            assert_eq!(g.deadline(), deadline, "the grant's deadline moved");
        }
        LockExtend::Lost => panic!("still ours"),
    }
    let pttl: i64 = raw(&mut conn, &["PTTL", &lock_key(&resource)]).await;
    assert!(pttl > 55_000, "{pttl}");

    let _: () = raw(&mut conn, &["DEL", &lock_key(&resource)]).await;
    assert_eq!(g.extend(&mut conn).await.unwrap(), LockExtend::Lost);
    assert_eq!(
        keys(&mut conn, &lock_key(&resource)).await,
        Vec::<String>::new(),
        "not revived"
    );
}

#[tokio::test]
async fn a_lease_outlives_three_ttls_and_stops_renewing_once_released() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let resource = format!("{}r", prefix("lease"));
    let ttl = Duration::from_millis(300);

    let lease = lock(ttl)
        .lease(conn.clone(), &resource)
        .await
        .unwrap()
        .acquired()
        .expect("free lock");
    assert_eq!(lease.fence().number(), 1);
    assert_eq!(lease.resource(), resource);
    assert_eq!(lease.ttl(), ttl);
    let first_deadline = lease.deadline();

    // "Work" for more than 3 x TTL, checking that the lock never lapses.
    let start = Instant::now();
    while start.elapsed() < 3 * ttl + Duration::from_millis(200) {
        let holder: Option<String> = raw(&mut conn, &["GET", &lock_key(&resource)]).await;
        assert_eq!(
            holder.as_deref(),
            Some(format!(
                "{}:{}",
                lease.fence().number(),
                lease.token().as_str()
            ))
            .as_deref(),
            "lapsed after {:?}",
            start.elapsed()
        );
        assert!(!lease.is_lost());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(
        lease.deadline() > first_deadline,
        "renewals moved the deadline"
    );
    let renewals = command_calls(&mut conn, "pexpire").await;
    assert!(renewals >= 3, "only {renewals} renewals");

    assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
    assert_eq!(
        keys(&mut conn, &lock_key(&resource)).await,
        Vec::<String>::new()
    );
    let pexpire = command_calls(&mut conn, "pexpire").await;
    let evalsha = command_calls(&mut conn, "evalsha").await;
    tokio::time::sleep(ttl + Duration::from_millis(100)).await; // > 3 renewal periods
    assert_eq!(
        command_calls(&mut conn, "pexpire").await,
        pexpire,
        "no renewal after release"
    );
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        evalsha,
        "nothing sent after release"
    );
}

#[tokio::test]
async fn a_lease_signals_loss_within_one_renewal_period() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let resource = format!("{}r", prefix("loss"));
    let ttl = Duration::from_millis(600);
    let period = ttl / 3;

    let lease = lock(ttl)
        .lease(conn.clone(), &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let token = lease.cancellation_token();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!lease.is_lost() && !token.is_cancelled());

    // Someone deletes the lock behind the lease's back.
    let _: () = raw(&mut conn, &["DEL", &lock_key(&resource)]).await;
    let deleted = Instant::now();
    let loss = tokio::time::timeout(period * 3, lease.lost())
        .await
        .expect("loss signalled");
    let took = deleted.elapsed();
    eprintln!("loss detected after {took:?}");
    assert_eq!(loss, Loss::NotHeld);
    // One renewal period, plus a round trip and scheduling slack on a busy box.
    assert!(took <= period + Duration::from_millis(150), "took {took:?}");
    assert!(token.is_cancelled());
    assert_eq!(lease.loss(), Some(Loss::NotHeld));
    assert_eq!(lease.release().await.unwrap(), LockRelease::Lost);
}

#[tokio::test]
async fn an_unreachable_server_loses_the_lease_at_its_deadline() {
    let mut server = RedisServer::start();
    let conn = server.conn().await;
    let resource = format!("{}r", prefix("renewal_failed"));
    let ttl = Duration::from_millis(600);

    let lease = lock(ttl)
        .lease(conn, &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let deadline = lease.deadline();
    // The server dies (and with it, without persistence, the lock). Renewals
    // fail; they are tried again until the deadline, then the lease is lost.
    server.kill();
    let loss = tokio::time::timeout(ttl * 2, lease.lost())
        .await
        .expect("loss signalled");
    let at = Instant::now();
    assert!(matches!(loss, Loss::RenewalFailed { .. }), "{loss:?}");
    assert!(at >= deadline, "not before the deadline");
    assert!(
        at <= deadline + Duration::from_millis(150),
        "{:?} after the deadline",
        at - deadline
    );
    // The final release cannot reach the server either.
    let err = lease.release().await.unwrap_err();
    assert!(!err.is_invalid_input(), "{err}");
}

/// Runs a script on its own connection that keeps the server busy for `busy`.
fn keep_busy(server: &RedisServer, busy: Duration) -> tokio::task::JoinHandle<()> {
    let client = server.client();
    let us = busy.as_micros().to_string();
    tokio::spawn(async move {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let script = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
            while true do local n = redis.call('TIME') \
            if n[1] * 1000000 + n[2] - s > tonumber(ARGV[1]) then return 1 end end";
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(&us)
            .query_async(&mut conn)
            .await
            .unwrap();
    })
}

#[tokio::test]
async fn a_lease_survives_a_busy_server() {
    // Past 20 ms of script, the server answers other clients BUSY.
    let server = RedisServer::start_with(&["--busy-reply-threshold", "20"]);
    let mut conn = server.conn().await;
    let resource = format!("{}r", prefix("busy"));
    let ttl = Duration::from_millis(1500);

    let lease = lock(ttl)
        .lease(conn.clone(), &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    // The first renewal is due at 500 ms; the server is busy from 100 to 800 ms.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = keep_busy(&server, Duration::from_millis(700));
    tokio::time::sleep(Duration::from_millis(1400)).await;
    busy.await.unwrap();
    assert_eq!(lease.loss(), None, "a BUSY blip does not end the lease");
    assert!(lease.deadline() > Instant::now() + ttl / 3, "renewed since");
    let held: Option<String> = raw(&mut conn, &["GET", &lock_key(&resource)]).await;
    assert_eq!(
        held.as_deref(),
        Some(format!(
            "{}:{}",
            lease.fence().number(),
            lease.token().as_str()
        ))
        .as_deref()
    );
    assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
}

#[tokio::test]
async fn a_lease_survives_reply_timeouts_during_a_pause() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_millis(150)));
    let renewing = server
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let resource = format!("{}r", prefix("paused"));
    let ttl = Duration::from_millis(1500);

    let lease = lock(ttl)
        .lease(renewing, &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    // Every write waits 600 ms from 300 ms on: the renewal at 500 ms times out
    // (indeterminate), and is tried again until one gets through.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: () = raw(&mut conn, &["CLIENT", "PAUSE", "600", "WRITE"]).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        lease.loss(),
        None,
        "timeouts within the deadline are not a loss"
    );
    assert!(lease.deadline() > Instant::now() + ttl / 3, "renewed since");
    assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
}

#[tokio::test]
async fn a_pause_longer_than_the_deadline_loses_the_lease() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "20"]);
    let conn = server.conn().await;
    let resource = format!("{}r", prefix("long_busy"));
    let ttl = Duration::from_millis(600);

    let lease = lock(ttl)
        .lease(conn, &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let deadline = lease.deadline();
    let busy = keep_busy(&server, Duration::from_millis(1200));
    let loss = tokio::time::timeout(ttl * 2, lease.lost())
        .await
        .expect("loss signalled");
    assert!(Instant::now() >= deadline);
    match &loss {
        Loss::RenewalFailed { error } => assert!(error.contains("deadline"), "{error}"),
        other => panic!("{other:?}"),
    }
    busy.await.unwrap();
    // The lock expired meanwhile; the release finds it gone.
    assert_eq!(lease.release().await.unwrap(), LockRelease::Lost);
}

#[tokio::test]
async fn dropping_a_lease_releases_the_lock_in_the_background() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}r", prefix("drop"));

    let lease = lock(MINUTE)
        .lease(conn.clone(), &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let token = lease.cancellation_token();
    let started = Instant::now();
    drop(lease);
    assert!(
        started.elapsed() < Duration::from_millis(50),
        "drop does not block"
    );
    wait_gone(&mut conn, &lock_key(&resource)).await;
    tokio::time::timeout(Duration::from_secs(5), token.cancelled())
        .await
        .expect("tokens are cancelled when the lease ends");
    // Free again well before the one-minute TTL.
    assert!(lock(MINUTE)
        .acquire(&mut conn, &resource)
        .await
        .unwrap()
        .is_acquired());
}

#[tokio::test]
async fn with_lease_runs_the_work_and_releases() {
    let redis = support::redis();
    let conn = redis.conn().await;
    let mut check = redis.conn().await;
    let p = prefix("with_lease");
    let resource = format!("{p}job");

    let mut writer = conn.clone();
    let result = lock(MINUTE)
        .with_lease(conn.clone(), &resource, |fence| async move {
            assert_eq!(fence.number(), 1);
            fence.write(&mut writer, "done").await
        })
        .await
        .unwrap();
    assert_eq!(result.done().unwrap().unwrap(), Write::Applied);
    assert_eq!(
        keys(&mut check, &lock_key(&resource)).await,
        Vec::<String>::new(),
        "released"
    );
    assert_eq!(
        fence::read(&mut check, &resource)
            .await
            .unwrap()
            .unwrap()
            .fence,
        1
    );

    // Held by someone else for longer than the lock waits: Busy, not run.
    let other = grant(lock(MINUTE).acquire(&mut check, &resource).await.unwrap());
    let ran = Arc::new(AtomicBool::new(false));
    let ran2 = ran.clone();
    let waiting = lock(MINUTE).with_wait(Backoff::new(Duration::from_millis(50)));
    let busy = waiting
        .with_lease(conn, &resource, |_| async move {
            ran2.store(true, Ordering::SeqCst);
        })
        .await
        .unwrap();
    assert_eq!(busy, Work::Busy);
    assert!(!ran.load(Ordering::SeqCst));
    let holder: String = raw(&mut check, &["GET", &lock_key(&resource)]).await;
    assert_eq!(holder, held_by(&other));
}

#[tokio::test]
async fn with_lease_cancels_the_work_when_the_lease_is_lost() {
    let redis = support::redis();
    let conn = redis.conn().await;
    let mut admin = redis.conn().await;
    let resource = format!("{}r", prefix("with_lease_lost"));
    let lock_key = lock_key(&resource);

    let finished = Arc::new(AtomicBool::new(false));
    let finished2 = finished.clone();
    let started = Instant::now();
    let out = lock(Duration::from_millis(300))
        .with_lease(conn, &resource, |fence| {
            let lock_key = lock_key.clone();
            async move {
                // Someone deletes the lock while the work runs (long past its TTL).
                let _: () = raw(&mut admin, &["DEL", &lock_key]).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
                finished2.store(true, Ordering::SeqCst);
                fence.number()
            }
        })
        .await
        .unwrap();
    assert_eq!(out, Work::Stopped(Loss::NotHeld));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancelled, not waited out"
    );
    assert!(!finished.load(Ordering::SeqCst));
}

/// Work that stalls the runtime past the TTL (no renewal can run) and then
/// finishes: the answer says the hold was lost, in its type, and the fence
/// it carried is refused once a newer grant exists.
#[test]
fn with_lease_over_a_stall_past_the_ttl_answers_overran() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut conn = server.conn().await;
        let resource = format!("{}r", prefix("with_lease_stall"));
        let ttl = Duration::from_millis(200);
        let out = lock(ttl)
            .with_lease(conn.clone(), &resource, |fence| async move {
                // A GC pause, a stuck VM: the whole runtime stops.
                std::thread::sleep(2 * ttl);
                fence
            })
            .await
            .unwrap();
        let Work::Overran { output: old, loss } = out else {
            panic!("the lost hold must show: {out:?}");
        };
        assert_eq!(loss, Loss::NotHeld);
        let next = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
        assert!(next.fence().number() > old.number());
        assert_eq!(
            old.write(&mut conn, "late").await.unwrap(),
            Write::Stale {
                current_fence: next.fence().number()
            }
        );
    });
}

#[tokio::test]
async fn fences_are_exact_above_2_pow_53() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("exact");
    let resource = format!("{p}r");
    let account = format!("{p}acct");
    let two_53: u64 = 1 << 53;

    let _: () = raw(
        &mut conn,
        &["SET", &fence_key(&resource), &two_53.to_string()],
    )
    .await;
    let g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(g.fence().number(), two_53 + 1, "not rounded to 2^53");
    let counter: String = raw(&mut conn, &["GET", &fence_key(&resource)]).await;
    assert_eq!(counter, "9007199254740993");

    // 2^53 + 1 and 2^53 + 2 are different fences, though equal as doubles ...
    assert_eq!(
        fence_of("unbound", two_53 + 2)
            .write_unbound(&mut conn, &account, "newer")
            .await
            .unwrap(),
        Write::Applied
    );
    assert_eq!(
        fence_of("unbound", g.fence().number())
            .write_unbound(&mut conn, &account, "older")
            .await
            .unwrap(),
        Write::Stale {
            current_fence: two_53 + 2
        }
    );
    // ... and so are the largest fences a counter reaches.
    const MAX: u64 = i64::MAX as u64;
    assert_eq!(
        fence_of("unbound", MAX)
            .write_unbound(&mut conn, &account, "max")
            .await
            .unwrap(),
        Write::Applied
    );
    assert_eq!(
        fence_of("unbound", MAX - 1)
            .write_unbound(&mut conn, &account, "max-1")
            .await
            .unwrap(),
        Write::Stale { current_fence: MAX }
    );
    let stored = fence::read_unbound(&mut conn, &account)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stored.value, stored.fence), (b"max".to_vec(), MAX));
}

#[tokio::test]
async fn unbound_writes_accept_equal_or_newer_fences_only() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}acct", prefix("write"));

    assert_eq!(fence::read_unbound(&mut conn, &key).await.unwrap(), None);
    assert_eq!(
        fence_of("unbound", 7)
            .write_unbound(&mut conn, &key, "a")
            .await
            .unwrap(),
        Write::Applied
    );
    // The same grant writes again (a second step, or a retry).
    assert_eq!(
        fence_of("unbound", 7)
            .write_unbound(&mut conn, &key, "b")
            .await
            .unwrap(),
        Write::Applied
    );
    assert_eq!(
        fence_of("unbound", 9)
            .write_unbound(&mut conn, &key, "c")
            .await
            .unwrap(),
        Write::Applied
    );
    assert_eq!(
        fence_of("unbound", 8)
            .write_unbound(&mut conn, &key, "d")
            .await
            .unwrap(),
        Write::Stale { current_fence: 9 }
    );
    assert_eq!(
        fence_of("unbound", 10)
            .write_unbound(&mut conn, &key, "")
            .await
            .unwrap(),
        Write::Applied,
        "empty values are values"
    );
    let stored = fence::read_unbound(&mut conn, &key).await.unwrap().unwrap();
    assert_eq!((stored.value, stored.fence), (Vec::new(), 10));
    let fields: Vec<String> = raw(&mut conn, &["HKEYS", &key]).await;
    assert_eq!(fields.len(), 2, "{fields:?}");
}

#[tokio::test]
async fn a_stale_write_is_refused_as_soon_as_a_newer_grant_exists() {
    // A's write after B's grant, before B wrote anything, is refused (were
    // it applied, B's later write would then erase it).
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}payout", prefix("stale-unwritten"));
    let ttl = Duration::from_millis(100);

    let a = grant(lock(ttl).acquire(&mut conn, &resource).await.unwrap());
    wait_gone(&mut conn, &lock_key(&resource)).await;
    let b = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(
        a.fence().write(&mut conn, "A").await.unwrap(),
        Write::Stale {
            current_fence: b.fence().number()
        },
        "B has not written, but its grant exists"
    );
    assert_eq!(fence::read(&mut conn, &resource).await.unwrap(), None);
    assert_eq!(
        b.fence().write(&mut conn, "B").await.unwrap(),
        Write::Applied
    );
    assert_eq!(
        b.fence().write(&mut conn, "B again").await.unwrap(),
        Write::Applied,
        "the newest grant may write again"
    );
}

#[tokio::test]
async fn a_fence_above_the_counter_is_refused() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}acct", prefix("above"));

    // No grant at all yet: every fence is above the (missing) counter.
    assert_eq!(
        fence_of(&resource, 1).write(&mut conn, "x").await.unwrap(),
        Write::NotGranted { counter: 0 }
    );
    let g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    for made_up in [g.fence().number() + 1, i64::MAX as u64] {
        assert_eq!(
            fence_of(&resource, made_up)
                .write(&mut conn, "x")
                .await
                .unwrap(),
            Write::NotGranted {
                counter: g.fence().number()
            }
        );
    }
    assert_eq!(fence::read(&mut conn, &resource).await.unwrap(), None);
    // The made-up fences left nothing behind that could shut out the real one.
    assert_eq!(
        g.fence().write(&mut conn, "real").await.unwrap(),
        Write::Applied
    );
}

#[tokio::test]
async fn advance_then_acquire_gives_a_fence_above_the_floor() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}job", prefix("advance"));

    let first = advanced(fence::advance(&mut conn, &resource, 41).await.unwrap());
    assert_eq!((first.raised, first.counter), (true, 42), "above the floor");
    let g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(g.fence().number(), 43);
    // Already above the floor: the answer is the same with a holder or not.
    let lower = advanced(fence::advance(&mut conn, &resource, 7).await.unwrap());
    assert_eq!((lower.raised, lower.counter), (false, 43), "never lowered");
    let lower = fence::force_advance(&mut conn, &resource, 7).await.unwrap();
    assert_eq!((lower.raised, lower.counter), (false, 43), "never lowered");
    // Forced to a live grant's own fence, its writes turn stale.
    let up = fence::force_advance(&mut conn, &resource, 43)
        .await
        .unwrap();
    assert_eq!((up.raised, up.counter), (true, 44));
    assert_eq!(
        g.fence().write(&mut conn, "v").await.unwrap(),
        Write::Stale { current_fence: 44 }
    );
    assert_eq!(g.release(&mut conn).await.unwrap(), LockRelease::Released);
    // Exact above 2^53.
    let big = (1u64 << 53) + 1;
    let raised = advanced(fence::advance(&mut conn, &resource, big).await.unwrap());
    assert_eq!((raised.raised, raised.counter), (true, big + 1));
    let next = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(next.fence().number(), big + 2);
    // A counter nolock did not write is refused, and left alone.
    let other = format!("{resource}:other");
    let _: () = raw(&mut conn, &["SET", &fence_key(&other), "007"]).await;
    let err = fence::advance(&mut conn, &other, 9).await.unwrap_err();
    assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");
    let err = fence::force_advance(&mut conn, &other, 9)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");
    let kept: String = raw(&mut conn, &["GET", &fence_key(&other)]).await;
    assert_eq!(kept, "007");
}

fn advanced(attempt: AdvanceAttempt) -> fence::Advance {
    match attempt {
        AdvanceAttempt::Advanced(advance) => advance,
        held => panic!("expected the counter raised, got {held:?}"),
    }
}

/// The fleet hazard: a replica that starts while another holds the lock
/// runs `advance` with the highest fence the database has seen, which is
/// the live holder's own. The counter stays; the holder's fenced writes go
/// on applying; once the lock is gone, the same call raises it.
#[tokio::test]
async fn advance_under_a_live_holder_leaves_its_writes_applying() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}job", prefix("fleet"));
    let holder = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert!(holder
        .fence()
        .write(&mut conn, "1")
        .await
        .unwrap()
        .is_applied());
    let seen = holder.fence().number(); // what the database has seen

    let held = fence::advance(&mut conn, &resource, seen).await.unwrap();
    let AdvanceAttempt::Held {
        counter,
        expires_in: Some(expires_in),
    } = held
    else {
        panic!("expected Held, got {held:?}");
    };
    assert_eq!(counter, seen);
    assert!(expires_in > MINUTE - Duration::from_secs(5) && expires_in <= MINUTE);
    assert!(!held.is_advanced() && held.advanced().is_none());
    let stored: String = raw(&mut conn, &["GET", &fence_key(&resource)]).await;
    assert_eq!(stored, seen.to_string(), "nothing written");
    assert_eq!(
        holder.fence().write(&mut conn, "2").await.unwrap(),
        Write::Applied,
        "the live holder still writes"
    );
    assert_eq!(
        fence::read(&mut conn, &resource)
            .await
            .unwrap()
            .unwrap()
            .value,
        b"2"
    );

    // A holder whose lock expired while it was paused is no live holder:
    // the advance raises, and its writes are refused.
    let short = Lock::new(Duration::from_millis(50)).unwrap();
    let _ = holder.release(&mut conn).await.unwrap();
    let paused = grant(short.acquire(&mut conn, &resource).await.unwrap());
    wait_gone(&mut conn, &lock_key(&resource)).await;
    let raised = advanced(
        fence::advance(&mut conn, &resource, paused.fence().number())
            .await
            .unwrap(),
    );
    assert_eq!(raised.counter, paused.fence().number() + 1);
    assert_eq!(
        paused.fence().write(&mut conn, "late").await.unwrap(),
        Write::Stale {
            current_fence: raised.counter
        }
    );
    let next = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert!(next.fence().number() > paused.fence().number() + 1);
}

/// `force_advance` raises whether or not a lock is held: the live holder's
/// lock stays, its writes are refused.
#[tokio::test]
async fn force_advance_raises_under_a_live_holder() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}job", prefix("force"));
    let holder = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    let forced = fence::force_advance(&mut conn, &resource, 10)
        .await
        .unwrap();
    assert_eq!((forced.raised, forced.counter), (true, 11));
    assert_eq!(
        holder.fence().write(&mut conn, "v").await.unwrap(),
        Write::Stale { current_fence: 11 }
    );
    let kept: String = raw(&mut conn, &["GET", &lock_key(&resource)]).await;
    assert_eq!(kept, held_by(&holder), "the lock itself is left alone");
    // A missing counter with a held lock: Held at 0, then forced from 0.
    let bare = format!("{resource}:bare");
    let _: () = raw(&mut conn, &["SET", &lock_key(&bare), "x", "PX", "60000"]).await;
    let held = fence::advance(&mut conn, &bare, 3).await.unwrap();
    assert!(
        matches!(
            held,
            AdvanceAttempt::Held {
                counter: 0,
                expires_in: Some(_)
            }
        ),
        "{held:?}"
    );
    assert_eq!(held.counter(), 0);
    let forced = fence::force_advance(&mut conn, &bare, 3).await.unwrap();
    assert_eq!((forced.raised, forced.counter), (true, 4));
}

/// Foreign data at the lock key (any type, with or without a TTL) counts as
/// a held lock and is left alone; foreign data at the counter is an error
/// for both forms, checked before the lock is read.
#[tokio::test]
async fn advance_treats_anything_at_the_lock_key_as_held() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("advance_foreign");
    let cases: [(&str, &[&str]); 3] = [
        ("a string without a TTL", &["SET", "{}", "not-a-lock"]),
        ("a hash", &["HSET", "{}", "f", "v"]),
        ("a list with a TTL", &["RPUSH", "{}", "x"]),
    ];
    for (n, (what, set)) in cases.iter().enumerate() {
        let resource = format!("{p}r{n}");
        let lock_k = lock_key(&resource);
        let args: Vec<&str> = set
            .iter()
            .map(|a| if *a == "{}" { lock_k.as_str() } else { a })
            .collect();
        let _: redis::Value = raw(&mut conn, &args).await;
        if n == 2 {
            let _: () = raw(&mut conn, &["PEXPIRE", &lock_k, "60000"]).await;
        }
        let held = fence::advance(&mut conn, &resource, 5).await.unwrap();
        match (n, held) {
            (
                2,
                AdvanceAttempt::Held {
                    counter: 0,
                    expires_in: Some(_),
                },
            ) => {}
            (
                0 | 1,
                AdvanceAttempt::Held {
                    counter: 0,
                    expires_in: None,
                },
            ) => {}
            (_, other) => panic!("{what}: {other:?}"),
        }
        let counter: Option<String> = raw(&mut conn, &["GET", &fence_key(&resource)]).await;
        assert_eq!(counter, None, "{what}: nothing written");
        let forced = fence::force_advance(&mut conn, &resource, 5).await.unwrap();
        assert_eq!(forced.counter, 6, "{what}");
        let kind: String = raw(&mut conn, &["TYPE", &lock_k]).await;
        assert_ne!(kind, "none", "{what}: the lock key is left alone");
    }
    // A counter of another type is an error, held lock or not.
    let resource = format!("{p}wrongtype");
    let _: () = raw(&mut conn, &["HSET", &fence_key(&resource), "f", "v"]).await;
    for result in [
        fence::advance(&mut conn, &resource, 5).await.map(|_| ()),
        fence::force_advance(&mut conn, &resource, 5)
            .await
            .map(|_| ()),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");
    }
}

/// After `SCRIPT FLUSH`, both forms load the script again and answer as
/// before.
#[tokio::test]
async fn advance_survives_a_script_flush() {
    // A server of its own: SCRIPT FLUSH is not among the commands of the
    // restricted user the shared server runs as under NOLOCK_ACL.
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let resource = format!("{}job", prefix("advance_flush"));
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let first = advanced(fence::advance(&mut conn, &resource, 3).await.unwrap());
    assert_eq!(first.counter, 4);
    let holder = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let held = fence::advance(&mut conn, &resource, 5).await.unwrap();
    assert!(
        matches!(held, AdvanceAttempt::Held { counter: 5, .. }),
        "{held:?}"
    );
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let forced = fence::force_advance(&mut conn, &resource, 5).await.unwrap();
    assert_eq!(forced.counter, 6);
    let _ = holder.release(&mut conn).await.unwrap();
}

/// A failover handed the same fence to two holders (the new primary had
/// not seen the first grant). Advancing to that fence refuses both: the
/// counter ends above it, and a write equal to the counter is the only one
/// accepted.
#[tokio::test]
async fn advance_over_a_duplicated_fence_refuses_both_holders() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}job", prefix("duplicate"));
    let a = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    // The failover: the counter and the lock are back where they were.
    let _: () = raw(
        &mut conn,
        &["DEL", &lock_key(&resource), &fence_key(&resource)],
    )
    .await;
    let b = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(a.fence().number(), b.fence().number(), "the duplicate");
    // The database has seen this fence: advance past it.
    // Both holders are live (A's lock is gone from this primary): the
    // operator's recovery step is the unconditional one.
    let advanced = fence::force_advance(&mut conn, &resource, b.fence().number())
        .await
        .unwrap();
    assert!(advanced.counter > b.fence().number());
    for holder in [&a, &b] {
        assert_eq!(
            holder.fence().write(&mut conn, "v").await.unwrap(),
            Write::Stale {
                current_fence: advanced.counter
            }
        );
    }
    assert_eq!(fence::read(&mut conn, &resource).await.unwrap(), None);
}

/// A holder that takes its lock again with its token after an advance is
/// answered its own grant's fence (which the advance made stale), never the
/// floor: the floor is a fence the resource has already seen.
#[tokio::test]
async fn re_entry_after_advance_keeps_the_grants_own_stale_fence() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}r", prefix("reentry"));
    let token = Token::random().unwrap();
    let first = grant(
        lock(MINUTE)
            .acquire_as(&mut conn, &resource, &token)
            .await
            .unwrap(),
    );
    assert_eq!(first.fence().number(), 1);
    let _ = fence::force_advance(&mut conn, &resource, 9).await.unwrap();
    assert_eq!(
        first.fence().write(&mut conn, "v").await.unwrap(),
        Write::Stale { current_fence: 10 }
    );
    let again = grant(
        lock(MINUTE)
            .acquire_as(&mut conn, &resource, &token)
            .await
            .unwrap(),
    );
    assert_eq!(again.fence().number(), 1, "its own fence, not the floor");
    assert_eq!(
        again.fence().write(&mut conn, "v").await.unwrap(),
        Write::Stale { current_fence: 10 }
    );
    // Released, the next grant is above the floor and writes.
    assert_eq!(
        again.release(&mut conn).await.unwrap(),
        LockRelease::Released
    );
    let next = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(next.fence().number(), 11);
    assert!(next
        .fence()
        .write(&mut conn, "v")
        .await
        .unwrap()
        .is_applied());
}

/// The calls on a grant or fence of resource A touch only A: B's lock,
/// value and counter are left alone.
/// Issue 33, item 9, as reported: another grant's extension (30 s) applied
/// to a grant whose 200 ms had run out moved its deadline to 29.7 s, and
/// its own extension then answered `Lost`. Now it is refused, and the
/// deadline stays as it was.
#[tokio::test]
async fn applying_another_grants_extension_is_refused_and_leaves_the_deadline() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("foreign_answer");
    let (ra, rb) = (format!("{p}a"), format!("{p}b"));
    let mut a = grant(
        lock(Duration::from_millis(200))
            .acquire(&mut conn, &ra)
            .await
            .unwrap(),
    );
    let b = grant(lock(MINUTE / 2).acquire(&mut conn, &rb).await.unwrap());
    wait_gone(&mut conn, &lock_key(&ra)).await; // a's TTL has run out
    let deadline = a.deadline();
    assert!(deadline <= Instant::now());
    let mut answers = nolock::Batch::from_iter([fence::ExtendLock::new(&b)])
        .run(&mut conn)
        .await;
    let of_b = answers.remove(0).unwrap();
    assert!(of_b.is_extended());
    let err = a.apply(&of_b).unwrap_err();
    assert!(
        matches!(err, Error::ForeignAnswer { receipt: "grant" }),
        "{err}"
    );
    assert!(err.is_invalid_input() && err.is_definite());
    assert_eq!(a.deadline(), deadline, "the deadline is as it was");
    assert_eq!(a.extend(&mut conn).await.unwrap(), LockExtend::Lost);

    // The same resource under another token (the next holder's grant) is
    // another grant too.
    let mut c = grant(lock(MINUTE).acquire(&mut conn, &ra).await.unwrap());
    let of_c = nolock::Batch::from_iter([fence::ExtendLock::new(&c)])
        .run(&mut conn)
        .await
        .remove(0)
        .unwrap();
    let deadline = a.deadline();
    assert!(a.apply(&of_c).is_err());
    assert_eq!(a.deadline(), deadline);
    c.apply(&of_c).unwrap();
    assert_eq!(
        Some(c.deadline()),
        match of_c.outcome() {
            LockExtend::Extended { deadline } => Some(deadline),
            LockExtend::Lost => None,
        }
    );
    assert_eq!(c.release(&mut conn).await.unwrap(), LockRelease::Released);
    assert_eq!(b.release(&mut conn).await.unwrap(), LockRelease::Released);
}

#[tokio::test]
async fn a_grant_of_one_resource_never_touches_another() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("two_resources");
    let (ra, rb) = (format!("{p}a"), format!("{p}b"));
    let mut a = grant(lock(MINUTE).acquire(&mut conn, &ra).await.unwrap());
    let b = grant(lock(MINUTE).acquire(&mut conn, &rb).await.unwrap());
    assert_eq!(a.fence().resource(), ra);
    assert!(a.fence().write(&mut conn, "a").await.unwrap().is_applied());
    assert!(matches!(
        a.extend(&mut conn).await.unwrap(),
        LockExtend::Extended { .. }
    ));
    assert_eq!(a.release(&mut conn).await.unwrap(), LockRelease::Released);
    let held: String = raw(&mut conn, &["GET", &lock_key(&rb)]).await;
    assert_eq!(held, held_by(&b));
    assert_eq!(fence::read(&mut conn, &rb).await.unwrap(), None);
    let counter: String = raw(&mut conn, &["GET", &fence_key(&rb)]).await;
    assert_eq!(counter, "1");
    // A fence carried in a message writes to the resource it names.
    let carried = Fence::from_message(&rb, b.fence().number()).unwrap();
    assert!(carried.write(&mut conn, "b").await.unwrap().is_applied());
    assert_eq!(
        fence::read(&mut conn, &ra).await.unwrap().unwrap().value,
        b"a"
    );
}

#[tokio::test]
async fn a_restart_without_persistence_is_made_safe_by_advance() {
    let mut server = RedisServer::start();
    let resource = format!("{}payout", prefix("restart"));
    let mut conn = server.conn().await;
    // The protected database (here: the highest fence it has seen).
    let mut highest_seen = 0;
    let mut a = None;
    for _ in 0..3 {
        let g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
        assert!(g.fence().write(&mut conn, "v").await.unwrap().is_applied());
        highest_seen = g.fence().number();
        a = Some(g.fence().clone());
        assert_eq!(g.release(&mut conn).await.unwrap(), LockRelease::Released);
    }
    let a = a.unwrap(); // a holder paused across the restart, fence 3

    let report = fence::durability(&mut conn).await.unwrap();
    assert_eq!(report.restart, fence::Restart::LosesAll);
    assert!(report.fences_can_go_back(), "{report:?}");

    server.restart(); // --save "" --appendonly no: everything is gone
    let mut conn = server.conn().await;
    let advanced = advanced(
        fence::advance(&mut conn, &resource, highest_seen)
            .await
            .unwrap(),
    );
    assert!(advanced.raised);
    let b = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert!(
        b.fence().number() > highest_seen,
        "{} <= {highest_seen}",
        b.fence().number()
    );
    // The database's own check (fence < $2) accepts B ...
    assert!(b.fence().number() > highest_seen);
    // ... and Redis refuses the paused holder.
    assert_eq!(
        a.write(&mut conn, "A").await.unwrap(),
        Write::Stale {
            current_fence: b.fence().number()
        }
    );
    assert!(b.fence().write(&mut conn, "B").await.unwrap().is_applied());
}

#[tokio::test]
async fn durability_reads_the_settings_and_falls_back_to_info() {
    let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut conn = server.conn().await;
    let report = fence::durability(&mut conn).await.unwrap();
    assert_eq!(report.source, fence::ConfigSource::Config);
    assert_eq!(report.restart, fence::Restart::Keeps);
    assert_eq!(report.appendfsync.as_deref(), Some("always"));
    assert_eq!(
        (report.role.as_str(), report.connected_replicas),
        ("master", 0)
    );
    assert!(!report.fences_can_go_back(), "{:?}", report.reasons());

    // `always`, except while rewriting: redis.conf says up to 30 s can go.
    let _: () = raw(
        &mut conn,
        &["CONFIG", "SET", "no-appendfsync-on-rewrite", "yes"],
    )
    .await;
    let report = fence::durability(&mut conn).await.unwrap();
    assert_eq!(report.restart, fence::Restart::LosesDuringRewrite);
    assert_eq!(report.no_appendfsync_on_rewrite, Some(true));
    assert!(report.fences_can_go_back());
    assert!(
        report.reasons()[0].contains("no-appendfsync-on-rewrite"),
        "{:?}",
        report.reasons()
    );
    let _: () = raw(
        &mut conn,
        &["CONFIG", "SET", "no-appendfsync-on-rewrite", "no"],
    )
    .await;

    let _: () = raw(&mut conn, &["CONFIG", "SET", "appendfsync", "everysec"]).await;
    let report = fence::durability(&mut conn).await.unwrap();
    assert_eq!(report.restart, fence::Restart::LosesLastSecond);
    assert!(report.fences_can_go_back());

    // A user without CONFIG: the report says what INFO can tell.
    let _: () = raw(
        &mut conn,
        &[
            "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-config",
        ],
    )
    .await;
    let url = server.url().replace("redis://", "redis://app:pw@");
    let mut limited = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let report = fence::durability(&mut limited).await.unwrap();
    assert_eq!(report.source, fence::ConfigSource::Info);
    assert_eq!(report.restart, fence::Restart::Unknown);
    assert!(report.appendonly && report.fences_can_go_back());
}

#[tokio::test]
async fn keys_of_another_shape_are_definite_errors_and_left_alone() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("wrongtype");
    let text = format!("{p}text");
    let bare_hash = format!("{p}hash");
    let resource = format!("{p}r");
    let _: () = raw(&mut conn, &["SET", &text, "hello"]).await;
    let _: () = raw(&mut conn, &["HSET", &bare_hash, "value", "x"]).await;
    let _: () = raw(&mut conn, &["SET", &fence_key(&resource), "-3"]).await;

    for key in [&text, &bare_hash] {
        let err = fence_of("unbound", 5)
            .write_unbound(&mut conn, key, "v")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");
        assert!(matches!(
            fence::read_unbound(&mut conn, key).await,
            Err(Error::Redis(_))
        ));
    }
    // A counter nolock did not write: the fenced write refuses it too.
    let err = fence_of(&resource, 5)
        .write(&mut conn, "v")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("non-counter"), "{err}");
    let err = lock(MINUTE)
        .acquire(&mut conn, &resource)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Redis(_)), "{err}");
    assert!(err.to_string().contains("non-counter"), "{err}");

    let text_now: String = raw(&mut conn, &["GET", &text]).await;
    assert_eq!(text_now, "hello");
    let hash_now: Vec<String> = raw(&mut conn, &["HKEYS", &bare_hash]).await;
    assert_eq!(hash_now, ["value"]);
    assert_eq!(
        keys(&mut conn, &lock_key(&resource)).await,
        Vec::<String>::new(),
        "no lock taken"
    );
    let counter: String = raw(&mut conn, &["GET", &fence_key(&resource)]).await;
    assert_eq!(counter, "-3");
}

#[tokio::test]
async fn script_flush_before_acquire_and_release_still_works() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let resource = format!("{}r", prefix("flush"));

    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let mut g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(
        g.fence().number(),
        1,
        "ran exactly once, after a SCRIPT LOAD"
    );
    assert_eq!(command_calls(&mut conn, "script|load").await, 1);

    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    assert!(matches!(
        g.extend(&mut conn).await.unwrap(),
        LockExtend::Extended { .. }
    ));

    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(g.release(&mut conn).await.unwrap(), LockRelease::Released);
    assert_eq!(command_calls(&mut conn, "script|load").await, 3);
    assert_eq!(command_calls(&mut conn, "eval").await, 0);
    assert_eq!(keys(&mut conn, "*").await, vec![fence_key(&resource)]);
}

#[tokio::test]
async fn release_and_extend_still_work_on_a_full_server() {
    let server =
        RedisServer::start_with(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    let mut conn = server.conn().await;
    let p = prefix("oom");
    let resource = format!("{p}r");
    let mut g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());

    // Fill the server until it refuses even a small write. Big values first;
    // a refused big SET frees its own buffer again, so finish with small ones.
    let mut full = false;
    let mut i = 0;
    for size in [16 * 1024, 1024, 64] {
        let blob = "x".repeat(size);
        for _ in 0..2_000 {
            i += 1;
            let set: redis::RedisResult<()> = redis::cmd("SET")
                .arg(format!("{p}fill:{i}"))
                .arg(&blob)
                .query_async(&mut conn)
                .await;
            if let Err(e) = set {
                assert!(e.to_string().contains("OOM"), "{e}");
                full = size == 64;
                break;
            }
        }
    }
    assert!(full, "the server never filled up");

    // A new grant needs memory: refused, definitely, with nothing written.
    let other = format!("{p}other");
    let err = lock(MINUTE).acquire(&mut conn, &other).await.unwrap_err();
    assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");
    assert!(err.to_string().contains("OOM"), "{err}");
    assert_eq!(
        keys(&mut conn, &format!("*{p}other*")).await,
        Vec::<String>::new()
    );

    // The holder can still keep and give back its lock (allow-oom), also
    // through the NOSCRIPT fallback.
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    assert!(matches!(
        g.extend(&mut conn).await.unwrap(),
        LockExtend::Extended { .. }
    ));
    assert_eq!(g.release(&mut conn).await.unwrap(), LockRelease::Released);
    assert_eq!(
        keys(&mut conn, &lock_key(&resource)).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn bad_input_is_rejected_before_anything_is_sent() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let evalsha_before = command_calls(&mut conn, "evalsha").await;
    let token = Token::random().unwrap();
    let ok = Duration::from_secs(1);
    let too_long = nolock::MAX_TTL + Duration::from_millis(1);
    let no_wait = Backoff::none();
    let zero_initial = Backoff {
        initial_delay: Duration::ZERO,
        ..Backoff::new(ok)
    };

    // The configuration is refused when the lock is built ...
    for (ttl, what) in [
        (Duration::ZERO, "zero ttl"),
        (Duration::from_micros(999), "sub-ms ttl"),
    ] {
        let err = Lock::new(ttl).unwrap_err();
        assert!(
            matches!(err, Error::ZeroDuration { what: "ttl" }),
            "{what}: {err:?}"
        );
    }
    for ttl in [too_long, Duration::MAX] {
        let err = Lock::new(ttl).unwrap_err();
        assert!(
            matches!(err, Error::DurationTooLong { what: "ttl", .. }),
            "{err:?}"
        );
    }
    // ... and the rest before anything is sent.
    let cases: Vec<(Error, &str)> = vec![
        (
            lock(ok).acquire(&mut conn, "").await.unwrap_err(),
            "empty resource",
        ),
        (
            lock(ok)
                .acquire_as(&mut conn, "", &token)
                .await
                .unwrap_err(),
            "acquire_as empty",
        ),
        (
            lock(ok)
                .with_wait(no_wait)
                .acquire(&mut conn, "")
                .await
                .unwrap_err(),
            "waiting, empty",
        ),
        (
            lock(ok)
                .with_wait(zero_initial)
                .acquire(&mut conn, "r")
                .await
                .unwrap_err(),
            "zero backoff",
        ),
        (
            fence::Fence::from_message("", 1).unwrap_err(),
            "fence of no resource",
        ),
        (fence::Fence::from_message("k", 0).unwrap_err(), "fence 0"),
        (
            fence_of("k", 1)
                .write_unbound(&mut conn, "", "v")
                .await
                .unwrap_err(),
            "unbound write to no key",
        ),
        (
            fence_of("k", 1)
                .write(&mut conn, vec![0u8; nolock::MAX_VALUE_LEN + 1])
                .await
                .unwrap_err(),
            "value too large",
        ),
        (fence::read(&mut conn, "").await.unwrap_err(), "read empty"),
        (
            fence::advance(&mut conn, "r", 0).await.unwrap_err(),
            "advance 0",
        ),
        (
            lock(ok).lease(conn.clone(), "").await.unwrap_err(),
            "lease empty",
        ),
        (
            lock(ok)
                .with_lease(conn.clone(), "", |_| async {})
                .await
                .unwrap_err(),
            "with_lease empty",
        ),
    ];
    for (err, what) in &cases {
        assert!(err.is_invalid_input(), "{what}: {err}");
        assert!(err.is_definite(), "{what}");
    }
    let kinds: Vec<String> = cases.iter().map(|(e, _)| format!("{e:?}")).collect();
    assert!(matches!(cases[0].0, Error::EmptyKey), "{}", kinds[0]);
    assert!(
        matches!(
            cases[3].0,
            Error::ZeroDuration {
                what: "initial_delay"
            }
        ),
        "{}",
        kinds[3]
    );
    assert!(
        matches!(cases[5].0, Error::ZeroLimit { what: "fence" }),
        "{}",
        kinds[5]
    );

    let dbsize: i64 = raw(&mut conn, &["DBSIZE"]).await;
    assert_eq!(dbsize, 0, "nothing written");
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        evalsha_before,
        "nothing sent"
    );
    assert_eq!(command_calls(&mut conn, "eval").await, 0);
    assert_eq!(command_calls(&mut conn, "evalsha_ro").await, 0);
}

#[tokio::test]
async fn a_waiter_gets_the_lock_soon_after_it_is_released() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let mut waiter_conn = redis.conn().await;
    let resource = format!("{}r", prefix("waiter"));

    let held = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    let resource2 = resource.clone();
    let waiter = tokio::spawn(async move {
        let backoff = Backoff {
            max_delay: Duration::from_millis(50),
            ..Backoff::new(Duration::from_secs(10))
        };
        let outcome = lock(MINUTE)
            .with_wait(backoff)
            .acquire(&mut waiter_conn, &resource2)
            .await
            .unwrap();
        (outcome, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "waits while held");
    let held_fence = held.fence().number();
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        LockRelease::Released
    );
    let released = Instant::now();
    let (outcome, got) = waiter.await.unwrap();
    assert_eq!(grant(outcome).fence().number(), held_fence + 1);
    // Within about one max_delay of the release.
    assert!(got.duration_since(released) < Duration::from_secs(2));
}

#[tokio::test]
async fn waiters_are_woken_by_the_release_not_by_a_timer() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let resource = format!("{}r", prefix("woken"));
    let waiters = fence::Waiters::new(&redis.client()).await.unwrap();

    let held = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    // Without a wake-up each waiter would sleep 20 s (the capped expiry).
    let slow = Backoff {
        initial_delay: Duration::from_secs(20),
        max_delay: Duration::from_secs(20),
        ..Backoff::new(Duration::from_secs(30))
    };
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (waiters, resource) = (waiters.clone(), resource.clone());
        let mut c = redis.conn().await;
        tasks.push(tokio::spawn(async move {
            let g = grant(
                waiters
                    .acquire(&mut c, &lock(MINUTE).with_wait(slow), &resource)
                    .await
                    .unwrap(),
            );
            // Hand over at once: the release wakes the next waiter.
            let number = g.fence().number();
            assert_eq!(g.release(&mut c).await.unwrap(), LockRelease::Released);
            number
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(tasks.iter().all(|t| !t.is_finished()), "wait while held");
    let released = Instant::now();
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        LockRelease::Released
    );
    let mut fences = Vec::new();
    for t in tasks {
        fences.push(t.await.unwrap());
    }
    fences.sort_unstable();
    assert_eq!(fences, [2, 3, 4, 5], "each waiter got one grant in turn");
    // Four handoffs, each ended by a release message, not by the 20 s sleep.
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "{:?}",
        released.elapsed()
    );
}

#[test]
fn a_runtime_without_timers_gets_an_error_before_anything_is_sent() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    rt.block_on(async {
        // redis-rs's own timeouts need timers too: turn them off.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None);
        let mut conn = server
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let before = command_calls(&mut conn, "evalsha").await;
        let wait = Backoff::new(Duration::from_secs(1));
        let err = lock(MINUTE)
            .with_wait(wait)
            .acquire(&mut conn, "r")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NoTimer) && err.is_definite(), "{err}");
        let err = lock(MINUTE).lease(conn.clone(), "r").await.unwrap_err();
        assert!(matches!(err, Error::NoTimer), "{err}");
        assert_eq!(command_calls(&mut conn, "evalsha").await, before);
        // One attempt needs no timer.
        let once = lock(MINUTE).acquire(&mut conn, "r").await;
        assert!(once.unwrap().is_acquired());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiters_back_off_instead_of_stampeding() {
    const WAITERS: u64 = 100;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let resource = format!("{}r", prefix("herd"));
    let _held = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
    let evalsha_before = command_calls(&mut conn, "evalsha").await;

    let timeout = Duration::from_millis(400);
    let backoff = Backoff {
        initial_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(100),
        ..Backoff::new(timeout)
    };
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let mut conn = conn.clone();
        let resource = resource.clone();
        tasks.push(tokio::spawn(async move {
            lock(MINUTE)
                .with_wait(backoff)
                .acquire(&mut conn, &resource)
                .await
                .unwrap()
        }));
    }
    for task in tasks {
        assert!(matches!(
            task.await.unwrap(),
            LockAttempt::Held {
                expires_in: Some(_)
            }
        ));
    }
    assert!(
        started.elapsed() >= timeout,
        "each waiter waited out its timeout"
    );
    let attempts = command_calls(&mut conn, "evalsha").await - evalsha_before - 1;
    // Doubling from 10 ms to 100 ms over 400 ms: about 4 + 2 x 300 / 100 = 10
    // attempts per waiter on average, against thousands for a tight loop.
    eprintln!("{attempts} attempts by {WAITERS} waiters");
    assert!(attempts >= 2 * WAITERS, "{attempts}");
    assert!(
        attempts <= 25 * WAITERS,
        "{attempts} attempts for {WAITERS} waiters"
    );
}

#[tokio::test]
async fn a_lease_renews_through_a_connection_manager() {
    let redis = support::redis();
    let mut check = redis.conn().await;
    let resource = format!("{}r", prefix("manager"));
    let manager = redis::aio::ConnectionManager::new(redis.client())
        .await
        .unwrap();
    let ttl = Duration::from_millis(150);

    let lease = lock(ttl)
        .lease(manager, &resource)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    let holder: Option<String> = raw(&mut check, &["GET", &lock_key(&resource)]).await;
    assert_eq!(
        holder.as_deref(),
        Some(format!(
            "{}:{}",
            lease.fence().number(),
            lease.token().as_str()
        ))
        .as_deref()
    );
    assert_eq!(lease.release().await.unwrap(), LockRelease::Released);
}

mod model {
    //! Model-based property test: random interleavings of acquire, extend,
    //! release, expiry and fenced writes by three clients, checked step by
    //! step against a model of what must happen.

    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Acquire(usize),
        Extend(usize),
        Release(usize),
        /// The holder is paused past its TTL: the lock expires under it.
        Expire,
        /// A client writes with its latest grant's fence, current or not.
        Write(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..3usize).prop_map(Op::Acquire),
            1 => (0..3usize).prop_map(Op::Extend),
            2 => (0..3usize).prop_map(Op::Release),
            1 => Just(Op::Expire),
            3 => (0..3usize).prop_map(Op::Write),
        ]
    }

    /// The lock is held by at most one grant; fences go 1, 2, 3, ... one per
    /// grant; release and extend succeed exactly for the current holder; a
    /// write applies exactly when its fence is the counter (the newest
    /// grant's), so the stored fence never goes down.
    #[test]
    fn fences_never_go_down_and_only_the_holder_holds() {
        let server = RedisServer::start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let config = Config {
            cases: 48,
            source_file: Some(file!()),
            failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
                "proptest-regressions",
            ))),
            ..Config::default()
        };
        TestRunner::new(config)
            .run(&prop::collection::vec(op(), 1..40), |ops| {
                rt.block_on(async {
                    let mut conn = server.conn().await;
                    let p = prefix("model");
                    let resource = format!("{p}r");
                    let mut holder: Option<usize> = None;
                    let mut grants: [Option<fence::Grant>; 3] = [None, None, None];
                    let mut fences: [Option<Fence>; 3] = [None, None, None];
                    let mut counter = 0u64;
                    let mut stored = 0u64;
                    for op in ops {
                        match op {
                            Op::Acquire(c) => {
                                let out = lock(MINUTE).acquire(&mut conn, &resource).await.unwrap();
                                prop_assert_eq!(out.is_acquired(), holder.is_none(), "{:?}", op);
                                if let LockAttempt::Acquired(g) = out {
                                    counter += 1;
                                    prop_assert_eq!(g.fence().number(), counter);
                                    holder = Some(c);
                                    fences[c] = Some(g.fence().clone());
                                    grants[c] = Some(g);
                                }
                            }
                            Op::Extend(c) | Op::Release(c) => {
                                // A client's latest grant is the live one iff it holds.
                                let ours = holder == Some(c);
                                if let Op::Extend(_) = op {
                                    let Some(g) = grants[c].as_mut() else {
                                        continue;
                                    };
                                    let out = g.extend(&mut conn).await.unwrap();
                                    prop_assert_eq!(
                                        matches!(out, LockExtend::Extended { .. }),
                                        ours
                                    );
                                } else {
                                    // A release consumes the grant; its fence stays.
                                    let Some(g) = grants[c].take() else { continue };
                                    let out = g.release(&mut conn).await.unwrap();
                                    prop_assert_eq!(out == LockRelease::Released, ours);
                                    if ours {
                                        holder = None;
                                    }
                                }
                            }
                            Op::Expire => {
                                let _: () = raw(&mut conn, &["DEL", &lock_key(&resource)]).await;
                                holder = None;
                            }
                            Op::Write(c) => {
                                let Some(f) = fences[c].clone() else { continue };
                                let out = f.write(&mut conn, "v").await.unwrap();
                                // Only the newest grant writes, written yet or not.
                                if f.number() == counter {
                                    prop_assert_eq!(out, Write::Applied);
                                    stored = f.number();
                                } else {
                                    prop_assert_eq!(
                                        out,
                                        Write::Stale {
                                            current_fence: counter
                                        }
                                    );
                                }
                            }
                        }
                    }
                    let on_server = fence::read(&mut conn, &resource).await.unwrap();
                    prop_assert_eq!(on_server.map_or(0, |f| f.fence), stored);
                    Ok(())
                })
            })
            .unwrap();
    }
}

/// A connection whose first reply is lost after the server ran the command,
/// as when a connection drops between the request and its answer.
struct LosesFirstReply {
    inner: MultiplexedConnection,
    lost: bool,
}

impl redis::aio::ConnectionLike for LosesFirstReply {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let reply = self.inner.req_packed_command(cmd).await;
            if self.lost {
                return reply;
            }
            self.lost = true;
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into())
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.inner.req_packed_commands(pipe, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[tokio::test]
async fn a_lost_acquire_reply_is_retried_with_the_same_token_and_fence() {
    let redis = support::redis();
    let resource = format!("{}r", prefix("lost_reply"));
    let backoff = Backoff::new(Duration::from_secs(2));
    let mut plain = redis.conn().await;
    // Cached, so that the first request (the one whose reply is lost) runs
    // the script rather than getting NOSCRIPT.
    nolock::Scripts::load(&mut plain).await.unwrap();

    // A plain acquire whose reply is lost is indeterminate: it did run.
    let mut conn = LosesFirstReply {
        inner: redis.conn().await,
        lost: false,
    };
    let err = lock(MINUTE)
        .acquire(&mut conn, &resource)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Indeterminate(_)), "{err}");
    let fence_now: String = raw(
        &mut plain,
        &["GET", &nolock::keys::derive(&resource, "fence")],
    )
    .await;
    assert_eq!(fence_now, "1", "the lost acquire took the lock and fence 1");

    // With retry, the lost attempt is repeated with its token: the caller
    // gets that very grant, and no second fence is used up.
    let resource = format!("{resource}2");
    let mut conn = LosesFirstReply {
        inner: redis.conn().await,
        lost: false,
    };
    let grant = lock(MINUTE)
        .with_wait(backoff)
        .acquire(&mut conn, &resource)
        .await
        .unwrap()
        .acquired()
        .expect("the lock is ours");
    assert_eq!(grant.fence().number(), 1);
    let fence_now: String = raw(
        &mut plain,
        &["GET", &nolock::keys::derive(&resource, "fence")],
    )
    .await;
    assert_eq!(fence_now, "1", "one fence for one grant");
    assert_eq!(
        grant.release(&mut plain).await.unwrap(),
        LockRelease::Released
    );
}

/// DUMP and absolute expiry of a key: equal snapshots mean nothing was written.
async fn snapshot(conn: &mut MultiplexedConnection, key: &str) -> (Option<Vec<u8>>, i64) {
    let dump: Option<Vec<u8>> = raw(conn, &["DUMP", key]).await;
    let expiry: i64 = raw(conn, &["PEXPIRETIME", key]).await;
    (dump, expiry)
}

#[tokio::test]
async fn foreign_counters_and_values_are_definite_errors_with_nothing_written() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("foreign");
    let foreign = [
        "abc",
        "",
        "5.0",
        " 7",
        "007",
        "1e3",
        "0x10",
        "inf",
        "-1",
        "0",
        "9223372036854775808",
        "99999999999999999999",
    ];
    let mut n = 0;
    let mut cases: Vec<(String, Vec<&str>)> = foreign
        .iter()
        .map(|v| (format!("string {v:?}"), vec!["SET", "{}", v]))
        .collect();
    cases.push(("a list".into(), vec!["RPUSH", "{}", "1"]));
    cases.push(("a hash".into(), vec!["HSET", "{}", "other", "1"]));
    for (what, set) in &cases {
        n += 1;
        let resource = format!("{p}r{n}");
        let counter = fence_key(&resource);
        let args: Vec<&str> = set
            .iter()
            .map(|a| if *a == "{}" { counter.as_str() } else { a })
            .collect();
        let _: redis::Value = raw(&mut conn, &args).await;
        let _: () = raw(&mut conn, &["PEXPIRE", &counter, "600000"]).await;
        let before = snapshot(&mut conn, &counter).await;
        let errors = [
            lock(MINUTE).acquire(&mut conn, &resource).await.map(|_| ()),
            fence_of(&resource, 1)
                .write(&mut conn, "v")
                .await
                .map(|_| ()),
            fence::advance(&mut conn, &resource, 5).await.map(|_| ()),
        ];
        for (call, result) in ["acquire", "write", "advance"].iter().zip(errors) {
            let err = result.expect_err(&format!("{call} on {what}"));
            assert!(
                matches!(err, Error::Redis(_)) && err.is_definite(),
                "{call} on {what}: {err}"
            );
        }
        assert_eq!(snapshot(&mut conn, &counter).await, before, "{what}");
        assert_eq!(
            keys(&mut conn, &format!("*{p}r{n}}}:*")).await,
            vec![counter.clone()],
            "{what}: no lock, no value written"
        );
    }

    // A value hash whose fence field nolock did not write (2^63 is a fence
    // `write_unbound` may store: it is a u64).
    let not_fences = foreign.iter().filter(|v| **v != "9223372036854775808");
    for (i, stored) in not_fences.enumerate() {
        let resource = format!("{p}v{i}");
        let g = grant(lock(MINUTE).acquire(&mut conn, &resource).await.unwrap());
        let value = nolock::keys::derive(&resource, "value");
        let _: () = raw(&mut conn, &["HSET", &value, "value", "x", "fence", stored]).await;
        let before = snapshot(&mut conn, &value).await;
        let err = g.fence().write(&mut conn, "v").await.unwrap_err();
        assert!(
            matches!(err, Error::Redis(_)),
            "write over {stored:?}: {err}"
        );
        let err = fence::read(&mut conn, &resource).await.unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "read of {stored:?}: {err}");
        assert_eq!(snapshot(&mut conn, &value).await, before, "{stored:?}");
    }
}

/// `Waiters` is subscribed to a resource's channel only while someone of
/// this process waits for it: after the waiters leave (granted, timed out
/// or dropped mid-wait) its table and the server's subscriptions are empty.
#[tokio::test]
async fn waiters_unsubscribe_when_the_last_waiter_leaves() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let waiters = fence::Waiters::new(&server.client()).await.unwrap();
    let p = prefix("unsubscribe");
    let channel = |r: &str| nolock::keys::derive(r, "released");
    let numsub = |mut c: MultiplexedConnection, ch: String| async move {
        let reply: (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&ch)
            .query_async(&mut c)
            .await
            .unwrap();
        reply.1
    };
    let waiting = lock(MINUTE).with_wait(Backoff::new(Duration::from_millis(300)));

    // Many resources, each waited on while held, then given up on.
    let mut tasks = Vec::new();
    let mut resources = Vec::new();
    for i in 0..20 {
        let r = format!("{p}r{i}");
        let held = grant(lock(MINUTE).acquire(&mut conn, &r).await.unwrap());
        for _ in 0..3 {
            let (waiters, waiting, r, mut c) =
                (waiters.clone(), waiting.clone(), r.clone(), conn.clone());
            tasks.push(tokio::spawn(async move {
                waiters.acquire(&mut c, &waiting, &r).await.unwrap()
            }));
        }
        resources.push((r, held));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(waiters.subscriptions(), 20);
    assert_eq!(numsub(conn.clone(), channel(&resources[0].0)).await, 1);
    for t in tasks {
        assert!(!t.await.unwrap().is_acquired(), "timed out while held");
    }
    // A waiter dropped mid-wait leaves too.
    let (r, _held) = &resources[0];
    let (w2, wait2, r2, mut c2) = (waiters.clone(), waiting.clone(), r.clone(), conn.clone());
    let dropped = tokio::spawn(async move { w2.acquire(&mut c2, &wait2, &r2).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    dropped.abort();
    let _ = dropped.await;
    // The unsubscribes run in the background: bounded wait.
    let start = Instant::now();
    loop {
        let mut subscribed = 0;
        for (r, _) in &resources {
            subscribed += numsub(conn.clone(), channel(r)).await;
        }
        if subscribed == 0 && waiters.subscriptions() == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{subscribed} server subscriptions, {} in the table",
            waiters.subscriptions()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And a new waiter subscribes again, and is woken by a release.
    let (r, held) = resources.pop().unwrap();
    let (w3, wait3, r3, mut c3) = (waiters.clone(), waiting.clone(), r.clone(), conn.clone());
    let next = tokio::spawn(async move { w3.acquire(&mut c3, &wait3, &r3).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(waiters.subscriptions(), 1);
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        LockRelease::Released
    );
    assert!(next.await.unwrap().is_acquired());
}
