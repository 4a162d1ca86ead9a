//! The Redis ACL permissions nolock needs, for a dedicated Redis user.
//!
//! Every nolock operation is a script, and Redis 7 checks a script's
//! `redis.call` commands and keys against the ACL of the user that runs it,
//! so the user needs the script commands **and** every command the scripts
//! call, on every key they touch. [`COMMANDS`] is that list; the unit tests
//! check it against the embedded scripts, and `tests/acl.rs` runs every
//! module as a user that has exactly these permissions and nothing else.
//!
//! Keys: grant the prefixes your application passes to nolock, **and** the
//! same prefixes after a `{`: keys that nolock derives (fence lock and
//! counter keys, `MultiLimiter` limits) turn an untagged key into a hash tag
//! (`app:job` gives `{app:job}:lock`; see [`crate::keys::derive`]).
//! The [`Client`](crate::Client) handles keep every key under `{nolock:`,
//! their stored configurations included (`{nolock:config}`, see
//! [`crate::config`]): grant `~{nolock:*` for them. Locks with slot fences
//! ([`FenceSource::PerSlot`](crate::fence::FenceSource::PerSlot)) and
//! fenced semaphores ([`Semaphore::fenced`](crate::semaphore::Semaphore::fenced))
//! also write their slot's counter ([`crate::fence::slot_counter`]): grant
//! `~{*}!nolock:fences`.
//!
//! ```text
//! ACL SETUSER app-limits on >secret resetkeys ~app:* ~{app:* resetchannels -@all
//!     +evalsha +evalsha_ro +eval +eval_ro +script|load +del +get +set +incr
//!     +incrby +hget +hmget +hgetall +hset +hincrby +zadd +zcard +zrange
//!     +zrangebyscore +zrank +zrem +zremrangebyscore +zscore +exists +type +pexpire
//!     +pexpireat +pexpiretime +pttl +time
//! ```
//!
//! On a cluster, add [`CLUSTER_COMMANDS`] (`Batch::run` reads the slot
//! map); for acknowledged locks and semaphores, [`ACKNOWLEDGED_COMMANDS`]. [`OPTIONAL_COMMANDS`] are used when granted and worked around
//! when not. Your own scripts run through the engine need the commands they
//! call, on top of these.
//!
//! ```
//! let rule = format!("on >secret resetkeys ~app:* ~{{app:* -@all {}", nolock::acl::COMMANDS);
//! assert!(rule.contains("+evalsha "));
//! ```

/// The commands nolock sends or its scripts call, as ACL rules (`+name`,
/// `+command|subcommand`), separated by spaces.
///
/// * `evalsha`, `evalsha_ro`: every call (`_ro` for read-only scripts);
///   `eval`, `eval_ro`: the fallback after `NOSCRIPT`.
/// * `script|load`: [`Scripts::load`](crate::Scripts::load).
/// * `del`: the rate scripts delete a limit that is full again, and
///   `rate::Limiter::reset` / `MultiLimiter::reset` (`lua/rate/reset.lua`)
///   delete its state; `semaphore/release` deletes a set left with its tag
///   alone (no permit).
/// * The rest are called by the scripts: strings and counters (`get`, `set`,
///   `incr`, `incrby`), hashes (`hget`, `hmget`, `hgetall`,
///   `hset`, `hincrby`), sorted sets for the semaphore's holders and a fair
///   lock's waiting line (`zadd`, `zcard`, `zrange`, `zrangebyscore`,
///   `zrank`, `zrem`, `zremrangebyscore`, `zscore`), `type` (the semaphore
///   and a fair lock check their keys' types before writing), expiry (`pexpire`, `pexpireat`, `pexpiretime`, `pttl`),
///   `exists`, and `time` (the server clock every rate decision reads).
pub const COMMANDS: &str = "+evalsha +evalsha_ro +eval +eval_ro +script|load +del \
+get +set +incr +incrby +hget +hmget +hgetall +hset +hincrby +zadd +zcard +zrange \
+zrangebyscore +zrank +zrem +zremrangebyscore +zscore +exists +type +pexpire +pexpireat +pexpiretime \
+pttl +time";

/// What a cluster needs on top of [`COMMANDS`]: `cluster|slots`, read by
/// [`Batch::run`](crate::Batch::run) to split a batch by node.
pub const CLUSTER_COMMANDS: &str = "+cluster|slots";

/// Used when granted, worked around when not:
///
/// * `info`: lets [`Scripts::load`](crate::Scripts::load) tell a single
///   server from a cluster in its one pipelined round trip, and find the
///   native commands a server has (Valkey's `SET ... IFEQ`); without it,
///   `load` sends each script once more, one by one, and every call runs
///   its script.
/// * `publish` (with the channel pattern `&{app:*`): `fence/release` (and `fence/release_fair`) wakes
///   the fence `Waiters` of the resource (channel `keys::derive(resource,
///   "released")`, sent only while their flag `keys::derive(resource,
///   "waiting")`, under the key pattern `~{app:*`, exists) through
///   `redis.pcall`, so a refused publish does not fail the release; waiters
///   then wake on their backoff instead. `semaphore/release_fair` wakes a
///   fair semaphore's waiters the same way, by ticket, on
///   `keys::derive(key, "released")` when its line exists. `subscribe`
///   and `unsubscribe` are what the `Waiters`' own connection needs (without
///   `unsubscribe` it stays subscribed to channels nobody waits on).
/// * `config|get`: the fence durability check reads the persistence
///   settings; without it, it reports what `info` shows.
pub const OPTIONAL_COMMANDS: &str = "+info +publish +subscribe +unsubscribe +config|get";

/// What acknowledged locks and semaphores need on top of [`COMMANDS`]:
/// `wait` ([`crate::fence::Lock::acknowledged`],
/// [`crate::semaphore::Semaphore::acknowledged`]). Their
/// `acknowledged_on_disk` needs `+waitaof` instead, which only servers that
/// have the command (Redis 7.2+, Valkey 8) accept in an ACL rule. Without
/// the permission, their acquires release what they were granted and
/// answer [`crate::Error::Redis`] (`NOPERM`).
pub const ACKNOWLEDGED_COMMANDS: &str = "+wait";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scripts;

    /// The command name at the start of `redis.call(` arguments.
    fn command(args: &str) -> String {
        args.trim_start_matches(['\'', '"'])
            .split(['\'', '"'])
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase()
    }

    #[test]
    fn every_command_a_script_calls_is_granted() {
        let granted: Vec<&str> = COMMANDS.split_whitespace().collect();
        let mut called = Vec::new();
        for script in Scripts::all() {
            for part in script.source().split("redis.call(").skip(1) {
                let name = command(part);
                assert!(
                    granted.contains(&format!("+{name}").as_str()),
                    "{} calls {name}, which acl::COMMANDS does not grant",
                    script.name()
                );
                called.push(name);
            }
            // pcall: a refused command does not fail the script, so it may
            // be optional.
            for part in script.source().split("redis.pcall(").skip(1) {
                let name = format!("+{}", command(part));
                assert!(
                    granted.contains(&name.as_str()) || OPTIONAL_COMMANDS.contains(&name),
                    "{} pcalls {name}, in neither list",
                    script.name()
                );
            }
        }
        // Nothing granted that no script or wrapper uses.
        for rule in &granted {
            let name = rule.trim_start_matches('+');
            let wrapper = [
                "evalsha",
                "evalsha_ro",
                "eval",
                "eval_ro",
                "script|load",
                "del",
            ];
            assert!(
                wrapper.contains(&name) || called.iter().any(|c| c == name),
                "{rule} is granted but unused"
            );
        }
    }
}
