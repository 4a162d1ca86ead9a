//! One script call: [`Invocation`] builds it (checked arguments, the
//! `EVALSHA` and its fallbacks) and runs it, with the resends after replies
//! in which nothing ran (`NOSCRIPT`, redirects, `LOADING`, ...).
//!
//! Over 700 lines only with its unit tests (the code is about 570).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use redis::{aio::ConnectionLike, Arg, Cmd, ErrorKind, ServerErrorKind, ToRedisArgs, Value};

use super::Script;
use crate::{keys, observe, Error, Result};

pub(super) static CALLS: AtomicU64 = AtomicU64::new(0);
pub(super) static FALLBACKS: AtomicU64 = AtomicU64::new(0);
pub(super) static BATCHES: AtomicU64 = AtomicU64::new(0);
static REDIRECTS: AtomicU64 = AtomicU64::new(0);
static RETRIES: AtomicU64 = AtomicU64::new(0);
static NEVER_SENT: AtomicU64 = AtomicU64::new(0);
static RETRY_RESENDS: AtomicU64 = AtomicU64::new(0);

/// Count one resend by [`crate::retry::retry`].
pub(crate) fn count_retry() {
    RETRY_RESENDS.fetch_add(1, Relaxed);
}

/// How long to wait before each resend of a call that a server refused
/// without running anything ([`is_resendable`]). The first resend goes at
/// once (a `MOVED` usually needs only the refreshed slot map); the later ones
/// give the nodes time to agree on a new owner, a slot migration time to end,
/// or a restarted server time to load its data. About 1.3 s in all: longer
/// outages reach the caller as a definite [`Error::Redis`].
const RESEND_DELAYS: [Duration; 8] = [
    Duration::ZERO,
    Duration::from_millis(10),
    Duration::from_millis(20),
    Duration::from_millis(40),
    Duration::from_millis(80),
    Duration::from_millis(160),
    Duration::from_millis(320),
    Duration::from_millis(640),
];

/// Process-wide counters of script calls, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Script calls sent with `EVALSHA` (or `EVALSHA_RO`), one per operation,
    /// whether sent alone or inside a [`crate::Batch`].
    pub calls: u64,
    /// Calls that got `NOSCRIPT` and were sent again, after a `SCRIPT LOAD`
    /// in the same pipeline (or with `EVAL` where `SCRIPT LOAD` is refused):
    /// each one cost an extra round trip (in a batch: one extra round trip
    /// per node for all of them). A steady rise means the script cache keeps being emptied
    /// (restarts, failovers, `SCRIPT FLUSH`) and [`crate::Scripts::load`] is
    /// worth calling after reconnects.
    pub noscript_fallbacks: u64,
    /// [`crate::Batch::run`] calls.
    pub batches: u64,
    /// Calls sent again because a cluster node answered `MOVED` or `READONLY`
    /// (the key's slot moved, typically in a failover): the server refused
    /// them without running anything.
    pub redirects: u64,
    /// Calls sent again after a short wait because the server refused them
    /// without running anything: `ASK` or `TRYAGAIN` (a slot migration in
    /// progress), `CLUSTERDOWN`, `LOADING` (a restarted server reading its
    /// data) or `MASTERDOWN`.
    pub retries: u64,
    /// Calls refused by a [`crate::Tracked`] connection that had already
    /// dropped, before anything was sent: reported as a definite
    /// [`Error::Redis`], not [`Error::Indeterminate`].
    pub never_sent: u64,
    /// Operations sent again by [`crate::retry::retry`] (after a lost reply,
    /// for an operation with an id, or after an error in which nothing ran).
    pub retry_resends: u64,
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
        batches: BATCHES.load(Relaxed),
        redirects: REDIRECTS.load(Relaxed),
        retries: RETRIES.load(Relaxed),
        never_sent: NEVER_SENT.load(Relaxed),
        retry_resends: RETRY_RESENDS.load(Relaxed),
    }
}

