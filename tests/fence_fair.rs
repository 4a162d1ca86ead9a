//! Fair (FIFO) waiting for a lock (`Lock::fair`, `lua/fence/acquire_fair.lua`)
//! on a single server and on the local 3x2 cluster: a history checker "no
//! waiter passed over" under 64 waiters of which some crash mid-wait, a dead
//! waiter leaving the line within its ticket's life, a ticket that died and
//! comes back queued at the back, the release waking the first in line by
//! name, bad input, foreign data in the line's keys, and a script flush.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use nolock::fence::{self, AcquireLock, FenceSource, Lock, LockAttempt, Token};
use nolock::keys::derive;
use nolock::{Backoff, Batch};
use support::deployment::{both, AnyConn, Deployment};
use support::history::{passed_over, Waited};
use support::prefix;

both!(
    shared: [
        no_waiter_is_passed_over_under_64_waiters_with_crashes,
        no_polling_waiter_is_passed_over_under_64_waiters_with_crashes,
        a_dead_head_leaves_the_line_within_its_ticket_life,
        a_ticket_that_died_is_queued_at_the_back_when_its_owner_returns,
        a_fair_grant_is_the_plain_lock_and_its_release_wakes_the_head_by_name,
        an_acquire_that_does_not_wait_never_passes_the_line,
        a_waiter_that_gives_up_leaves_the_line_at_once,
        slot_fences_are_granted_in_line_too,
        bad_input_is_refused_before_anything_is_written,
        foreign_data_in_the_line_is_refused_before_any_write,
    ],
    exclusive: [fair_acquire_survives_a_script_flush],
);

const MINUTE: Duration = Duration::from_secs(60);

/// A fair lock whose waiters sleep at most 100 ms between attempts.
fn fair(ttl: Duration, timeout: Duration) -> Lock {
    Lock::new(ttl)
        .unwrap()
        .with_wait(Backoff {
            max_delay: Duration::from_millis(100),
            ..Backoff::new(timeout)
        })
        .fair()
}

