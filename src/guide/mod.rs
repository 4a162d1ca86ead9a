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
//! | [`configuration`] | limits stored on the server: every process agrees, operators list, change and switch them at run time |
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
//! A [`Client`](crate::Client) and its named handles, by id. Limit each user
//! (a rate limit per id; a denial is the `Err`):
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Ok(url) = std::env::var("REDIS_URL") else { return Ok(()) };
//! # let user = format!("guide-{}", std::process::id());
//! use nolock::client::Rejection;
//!
//! let client = nolock::Client::connect(url).await?;
//! let per_user = client.rate_limit("guide-per-user", nolock::quota!(2 per minute))?;
//! assert_eq!(per_user.check(&user).await?.remaining, 1);
//! assert_eq!(per_user.check(&user).await?.remaining, 0);
//! match per_user.check(&user).await {
//!     Err(Rejection::Limited(limited)) => assert!(limited.retry_after.is_some()),
//!     other => panic!("{other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! Two limits at once, per user and shared per tenant:
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Ok(url) = std::env::var("REDIS_URL") else { return Ok(()) };
//! # let tenant = format!("guide-{}", std::process::id());
//! use nolock::client::Scope;
//!
//! let client = nolock::Client::connect(url).await?;
//! let limits = client
//!     .rate_limits("guide-api")
//!     .per_member("user", nolock::quota!(10 per second))
//!     .per_scope("tenant", nolock::quota!(3 per minute))
//!     .build()?;
//! for user in ["ann", "bob", "cat"] {
//!     limits.check(&Scope::new(&tenant).member(user)).await?;
//! }
//! // The tenant's shared limit is spent, whoever asks next.
//! assert!(limits.check(&Scope::new(&tenant).member("dan")).await.is_err());
//! # Ok(()) }
//! ```
//!
//! At most N at once, and one job at a time with a fence:
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Ok(url) = std::env::var("REDIS_URL") else { return Ok(()) };
//! # let id = std::process::id().to_string();
//! use std::time::Duration;
//! use nolock::Work;
//!
//! let client = nolock::Client::connect(url).await?;
//! let exports = client.semaphore("guide-exports", 3, Duration::from_secs(10))?;
//! let out = exports.with_permit(&id, |_| async { "exported" }).await?;
//! assert_eq!(out, Work::Done("exported"));
//!
//! let reports = client.lock("guide-reports", Duration::from_secs(10))?;
//! let out = reports
//!     .with_lease(&id, |fence| async move { fence.number() })
//!     .await?;
//! assert!(out.done().expect("held to the end") >= 1);
//! # Ok(()) }
//! ```
//!
//! The same jobs on a connection and keys of your own (batches, operation
//! ids, refunds and settlements) are in the chapters below.

#[doc = include_str!("rate_limiting.md")]
pub mod rate_limiting {}

#[doc = include_str!("web_service.md")]
pub mod web_service {}

#[doc = include_str!("concurrency.md")]
pub mod concurrency {}

#[doc = include_str!("fencing.md")]
pub mod fencing {}

#[doc = include_str!("configuration.md")]
pub mod configuration {}

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