/// One call of one script: `EVALSHA sha numkeys key... arg...`, with the
/// `SCRIPT LOAD` and `EVAL` forms built from it only when the server has lost
/// the script.
///
/// It is public only so that [`crate::Operation`] can name it; nothing
/// outside the crate can build or use one. Its `Debug` names the script and
/// the slot only: keys and arguments may carry a token or an id.
#[derive(Clone)]
#[allow(
    unnameable_types,
    reason = "the seal of Operation: reachable, never nameable"
)]
pub struct Invocation {
    script: &'static Script,
    cmd: Cmd,
    /// The cluster slot of the keys; `None` for a keyless call.
    slot: Option<u16>,
    /// Set when the keys span several slots: the first key and slot, and the
    /// first key of another slot. The call is refused before I/O.
    cross_slot: Option<[(String, u16); 2]>,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("script", &self.script.name())
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
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
        let slot = keys.first().map(|key| keys::slot(key));
        // A script may only touch keys of one slot on a cluster. Refusing it
        // everywhere (single nodes too) means a key layout that works in
        // development also works on a cluster.
        let cross_slot = keys::split_slot(keys)
            .map(|[(first, a), (second, b)]| [(first.to_owned(), a), (second.to_owned(), b)]);
        Invocation {
            script,
            cmd,
            slot,
            cross_slot,
        }
    }

    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// The `EVALSHA` command, as sent.
    pub(crate) fn command(&self) -> &Cmd {
        &self.cmd
    }

    /// The script this call runs.
    pub(crate) fn script(&self) -> &'static Script {
        self.script
    }

    /// The cluster slot of the call's keys (`None` for a keyless call).
    pub(crate) fn slot(&self) -> Option<u16> {
        self.slot
    }

    /// The keys and the arguments, as sent after `numkeys`.
    pub(crate) fn keys_and_args(&self) -> (Vec<&[u8]>, Vec<&[u8]>) {
        let mut words = self.cmd.args_iter().skip(2).filter_map(|arg| match arg {
            Arg::Simple(bytes) => Some(bytes),
            _ => None,
        });
        let numkeys: usize = words
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .unwrap_or(0);
        let mut rest: Vec<&[u8]> = words.collect();
        let args = rest.split_off(numkeys.min(rest.len()));
        (rest, args)
    }

    /// The same call through `variant`, the script's at-most-once form
    /// (`compose::once`): `record` appended to the keys, `fingerprint` and
    /// `horizon_ms` to the arguments.
    pub(crate) fn once(
        &self,
        variant: &'static Script,
        record: &str,
        fingerprint: &str,
        horizon_ms: u64,
    ) -> Invocation {
        let (keys, args) = self.keys_and_args();
        // Every key was given as a `&str`, so this is lossless.
        let keys: Vec<std::borrow::Cow<'_, str>> =
            keys.iter().map(|k| String::from_utf8_lossy(k)).collect();
        let mut keys: Vec<&str> = keys.iter().map(|k| k.as_ref()).collect();
        keys.push(record);
        let mut call = Invocation::new(variant, &keys);
        for arg in args {
            call = call.arg(arg);
        }
        call.arg(fingerprint).arg(horizon_ms)
    }

    /// [`Error::CrossSlot`] when the keys span several cluster slots.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.cross_slot {
            Some([(first, first_slot), (second, second_slot)]) => Err(Error::CrossSlot {
                first: first.clone(),
                first_slot: *first_slot,
                second: second.clone(),
                second_slot: *second_slot,
            }),
            None => Ok(()),
        }
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

    /// `SCRIPT LOAD source`, which makes the script resident: unlike a
    /// script that `EVAL` created, it is never evicted by the `EVAL` script
    /// LRU of Redis >= 7.4 and Valkey >= 8.0.
    pub(crate) fn load_command(&self) -> Cmd {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(self.script.source());
        load
    }

    /// Run the script: one round trip, or two when the server answers `NOSCRIPT`.
    ///
    /// Only replies in which the server promises that the script did not run
    /// are followed by another send: `NOSCRIPT`, and `MOVED`, `READONLY`,
    /// `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`, `MASTERDOWN` or a script
    /// stopped at a key that left a migrating slot (up to 8
    /// times within about 1.3 s, [`RESEND_DELAYS`]; the cluster connection
    /// refreshes its slot map after `MOVED` and `READONLY`). Every other
    /// failure, above all a lost reply, is returned as it is. A resend
    /// that must wait on a runtime without timers returns [`Error::NoTimer`]
    /// (nothing ran) instead of panicking.
    ///
    /// After `NOSCRIPT` the call goes again as the pipeline `SCRIPT LOAD`,
    /// `EVALSHA` ([`Fallback::Load`]). Were it sent as `EVAL`, the script
    /// would sit in the `EVAL` LRU of Redis >= 7.4 and Valkey >= 8.0, and 500
    /// other applications' `EVAL`s later it would be gone again; on Redis a
    /// later `SCRIPT LOAD` does not even take it out of that LRU. Only if the
    /// `EVALSHA` of that pipeline still gets `NOSCRIPT` (the `SCRIPT LOAD` was
    /// refused, e.g. by an ACL without `script|load` or a proxy, or a flush
    /// came in between) is the call sent as `EVAL` ([`Fallback::Eval`]).
    pub(crate) async fn run<C>(&self, conn: &mut C) -> Result<Value>
    where
        C: ConnectionLike + Send,
    {
        self.check()?;
        CALLS.fetch_add(1, Relaxed);
        let mut observed = observe::Call::start(self.script.name(), || self.first_key());
        let mut fallback = Fallback::None;
        let mut resends = 0;
        loop {
            let sent = match fallback {
                Fallback::None => send(conn, &self.cmd).await,
                Fallback::Load => self.send_loaded(conn).await,
                Fallback::Eval => send(conn, &self.fallback_command()).await,
            };
            match sent {
                Err(err) if is_noscript(&err) && fallback != Fallback::Eval => {
                    if fallback == Fallback::None {
                        FALLBACKS.fetch_add(1, Relaxed);
                        observed.noscript();
                    }
                    fallback = fallback.next();
                }
                Err(err) if is_resendable(&err) && resends < RESEND_DELAYS.len() => {
                    if is_redirect(&err) {
                        REDIRECTS.fetch_add(1, Relaxed);
                    } else {
                        RETRIES.fetch_add(1, Relaxed);
                    }
                    observed.redirect();
                    let delay = RESEND_DELAYS[resends];
                    if !delay.is_zero() {
                        // Nothing ran (a resendable reply), so NoTimer is definite.
                        crate::timer::sleep(delay)?.await;
                    }
                    resends += 1;
                }
                result => {
                    let result = result.map_err(Error::from_redis);
                    observed.finish(&result);
                    return result;
                }
            }
        }
    }

    /// Run the script and then the command `after` builds (a `WAIT`, say)
    /// on the same node, in one pipeline: one round trip. Answers the
    /// script's reply and `after`'s.
    ///
    /// `after` is given the time spent since the first pipeline was sent:
    /// nothing for that pipeline, and, for a command sent again after a
    /// fallback, the time the first one took (a `WAIT` in it ran its whole
    /// timeout even though the script did not run), so that a wait can be
    /// given only what is left of its caller's budget.
    ///
    /// On a cluster connection the pipeline is routed by its one keyed
    /// command, the script (as [`Invocation::run`]'s `SCRIPT LOAD` pipeline
    /// is), so `after` runs on the node that ran the script. When the
    /// pipeline fails as a whole, or the script's reply is one after which
    /// [`Invocation::run`] would send again (`NOSCRIPT`, a redirect), the
    /// script goes through [`Invocation::run`] and `after` follows on its
    /// own: two round trips, only then.
    ///
    /// `after`'s failure is answered beside the script's reply, never as the
    /// call's error: the script has run by then (a `WAIT` that the server
    /// cuts short, `UNBLOCKED` when a failover demotes it, does not undo a
    /// grant), so only the caller knows what it means.
    pub(crate) async fn run_then<C, F>(
        &self,
        conn: &mut C,
        after: F,
    ) -> Result<(Value, redis::RedisResult<Value>)>
    where
        C: ConnectionLike + Send,
        F: Fn(Duration) -> Cmd,
    {
        self.check()?;
        let started = Instant::now();
        let mut pipe = redis::pipe();
        pipe.add_command(self.cmd.clone())
            .add_command(after(Duration::ZERO));
        let replies = conn.req_packed_commands(&pipe, 0, 2).await;
        let mut replies = match replies {
            Ok(replies) if replies.len() == 2 => replies,
            // Nothing is known of the script: lost, or refused as a whole.
            Ok(_) => {
                return Err(Error::from_redis(
                    (
                        ErrorKind::UnexpectedReturnType,
                        "script + command pipeline: not two replies",
                    )
                        .into(),
                ))
            }
            Err(err) if is_noscript(&err) || is_resendable(&err) => Vec::new(),
            Err(err) => return Err(Error::from_redis(err)),
        };
        let second = replies.pop();
        let first = replies.pop();
        match (first.map(Value::extract_error), second) {
            (Some(Ok(value)), Some(after_reply)) => {
                CALLS.fetch_add(1, Relaxed);
                Ok((value, after_reply.extract_error()))
            }
            (Some(Err(err)), _) if !is_noscript(&err) && !is_resendable(&err) => {
                CALLS.fetch_add(1, Relaxed);
                Err(Error::from_redis(err))
            }
            // The script did not run: the full path, then `after` with a
            // read of the script's first key, which routes it to that key's
            // node on a cluster.
            _ => {
                let value = self.run(conn).await?;
                let mut pipe = redis::pipe();
                if let Some(key) = self.first_key() {
                    pipe.cmd("EXISTS").arg(key);
                }
                pipe.add_command(after(started.elapsed()));
                let count = pipe.cmd_iter().count();
                let after_reply =
                    conn.req_packed_commands(&pipe, 0, count)
                        .await
                        .and_then(|mut replies| {
                            replies.pop().map_or_else(
                                || {
                                    Err((
                                        ErrorKind::UnexpectedReturnType,
                                        "no reply to the command after the script",
                                    )
                                        .into())
                                },
                                Value::extract_error,
                            )
                        });
                Ok((value, after_reply))
            }
        }
    }

    /// The first key, for spans that opted in to keys.
    pub(crate) fn first_key(&self) -> Option<String> {
        match (self.cmd.args_iter().nth(2), self.cmd.args_iter().nth(3)) {
            (Some(Arg::Simple(b"0")) | None, _) => None,
            (_, Some(Arg::Simple(key))) => Some(String::from_utf8_lossy(key).into_owned()),
            _ => None,
        }
    }

    /// `SCRIPT LOAD` and `EVALSHA` as one pipeline on one connection; the
    /// reply is the `EVALSHA`'s.
    ///
    /// On a cluster connection redis-rs routes the pipeline by its one keyed
    /// command, the `EVALSHA` (`SCRIPT LOAD` has no key), so the script is
    /// loaded on the node that runs it; a keyless call goes to one node,
    /// both commands with it. The `SCRIPT LOAD` reply is not needed: if it
    /// failed, the `EVALSHA` says `NOSCRIPT` and [`Invocation::run`] goes on
    /// to `EVAL`. An error for the whole pipeline is the `EVALSHA`'s
    /// (`MOVED`, ...: `SCRIPT LOAD` has no key to be redirected for) or a lost
    /// connection, after which the `EVALSHA` may have run: indeterminate.
    async fn send_loaded<C>(&self, conn: &mut C) -> redis::RedisResult<Value>
    where
        C: ConnectionLike + Send,
    {
        let mut pipe = redis::pipe();
        pipe.add_command(self.load_command())
            .add_command(self.cmd.clone());
        let mut values = conn.req_packed_commands(&pipe, 0, 2).await?;
        match (values.pop(), values.len()) {
            (Some(reply), 1) => reply.extract_error(),
            _ => Err((
                ErrorKind::UnexpectedReturnType,
                "SCRIPT LOAD + EVALSHA pipeline: not two replies",
            )
                .into()),
        }
    }
}

