//! A fenced write to PostgreSQL: a worker paused past its lease cannot pay twice.
//!
//! ```text
//! cargo run --example fenced_postgres
//! DATABASE_URL="host=127.0.0.1 user=postgres dbname=test" REDIS_URL=redis://127.0.0.1/ \
//!     cargo run --example fenced_postgres
//! ```
//!
//! Starts its own redis-server unless `REDIS_URL` is set; uses PostgreSQL at
//! `DATABASE_URL` (default: 127.0.0.1:5432, database `test`, user `postgres`)
//! with a temporary table, so it leaves nothing behind.
//!
//! Worker A takes the lease on `payout:7` and stalls (a GC pause, a slow
//! call) past its TTL. Worker B takes the lease over, gets a higher fence, and
//! pays. When A wakes up and sends its payment, the fenced `UPDATE` matches
//! zero rows: the database, not the lock, refuses the stale holder.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use nolock::fence::{self, AdvanceAttempt, Lock, LockAttempt, LockRelease};
use nolock::{Backoff, Work};
use tokio_postgres::NoTls;

/// The whole pattern: write only if no newer grant has written.
const PAY: &str = "UPDATE payouts SET status = $1, fence = $2 WHERE id = $3 AND fence < $2";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (redis_url, _server) = server::url_from_env_or_start();
    let redis = redis::Client::open(redis_url.as_str())?;
    let mut conn = redis.get_multiplexed_async_connection().await?;

    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned());
    let (db, connection) = tokio_postgres::connect(&database_url, NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TEMP TABLE payouts (
             id     bigint PRIMARY KEY,
             status text   NOT NULL,
             fence  bigint NOT NULL DEFAULT 0   -- the fence of the last write
         );
         INSERT INTO payouts (id, status) VALUES (7, 'pending');",
    )
    .await?;

    let resource = format!("payout:7:{}", std::process::id());
    let ttl = Duration::from_millis(300);

    // At startup: the Redis counter must be above every fence the database
    // has seen (it could have gone back in a restart without persistence).
    let report = fence::durability(&mut conn).await?;
    if report.fences_can_go_back() {
        println!("note: {}", report.reasons().join("; "));
    }
    let seen: i64 = db
        .query_one("SELECT coalesce(max(fence), 0) FROM payouts", &[])
        .await?
        .get(0);
    // Every replica runs this: `advance` never raises the counter under a
    // live holder (another replica's work would turn stale).
    if let Ok(seen @ 1..) = u64::try_from(seen) {
        match fence::advance(&mut conn, &resource, seen).await? {
            AdvanceAttempt::Advanced(advanced) => {
                println!("counter at {} (database has seen {seen})", advanced.counter);
            }
            // A live holder took the newest grant: the next one is above `seen`.
            AdvanceAttempt::Held { counter, .. } if counter >= seen => {}
            // The counter went back under a live holder, whose fence is below
            // `seen`: the database refuses it already; raise the counter anyway.
            AdvanceAttempt::Held { .. } => {
                let forced = fence::force_advance(&mut conn, &resource, seen).await?;
                println!(
                    "counter forced to {} (database has seen {seen})",
                    forced.counter
                );
            }
        }
    }

    // Every worker shares one configuration: the lease's TTL and how long
    // to wait for it.
    let payouts = Lock::new(ttl)?.with_wait(Backoff::new(Duration::from_secs(2)));

    // Worker A: takes the lease, then stalls past its TTL before paying.
    let LockAttempt::Acquired(a) = payouts.acquire(&mut conn, &resource).await? else {
        return Err("payout:7 is locked by someone else".into());
    };
    println!("A: lease acquired, fence {}", a.fence().number());
    println!("A: ... paused for 500 ms (GC, slow provider call) ...");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Worker B: the lease has expired, so B gets it, with a higher fence.
    let paid_by_b = payouts
        .with_lease(conn.clone(), &resource, |fence| {
            let db = &db;
            async move {
                println!("B: lease acquired, fence {}", fence.number());
                let fence = fence.as_i64(); // Redis fences fit a bigint
                let rows = db.execute(PAY, &[&"paid by B", &fence, &7i64]).await?;
                println!("B: UPDATE with fence {fence}: {rows} row(s)");
                Ok::<bool, Box<dyn std::error::Error>>(rows == 1)
            }
        })
        .await?;
    let Work::Done(paid_by_b) = paid_by_b else {
        return Err(format!("B did not pay under a held lease: {paid_by_b:?}").into());
    };
    assert!(paid_by_b?);

    // Worker A wakes up and pays as if it still held the lease.
    let fence_a = a.fence().as_i64();
    let rows = db.execute(PAY, &[&"paid by A", &fence_a, &7i64]).await?;
    println!("A: UPDATE with fence {fence_a}: {rows} row(s): fenced out, nothing paid twice");
    let released = a.release(&mut conn).await?;
    println!("A: release: {released:?} (B's lock, if any, was left alone)");
    assert_eq!((rows, released), (0, LockRelease::Lost));

    let row = db
        .query_one("SELECT status, fence FROM payouts WHERE id = 7", &[])
        .await?;
    println!(
        "payout 7: status = {:?}, fence = {}",
        row.get::<_, String>(0),
        row.get::<_, i64>(1)
    );
    // The fence counter has no TTL by design; this demo's is not needed again.
    let _: () = redis::cmd("DEL")
        .arg(nolock::keys::derive(&resource, "fence"))
        .query_async(&mut conn)
        .await?;
    Ok(())
}
