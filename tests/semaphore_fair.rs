//! Fair (FIFO) waiting for a semaphore (`Semaphore::fair`,
//! `lua/semaphore/acquire_fair.lua`) on a single server and on the local
//! 3x2 cluster: a history checker "no waiter passed over" under 64 waiters
//! of weights 1-2 on a semaphore of 3, some crashing mid-wait (polling, and
//! woken through `Waiters::acquire_permit`); a release of several permits
//! letting in as many waiters as fit, and publishing exactly the tickets
//! that fit (woken waiters with 30 s timers granted at once); a heavy head
//! not starved by light waiters; a dead head leaving
//! the line within its ticket's life; an acquire that does not wait never
//! passing the line; bad input; foreign data in the line's keys; a script
//! flush.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::keys::derive;
use nolock::semaphore::{
    AcquirePermit, Permit, PermitAttempt, PermitExtend, PermitId, PermitRelease, Semaphore,
};
use nolock::{Backoff, Batch};
use support::deployment::{both, AnyConn, Deployment};
use support::prefix;

both!(
    shared: [
        no_waiter_is_passed_over_under_64_weighted_waiters_with_crashes,
        no_woken_waiter_is_passed_over_under_64_weighted_waiters_with_crashes,
        a_fair_release_wakes_by_name_the_first_waiters_that_fit,
        a_release_of_several_permits_lets_in_every_waiter_that_fits,
        a_heavy_head_is_not_starved_by_light_waiters_behind_it,
        a_dead_head_leaves_the_line_within_its_ticket_life,
        an_acquire_that_does_not_wait_never_passes_the_line,
        a_waiter_that_gives_up_leaves_the_line_at_once,
        a_fair_grant_is_the_plain_semaphores_permits,
        bad_input_is_refused_before_anything_is_written,
        foreign_data_in_the_line_is_refused_before_any_write,
    ],
    exclusive: [fair_acquire_survives_a_script_flush],
);

const MINUTE: Duration = Duration::from_secs(60);

/// A fair semaphore of `permits` whose waiters sleep at most 100 ms
/// between attempts.
fn fair(permits: u64, ttl: Duration, timeout: Duration) -> Semaphore {
    Semaphore::new(permits, ttl)
        .unwrap()
        .with_wait(Backoff {
            max_delay: Duration::from_millis(100),
            ..Backoff::new(timeout)
        })
        .fair()
}

fn permit(outcome: PermitAttempt) -> Permit {
    match outcome {
        PermitAttempt::Acquired(permit) => permit,
        full => panic!("expected a permit, got {full:?}"),
    }
}

/// One attempt that joins the line under `id` (the first attempt of a
/// waiting acquire, as an operation value).
async fn join(
    conn: &mut AnyConn,
    semaphore: &Semaphore,
    key: &str,
    id: &PermitId,
    weight: u64,
) -> PermitAttempt {
    let mut batch = Batch::new();
    batch.push(AcquirePermit::with_id(semaphore, key, id, weight).unwrap());
    batch.run(conn).await.pop().unwrap().unwrap()
}

/// The tickets in line, first first.
async fn line(d: &Deployment, key: &str) -> Vec<String> {
    let queue = derive(key, "queue");
    let mut owner = d.owner(&queue).await;
    support::raw(&mut owner, &["ZRANGE", &queue, "0", "-1"]).await
}

fn ticket(id: &PermitId, weight: u64) -> String {
    format!("{}:{weight}", id.as_str())
}

/// One waiter's history. Its permits are never released: they expire, so
/// the server's own times say exactly when they were held.
#[derive(Debug, Clone, Copy)]
struct Waited {
    weight: u64,
    start: Instant,
    /// When its joining attempt returned with its ticket in line.
    enqueued: Option<Instant>,
    /// The grant: server millisecond, and when it was answered.
    granted: Option<(u64, Instant)>,
    /// When the waiter was killed (its future dropped), if it was.
    crashed: Option<Instant>,
}

