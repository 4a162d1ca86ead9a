//! Atomic Redis operations that replace distributed locks.
//!
//! Most "we need a distributed lock" problems are really "we need one atomic
//! read-decide-write". nolock ships each such operation as one Lua script that
//! Redis runs atomically, in one round trip, with no lock to acquire, renew or
//! lose: bounded counters ([`limits`]), rate limits ([`rate`]) and conditional
//! writes ([`cas`]); and, for the cases that truly need mutual exclusion,
//! leases with fencing tokens ([`fence`]).
//!
//! The front door is a [`Client`]: it owns the connection (one that
//! reconnects, or a cluster connection with the settings nolock needs), has
//! loaded the scripts, and builds **named handles** that take ids, not Redis
//! keys. A denial is the `Err` of a `Result`, so `?` turns it away (with the
//! `axum` feature, into a `429` with the IETF `RateLimit` headers).
//!
//! ```no_run
//! # async fn handler(user: &str) -> Result<(), Box<dyn std::error::Error>> {
//! let client = nolock::Client::connect("redis://127.0.0.1/").await?;
//! let per_user = client.rate_limit("api", nolock::quota!(100 per minute))?;
//!
//! // In a request handler: one round trip, one decision per user id.
//! let admitted = per_user.check(user).await?; // Err(Rejection::Limited(..)) when over
//! println!("ok, {} left", admitted.remaining);
//! # Ok(()) }
//! ```
//!
//! Under the handles, every operation is also an async function that takes
//! any redis-rs async connection (`MultiplexedConnection`,
//! `ConnectionManager`, a cluster connection, a pooled connection) as `&mut
//! impl ConnectionLike` and a key of your own. It checks its input before
//! sending anything, runs its script with `EVALSHA`, and when the server has
//! lost the script, loads it and runs it once more.
//!
//! The [`guide`] has one chapter per job and per concern (rate limiting an
//! axum service, at most N at once, fencing with PostgreSQL, retries, Redis
//! Cluster, servers, what it survives, performance), with tested examples.
//!
//! # The connection-level form
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let mut conn = client.get_multiplexed_async_connection().await?;
//! nolock::Scripts::load(&mut conn).await?; // optional: saves a round trip per script
//!
//! let a = nolock::limits::try_increment(&mut conn, "api:user:42", 100, Duration::from_secs(60)).await?;
//! if a.admitted {
//!     println!("ok, {} left", a.remaining);
//! } else {
//!     println!("slow down, window resets in {:?}", a.reset_after);
//! }
//! # Ok(()) }
//! ```
//!
//! # Many operations at once
//!
//! Every call also exists as a value that checks its input when built
//! ([`limits::TryIncrement`], [`rate::Check`], [`cas::Adjust`],
//! [`fence::ReleaseLock`], ...). A [`Batch`] of them goes out as one pipeline per server and returns
//! one typed `Result` per operation, in order, recovering `NOSCRIPT` entry by
//! entry.
//!
//! # Retries without double counting
//!
//! Any operation value that writes can carry an operation id
//! ([`Operation::idempotent`]): the server then applies it at most once
//! per id within a horizon (default 5 minutes) and answers a resend with
//! the first run's reply. [`retry()`] sends such an operation again after
//! a lost reply ([`Error::Indeterminate`]), and any operation again after
//! errors in which nothing ran, with jittered backoff and a deadline; it
//! never re-sends an operation without an id after a lost reply. The plain
//! calls are unchanged. The guide chapter [`guide::retries`] states the
//! guarantee and its limits.
//!
//! # Your own scripts
//!
//! A directory of your own Lua scripts, embedded with [`scripts!`], runs
//! through the same engine: [`script::ScriptDir`] names them,
//! [`script::Call`] calls one with its reply decoded into your type, alone
//! or in a [`Batch`], and [`Scripts::load_with`] loads them at startup.
//!
//! # Redis Cluster
//!
//! Operations work unchanged on a redis-rs cluster connection: each script's
//! keys share one slot (multi-key scripts derive their keys with a hash tag,
//! [`keys::derive`]; keys that would span slots are refused before I/O with
//! [`Error::CrossSlot`]), `EVALSHA` is routed by key, [`Scripts::load`] loads
//! every node, and [`Batch::run`] splits a batch by node.
//!
//! **Build the cluster client with `retries(0)`.** With its default settings
//! the redis-rs cluster connection sends a request again when the connection
//! to a node drops or times out after the request went out. For a script that
//! is a second execution nobody asked for: one call, two increments (the test
//! `tests/cluster_failover.rs` shows it). With `retries(0)` such a call fails
//! with [`Error::Indeterminate`] instead. What the redis-rs retries would
//! also have done safely, nolock does itself: a call answered `MOVED`,
//! `READONLY`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING` or `MASTERDOWN`,
//! or stopped at a key that left a migrating slot (the slot moved or is
//! moving, the node is not ready; nothing ran) is sent
//! again, up to 8 times within about 1.3 s. Other commands of your
//! application may want the default retries: give nolock its own cluster
//! client.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::cluster::ClusterClient::builder([
//!     "redis://10.0.0.1:6379/",
//!     "redis://10.0.0.2:6379/",
//! ])
//! .retries(0) // never replay a script whose reply was lost
//! .build()?;
//! let mut conn = client.get_async_connection().await?;
//! nolock::Scripts::load(&mut conn).await?; // every primary and replica
//! # Ok(()) }
//! ```
//!
//! Read-only operations ([`limits::peek`]) run with `EVALSHA_RO`, so a
//! cluster client with a replica read strategy
//! (`ClusterClientBuilder::read_routing_strategy`) serves them from replicas.
//! What a failover can lose, and what an operator can do about it, is in the
//! [`script`] docs.
//!
//! # Which module for which job
//!
//! One operation, one script, one wrapper: `lua/limits/try_increment.lua` is
//! run by [`limits::try_increment`].
//!
//! | the job | module | start with |
//! |---|---|---|
//! | any of the jobs below by name and id, with a connection it owns | [`client`] | [`Client::connect`] |
//! | "at most N per window" per key, cheapest | [`limits`] | [`limits::try_increment`] |
//! | "N per second with a burst", smooth; several limits at once; `RateLimit` headers | [`rate`] | [`rate::Limiter`], [`rate::MultiLimiter`] |
//! | "at most N at once" (a bounded worker pool, in-flight calls) | [`semaphore`] | [`semaphore::Semaphore`] |
//! | `UPDATE … WHERE` in Redis: compare-and-set/delete/expire, versions, balances, insert-if-absent | [`cas`] | [`cas::debit`], [`cas::compare_and_set`] |
//! | one worker at a time, safely (a lease with a fencing token) | [`fence`] | [`fence::Lock::with_lease`] |
//! | rate or in-flight limits in front of an axum/hyper/tower service (feature `tower`) | `layer` | `layer::RateLimitLayer` |
//! | what to do when Redis is slow or down | [`policy`] | [`policy::Guard`] |
//! | many operations in one round trip; your own Lua scripts | [`script`] | [`Batch`], [`scripts!`] |
//! | keys for several scripts in one cluster slot | [`keys`] | [`keys::derive`] |
//! | the Redis ACL a service user needs | [`acl`] | [`acl::COMMANDS`] |
//! | sharper errors after a dropped connection or behind a proxy | [`Tracked`], [`Proxied`] | [`Tracked::new`] |
//! | telling "not applied" from "may have been applied" | [`Error`] | [`Error::is_definite`] |
//! | sending again after a lost reply without counting twice (operation ids) | [`retry`](mod@retry) | [`Operation::idempotent`], [`retry()`] |
//!
//! # Features
//!
//! None is on by default; the core depends on redis-rs and tokio only, and
//! every module above but `layer` is always there. docs.rs documents the crate
//! with all features, and marks what needs one.
//!
//! | feature | adds | pulls in |
//! |---|---|---|
//! | `axum` | a [`client::Rejection`] is an axum response (`429` with the `RateLimit` headers and `Retry-After`, `503`/`500` with a body) and a [`client::Admitted`] adds its headers to one | `axum-core`, `http` |
//! | `tower` | the `layer` module: `RateLimitLayer` and `ConcurrencyLimitLayer` for axum 0.8, hyper 1 and any tower stack | `tower-layer`, `tower-service`, `http` |
//! | `tracing` | a `nolock.script` span per script call, events for fallbacks and lost leases, `record_keys_in_spans` | `tracing` |
//! | `metrics` | counters and a latency histogram through the `metrics` facade (names in the `observe` docs: [`guide::web_service`]) | `metrics` |
//!
//! # Which redis-rs
//!
//! nolock is built on redis-rs 1.x (`redis = "1.8"`) and re-exports it as
//! [`nolock::redis`](crate::redis). Its functions take a connection of *that*
//! redis-rs: a connection made with another major version (0.32, say) does
//! not implement its `ConnectionLike`, and the call fails to compile:
//!
//! ```text
//! error[E0277]: the trait bound `redis::aio::MultiplexedConnection: nolock::redis::aio::ConnectionLike` is not satisfied
//! note: there are multiple different versions of crate `redis` in the dependency graph
//! ```
//!
//! Either depend on the same redis-rs major version (`cargo tree -d` lists
//! duplicated crates), or make nolock's connections through the re-export:
//!
//! ```no_run
//! use nolock::redis; // the redis-rs nolock is built on
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let mut conn = client.get_multiplexed_async_connection().await?;
//! let usage = nolock::limits::peek(&mut conn, "api:user:42").await?;
//! # let _ = usage;
//! # Ok(()) }
//! ```
//!
//! # Minimum Rust version
//!
//! `rust-version` in `Cargo.toml` (1.88). CI checks it without a 1.88
//! toolchain: clippy's `incompatible_msrv` lint refuses standard library items
//! newer than it, and no dependency in `Cargo.lock` may declare a newer
//! `rust-version`. Language features are not checked ([`guide::project`] says
//! how to check them with a 1.88 toolchain).
//!
//! Tested on Redis 7.0, 7.4 and 8.0 and Valkey 8.0, 8.1 and 9.1 (read-only
//! scripts declare `#!lua flags=no-writes`, which needs Redis 7.0 or later);
//! [`guide::servers`] says how they differ.

