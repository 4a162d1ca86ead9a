//! Acknowledged writes: a grant (a fenced lock's, a semaphore's permits)
//! handed out only once replicas, and with [`Ack::on_disk`] the primary's
//! append-only file, hold it. Shared by [`crate::fence::Lock`] and
//! [`crate::semaphore::Semaphore`].
//!
//! Redis replicates asynchronously: a write the primary answered but no
//! replica received is lost in a failover. `WAIT replicas timeout` in the
//! same pipeline as the script, on the same node, answers how many replicas
//! have every write made so far on that connection; `WAITAOF 1 replicas
//! timeout` (Redis 7.2 and later, Valkey 8) answers how many have written
//! it to their append-only file with `fsync`, the primary's own included.
//!
//! A grant costs at most one `timeout` of waiting: where the script must be
//! sent again (`NOSCRIPT`), the wait of the first pipeline has run anyway,
//! so the second gets only what is left (at least 1 ms: `0` means forever).
//! The server enforces a wait's timeout at its cron tick (`1000 / hz` ms),
//! so an idle server at the default `hz 10` answers up to 100 ms late.

use std::time::Duration;

use redis::{Cmd, RedisError, Value};

use crate::script::Invocation;
use crate::{validate, Error, Result};

/// How many replicas must confirm a grant, how long to wait for them, and
/// whether the confirmation is of the append-only file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ack {
    replicas: u64,
    timeout_ms: u64,
    disk: bool,
}

/// What the command after the script said of the grant.
#[derive(Debug)]
pub(crate) enum Confirmed {
    /// As many confirmations as asked.
    Enough,
    /// Fewer in time (or the wait was cut short, `UNBLOCKED`, or its reply
    /// lost): the number of replicas that did confirm.
    Short(u64),
    /// The server refused the command itself (`NOPERM`, an unknown command,
    /// `WAITAOF` without `appendonly`): no grant can ever be confirmed
    /// this way, which the caller must hear as such.
    Refused(RedisError),
}

impl Ack {
    /// Confirmation by `replicas` replicas' memory (`WAIT`).
    pub(crate) fn replicas(replicas: u64, timeout: Duration) -> Result<Ack> {
        if replicas == 0 {
            return Err(Error::ZeroLimit { what: "replicas" });
        }
        Ok(Ack {
            replicas,
            timeout_ms: validate::millis("timeout", timeout)?,
            disk: false,
        })
    }

    /// Confirmation by the primary's append-only file and `replicas`
    /// replicas' (`WAITAOF 1 replicas timeout`); `replicas` may be 0.
    pub(crate) fn on_disk(replicas: u64, timeout: Duration) -> Result<Ack> {
        Ok(Ack {
            replicas,
            timeout_ms: validate::millis("timeout", timeout)?,
            disk: true,
        })
    }

    /// How many replicas must confirm.
    pub(crate) fn count(&self) -> u64 {
        self.replicas
    }

    /// True when the primary's own append-only file must have it too.
    pub(crate) fn disk(&self) -> bool {
        self.disk
    }

    /// The wait, given what is left of the timeout after `spent`. With
    /// nothing left it asks without waiting (`WAIT 0 0`, `WAITAOF 0 0 0`:
    /// met at once, they answer the confirmations known now), since a
    /// timeout of 0 means "forever" to both, and even 1 ms costs up to one
    /// server tick (`1000 / hz` ms: Redis checks timeouts in its cron).
    fn command(&self, spent: Duration) -> Cmd {
        let spent_ms = u64::try_from(spent.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let left_ms = self.timeout_ms.saturating_sub(spent_ms);
        let (local, replicas) = if left_ms == 0 {
            (0, 0)
        } else {
            (1, self.replicas)
        };
        let mut cmd;
        if self.disk {
            cmd = redis::cmd("WAITAOF");
            cmd.arg(local);
        } else {
            cmd = redis::cmd("WAIT");
        }
        cmd.arg(replicas).arg(left_ms);
        cmd
    }

    /// Runs `call`, then the wait in the same round trip: the script's reply
    /// and what the wait confirmed. Where the script must be sent again
    /// (`NOSCRIPT`: the first wait ran anyway, for its whole timeout
    /// without a replica), the second wait gets only what is left of the
    /// timeout, counted from the first send: one timeout in all, not two.
    pub(crate) async fn run<C>(&self, conn: &mut C, call: &Invocation) -> Result<(Value, Confirmed)>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        let (reply, waited) = call.run_then(conn, |spent| self.command(spent)).await?;
        Ok((reply, self.judge(waited)))
    }

