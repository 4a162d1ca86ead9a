//! Waking waiters when a lock is released, instead of polling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, PubSubSink};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::retry::{longest_sleep, wait_for};
use super::{AcquireLock, Lock, LockAttempt};
#[cfg(doc)]
use crate::Backoff;
use crate::{timer, Error, Result};

/// Release notifications for every waiter of a process: one pub/sub
/// connection, shared (clone it freely), that wakes a waiter of
/// [`Waiters::acquire`] as soon as the lock it waits for is released.
///
/// A [`Waiters`] subscribes to the channel `keys::derive(resource,
/// "released")` of each resource it is asked to wait for, then tries the
/// lock; each attempt that finds it held also sets the resource's waiting
/// flag (`keys::derive(resource, "waiting")`, in the same slot) for at least
/// as long as the waiter then sleeps. [`super::Grant::release`] (and so
/// [`super::Lease`] and [`super::Lock::with_lease`]) `PUBLISH`es on the
/// channel after deleting the lock **only while that flag exists**: a
/// release nobody waits for publishes nothing. No wake-up is lost by it: a
/// release after a waiter's failed attempt sees the flag that attempt set,
/// and one before it left the lock free for the attempt (the subscription
/// came first, so the message is heard either way). Each message wakes **one** waiter
/// of this process for that resource (the first to have gone back to
/// sleep: Tokio's `Notify::notify_one` is first in, first out), which tries at
/// once: a release costs one attempt per waiting process, not one per
/// waiter. A waiter still sleeps at most until the lock's expiry (capped at
/// [`Backoff::max_delay`]), so a lost message, a lock that simply expires,
/// or a dropped pub/sub connection only costs that fallback sleep.
///
/// It is subscribed to a resource's channel only while some waiter of this
/// process waits for it: the first waiter subscribes, the last one to leave
/// (granted, timed out, failed or dropped) unsubscribes, so its table and
/// the server's subscriptions follow the waiting, not every resource ever
/// waited on ([`Waiters::subscriptions`]).
///
/// # Fair waiting
///
/// With a fair lock ([`Lock::fair`]) each waiter waits under a ticket (its
/// token) in the resource's line in Redis, and is granted only when it is
/// first. A fair grant's release `PUBLISH`es the first ticket in line
/// instead of `"1"`, and a [`Waiters`] wakes the waiter of this process
/// with that ticket, and no other: the one whose turn it is, in whichever
/// process it waits. The others sleep until the lock's expiry (capped at
/// [`Backoff::max_delay`]), when they refresh their place in line.
///
/// A fair semaphore's waiters ([`crate::semaphore::Semaphore::fair`])
/// are woken the same way, by ticket (`"<id>:<weight>"`), through
/// [`Waiters::acquire_permit`]: a fair permit's release names every waiter
/// at the head of the line whose weight fits what it left free.
///
/// # Clusters
///
/// In a script on a cluster, `PUBLISH` is broadcast over the cluster bus to
/// every node, so a [`Waiters`] built from a client of **any one node**
/// hears every release (that is also why a release without waiters skips
/// it). Sharded pub/sub (`SPUBLISH`, Redis 7.0+) would keep
/// each message on the shard that owns the resource's slot (the channel is
/// derived like the resource's keys, so it fits the slot model), but the
/// subscriber would then need an `SSUBSCRIBE` on that shard's node, which
/// redis-rs 1.8 offers only on the cluster connection with RESP3 pushes, and
/// which moves with the slot on failover. The broadcast costs one small
/// message per node for each release that someone waits for (on the local
/// 3x2 cluster, an acquire + release pair used 1.2 to 1.9 times the CPU of
/// one nobody waited for: `fence_wake::cluster_cpu_of_a_release_with_and_without_waiters`);
/// switching to `SPUBLISH` is a change of the script and of this type only.
#[derive(Debug, Clone)]
pub struct Waiters {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Subscribing is serialised, so a channel is subscribed once.
    sink: tokio::sync::Mutex<PubSubSink>,
    /// Channel name -> the waiters of that resource.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    reader: JoinHandle<()>,
}

/// The waiters of one resource in this process.
#[derive(Debug)]
struct Channel {
    wake: Arc<Notify>,
    /// Fair waiters ([`Lock::fair`]) by ticket: a release of a fair grant
    /// names the first in line, and only that waiter is woken.
    tickets: HashMap<String, Arc<Notify>>,
    /// How many are waiting; the entry (and the subscription) goes at 0.
    waiting: usize,
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
    /// use nolock::fence::{Lock, LockAttempt, Waiters};
    /// use nolock::Backoff;
    ///
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let mut conn = client.get_multiplexed_async_connection().await?;
    /// let waiters = Waiters::new(&client).await?;
    /// let reports = Lock::new(Duration::from_secs(30))?.with_wait(Backoff::new(Duration::from_secs(10)));
    /// match waiters.acquire(&mut conn, &reports, "report:daily").await? {
    ///     LockAttempt::Acquired(grant) => println!("fence {}", grant.fence().number()),
    ///     LockAttempt::Held { .. } => println!("still busy after 10 s"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn new(client: &redis::Client) -> Result<Waiters> {
        timer::check()?;
        let pubsub = client.get_async_pubsub().await.map_err(Error::from_redis)?;
        let (sink, mut stream) = pubsub.split();
        let channels: Arc<Mutex<HashMap<String, Channel>>> = Arc::default();
        let routes = Arc::clone(&channels);
        let reader = tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let payload = message.get_payload_bytes();
                let notify = routes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(message.get_channel_name())
                    .and_then(|channel| {
                        if payload == b"1" {
                            // A plain release: wake one plain waiter.
                            return Some(Arc::clone(&channel.wake));
                        }
                        // A ticket: that fair waiter, if it is in this process.
                        std::str::from_utf8(payload)
                            .ok()
                            .and_then(|ticket| channel.tickets.get(ticket))
                            .map(Arc::clone)
                    });
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

