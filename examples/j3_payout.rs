//! J3: one payout job per tenant among replicas, the fence checked by
//! PostgreSQL, the lease renewed while the job runs, and its loss handled.
//!
//! ```text
//! cargo run --example j3_payout
//! cargo test --example j3_payout
//! ```
//!
//! Starts its own redis-server unless `REDIS_URL` is set; uses PostgreSQL at
//! `DATABASE_URL` (default: 127.0.0.1:5432, database `test`, user
//! `postgres`) with a table of its own, dropped at the end.
//!
//! Each replica, at startup, raises the fence counter of every tenant above
//! the highest fence the database has seen, with the **fleet-safe**
//! `advance` (it never raises a counter under a live holder). Then every
//! replica tries every tenant: one holds the tenant's lock and pays; the
//! others find it held (or paid) and move on. The payment is fenced in SQL:
//! a replica paused past its lease updates zero rows.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::Arc;
use std::time::Duration;

use nolock::{Client, Work};
use tokio_postgres::NoTls;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease's TTL: renewed every third of it while the job runs.
const TTL: Duration = Duration::from_millis(600);

/// Claim the row for this grant before the work: from here on, every older
/// grant's statements match nothing.
const CLAIM: &str =
    "UPDATE {t} SET fence = $2 WHERE tenant = $1 AND fence <= $2 AND status = 'pending'";
/// Pay, only if no newer grant has claimed the row since.
const PAY: &str = "UPDATE {t} SET status = 'paid', paid_by = $3, payments = payments + 1 \
                   WHERE tenant = $1 AND fence <= $2 AND status = 'pending'";

/// The database side: one row per tenant's pending payout.
struct Ledger {
    db: tokio_postgres::Client,
    table: String,
}

impl Ledger {
    async fn connect(table: &str, tenants: &[i64]) -> Result<Ledger, BoxError> {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned());
        let (db, connection) = tokio_postgres::connect(&url, NoTls).await?;
        tokio::spawn(connection);
        db.batch_execute(&format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (
                 tenant   bigint PRIMARY KEY,
                 status   text   NOT NULL DEFAULT 'pending',
                 paid_by  text,
                 payments int    NOT NULL DEFAULT 0,
                 fence    bigint NOT NULL DEFAULT 0   -- the newest grant that claimed it
             );"
        ))
        .await?;
        for tenant in tenants {
            db.execute(
                &format!("INSERT INTO {table} (tenant) VALUES ($1)"),
                &[tenant],
            )
            .await?;
        }
        Ok(Ledger {
            db,
            table: table.to_owned(),
        })
    }

    fn sql(&self, statement: &str) -> String {
        statement.replace("{t}", &self.table)
    }

    async fn highest_fence(&self, tenant: i64) -> Result<u64, BoxError> {
        let row = self
            .db
            .query_one(
                &self.sql("SELECT fence FROM {t} WHERE tenant = $1"),
                &[&tenant],
            )
            .await?;
        Ok(u64::try_from(row.get::<_, i64>(0))?)
    }

    /// Claim, call the provider, pay: `true` when this grant paid.
    async fn pay(&self, tenant: i64, fence: i64, replica: &str) -> Result<bool, BoxError> {
        if self
            .db
            .execute(&self.sql(CLAIM), &[&tenant, &fence])
            .await?
            == 0
        {
            return Ok(false); // paid already, or a newer grant claimed it
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // the payment provider
        let paid = self
            .db
            .execute(&self.sql(PAY), &[&tenant, &fence, &replica])
            .await?;
        Ok(paid == 1)
    }

    async fn drop_table(&self) -> Result<(), BoxError> {
        self.db
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", self.table))
            .await?;
        Ok(())
    }
}

/// Startup, in every replica: each tenant's fence counter above what the
/// database has seen, never raised under another replica's live job.
async fn startup(
    payouts: &nolock::client::Lock,
    ledger: &Ledger,
    tenants: &[i64],
) -> Result<(), BoxError> {
    for &tenant in tenants {
        let seen = ledger.highest_fence(tenant).await?;
        if seen == 0 {
            continue;
        }
        let attempt = payouts.advance(&tenant.to_string(), seen).await?;
        // Held with the counter below `seen`: it went back (a restart, a
        // failover) and a live holder's fence is below what the database
        // has seen, so the database refuses that holder already.
        if !attempt.is_advanced() && attempt.counter() < seen {
            let _ = payouts.force_advance(&tenant.to_string(), seen).await?;
        }
    }
    Ok(())
}