    /// Keeps a grant the wait confirmed; otherwise gives it back with
    /// `release` (best effort: unreleased, it expires at its TTL; it
    /// answers how many replicas the server has, [`connected_replicas`])
    /// and answers `unconfirmed(replicas that did confirm, connected)`, or
    /// the server's refusal of the wait itself as [`Error::Redis`].
    pub(crate) async fn keep_or_give_back<G, F, Fut>(
        &self,
        confirmed: Confirmed,
        grant: G,
        release: F,
        unconfirmed: impl FnOnce(u64, Option<u64>) -> Error,
    ) -> Result<G>
    where
        F: FnOnce(G) -> Fut,
        Fut: std::future::Future<Output = Option<u64>>,
    {
        match confirmed {
            Confirmed::Enough => Ok(grant),
            Confirmed::Short(acknowledged) => {
                let connected = release(grant).await;
                Err(unconfirmed(acknowledged, connected))
            }
            Confirmed::Refused(err) => {
                release(grant).await;
                Err(Error::Redis(err))
            }
        }
    }

    /// The wait's reply, judged.
    fn judge(&self, waited: redis::RedisResult<Value>) -> Confirmed {
        let reply = match waited {
            Ok(reply) => reply,
            Err(err) if is_refusal(&err) => return Confirmed::Refused(err),
            // Cut short (`UNBLOCKED`: a failover demoted the node), asked of
            // a node that is a replica by now, or lost: nothing confirmed.
            Err(_) => return Confirmed::Short(0),
        };
        let (local, replicas) = match (&reply, self.disk) {
            (Value::Int(n), false) => (1, *n),
            (Value::Array(counts), true) => match counts.as_slice() {
                [Value::Int(local), Value::Int(replicas)] => (*local, *replicas),
                _ => (0, 0),
            },
            // Not what the command answers: counted as confirmed by none.
            _ => (0, 0),
        };
        let replicas = u64::try_from(replicas).unwrap_or(0);
        if local >= 1 && replicas >= self.replicas {
            Confirmed::Enough
        } else {
            Confirmed::Short(replicas)
        }
    }
}

/// How many replicas the server behind `conn` has connected
/// (`connected_slaves` of `INFO replication`), read after a wait fell short
/// so that the error can say "this server has no replica". `None` when the
/// server does not say: `info` not allowed, or a cluster connection, where
/// the command is not routed to the grant's node.
pub(crate) async fn connected_replicas<C>(conn: &mut C) -> Option<u64>
where
    C: redis::aio::ConnectionLike + Send,
{
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await
        .ok()?;
    parse_connected(&info)
}

fn parse_connected(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
}

