//! A contended lock: `WAITERS` tasks take one lock in turn, hold it `HOLD`,
//! release it, and queue again. Measured: grants per second, and the handoff
//! gap from a holder sending its release to the next holder's grant.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{self, Acquire, Backoff, Token};
use redis::aio::MultiplexedConnection;

use crate::measure::Error;
use crate::subjects::{Conns, TTL};

pub const WAITERS: usize = 64;
pub const HOLD: Duration = Duration::from_millis(1);

/// The two waiting acquires compared.
#[derive(Clone)]
pub enum Locker {
    /// `fence::acquire_with_retry` with `Backoff::new(30 s)` (its default delays).
    Nolock(MultiplexedConnection),
    /// rslock's `acquire_no_guard`: `lock` retried until it succeeds (3 tries
    /// 0–200 ms apart per `lock`, its defaults).
    Rslock(rslock::LockManager),
}

enum Held {
    Nolock(Token),
    Rslock(rslock::Lock),
}

impl Locker {
    pub fn all(conns: &Conns) -> [(&'static str, Locker); 2] {
        [
            (
                "fence::acquire_with_retry",
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
                let wait = Backoff::new(Duration::from_secs(30));
                match fence::acquire_with_retry(conn, key, TTL, &wait).await? {
                    Acquire::Acquired(grant) => Ok(Held::Nolock(grant.token)),
                    Acquire::Held { .. } => Err(format!("{key} still held after 30 s").into()),
                }
            }
            Locker::Rslock(manager) => Ok(Held::Rslock(manager.acquire_no_guard(key, TTL).await?)),
        }
    }

    async fn release(&mut self, key: &str, held: Held) -> Result<(), Error> {
        match (self, held) {
            (Locker::Nolock(conn), Held::Nolock(token)) => {
                let _ = fence::release(conn, key, &token).await?;
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
    pub p50: Duration,
    pub p99: Duration,
}

/// `WAITERS` tasks cycle through the lock on `key` for `duration`.
pub async fn run(locker: &Locker, key: &str, duration: Duration) -> Result<Handoff, Error> {
    // When the last holder sent its release; the next grant takes it.
    let released: Arc<Mutex<Option<Instant>>> = Arc::default();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let (mut locker, key, released) = (locker.clone(), key.to_owned(), released.clone());
        tasks.push(tokio::spawn(async move {
            let mut gaps = Vec::new();
            while start.elapsed() < duration {
                let held = locker.acquire(&key).await?;
                let granted = Instant::now();
                if let Some(at) = released.lock().map_err(|_| "poisoned")?.take() {
                    gaps.push(granted - at);
                }
                tokio::time::sleep(HOLD).await;
                *released.lock().map_err(|_| "poisoned")? = Some(Instant::now());
                locker.release(&key, held).await?;
            }
            Ok::<_, Error>(gaps)
        }));
    }
    let mut gaps = Vec::new();
    for task in tasks {
        gaps.extend(task.await??);
    }
    let elapsed = start.elapsed();
    if gaps.is_empty() {
        return Err("no handoff happened".into());
    }
    gaps.sort();
    Ok(Handoff {
        grants_per_s: (gaps.len() + 1) as f64 / elapsed.as_secs_f64(),
        p50: gaps[gaps.len() / 2],
        p99: gaps[gaps.len() * 99 / 100],
    })
}