#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unnameable_types,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]
// docs.rs (`--cfg docsrs`, nightly): mark items that need a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod ack;
pub mod acl;
mod backoff;
pub mod cas;
pub mod client;
pub mod config;
mod error;
/// What the exported macros expand to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use include_dir;
}
pub mod fence;
pub mod guide;
pub mod keys;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod layer;
pub mod limits;
mod observe;
pub mod policy;
mod proxied;
pub mod rate;
mod renew;
pub mod retry;
pub mod script;
pub mod semaphore;
mod timer;
mod tracked;
mod validate;

pub use backoff::Backoff;
pub use client::Client;
pub use error::{Error, Result};
pub use proxied::Proxied;
pub use renew::{Loss, Work};
pub use retry::{retry, RetryPolicy};
pub use script::{stats, Batch, BatchConnection, Idempotent, Operation, Script, Scripts, Stats};
pub use tracked::Tracked;
pub use validate::{MAX_INTEGER, MAX_TTL, MAX_VALUE_LEN};

#[cfg(feature = "tracing")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub use observe::record_keys_in_spans;

/// The redis-rs crate nolock is built on (version 1.x). Connections made
/// through it always fit nolock's functions, whatever redis-rs version the
/// rest of the application uses (see "Which redis-rs" above).
pub use redis;