/// How far a call has gone past its first `EVALSHA`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fallback {
    /// The plain `EVALSHA`.
    None,
    /// `SCRIPT LOAD` + `EVALSHA` in one pipeline, after a `NOSCRIPT`.
    Load,
    /// `EVAL` with the source, after `NOSCRIPT` even with the `SCRIPT LOAD`.
    Eval,
}

impl Fallback {
    fn next(self) -> Self {
        match self {
            Fallback::None => Fallback::Load,
            Fallback::Load | Fallback::Eval => Fallback::Eval,
        }
    }
}

async fn send<C>(conn: &mut C, cmd: &Cmd) -> redis::RedisResult<Value>
where
    C: ConnectionLike + Send,
{
    conn.req_packed_command(cmd).await?.extract_error()
}

/// Marks an I/O error raised before the request could reach the connection
/// ([`crate::Tracked`] raises it); [`Error::from_redis`] reports it as
/// definite.
///
/// redis-rs 1.8 cannot raise it itself: its multiplexed connection fails a
/// request sent after its I/O task ended with `io::Error::from(BrokenPipe)`,
/// the very error it gives a request whose reply was lost when the
/// connection died under it (`closed_connection_error`, on both paths).
#[derive(Debug)]
pub(crate) struct NeverSent;

impl std::fmt::Display for NeverSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the connection was already closed; the request was not sent")
    }
}