/// "No waiter passed over": when a waiter `j` is granted at server
/// millisecond `g` while an earlier waiter `i` (in line before `j`'s first
/// attempt was sent, and alive: not crashed before `j`'s grant was
/// answered) is not yet granted (granted after `g`, or never), the permits
/// still free after `j`'s grant must leave room for `i`'s weight: `j` took
/// nothing `i` needed. The permits in use at `g` are counted from the
/// waiters' grants before `g` that had not expired (`ttl` ms each), `j`'s
/// included; grants in the same millisecond are left out (their order is
/// unknown), so the count never exceeds the truth. Returns every violation.
fn passed_over(history: &[Waited], permits: u64, ttl: u64) -> Vec<String> {
    let mut violations = Vec::new();
    for (j, b) in history.iter().enumerate() {
        let Some((g, answered)) = b.granted else {
            continue;
        };
        let in_use: u64 = b.weight
            + history
                .iter()
                .filter_map(|k| k.granted.map(|(gk, _)| (gk, k.weight)))
                .filter(|&(gk, _)| gk < g && gk + ttl > g)
                .map(|(_, w)| w)
                .sum::<u64>();
        for (i, a) in history.iter().enumerate() {
            let Some(enqueued) = a.enqueued else { continue };
            if i == j || enqueued >= b.start {
                continue;
            }
            let alive = a.crashed.is_none_or(|c| c > answered);
            let waiting = a.granted.is_none_or(|(gi, _)| gi > g);
            if alive && waiting && in_use + a.weight > permits {
                violations.push(format!(
                    "waiter {j} (weight {}) granted at {g} left {} free, and waiter {i} \
                     (weight {}), in line earlier, was still waiting: {a:?}",
                    b.weight,
                    permits.saturating_sub(in_use),
                    a.weight
                ));
            }
        }
    }
    violations
}

#[test]
fn the_checker_finds_a_waiter_passed_over() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let heavy = Waited {
        weight: 2,
        start: ms(0),
        enqueued: Some(ms(1)),
        granted: Some((1000, ms(20))),
        crashed: None,
    };
    let light = Waited {
        weight: 1,
        start: ms(2),
        enqueued: Some(ms(3)),
        granted: Some((1001, ms(21))),
        crashed: None,
    };
    // Semaphore of 3: both fit together, in either order.
    assert!(passed_over(&[heavy, light], 3, 100).is_empty());
    let light_first = Waited {
        granted: Some((999, ms(19))),
        ..light
    };
    assert!(passed_over(&[heavy, light_first], 3, 100).is_empty());
    // Semaphore of 2: the light one, behind, took a permit the heavy one needed.
    assert_eq!(passed_over(&[heavy, light_first], 2, 100).len(), 1);
    // ... also when the heavy one never got it.
    let starved = Waited {
        granted: None,
        ..heavy
    };
    assert_eq!(passed_over(&[starved, light], 2, 100).len(), 1);
    // ... but not once the heavy one crashed, nor when the light one came
    // first.
    let crashed = Waited {
        crashed: Some(ms(5)),
        ..starved
    };
    assert!(passed_over(&[crashed, light], 2, 100).is_empty());
    // Earlier grants count while unexpired: on a semaphore of 3, a grant
    // of 1 at 900 leaves no room for both at 1000 if it still holds.
    let old = Waited {
        weight: 1,
        start: ms(0),
        enqueued: None,
        granted: Some((900, ms(10))),
        crashed: None,
    };
    let heavy_later = Waited {
        start: ms(2),
        enqueued: Some(ms(3)),
        granted: Some((1000, ms(20))),
        ..heavy
    };
    let light_earlier = Waited {
        start: ms(0),
        enqueued: Some(ms(1)),
        granted: Some((1001, ms(21))),
        ..light
    };
    assert_eq!(
        passed_over(&[old, light_earlier, heavy_later], 3, 200).len(),
        1
    );
    assert!(passed_over(&[old, light_earlier, heavy_later], 3, 100).is_empty());
    let earlier = Waited {
        start: ms(0),
        enqueued: Some(ms(0)),
        ..light_first
    };
    let later = Waited {
        start: ms(2),
        ..heavy
    };
    assert!(passed_over(&[earlier, later], 2, 100).is_empty());
    // Grants in one millisecond are not counted against each other.
    let same_ms = Waited {
        granted: Some((1000, ms(20))),
        ..light
    };
    let other = Waited {
        weight: 2,
        start: ms(4),
        enqueued: Some(ms(5)),
        granted: Some((1000, ms(20))),
        crashed: None,
    };
    assert!(passed_over(&[same_ms, other], 2, 100).is_empty());
}

