//! The guide: one chapter per job and per concern, with the measurements
//! and the reasoning behind them. Every example in it is compiled by
//! `cargo test --doc`, except two excerpts of files in `examples/` (they say
//! so), which CI builds as the examples they come from; those marked
//! runnable run against the throwaway server `.ci/test` starts (they return
//! early without `REDIS_URL`).
//!
//! | chapter | read it for |
//! |---|---|
//! | [`rate_limiting`] | a limit per user or per key: bounded counters and the four rate-limit algorithms, refunds and settlement |
//! | [`web_service`] | an axum/tower service end to end: the layers, headers, failure policies, the deny cache |
//! | [`concurrency`] | at most N at once: the semaphore, its permits and leases |
//! | [`fencing`] | one job at a time, safely: leases with fencing tokens, PostgreSQL, acknowledged grants |
//! | [`conditional_writes`] | compare-and-set, versioned values, guarded balances |
//! | [`retries`] | lost replies, operation ids and `retry`: applied exactly once |
//! | [`cluster`] | Redis Cluster: hash tags, batches, failover |
//! | [`servers`] | which servers are tested, ACLs, managed services |
//! | [`own_scripts`] | your own Lua scripts through the same engine |
//! | [`how_it_works`] | the engine: `EVALSHA`, `NOSCRIPT`, resends, replies |
//! | [`survives`] | what it survives (faults, each with its test), and the promises with the test of each |
//! | [`performance`] | scripts against locks, server cost per call, other crates, and how each figure was measured |
//! | [`project`] | adding it to a project: features, redis-rs versions, the minimum Rust version, running the tests |
//!
//! # The three main jobs, runnable
//!
//! Limit a request (a bounded counter per user and window):
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Ok(url) = std::env::var("REDIS_URL") else { return Ok(()) };
//! # let mut conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
//! # let user = format!("guide-{}", std::process::id());
//! use std::time::Duration;
//! use nolock::limits::Counter;
//!
//! let api = Counter::new(100, Duration::from_secs(60))?;
//! let a = api.try_increment(&mut conn, &format!("api:{user}")).await?;
//! assert!(a.admitted && a.remaining == 99);
//! # Ok(()) }
//! ```
//!
//! Rate limit an endpoint (GCRA, 10 a minute; give units back when the work
//! was not done):
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Ok(url) = std::env::var("REDIS_URL") else { return Ok(()) };
//! # let mut conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
//! # let key = format!("guide-rl:{}", std::process::id());
//! use nolock::rate::{Algorithm, Limiter, Quota};
//!
//! let exports = Limiter::new(Algorithm::Gcra, Quota::per_minute(10)?)?;
//! let mut decision = exports.check(&mut conn, &key, 4).await?;
//! assert!(decision.allowed);
//! // The export failed: the charge gives its units back, once.
//! let charge = decision.charge_mut().expect("admitted");
//! assert_eq!(charge.refund(&mut conn, 4).await?.credited, 4);
//! assert!(charge.refund(&mut conn, 1).await.is_err(), "nothing left to give back");
//! # Ok(()) }
//! ```
//!
//! At most N at once, and one job at a time with a fence:
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Ok(url) = std::env::var("REDIS_URL") else { return Ok(()) };
//! # let conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
//! # let id = std::process::id();
//! use std::time::Duration;
//! use nolock::fence::Lock;
//! use nolock::semaphore::Semaphore;
//! use nolock::Work;
//!
//! let exports = Semaphore::new(3, Duration::from_secs(10))?;
//! let out = exports
//!     .with_permit(conn.clone(), &format!("exports:{id}"), |_| async { "exported" })
//!     .await?;
//! assert_eq!(out, Work::Done("exported"));
//!
//! let reports = Lock::new(Duration::from_secs(10))?;
//! let mut writer = conn.clone();
//! let out = reports
//!     .with_lease(conn.clone(), &format!("report:{id}"), |fence| async move {
//!         fence.write(&mut writer, "built").await
//!     })
//!     .await?;
//! assert!(out.done().expect("held to the end")?.is_applied());
//! # Ok(()) }
//! ```

#[doc = include_str!("rate_limiting.md")]
pub mod rate_limiting {}

#[doc = include_str!("web_service.md")]
pub mod web_service {}

#[doc = include_str!("concurrency.md")]
pub mod concurrency {}

#[doc = include_str!("fencing.md")]
pub mod fencing {}

#[doc = include_str!("conditional_writes.md")]
pub mod conditional_writes {}

#[doc = include_str!("retries.md")]
pub mod retries {}

#[doc = include_str!("cluster.md")]
pub mod cluster {}

#[doc = include_str!("servers.md")]
pub mod servers {}

#[doc = include_str!("own_scripts.md")]
pub mod own_scripts {}

#[doc = include_str!("how_it_works.md")]
pub mod how_it_works {}

#[doc = include_str!("survives.md")]
pub mod survives {}

#[doc = include_str!("performance.md")]
pub mod performance {}

#[doc = include_str!("project.md")]
pub mod project {}