impl std::error::Error for NeverSent {}

pub(crate) fn never_sent() -> redis::RedisError {
    NEVER_SENT.fetch_add(1, Relaxed);
    std::io::Error::new(std::io::ErrorKind::NotConnected, NeverSent).into()
}

/// True when `err` is [`never_sent`]'s mark.
pub(crate) fn is_never_sent(err: &redis::RedisError) -> bool {
    io_error(err)
        .and_then(|io| io.get_ref())
        .is_some_and(|inner| inner.is::<NeverSent>())
}

/// The `std::io::Error` inside a redis-rs I/O error. redis-rs keeps it in
/// an `Arc<dyn Error>` that `source()` hands out as it is.
fn io_error(err: &redis::RedisError) -> Option<&std::io::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let source = std::error::Error::source(err)?;
    match source.downcast_ref::<Shared>() {
        Some(shared) => shared.downcast_ref(),
        None => source.downcast_ref(),
    }
}

pub(crate) fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// A cluster reply saying "not here, nothing ran": `MOVED` (the slot has
/// another owner) or `READONLY` (the node was demoted to replica; scripts
/// check their input before the first write, so the refused write was the
/// first). redis-rs refreshes its slot map on both before sending anything
/// else, so sending again goes to the new owner.
fn is_redirect(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::ReadOnly)
    )
}

