//! Waking waiters when a lock is released, instead of polling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, PubSubSink};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::retry::wait_for;
use super::{millis, Acquire, Keys};
use crate::Backoff;
use crate::{timer, Error, Result};

/// Release notifications for every waiter of a process: one pub/sub
/// connection, shared (clone it freely), that wakes a waiter of
/// [`Waiters::acquire`] as soon as the lock it waits for is released.
///
/// [`super::release`] (and so [`super::Lease`] and [`super::with_lease`])
/// `PUBLISH`es on the channel `keys::derive(resource, "released")` after
/// deleting the lock. A [`Waiters`] subscribes to the channel of each
/// resource it is asked to wait for, and each message wakes **one** waiter
/// of this process for that resource (the first to have gone back to
/// sleep: Tokio's `Notify::notify_one` is first in, first out), which tries at
/// once: a release costs one attempt per waiting process, not one per
/// waiter. A waiter still sleeps at most until the lock's expiry (capped at
/// [`Backoff::max_delay`]), so a lost message, a lock that simply expires,
/// or a dropped pub/sub connection only costs that fallback sleep.
///
/// It stays subscribed to every resource it has waited for until the last
/// clone is dropped: take resource names from a bounded set, as the fence
/// counters already ask.
///
/// # Clusters
///
/// In a script on a cluster, `PUBLISH` is broadcast over the cluster bus to
/// every node, so a [`Waiters`] built from a client of **any one node**
/// hears every release. Sharded pub/sub (`SPUBLISH`, Redis 7.0+) would keep
/// each message on the shard that owns the resource's slot (the channel is
/// derived like the resource's keys, so it fits the slot model), but the
/// subscriber would then need an `SSUBSCRIBE` on that shard's node, which
/// redis-rs 1.8 offers only on the cluster connection with RESP3 pushes, and
/// which moves with the slot on failover. The broadcast costs one small
/// message per release per node, which is fine for locks (they are not
/// taken thousands of times a second); switching to `SPUBLISH` is a change
/// of the script and of this type only.
#[derive(Debug, Clone)]
pub struct Waiters {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Subscribing is serialised, so a channel is subscribed once.
    sink: tokio::sync::Mutex<PubSubSink>,
    /// Channel name -> the waiters of that resource.
    channels: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    reader: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Waiters {
    /// Open the pub/sub connection (one per process is enough).
    ///
    /// On a cluster, pass a client of any node (see [`Waiters`]).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] or [`Error::Indeterminate`] when the connection
    /// cannot be opened; [`Error::NoTimer`] outside a Tokio runtime with
    /// timers (waiting needs them).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use nolock::fence::{Acquire, Waiters};
    /// use nolock::Backoff;
    ///
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let mut conn = client.get_multiplexed_async_connection().await?;
    /// let waiters = Waiters::new(&client).await?;
    /// let wait = Backoff::new(Duration::from_secs(10));
    /// match waiters.acquire(&mut conn, "report:daily", Duration::from_secs(30), &wait).await? {
    ///     Acquire::Acquired(grant) => println!("fence {}", grant.fence),
    ///     Acquire::Held { .. } => println!("still busy after 10 s"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn new(client: &redis::Client) -> Result<Waiters> {
        timer::check()?;
        let pubsub = client.get_async_pubsub().await.map_err(Error::from_redis)?;
        let (sink, mut stream) = pubsub.split();
        let channels: Arc<Mutex<HashMap<String, Arc<Notify>>>> = Arc::default();
        let routes = Arc::clone(&channels);
        let reader = tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let notify = routes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(message.get_channel_name())
                    .cloned();
                if let Some(notify) = notify {
                    notify.notify_one();
                }
            }
        });
        Ok(Waiters {
            inner: Arc::new(Inner {
                sink: tokio::sync::Mutex::new(sink),
                channels,
                reader,
            }),
        })
    }

    /// [`super::acquire_with_retry`], but each sleep also ends when the lock
    /// is released (see [`Waiters`]): the next grant follows a release by
    /// about one round trip instead of by the rest of a backoff delay.
    ///
    /// Between releases a waiter sleeps until the lock's expiry (capped at
    /// [`Backoff::max_delay`]); a lock without an expiry is polled with the
    /// [`Backoff`] delays. The first call for a resource subscribes to its
    /// channel (one more round trip on the pub/sub connection).
    ///
    /// # Errors
    ///
    /// As [`super::acquire_with_retry`], plus [`Error::Redis`] or
    /// [`Error::Indeterminate`] from the subscription (before any lock
    /// request is sent).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(waiters: nolock::fence::Waiters, conn: &mut redis::aio::MultiplexedConnection)
    /// #     -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let wait = nolock::Backoff::new(Duration::from_secs(5));
    /// let outcome = waiters.acquire(conn, "job:42", Duration::from_secs(30), &wait).await?;
    /// # let _ = outcome;
    /// # Ok(()) }
    /// ```
    pub async fn acquire<C>(
        &self,
        conn: &mut C,
        resource: &str,
        ttl: Duration,
        backoff: &Backoff,
    ) -> Result<Acquire>
    where
        C: ConnectionLike + Send,
    {
        let keys = Keys::of(resource)?;
        millis(ttl)?;
        backoff.check()?;
        let notify = self.watch(&keys.released).await?;
        wait_for(conn, resource, ttl, backoff, Some(&notify)).await
    }

    /// The wake-up of `channel`'s waiters, subscribing on first use.
    async fn watch(&self, channel: &str) -> Result<Arc<Notify>> {
        if let Some(notify) = self.lookup(channel) {
            return Ok(notify);
        }
        let mut sink = self.inner.sink.lock().await;
        // Another waiter may have subscribed while this one waited for the sink.
        if let Some(notify) = self.lookup(channel) {
            return Ok(notify);
        }
        // Routed before SUBSCRIBE returns, so no message after it is dropped.
        let notify = Arc::new(Notify::new());
        self.inner
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(channel.to_owned(), Arc::clone(&notify));
        if let Err(err) = sink.subscribe(channel).await {
            self.inner
                .channels
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(channel);
            return Err(Error::from_redis(err));
        }
        Ok(notify)
    }

    fn lookup(&self, channel: &str) -> Option<Arc<Notify>> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(channel)
            .cloned()
    }
}