    /// `lock`'s acquire, waiting as [`Lock::with_wait`] says, but each sleep
    /// also ends when the lock is released (see [`Waiters`]): the next grant
    /// follows a release by about one round trip instead of by the rest of a
    /// backoff delay.
    ///
    /// Between releases a waiter sleeps until the lock's expiry (capped at
    /// [`Backoff::max_delay`]); a lock without an expiry is polled with the
    /// [`Backoff`] delays. The first waiter of a resource subscribes to its
    /// channel (one more round trip on the pub/sub connection); the last to
    /// leave unsubscribes.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`], plus [`Error::Redis`] or
    /// [`Error::Indeterminate`] from the subscription (before any lock
    /// request is sent).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(waiters: nolock::fence::Waiters, conn: &mut redis::aio::MultiplexedConnection)
    /// #     -> nolock::Result<()> {
    /// use std::time::Duration;
    /// let jobs = nolock::fence::Lock::new(Duration::from_secs(30))?
    ///     .with_wait(nolock::Backoff::new(Duration::from_secs(5)));
    /// let outcome = waiters.acquire(conn, &jobs, "job:42").await?;
    /// # let _ = outcome;
    /// # Ok(()) }
    /// ```
    pub async fn acquire<C>(&self, conn: &mut C, lock: &Lock, resource: &str) -> Result<LockAttempt>
    where
        C: ConnectionLike + Send,
    {
        super::Keys::of(resource)?;
        self.acquire_as(conn, lock, resource, &super::Token::random()?)
            .await
    }

    /// [`Waiters::acquire`] under a token you chose (from
    /// [`super::Token::random`]), as [`Lock::acquire_as`]: for a fair lock
    /// ([`Lock::fair`]) the token is also the waiter's ticket, so a waiter
    /// that sent one attempt of its own first ([`AcquireLock::with_token`]
    /// of the same lock, which joins the line) keeps its place.
    ///
    /// # Errors
    ///
    /// As [`Waiters::acquire`] (without [`Error::Entropy`]).
    pub async fn acquire_as<C>(
        &self,
        conn: &mut C,
        lock: &Lock,
        resource: &str,
        token: &super::Token,
    ) -> Result<LockAttempt>
    where
        C: ConnectionLike + Send,
    {
        // Whole milliseconds, rounded up: the flag must outlive the sleep.
        let sleep = longest_sleep(lock.wait()).as_nanos().div_ceil(1_000_000);
        let sleep_ms = u64::try_from(sleep)
            .unwrap_or(u64::MAX)
            .clamp(1, crate::MAX_INTEGER);
        let op = AcquireLock::build_waiting(lock, resource, token, Some(sleep_ms))?;
        lock.wait().check()?;
        let watch = self.watch(op.released_channel()).await?;
        if let Some(ticket) = op.ticket() {
            let own = self.ticket(&watch, ticket);
            return wait_for(conn, lock, &op, Some(&own.wake)).await;
        }
        wait_for(conn, lock, &op, Some(&watch.wake)).await
    }

