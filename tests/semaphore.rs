//! The semaphore against real servers: concurrency bounds under load (with
//! the old `limits` recipe shown over-admitting), crashed and paused
//! holders, weights, bad input, script flushes, a full server, foreign data,
//! and a model-based property test.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::semaphore::{
    self, AcquirePermit, ExtendPermit, Permit, PermitAttempt, PermitExtend, PermitLease,
    PermitRelease, ReleasePermit, Semaphore,
};
use nolock::Backoff;
use nolock::{Batch, Error, Operation};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use redis::aio::MultiplexedConnection;
use support::{command_calls, keys, prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);
const MS: Duration = Duration::from_millis(1);

fn permit(outcome: PermitAttempt) -> Permit {
    match outcome {
        PermitAttempt::Acquired(permit) => permit,
        full => panic!("expected a permit, got {full:?}"),
    }
}

/// Running holders as the workers see them: counted up after a grant's
/// reply, down before the release is sent, so always within the server's
/// holding window: a peak above the limit here is a real over-admission.
#[derive(Default)]
struct Gauge {
    now: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
    fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }
}

const WORKERS: usize = 12;
const PERMITS: u64 = 2;
const JOB: Duration = Duration::from_millis(600);
const TTL: Duration = Duration::from_secs(1);
const RUN: Duration = Duration::from_secs(5);