/// A wait the server will never run on this connection: not allowed by the
/// ACL, unknown to the server (`WAITAOF` before Redis 7.2), or `WAITAOF`
/// where `appendonly` is off.
fn is_refusal(err: &RedisError) -> bool {
    if err.code() == Some("NOPERM") {
        return true;
    }
    let text = err.to_string().to_ascii_lowercase();
    text.contains("unknown command") || text.contains("appendonly")
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ErrorKind;

    fn server_error(text: &str) -> RedisError {
        crate::script::tests_support::error_reply(text)
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_sent() {
        assert!(matches!(
            Ack::replicas(0, Duration::from_millis(5)),
            Err(Error::ZeroLimit { what: "replicas" })
        ));
        assert!(matches!(
            Ack::replicas(1, Duration::ZERO),
            Err(Error::ZeroDuration { what: "timeout" })
        ));
        assert!(Ack::on_disk(0, Duration::from_millis(5)).is_ok());
        assert!(Ack::on_disk(0, Duration::from_micros(10)).is_err());
    }

    #[test]
    fn the_connected_replicas_are_read_from_info() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=x\r\n";
        assert_eq!(parse_connected(info), Some(2));
        assert_eq!(parse_connected("role:master\r\n"), None);
        assert_eq!(parse_connected("connected_slaves:x\r\n"), None);
    }

    #[test]
    fn wait_counts_replicas() {
        let ack = Ack::replicas(2, Duration::from_millis(5)).unwrap();
        assert!(matches!(ack.judge(Ok(Value::Int(2))), Confirmed::Enough));
        assert!(matches!(ack.judge(Ok(Value::Int(3))), Confirmed::Enough));
        assert!(matches!(ack.judge(Ok(Value::Int(1))), Confirmed::Short(1)));
        assert!(matches!(ack.judge(Ok(Value::Nil)), Confirmed::Short(0)));
        let cut = server_error("UNBLOCKED force unblock from blocking operation");
        assert!(matches!(ack.judge(Err(cut)), Confirmed::Short(0)));
        let lost = RedisError::from((ErrorKind::Io, "connection reset"));
        assert!(matches!(ack.judge(Err(lost)), Confirmed::Short(0)));
        let denied = server_error("NOPERM User app has no permissions to run the 'wait' command");
        assert!(matches!(ack.judge(Err(denied)), Confirmed::Refused(_)));
    }

    #[test]
    fn the_wait_gets_what_is_left_of_the_timeout_and_never_blocks_past_it() {
        let ms = Duration::from_millis;
        let ack = Ack::replicas(1, ms(150)).unwrap();
        let words = |spent| crate::script::words(&ack.command(spent));
        assert_eq!(words(Duration::ZERO), ["WAIT", "1", "150"]);
        assert_eq!(words(ms(100)), ["WAIT", "1", "50"]);
        // Rounded up: never past the caller's timeout.
        assert_eq!(
            words(ms(100) + Duration::from_micros(1)),
            ["WAIT", "1", "49"]
        );
        // Nothing left: ask what is confirmed now, without blocking (a
        // timeout of 0 with 1 replica asked would wait forever).
        assert_eq!(words(ms(150)), ["WAIT", "0", "0"]);
        assert_eq!(words(Duration::from_secs(60)), ["WAIT", "0", "0"]);
        let disk = Ack::on_disk(1, ms(300)).unwrap();
        let disk_words = |spent| crate::script::words(&disk.command(spent));
        assert_eq!(disk_words(ms(120)), ["WAITAOF", "1", "1", "180"]);
        assert_eq!(disk_words(ms(300)), ["WAITAOF", "0", "0", "0"]);
    }

    /// The first acquire after a `SCRIPT FLUSH`: the first pipeline's wait
    /// ran its whole timeout (the script did not run), so the wait after
    /// the fallback gets what is left of it: nothing here, so it only asks.
    #[tokio::test]
    async fn after_noscript_the_second_wait_gets_only_what_is_left() {
        use crate::script::tests_support::{Scripted, SlowFirst, NOSCRIPT};
        static ECHO: crate::script::Script =
            crate::script::Script::embedded("test/ack", "return 1");
        let call = Invocation::new(&ECHO, &["k"]);
        let ack = Ack::replicas(1, Duration::from_millis(50)).unwrap();
        let mut conn = SlowFirst {
            inner: Scripted::new(vec![
                Ok(vec![NOSCRIPT, ":0"]),
                Ok(vec![NOSCRIPT]),
                Ok(vec!["+sha", ":1"]),
                Ok(vec![":1", ":0"]),
            ]),
            first: Some(Duration::from_millis(50)),
        };
        let (reply, confirmed) = ack.run(&mut conn, &call).await.unwrap();
        assert_eq!(reply, Value::Int(1));
        assert!(matches!(confirmed, Confirmed::Short(0)));
        let sent = &conn.inner.sent;
        assert_eq!(sent[0][5..], ["WAIT", "1", "50", "|"]);
        assert_eq!(sent[3], ["EXISTS", "k", "|", "WAIT", "0", "0", "|"]);
    }

    #[test]
    fn waitaof_needs_the_local_file_and_the_replicas() {
        let ack = Ack::on_disk(1, Duration::from_millis(5)).unwrap();
        let counts = |l, r| Ok(Value::Array(vec![Value::Int(l), Value::Int(r)]));
        assert!(matches!(ack.judge(counts(1, 1)), Confirmed::Enough));
        assert!(matches!(ack.judge(counts(0, 1)), Confirmed::Short(1)));
        assert!(matches!(ack.judge(counts(1, 0)), Confirmed::Short(0)));
        assert!(matches!(ack.judge(Ok(Value::Int(1))), Confirmed::Short(0)));
        let off = server_error(
            "ERR WAITAOF cannot be used when numlocal is set but appendonly is disabled.",
        );
        assert!(matches!(ack.judge(Err(off)), Confirmed::Refused(_)));
        let old = server_error("ERR unknown command 'WAITAOF', with args beginning with: '1' ");
        assert!(matches!(ack.judge(Err(old)), Confirmed::Refused(_)));
        let local_only = Ack::on_disk(0, Duration::from_millis(5)).unwrap();
        assert!(matches!(local_only.judge(counts(1, 0)), Confirmed::Enough));
        assert!(matches!(
            local_only.judge(counts(0, 0)),
            Confirmed::Short(0)
        ));
    }
}
