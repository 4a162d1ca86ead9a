//! Native commands that meet a script's contract exactly, used where the
//! server has them. [`crate::Scripts::load`] reads the server's name and
//! version once (`INFO server`, in its pipeline) and records here what it
//! found; the operations ask.
//!
//! Today one: Valkey >= 8.1's `SET key value IFEQ expected GET`, which
//! writes only if the key holds `expected` and answers the value it found,
//! so `cas::compare_and_set` with an expected value needs no script there.
//! What is recorded is process-wide (the last load wins). A server that
//! lacks the option answers `ERR syntax error` without running anything,
//! and that call goes through the script instead
//! ([`is_unsupported_option`]), so a process that talks to an older server
//! too (a rolling upgrade, two deployments) stays correct at the cost of
//! that extra round trip on the older one.
//!
//! Where a newer command would serve another call, for the next server
//! build: Valkey 9's `DELIFEQ key value` is exactly the token-checked delete
//! of `cas::compare_and_delete` (it answers 1 or 0, so a mismatch would need
//! a second read for `current`), and, with the lock's value as the token, of
//! a fenced release (but not its `PUBLISH` to the waiters). Neither is used
//! yet: `compare_and_delete`'s contract returns the value found.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

static SET_IFEQ: AtomicBool = AtomicBool::new(false);

/// True when the last [`crate::Scripts::load`] found a server with
/// `SET ... IFEQ` (Valkey 8.1 or later).
pub(crate) fn set_ifeq() -> bool {
    SET_IFEQ.load(Relaxed)
}

/// Record what `info` (the text of `INFO server`) says the server has;
/// returns whether it has `SET ... IFEQ`.
pub(crate) fn detect(info: &str) -> bool {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
    };
    let ifeq = field("valkey_version").is_some_and(|v| at_least(v, (8, 1)));
    SET_IFEQ.store(ifeq, Relaxed);
    ifeq
}

/// "8.1.8" >= (8, 1); anything unreadable is not.
fn at_least(version: &str, (major, minor): (u64, u64)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u64>());
    match (parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// The refusal of a server that does not know a command's option: it ran
/// nothing, so the script may run instead.
pub(crate) fn is_unsupported_option(err: &redis::RedisError) -> bool {
    matches!(err.kind(), redis::ErrorKind::Server(_))
        && err
            .to_string()
            .to_ascii_lowercase()
            .contains("syntax error")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_compared_by_number() {
        assert!(at_least("8.1.8", (8, 1)) && at_least("9.1.2", (8, 1)));
        assert!(at_least("10.0.0", (8, 1)));
        assert!(!at_least("8.0.1", (8, 1)) && !at_least("7.2.4", (8, 1)));
        assert!(!at_least("", (8, 1)) && !at_least("8", (8, 1)));
    }

    #[test]
    fn only_a_valkey_version_counts() {
        // Valkey also reports redis_version:7.2.4 for compatibility.
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
        let old =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n";
        let redis = "# Server\r\nredis_version:7.4.1\r\n";
        assert!(detect(valkey));
        assert!(!detect(old));
        assert!(!detect(redis));
    }

    #[test]
    fn an_unknown_option_is_a_refusal_to_run() {
        let reply = crate::script::tests_support::error_reply;
        // Redis 7.0 and Valkey 8.0, asked for SET ... IFEQ.
        assert!(is_unsupported_option(&reply("ERR syntax error")));
        let wrongtype = reply("WRONGTYPE Operation against a key holding the wrong kind of value");
        assert!(!is_unsupported_option(&wrongtype));
    }
}
