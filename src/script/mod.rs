//! The script engine: the embedded registry, startup loading, and invocation
//! with `EVALSHA` and a `NOSCRIPT` fallback.
//!
//! Every file under `lua/` is embedded at compile time and known by its path
//! without the extension (`lua/limits/try_increment.lua` is
//! `limits/try_increment`). Operations call their script with `EVALSHA`; when
//! the server answers `NOSCRIPT` (it restarted, failed over, evicted it, or
//! someone ran `SCRIPT FLUSH`) the call is repeated once, pipelined after a
//! `SCRIPT LOAD` of the script on the same connection. A loaded script stays
//! until the next flush, whereas one created by `EVAL` sits in the `EVAL`
//! script LRU of Redis >= 7.4 and Valkey >= 8.0 (500 entries, shared with
//! every other client's `EVAL`s). Only where `SCRIPT LOAD` is refused (an ACL
//! or a proxy) is the call then sent as `EVAL`. `NOSCRIPT` means the script
//! did not run, so the repeat can never apply an operation twice. [`stats`]
//! counts calls and fallbacks.
//!
//! [`Scripts::load`] at startup saves that one extra round trip on the first
//! call of each script, and checks that the server hashes the sources as we
//! do.
//!
//! # Batches
//!
//! A [`Batch`] holds many [`Operation`] values of one kind (each checked when
//! it was built) and sends them as one pipeline of `EVALSHA`s per server. The
//! entries that come back `NOSCRIPT` did not run; exactly those are sent
//! again as one pipeline that first loads their scripts (one `SCRIPT LOAD`
//! per script), so a flushed script cache costs one extra round trip and
//! never runs an entry twice. On a cluster the batch is
//! split by the primary that owns each entry's slot and the parts go out in
//! parallel. [`stats`] counts one call per entry, one fallback per entry that
//! got `NOSCRIPT`, and one batch per [`Batch::run`].
//!
//! # Your own scripts
//!
//! A directory of your own Lua files, embedded with [`crate::scripts!`]
//! into a [`ScriptDir`], runs through the same engine: a [`Call`] is built
//! on the same `Invocation` as nolock's operations and is an
//! [`Operation`], so it has the fallback, the read-only path, the
//! cross-slot check, the resends and [`stats`], alone or in a [`Batch`].
//! [`Scripts::load_with`] loads your scripts with nolock's. See `user.rs`.
//!
//! # Clusters and failover
//!
//! Every call is routed by its keys, which share one slot
//! ([`crate::Error::CrossSlot`] otherwise, before I/O). A call answered
//! `NOSCRIPT` by whichever node served it is loaded and run again there: the
//! `SCRIPT LOAD` + `EVALSHA` pipeline is routed by the `EVALSHA`'s key. A call
//! answered `MOVED` or `READONLY`, which a node sends without running
//! anything when the slot has a new owner, is sent again once redis-rs has
//! refreshed its slot map ([`Stats::redirects`]). A call answered `ASK` or
//! `TRYAGAIN` (its slot is being migrated), `CLUSTERDOWN`, `LOADING` or
//! `MASTERDOWN` is sent again after a short wait ([`Stats::retries`]): nolock
//! waits out a migration rather than sending `ASKING` to the importing node,
//! which the generic `ConnectionLike` API gives no way to address. All
//! resends share one budget: 8 within about 1.3 s. Nothing else is ever sent twice, which is why the cluster client
//! must be built with `retries(0)` (see the crate docs).
//!
//! **What a failover keeps.** `CLUSTER FAILOVER` on a replica, without
//! options, is coordinated: the primary stops taking writes, the replica
//! catches up to the primary's last write, and only then takes over. Every
//! write a client saw acknowledged is on the new primary; calls in flight get
//! `MOVED` and are re-sent by nolock. Counts stay exact (the failover test in
//! `tests/cluster_failover.rs` checks it under load). The new primary's
//! script cache may be empty: the `NOSCRIPT` fallback covers it, and
//! [`Scripts::load`] after a failover avoids the extra round trip.
//!
//! **What a forced failover can lose.** Replication is asynchronous: a
//! primary acknowledges a write before any replica has it.
//!
//! * `CLUSTER FAILOVER FORCE` promotes the replica without waiting to catch
//!   up with the primary (which may be unreachable); the primaries still vote.
//!   Writes the old primary acknowledged but had not yet sent are lost.
//! * `CLUSTER FAILOVER TAKEOVER` promotes the replica without any vote. The
//!   same writes are lost, and if the old primary is still serving clients on
//!   the other side of a partition, both accept writes for the same slots
//!   until it learns of the new epoch; its writes are then discarded.
//! * An automatic failover after a primary fails loses the same way as
//!   `FORCE`.
//!
//! For nolock, a lost write means a counter lower than the admissions the
//! clients saw (a limit admits more than it should, for one window), or a
//! fencing token handed out twice. What operators can do:
//!
//! * `min-replicas-to-write 1` with `min-replicas-max-lag 1..10` on primaries:
//!   a primary cut off from its replicas refuses writes (a definite
//!   [`crate::Error::Redis`]) instead of accepting writes it is about to lose.
//!   This bounds the loss to the last seconds of lag.
//! * `WAIT 1 <ms>` after an operation whose loss matters (a fencing token, a
//!   payment quota): it returns how many replicas have the write. Scripts
//!   cannot call `WAIT` themselves; send it on the same connection after the
//!   call. It narrows the window; it does not make replication synchronous.
//! * Prefer the coordinated `CLUSTER FAILOVER` for maintenance; keep `FORCE`
//!   and `TAKEOVER` for a primary that is really gone.
//! * `appendonly yes` with `appendfsync always` protects against a restart
//!   of a node: every write is on disk before its reply. `everysec` can lose
//!   about the last second of writes when the machine goes down (for
//!   fences: grants handed out again; [`crate::fence::durability`] reports
//!   it); a crash of the server process alone loses nothing acknowledged
//!   (`examples/everysec_loss.rs`). Neither protects
//!   against a failover to a replica that was behind.

// Adding an operation that batches: give the module a value type holding its
// `Invocation` (built by a validating constructor) and implement `Operation`
// for it (`invocation()` and `decode()`); the single-call function is then
// `run_one(&Op::new(..)?, conn)`. See `limits::TryIncrement`.
mod batch;
mod call;
#[cfg_attr(not(test), allow(dead_code))]
mod compose;
mod invoke;
pub(crate) mod native;
mod once;
mod registry;
mod reply;
mod user;

pub use batch::{Batch, BatchConnection, Map, Operation};
pub use call::Call;
pub use invoke::{stats, Stats};
pub use once::{Idempotent, DEFAULT_HORIZON, MAX_ID_LEN};
pub use registry::{Loaded, Script, Scripts};
pub use user::ScriptDir;

pub(crate) use batch::run_one;
pub(crate) use compose::ID_REUSED;
#[cfg(test)]
pub(crate) use invoke::tests as tests_support;
#[cfg(test)]
pub(crate) use invoke::words;
pub(crate) use invoke::{count_retry, is_never_sent, is_resendable, never_sent, Invocation};
pub(crate) use reply::Reply;

/// A `static` [`Script`] for `lua/<name>.lua`.
///
/// `include_str!` makes a missing or misspelt script a compile error, and
/// names the same composed bytes (`build.rs`) that the `include_dir`
/// registry embeds.
macro_rules! embedded {
    ($name:literal) => {
        $crate::script::Script::embedded(
            $name,
            include_str!(concat!(env!("OUT_DIR"), "/lua/", $name, ".lua")),
        )
    };
}
pub(crate) use embedded;