/// A reply in which the server promises that nothing ran and that the same
/// request may succeed a moment later: a redirect ([`is_redirect`]), or
///
/// * `ASK`: the key's slot is being migrated and the key is not (or no
///   longer) on this node. nolock waits for the migration to end rather
///   than sending `ASKING` and the script to the named node, because every
///   operation takes any `ConnectionLike`, through which redis-rs's cluster
///   connection cannot be told to route one request to a given node. Once
///   the slot has moved, the old owner answers `MOVED` and the call follows.
/// * `TRYAGAIN`: a multi-key script whose keys are split by a migration.
/// * `CLUSTERDOWN`, `LOADING`, `MASTERDOWN`: the node cannot serve right now.
/// * A script stopped by a key its node does not hold in a slot being
///   migrated ([`is_non_local_key`]): the keys were all there when the
///   script was let in, and one was gone when the script reached it.
///
/// `BUSY` (another script is running) is not resent: it may last until an
/// operator runs `SCRIPT KILL`, so the caller decides.
pub(crate) fn is_resendable(err: &redis::RedisError) -> bool {
    is_redirect(err)
        || matches!(
            err.kind(),
            ErrorKind::Server(
                ServerErrorKind::Ask
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::MasterDown
            )
        )
        || is_non_local_key(err)
}

