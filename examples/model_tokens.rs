//! A token budget for a language-model API: reserve an estimate, settle the
//! real usage when the call returns.
//!
//! ```text
//! cargo run --example model_tokens            # own redis-server
//! REDIS_URL=redis://127.0.0.1/ cargo run --example model_tokens
//! ```
//!
//! A handler admits each request on an estimate of its tokens (a GCRA
//! limit of 2 000 tokens per second for one API key), calls a slow "model"
//! stub whose real usage differs from the estimate, and settles the charge
//! at that usage: below the estimate the difference comes back at once;
//! above it the excess is charged even past the budget, and the next
//! requests are told to wait until the debt has drained. Each response's
//! `RateLimit` headers are printed as an HTTP service would send them.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use nolock::rate::{Algorithm, Limiter, Quota, Settle};

/// The model stub: answers after 30-80 ms with a usage that may be below
/// or well above the estimate.
async fn model(prompt: usize) -> u64 {
    tokio::time::sleep(Duration::from_millis(30 + fastrand::u64(0..50))).await;
    let usage = [300, 800, 1_400, 2_600];
    usage[prompt % usage.len()]
}

/// One request: returns the status and the headers it would answer with.
async fn handle(
    conn: &mut redis::aio::MultiplexedConnection,
    budget: &Limiter,
    prompt: usize,
) -> nolock::Result<(u16, Vec<(String, String)>)> {
    let estimate = 1_000;
    let decision = budget.check(conn, "tpm:key:7", estimate).await?;
    let headers = budget.headers(&decision);
    let Some(charge) = decision.into_charge() else {
        return Ok((429, owned(headers.iter())));
    };
    let used = model(prompt).await;
    let after = match charge.settle(conn, used).await? {
        Settle::Settled(s) => {
            println!(
                "  prompt {prompt}: estimated {estimate}, used {used}: {} back, {} charged more, debt {}",
                s.credited, s.charged, s.state.debt
            );
            budget.headers(&s.state)
        }
        other => {
            println!("  prompt {prompt}: {other:?}");
            headers
        }
    };
    Ok((200, owned(after.iter())))
}

fn owned<'a>(h: impl Iterator<Item = (&'static str, &'a str)>) -> Vec<(String, String)> {
    h.map(|(n, v)| (n.to_owned(), v.to_owned())).collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = server::url_from_env_or_start();
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    nolock::Scripts::load(&mut conn).await?;
    let _: () = redis::cmd("DEL")
        .arg("tpm:key:7")
        .query_async(&mut conn)
        .await?;
    // 2 000 tokens per second, a burst of 4 000; settlements may leave at
    // most 4 000 tokens of debt in all (the cap counts the debt already there).
    let budget = Limiter::new(
        Algorithm::Gcra,
        Quota::per_second(2_000)?.with_burst(4_000)?,
    )?
    .named("tokens")?
    .with_debt_cap(4_000);
    for prompt in 0..12 {
        let (status, headers) = handle(&mut conn, &budget, prompt).await?;
        let shown: Vec<String> = headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
        println!("{status} {}", shown.join(" | "));
        if status == 429 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
