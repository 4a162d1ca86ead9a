//! Atomic Redis operations that replace distributed locks.
//!
//! Most "we need a distributed lock" problems are really "we need one atomic
//! read-decide-write". nolock ships each such operation as one Lua script that
//! Redis runs atomically, in one round trip, with no lock to acquire, renew or
//! lose: bounded counters ([`limits`]), rate limits ([`rate`]) and conditional
//! writes ([`cas`]); and, for the cases that truly need mutual exclusion,
//! leases with fencing tokens ([`fence`]).
//!
//! Every operation is an async function that takes any redis-rs async
//! connection (`MultiplexedConnection`, `ConnectionManager`, a cluster
//! connection, a pooled connection) as `&mut impl ConnectionLike`. It checks
//! its input before sending anything, runs its script with `EVALSHA`, and
//! when the server has lost the script, loads it and runs it once more.
//!
//! # Example
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
//! The most batched operations also exist as values that check their input
//! when built ([`limits::TryIncrement`], [`rate::Check`], [`cas::Adjust`],
//! ...). A [`Batch`] of them goes out as one pipeline per server and returns
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
//! calls are unchanged. The README section "Retries without double
//! counting" states the guarantee and its limits.
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
//! `READONLY`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING` or `MASTERDOWN`
//! (the slot moved or is moving, the node is not ready; nothing ran) is sent
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
//! # Layout
//!
//! One operation, one script, one wrapper: `lua/limits/try_increment.lua` is
//! run by [`limits::try_increment`].
//!
//! * [`limits`]: bounded counters (fixed windows).
//! * [`rate`]: rate limiters (GCRA, token bucket, sliding and fixed windows),
//!   atomic multi-limit checks, IETF `RateLimit` headers.
//! * [`cas`]: conditional writes: compare-and-set/delete/expire, versioned
//!   values, monotonic integers, guarded debit/credit, insert-if-absent.
//! * [`semaphore`]: "at most N at once" with expiring permits, reclaimed
//!   one by one from crashed holders; a self-renewing [`semaphore::PermitLease`].
//! * [`fence`]: leases with fencing tokens: fenced acquire, token-checked
//!   release/extend, a self-renewing [`fence::Lease`], fenced writes.
//! * [`script`]: the engine: the embedded registry, [`Scripts::load`], `EVALSHA`
//!   with the `NOSCRIPT` fallback, [`Batch`], [`stats`]; cluster behaviour.
//! * [`policy`]: a per-decision timeout and what to do when Redis fails
//!   (fail closed, fail open, a per-process limiter), visible in the answer.
//! * `layer` (feature `tower`): `RateLimitLayer` and `ConcurrencyLimitLayer`
//!   for axum, hyper and tower.
//! * [`retry`](mod@retry): re-sending an operation with an id after a lost reply,
//!   and any operation after errors in which nothing ran.
//! * [`keys`]: cluster slots and hash tags for scripts that touch several keys.
//! * [`acl`]: the Redis ACL permissions nolock needs.
//! * [`Tracked`] and [`Proxied`]: connection wrappers that sharpen what an
//!   error says (calls after a dropped connection were never sent; behind a
//!   proxy an error reply may hide a script that ran).
//! * [`Error`]: bad input (before I/O), definite and indeterminate Redis failures.
//!
//! # Features
//!
//! None is on by default; the core depends on redis-rs and tokio only.
//!
//! * `tower`: the `layer` module (`tower-layer`, `tower-service`, `http`).
//! * `tracing`: a span per script call and events for fallbacks and lost
//!   leases (`tracing`).
//! * `metrics`: counters and a latency histogram through the `metrics`
//!   facade.
//!
//! Tested on Redis 7.0, 7.4 and 8.0 and Valkey 8.0 (read-only scripts declare
//! `#!lua flags=no-writes`, which needs Redis 7.0 or later); the README's
//! "Servers" section says how they differ.

#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod acl;
pub mod cas;
mod error;
/// What the exported macros expand to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use include_dir;
}
pub mod fence;
pub mod keys;
#[cfg(feature = "tower")]
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

pub use error::{Error, Result};
pub use proxied::Proxied;
pub use retry::{retry, RetryPolicy};
pub use script::{stats, Batch, BatchConnection, Idempotent, Operation, Script, Scripts, Stats};
pub use tracked::Tracked;
pub use validate::{MAX_INTEGER, MAX_TTL, MAX_VALUE_LEN};

#[cfg(feature = "tracing")]
pub use observe::record_keys_in_spans;
