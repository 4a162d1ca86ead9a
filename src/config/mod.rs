//! Limits that live on the server: every named handle of a
//! [`Client`](crate::Client) (a rate limit, several rate limits decided
//! together, a counter, a semaphore, a lock) keeps its numbers in a registry
//! in Redis, so that every process decides by the same numbers, an operator
//! can list and change them at run time, and a switch can block a name or
//! let it through.
//!
//! # How it works
//!
//! * **Declared by the first process.** A handle's first call stores the
//!   numbers it was built with under its name, unless the name is already
//!   stored; then it decides by the stored numbers. A process built with
//!   other numbers reports it (a `tracing` warning and the metric
//!   `nolock_config_differs_total`), or, when it asks with
//!   [`insist`](crate::client::RateLimit::insist) at startup, gets
//!   [`Error::ConfigMismatch`](crate::Error::ConfigMismatch). Never a silent disagreement.
//! * **Changed at run time.** [`Configs::set`] stores new numbers, keeping
//!   every id's current state ([`Change::Keep`]) or starting every id afresh
//!   ([`Change::Reset`]); [`Configs::block`], [`Configs::unlimit`] and
//!   [`Configs::unblock`] switch a name off or on.
//! * **Learned by polling one key.** Every write to the registry takes the
//!   next number of one epoch key. Each [`Client`](crate::Client) reads that
//!   key every 250 ms ([`Client::config_poll`](crate::Client::config_poll))
//!   and reads the registry again only when it moved; a handle rebuilds its
//!   limiter once per change. A decision reads the cached numbers: no round
//!   trip on the hot path. So every process decides by new numbers at most
//!   one poll interval plus one registry read after the change returned
//!   (measured by `examples/config_change.rs`, see the README).
//!
//! # Why a poll and not a check in every script
//!
//! On Redis Cluster the registry is one hash, on one slot, and a script that
//! decides for an id runs on that id's slot: it cannot read the registry.
//! The numbers therefore travel with the call, as before, and the registry
//! decides which numbers a process sends. Between a change and the next
//! poll a process may still send the old numbers; that window is the bound
//! the README gives.
//!
//! # What "keep" keeps
//!
//! [`Change::Keep`] leaves every id's stored state as it is and decides it
//! by the new numbers from then on:
//!
//! * GCRA and the token bucket keep the time at which the id is full again
//!   (the TAT; the bucket's full-at time): the *time* the used units take to
//!   drain is kept, so the used fraction of the burst is kept when the
//!   period (burst × interval) is unchanged, and an id in debt stays in
//!   debt for the same time.
//! * The fixed and sliding windows keep the count of the current (and the
//!   previous) window; the new limit applies to it.
//! * A calendar quota ([`Algorithm::Calendar`](crate::rate::Algorithm::Calendar))
//!   keeps the count of the stored period and that period's end: a plan
//!   raised from 10 000 to 20 000 a month mid-month leaves 20 000 minus
//!   what the month used; a new period (another zone, unit or day start)
//!   applies from the end of the stored one, so no period is counted twice
//!   at once.
//! * A counter keeps its count and its window's end; the new window applies
//!   from the next window.
//! * A semaphore keeps its holders; the new size applies to the next
//!   acquire (holders above a smaller size keep their permits until they
//!   release them or they expire: nothing is taken back).
//! * A lock keeps its holder and fence; the new TTL applies from the next
//!   acquire or renewal.
//!
//! [`Change::Reset`] (rate limits and counters only) starts a new
//! *generation*: every id's key gets the generation in its name, so every id
//! starts full, at once, without a scan; the old keys expire by themselves.
//! A semaphore or a lock cannot be reset: their holders would keep running
//! on the old keys.
//!
//! # Example
//!
//! ```no_run
//! use nolock::config::{Change, Spec};
//! use nolock::rate::Quota;
//!
//! # async fn run() -> nolock::Result<()> {
//! let client = nolock::Client::connect("redis://127.0.0.1/").await?;
//! let api = client.rate_limit("api", Quota::per_minute(100)?)?;
//! api.check("alice").await.ok(); // declares "api" at 100/min if it was not stored
//!
//! // An operator raises it, keeping what every user used so far.
//! let configs = client.configs();
//! let spec = Spec::rate_limit(nolock::rate::Algorithm::Gcra, Quota::per_minute(200)?);
//! configs.set("api", spec, Change::Keep).await?;
//! for config in configs.list().await? {
//!     println!("{} {} {}", config.family, config.name, config.spec);
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

mod configs;
mod inspect;
mod registry;
mod spec;

pub use configs::Configs;
pub use inspect::*;
pub(crate) use registry::Registry;
pub use spec::{Change, Config, Family, LimitSpec, Mode, Per, Spec};

/// The registry: one hash, one field per named configuration.
pub const REGISTRY_KEY: &str = "{nolock:config}";
/// The registry's epoch: the number of the latest write to the registry.
pub const EPOCH_KEY: &str = "{nolock:config}:epoch";
/// How often a [`Client`](crate::Client) reads the epoch by default.
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);