/// "Script attempted to access a non local key in a cluster node": in a
/// slot being migrated, a node lets a script in only if it holds all of the
/// script's keys (else `ASK` or `TRYAGAIN`, and nothing runs), but inside
/// the script it refuses any command on a key it does not hold. A key can
/// be gone by then in two ways: its TTL ran out between the check and the
/// script (a lock released by expiry at that very millisecond), or the
/// script emptied it (Redis deletes an empty sorted set) and touched it
/// again. nolock's scripts read every key before their first write and
/// never touch a key after a write that may have deleted it (the
/// semaphore's acquire adds before it clears, its release reads the set
/// again only if something is left: `tests/cluster_migration.rs`), so the
/// refused command is the first touch of that key and nothing before it
/// wrote: like `TRYAGAIN`, it is sent again once the migration has moved
/// on. The guide's chapter on your own scripts asks the same of them.
fn is_non_local_key(err: &redis::RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(_))
        && err
            .to_string()
            .contains("attempted to access a non local key")
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
pub(crate) mod tests {
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
    fn the_load_is_script_load_of_the_source() {
        let call = Invocation::new(&ECHO, &["a"]).arg(7u64);
        assert_eq!(
            words(&call.load_command()),
            ["SCRIPT", "LOAD", "return ARGV"]
        );
        assert_eq!(Fallback::None.next(), Fallback::Load);
        assert_eq!(Fallback::Load.next(), Fallback::Eval);
    }

    /// A connection that counts what it is asked to send and answers nothing.
    #[derive(Default)]
    pub(crate) struct NoIo {
        pub(crate) sent: usize,
    }

