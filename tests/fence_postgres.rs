//! Fenced writes to PostgreSQL: the resource, not the lock, stops a holder
//! that was paused past its lease.
//!
//! Needs PostgreSQL at `$DATABASE_URL` (default: 127.0.0.1:5432, database
//! `test`, user `postgres`, trust auth). `.ci/test` starts it. Under `CI=true`
//! an unreachable server fails the tests; elsewhere they are skipped with a
//! message. Each test works in its own schema, dropped at the end, so parallel
//! runs never collide.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nolock::fence::{self, Lock, LockAttempt, LockRelease};
use nolock::Backoff;
use support::postgres::{connect, with_schema};

/// The pattern the module docs teach, verbatim.
const FENCED_UPDATE: &str =
    "UPDATE payouts SET status = $1, fence = $2 WHERE id = $3 AND fence < $2";

/// The test schema's tables (`{schema}` is its name).
const TABLES: &str = "CREATE TABLE {schema}.payouts ( id bigint PRIMARY KEY, status text NOT NULL, fence bigint NOT NULL DEFAULT 0 );";

fn grant(outcome: LockAttempt) -> fence::Grant {
    match outcome {
        LockAttempt::Acquired(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}

fn pg_fence(grant: &fence::Grant) -> i64 {
    grant.fence().as_i64()
}

#[tokio::test]
async fn a_paused_holder_updates_zero_rows() {
    with_schema("paused", TABLES, |schema| async move {
        let redis = support::redis();
        let mut conn = redis.conn().await;
        // Two services, each with its own database session.
        let db_a = connect(Some(&schema)).await.unwrap();
        let db_b = connect(Some(&schema)).await.unwrap();
        db_a.execute(
            "INSERT INTO payouts (id, status) VALUES (7, 'pending')",
            &[],
        )
        .await
        .unwrap();
        let resource = format!("{}payout:7", support::prefix("pg_paused"));
        let ttl = Duration::from_millis(200);

        // A takes the lease, then is paused past its TTL before it writes.
        let a = grant(
            nolock::fence::Lock::new(ttl)
                .expect("a valid lock TTL")
                .acquire(&mut conn, &resource)
                .await
                .unwrap(),
        );
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;

        // B takes over and pays.
        let b = grant(
            Lock::new(ttl)
                .unwrap()
                .with_wait(Backoff::new(Duration::from_secs(5)))
                .acquire(&mut conn, &resource)
                .await
                .unwrap(),
        );
        assert!(b.fence().number() > a.fence().number());
        let rows = db_b
            .execute(FENCED_UPDATE, &[&"paid by B", &pg_fence(&b), &7i64])
            .await
            .unwrap();
        assert_eq!(rows, 1, "B's write lands");

        // A wakes up and tries to pay again: zero rows, nothing changes.
        let rows = db_a
            .execute(FENCED_UPDATE, &[&"paid by A", &pg_fence(&a), &7i64])
            .await
            .unwrap();
        assert_eq!(rows, 0, "A's stale write is refused by the database");
        assert_eq!(a.release(&mut conn).await.unwrap(), LockRelease::Lost);

        let row = db_a
            .query_one("SELECT status, fence FROM payouts WHERE id = 7", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "paid by B");
        assert_eq!(row.get::<_, i64>(1), pg_fence(&b));

        // `fence < $2` is strict: the same grant cannot update the row twice.
        let rows = db_b
            .execute(FENCED_UPDATE, &[&"paid by B again", &pg_fence(&b), &7i64])
            .await
            .unwrap();
        assert_eq!(rows, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_in_turn_each_update_the_row_exactly_once() {
    with_schema("turns", TABLES, |schema| async move {
        const WORKERS: usize = 12;
        let redis = support::redis();
        let conn = redis.conn().await;
        let db = Arc::new(connect(Some(&schema)).await.unwrap());
        db.execute("INSERT INTO payouts (id, status) VALUES (1, '0')", &[])
            .await
            .unwrap();
        let resource = format!("{}payout:1", support::prefix("pg_turns"));
        let updated = Arc::new(AtomicUsize::new(0));
        let backoff = Backoff {
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(20),
            ..Backoff::new(Duration::from_secs(30))
        };

        let payouts = Lock::new(Duration::from_secs(10))
            .unwrap()
            .with_wait(backoff);
        let mut tasks = Vec::new();
        for _ in 0..WORKERS {
            let (conn, db, resource, updated, payouts) = (
                conn.clone(),
                db.clone(),
                resource.clone(),
                updated.clone(),
                payouts.clone(),
            );
            tasks.push(tokio::spawn(async move {
                payouts
                    .with_lease(conn, &resource, |fence| async move {
                        // Read-modify-write under the lease; the fence makes a
                        // stale holder's write a no-op instead of a lost update.
                        let row = db
                            .query_one("SELECT status FROM payouts WHERE id = 1", &[])
                            .await
                            .unwrap();
                        let n: u32 = row.get::<_, String>(0).parse().unwrap();
                        let rows = db
                            .execute(
                                FENCED_UPDATE,
                                &[&(n + 1).to_string(), &fence.as_i64(), &1i64],
                            )
                            .await
                            .unwrap();
                        updated.fetch_add(rows as usize, Ordering::SeqCst);
                    })
                    .await
                    .unwrap()
                    .done()
                    .expect("acquired within the wait, and held to the end");
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(updated.load(Ordering::SeqCst), WORKERS);
        let row = db
            .query_one("SELECT status, fence FROM payouts WHERE id = 1", &[])
            .await
            .unwrap();
        assert_eq!(
            row.get::<_, String>(0),
            WORKERS.to_string(),
            "no lost update"
        );
        assert_eq!(
            row.get::<_, i64>(1),
            WORKERS as i64,
            "the last of fences 1..=12"
        );
    })
    .await;
}
