//! What the rate-limit layer costs per HTTP request: the same axum handler
//! with and without `RateLimitLayer`, on one hot key and on 1,000 keys, in
//! one run.
//!
//! ```text
//! cargo run --release --features tower --example layer_cost          # 3 rounds of 2 s per row
//! cargo run --release --features tower --example layer_cost -- 5 3   # seconds per row, rounds
//! ```
//!
//! Server and load generator share one process and one tokio runtime (as
//! many workers as cores), on loopback: 32 clients, each on its own
//! keep-alive HTTP/1.1 connection (hyper), send `GET /` back to back. Every
//! request is admitted (the quota is far above the load), so each layered
//! request costs one `EVALSHA` round trip on one multiplexed connection.
//! The rows run in turn, `rounds` times, so that load changes on a shared
//! machine hit every row alike; the best round of each row is printed.
//! "µs per request" is `1/rps(layer) - 1/rps(bare)` (the extra time per
//! request at full load); the p50 columns compare single-request latency.

#[path = "../tests/support/server.rs"]
mod server;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::{routing::get, Router};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use nolock::layer::{Identity, RateLimitLayer};
use nolock::rate::{Algorithm, Limiter, Quota};

type Error = Box<dyn std::error::Error + Send + Sync>;

const CLIENTS: usize = 32;

async fn serve(app: Router) -> Result<SocketAddr, Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// `(requests per second, p50 µs, non-200 answers)` for `secs` of load.
async fn load(addr: SocketAddr, secs: f64, keys: usize) -> Result<(f64, f64, usize), Error> {
    let next_key = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let next_key = Arc::clone(&next_key);
        clients.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            let io = hyper_util::rt::TokioIo::new(stream);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(conn);
            let mut latencies = Vec::new();
            let mut refused = 0;
            while Instant::now() < deadline {
                let user = next_key.fetch_add(1, Ordering::Relaxed) % keys;
                let request = hyper::Request::get("/")
                    .header("host", "bench")
                    .header("x-user", user.to_string())
                    .body(Empty::<Bytes>::new())?;
                let started = Instant::now();
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                refused += usize::from(response.status() != 200);
                response.into_body().collect().await?;
                latencies.push(started.elapsed());
            }
            Ok::<_, Error>((latencies, refused))
        }));
    }
    let mut all = Vec::new();
    let mut refused = 0;
    for client in clients {
        let (latencies, r) = client.await??;
        all.extend(latencies);
        refused += r;
    }
    all.sort();
    let p50 = all.get(all.len() / 2).copied().unwrap_or_default();
    Ok((all.len() as f64 / secs, p50.as_secs_f64() * 1e6, refused))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let (url, _server) = server::url_from_env_or_start();
    let conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    nolock::Scripts::load(&mut conn.clone()).await?;
    // Far above any load this loop can make: every request is admitted.
    let quota = Quota::per_second(1_000_000)?.with_burst(1_000_000)?;
    let limiter = Limiter::new(Algorithm::Gcra, quota)?.named("bench")?;

    let handler = || Router::new().route("/", get(|| async { "ok" }));
    let bare = serve(handler()).await?;
    let layered = serve(handler().layer(RateLimitLayer::new(conn, limiter, |req| {
        let user = req.headers.get("x-user").and_then(|v| v.to_str().ok());
        Identity::Limited(format!("bench:layer:{}", user.unwrap_or("-")))
    })))
    .await?;

    let rows: [(&str, SocketAddr, usize); 3] = [
        ("bare handler", bare, 1),
        ("layer, 1 hot key", layered, 1),
        ("layer, 1,000 keys", layered, 1000),
    ];
    let mut best = [(0.0f64, f64::MAX, 0usize); 3];
    // Warm up connections, scripts and the allocator.
    for (_, addr, keys) in rows {
        load(addr, 0.3, keys).await?;
    }
    for _ in 0..rounds {
        for (i, (_, addr, keys)) in rows.iter().enumerate() {
            let (rps, p50, refused) = load(*addr, secs, *keys).await?;
            if rps > best[i].0 {
                best[i] = (rps, p50, refused);
            }
        }
    }

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{CLIENTS} clients, keep-alive HTTP/1.1, {cores} cores, best of {rounds} × {secs} s per row"
    );
    println!("| row | requests/s | p50 µs | µs per request over bare | ratio to bare | non-200 |");
    println!("|---|---|---|---|---|---|");
    let (bare_rps, bare_p50, _) = best[0];
    for ((label, _, _), (rps, p50, refused)) in rows.iter().zip(best) {
        let extra = 1e6 / rps - 1e6 / bare_rps;
        println!(
            "| {label} | {rps:.0} | {p50:.0} (+{:.0}) | {extra:.1} | {:.2} | {refused} |",
            p50 - bare_p50,
            rps / bare_rps
        );
    }
    Ok(())
}
