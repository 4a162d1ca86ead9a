//! The script engine: the embedded registry, startup loading, and invocation
//! with `EVALSHA` and an `EVAL` fallback.
//!
//! Every file under `lua/` is embedded at compile time and known by its path
//! without the extension (`lua/limits/try_increment.lua` is
//! `limits/try_increment`). Operations call their script with `EVALSHA`; when
//! the server answers `NOSCRIPT` (it restarted, failed over, or someone ran
//! `SCRIPT FLUSH`) the call is repeated once with `EVAL`, which runs the
//! script and caches it again. `NOSCRIPT` means the script did not run, so the
//! repeat can never apply an operation twice. [`stats`] counts both.
//!
//! [`Scripts::load`] at startup saves that one extra round trip on the first
//! call of each script, and checks that the server hashes the sources as we
//! do.

mod batch;
mod invoke;
mod registry;
mod reply;

pub use batch::{Batch, BatchConnection, Operation};
pub use invoke::{stats, Stats};
pub use registry::{Loaded, Script, Scripts};

pub(crate) use batch::run_one;
#[cfg(test)]
pub(crate) use invoke::words;
pub(crate) use invoke::Invocation;
pub(crate) use reply::Reply;

/// A `static` [`Script`] for `lua/<name>.lua`.
///
/// `include_str!` makes a missing or misspelt script a compile error, and
/// names the same bytes that the `include_dir` registry embeds.
macro_rules! embedded {
    ($name:literal) => {
        $crate::script::Script::embedded(
            $name,
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $name, ".lua")),
        )
    };
}
pub(crate) use embedded;
