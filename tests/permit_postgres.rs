//! Fenced permits writing to PostgreSQL: a row per (resource, seat), and
//! `UPDATE ... WHERE seat = $s AND fence <= $f`: a permit holder paused past
//! its expiry writes nothing once its seat was granted again and written.
//!
//! Needs PostgreSQL at `$DATABASE_URL`, as `tests/fence_postgres.rs` (whose
//! setup it shares, `support::postgres`): skipped with a message when unreachable,
//! failed under `CI=true`.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nolock::semaphore::{Permit, PermitAttempt, PermitRelease, Semaphore};
use nolock::Backoff;
use support::postgres::{connect, with_schema};
use tokio_postgres::Client;

/// The pattern for fenced permits: the row of the permit's seat, written
/// only under a fence not below the row's (`<=`: one permit may write its
/// seat several times; a newer grant of the seat always has a greater
/// fence).
const FENCED_UPDATE: &str =
    "UPDATE exports SET cursor = $1, fence = $3 WHERE seat = $2 AND fence <= $3";

/// The test schema's tables (`{schema}` is its name).
const TABLES: &str = "CREATE TABLE {schema}.exports ( seat bigint PRIMARY KEY, cursor text NOT NULL, fence bigint NOT NULL DEFAULT 0 ); INSERT INTO {schema}.exports (seat, cursor) SELECT s, '0' FROM generate_series(1, 3) AS s;";

fn permit(outcome: PermitAttempt) -> Permit {
    match outcome {
        PermitAttempt::Acquired(permit) => permit,
        full => panic!("expected a permit, got {full:?}"),
    }
}

/// `(seat, fence)` as the query takes them.
fn seat(permit: &Permit) -> (i64, i64) {
    let fence = permit.fence().expect("a fenced permit");
    (fence.seat() as i64, fence.as_i64())
}

async fn update(db: &Client, cursor: &str, (seat, fence): (i64, i64)) -> u64 {
    db.execute(FENCED_UPDATE, &[&cursor, &seat, &fence])
        .await
        .unwrap()
}

#[tokio::test]
async fn a_paused_permit_holder_updates_zero_rows_after_its_seat_was_written() {
    with_schema("permit_paused", TABLES, |schema| async move {
        let redis = support::redis();
        let mut conn = redis.conn().await;
        let db_a = connect(Some(&schema)).await.unwrap();
        let db_b = connect(Some(&schema)).await.unwrap();
        let key = format!("{}exporters", support::prefix("pg_permit_paused"));
        let ttl = Duration::from_millis(200);
        let exporters = Semaphore::new(3, ttl).unwrap().fenced();

        // A takes seat 1 and writes; B takes seat 2.
        let a = permit(exporters.acquire(&mut conn, &key).await.unwrap());
        let b = permit(
            Semaphore::new(3, Duration::from_secs(60))
                .unwrap()
                .fenced()
                .acquire(&mut conn, &key)
                .await
                .unwrap(),
        );
        assert_eq!((seat(&a).0, seat(&b).0), (1, 2));
        assert_eq!(update(&db_a, "a1", seat(&a)).await, 1);
        assert_eq!(
            update(&db_a, "a2", seat(&a)).await,
            1,
            "one permit writes its seat again"
        );

        // A is paused past its expiry; C gets seat 1 with a greater fence and writes.
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        let c = permit(
            exporters
                .clone()
                .with_wait(Backoff::new(Duration::from_secs(5)))
                .acquire(&mut conn, &key)
                .await
                .unwrap(),
        );
        assert_eq!(seat(&c).0, 1);
        assert!(seat(&c).1 > seat(&a).1);
        assert_eq!(update(&db_b, "c1", seat(&c)).await, 1);

        // A wakes up: zero rows on its seat; B's seat is unaffected.
        assert_eq!(
            update(&db_a, "a3", seat(&a)).await,
            0,
            "A's stale write is refused"
        );
        assert_eq!(update(&db_b, "b1", seat(&b)).await, 1);
        assert_eq!(a.release(&mut conn).await.unwrap(), PermitRelease::Lost);
        let row = db_a
            .query_one("SELECT cursor, fence FROM exports WHERE seat = 1", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "c1");
        assert_eq!(row.get::<_, i64>(1), seat(&c).1);
        for p in [b, c] {
            assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporters_in_turn_each_update_their_seat_exactly_once() {
    with_schema("permit_turns", TABLES, |schema| async move {
        const WORKERS: usize = 12;
        let redis = support::redis();
        let db = Arc::new(connect(Some(&schema)).await.unwrap());
        let key = format!("{}exporters", support::prefix("pg_permit_turns"));
        let updated = Arc::new(AtomicUsize::new(0));
        let exporters = Semaphore::new(3, Duration::from_secs(10))
            .unwrap()
            .fenced()
            .with_wait(Backoff {
                initial_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(20),
                ..Backoff::new(Duration::from_secs(30))
            });
        let mut tasks = Vec::new();
        for _ in 0..WORKERS {
            let mut conn = redis.conn().await;
            let (db, key, updated, exporters) =
                (db.clone(), key.clone(), updated.clone(), exporters.clone());
            tasks.push(tokio::spawn(async move {
                let p = permit(exporters.acquire(&mut conn, &key).await.unwrap());
                // Read-modify-write of the seat's row under the permit.
                let row = db
                    .query_one("SELECT cursor FROM exports WHERE seat = $1", &[&seat(&p).0])
                    .await
                    .unwrap();
                let n: u32 = row.get::<_, String>(0).parse().unwrap();
                let rows = update(&db, &(n + 1).to_string(), seat(&p)).await;
                updated.fetch_add(rows as usize, Ordering::SeqCst);
                assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(updated.load(Ordering::SeqCst), WORKERS);
        let rows = db
            .query("SELECT cursor FROM exports ORDER BY seat", &[])
            .await
            .unwrap();
        let total: u32 = rows
            .iter()
            .map(|r| r.get::<_, String>(0).parse::<u32>().unwrap())
            .sum();
        assert_eq!(total as usize, WORKERS, "no lost update on any seat");
    })
    .await;
}
