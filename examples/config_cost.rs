//! What reading the stored configuration costs a decision: the same GCRA
//! check through a `client::RateLimit` handle (its numbers from the
//! registry, cached per process: a map lookup and an epoch compare per
//! call) and through a bare `rate::Limiter` with the numbers in the code,
//! on one connection, in alternating rounds of one run.
//!
//! The server runs the same script with the same arguments either way
//! (`lua/` did not change for stored configurations), so the server's
//! instructions per decision are equal by construction; this measures the
//! client side, end to end.
//!
//! ```text
//! cargo run --release --example config_cost
//! ```

#[path = "../tests/support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use nolock::rate::{Algorithm, Limiter, Quota};

type Error = Box<dyn std::error::Error + Send + Sync>;

const ROUNDS: usize = 10;
const CALLS: usize = 2_000;
const TASKS: usize = 16;

/// Runs `CALLS` checks on each of `TASKS` tasks; answers µs per check.
async fn round<F, Fut>(check: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let check = check.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..CALLS {
                check(t * CALLS + i).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task ran");
    }
    start.elapsed().as_secs_f64() * 1e6 / (TASKS * CALLS) as f64
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (url, _server) = server::url_from_env_or_start();
    let client = nolock::Client::connect(url.as_str()).await?;
    let quota = Quota::per(1_000_000, Duration::from_secs(1))?.with_burst(10_000_000)?;
    let handle = client.rate_limit("config-cost", quota)?;
    handle.insist().await?;
    let limiter = Limiter::new(Algorithm::Gcra, quota)?;
    let conn = client.connection();

    let mut bare = Vec::new();
    let mut stored = Vec::new();
    for _ in 0..ROUNDS {
        let (l, c) = (limiter.clone(), conn.clone());
        bare.push(
            round(move |i| {
                let (l, mut c) = (l.clone(), c.clone());
                async move {
                    let key = format!("{{nolock:bare:config-cost:{}}}", i % 64);
                    let d = l.check(&mut c, &key, 1).await.expect("a decision");
                    assert!(d.allowed);
                }
            })
            .await,
        );
        let h = handle.clone();
        stored.push(
            round(move |i| {
                let h = h.clone();
                async move {
                    let admitted = h.check(&(i % 64).to_string()).await;
                    assert!(admitted.is_ok());
                }
            })
            .await,
        );
    }
    bare.sort_by(f64::total_cmp);
    stored.sort_by(f64::total_cmp);
    let (b, s) = (bare[ROUNDS / 2], stored[ROUNDS / 2]);
    println!(
        "{TASKS} tasks x {CALLS} checks, median of {ROUNDS} alternating rounds, one connection"
    );
    println!("{:<44} {:>10}", "path", "µs/check");
    println!("{:<44} {:>10.2}", "rate::Limiter, numbers in the code", b);
    println!("{:<44} {:>10.2}", "client::RateLimit, numbers stored", s);
    println!("{:<44} {:>10.3}", "ratio (stored / in the code)", s / b);
    Ok(())
}
