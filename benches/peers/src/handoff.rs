//! A contended lock: `WAITERS` tasks take one lock in turn, hold it `HOLD`,
//! release it, and queue again. Measured: grants per second, and the handoff
//! gap from a holder sending its release to the grant of another waiter (a
//! releaser that takes the lock straight back is counted apart: its quick
//! re-grant says nothing about how waiters are woken).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{Grant, Lock, LockAttempt};
use nolock::Backoff;
use redis::aio::MultiplexedConnection;

use crate::measure::Error;
use crate::subjects::{Conns, TTL};

pub const WAITERS: usize = 64;
pub const HOLD: Duration = Duration::from_millis(1);

/// The two waiting acquires compared.
#[derive(Clone)]
pub enum Locker {
    /// `fence::Lock::with_wait(Backoff::new(30 s))` (its default delays).
    Nolock(MultiplexedConnection),
    /// rslock's `acquire_no_guard`: `lock` retried until it succeeds (3 tries
    /// 0–200 ms apart per `lock`, its defaults).
    Rslock(rslock::LockManager),
}

enum Held {
    Nolock(Grant),
    Rslock(rslock::Lock),
}

impl Locker {
    pub fn all(conns: &Conns) -> [(&'static str, Locker); 2] {
        [
            (
                "fence::Lock::with_wait",
                Locker::Nolock(conns.nolock.clone()),
            ),
            (
                "rslock acquire (lock retried)",
                Locker::Rslock(rslock::LockManager::new(vec![conns.url.clone()])),
            ),
        ]
    }

    async fn acquire(&mut self, key: &str) -> Result<Held, Error> {
        match self {
            Locker::Nolock(conn) => {
                let lock = Lock::new(TTL)?.with_wait(Backoff::new(Duration::from_secs(30)));
                match lock.acquire(conn, key).await? {
                    LockAttempt::Acquired(grant) => Ok(Held::Nolock(grant)),
                    LockAttempt::Held { .. } => Err(format!("{key} still held after 30 s").into()),
                }
            }
            Locker::Rslock(manager) => Ok(Held::Rslock(manager.acquire_no_guard(key, TTL).await?)),
        }
    }

    async fn release(&mut self, key: &str, held: Held) -> Result<(), Error> {
        match (self, held) {
            (Locker::Nolock(conn), Held::Nolock(grant)) => {
                debug_assert_eq!(grant.resource(), key);
                let _ = grant.release(conn).await?;
            }
            (Locker::Rslock(manager), Held::Rslock(lock)) => manager.unlock(&lock).await,
            _ => return Err("lock from another locker".into()),
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Handoff {
    pub grants_per_s: f64,
    /// Share of the grants that went back to the task that had just released.
    pub retaken: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// `WAITERS` tasks cycle through the lock on `key` for `duration`.
pub async fn run(locker: &Locker, key: &str, duration: Duration) -> Result<Handoff, Error> {
    // Who last sent a release, and when; the next grant takes it.
    let released: Arc<Mutex<Option<(usize, Instant)>>> = Arc::default();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for waiter in 0..WAITERS {
        let (mut locker, key, released) = (locker.clone(), key.to_owned(), released.clone());
        tasks.push(tokio::spawn(async move {
            let (mut gaps, mut grants, mut retaken) = (Vec::new(), 0, 0);
            while start.elapsed() < duration {
                let held = locker.acquire(&key).await?;
                let granted = Instant::now();
                grants += 1;
                match released.lock().map_err(|_| "poisoned")?.take() {
                    Some((by, _)) if by == waiter => retaken += 1,
                    Some((_, at)) => gaps.push(granted - at),
                    None => {}
                }
                tokio::time::sleep(HOLD).await;
                *released.lock().map_err(|_| "poisoned")? = Some((waiter, Instant::now()));
                locker.release(&key, held).await?;
            }
            Ok::<_, Error>((gaps, grants, retaken))
        }));
    }
    let (mut gaps, mut grants, mut retaken) = (Vec::new(), 0, 0);
    for task in tasks {
        let (g, n, r) = task.await??;
        gaps.extend(g);
        grants += n;
        retaken += r;
    }
    let elapsed = start.elapsed();
    if gaps.is_empty() {
        return Err("no handoff happened".into());
    }
    gaps.sort();
    Ok(Handoff {
        grants_per_s: f64::from(grants) / elapsed.as_secs_f64(),
        retaken: f64::from(retaken) / f64::from(grants),
        p50: gaps[gaps.len() / 2],
        p99: gaps[gaps.len() * 99 / 100],
    })
}