fn grant(outcome: LockAttempt) -> fence::Grant {
    match outcome {
        LockAttempt::Acquired(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}

async fn waiters(d: &Deployment) -> fence::Waiters {
    let port = match d {
        Deployment::Single(server) => server.port,
        Deployment::Cluster(cluster) => cluster.ports()[0],
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    fence::Waiters::new(&client).await.unwrap()
}

/// One attempt that joins the line under `token` (the first attempt of a
/// waiting acquire, as an operation value).
async fn join(conn: &mut AnyConn, lock: &Lock, resource: &str, token: &Token) -> LockAttempt {
    let mut batch = Batch::new();
    batch.push(AcquireLock::with_token(lock, resource, token).unwrap());
    batch.run(conn).await.pop().unwrap().unwrap()
}

/// The tickets in line, first first.
async fn line(d: &Deployment, resource: &str) -> Vec<String> {
    let key = derive(resource, "queue");
    let mut owner = d.owner(&key).await;
    support::raw(&mut owner, &["ZRANGE", &key, "0", "-1"]).await
}

#[test]
fn the_checker_finds_a_waiter_passed_over() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let first = Waited {
        start: ms(0),
        enqueued: Some(ms(1)),
        granted: Some((10, ms(20))),
        crashed: None,
    };
    let second = Waited {
        start: ms(2),
        enqueued: Some(ms(3)),
        granted: Some((11, ms(21))),
        crashed: None,
    };
    assert!(passed_over(&[first, second]).is_empty());
    // The later one granted first.
    let swapped = [
        first,
        Waited {
            granted: Some((9, ms(19))),
            ..second
        },
    ];
    assert_eq!(passed_over(&swapped).len(), 1);
    // The earlier one never granted while alive.
    let starved = [
        Waited {
            granted: None,
            ..first
        },
        second,
    ];
    assert_eq!(passed_over(&starved).len(), 1);
    // ... but it may be passed over once it crashed.
    let crashed = [
        Waited {
            granted: None,
            crashed: Some(ms(5)),
            ..first
        },
        second,
    ];
    assert!(passed_over(&crashed).is_empty());
    // Overlapping first attempts: no order between them.
    let overlapping = [
        Waited {
            enqueued: Some(ms(4)),
            ..first
        },
        Waited {
            granted: Some((9, ms(19))),
            ..second
        },
    ];
    assert!(passed_over(&overlapping).is_empty());
}

/// 64 waiters join the line of a held lock (staggered, some overlapping),
/// each through one joining attempt (recorded) and then the waiting acquire
/// of `Waiters` under the same token (four `Waiters`, as four processes
/// would have; a waiter's connection is not its `Waiters`' process). Once the first grants went through, 6
/// waiters still in line are killed (their tasks aborted: no leave is
/// sent, as after kill -9). Each holder holds about 1 ms. The history must
/// show no waiter passed over, every surviving waiter granted, and the line
/// gone at the end.
async fn no_waiter_is_passed_over_under_64_waiters_with_crashes(d: &Deployment) {
    history_of_64_waiters(d, false).await;
}

/// The same history with `Lock::acquire`'s waiting (backoff polling, no
/// pub/sub).
async fn no_polling_waiter_is_passed_over_under_64_waiters_with_crashes(d: &Deployment) {
    history_of_64_waiters(d, true).await;
}

async fn history_of_64_waiters(d: &Deployment, polling: bool) {
    let resource = format!("{}r", prefix("fair-history"));
    let lock = fair(Duration::from_secs(2), MINUTE);
    // Four processes, as far as waking goes: a pub/sub connection each.
    let mut processes = Vec::new();
    for _ in 0..4 {
        processes.push(waiters(d).await);
    }
    let mut conn = d.conn().await;
    let first = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    let history: Arc<Mutex<Vec<Waited>>> = Arc::default();
    let joined = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(d.conn().await);
    }
    let mut tasks = Vec::new();
    for w in 0..64usize {
        let (lock, resource) = (lock.clone(), resource.clone());
        let waiters = processes[w % 4].clone();
        let (history, joined, granted) = (history.clone(), joined.clone(), granted.clone());
        let mut conn = conns[w % 4].clone();
        history.lock().unwrap().push(Waited {
            start: Instant::now(),
            enqueued: None,
            granted: None,
            crashed: None,
        });
        tasks.push(tokio::spawn(async move {
            let token = Token::random().unwrap();
            let start = Instant::now();
            history.lock().unwrap()[w].start = start;
            let first = join(&mut conn, &lock, &resource, &token).await;
            assert!(!first.is_acquired(), "the lock is held while all join");
            history.lock().unwrap()[w].enqueued = Some(Instant::now());
            joined.fetch_add(1, Ordering::SeqCst);
            let outcome = if polling {
                lock.acquire_as(&mut conn, &resource, &token).await.unwrap()
            } else {
                waiters
                    .acquire_as(&mut conn, &lock, &resource, &token)
                    .await
                    .unwrap()
            };
            let grant = grant(outcome);
            history.lock().unwrap()[w].granted = Some((grant.fence().number(), Instant::now()));
            granted.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = grant.release(&mut conn).await.unwrap();
        }));
        if w % 3 == 0 {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    while joined.load(Ordering::SeqCst) < 64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(line(d, &resource).await.len(), 64);
    assert_eq!(
        first.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    while granted.load(Ordering::SeqCst) < 10 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Kill 6 waiters still in line: every 7th from the 15th on.
    let mut killed = Vec::new();
    for w in (15..64).step_by(7).take(6) {
        if history.lock().unwrap()[w].granted.is_none() {
            tasks[w].abort();
            history.lock().unwrap()[w].crashed = Some(Instant::now());
            killed.push(w);
        }
    }
    for (w, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(()) => {}
            Err(e) if e.is_cancelled() && killed.contains(&w) => {}
            Err(e) => panic!("waiter {w}: {e}"),
        }
    }
    let history = history.lock().unwrap().clone();
    let violations = passed_over(&history);
    assert!(violations.is_empty(), "{violations:#?}");
    let survivors = history.iter().filter(|w| w.granted.is_some()).count();
    assert!(survivors >= 58, "{survivors} granted");
    assert!(!killed.is_empty());
    // The killed tickets died within their life; the line is empty and gone.
    tokio::time::sleep(lock.ticket_life()).await;
    let _ = lock
        .clone()
        .with_wait(Backoff::none())
        .acquire(&mut conn, &resource)
        .await
        .unwrap();
    assert!(line(d, &resource).await.is_empty());
    assert!(!d.exists(&derive(&resource, "queue")).await);
}

/// A waiter first in line stops calling (its first attempt is all it ever
/// sends, as when its process is killed). The waiter behind it is granted
/// only once that ticket died: after the lock was freed and within the dead
/// ticket's life plus one fallback sleep (with a wide margin for a loaded
/// machine).
async fn a_dead_head_leaves_the_line_within_its_ticket_life(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-dead"));
    let lock = fair(MINUTE, MINUTE);
    let waiters = waiters(d).await;
    let mut conn = d.conn().await;
    let held = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    let dead = Token::random().unwrap();
    assert!(!join(&mut conn, &lock, &resource, &dead).await.is_acquired());
    let joined = Instant::now();
    let mut second = d.conn().await;
    let behind = {
        let (lock, resource, waiters) = (lock.clone(), resource.clone(), waiters.clone());
        tokio::spawn(async move {
            let outcome = waiters.acquire(&mut second, &lock, &resource).await;
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(line(d, &resource).await.len(), 2);
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let (outcome, at) = behind.await.unwrap();
    let next = grant(outcome.unwrap());
    let waited = at - joined;
    assert!(
        waited >= lock.ticket_life() - Duration::from_millis(50),
        "granted {waited:?} after the dead ticket joined: it was still alive"
    );
    assert!(
        waited <= lock.ticket_life() + Duration::from_secs(3),
        "the line took {waited:?} to move on"
    );
    assert!(line(d, &resource).await.is_empty());
    assert_eq!(
        next.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// A ticket that died is not first when its owner comes back: it is queued
/// again behind the waiters that joined meanwhile.
async fn a_ticket_that_died_is_queued_at_the_back_when_its_owner_returns(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-back"));
    // 1 ms sleeps: a ticket lives 2 * 2 ms + 1 s.
    let lock = Lock::new(MINUTE)
        .unwrap()
        .with_wait(Backoff {
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
            ..Backoff::new(MINUTE)
        })
        .fair();
    let mut conn = d.conn().await;
    let held = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    let (a, b, c) = (
        Token::random().unwrap(),
        Token::random().unwrap(),
        Token::random().unwrap(),
    );
    assert!(!join(&mut conn, &lock, &resource, &a).await.is_acquired());
    assert!(!join(&mut conn, &lock, &resource, &b).await.is_acquired());
    // b keeps calling, a does not: a dies.
    let until = Instant::now() + lock.ticket_life() + Duration::from_millis(200);
    while Instant::now() < until {
        assert!(!join(&mut conn, &lock, &resource, &b).await.is_acquired());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!join(&mut conn, &lock, &resource, &c).await.is_acquired());
    assert_eq!(line(d, &resource).await, [b.as_str(), c.as_str()]);
    // a returns: at the back.
    assert!(!join(&mut conn, &lock, &resource, &a).await.is_acquired());
    assert_eq!(
        line(d, &resource).await,
        [b.as_str(), c.as_str(), a.as_str()]
    );
    // And the lock, once free, goes to b, not to a or c.
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    assert!(!join(&mut conn, &lock, &resource, &a).await.is_acquired());
    assert!(!join(&mut conn, &lock, &resource, &c).await.is_acquired());
    let g = grant(join(&mut conn, &lock, &resource, &b).await);
    assert_eq!(line(d, &resource).await, [c.as_str(), a.as_str()]);
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// The grant of a fair acquire is the plain one: the lock holds
/// "<fence>:<token>", the fence counter moves by one, a plain acquire's
/// counter rules carry on; the line's keys expire with their last deadline;
/// a release PUBLISHes the first ticket in line on the resource's channel.
async fn a_fair_grant_is_the_plain_lock_and_its_release_wakes_the_head_by_name(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-normal"));
    let lock = fair(MINUTE, MINUTE);
    let plain = Lock::new(MINUTE).unwrap();
    let mut conn = d.conn().await;
    let g = grant(plain.acquire(&mut conn, &resource).await.unwrap());
    let f1 = g.fence().number();
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let token = Token::random().unwrap();
    let g = grant(join(&mut conn, &lock, &resource, &token).await);
    assert_eq!(g.fence().number(), f1 + 1);
    assert_eq!(
        d.get(&derive(&resource, "lock")).await.unwrap(),
        format!("{}:{}", f1 + 1, token.as_str())
    );
    assert_eq!(
        d.get(&derive(&resource, "fence")).await.unwrap(),
        (f1 + 1).to_string()
    );
    // A re-entry (lost reply) answers the same grant.
    let again = grant(join(&mut conn, &lock, &resource, &token).await);
    assert_eq!(again.fence().number(), f1 + 1);
    // Two join; the line's keys expire with the latest deadline.
    let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
    assert!(!join(&mut conn, &lock, &resource, &a).await.is_acquired());
    assert!(!join(&mut conn, &lock, &resource, &b).await.is_acquired());
    let queue = derive(&resource, "queue");
    let alive = derive(&resource, "queue:alive");
    let mut owner = d.owner(&queue).await;
    for key in [&queue, &alive] {
        let pttl: i64 = support::raw(&mut owner, &["PTTL", key]).await;
        let life = i64::try_from(lock.ticket_life().as_millis()).unwrap();
        assert!(pttl > 0 && pttl <= life, "{key}: {pttl} ms");
    }
    // The release names a, the first in line.
    let port = d.owner_port(&queue).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe(derive(&resource, "released"))
        .await
        .unwrap();
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let message = tokio::time::timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(message.get_payload_bytes(), a.as_str().as_bytes());
    // b calls first: not its turn. a is granted the next fence.
    assert!(!join(&mut conn, &lock, &resource, &b).await.is_acquired());
    let ga = grant(join(&mut conn, &lock, &resource, &a).await);
    assert_eq!(ga.fence().number(), f1 + 2);
    assert_eq!(
        ga.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let gb = grant(join(&mut conn, &lock, &resource, &b).await);
    assert_eq!(gb.fence().number(), f1 + 3);
    assert_eq!(
        gb.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    assert!(!d.exists(&queue).await);
    assert!(!d.exists(&alive).await);
}

/// A fair acquire without a wait takes a free lock only when nobody is in
/// line, and does not join.
async fn an_acquire_that_does_not_wait_never_passes_the_line(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-try"));
    let lock = fair(MINUTE, MINUTE);
    let once = lock.clone().with_wait(Backoff::none());
    let mut conn = d.conn().await;
    let g = grant(once.acquire(&mut conn, &resource).await.unwrap());
    let waiting = Token::random().unwrap();
    assert!(!join(&mut conn, &lock, &resource, &waiting)
        .await
        .is_acquired());
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    assert_eq!(
        once.acquire(&mut conn, &resource).await.unwrap(),
        LockAttempt::Held { expires_in: None }
    );
    assert_eq!(line(d, &resource).await, [waiting.as_str()]);
    let g = grant(join(&mut conn, &lock, &resource, &waiting).await);
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let g = grant(once.acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// A waiting acquire whose timeout passes leaves the line at once (it
/// does not block the ones behind it for its ticket's life).
async fn a_waiter_that_gives_up_leaves_the_line_at_once(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-give-up"));
    let lock = fair(MINUTE, Duration::from_millis(300));
    let mut conn = d.conn().await;
    let g = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    let outcome = lock.acquire(&mut conn, &resource).await.unwrap();
    assert!(!outcome.is_acquired());
    assert!(line(d, &resource).await.is_empty());
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

/// `FenceSource::PerSlot` in a fair lock: the slot counter's next fence,
/// nothing per resource written.
async fn slot_fences_are_granted_in_line_too(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-slot"));
    let lock = fair(MINUTE, MINUTE).with_fence_source(FenceSource::PerSlot);
    let waiters = waiters(d).await;
    let mut conn = d.conn().await;
    let g = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    assert_eq!(g.fence().source(), FenceSource::PerSlot);
    let counter = fence::slot_counter(nolock::keys::slot(&derive(&resource, "lock")));
    let top: u64 = d.get(counter).await.unwrap().parse().unwrap();
    assert!(top >= g.fence().number());
    let mut other = d.conn().await;
    let next = {
        let (lock, resource) = (lock.clone(), resource.clone());
        tokio::spawn(async move { waiters.acquire(&mut other, &lock, &resource).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let first = g.fence().number();
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let g2 = grant(next.await.unwrap().unwrap());
    assert!(g2.fence().number() > first);
    assert!(!d.exists(&derive(&resource, "fence")).await);
    assert_eq!(
        g2.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}

async fn eval(d: &Deployment, keys: &[&str], args: &[&str]) -> redis::RedisResult<redis::Value> {
    let script = nolock::script::Scripts::get("fence/acquire_fair").unwrap();
    let mut owner = d.owner(keys[0]).await;
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.source()).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query_async(&mut owner).await
}

/// Bad arguments to the script and bad input to the API: an error, and
/// nothing written.
async fn bad_input_is_refused_before_anything_is_written(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-bad"));
    let (l, q, a, f) = (
        derive(&resource, "lock"),
        derive(&resource, "queue"),
        derive(&resource, "queue:alive"),
        derive(&resource, "fence"),
    );
    let keys = [l.as_str(), q.as_str(), a.as_str(), f.as_str()];
    for (args, expect) in [
        (vec!["", "1000", "join", "10"], "empty token"),
        (vec!["t", "0", "join", "10"], "bad ttl"),
        (vec!["t", "1.5", "join", "10"], "bad ttl"),
        (vec!["t", "1000", "queue", "10"], "bad mode"),
        (vec!["t", "1000", "join", "0"], "bad life"),
        (vec!["t", "1000", "join", "x"], "bad life"),
        (vec!["t", "1000", "join"], "bad life"),
    ] {
        let err = eval(d, &keys, &args).await.expect_err(expect);
        assert!(err.to_string().contains(expect), "{err}");
    }
    let wrong = [l.as_str(), a.as_str(), q.as_str(), f.as_str()];
    let err = eval(d, &wrong, &["t", "1000", "join", "10"])
        .await
        .expect_err("not a queue");
    assert!(err.to_string().contains("not a queue"), "{err}");
    for key in [&l, &q, &a, &f] {
        assert!(!d.exists(key).await, "{key} was written");
    }
    let mut conn = d.conn().await;
    assert!(matches!(
        fair(MINUTE, MINUTE).acquire(&mut conn, "").await,
        Err(nolock::Error::EmptyKey)
    ));
}

/// A line key of another type, or a fence counter that is not one: a
/// definite error naming the key, nothing written (the lock stays free).
async fn foreign_data_in_the_line_is_refused_before_any_write(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-foreign"));
    let lock = fair(MINUTE, MINUTE);
    let mut conn = d.conn().await;
    let (q, a, f, l) = (
        derive(&resource, "queue"),
        derive(&resource, "queue:alive"),
        derive(&resource, "fence"),
        derive(&resource, "lock"),
    );
    let mut owner = d.owner(&q).await;
    for (setup, key, expect) in [
        (vec!["SET", q.as_str(), "x"], &q, "not a sorted set"),
        (vec!["HSET", a.as_str(), "f", "1"], &a, "not a sorted set"),
        (vec!["SET", f.as_str(), "007"], &f, "non-counter"),
    ] {
        let _: redis::Value = support::raw(&mut owner, &setup).await;
        let before: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", key]).await;
        let err = lock.acquire(&mut conn, &resource).await.expect_err(expect);
        assert!(err.is_definite(), "{err}");
        assert!(err.to_string().contains(expect), "{err}");
        assert!(err.to_string().contains(key.as_str()), "{err}");
        assert!(!d.exists(&l).await, "a lock was taken: {err}");
        let after: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", key]).await;
        assert_eq!(before, after, "{key} changed");
        let _: () = support::raw(&mut owner, &["DEL", key]).await;
    }
    // A ticket in line without a deadline (not nolock's): dropped when it
    // comes to the head, so it blocks nobody.
    let _: () = support::raw(&mut owner, &["ZADD", &q, "1", "stranger"]).await;
    let g = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    // A release still frees the lock when the line is foreign.
    let _: () = support::raw(&mut owner, &["SET", &q, "x"]).await;
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    let _: () = support::raw(&mut owner, &["DEL", &q]).await;
}

/// After SCRIPT FLUSH the fair acquire and the release run all the same.
async fn fair_acquire_survives_a_script_flush(d: &Deployment) {
    let resource = format!("{}r", prefix("fair-flush"));
    let lock = fair(MINUTE, MINUTE);
    let mut conn = d.conn().await;
    d.flush_scripts_everywhere().await;
    let g = grant(lock.acquire(&mut conn, &resource).await.unwrap());
    let token = Token::random().unwrap();
    assert!(!join(&mut conn, &lock, &resource, &token)
        .await
        .is_acquired());
    d.flush_scripts_everywhere().await;
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
    d.flush_scripts_everywhere().await;
    let g = grant(join(&mut conn, &lock, &resource, &token).await);
    assert_eq!(
        g.release(&mut conn).await.unwrap(),
        fence::LockRelease::Released
    );
}
