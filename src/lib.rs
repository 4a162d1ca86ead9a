//! Atomic Redis operations that replace distributed locks.
//!
//! Most "we need a distributed lock" problems are really "we need one atomic
//! read-decide-write". nolock ships each such operation as one Lua script that
//! Redis runs atomically, in one round trip, with no lock to acquire, renew or
//! lose: bounded counters today; rate limits, conditional sets and fenced
//! leases (for the cases that truly need mutual exclusion) as they land.
//!
//! Every operation is an async function that takes any redis-rs async
//! connection (`MultiplexedConnection`, `ConnectionManager`, a cluster
//! connection, a pooled connection) as `&mut impl ConnectionLike`. It checks
//! its input before sending anything, runs its script with `EVALSHA`, and
//! falls back to `EVAL` once when the server has lost the script.
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
//! # Layout
//!
//! One operation, one script, one wrapper: `lua/limits/try_increment.lua` is
//! run by [`limits::try_increment`].
//!
//! * [`limits`]: bounded counters (fixed windows, concurrency limits).
//! * [`fence`]: leases with fencing tokens: fenced acquire, token-checked
//!   release/extend, a self-renewing [`fence::Lease`], fenced writes.
//! * [`script`]: the engine: the embedded registry, [`Scripts::load`], `EVALSHA`
//!   with the `EVAL` fallback, [`stats`].
//! * [`keys`]: cluster slots and hash tags for scripts that touch several keys.
//! * [`Error`]: bad input (before I/O), definite and indeterminate Redis failures.
//!
//! Requires Redis 7.0 or later (read-only scripts declare `#!lua flags=no-writes`).

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

mod error;
pub mod fence;
pub mod keys;
pub mod limits;
pub mod script;
mod validate;

pub use error::{Error, Result};
pub use script::{stats, Script, Scripts, Stats};
pub use validate::{MAX_INTEGER, MAX_TTL};
