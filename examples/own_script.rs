//! Your own Lua scripts through nolock's engine: a leaderboard.
//!
//! The scripts live in `examples/lua/leaderboard/` (in your crate: `lua/`),
//! are embedded at compile time with `nolock::scripts!`, use nolock's
//! helpers (`--@include lib/args`, `lib/fail`), and are called typed, alone
//! and in a `Batch` next to nolock's own operations. Then the cost of a
//! script cache miss is counted by the server (`INFO commandstats`) for
//! nolock and for redis-rs's `Script`.
//!
//! ```text
//! cargo run --example own_script
//! ```
//!
//! Starts its own `redis-server` (needs it on the PATH), unless `REDIS_URL`
//! is set; the miss measurement empties the script cache, so it runs only
//! on the server the example started.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use nolock::limits::{Admission, TryIncrement};
use nolock::script::{Call, ScriptDir};
use nolock::{Batch, Operation, Scripts};
use redis::aio::MultiplexedConnection;

/// In your crate: `nolock::scripts!("$CARGO_MANIFEST_DIR/lua")`.
static SCRIPTS: ScriptDir = nolock::scripts!("$CARGO_MANIFEST_DIR/examples/lua");

/// What one entry of the mixed batch returns.
#[derive(Debug)]
enum Out {
    Quota(Admission),
    Score { score: i64, rank: i64 },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, server) = server::url_from_env_or_start();
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let board = format!("nolock-example:{}:{{weekly}}", std::process::id());

    // Startup: nolock's scripts and yours, in one round trip.
    let loaded = Scripts::load_with(&mut conn, &[&SCRIPTS]).await?;
    println!("loaded {} scripts", loaded.scripts.len());

    // One typed call; the name is checked at compile time.
    let add = nolock::checked_script!(SCRIPTS, "examples/lua", "leaderboard/add")?;
    let (score, rank): (i64, i64) = Call::new(add, &[&board])
        .arg("alice")
        .arg(30)
        .run(&mut conn)
        .await?;
    println!("alice: {score} points, rank {rank}");

    // A script's own check, before its first write: a definite error.
    let refused = Call::<(i64, i64)>::new(add, &[&board])
        .arg("bob")
        .arg(0)
        .run(&mut conn)
        .await;
    if let Err(err) = refused {
        println!("refused (definite: {}): {err}", err.is_definite());
    }

    // nolock's quota check and your script in one batch, one round trip.
    let mut batch: Batch<Box<dyn Operation<Output = Out>>> = Batch::new();
    let entries = [("bob", 20), ("carol", 40), ("bob", 15)];
    for (user, points) in entries {
        let quota = TryIncrement::new(
            &nolock::limits::Counter::new(2, Duration::from_secs(60))?,
            &format!("{board}:quota:{user}"),
        )?;
        batch.push(Box::new(quota.map(Out::Quota)));
        let call = SCRIPTS
            .call::<(i64, i64)>("leaderboard/add", &[&board])?
            .arg(user)
            .arg(points)
            .map(|(score, rank)| Out::Score { score, rank });
        batch.push(Box::new(call));
    }
    let results = batch.run(&mut conn).await;
    for ((user, _), pair) in entries.iter().zip(results.chunks(2)) {
        for result in pair {
            match result {
                Ok(Out::Quota(a)) => print!("{user}: quota {}/{}", a.count, a.limit),
                Ok(Out::Score { score, rank }) => println!(", {score} points, rank {rank}"),
                Err(err) => println!("{user}: {err}"),
            }
        }
    }

    // A read-only script: EVALSHA_RO (a replica may serve it on a cluster).
    let top: Vec<(String, i64)> = SCRIPTS
        .call("leaderboard/top", &[&board])?
        .arg(3)
        .run(&mut conn)
        .await?;
    println!("top 3: {top:?}");

    if server.is_some() {
        miss_costs(&mut conn, &board).await?;
    } else {
        println!(
            "(REDIS_URL set: the miss measurement, which empties the script cache, is skipped)"
        );
    }
    Ok(())
}

/// `SCRIPT FLUSH`, then one call, for nolock and for redis-rs's `Script`,
/// counting what the server received.
async fn miss_costs(conn: &mut MultiplexedConnection, board: &str) -> redis::RedisResult<()> {
    async fn counts(conn: &mut MultiplexedConnection) -> redis::RedisResult<[u64; 3]> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        Ok(["evalsha", "eval", "script|load"].map(|cmd| {
            let needle = format!("cmdstat_{cmd}:calls=");
            info.lines()
                .find_map(|line| line.strip_prefix(&needle))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        }))
    }
    let script = SCRIPTS.get("leaderboard/add").map_err(|e| {
        redis::RedisError::from((redis::ErrorKind::Client, "script", e.to_string()))
    })?;
    let theirs = redis::Script::new(script.source());

    println!("\na script cache miss, counted by the server  [EVALSHA, EVAL, SCRIPT LOAD]");
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(conn).await?;
    let (before, stats) = (counts(conn).await?, nolock::stats());
    let _: (i64, i64) = Call::new(script, &[board])
        .arg("dave")
        .arg(1)
        .run(conn)
        .await
        .map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Client, "nolock", e.to_string()))
        })?;
    let after = counts(conn).await?;
    let fallbacks = nolock::stats().noscript_fallbacks - stats.noscript_fallbacks;
    println!(
        "  nolock Call:      {:?}  2 round trips, counted in nolock::stats(): {fallbacks} fallback",
        [0, 1, 2].map(|i| after[i] - before[i])
    );

    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(conn).await?;
    let before = counts(conn).await?;
    let _: (i64, i64) = theirs
        .key(board)
        .arg("erin")
        .arg(1)
        .invoke_async(conn)
        .await?;
    let after = counts(conn).await?;
    println!(
        "  redis-rs Script:  {:?}  3 round trips, not counted",
        [0, 1, 2].map(|i| after[i] - before[i])
    );
    Ok(())
}