    /// A fair semaphore's waiting acquire ([`crate::semaphore::Semaphore::fair`]),
    /// woken by name: `weight` permits at `key` under `id`, waiting as the
    /// semaphore's [`crate::semaphore::Semaphore::with_wait`] says, but each
    /// sleep also ends when a release of a fair permit at `key` names this
    /// waiter's ticket (`lua/semaphore/release_fair.lua` publishes the
    /// tickets at the head of the line whose weights fit the permits it
    /// left free, on `keys::derive(key, "released")`). Between releases a
    /// waiter sleeps until the permits it needs expire, capped at
    /// [`Backoff::max_delay`]. A semaphore that is not fair is simply
    /// acquired as [`crate::semaphore::Semaphore::acquire_as`] (its releases
    /// wake nobody).
    ///
    /// # Errors
    ///
    /// As [`crate::semaphore::Semaphore::acquire_as`], plus [`Error::Redis`]
    /// or [`Error::Indeterminate`] from the subscription (before any
    /// request is sent).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(waiters: nolock::fence::Waiters, conn: &mut redis::aio::MultiplexedConnection)
    /// #     -> nolock::Result<()> {
    /// use std::time::Duration;
    /// use nolock::semaphore::{PermitId, Semaphore};
    /// let exports = Semaphore::new(3, Duration::from_secs(30))?
    ///     .with_wait(nolock::Backoff::new(Duration::from_secs(5)))
    ///     .fair();
    /// let id = PermitId::random()?;
    /// let outcome = waiters.acquire_permit(conn, &exports, "exports", &id, 2).await?;
    /// # let _ = outcome;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_permit<C>(
        &self,
        conn: &mut C,
        semaphore: &crate::semaphore::Semaphore,
        key: &str,
        id: &crate::semaphore::PermitId,
        weight: u64,
    ) -> Result<crate::semaphore::PermitAttempt>
    where
        C: ConnectionLike + Send,
    {
        if !semaphore.is_fair() || semaphore.wait().timeout.is_zero() {
            return semaphore.acquire_as(conn, key, id, weight).await;
        }
        semaphore.check(key, weight)?;
        semaphore.wait().check()?;
        let channel = crate::keys::derive(key, "released");
        let watch = self.watch(&channel).await?;
        let own = self.ticket(&watch, &format!("{}:{weight}", id.as_str()));
        crate::semaphore::retry::acquire_waiting(
            semaphore,
            conn,
            key,
            weight,
            Some(id),
            Some(&own.wake),
        )
        .await
    }

    /// How many resources it is subscribed to now: those with a waiter of
    /// this process.
    pub fn subscriptions(&self) -> usize {
        self.table().len()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Join `channel`'s waiters, subscribing on first use.
    async fn watch(&self, channel: &str) -> Result<Watch> {
        if let Some(watch) = self.join(channel) {
            return Ok(watch);
        }
        let mut sink = self.inner.sink.lock().await;
        // Another waiter may have subscribed while this one waited for the sink.
        if let Some(watch) = self.join(channel) {
            return Ok(watch);
        }
        // Routed before SUBSCRIBE returns, so no message after it is dropped.
        let wake = Arc::new(Notify::new());
        self.table().insert(
            channel.to_owned(),
            Channel {
                wake: Arc::clone(&wake),
                tickets: HashMap::new(),
                waiting: 1,
            },
        );
        let watch = Watch {
            waiters: self.clone(),
            channel: channel.to_owned(),
            wake,
        };
        if let Err(err) = sink.subscribe(channel).await {
            drop(sink);
            drop(watch); // leaves, and unsubscribes whatever half happened
            return Err(Error::from_redis(err));
        }
        Ok(watch)
    }

    /// A fair waiter's own wake-up, routed by its ticket while the returned
    /// value lives.
    fn ticket(&self, watch: &Watch, ticket: &str) -> TicketWatch {
        let wake = Arc::new(Notify::new());
        if let Some(entry) = self.table().get_mut(&watch.channel) {
            entry.tickets.insert(ticket.to_owned(), Arc::clone(&wake));
        }
        TicketWatch {
            waiters: self.clone(),
            channel: watch.channel.clone(),
            ticket: ticket.to_owned(),
            wake,
        }
    }

    /// One more waiter on an already subscribed channel.
    fn join(&self, channel: &str) -> Option<Watch> {
        let mut table = self.table();
        let entry = table.get_mut(channel)?;
        entry.waiting += 1;
        Some(Watch {
            waiters: self.clone(),
            channel: channel.to_owned(),
            wake: Arc::clone(&entry.wake),
        })
    }

    /// A waiter leaves; the last one out unsubscribes (in a task: a waiter
    /// may be dropped anywhere, outside any `.await`).
    fn leave(&self, channel: &str) {
        let last = {
            let mut table = self.table();
            match table.get_mut(channel) {
                Some(entry) if entry.waiting > 1 => {
                    entry.waiting -= 1;
                    false
                }
                Some(_) => {
                    table.remove(channel);
                    true
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let waiters = self.clone();
        let channel = channel.to_owned();
        let unsubscribe = async move {
            let mut sink = waiters.inner.sink.lock().await;
            // A new waiter that came meanwhile subscribed again under this
            // same lock, before or after: only unsubscribe when none did.
            if !waiters.table().contains_key(&channel) {
                let _ = sink.unsubscribe(&channel).await;
            }
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(unsubscribe);
        }
    }
}

/// One waiter's place on a channel; leaving it (drop) may unsubscribe.
struct Watch {
    waiters: Waiters,
    channel: String,
    wake: Arc<Notify>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.waiters.leave(&self.channel);
    }
}

/// A fair waiter's route by ticket; dropped before its [`Watch`], it
/// removes the route.
struct TicketWatch {
    waiters: Waiters,
    channel: String,
    ticket: String,
    wake: Arc<Notify>,
}

impl Drop for TicketWatch {
    fn drop(&mut self) {
        if let Some(entry) = self.waiters.table().get_mut(&self.channel) {
            entry.tickets.remove(&self.ticket);
        }
    }
}
