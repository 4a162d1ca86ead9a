//! Server time per semaphore call, from `INFO commandstats`.
//!
//! ```text
//! cargo run --release --example semaphore_cost            # own redis-server, 5000 calls per row
//! cargo run --release --example semaphore_cost -- 20000
//! ```
//!
//! Each row resets the server's statistics (`CONFIG RESETSTAT`), sends its
//! calls one by one, and reads `usec_per_call` of the command they used
//! (`EVALSHA`, or `INCR` for the baseline): server CPU only, no network.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use nolock::semaphore::{self, Permit, Semaphore};
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(600);

async fn usec_per_call(conn: &mut MultiplexedConnection, cmd: &str) -> redis::RedisResult<f64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let needle = format!("cmdstat_{cmd}:");
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN))
}

async fn reset(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    redis::cmd("CONFIG").arg("RESETSTAT").exec_async(conn).await
}

fn acquired(outcome: semaphore::PermitAttempt) -> Result<Permit, Box<dyn std::error::Error>> {
    outcome.acquired().ok_or_else(|| "expected a permit".into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 5_000,
    };
    let (url, _server) = server::url_from_env_or_start();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    nolock::Scripts::load(&mut conn).await?;
    let p = format!("nolock-semaphore-cost:{}:", std::process::id());
    let mut rows: Vec<(String, f64)> = Vec::new();

    reset(&mut conn).await?;
    for i in 0..n {
        redis::cmd("INCR")
            .arg(format!("{p}incr:{i}"))
            .exec_async(&mut conn)
            .await?;
    }
    rows.push((
        "INCR (baseline)".into(),
        usec_per_call(&mut conn, "incr").await?,
    ));

    reset(&mut conn).await?;
    for i in 0..n {
        let _ = nolock::limits::try_increment(&mut conn, &format!("{p}count:{i}"), 10, TTL).await?;
    }
    rows.push((
        "limits::try_increment (admitted)".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));

    reset(&mut conn).await?;
    let mut empty = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("{p}empty:{i}");
        empty.push((
            acquired(Semaphore::new(10, TTL)?.acquire(&mut conn, &key).await?)?,
            key,
        ));
    }
    rows.push((
        "acquire, empty semaphore of 10".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));

    // Semaphores with 9 of 10 permits held: the 10th is admitted.
    let keys = n.min(2_000);
    for i in 0..keys {
        for _ in 0..9 {
            let _ = Semaphore::new(10, TTL)?
                .acquire(&mut conn, &format!("{p}nine:{i}"))
                .await?;
        }
    }
    reset(&mut conn).await?;
    for i in 0..keys {
        let _ = acquired(
            Semaphore::new(10, TTL)?
                .acquire(&mut conn, &format!("{p}nine:{i}"))
                .await?,
        )?;
    }
    rows.push((
        "acquire, 9 of 10 held (admitted)".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));

    reset(&mut conn).await?;
    for i in 0..n {
        let full = Semaphore::new(10, TTL)?
            .acquire(&mut conn, &format!("{p}nine:{}", i % keys))
            .await?;
        if full.is_acquired() {
            return Err("expected a full semaphore".into());
        }
    }
    rows.push((
        "acquire, 10 of 10 held (full)".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));

    reset(&mut conn).await?;
    for (permit, _key) in empty.iter_mut() {
        let _ = permit.extend(&mut conn).await?;
    }
    rows.push(("extend".into(), usec_per_call(&mut conn, "evalsha").await?));

    reset(&mut conn).await?;
    for i in 0..n {
        let _ = semaphore::peek(&mut conn, &format!("{p}nine:{}", i % keys)).await?;
    }
    rows.push((
        "peek, 10 held".into(),
        usec_per_call(&mut conn, "evalsha_ro").await?,
    ));

    reset(&mut conn).await?;
    for (permit, _key) in empty {
        let _ = permit.release(&mut conn).await?;
    }
    rows.push((
        "release (last permit: key deleted)".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));

    // Fenced permits (Semaphore::fenced): a seat and a slot fence per grant.
    let fenced = Semaphore::new(10, TTL)?.fenced();
    reset(&mut conn).await?;
    let mut seated = Vec::with_capacity(n);
    for i in 0..n {
        seated.push(acquired(
            fenced.acquire(&mut conn, &format!("{p}fenced:{i}")).await?,
        )?);
    }
    rows.push((
        "fenced acquire, empty semaphore of 10".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));
    for i in 0..keys {
        for _ in 0..9 {
            let _ = fenced
                .acquire(&mut conn, &format!("{p}fenced-nine:{i}"))
                .await?;
        }
    }
    reset(&mut conn).await?;
    for i in 0..keys {
        let _ = acquired(
            fenced
                .acquire(&mut conn, &format!("{p}fenced-nine:{i}"))
                .await?,
        )?;
    }
    rows.push((
        "fenced acquire, 9 of 10 held (admitted)".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));
    reset(&mut conn).await?;
    for permit in &seated {
        if !permit.write(&mut conn, "v").await?.is_applied() {
            return Err("expected the write to apply".into());
        }
    }
    rows.push((
        "fenced write (the seat's value)".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));
    reset(&mut conn).await?;
    for permit in seated.iter_mut() {
        let _ = permit.extend(&mut conn).await?;
    }
    rows.push((
        "fenced extend".into(),
        usec_per_call(&mut conn, "evalsha").await?,
    ));

    println!("server time per call (usec_per_call from INFO commandstats), {n} calls per row:");
    for (what, usec) in rows {
        println!("  {what:<40} {usec:>6.2} µs");
    }
    // Every key this run wrote starts with the prefix; leave the rest alone.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{p}*"))
        .query_async(&mut conn)
        .await?;
    for chunk in keys.chunks(1000) {
        redis::cmd("UNLINK")
            .arg(chunk)
            .exec_async(&mut conn)
            .await?;
    }
    Ok(())
}
