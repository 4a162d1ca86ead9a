//! Decisions per second of the local fallback (`OnFailure::Local`) while
//! Redis is down, with its key table empty and full.
//!
//! ```text
//! cargo run --release --example local_fallback_cost
//! ```
//!
//! The fallback keeps at most 100 000 keys. A flood of new keys during an
//! outage is the case it exists for: once the table is full, each new key
//! forgets the key whose limiter is full again soonest (found in an index
//! ordered by that time, O(log n)), or is denied when none is. The table
//! prints decisions per second for known keys, for new keys into an empty
//! table, and for new keys into a full one (with and without keys to
//! forget); the three should be of one order.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use nolock::policy::{Guard, OnFailure};
use nolock::rate::{Algorithm, Limiter, Quota};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, Value};

/// Redis is down: every request fails at once.
struct Down;

impl ConnectionLike for Down {
    fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async { Err((ErrorKind::Io, "down").into()) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a Pipeline,
        _: usize,
        _: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Err((ErrorKind::Io, "down").into()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

const TABLE: usize = 100_000;

async fn rate(guard: &Guard, limiter: &Limiter, keys: impl Iterator<Item = String>) -> f64 {
    let mut conn = Down;
    let start = Instant::now();
    let mut n = 0u64;
    for key in keys {
        let _ = guard
            .check(limiter, &mut conn, &key, 1)
            .await
            .expect("valid input");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> nolock::Result<()> {
    let one = NonZeroU32::MIN;
    let hourly = Limiter::new(Algorithm::Gcra, Quota::per_hour(1)?)?;
    let brief = Limiter::new(Algorithm::Gcra, Quota::per(1, Duration::from_millis(1))?)?;
    println!("| local fallback, {TABLE} keys at most | decisions/s |\n|---|---:|");

    let guard = Guard::new(
        Duration::from_millis(50),
        OnFailure::Local { replicas: one },
    )?;
    let fill = rate(&guard, &hourly, (0..TABLE).map(|i| format!("k{i}"))).await;
    println!("| new keys into an empty table (filling it) | {fill:.0} |");
    let known = rate(&guard, &hourly, (0..TABLE).map(|i| format!("k{i}"))).await;
    println!("| known keys, table full | {known:.0} |");
    let refused = rate(&guard, &hourly, (0..TABLE).map(|i| format!("new{i}"))).await;
    println!("| new keys, table full, none to forget (denied) | {refused:.0} |");

    let guard = Guard::new(
        Duration::from_millis(50),
        OnFailure::Local { replicas: one },
    )?;
    let _ = rate(&guard, &brief, (0..TABLE).map(|i| format!("k{i}"))).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let evicting = rate(&guard, &brief, (0..TABLE).map(|i| format!("new{i}"))).await;
    println!("| new keys, table full, each forgetting one | {evicting:.0} |");
    Ok(())
}
