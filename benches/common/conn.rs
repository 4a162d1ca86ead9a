//! Connections for the runs, and the round-trip counter.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};

use super::Result;

/// A multiplexed connection for a run.
///
/// The default 500 ms response timeout would turn one slow moment on a
/// loaded 2-core machine into an error; a benchmark wants the latency instead.
pub async fn connect(client: &redis::Client) -> Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// A connection that counts round trips: each single command and each
/// pipeline (a `MULTI`/`EXEC` block included) is one request/response
/// exchange with the server, however many tasks share the socket.
///
/// Every variant runs through it, so its one atomic add per request costs
/// them all the same.
#[derive(Clone)]
pub struct Counted<C> {
    inner: C,
    round_trips: Arc<AtomicU64>,
}

impl<C> Counted<C> {
    pub fn new(inner: C, round_trips: Arc<AtomicU64>) -> Self {
        Counted { inner, round_trips }
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Counted<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips.fetch_add(1, Relaxed);
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips.fetch_add(1, Relaxed);
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
