//! What an operation id costs the server: time per call with and without
//! an id, and the memory of one record.
//!
//! ```text
//! cargo run --release --example idempotency_cost            # own redis-server
//! cargo run --release --example idempotency_cost -- 20000   # calls per row per round
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --example idempotency_cost
//! ```
//!
//! Every row is one kind of call, sent `n` times one after the other; its
//! time is `usec_per_call` of `EVALSHA` in `INFO commandstats` after a
//! `CONFIG RESETSTAT` (server CPU only, no network). The rows take turns,
//! and the table is measured `ROUNDS` times, so that a load change on a
//! shared machine hits every row alike; the median and the minimum over
//! the rounds are printed, and each id'd row as a ratio of its plain row.
//!
//! * "plain": the call as before this feature, same script and SHA1;
//! * "id, first": a new id per call: the variant runs the script and writes
//!   its record;
//! * "id, resend": one id for every call: all but the first are answered
//!   from the record, nothing else is read or written.
//!
//! Memory per record: `MEMORY USAGE` of records of both kinds, and the
//! growth of `used_memory` over all the records written, per record.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nolock::limits::TryIncrement;
use nolock::rate::{Algorithm, Check, Limiter, Quota};
use nolock::retry::{retry, RetryPolicy};
use nolock::Operation;
use redis::aio::MultiplexedConnection;

type Error = Box<dyn std::error::Error + Send + Sync>;

const ROUNDS: usize = 5;
const HOUR: Duration = Duration::from_secs(3600);

/// Fresh ids across rows and rounds.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// How a row builds the call it sends `n` times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Id {
    None,
    Fresh,
    Resend,
}

impl Id {
    fn label(self) -> &'static str {
        match self {
            Id::None => "plain",
            Id::Fresh => "id, first",
            Id::Resend => "id, resend",
        }
    }

    /// `op` with the id this row gives it, its output dropped.
    fn apply<O: Operation + 'static>(self, op: O) -> Result<Op, Error> {
        Ok(match self {
            Id::None => Box::new(op.map(drop)),
            Id::Fresh => Box::new(
                op.idempotent(format!("fresh-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)))?
                    .map(drop),
            ),
            Id::Resend => Box::new(op.idempotent("resend")?.map(drop)),
        })
    }
}

type Op = Box<dyn Operation<Output = ()>>;

/// One call, sent once (a policy of one attempt: `retry` here is only the
/// way to run any operation value).
async fn send(conn: &mut MultiplexedConnection, op: Op) -> Result<(), Error> {
    let once = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    retry(&once, conn, &op).await?;
    Ok(())
}

async fn reset(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    redis::cmd("CONFIG").arg("RESETSTAT").exec_async(conn).await
}

/// The field `name` (`calls=`, or `:` for the whole value) of the line
/// `prefix...` of `INFO section`.
async fn info_text(
    conn: &mut MultiplexedConnection,
    section: &str,
    prefix: &str,
    name: &str,
) -> Result<String, Error> {
    let info: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    info.lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .flat_map(|rest| rest.split_inclusive([',', ':']))
        .find_map(|field| field.strip_prefix(name))
        .map(|v| v.trim_end_matches([',', ':']).trim().to_owned())
        .ok_or_else(|| format!("no {prefix}{name} in INFO {section}").into())
}

async fn info_field(
    conn: &mut MultiplexedConnection,
    section: &str,
    prefix: &str,
    name: &str,
) -> Result<f64, Error> {
    Ok(info_text(conn, section, prefix, name).await?.parse()?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let n: usize = std::env::args().nth(1).map_or(Ok(5_000), |n| n.parse())?;
    let (url, _server) = server::url_from_env_or_start();
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    nolock::Scripts::load(&mut conn).await?;
    let version = info_text(&mut conn, "server", "redis_version:", "").await?;
    let p = format!("nolock-idempotency-cost:{}:", std::process::id());
    let counter = format!("{p}counter");
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(1_000_000)?)?;
    let rl = format!("{p}gcra");

    let ids = [Id::None, Id::Fresh, Id::Resend];
    // rows[op][id][round]
    let mut times = vec![vec![Vec::new(); ids.len()]; 2];
    for _ in 0..ROUNDS {
        for (o, op) in ["try_increment", "GCRA check"].into_iter().enumerate() {
            for (i, &id) in ids.iter().enumerate() {
                reset(&mut conn).await?;
                for _ in 0..n {
                    if o == 0 {
                        let call = TryIncrement::new(
                            &nolock::limits::Counter::new(1 << 50, HOUR)?,
                            &counter,
                        )?;
                        send(&mut conn, id.apply(call)?).await?;
                    } else {
                        send(&mut conn, id.apply(Check::new(&limiter, &rl, 1)?)?).await?;
                    }
                }
                let calls =
                    info_field(&mut conn, "commandstats", "cmdstat_evalsha", "calls=").await?;
                if calls as usize != n {
                    return Err(format!("{op}: {calls} EVALSHA counted for {n} calls").into());
                }
                times[o][i].push(
                    info_field(
                        &mut conn,
                        "commandstats",
                        "cmdstat_evalsha",
                        "usec_per_call=",
                    )
                    .await?,
                );
            }
        }
    }

    println!("redis {version}; {n} calls per row per round, {ROUNDS} rounds; server µs per call (EVALSHA)");
    println!();
    println!("| operation | id | median µs/call | min µs/call | median / plain |");
    println!("|---|---|---|---|---|");
    for (o, op) in ["limits::try_increment", "rate GCRA check"]
        .into_iter()
        .enumerate()
    {
        let plain = median(&times[o][0]);
        for (i, id) in ids.iter().enumerate() {
            let row = &times[o][i];
            println!(
                "| {op} | {} | {:.2} | {:.2} | {:.2} |",
                id.label(),
                median(row),
                row.iter().copied().fold(f64::INFINITY, f64::min),
                median(row) / plain
            );
        }
    }

    // Memory: one record of each kind, and the average over all written.
    println!();
    let before = info_field(&mut conn, "memory", "used_memory:", "").await?;
    let m = 10_000;
    let mut records = Vec::new();
    for i in 0..m {
        let op = TryIncrement::new(&nolock::limits::Counter::new(1 << 50, HOUR)?, &counter)?
            .idempotent(format!("mem-{i}"))?;
        records.push(op.record_key().to_owned());
        send(&mut conn, Box::new(op.map(drop))).await?;
    }
    let after = info_field(&mut conn, "memory", "used_memory:", "").await?;
    let gcra = Check::new(&limiter, &rl, 1)?.idempotent("mem-gcra")?;
    let gcra_key = gcra.record_key().to_owned();
    send(&mut conn, Box::new(gcra.map(drop))).await?;
    for (what, key) in [("try_increment", &records[0]), ("GCRA check", &gcra_key)] {
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        let len: i64 = redis::cmd("STRLEN").arg(key).query_async(&mut conn).await?;
        println!(
            "MEMORY USAGE of a {what} record: {bytes} bytes ({len} bytes of value, key {} bytes)",
            key.len()
        );
    }
    println!(
        "used_memory growth over {m} try_increment records: {:.0} bytes per record",
        (after - before) / m as f64
    );
    Ok(())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