    impl ConnectionLike for NoIo {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> redis::RedisFuture<'a, Value> {
            self.sent += 1;
            Box::pin(async { Err((ErrorKind::Client, "NoIo sends nothing").into()) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a redis::Pipeline,
            _: usize,
            _: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            self.sent += 1;
            Box::pin(async { Err((ErrorKind::Client, "NoIo sends nothing").into()) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    /// A connection that answers from a list, one entry per request (a
    /// command or a whole pipeline), and records the words it was sent.
    pub(crate) struct Scripted {
        pub(crate) sent: Vec<Vec<String>>,
        replies: std::collections::VecDeque<redis::RedisResult<Vec<Value>>>,
    }

    impl Scripted {
        pub(crate) fn new(replies: Vec<redis::RedisResult<Vec<&str>>>) -> Self {
            let resp = |r: &str| redis::parse_redis_value(format!("{r}\r\n").as_bytes()).unwrap();
            let replies = replies
                .into_iter()
                .map(|reply| reply.map(|values| values.into_iter().map(resp).collect()))
                .collect();
            Scripted {
                sent: Vec::new(),
                replies,
            }
        }

        fn next(&mut self) -> redis::RedisResult<Vec<Value>> {
            self.replies
                .pop_front()
                .unwrap_or_else(|| Err((ErrorKind::Client, "nothing more to answer").into()))
        }
    }

    impl ConnectionLike for Scripted {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
            self.sent.push(words(cmd));
            let reply = self.next().map(|mut values| values.remove(0));
            Box::pin(async move { reply })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipe: &'a redis::Pipeline,
            _: usize,
            _: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            let mut all = Vec::new();
            for cmd in pipe.cmd_iter() {
                all.extend(words(cmd));
                all.push("|".into());
            }
            self.sent.push(all);
            let reply = self.next();
            Box::pin(async move { reply })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    pub(crate) const NOSCRIPT: &str = "-NOSCRIPT No matching script.";

    #[tokio::test]
    async fn noscript_loads_the_script_and_runs_it_in_one_pipeline() {
        let call = Invocation::new(&ECHO, &["k"]).arg(7u64);
        let sha = ECHO.sha1().to_owned();
        let mut conn = Scripted::new(vec![Ok(vec![NOSCRIPT]), Ok(vec![&format!("+{sha}"), ":1"])]);
        assert_eq!(call.run(&mut conn).await.unwrap(), Value::Int(1));
        let evalsha = ["EVALSHA", &sha, "1", "k", "7"];
        let pipeline: Vec<&str> = ["SCRIPT", "LOAD", "return ARGV", "|"]
            .into_iter()
            .chain(evalsha)
            .chain(["|"])
            .collect();
        assert_eq!(conn.sent, [evalsha.to_vec(), pipeline]);
    }

    #[tokio::test]
    async fn a_refused_script_load_ends_in_eval_and_nothing_runs_twice() {
        let call = Invocation::new(&ECHO, &["k"]);
        let noperm = "-NOPERM User app has no permissions to run the 'script|load' command";
        let mut conn = Scripted::new(vec![
            Ok(vec![NOSCRIPT]),
            Ok(vec![noperm, NOSCRIPT]),
            Ok(vec![":2"]),
        ]);
        assert_eq!(call.run(&mut conn).await.unwrap(), Value::Int(2));
        assert_eq!(conn.sent.len(), 3);
        assert_eq!(conn.sent[2], ["EVAL", "return ARGV", "1", "k"]);

        // Whatever the EVALSHA of the pipeline answers other than NOSCRIPT
        // is the call's result: the script ran (or refused) there.
        let mut conn = Scripted::new(vec![
            Ok(vec![NOSCRIPT]),
            Ok(vec!["+sha", "-ERR nolock test/echo: bad"]),
        ]);
        let err = call.run(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "{err}");
        assert_eq!(conn.sent.len(), 2);

        // A lost reply to the pipeline: the EVALSHA may have run, so nothing
        // is sent again.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let mut conn = Scripted::new(vec![Ok(vec![NOSCRIPT]), Err(reset.into())]);
        let err = call.run(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::Indeterminate(_)), "{err}");
        assert_eq!(conn.sent.len(), 2);
    }

    #[tokio::test]
    async fn keys_of_different_slots_are_refused_before_anything_is_sent() {
        let mut conn = NoIo::default();
        let call = Invocation::new(&ECHO, &["{a}:x", "{b}:y"]);
        match call.run(&mut conn).await {
            Err(Error::CrossSlot { first, second, .. }) => {
                assert_eq!((first.as_str(), second.as_str()), ("{a}:x", "{b}:y"))
            }
            other => panic!("expected CrossSlot, got {other:?}"),
        }
        assert_eq!(conn.sent, 0);

        let same_tag = Invocation::new(&ECHO, &["{a}:x", "{a}:y"]);
        assert!(same_tag.check().is_ok());
        assert_eq!(same_tag.slot(), Some(keys::slot("a")));
        assert!(Invocation::new(&ECHO, &[]).check().is_ok());
        assert_eq!(Invocation::new(&ECHO, &[]).slot(), None);
    }

    #[test]
    fn only_nothing_ran_replies_are_resent() {
        let server = |kind| redis::RedisError::from((ErrorKind::Server(kind), "x"));
        assert!(is_redirect(&server(ServerErrorKind::Moved)));
        assert!(is_redirect(&server(ServerErrorKind::ReadOnly)));
        for kind in [
            ServerErrorKind::Moved,
            ServerErrorKind::ReadOnly,
            ServerErrorKind::Ask,
            ServerErrorKind::TryAgain,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::BusyLoading,
            ServerErrorKind::MasterDown,
        ] {
            assert!(is_resendable(&server(kind)), "{kind:?}");
        }
        for kind in [
            ServerErrorKind::NoScript,
            ServerErrorKind::ResponseError,
            ServerErrorKind::CrossSlot,
            ServerErrorKind::ExecAbort,
        ] {
            assert!(!is_resendable(&server(kind)), "{kind:?}");
        }
        let lost =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!is_resendable(&lost) && !is_noscript(&lost));
    }

    /// The error reply `-<text>`, parsed as redis-rs parses a server's.
    pub(crate) fn error_reply(text: &str) -> redis::RedisError {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
            .expect("a RESP error")
            .extract_error()
            .expect_err("an error reply")
    }

    /// The reply as a server sends it (Redis 7.0 and Valkey 8.1 alike), and
    /// a script's own error, which is not resent.
    #[test]
    fn a_script_stopped_by_a_migrating_key_is_resent() {
        let reply = error_reply;
        let stopped = reply(
            "ERR Script attempted to access a non local key in a cluster node script: \
             8e79d6167ad4e457067b2b6088a441ae0e8a941c, on @user_script:132.",
        );
        assert!(is_non_local_key(&stopped) && is_resendable(&stopped));
        assert!(!is_redirect(&stopped));
        let own = reply("ERR nolock semaphore/acquire: bad permit id");
        assert!(!is_non_local_key(&own) && !is_resendable(&own));
    }

    /// A connection that answers every request with one fixed error.
    struct Fixed {
        error: fn() -> redis::RedisError,
        sent: usize,
    }

    impl ConnectionLike for Fixed {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> redis::RedisFuture<'a, Value> {
            self.sent += 1;
            let error = self.error;
            Box::pin(async move { Err(error()) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a redis::Pipeline,
            _: usize,
            _: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async { Err((ErrorKind::Client, "unused").into()) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    #[tokio::test]
    async fn nothing_ran_replies_are_resent_within_the_budget() {
        let call = Invocation::new(&ECHO, &["k"]);
        let mut conn = Fixed {
            error: || (ErrorKind::Server(ServerErrorKind::TryAgain), "x").into(),
            sent: 0,
        };
        let started = std::time::Instant::now();
        let err = call.run(&mut conn).await.unwrap_err();
        assert!(err.is_definite(), "{err:?}");
        assert_eq!(conn.sent, 1 + RESEND_DELAYS.len());
        let waited: Duration = RESEND_DELAYS.iter().sum();
        assert!(started.elapsed() >= waited);
        assert!(waited < Duration::from_millis(1500));
    }

    /// A [`Scripted`] connection whose first answer comes only after
    /// `first`: a `WAIT` that ran its whole timeout.
    pub(crate) struct SlowFirst {
        pub(crate) inner: Scripted,
        pub(crate) first: Option<Duration>,
    }

    impl ConnectionLike for SlowFirst {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
            let delay = self.first.take().unwrap_or_default();
            let reply = self.inner.req_packed_command(cmd);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                reply.await
            })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipe: &'a redis::Pipeline,
            offset: usize,
            count: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            let delay = self.first.take().unwrap_or_default();
            let reply = self.inner.req_packed_commands(pipe, offset, count);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                reply.await
            })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    /// After `NOSCRIPT` the command after the script is built again from
    /// the time spent since the first pipeline was sent, and routed with a
    /// read of the first key; the first pipeline's is built from nothing.
    #[tokio::test]
    async fn after_a_fallback_the_command_after_is_built_from_the_time_spent() {
        let call = Invocation::new(&ECHO, &["k"]).arg(7u64);
        let sha = ECHO.sha1().to_owned();
        let mut conn = SlowFirst {
            inner: Scripted::new(vec![
                Ok(vec![NOSCRIPT, ":0"]),
                Ok(vec![NOSCRIPT]),
                Ok(vec![&format!("+{sha}"), ":1"]),
                Ok(vec![":1", "+after"]),
            ]),
            first: Some(Duration::from_millis(60)),
        };
        let spent = std::sync::Mutex::new(Vec::new());
        let (value, after) = call
            .run_then(&mut conn, |d| {
                spent.lock().unwrap().push(d);
                let mut cmd = redis::cmd("AFTER");
                cmd.arg(d.as_millis() as u64);
                cmd
            })
            .await
            .unwrap();
        assert_eq!(value, Value::Int(1));
        assert_eq!(after.unwrap(), Value::SimpleString("after".into()));
        let spent = spent.into_inner().unwrap();
        assert_eq!(spent.len(), 2, "{spent:?}");
        assert_eq!(spent[0], Duration::ZERO);
        assert!(spent[1] >= Duration::from_millis(60), "{spent:?}");
        let sent = &conn.inner.sent;
        assert_eq!(sent.len(), 4, "{sent:?}");
        assert_eq!(sent[0][..5], ["EVALSHA", &sha, "1", "k", "7"]);
        assert_eq!(sent[0][6..], ["AFTER", "0", "|"]);
        let last: Vec<&str> = sent[3].iter().map(String::as_str).collect();
        assert_eq!(last[..4], ["EXISTS", "k", "|", "AFTER"]);
        let waited: u64 = last[4].parse().unwrap();
        assert!(waited >= 60, "{last:?}");
    }

    #[test]
    fn read_only_scripts_use_the_ro_commands() {
        static RO: Script = Script::embedded("test/ro", "#!lua flags=no-writes\nreturn 1");
        let call = Invocation::new(&RO, &["k"]);
        assert_eq!(words(call.command())[0], "EVALSHA_RO");
        assert_eq!(words(&call.fallback_command())[0], "EVAL_RO");
    }
}
