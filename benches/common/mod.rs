//! The comparison behind `examples/compare.rs` (a short run: the README's main
//! job) and `benches/versus_locks.rs` (the full matrix).
//!
//! Each [`ops::Operation`] is written up to four ways ([`ops::Variant`]):
//!
//! * `script`: the nolock call: one Lua script, one round trip, no lock;
//! * `raw`: the same script by a hand-written redis-rs `EVALSHA` (bounded
//!   counter only), to show what the library's own code costs;
//! * `lock`: read, decide and write with separate commands under a
//!   distributed lock, written as careful users write it today ([`lock`]);
//! * `watch`: optimistic `WATCH`/`MULTI`/`EXEC`, retried on conflict.
//!
//! [`run::run`] drives one [`run::Scenario`] (N tasks, one hot key or keys
//! spread over 1,000 names, optionally with holders that pause past the lock's
//! TTL) and measures throughput, p50/p99 latency, round trips per operation,
//! over-admissions and lost updates. [`overhead`] measures what the library
//! itself adds per call, without I/O. [`report`] prints the table and the
//! JSON rows. Nothing here is part of the library's API.
#![allow(dead_code)]

/// The lock's TTL when nothing pauses: far above any critical section, as a
/// careful user sizes it (above the p99 of the work it guards).
pub const LOCK_TTL: std::time::Duration = std::time::Duration::from_secs(1);
/// Each key's capacity in the throughput runs: never reached, so every call
/// is admitted and every call writes (the costlier path for every variant).
pub const CAPACITY: u64 = 1_000_000_000;

pub mod charts;
pub mod conn;
pub mod deny_cache;
pub mod hot_key;
pub mod latency;
pub mod lock;
pub mod ops;
pub mod overhead;
pub mod report;
pub mod run;
pub mod semaphore;
#[path = "../../tests/support/server.rs"]
pub mod server;
pub mod subject;

/// Errors of the comparison itself (bad setup, a Redis error during a run).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

/// The Redis server the comparison runs against: `$REDIS_URL`, or a
/// throwaway `redis-server` on a free port, stopped when this is dropped.
pub struct Target {
    pub url: String,
    server: Option<server::RedisServer>,
}

impl Target {
    /// Use `$REDIS_URL` when set; otherwise start `redis-server` (or
    /// `$NOLOCK_REDIS_SERVER`), or exit with what to install when it is missing.
    pub fn from_env() -> Target {
        if let Ok(url) = std::env::var("REDIS_URL") {
            if !url.is_empty() {
                return Target { url, server: None };
            }
        }
        let binary = server::redis_server_binary();
        if std::process::Command::new(&binary)
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("error: {}", server::install_hint());
            std::process::exit(1);
        }
        let server = server::RedisServer::start();
        Target {
            url: server.url(),
            server: Some(server),
        }
    }

    /// Where the server came from, for the progress output.
    pub fn describe(&self) -> String {
        match &self.server {
            Some(server) => format!(
                "throwaway redis-server on 127.0.0.1:{} (set REDIS_URL to use another)",
                server.port
            ),
            None => format!("REDIS_URL={}", self.url),
        }
    }
}