/// 64 waiters of weights 1 and 2 join the line of a semaphore of 3 that
/// one holder fills (staggered, some overlapping), each through one joining
/// attempt (recorded) and then the waiting acquire under the same id, over
/// four connections. Each grant is held until its permits expire (400 ms),
/// so the server's times say when they were held. Once the first grants
/// went through, 6 waiters still in line are killed (their tasks aborted:
/// no leave is sent, as after kill -9). The history must show no waiter
/// passed over, every surviving waiter granted, and the line gone at the
/// end.
async fn no_waiter_is_passed_over_under_64_weighted_waiters_with_crashes(d: &Deployment) {
    history_of_64_waiters(d, false).await;
}

/// The same history through `Waiters::acquire_permit` (woken by name by
/// the releases), four `Waiters` as four processes would have. The permits
/// still expire rather than being released; the expiries are the waiters'
/// fallback.
async fn no_woken_waiter_is_passed_over_under_64_weighted_waiters_with_crashes(d: &Deployment) {
    history_of_64_waiters(d, true).await;
}

async fn waiters(d: &Deployment) -> nolock::fence::Waiters {
    let port = match d {
        Deployment::Single(server) => server.port,
        Deployment::Cluster(cluster) => cluster.ports()[0],
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    nolock::fence::Waiters::new(&client).await.unwrap()
}

async fn history_of_64_waiters(d: &Deployment, woken: bool) {
    const TTL: u64 = 400;
    let mut processes = Vec::new();
    for _ in 0..4 {
        processes.push(waiters(d).await);
    }
    let key = format!("{}s", prefix("fair-sem-history"));
    let semaphore = fair(3, Duration::from_millis(TTL), MINUTE);
    let mut conn = d.conn().await;
    let first = permit(
        semaphore
            .clone()
            .with_wait(Backoff::none())
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    let history: Arc<Mutex<Vec<Waited>>> = Arc::default();
    let joined = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(d.conn().await);
    }
    // The first holder keeps its permits while all join.
    let keeper = {
        let (mut conn, semaphore, key) = (d.conn().await, semaphore.clone(), key.clone());
        let mut first = first;
        let joined = joined.clone();
        tokio::spawn(async move {
            while joined.load(Ordering::SeqCst) < 64 {
                let _ = first.extend(&mut conn).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = (semaphore, key);
            first
        })
    };
    let mut tasks = Vec::new();
    for w in 0..64usize {
        let weight = 1 + (w as u64 * 7 % 5) % 2;
        let (semaphore, key) = (semaphore.clone(), key.clone());
        let (history, joined, granted) = (history.clone(), joined.clone(), granted.clone());
        let mut conn = conns[w % 4].clone();
        let wake = processes[w % 4].clone();
        let owner_d = match d {
            Deployment::Single(s) => s.port,
            Deployment::Cluster(_) => d.owner_port(&key).await,
        };
        history.lock().unwrap().push(Waited {
            weight,
            start: Instant::now(),
            enqueued: None,
            granted: None,
            crashed: None,
        });
        tasks.push(tokio::spawn(async move {
            let id = PermitId::random().unwrap();
            let start = Instant::now();
            history.lock().unwrap()[w].start = start;
            let first = join(&mut conn, &semaphore, &key, &id, weight).await;
            assert!(!first.is_acquired(), "the semaphore is full while all join");
            history.lock().unwrap()[w].enqueued = Some(Instant::now());
            joined.fetch_add(1, Ordering::SeqCst);
            let outcome = if woken {
                wake.acquire_permit(&mut conn, &semaphore, &key, &id, weight)
                    .await
                    .unwrap()
            } else {
                semaphore
                    .acquire_as(&mut conn, &key, &id, weight)
                    .await
                    .unwrap()
            };
            let permit = permit(outcome);
            let answered = Instant::now();
            let client = redis::Client::open(format!("redis://127.0.0.1:{owner_d}/")).unwrap();
            let mut owner = client.get_multiplexed_async_connection().await.unwrap();
            let member = format!("{}:1", id.as_str());
            let score: Option<u64> = support::raw(&mut owner, &["ZSCORE", &key, &member]).await;
            let score = score.expect("the permit is read before it expires");
            history.lock().unwrap()[w].granted = Some((score - TTL, answered));
            granted.fetch_add(1, Ordering::SeqCst);
            drop(permit);
        }));
        if w % 3 == 0 {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    while joined.load(Ordering::SeqCst) < 64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(line(d, &key).await.len(), 64);
    let first = keeper.await.unwrap();
    assert_eq!(
        first.release(&mut conn).await.unwrap(),
        PermitRelease::Released
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
    let violations = passed_over(&history, 3, TTL);
    assert!(violations.is_empty(), "{violations:#?}");
    let survivors = history.iter().filter(|w| w.granted.is_some()).count();
    assert!(survivors >= 58, "{survivors} granted");
    assert!(!killed.is_empty());
    // The killed tickets died within their life; the line is empty and gone.
    tokio::time::sleep(semaphore.ticket_life()).await;
    let _ = semaphore
        .clone()
        .with_wait(Backoff::none())
        .acquire(&mut conn, &key)
        .await
        .unwrap();
    assert!(line(d, &key).await.is_empty());
    assert!(!d.exists(&derive(&key, "queue")).await);
}

/// A holder of all 3 permits releases them with three waiters of weight 1
/// in line: all three are granted, and the third may be granted first (it
/// does not wait for the two ahead of it to take theirs): one release lets
/// in every waiter that fits, not one per release. Then through the
/// waiting acquire: three spawned waiters are all granted after one
/// release, holding together.
async fn a_release_of_several_permits_lets_in_every_waiter_that_fits(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-wake"));
    let semaphore = fair(3, MINUTE, MINUTE);
    let mut conn = d.conn().await;
    let holder = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    let ids: Vec<PermitId> = (0..3).map(|_| PermitId::random().unwrap()).collect();
    for (n, id) in ids.iter().enumerate() {
        assert!(!join(&mut conn, &semaphore, &key, id, 1).await.is_acquired());
        assert_eq!(line(d, &key).await.len(), n + 1);
    }
    assert_eq!(
        holder.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    let mut permits = Vec::new();
    for id in ids.iter().rev() {
        permits.push(permit(join(&mut conn, &semaphore, &key, id, 1).await));
    }
    assert!(line(d, &key).await.is_empty());
    assert_eq!(semaphore.peek(&mut conn, &key).await.unwrap().in_use, 3);
    for p in permits {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }

    let holder = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (semaphore, key, granted) = (semaphore.clone(), key.clone(), granted.clone());
        let mut conn = d.conn().await;
        tasks.push(tokio::spawn(async move {
            let p = permit(semaphore.acquire(&mut conn, &key).await.unwrap());
            granted.fetch_add(1, Ordering::SeqCst);
            // Held until all three are in.
            while granted.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            p.release(&mut conn).await.unwrap()
        }));
    }
    while line(d, &key).await.len() < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        holder.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    for task in tasks {
        assert_eq!(task.await.unwrap(), PermitRelease::Released);
    }
    assert!(line(d, &key).await.is_empty());
}

/// A fair permit's release publishes, on `keys::derive(key, "released")`,
/// the tickets at the head of the line whose weights fit what it freed, in
/// line order, stopping at the first that does not fit; a plain release of
/// the same permits publishes nothing. Through `Waiters::acquire_permit`,
/// three waiters of weight 1 behind a holder of all 3 permits, sleeping
/// 30 s between attempts, are all granted at its one release.
async fn a_fair_release_wakes_by_name_the_first_waiters_that_fit(d: &Deployment) {
    use futures_util::StreamExt;
    let key = format!("{}s", prefix("fair-sem-publish"));
    let semaphore = fair(3, MINUTE, MINUTE);
    let mut conn = d.conn().await;
    let holder = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    let ids: Vec<(PermitId, u64)> = [1, 1, 2, 1]
        .into_iter()
        .map(|w| (PermitId::random().unwrap(), w))
        .collect();
    for (id, w) in &ids {
        assert!(!join(&mut conn, &semaphore, &key, id, *w)
            .await
            .is_acquired());
    }
    let port = d.owner_port(&key).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe(derive(&key, "released")).await.unwrap();
    assert_eq!(
        holder.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    let mut heard = Vec::new();
    {
        let mut messages = pubsub.on_message();
        while let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_millis(300), messages.next()).await
        {
            heard.push(String::from_utf8(m.get_payload_bytes().to_vec()).unwrap());
        }
    }
    // 1 + 1 fit in 3; 1 + 1 + 2 do not, and the 1 behind the 2 waits too.
    assert_eq!(heard, [ticket(&ids[0].0, 1), ticket(&ids[1].0, 1)]);
    // A plain release of fair permits: the same removal, no message.
    let p = permit(join(&mut conn, &semaphore, &key, &ids[0].0, 1).await);
    let plain = Semaphore::new(3, MINUTE).unwrap();
    let restored = plain.restore(&key, p.id().clone(), 1).unwrap();
    assert_eq!(
        restored.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    drop(p);
    let quiet = tokio::time::timeout(Duration::from_millis(300), pubsub.on_message().next()).await;
    assert!(quiet.is_err(), "{quiet:?}");
    for (id, _) in &ids {
        let _: () = support::raw(
            &mut d.owner(&key).await,
            &[
                "ZREM",
                &derive(&key, "queue"),
                &ticket(id, 1),
                &ticket(id, 2),
            ],
        )
        .await;
    }

    // Woken by name: three waiters behind a holder of all 3 permits, whose
    // own timers would not fire for 30 s: the release alone lets them in.
    let semaphore = Semaphore::new(3, MINUTE)
        .unwrap()
        .with_wait(Backoff {
            initial_delay: Duration::from_secs(30),
            max_delay: Duration::from_secs(30),
            ..Backoff::new(MINUTE)
        })
        .fair();
    let wake = waiters(d).await;
    let holder = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (semaphore, key, granted, wake) = (
            semaphore.clone(),
            key.clone(),
            granted.clone(),
            wake.clone(),
        );
        let mut conn = d.conn().await;
        tasks.push(tokio::spawn(async move {
            let id = PermitId::random().unwrap();
            let p = permit(
                wake.acquire_permit(&mut conn, &semaphore, &key, &id, 1)
                    .await
                    .unwrap(),
            );
            granted.fetch_add(1, Ordering::SeqCst);
            while granted.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            p.release(&mut conn).await.unwrap()
        }));
    }
    while line(d, &key).await.len() < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        holder.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    for task in tasks {
        let released = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("woken by the release, not by its 30 s timer");
        assert_eq!(released.unwrap(), PermitRelease::Released);
    }
    assert!(line(d, &key).await.is_empty());
}

/// A waiter of weight 2 first in line, light waiters behind it: as permits
/// come free one by one, the light ones do not take them before it.
async fn a_heavy_head_is_not_starved_by_light_waiters_behind_it(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-heavy"));
    let semaphore = fair(3, MINUTE, MINUTE);
    let mut conn = d.conn().await;
    let a = permit(semaphore.acquire(&mut conn, &key).await.unwrap());
    let b = permit(semaphore.acquire(&mut conn, &key).await.unwrap());
    let c = permit(semaphore.acquire(&mut conn, &key).await.unwrap());
    let (heavy, light) = (PermitId::random().unwrap(), PermitId::random().unwrap());
    assert!(!join(&mut conn, &semaphore, &key, &heavy, 2)
        .await
        .is_acquired());
    assert!(!join(&mut conn, &semaphore, &key, &light, 1)
        .await
        .is_acquired());
    assert_eq!(a.release(&mut conn).await.unwrap(), PermitRelease::Released);
    // One free: the light one would fit alone, but the heavy one is first.
    match join(&mut conn, &semaphore, &key, &light, 1).await {
        PermitAttempt::Full {
            retry_after,
            in_use,
        } => assert_eq!((retry_after, in_use), (Duration::ZERO, 2)),
        granted => panic!("the light waiter passed the heavy one: {granted:?}"),
    }
    assert!(!join(&mut conn, &semaphore, &key, &heavy, 2)
        .await
        .is_acquired());
    assert_eq!(b.release(&mut conn).await.unwrap(), PermitRelease::Released);
    assert!(!join(&mut conn, &semaphore, &key, &light, 1)
        .await
        .is_acquired());
    let h = permit(join(&mut conn, &semaphore, &key, &heavy, 2).await);
    assert_eq!(line(d, &key).await, [ticket(&light, 1)]);
    assert_eq!(c.release(&mut conn).await.unwrap(), PermitRelease::Released);
    let l = permit(join(&mut conn, &semaphore, &key, &light, 1).await);
    for p in [h, l] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    assert!(!d.exists(&derive(&key, "queue")).await);
    assert!(!d.exists(&derive(&key, "queue:alive")).await);
}

/// A waiter of weight 2 first in line stops calling (its first attempt is
/// all it ever sends). The waiter of weight 2 behind it (2 + 2 > 3) is
/// granted only once that ticket died: within the dead ticket's life plus
/// one sleep (with a wide margin for a loaded machine).
async fn a_dead_head_leaves_the_line_within_its_ticket_life(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-dead"));
    let semaphore = fair(3, MINUTE, MINUTE);
    let mut conn = d.conn().await;
    let held = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    let dead = PermitId::random().unwrap();
    assert!(!join(&mut conn, &semaphore, &key, &dead, 2)
        .await
        .is_acquired());
    let joined = Instant::now();
    let behind = {
        let (semaphore, key, mut conn) = (semaphore.clone(), key.clone(), d.conn().await);
        tokio::spawn(async move {
            let outcome = semaphore.acquire_weighted(&mut conn, &key, 2).await;
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(line(d, &key).await.len(), 2);
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    let (outcome, at) = behind.await.unwrap();
    let next = permit(outcome.unwrap());
    let waited = at - joined;
    assert!(
        waited >= semaphore.ticket_life() - Duration::from_millis(50),
        "granted after {waited:?}, before the dead head's ticket died"
    );
    assert!(
        waited <= semaphore.ticket_life() + Duration::from_secs(3),
        "granted after {waited:?}"
    );
    assert!(line(d, &key).await.is_empty());
    assert_eq!(
        next.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
}

/// A fair acquire without a wait is granted only when its weight fits with
/// the whole line's, and never joins.
async fn an_acquire_that_does_not_wait_never_passes_the_line(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-try"));
    let semaphore = fair(3, MINUTE, MINUTE);
    let once = semaphore.clone().with_wait(Backoff::none());
    let mut conn = d.conn().await;
    let all = permit(once.acquire_weighted(&mut conn, &key, 3).await.unwrap());
    let waiting = PermitId::random().unwrap();
    assert!(!join(&mut conn, &semaphore, &key, &waiting, 2)
        .await
        .is_acquired());
    assert_eq!(
        all.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    // 3 free, 2 promised: a try of 2 does not fit beside them; a try of 1 does.
    assert_eq!(
        once.acquire_weighted(&mut conn, &key, 2).await.unwrap(),
        PermitAttempt::Full {
            retry_after: Duration::ZERO,
            in_use: 0
        }
    );
    let one = permit(once.acquire(&mut conn, &key).await.unwrap());
    assert!(!once.acquire(&mut conn, &key).await.unwrap().is_acquired());
    assert_eq!(line(d, &key).await, [ticket(&waiting, 2)]);
    let w = permit(join(&mut conn, &semaphore, &key, &waiting, 2).await);
    assert!(line(d, &key).await.is_empty());
    for p in [one, w] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    let p = permit(once.acquire_weighted(&mut conn, &key, 3).await.unwrap());
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
}

/// A waiting acquire whose timeout passes leaves the line at once.
async fn a_waiter_that_gives_up_leaves_the_line_at_once(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-give-up"));
    let semaphore = fair(1, MINUTE, Duration::from_millis(300));
    let mut conn = d.conn().await;
    let p = permit(semaphore.acquire(&mut conn, &key).await.unwrap());
    let outcome = semaphore.acquire(&mut conn, &key).await.unwrap();
    assert!(!outcome.is_acquired());
    assert!(line(d, &key).await.is_empty());
    let lease = semaphore
        .with_permit(d.conn().await, &key, |_| async {})
        .await;
    assert!(matches!(lease, Ok(nolock::Work::Busy)), "{lease:?}");
    assert!(line(d, &key).await.is_empty());
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    let done = semaphore
        .with_permit(d.conn().await, &key, |_| async { 7 })
        .await
        .unwrap();
    assert!(matches!(done, nolock::Work::Done(7)), "{done:?}");
}

/// A fair grant writes the plain semaphore's permits: a plain semaphore of
/// the same size peeks, extends and releases them; the line's keys expire
/// within the ticket's life.
async fn a_fair_grant_is_the_plain_semaphores_permits(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-plain"));
    let semaphore = fair(3, MINUTE, MINUTE);
    let plain = Semaphore::new(3, MINUTE).unwrap();
    let mut conn = d.conn().await;
    let mut p = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 2)
            .await
            .unwrap(),
    );
    let usage = plain.peek(&mut conn, &key).await.unwrap();
    assert_eq!(usage.in_use, 2);
    let mut owner = d.owner(&key).await;
    let tag: Option<String> = support::raw(&mut owner, &["ZSCORE", &key, "by:m3"]).await;
    assert_eq!(tag.as_deref(), Some("0"));
    assert!(matches!(
        p.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    let waiting = PermitId::random().unwrap();
    assert!(!join(&mut conn, &semaphore, &key, &waiting, 2)
        .await
        .is_acquired());
    for k in [derive(&key, "queue"), derive(&key, "queue:alive")] {
        let pttl: i64 = support::raw(&mut owner, &["PTTL", &k]).await;
        let life = i64::try_from(semaphore.ticket_life().as_millis()).unwrap();
        assert!(pttl > 0 && pttl <= life, "{k}: {pttl} ms");
    }
    let restored = plain.restore(&key, p.id().clone(), 2).unwrap();
    assert_eq!(
        restored.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    let _ = p;
    let w = permit(join(&mut conn, &semaphore, &key, &waiting, 2).await);
    assert_eq!(w.release(&mut conn).await.unwrap(), PermitRelease::Released);
    assert!(!d.exists(&key).await);
}

async fn eval(d: &Deployment, keys: &[&str], args: &[&str]) -> redis::RedisResult<redis::Value> {
    eval_script(d, "semaphore/acquire_fair", keys, args).await
}

async fn eval_script(
    d: &Deployment,
    name: &str,
    keys: &[&str],
    args: &[&str],
) -> redis::RedisResult<redis::Value> {
    let script = nolock::script::Scripts::get(name).unwrap();
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
    let key = format!("{}s", prefix("fair-sem-bad"));
    let (q, a) = (derive(&key, "queue"), derive(&key, "queue:alive"));
    let keys = [key.as_str(), q.as_str(), a.as_str()];
    let id = "0123456789abcdef0123456789abcdef";
    for (args, expect) in [
        (vec!["x", "3", "1", "1000", "join", "10"], "bad permit id"),
        (vec![id, "0", "1", "1000", "join", "10"], "bad permits"),
        (vec![id, "3", "4", "1000", "join", "10"], "bad weight"),
        (vec![id, "3", "1", "0", "join", "10"], "bad ttl"),
        (vec![id, "3", "1", "1000", "wait", "10"], "bad mode"),
        (vec![id, "3", "1", "1000", "join", "0"], "bad life"),
        (vec![id, "3", "1", "1000", "join", "1.5"], "bad life"),
        (vec![id, "3", "1", "1000", "try", "10"], "bad life"),
        (vec![id, "3", "1", "1000", "join"], "bad life"),
        (
            vec![id, "3", "1", "1000", "join", "10", "x"],
            "expected 6 arguments",
        ),
    ] {
        let err = eval(d, &keys, &args).await.expect_err(expect);
        assert!(err.to_string().contains(expect), "{err}");
    }
    for wrong in [
        [key.as_str(), a.as_str(), q.as_str()],
        [key.as_str(), q.as_str(), key.as_str()],
    ] {
        let err = eval(d, &wrong, &[id, "3", "1", "1000", "join", "10"])
            .await
            .expect_err("not a queue");
        assert!(err.to_string().contains("not a queue"), "{err}");
    }
    for k in [&key, &q, &a] {
        assert!(!d.exists(k).await, "{k} was written");
    }
    // The release's own arguments.
    for (keys, args, expect) in [
        (
            vec![key.as_str(), q.as_str(), a.as_str()],
            vec!["x", "1"],
            "bad permit id",
        ),
        (
            vec![key.as_str(), q.as_str(), a.as_str()],
            vec![id, "0"],
            "bad weight",
        ),
        (
            vec![key.as_str(), a.as_str(), q.as_str()],
            vec![id, "1"],
            "not a queue",
        ),
        (vec![key.as_str(), q.as_str()], vec![id, "1"], "not a queue"),
    ] {
        let err = eval_script(d, "semaphore/release_fair", &keys, &args)
            .await
            .expect_err(expect);
        assert!(err.to_string().contains(expect), "{err}");
    }
    let mut conn = d.conn().await;
    let semaphore = fair(3, MINUTE, MINUTE);
    assert!(matches!(
        semaphore.acquire(&mut conn, "").await,
        Err(nolock::Error::EmptyKey)
    ));
    assert!(matches!(
        semaphore.acquire_weighted(&mut conn, &key, 4).await,
        Err(nolock::Error::InsufficientCapacity { .. })
    ));
    // Fair and fenced: refused before any I/O, in every way in.
    let fenced = semaphore.clone().fenced();
    assert!(matches!(
        fenced.acquire(&mut conn, &key).await,
        Err(nolock::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        AcquirePermit::new(&fenced, &key),
        Err(nolock::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        fenced
            .with_wait(Backoff::none())
            .acquire(&mut conn, &key)
            .await,
        Err(nolock::Error::InvalidArgument { .. })
    ));
    for k in [&key, &q, &a] {
        assert!(!d.exists(k).await, "{k} was written");
    }
}

/// A line key of another type, or a semaphore that is not one: a definite
/// error naming the key, nothing written. A ticket in line that is not
/// nolock's (another form, or no deadline) is dropped and blocks nobody.
async fn foreign_data_in_the_line_is_refused_before_any_write(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-foreign"));
    let semaphore = fair(2, MINUTE, MINUTE);
    let mut conn = d.conn().await;
    let (q, a) = (derive(&key, "queue"), derive(&key, "queue:alive"));
    let mut owner = d.owner(&q).await;
    for (setup, k, expect) in [
        (vec!["SET", q.as_str(), "x"], &q, "not a sorted set"),
        (vec!["HSET", a.as_str(), "f", "1"], &a, "not a sorted set"),
        (
            vec!["ZADD", key.as_str(), "5", "worker-1"],
            &key,
            "not a semaphore",
        ),
    ] {
        let _: redis::Value = support::raw(&mut owner, &setup).await;
        let before: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", k]).await;
        let err = semaphore.acquire(&mut conn, &key).await.expect_err(expect);
        assert!(err.is_definite(), "{err}");
        assert!(err.to_string().contains(expect), "{err}");
        assert!(err.to_string().contains(k.as_str()), "{err}");
        let after: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", k]).await;
        assert_eq!(before, after, "{k} changed");
        let _: () = support::raw(&mut owner, &["DEL", k]).await;
        for other in [&key, &q, &a] {
            assert!(!d.exists(other).await, "{other} was written: {err}");
        }
    }
    // Strangers in line: one of another form with a deadline, one of
    // nolock's form without, both ahead: dropped, they block nobody.
    let far = "99999999999999";
    let _: () = support::raw(
        &mut owner,
        &[
            "ZADD",
            &q,
            "1",
            "stranger",
            "2",
            "0123456789abcdef0123456789abcdef:2",
        ],
    )
    .await;
    let _: () = support::raw(&mut owner, &["ZADD", &a, far, "stranger"]).await;
    let p = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 2)
            .await
            .unwrap(),
    );
    assert!(line(d, &key).await.is_empty());
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    // A stranger ahead of a live ticket: the ticket is still counted.
    let p = permit(
        semaphore
            .acquire_weighted(&mut conn, &key, 2)
            .await
            .unwrap(),
    );
    let waiting = PermitId::random().unwrap();
    assert!(!join(&mut conn, &semaphore, &key, &waiting, 2)
        .await
        .is_acquired());
    let _: () = support::raw(&mut owner, &["ZADD", &q, "0", "stranger"]).await;
    let _: () = support::raw(&mut owner, &["ZADD", &a, far, "stranger"]).await;
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    let once = semaphore.clone().with_wait(Backoff::none());
    assert!(!once
        .acquire_weighted(&mut conn, &key, 2)
        .await
        .unwrap()
        .is_acquired());
    assert_eq!(line(d, &key).await, [ticket(&waiting, 2)]);
    let w = permit(join(&mut conn, &semaphore, &key, &waiting, 2).await);
    // A release still frees the permits when the line is foreign (and
    // wakes nobody).
    let _: () = support::raw(&mut owner, &["DEL", &q, &a]).await;
    let _: () = support::raw(&mut owner, &["SET", &q, "x"]).await;
    assert_eq!(w.release(&mut conn).await.unwrap(), PermitRelease::Released);
    assert!(!d.exists(&key).await);
    let _: () = support::raw(&mut owner, &["DEL", &q, &a]).await;
}

/// After SCRIPT FLUSH the fair acquire runs all the same (EVAL fallback).
async fn fair_acquire_survives_a_script_flush(d: &Deployment) {
    let key = format!("{}s", prefix("fair-sem-flush"));
    let semaphore = fair(1, MINUTE, MINUTE);
    let mut conn = d.conn().await;
    d.flush_scripts_everywhere().await;
    let p = permit(semaphore.acquire(&mut conn, &key).await.unwrap());
    let id = PermitId::random().unwrap();
    assert!(!join(&mut conn, &semaphore, &key, &id, 1)
        .await
        .is_acquired());
    d.flush_scripts_everywhere().await;
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    d.flush_scripts_everywhere().await;
    let p = permit(join(&mut conn, &semaphore, &key, &id, 1).await);
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
}
