//! 200 tasks over 8 connections hammer one limiter for a few windows; the
//! admissions, placed in time by the server-reported `at` of each decision
//! (the same `TIME` reading the script decided with), never exceed what the
//! algorithm allows. The bounds are exact: no slack for scheduling is needed,
//! because nothing here depends on when the client sent a request.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use nolock::rate::{Algorithm, Limiter, MultiKey, MultiLimiter, Quota, RateLimit};
use support::prefix;

const TASKS: usize = 200;
const CONNECTIONS: usize = 8;
const RUN_FOR: Duration = Duration::from_millis(300);
/// Bounds the work per task whatever the machine's speed.
const MAX_CALLS_PER_TASK: usize = 200;

#[derive(Clone)]
enum Target {
    One(Limiter, String),
    Many(MultiLimiter, String, String),
}

impl Target {
    async fn call(&self, conn: &mut redis::aio::MultiplexedConnection) -> (bool, Vec<RateLimit>) {
        match self {
            Target::One(limiter, key) => {
                let d = limiter.check(conn, key, 1).await.unwrap();
                (d.allowed, vec![*d])
            }
            Target::Many(limits, key, shared) => {
                let key = MultiKey::new(key).shared("slow", shared);
                let d = limits.check(conn, key, 1).await.unwrap();
                (d.allowed, d.limits)
            }
        }
    }
}

/// Every decision of every task: (admitted, per-limit answers).
async fn hammer(target: Target) -> Vec<(bool, Vec<RateLimit>)> {
    let redis = support::redis();
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(redis.conn().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let mut conn = conns[i % CONNECTIONS].clone();
        let (target, barrier) = (target.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let start = Instant::now();
            let mut out = Vec::new();
            while start.elapsed() < RUN_FOR && out.len() < MAX_CALLS_PER_TASK {
                out.push(target.call(&mut conn).await);
            }
            out
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    for (allowed, limits) in &all {
        assert_eq!(*allowed, limits.iter().all(|l| l.allowed), "all or nothing");
        assert!(limits.iter().all(|l| l.at == limits[0].at));
    }
    let denied = all.iter().filter(|(allowed, _)| !allowed).count();
    assert!(denied > 0, "the limiter was pushed past its limit");
    all
}

fn micros(limit: &RateLimit) -> u64 {
    limit.at.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

/// GCRA and token bucket: any `n` admissions within `d` satisfy
/// `n <= burst + floor(d / T)`.
fn assert_bucket_bound(mut admitted_at: Vec<u64>, quota: &Quota, what: &str) {
    admitted_at.sort_unstable();
    let t = quota.emission_interval().as_micros() as u64;
    let n = admitted_at.len();
    assert!(
        n as u64 > quota.burst(),
        "{what}: units came back during the run ({n})"
    );
    for i in 0..n {
        for j in i..n {
            let allowed = quota.burst() + (admitted_at[j] - admitted_at[i]) / t;
            assert!(
                (j - i + 1) as u64 <= allowed,
                "{what}: {} admitted within {} µs, at most {allowed} allowed",
                j - i + 1,
                admitted_at[j] - admitted_at[i]
            );
        }
    }
}

async fn bucket(algorithm: Algorithm) {
    // 5 per 50 ms, burst 5: one unit every 10 ms.
    let quota = Quota::per(5, Duration::from_millis(50)).unwrap();
    let key = format!("{}{algorithm}", prefix("hammer"));
    let all = hammer(Target::One(Limiter::new(algorithm, quota).unwrap(), key)).await;
    let admitted = all
        .iter()
        .filter(|(a, _)| *a)
        .map(|(_, l)| micros(&l[0]))
        .collect();
    assert_bucket_bound(admitted, &quota, algorithm.name());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_never_admits_more_than_burst_plus_rate() {
    bucket(Algorithm::Gcra).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_never_admits_more_than_burst_plus_rate() {
    bucket(Algorithm::TokenBucket).await;
}

/// Sliding window: in each aligned window at most `limit` pass, and at every
/// admission `previous × (w - e) + count × w <= limit × w`, counting this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_never_passes_its_weighted_limit() {
    let (limit, w) = (10u64, 100u64);
    let quota = Quota::per(limit, Duration::from_millis(w)).unwrap();
    let key = format!("{}sliding", prefix("hammer"));
    let limiter = Limiter::new(Algorithm::SlidingWindow, quota).unwrap();
    let all = hammer(Target::One(limiter, key)).await;
    let mut admitted: Vec<u64> = all
        .iter()
        .filter(|(a, _)| *a)
        .map(|(_, l)| micros(&l[0]) / 1000)
        .collect();
    admitted.sort_unstable();
    let windows: Vec<u64> = admitted.iter().map(|ms| ms / w).collect();
    assert!(
        windows.last() > windows.first(),
        "the run spanned several windows"
    );
    for (i, ms) in admitted.iter().enumerate() {
        let k = ms / w;
        let e = ms - k * w;
        let count = windows[..=i].iter().filter(|&&x| x == k).count() as u64;
        let previous = windows.iter().filter(|&&x| x + 1 == k).count() as u64;
        assert!(count <= limit, "window {k}: {count} admitted");
        assert!(
            previous * (w - e) + count * w <= limit * w,
            "at {ms} ms: previous {previous}, count {count}, {e} ms into the window"
        );
    }
}

/// Fixed window: admissions grouped by their window's end (`at` + `reset_after`,
/// exact in ms) number at most `limit`, and lie inside that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_never_passes_its_limit_per_window() {
    let (limit, w) = (10u64, 100u64);
    let quota = Quota::per(limit, Duration::from_millis(w)).unwrap();
    let key = format!("{}fixed", prefix("hammer"));
    let limiter = Limiter::new(Algorithm::FixedWindow, quota).unwrap();
    let all = hammer(Target::One(limiter, key)).await;
    let mut by_end = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for (_, l) in all.iter().filter(|(a, _)| *a) {
        let ms = micros(&l[0]) / 1000;
        by_end
            .entry(ms + l[0].reset_after.as_millis() as u64)
            .or_default()
            .push(ms);
    }
    assert!(by_end.len() >= 2, "the run spanned several windows");
    let mut last_end = 0;
    for (end, members) in &by_end {
        assert!(
            members.len() as u64 <= limit,
            "window ending {end}: {}",
            members.len()
        );
        assert!(
            members.iter().all(|ms| ms + w >= *end && ms < end),
            "inside the window"
        );
        assert!(*end >= last_end + w, "windows do not overlap");
        last_end = *end;
    }
}

/// Two GCRA limits in one call (one per user, one shared): each limit's bound
/// holds on the calls admitted by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_limit_keeps_every_bound() {
    let fast = Quota::per(5, Duration::from_millis(50)).unwrap();
    let slow = Quota::per(10, Duration::from_millis(400)).unwrap();
    let tag = prefix("hammer_multi");
    let limits = MultiLimiter::new(Algorithm::Gcra)
        .limit("fast", fast)
        .unwrap()
        .shared_limit("slow", slow)
        .unwrap();
    let target = Target::Many(limits, format!("{{{tag}}}:user"), format!("{{{tag}}}:all"));
    let all = hammer(target).await;
    let admitted: Vec<u64> = all
        .iter()
        .filter(|(a, _)| *a)
        .map(|(_, l)| micros(&l[0]))
        .collect();
    assert_bucket_bound(admitted.clone(), &fast, "fast");
    assert_bucket_bound(admitted, &slow, "slow");
    assert!(
        all.iter().any(|(_, l)| l[0].allowed && !l[1].allowed),
        "the shared limit denied while the fast one had room"
    );
}
