//! [`Proxied`]: a connection through a Redis proxy.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

use crate::BatchConnection;

/// A connection through a Redis proxy (twemproxy, Envoy, ...), on which a
/// server error does not prove that nothing ran.
///
/// Talking to Redis directly, an error reply means the server refused the
/// request: nolock reports it as a definite [`Error::Redis`] and the call is
/// safe to retry. A proxy breaks that promise. It forwards the script to a
/// server and, when that server's reply is slow or its connection drops,
/// answers the client with an error of its own (Envoy's `upstream failure`,
/// twemproxy's `ERR Connection timed out`): the script may have run. Some
/// proxies also retry upstream on their own.
///
/// Wrap such a connection in [`Proxied`]: every error reply except
/// `NOSCRIPT` then becomes [`Error::Indeterminate`]. `NOSCRIPT` stays
/// definite (no proxy invents it; the server did not run the script), so
/// the `EVAL` fallback still works. Denials, held locks and failed
/// conditions are replies, not errors, and are unaffected.
///
/// [`Error::Redis`]: crate::Error::Redis
/// [`Error::Indeterminate`]: crate::Error::Indeterminate
///
/// Works wherever the connection inside works, batches included. In a
/// [`crate::Batch`] one such error makes every entry of that batch
/// indeterminate, since a pipeline's reply cannot mark a single entry.
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::{limits, Proxied};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// // twemproxy listening on 22121 in front of the Redis servers.
/// let client = redis::Client::open("redis://127.0.0.1:22121/")?;
/// let mut conn = Proxied::new(client.get_multiplexed_async_connection().await?);
/// match limits::try_increment(&mut conn, "jobs:running", 10, Duration::from_secs(60)).await {
///     Ok(admission) => println!("admitted: {}", admission.admitted),
///     // A proxy's error may hide a script that ran: not safe to retry blindly.
///     Err(nolock::Error::Indeterminate(e)) => println!("unknown outcome: {e}"),
///     Err(e) => println!("refused: {e}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Proxied<C> {
    inner: C,
}

impl<C> Proxied<C> {
    /// Declare `inner` a connection through a proxy.
    pub const fn new(inner: C) -> Self {
        Proxied { inner }
    }

    /// The connection inside.
    pub fn get_mut(&mut self) -> &mut C {
        &mut self.inner
    }

    /// The connection inside, unwrapped.
    pub fn into_inner(self) -> C {
        self.inner
    }
}

/// The error that stands for a server error seen through a proxy: an I/O
/// error, which nolock classifies as indeterminate.
#[derive(Debug)]
struct ThroughProxy(RedisError);

impl std::fmt::Display for ThroughProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "error reply through a proxy (the command may have run): {}",
            self.0
        )
    }
}

impl std::error::Error for ThroughProxy {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn through_proxy(err: RedisError) -> RedisError {
    std::io::Error::other(ThroughProxy(err)).into()
}

/// True for an error reply that does not prove, behind a proxy, that
/// nothing ran: every server error but `NOSCRIPT`.
fn is_doubtful(err: &RedisError) -> bool {
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoScript) => false,
        ErrorKind::Server(_) | ErrorKind::Extension => true,
        _ => false,
    }
}

fn doubtful_value(value: &Value) -> bool {
    match value {
        Value::ServerError(err) => is_doubtful(&err.clone().into()),
        _ => false,
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Proxied<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.inner.req_packed_command(cmd).await {
                Ok(value) if doubtful_value(&value) => {
                    Err(through_proxy(value.extract_error().err().unwrap_or_else(
                        || RedisError::from((ErrorKind::Client, "error reply")),
                    )))
                }
                Err(err) if is_doubtful(&err) => Err(through_proxy(err)),
                other => other,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await
            {
                Ok(values) => match values.iter().find(|v| doubtful_value(v)) {
                    Some(value) => Err(through_proxy(
                        value.clone().extract_error().err().unwrap_or_else(|| {
                            RedisError::from((ErrorKind::Client, "error reply"))
                        }),
                    )),
                    None => Ok(values),
                },
                Err(err) if is_doubtful(&err) => Err(through_proxy(err)),
                Err(err) => Err(err),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// A proxy shows clients one server, so a batch goes out as one pipeline.
impl<C: ConnectionLike + Send> BatchConnection for Proxied<C> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Script;
    use crate::Error;

    /// Answers every request with one error reply.
    struct Replies(fn() -> Value);

    impl ConnectionLike for Replies {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
            let reply = (self.0)();
            Box::pin(async move { Ok(reply) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a Pipeline,
            _: usize,
            count: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            let reply = (self.0)();
            Box::pin(async move { Ok(vec![reply; count]) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    fn server_error(text: &'static str) -> Value {
        // The parser is the one public way to build a server error value.
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap_or(Value::Nil)
    }

    static ECHO: Script = Script::embedded("test/proxied-echo", "return ARGV");

    #[tokio::test]
    async fn error_replies_become_indeterminate_but_noscript_stays_definite() {
        let call = crate::script::Invocation::new(&ECHO, &["k"]);

        let mut direct = Replies(|| server_error("ERR upstream failure"));
        assert!(matches!(call.run(&mut direct).await, Err(Error::Redis(_))));

        let mut proxied = Proxied::new(Replies(|| server_error("ERR upstream failure")));
        let err = call.run(&mut proxied).await.unwrap_err();
        assert!(matches!(err, Error::Indeterminate(_)), "{err:?}");
        assert!(err.to_string().contains("through a proxy"), "{err}");

        let mut busy = Proxied::new(Replies(|| server_error("BUSY Redis is busy")));
        assert!(!call.run(&mut busy).await.unwrap_err().is_definite());

        // NOSCRIPT twice (EVALSHA, then EVAL): definite, and the fallback ran.
        let mut noscript = Proxied::new(Replies(|| server_error("NOSCRIPT No matching script")));
        let before = crate::stats().noscript_fallbacks;
        let err = call.run(&mut noscript).await.unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "{err:?}");
        assert!(crate::stats().noscript_fallbacks > before);
    }

    #[tokio::test]
    async fn a_batch_with_an_error_reply_is_indeterminate_as_a_whole() {
        let op = crate::limits::TryIncrement::new(
            &crate::limits::Counter::new(5, std::time::Duration::from_secs(1)).unwrap(),
            "k",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut batch = crate::Batch::new();
        batch.push(op.clone()).push(op);
        let mut proxied = Proxied::new(Replies(|| server_error("ERR upstream failure")));
        for result in batch.run(&mut proxied).await {
            assert!(matches!(result, Err(Error::Indeterminate(_))), "{result:?}");
        }
    }
}
