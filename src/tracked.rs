//! [`Tracked`]: a connection that remembers that it dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::script::never_sent;
use crate::BatchConnection;

/// A connection that remembers that it dropped, so that calls made after
/// the drop are reported as never sent (definite) instead of indeterminate.
///
/// redis-rs's `MultiplexedConnection` never reconnects: once its socket
/// closes (a `CLIENT KILL`, a restart, a network cut), every later request
/// fails at once with `BrokenPipe`. redis-rs 1.8 gives that same error to a
/// request whose reply was lost when the socket closed under it, so nolock
/// cannot tell the two apart from the error and must call both
/// [`Error::Indeterminate`]. In a busy process sharing one connection, one
/// drop turns thousands of calls indeterminate, though only those in flight
/// at the drop could have run.
///
/// [`Tracked`] keeps the missing fact: the first failure that shows the
/// connection is gone sets a flag shared by every clone, and every call that
/// starts after it is refused before anything is sent, as a definite
/// [`Error::Redis`] that says "not sent". Calls that were already under way
/// stay indeterminate. Make a new connection when you see it
/// ([`Tracked::is_dropped`]).
///
/// Wrap a `MultiplexedConnection` only. A `ConnectionManager` or a cluster
/// connection reconnects by itself, so refusing calls after a drop would
/// refuse calls that would have gone out on the new socket.
///
/// [`Error::Indeterminate`]: crate::Error::Indeterminate
/// [`Error::Redis`]: crate::Error::Redis
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::{limits, Tracked};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1/")?;
/// let mut conn = Tracked::new(client.get_multiplexed_async_connection().await?);
/// match limits::try_increment(&mut conn, "jobs", 10, Duration::from_secs(60)).await {
///     Ok(admission) => println!("admitted: {}", admission.admitted),
///     Err(e) if e.is_definite() => println!("not applied, safe to retry: {e}"),
///     Err(e) => println!("may have been applied: {e}"),
/// }
/// if conn.is_dropped() {
///     conn = Tracked::new(client.get_multiplexed_async_connection().await?);
/// }
/// # let _ = conn;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Tracked<C> {
    inner: C,
    dropped: Arc<AtomicBool>,
}

impl<C> Tracked<C> {
    /// Track `inner`, a connection that never reconnects.
    pub fn new(inner: C) -> Self {
        Tracked {
            inner,
            dropped: Arc::new(AtomicBool::new(false)),
        }
    }

    /// True once a call has shown that the connection is gone.
    pub fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Acquire)
    }

    /// The connection inside.
    pub fn get_mut(&mut self) -> &mut C {
        &mut self.inner
    }

    /// The connection inside, unwrapped.
    pub fn into_inner(self) -> C {
        self.inner
    }

    fn note<T>(&self, result: Result<T, RedisError>) -> Result<T, RedisError> {
        if let Err(err) = &result {
            // A lost socket (reset, EOF, broken pipe) or a stream redis-rs
            // gives up on (a parse error); a timeout leaves the socket usable.
            if err.is_connection_dropped() || err.is_unrecoverable_error() {
                self.dropped.store(true, Ordering::Release);
            }
        }
        result
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Tracked<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            if self.is_dropped() {
                return Err(never_sent());
            }
            let result = self.inner.req_packed_command(cmd).await;
            self.note(result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            if self.is_dropped() {
                return Err(never_sent());
            }
            let result = self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.note(result)
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// A multiplexed connection carries a batch as one pipeline.
impl<C: ConnectionLike + Send> BatchConnection for Tracked<C> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Script;
    use crate::Error;

    /// Fails every request with a closed-connection error, counting them.
    #[derive(Clone)]
    struct Closed {
        sent: usize,
    }

    impl ConnectionLike for Closed {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
            self.sent += 1;
            Box::pin(async { Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe).into()) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a Pipeline,
            _: usize,
            _: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            self.sent += 1;
            Box::pin(async { Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    static ECHO: Script = Script::embedded("test/tracked-echo", "return ARGV");

    #[tokio::test]
    async fn calls_after_a_drop_are_refused_as_never_sent() {
        let call = crate::script::Invocation::new(&ECHO, &["k"]);
        let mut conn = Tracked::new(Closed { sent: 0 });
        let other = conn.clone();
        let before = crate::stats().never_sent;

        let first = call.run(&mut conn).await.unwrap_err();
        assert!(matches!(first, Error::Indeterminate(_)), "{first:?}");
        assert!(conn.is_dropped() && other.is_dropped());

        let later = call.run(&mut conn).await.unwrap_err();
        assert!(matches!(later, Error::Redis(_)), "{later:?}");
        assert!(later.to_string().contains("not sent"), "{later}");
        assert_eq!(conn.get_mut().sent, 1, "nothing reached the connection");
        assert!(crate::stats().never_sent > before);
    }

    #[tokio::test]
    async fn a_timeout_does_not_mark_the_connection_dropped() {
        let mut conn = Tracked::new(Closed { sent: 0 });
        let pipe = redis::pipe();
        let err = conn.req_packed_commands(&pipe, 0, 1).await.unwrap_err();
        assert!(err.is_timeout());
        assert!(!conn.is_dropped());
    }
}