/// One replica's payout job for one tenant.
async fn run_job(
    payouts: &nolock::client::Lock,
    ledger: &Ledger,
    tenant: i64,
    replica: &str,
) -> Result<bool, BoxError> {
    let job = payouts
        .with_lease(&tenant.to_string(), |fence| {
            ledger.pay(tenant, fence.as_i64(), replica)
        })
        .await?;
    match job {
        Work::Done(paid) => paid,
        Work::Busy => Ok(false), // another replica runs it
        // The lease ended before the job did: the fence in the UPDATEs
        // decided whether this grant's payment landed; never retry it here.
        Work::Overran { output, loss } => {
            eprintln!("{replica}: tenant {tenant}: lease lost ({loss}); the fence decided");
            output
        }
        Work::Stopped(loss) => {
            eprintln!("{replica}: tenant {tenant}: stopped, lease lost ({loss})");
            Ok(false)
        }
    }
}

/// Three replicas, each running startup and then every tenant's job.
async fn fleet(client: &Client, ledger: Arc<Ledger>, tenants: &[i64]) -> Result<u64, BoxError> {
    let payouts = client.lock("j3-payouts", TTL)?;
    let mut replicas = Vec::new();
    for r in 0..3 {
        let (payouts, ledger, tenants) = (payouts.clone(), ledger.clone(), tenants.to_vec());
        replicas.push(tokio::spawn(async move {
            let replica = format!("replica-{r}");
            startup(&payouts, &ledger, &tenants).await?;
            let mut paid = 0;
            for tenant in tenants {
                paid += u64::from(run_job(&payouts, &ledger, tenant, &replica).await?);
            }
            Ok::<u64, BoxError>(paid)
        }));
    }
    let mut paid = 0;
    for replica in replicas {
        paid += replica.await??;
    }
    Ok(paid)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (redis_url, _server) = server::url_from_env_or_start();
    let client = Client::connect(redis_url.as_str()).await?;
    let tenants = [1, 2, 3, 4];
    let ledger =
        Arc::new(Ledger::connect(&format!("j3_payouts_{}", std::process::id()), &tenants).await?);
    let paid = fleet(&client, ledger.clone(), &tenants).await?;
    let rows = ledger
        .db
        .query(
            &ledger.sql("SELECT tenant, paid_by, payments, fence FROM {t} ORDER BY tenant"),
            &[],
        )
        .await?;
    for row in &rows {
        let (tenant, by, payments, fence): (i64, String, i32, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        println!("tenant {tenant}: paid once by {by} ({payments} payment), fence {fence}");
        assert_eq!(payments, 1);
    }
    ledger.drop_table().await?;
    assert_eq!(paid, tenants.len() as u64, "every tenant paid exactly once");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn setup(table: &str, tenants: &[i64]) -> (server::RedisServer, Client, Arc<Ledger>) {
        let redis = server::RedisServer::start();
        let client = Client::connect(redis.url()).await.unwrap();
        let table = format!("{table}_{}", std::process::id());
        let ledger = Arc::new(Ledger::connect(&table, tenants).await.unwrap());
        (redis, client, ledger)
    }

    async fn payments(ledger: &Ledger, tenant: i64) -> (i32, Option<String>, i64) {
        let row = ledger
            .db
            .query_one(
                &ledger.sql("SELECT payments, paid_by, fence FROM {t} WHERE tenant = $1"),
                &[&tenant],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// Three replicas, four tenants: every tenant paid exactly once; a
    /// database that had seen fence 50 before Redis lost its counters gets
    /// grants above it.
    #[tokio::test]
    async fn every_tenant_is_paid_once_and_fences_pass_what_the_database_saw() {
        let tenants = [1, 2, 3, 4];
        let (_redis, client, ledger) = setup("j3_fleet", &tenants).await;
        ledger
            .db
            .execute(
                &ledger.sql("UPDATE {t} SET fence = 50 WHERE tenant = 4"),
                &[],
            )
            .await
            .unwrap();
        let paid = fleet(&client, ledger.clone(), &tenants).await.unwrap();
        assert_eq!(paid, 4);
        for tenant in tenants {
            let (count, by, fence) = payments(&ledger, tenant).await;
            assert_eq!(count, 1, "tenant {tenant}");
            assert!(by.is_some());
            if tenant == 4 {
                assert!(fence > 50, "the grant passed the database's fence: {fence}");
            }
        }
        ledger.drop_table().await.unwrap();
    }

    /// A replica paused past its lease (its whole runtime stops: the job
    /// and the renewals) wakes after another replica paid: its payment
    /// updates zero rows. Its startup `advance`, run while the other
    /// replica holds the lock, left that holder's payment alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_holder_is_refused_by_the_database() {
        let (_redis, client, ledger) = setup("j3_paused", &[7]).await;
        let payouts = client.lock("j3-payouts", TTL).unwrap();
        let (granted_tx, granted_rx) = tokio::sync::oneshot::channel();
        let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
        let paused = {
            let (payouts, ledger) = (payouts.clone(), ledger.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let lease = payouts.acquire("7").await.unwrap().acquired().unwrap();
                    let fence = lease.fence().as_i64();
                    granted_tx.send(fence).unwrap();
                    resume_rx.recv().unwrap(); // the pause: nothing on this runtime runs
                    let paid = ledger.pay(7, fence, "paused").await.unwrap();
                    drop(lease); // its lock is long gone: nothing to release
                    paid
                })
            })
        };
        let old_fence = granted_rx.await.unwrap();
        tokio::time::sleep(TTL * 2).await; // the paused lease expires
                                           // Another replica starts (the fleet-safe advance), takes the lease
                                           // and claims the row; its payment is still on its way (pending).
        let seen = ledger.highest_fence(7).await.unwrap();
        startup(&payouts, &ledger, &[7]).await.unwrap();
        let b = payouts.acquire("7").await.unwrap().acquired().unwrap();
        let b_fence = b.fence().as_i64();
        assert!(b_fence > old_fence && u64::try_from(b_fence).unwrap() > seen);
        let claimed = ledger
            .db
            .execute(&ledger.sql(CLAIM), &[&7i64, &b_fence])
            .await
            .unwrap();
        assert_eq!(claimed, 1);
        // A third replica starts meanwhile: B's lease is live, the counter
        // stays, and B's payment below still lands.
        startup(&payouts, &ledger, &[7]).await.unwrap();

        // The paused replica wakes while the payout is still pending: only
        // the fence refuses it.
        resume_tx.send(()).unwrap();
        let paid = tokio::task::spawn_blocking(move || paused.join().unwrap())
            .await
            .unwrap();
        assert!(!paid, "the paused holder's payment matched zero rows");
        assert!(ledger.pay(7, b_fence, "replica-b").await.unwrap());
        let (count, by, fence) = payments(&ledger, 7).await;
        assert_eq!(
            (count, by.as_deref(), fence),
            (1, Some("replica-b"), b_fence)
        );
        let _ = b.release().await.unwrap();
        ledger.drop_table().await.unwrap();
    }

    /// The startup step under a live holder: the holder's payment still
    /// lands (the counter was not raised under it).
    #[tokio::test]
    async fn startup_under_a_live_holder_leaves_its_payment_alone() {
        let (_redis, client, ledger) = setup("j3_live", &[9]).await;
        let payouts = client.lock("j3-payouts", TTL).unwrap();
        let lease = payouts.acquire("9").await.unwrap().acquired().unwrap();
        let fence = lease.fence().as_i64();
        // The holder claims the row: the database has now seen its fence.
        ledger
            .db
            .execute(&ledger.sql(CLAIM), &[&9i64, &fence])
            .await
            .unwrap();
        startup(&payouts, &ledger, &[9]).await.unwrap(); // a replica starts meanwhile
        assert!(ledger.pay(9, fence, "holder").await.unwrap());
        // And its Redis-side fenced write still applies.
        assert!(payouts
            .write(lease.fence(), "paid")
            .await
            .unwrap()
            .is_applied());
        let _ = lease.release().await.unwrap();
        ledger.drop_table().await.unwrap();
    }
}