/// The scenario of issue 12: 12 workers, 2 permits, 600 ms jobs, a 1 s ttl
/// (longer than a job, as the old docs asked), for 5 s.
#[tokio::test]
async fn twelve_workers_on_two_permits_never_run_more_than_two() {
    let server = RedisServer::start();
    let conn = server.conn().await;
    let key = format!("{}exports", prefix("pool"));
    let gauge = Arc::new(Gauge::default());
    let jobs = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let wait = Backoff {
        max_delay: Duration::from_millis(100),
        ..Backoff::new(RUN)
    };
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (mut conn, key, gauge, jobs) = (conn.clone(), key.clone(), gauge.clone(), jobs.clone());
        workers.push(tokio::spawn(async move {
            while start.elapsed() < RUN {
                let outcome = Semaphore::new(PERMITS, TTL)
                    .unwrap()
                    .with_wait(wait)
                    .acquire(&mut conn, &key)
                    .await
                    .unwrap();
                let PermitAttempt::Acquired(permit) = outcome else {
                    continue;
                };
                gauge.enter();
                tokio::time::sleep(JOB).await;
                gauge.leave();
                let released = permit.release(&mut conn).await.unwrap();
                assert_eq!(
                    released,
                    PermitRelease::Released,
                    "a job shorter than the ttl"
                );
                jobs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let jobs = jobs.load(Ordering::Relaxed);
    eprintln!(
        "semaphore: peak {} running, {jobs} jobs in {RUN:?}",
        gauge.peak()
    );
    assert_eq!(gauge.peak(), PERMITS);
    // 2 permits × 5 s / 0.6 s: about 16 jobs; backoff costs a few.
    assert!(jobs >= 10, "{jobs} jobs");
    let mut conn = conn;
    assert_eq!(
        keys(&mut conn, &format!("{key}*")).await,
        Vec::<String>::new()
    );
}

/// The recipe people write instead of a semaphore (a bounded counter
/// incremented when work starts and decremented when it ends; nolock no
/// longer offers the decrement) over-admits as soon as a job outlives the
/// counter's window: the counter expires one window after the *first*
/// holder while the holders still run, and the next ones are admitted on a
/// fresh count. Played out step by step, so that it never depends on timing;
/// the semaphore in the same steps admits no one extra.
#[tokio::test]
async fn the_old_limits_recipe_over_admits_in_the_same_scenario() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let p = prefix("old_recipe");
    let window = Duration::from_millis(300);
    let counter = nolock::limits::Counter::new(PERMITS, window).unwrap();
    let key = format!("{p}exports");
    // Two jobs start: the counter is full.
    for _ in 0..PERMITS {
        assert!(
            counter
                .try_increment(&mut conn, &key)
                .await
                .unwrap()
                .admitted
        );
    }
    assert!(
        !counter
            .try_increment(&mut conn, &key)
            .await
            .unwrap()
            .admitted
    );
    // They run past the window; the counter expires under them ...
    tokio::time::sleep(window + 100 * MS).await;
    // ... and two more are admitted while the first two still run.
    let mut running = PERMITS;
    while counter
        .try_increment(&mut conn, &key)
        .await
        .unwrap()
        .admitted
    {
        running += 1;
        assert!(running < 100, "never full again");
    }
    assert_eq!(running, 2 * PERMITS, "over-admitted: {running} running");

    // The semaphore, same steps: a permit's holder renews it (or it is
    // lost to that holder, who then stops); never more than PERMITS hold.
    let sem = Semaphore::new(PERMITS, window).unwrap();
    let skey = format!("{p}sem");
    let mut leases = Vec::new();
    for _ in 0..PERMITS {
        leases.push(
            sem.lease(conn.clone(), &skey)
                .await
                .unwrap()
                .acquired()
                .expect("a free permit"),
        );
    }
    tokio::time::sleep(window + 100 * MS).await;
    assert!(!sem.acquire(&mut conn, &skey).await.unwrap().is_acquired());
    assert!(leases.iter().all(|l| !l.is_lost()));
}

#[tokio::test]
async fn a_crashed_holder_frees_exactly_its_own_permit_after_its_ttl() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("crash"));
    let crashed = permit(
        Semaphore::new(3, 300 * MS)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );
    let mut b = permit(
        Semaphore::new(3, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );
    let mut c = permit(
        Semaphore::new(3, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );

    // Full, until the crashed holder's permit expires (it never releases).
    let PermitAttempt::Full {
        retry_after,
        in_use,
    } = Semaphore::new(3, MINUTE)
        .unwrap()
        .acquire(&mut conn, &key)
        .await
        .unwrap()
    else {
        panic!("3 of 3 held");
    };
    assert_eq!(in_use, 3);
    assert!(
        retry_after <= 300 * MS && retry_after > 200 * MS,
        "{retry_after:?}"
    );
    tokio::time::sleep(retry_after + 5 * MS).await;
    let d = permit(
        Semaphore::new(3, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );

    // Exactly the crashed permit came back: b and c still hold theirs
    // (beside the tag of a semaphore of 3).
    let members: Vec<String> = raw(&mut conn, &["ZRANGE", &key, "0", "-1"]).await;
    let mut want: Vec<String> = [&b, &c, &d]
        .iter()
        .map(|p| format!("{}:1", p.id().as_str()))
        .collect();
    want.push("by:m3".to_owned());
    let mut got = members.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    for p in [&mut b, &mut c] {
        assert!(matches!(
            p.extend(&mut conn).await.unwrap(),
            PermitExtend::Extended { .. }
        ));
    }
    assert_eq!(
        crashed.release(&mut conn).await.unwrap(),
        PermitRelease::Lost
    );
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (3, 3));
    for p in [b, c, d] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    assert_eq!(
        keys(&mut conn, &key).await,
        Vec::<String>::new(),
        "gone with its last permit"
    );
}

#[tokio::test]
async fn a_holder_paused_past_its_ttl_finds_its_permit_lost_and_taken() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("paused"));
    let mut paused = permit(
        Semaphore::new(1, 200 * MS)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );
    // The holder stalls (a GC pause, a stuck VM) past its ttl...
    tokio::time::sleep(250 * MS).await;
    // ...and another holder takes the only permit.
    let other = permit(
        Semaphore::new(1, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );
    assert_eq!(paused.extend(&mut conn).await.unwrap(), PermitExtend::Lost);
    assert_eq!(
        paused.release(&mut conn).await.unwrap(),
        PermitRelease::Lost
    );
    // The late release left the new holder alone.
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (1, 1));
    assert!(!Semaphore::new(1, MINUTE)
        .unwrap()
        .acquire(&mut conn, &key)
        .await
        .unwrap()
        .is_acquired());
    assert_eq!(
        other.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
}

/// 200 tasks on a semaphore of 10 for 3 s: never more than 10 holders, by
/// the grant and release times the tasks record and by the server's count.
#[tokio::test]
async fn two_hundred_tasks_on_ten_permits_never_exceed_ten() {
    const TASKS: usize = 200;
    const SIZE: u64 = 10;
    let server = RedisServer::start();
    let conn = server.conn().await;
    let key = format!("{}s", prefix("two_hundred"));
    let run = Duration::from_secs(3);
    let start = Instant::now();
    // (granted, release sent) per job, on the local clock.
    let spans = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let gauge = Arc::new(Gauge::default());
    let wait = Backoff {
        initial_delay: 2 * MS,
        max_delay: 50 * MS,
        ..Backoff::new(run)
    };

    let sampler = {
        let (mut conn, key) = (conn.clone(), key.clone());
        tokio::spawn(async move {
            let (mut reads, mut peak) = (0u64, 0u64);
            while start.elapsed() < run {
                let usage = semaphore::peek(&mut conn, &key).await.unwrap();
                assert!(usage.in_use <= SIZE, "server holds {}", usage.in_use);
                peak = peak.max(usage.in_use);
                reads += 1;
                tokio::time::sleep(5 * MS).await;
            }
            (reads, peak)
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (mut conn, key, spans, gauge) =
            (conn.clone(), key.clone(), spans.clone(), gauge.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < run {
                let outcome = Semaphore::new(SIZE, 2 * TTL)
                    .unwrap()
                    .with_wait(wait)
                    .acquire(&mut conn, &key)
                    .await
                    .unwrap();
                let PermitAttempt::Acquired(permit) = outcome else {
                    continue;
                };
                let granted = Instant::now();
                gauge.enter();
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..30))).await;
                gauge.leave();
                let sent = Instant::now();
                let released = permit.release(&mut conn).await.unwrap();
                assert_eq!(released, PermitRelease::Released);
                spans.lock().unwrap().push((granted, sent));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (reads, server_peak) = sampler.await.unwrap();

    let spans = std::mem::take(&mut *spans.lock().unwrap());
    let mut events: Vec<(Instant, i64)> =
        spans.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
    // At equal instants, count ends first (a release sent before the grant seen).
    events.sort();
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, delta) in events {
        now += delta;
        peak = peak.max(now);
    }
    eprintln!(
        "{} jobs, peak {peak} by grant/release times, {} by the gauge, {server_peak} in {reads} server reads",
        spans.len(),
        gauge.peak()
    );
    assert!(peak <= SIZE as i64 && gauge.peak() <= SIZE);
    // Loose floors: a loaded machine runs fewer jobs and reads, never more holders.
    assert!(spans.len() >= 100, "{} jobs", spans.len());
    assert!(reads >= 10, "{reads} server reads");
    let mut conn = conn;
    assert_eq!(semaphore::peek(&mut conn, &key).await.unwrap().in_use, 0);
    assert_eq!(
        keys(&mut conn, &key).await,
        Vec::<String>::new(),
        "every permit released"
    );
}

#[tokio::test]
async fn a_weighted_acquire_is_all_or_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("weighted"));
    let mut big = permit(
        Semaphore::new(5, MINUTE)
            .unwrap()
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    assert_eq!(big.weight(), 3);
    let full = Semaphore::new(5, MINUTE)
        .unwrap()
        .acquire_weighted(&mut conn, &key, 3)
        .await
        .unwrap();
    assert!(
        matches!(full, PermitAttempt::Full { in_use: 3, .. }),
        "{full:?}"
    );
    let card: u64 = raw(&mut conn, &["ZCARD", &key]).await;
    assert_eq!(
        card,
        3 + 1,
        "nothing taken by the refused request (3 and the tag)"
    );
    let small = permit(
        Semaphore::new(5, MINUTE)
            .unwrap()
            .acquire_weighted(&mut conn, &key, 2)
            .await
            .unwrap(),
    );
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders, usage.free(5)), (5, 2, 0));
    let one = Semaphore::new(5, MINUTE)
        .unwrap()
        .acquire(&mut conn, &key)
        .await
        .unwrap();
    assert!(matches!(one, PermitAttempt::Full { .. }));

    assert!(matches!(
        big.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert_eq!(
        big.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert_eq!(semaphore::peek(&mut conn, &key).await.unwrap().in_use, 2);
    let again = permit(
        Semaphore::new(5, MINUTE)
            .unwrap()
            .acquire_weighted(&mut conn, &key, 3)
            .await
            .unwrap(),
    );
    for p in [small, again] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    assert_eq!(keys(&mut conn, &key).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_retry_with_the_same_id_gets_the_same_permit_not_a_second() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("same_id"));
    let id = semaphore::PermitId::random().unwrap();
    let op = AcquirePermit::with_id(&Semaphore::new(2, MINUTE).unwrap(), &key, &id, 2).unwrap();
    let mut batch = Batch::new();
    batch.push(op.clone()).push(op);
    let results = batch.run(&mut conn).await;
    for r in results {
        assert!(r.unwrap().is_acquired());
    }
    assert_eq!(semaphore::peek(&mut conn, &key).await.unwrap().in_use, 2);
    // A different weight under the same id is refused, with nothing written.
    let err = nolock::Batch::from_iter([AcquirePermit::with_id(
        &Semaphore::new(2, MINUTE).unwrap(),
        &key,
        &id,
        1,
    )
    .unwrap()])
    .run(&mut conn)
    .await
    .remove(0)
    .unwrap_err();
    assert!(
        matches!(err, Error::PermitWeightMismatch { .. }) && err.is_definite(),
        "{err}"
    );
    assert_eq!(semaphore::peek(&mut conn, &key).await.unwrap().in_use, 2);
}

/// The semaphore as stored (members with their scores) and when the key
/// expires: equal before and after a call means the call wrote nothing.
async fn stored(conn: &mut MultiplexedConnection, key: &str) -> (Vec<String>, i64) {
    let members: Vec<String> = raw(conn, &["ZRANGE", key, "0", "-1", "WITHSCORES"]).await;
    let expires: i64 = raw(conn, &["PEXPIRETIME", key]).await;
    (members, expires)
}

/// Issue 33, item 5: a holder of 3 permits whose permit is rebuilt as 1
/// (or 2, or 4) cannot extend or release part of it. Each call is a
/// definite `PermitWeightMismatch` with nothing written, the real holder
/// keeps its 3 permits (and extends and releases them), and another caller
/// gets only what is free.
#[tokio::test]
async fn a_permit_restored_with_another_weight_is_neither_extended_nor_released() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("restored_weight"));
    let ttl = Duration::from_millis(400);
    let sem = Semaphore::new(5, ttl).unwrap();
    let mut holder = permit(sem.acquire_weighted(&mut conn, &key, 3).await.unwrap());
    let before = stored(&mut conn, &key).await;
    assert_eq!(before.0.len(), 8, "3 members and the tag with their scores");
    assert_eq!(before.0[..2], ["by:m5", "0"]);

    for weight in [1, 2, 4] {
        // The reporter's run: six extensions of the wrong weight.
        let mut wrong = sem.restore(&key, holder.id().clone(), weight).unwrap();
        for _ in 0..6 {
            let err = wrong.extend(&mut conn).await.unwrap_err();
            assert!(
                matches!(err, Error::PermitWeightMismatch { .. }) && err.is_definite(),
                "weight {weight}: {err}"
            );
            assert!(!err.is_invalid_input(), "the server decided");
            assert!(err.to_string().contains(&key), "{err}");
        }
        assert!(wrong.time_left().is_zero(), "no deadline from a refusal");
        let err = wrong.release(&mut conn).await.unwrap_err();
        assert!(
            matches!(err, Error::PermitWeightMismatch { .. }),
            "weight {weight}: {err}"
        );
        assert_eq!(stored(&mut conn, &key).await, before, "weight {weight}");
    }
    // Through a batch and with an operation id: the same refusal, and the
    // refusal is not recorded (an error reply never is).
    let wrong = sem.restore(&key, holder.id().clone(), 1).unwrap();
    let release = ReleasePermit::new(&wrong).idempotent("restored-1").unwrap();
    for _ in 0..2 {
        let err = Batch::from_iter([release.clone()])
            .run(&mut conn)
            .await
            .remove(0)
            .unwrap_err();
        assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    }
    assert_eq!(stored(&mut conn, &key).await, before);
    let other = Semaphore::new(5, ttl).unwrap();
    let full = other.acquire_weighted(&mut conn, &key, 3).await.unwrap();
    assert!(
        matches!(full, PermitAttempt::Full { in_use: 3, .. }),
        "{full:?}"
    );
    // The real holder keeps all 3: its extension moves them together.
    assert!(matches!(
        holder.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    let (members, _) = stored(&mut conn, &key).await;
    assert_eq!(members[..2], ["by:m5", "0"], "the tag, untouched");
    let scores: Vec<&String> = members.iter().skip(3).step_by(2).collect();
    assert_eq!(scores.len(), 3);
    assert!(scores.iter().all(|s| *s == scores[0]), "{members:?}");

    // The permits' TTL passes: all 3 expire together (none was kept alive
    // by a partial extension), so at no point are more than 5 held.
    tokio::time::sleep(ttl + 50 * MS).await;
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (0, 0));
    let mut two = permit(other.acquire_weighted(&mut conn, &key, 2).await.unwrap());
    assert_eq!(holder.extend(&mut conn).await.unwrap(), PermitExtend::Lost);
    let mut three = permit(other.acquire_weighted(&mut conn, &key, 3).await.unwrap());
    let full = other.acquire(&mut conn, &key).await.unwrap();
    assert!(
        matches!(full, PermitAttempt::Full { in_use: 5, .. }),
        "{full:?}"
    );
    // Holders of the right weight still extend and release.
    assert!(matches!(
        three.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert!(matches!(
        two.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    for p in [two, three] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    assert_eq!(
        holder.release(&mut conn).await.unwrap(),
        PermitRelease::Lost
    );
    assert_eq!(keys(&mut conn, &key).await, Vec::<String>::new());
}

/// Issue 33, item 9: a permit rebuilt by `Semaphore::restore` has the
/// semaphore's TTL, and its extension sets that TTL on the server.
#[tokio::test]
async fn a_restored_permits_ttl_is_the_semaphores() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("restored_ttl"));
    let ttl = Duration::from_millis(1500);
    let sem = Semaphore::new(2, ttl).unwrap();
    let taken = permit(sem.acquire(&mut conn, &key).await.unwrap());
    let mut restored = sem.restore(&key, taken.id().clone(), 1).unwrap();
    assert_eq!(restored.ttl(), sem.ttl());
    assert!(matches!(
        restored.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert!(restored.time_left() <= ttl);
    let (now_s, now_us): (u64, u64) = raw(&mut conn, &["TIME"]).await;
    let now_ms = now_s * 1000 + now_us / 1000;
    let member = format!("{}:1", restored.id().as_str());
    let score: u64 = raw(&mut conn, &["ZSCORE", &key, &member]).await;
    assert!(
        score <= now_ms + 1500 && score + 200 >= now_ms + 1500,
        "expiry {score} is not about {now_ms} + 1500"
    );
    assert_eq!(
        restored.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert_eq!(taken.release(&mut conn).await.unwrap(), PermitRelease::Lost);
}

/// Issue 33, item 9: an extension's answer is taken only by the permit it
/// is about; another permit's is refused and the deadline stays.
#[tokio::test]
async fn applying_another_permits_extension_is_refused_and_leaves_the_deadline() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("foreign_answer"));
    let short = Semaphore::new(3, Duration::from_millis(200)).unwrap();
    let long = Semaphore::new(3, Duration::from_secs(30)).unwrap();
    let mut a = permit(short.acquire(&mut conn, &key).await.unwrap());
    let b = permit(long.acquire(&mut conn, &key).await.unwrap());
    tokio::time::sleep(250 * MS).await; // a's permit has expired
    let answers = Batch::from_iter([ExtendPermit::new(&b), ExtendPermit::new(&a)])
        .run(&mut conn)
        .await;
    let [of_b, of_a] = [&answers[0], &answers[1]].map(|r| r.as_ref().unwrap());
    assert!(of_b.is_extended() && !of_a.is_extended());
    let deadline = a.deadline();
    let err = a.apply(of_b).unwrap_err();
    assert!(
        matches!(err, Error::ForeignAnswer { receipt: "permit" }),
        "{err}"
    );
    assert_eq!(a.deadline(), deadline, "the deadline is as it was");
    // The same id restored with another TTL is another receipt too.
    let stretched = long.restore(&key, a.id().clone(), 1).unwrap();
    let answer = Batch::from_iter([ExtendPermit::new(&stretched)])
        .run(&mut conn)
        .await
        .remove(0)
        .unwrap();
    assert!(a.apply(&answer).is_err());
    assert_eq!(a.deadline(), deadline);
    a.apply(of_a).unwrap();
    assert!(a.time_left().is_zero());
    assert_eq!(a.extend(&mut conn).await.unwrap(), PermitExtend::Lost);
    assert_eq!(b.release(&mut conn).await.unwrap(), PermitRelease::Released);
}

#[tokio::test]
async fn bad_input_is_rejected_before_anything_is_sent() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // Loaded first: the valid acquire below is then one EVALSHA (a miss
    // would add the EVALSHA of the SCRIPT LOAD + EVALSHA fallback).
    nolock::Scripts::load(&mut conn).await.unwrap();
    let before = command_calls(&mut conn, "evalsha").await;
    let s = Duration::from_secs(1);
    let too_long = semaphore::MAX_PERMIT_TTL + MS;
    let cases: Vec<(Error, &str)> = vec![
        (Semaphore::new(0, s).unwrap_err(), "ZeroLimit"),
        (
            Semaphore::new(2, s)
                .unwrap()
                .acquire_weighted(&mut conn, "k", 3)
                .await
                .unwrap_err(),
            "InsufficientCapacity",
        ),
        (
            Semaphore::new(2, s)
                .unwrap()
                .acquire_weighted(&mut conn, "k", 0)
                .await
                .unwrap_err(),
            "ZeroLimit",
        ),
        (Semaphore::new(10_001, s).unwrap_err(), "OutOfRange"),
        (
            Semaphore::new(1, Duration::ZERO).unwrap_err(),
            "ZeroDuration",
        ),
        (Semaphore::new(1, too_long).unwrap_err(), "DurationTooLong"),
        (
            Semaphore::new(1, s)
                .unwrap()
                .acquire(&mut conn, "")
                .await
                .unwrap_err(),
            "EmptyKey",
        ),
        (
            semaphore::peek(&mut conn, "").await.unwrap_err(),
            "EmptyKey",
        ),
        (Semaphore::new(0, s).unwrap_err(), "ZeroLimit"),
        (
            Semaphore::new(1, s)
                .unwrap()
                .restore("", semaphore::PermitId::random().unwrap(), 1)
                .unwrap_err(),
            "EmptyKey",
        ),
        (
            Semaphore::new(1, s)
                .unwrap()
                .restore("k", semaphore::PermitId::random().unwrap(), 2)
                .unwrap_err(),
            "InsufficientCapacity",
        ),
    ];
    for (err, kind) in cases {
        assert!(
            format!("{err:?}").starts_with(kind),
            "{err:?} is not {kind}"
        );
        assert!(err.is_invalid_input(), "{err}");
    }
    // The one valid call: a permit's release and extension take no key
    // and no TTL, so they have no bad input left to refuse.
    let p = permit(
        Semaphore::new(1, s)
            .unwrap()
            .acquire(&mut conn, "k")
            .await
            .unwrap(),
    );
    let _ = p;
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        before + 1,
        "only the valid acquire"
    );
}

#[tokio::test]
async fn every_call_recovers_a_script_flush() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("flush"));
    let flush = || async {
        let mut c = server.conn().await;
        let _: () = raw(&mut c, &["SCRIPT", "FLUSH"]).await;
    };
    flush().await;
    let mut p = permit(
        Semaphore::new(2, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );
    flush().await;
    assert!(matches!(
        p.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    flush().await;
    assert_eq!(semaphore::peek(&mut conn, &key).await.unwrap().in_use, 1);
    // A permit restored with another weight: the typed refusal, after the
    // fallback as before it.
    let sem = Semaphore::new(2, MINUTE).unwrap();
    let mut wrong = sem.restore(&key, p.id().clone(), 2).unwrap();
    flush().await;
    let err = wrong.extend(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    flush().await;
    let err = wrong.release(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    flush().await;
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    // Each flushed script came back through SCRIPT LOAD + EVALSHA, never
    // EVAL / EVAL_RO (which the EVAL LRU of Redis >= 7.4 could evict).
    assert_eq!(command_calls(&mut conn, "script|load").await, 6);
    assert_eq!(command_calls(&mut conn, "eval").await, 0);
    assert_eq!(command_calls(&mut conn, "eval_ro").await, 0);
}

#[tokio::test]
async fn release_and_extend_still_work_on_a_full_server() {
    let server =
        RedisServer::start_with(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    let mut conn = server.conn().await;
    let p = prefix("oom");
    let key = format!("{p}s");
    let mut held = permit(
        Semaphore::new(3, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );

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

    // A new permit needs memory: refused, definitely, nothing written.
    let err = Semaphore::new(3, MINUTE)
        .unwrap()
        .acquire(&mut conn, &key)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Redis(_)) && err.to_string().contains("OOM"),
        "{err}"
    );
    let card: u64 = raw(&mut conn, &["ZCARD", &key]).await;
    assert_eq!(card, 1 + 1, "the permit and the tag");

    // A permit restored with another weight is refused as such (allow-oom:
    // not OOM), with nothing written.
    let before: Vec<String> = raw(&mut conn, &["ZRANGE", &key, "0", "-1", "WITHSCORES"]).await;
    let mut wrong = Semaphore::new(3, MINUTE)
        .unwrap()
        .restore(&key, held.id().clone(), 2)
        .unwrap();
    let err = wrong.extend(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    let err = wrong.release(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    let after: Vec<String> = raw(&mut conn, &["ZRANGE", &key, "0", "-1", "WITHSCORES"]).await;
    assert_eq!(after, before);

    // The holder keeps and gives back its permit (allow-oom), also through EVAL.
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    assert!(matches!(
        held.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert_eq!(keys(&mut conn, &key).await, Vec::<String>::new());
}

/// Keys nolock did not write: every call refuses them with a definite error
/// naming the key, and writes nothing (not even a TTL).
#[tokio::test]
async fn foreign_data_is_refused_with_nothing_written() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let p = prefix("foreign");
    let id = "0123456789abcdef0123456789abcdef";
    let far = "9000000000000";
    let setups: Vec<(&str, Vec<Vec<String>>)> = vec![
        ("string", vec![vec!["SET".into(), "{k}".into(), "3".into()]]),
        (
            "list",
            vec![vec!["RPUSH".into(), "{k}".into(), format!("{id}:1")]],
        ),
        (
            "hash",
            vec![vec!["HSET".into(), "{k}".into(), "a".into(), "1".into()]],
        ),
        (
            "zset, foreign member",
            vec![vec![
                "ZADD".into(),
                "{k}".into(),
                far.into(),
                "worker-1".into(),
            ]],
        ),
        (
            "zset, uppercase id",
            vec![vec![
                "ZADD".into(),
                "{k}".into(),
                far.into(),
                format!("{}:1", id.to_uppercase()),
            ]],
        ),
        (
            "zset, index 0",
            vec![vec![
                "ZADD".into(),
                "{k}".into(),
                far.into(),
                format!("{id}:0"),
            ]],
        ),
        (
            "zset, fractional score",
            vec![vec![
                "ZADD".into(),
                "{k}".into(),
                "9000000000000.5".into(),
                format!("{id}:1"),
            ]],
        ),
        (
            "zset, negative score",
            vec![vec![
                "ZADD".into(),
                "{k}".into(),
                "-5".into(),
                format!("{id}:1"),
            ]],
        ),
        (
            "zset, infinite score",
            vec![vec![
                "ZADD".into(),
                "{k}".into(),
                "+inf".into(),
                format!("{id}:1"),
            ]],
        ),
        (
            "zset, foreign highest member",
            vec![
                vec!["ZADD".into(), "{k}".into(), far.into(), format!("{id}:1")],
                vec![
                    "ZADD".into(),
                    "{k}".into(),
                    "9000000000001".into(),
                    "x".into(),
                ],
            ],
        ),
    ];
    let other = semaphore::PermitId::random().unwrap();
    for (n, (what, commands)) in setups.iter().enumerate() {
        let key = format!("{p}{n}");
        for command in commands {
            let args: Vec<String> = command.iter().map(|a| a.replace("{k}", &key)).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _: redis::Value = raw(&mut conn, &args).await;
        }
        let dump = || async {
            let mut c = server.conn().await;
            let dump: Option<Vec<u8>> = raw(&mut c, &["DUMP", &key]).await;
            let pttl: i64 = raw(&mut c, &["PTTL", &key]).await;
            (dump, pttl)
        };
        let before = dump().await;
        assert_eq!(before.1, -1, "{what}");

        // Another holder's permit, as a process that kept only its id would
        // rebuild it, pointed at the foreign key.
        let five = Semaphore::new(5, MINUTE).unwrap();
        let mut stranger = five.restore(&key, other.clone(), 1).unwrap();
        let stranger_again = five.restore(&key, other.clone(), 1).unwrap();
        let results = [
            Semaphore::new(5, MINUTE)
                .unwrap()
                .acquire(&mut conn, &key)
                .await
                .map(|_| ()),
            Semaphore::new(5, MINUTE)
                .unwrap()
                .acquire_weighted(&mut conn, &key, 2)
                .await
                .map(|_| ()),
            stranger_again.release(&mut conn).await.map(|_| ()),
            stranger.extend(&mut conn).await.map(|_| ()),
            semaphore::peek(&mut conn, &key).await.map(|_| ()),
        ];
        for (call, result) in ["acquire", "weighted", "release", "extend", "peek"]
            .iter()
            .zip(results)
        {
            let err = result.expect_err(&format!("{what}: {call} must refuse"));
            assert!(
                matches!(err, Error::Redis(_)) && err.is_definite(),
                "{what}: {call}: {err}"
            );
            let text = err.to_string();
            assert!(
                text.contains("nolock semaphore/") || text.contains("WRONGTYPE"),
                "{what}: {call}: {text}"
            );
        }
        assert_eq!(dump().await, before, "{what}: nothing written");
    }
}

// ------------------------------------------------------------ model

#[derive(Debug, Clone)]
enum Step {
    Acquire {
        slot: usize,
        weight: u64,
    },
    Release {
        slot: usize,
    },
    Extend {
        slot: usize,
    },
    /// The holder's permits reach their expiry (scores set in the past, as
    /// if the holder had stalled past its ttl).
    Expire {
        slot: usize,
    },
    /// The holder's permit rebuilt with `weight`, extended and released.
    Restore {
        slot: usize,
        weight: u64,
    },
    Peek,
}

fn steps() -> impl Strategy<Value = (u64, Vec<Step>)> {
    (1u64..6).prop_flat_map(|permits| {
        let step = prop_oneof![
            3 => (0usize..4, 1..=permits).prop_map(|(slot, weight)| Step::Acquire { slot, weight }),
            2 => (0usize..4).prop_map(|slot| Step::Release { slot }),
            1 => (0usize..4).prop_map(|slot| Step::Extend { slot }),
            1 => (0usize..4).prop_map(|slot| Step::Expire { slot }),
            1 => (0usize..4, 1..=permits).prop_map(|(slot, weight)| Step::Restore { slot, weight }),
            1 => Just(Step::Peek),
        ];
        (Just(permits), prop::collection::vec(step, 1..30))
    })
}

/// The model: per slot, a permit held (its weight) and whether it expired.
#[derive(Default, Clone, Copy)]
struct Slot {
    weight: u64,
    expired: bool,
}

#[test]
fn the_semaphore_conforms_to_a_model() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt.block_on(server.conn());
    let config = Config {
        cases: 48,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    TestRunner::new(config)
        .run(&steps(), |(permits, steps)| {
            let key = format!("{}s", prefix("model"));
            let mut conn: MultiplexedConnection = conn.clone();
            rt.block_on(async {
                let mut model: [Option<Slot>; 4] = [None; 4];
                let mut held: [Option<Permit>; 4] = Default::default();
                for (i, step) in steps.iter().enumerate() {
                    let live = |m: &[Option<Slot>; 4]| -> (u64, u64) {
                        m.iter()
                            .flatten()
                            .filter(|s| !s.expired)
                            .fold((0, 0), |(w, h), s| (w + s.weight, h + 1))
                    };
                    match *step {
                        Step::Acquire { slot, weight } => {
                            if held[slot].is_some() {
                                continue;
                            }
                            let outcome = Semaphore::new(permits, MINUTE)
                                .unwrap()
                                .acquire_weighted(&mut conn, &key, weight)
                                .await
                                .unwrap();
                            let (in_use, _) = live(&model);
                            let fits = in_use + weight <= permits;
                            prop_assert_eq!(outcome.is_acquired(), fits, "step {}: {:?}", i, step);
                            match outcome {
                                PermitAttempt::Acquired(p) => {
                                    // Expired permits were reclaimed by this call.
                                    for s in model.iter_mut() {
                                        if s.is_some_and(|s| s.expired) {
                                            *s = None;
                                        }
                                    }
                                    model[slot] = Some(Slot {
                                        weight,
                                        expired: false,
                                    });
                                    held[slot] = Some(p);
                                }
                                PermitAttempt::Full { in_use: got, .. } => {
                                    prop_assert_eq!(got, in_use)
                                }
                            }
                        }
                        Step::Release { slot } => {
                            let Some(p) = held[slot].take() else { continue };
                            let r = p.release(&mut conn).await.unwrap();
                            let want = if model[slot].is_some_and(|s| !s.expired) {
                                PermitRelease::Released
                            } else {
                                PermitRelease::Lost
                            };
                            prop_assert_eq!(r, want, "step {}", i);
                            model[slot] = None;
                        }
                        Step::Extend { slot } => {
                            let Some(p) = held[slot].as_mut() else {
                                continue;
                            };
                            let e = p.extend(&mut conn).await.unwrap();
                            let live_slot = model[slot].is_some_and(|s| !s.expired);
                            prop_assert_eq!(
                                matches!(e, PermitExtend::Extended { .. }),
                                live_slot,
                                "step {}",
                                i
                            );
                        }
                        Step::Expire { slot } => {
                            let Some(p) = &held[slot] else { continue };
                            if let Some(s) = model[slot].as_mut() {
                                for n in 1..=p.weight() {
                                    let _: redis::Value = raw(
                                        &mut conn,
                                        &[
                                            "ZADD",
                                            &key,
                                            "XX",
                                            "1000",
                                            &format!("{}:{n}", p.id().as_str()),
                                        ],
                                    )
                                    .await;
                                }
                                s.expired = true;
                            }
                        }
                        Step::Restore { slot, weight } => {
                            let Some(p) = &held[slot] else { continue };
                            let sem = Semaphore::new(permits, MINUTE).unwrap();
                            let mut restored = sem.restore(&key, p.id().clone(), weight).unwrap();
                            let extended = restored.extend(&mut conn).await;
                            let released = restored.release(&mut conn).await;
                            let live_slot = model[slot].is_some_and(|s| !s.expired);
                            match (live_slot, weight == p.weight()) {
                                // Another weight: refused, nothing written.
                                (true, false) => {
                                    prop_assert!(
                                        matches!(extended, Err(Error::PermitWeightMismatch { .. }))
                                            && matches!(
                                                released,
                                                Err(Error::PermitWeightMismatch { .. })
                                            ),
                                        "step {}: {:?} {:?}",
                                        i,
                                        extended,
                                        released
                                    );
                                }
                                // Its own weight: the holding, extended then given back.
                                (true, true) => {
                                    prop_assert!(
                                        matches!(extended, Ok(PermitExtend::Extended { .. })),
                                        "step {}",
                                        i
                                    );
                                    prop_assert_eq!(
                                        released.unwrap(),
                                        PermitRelease::Released,
                                        "step {}",
                                        i
                                    );
                                    model[slot] = None;
                                }
                                // Expired: lost, whatever the weight.
                                (false, _) => {
                                    prop_assert_eq!(
                                        extended.unwrap(),
                                        PermitExtend::Lost,
                                        "step {}",
                                        i
                                    );
                                    prop_assert_eq!(
                                        released.unwrap(),
                                        PermitRelease::Lost,
                                        "step {}",
                                        i
                                    );
                                }
                            }
                        }
                        Step::Peek => {
                            let u = semaphore::peek(&mut conn, &key).await.unwrap();
                            prop_assert_eq!((u.in_use, u.holders), live(&model), "step {}", i);
                        }
                    }
                    let card: u64 = raw(&mut conn, &["ZCARD", &key]).await;
                    let (in_use, _) = live(&model);
                    prop_assert!(in_use <= permits);
                    prop_assert!(
                        card >= in_use,
                        "step {}: {} members for {} in use",
                        i,
                        card,
                        in_use
                    );
                }
                Ok(())
            })
        })
        .unwrap();
}

#[tokio::test]
async fn with_permit_runs_the_work_and_a_lease_outlives_its_ttl() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("lease"));
    let out = Semaphore::new(1, 300 * MS)
        .unwrap()
        .with_permit(conn.clone(), &key, |id| async move {
            // Three ttls of work: the renewals keep the permit.
            tokio::time::sleep(900 * MS).await;
            id.as_str().len()
        })
        .await
        .unwrap();
    assert_eq!(out, nolock::Work::Done(32));
    assert_eq!(
        keys(&mut conn, &key).await,
        Vec::<String>::new(),
        "released after the work"
    );

    // A full semaphore: Busy after the backoff.
    let holder = permit(
        Semaphore::new(1, MINUTE)
            .unwrap()
            .acquire(&mut conn, &key)
            .await
            .unwrap(),
    );
    let none = Semaphore::new(1, MINUTE)
        .unwrap()
        .with_wait(Backoff::new(50 * MS))
        .with_permit(conn.clone(), &key, |_| async {})
        .await
        .unwrap();
    assert_eq!(none, nolock::Work::Busy);

    // A lease whose permit is taken away is lost, and the work is cancelled.
    let _ = holder.release(&mut conn).await.unwrap();
    let lease = Semaphore::new(1, 300 * MS)
        .unwrap()
        .lease(conn.clone(), &key)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let _: () = raw(&mut conn, &["DEL", &key]).await;
    let loss = tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .unwrap();
    assert_eq!(loss, nolock::Loss::NotHeld);
    assert_eq!(lease.release().await.unwrap(), PermitRelease::Lost);
}

#[tokio::test]
async fn a_permit_lease_survives_a_busy_server_and_a_restored_permit_releases() {
    // Past 20 ms of script, the server answers other clients BUSY.
    let server = RedisServer::start_with(&["--busy-reply-threshold", "20"]);
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("busy"));
    let ttl = Duration::from_millis(1500);
    let lease = Semaphore::new(1, ttl)
        .unwrap()
        .lease(conn.clone(), &key)
        .await
        .unwrap()
        .acquired()
        .unwrap();
    // The first renewal is due at 500 ms; the server is busy from 100 to 800 ms.
    tokio::time::sleep(100 * MS).await;
    let client = server.client();
    let busy = tokio::spawn(async move {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let script = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
            while true do local n = redis.call('TIME') \
            if n[1] * 1000000 + n[2] - s > 700000 then return 1 end end";
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
    });
    tokio::time::sleep(1400 * MS).await;
    busy.await.unwrap();
    assert_eq!(lease.loss(), None, "a BUSY blip does not end the permit");
    assert!(lease.deadline() > Instant::now() + ttl / 3, "renewed since");

    // A process that kept only the id and weight can still give it back.
    let stored = (
        lease.permit().id().as_str().to_owned(),
        lease.permit().weight(),
    );
    let mut restored = Semaphore::new(1, ttl)
        .unwrap()
        .restore(
            &key,
            semaphore::PermitId::parse(&stored.0).unwrap(),
            stored.1,
        )
        .unwrap();
    assert!(matches!(
        restored.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert_eq!(
        restored.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert_eq!(
        lease.release().await.unwrap(),
        PermitRelease::Lost,
        "already given back"
    );
}

/// A foreign member between the lowest and highest is not read by an
/// acquire: it counts as one permit held until its score passes. It can
/// make the semaphore admit fewer holders, never more, and peek (which
/// reads every member) refuses the key. The documented reach.
#[tokio::test]
async fn a_foreign_member_in_the_middle_counts_as_a_holder_and_never_over_admits() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}s", prefix("foreign_middle"));
    // Two configurations of one key (as two deployments might have): the
    // lowest member expires in 30 s, the highest in 60 s.
    let short = Semaphore::new(3, 30 * 1000 * MS).unwrap();
    let sem = Semaphore::new(3, MINUTE).unwrap();
    let low = permit(short.acquire(&mut conn, &key).await.unwrap());
    let high = permit(sem.acquire(&mut conn, &key).await.unwrap());
    let now_ms = {
        let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        s * 1000 + us / 1000
    };
    // A score between the permits' own.
    let _: i64 = raw(
        &mut conn,
        &["ZADD", &key, &(now_ms + 45_000).to_string(), "worker-1"],
    )
    .await;
    // 3 permits: two holders and the foreign member. Full.
    let full = sem.acquire(&mut conn, &key).await.unwrap();
    assert!(
        matches!(full, PermitAttempt::Full { in_use: 3, .. }),
        "{full:?}"
    );
    assert!(
        semaphore::peek(&mut conn, &key).await.is_err(),
        "peek reads every member"
    );
    // Once a release leaves it lowest, every acquire refuses the key, with
    // nothing written: the foreign member must go before the semaphore
    // works again.
    assert_eq!(
        low.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    let before: Vec<String> = raw(&mut conn, &["ZRANGE", &key, "0", "-1"]).await;
    assert!(
        sem.acquire(&mut conn, &key).await.is_err(),
        "a foreign lowest member is refused"
    );
    let after: Vec<String> = raw(&mut conn, &["ZRANGE", &key, "0", "-1"]).await;
    assert_eq!(before, after, "nothing written");
    let _: i64 = raw(&mut conn, &["ZREM", &key, "worker-1"]).await;
    let again = permit(sem.acquire(&mut conn, &key).await.unwrap());
    for p in [again, high] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
}

/// Work that stalls the runtime past its permit's TTL (no renewal can run)
/// finishes, and the answer says the hold was lost: `Work::Overran`.
#[test]
fn work_stalled_past_its_ttl_is_told_it_overran() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = server.conn().await;
        let key = format!("{}s", prefix("stall"));
        let sem = Semaphore::new(1, 200 * MS).unwrap();
        let out = sem
            .with_permit(conn, &key, |_| async {
                // A GC pause, a stuck VM: the whole runtime stops.
                std::thread::sleep(400 * MS);
                7
            })
            .await
            .unwrap();
        assert!(
            matches!(out, nolock::Work::Overran { output: 7, .. }),
            "{out:?}"
        );
    });
}

/// Every semaphore call that sleeps answers `NoTimer` on a runtime built
/// without timers, before any I/O, and never panics.
#[test]
fn a_runtime_without_timers_gets_no_timer_never_a_panic() {
    let server = RedisServer::start();
    let (io_only, _driver, conn) = support::io_only_runtime_and_conn(&server);
    io_only.block_on(async {
        let mut conn = conn;
        let key = format!("{}s", prefix("no_timer"));
        let waiting = Semaphore::new(1, MINUTE)
            .unwrap()
            .with_wait(Backoff::new(Duration::from_secs(1)));
        assert!(matches!(
            waiting.acquire(&mut conn, &key).await,
            Err(Error::NoTimer)
        ));
        let once = Semaphore::new(1, MINUTE).unwrap();
        assert!(matches!(
            once.lease(conn.clone(), &key).await,
            Err(Error::NoTimer)
        ));
        assert!(matches!(
            once.with_permit(conn.clone(), &key, |_| async {}).await,
            Err(Error::NoTimer)
        ));
        let p = permit(once.acquire(&mut conn, &key).await.unwrap());
        assert!(matches!(
            PermitLease::start(conn.clone(), p),
            Err(Error::NoTimer)
        ));
        assert_eq!(semaphore::peek(&mut conn, &key).await.unwrap().in_use, 1);
    });
}
