use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use redis::{aio::ConnectionLike, Arg, Cmd, ErrorKind, ServerErrorKind, ToRedisArgs, Value};

use super::Script;
use crate::{Error, Result};

static CALLS: AtomicU64 = AtomicU64::new(0);
static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Process-wide counters of script calls, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Script calls sent with `EVALSHA` (or `EVALSHA_RO`).
    pub calls: u64,
    /// Calls that got `NOSCRIPT` and were sent again with `EVAL`: each one cost
    /// an extra round trip. A steady rise means the script cache keeps being
    /// emptied (restarts, failovers, `SCRIPT FLUSH`) and [`crate::Scripts::load`]
    /// is worth calling after reconnects.
    pub noscript_fallbacks: u64,
}

/// A snapshot of the process-wide [`Stats`].
///
/// ```
/// let before = nolock::stats();
/// assert!(nolock::stats().calls >= before.calls);
/// ```
pub fn stats() -> Stats {
    Stats {
        calls: CALLS.load(Relaxed),
        noscript_fallbacks: FALLBACKS.load(Relaxed),
    }
}

/// One call of one script: `EVALSHA sha numkeys key... arg...`, with the
/// `EVAL` form built from it only when the server has lost the script.
#[derive(Debug, Clone)]
pub(crate) struct Invocation {
    script: &'static Script,
    cmd: Cmd,
}

impl Invocation {
    pub(crate) fn new(script: &'static Script, keys: &[&str]) -> Self {
        let name = if script.is_read_only() {
            "EVALSHA_RO"
        } else {
            "EVALSHA"
        };
        let mut cmd = redis::cmd(name);
        cmd.arg(script.sha1()).arg(keys.len()).arg(keys);
        Invocation { script, cmd }
    }

    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// The `EVALSHA` command, as sent.
    #[cfg(test)]
    pub(crate) fn command(&self) -> &Cmd {
        &self.cmd
    }

    /// The same call as `EVAL source numkeys key... arg...`.
    pub(crate) fn fallback_command(&self) -> Cmd {
        let name = if self.script.is_read_only() {
            "EVAL_RO"
        } else {
            "EVAL"
        };
        let mut eval = redis::cmd(name);
        eval.arg(self.script.source());
        // Skip the command name and the SHA1; numkeys, keys and args follow unchanged.
        for arg in self.cmd.args_iter().skip(2) {
            if let Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }

    /// Run the script: one round trip, or two when the server answers `NOSCRIPT`.
    ///
    /// Nothing else is retried. `NOSCRIPT` is a promise from the server that
    /// the script did not run; every other failure is returned as it is.
    pub(crate) async fn run<C>(&self, conn: &mut C) -> Result<Value>
    where
        C: ConnectionLike + Send,
    {
        CALLS.fetch_add(1, Relaxed);
        match send(conn, &self.cmd).await {
            Err(err) if is_noscript(&err) => {
                FALLBACKS.fetch_add(1, Relaxed);
                send(conn, &self.fallback_command())
                    .await
                    .map_err(Error::from_redis)
            }
            result => result.map_err(Error::from_redis),
        }
    }
}

async fn send<C>(conn: &mut C, cmd: &Cmd) -> redis::RedisResult<Value>
where
    C: ConnectionLike + Send,
{
    conn.req_packed_command(cmd).await?.extract_error()
}

pub(crate) fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// The words of a command, for tests that check exactly what is sent.
#[cfg(test)]
pub(crate) fn words(cmd: &Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|arg| match arg {
            Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => "<cursor>".into(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    static ECHO: Script = Script::embedded("test/echo", "return ARGV");

    #[test]
    fn builds_evalsha_with_keys_then_args() {
        let call = Invocation::new(&ECHO, &["a", "b"]).arg(7u64).arg("x");
        assert_eq!(
            words(call.command()),
            ["EVALSHA", ECHO.sha1(), "2", "a", "b", "7", "x"]
        );
    }

    #[test]
    fn fallback_is_the_same_call_with_the_source() {
        let call = Invocation::new(&ECHO, &["a"]).arg(7u64);
        assert_eq!(
            words(&call.fallback_command()),
            ["EVAL", "return ARGV", "1", "a", "7"]
        );
    }

    #[test]
    fn read_only_scripts_use_the_ro_commands() {
        static RO: Script = Script::embedded("test/ro", "#!lua flags=no-writes\nreturn 1");
        let call = Invocation::new(&RO, &["k"]);
        assert_eq!(words(call.command())[0], "EVALSHA_RO");
        assert_eq!(words(&call.fallback_command())[0], "EVAL_RO");
    }
}
