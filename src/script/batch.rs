//! Many operations in one round trip per server: [`Batch`].
//!
//! Over 700 lines only with its unit tests (the code is under 700): the
//! single-server and the cluster paths share the recovery of `NOSCRIPT`
//! entries, and splitting them would expose that to the whole engine.

use std::sync::atomic::Ordering::Relaxed;

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use super::invoke::{is_noscript, Invocation, BATCHES, CALLS, FALLBACKS};
use super::Idempotent;
use crate::{observe, Error, Result};

/// An operation checked and ready to send: one script call and the decoding
/// of its reply into [`Operation::Output`].
///
/// Each module has a value type per operation, built by a constructor that
/// validates its input, e.g. [`crate::limits::TryIncrement::new`]. Put them
/// in a [`Batch`] to send many at once. The trait is sealed: its methods name
/// a type that only nolock can build.
pub trait Operation: Send + Sync {
    /// What the operation returns, the same type as its single-call function.
    type Output: Send;

    /// The script call.
    #[doc(hidden)]
    fn invocation(&self) -> &Invocation;

    /// Decode the script's reply.
    #[doc(hidden)]
    fn decode(&self, reply: Value) -> Result<Self::Output>;

    /// The operation id, when it carries one ([`Operation::idempotent`]):
    /// [`crate::retry::retry`] re-sends after a lost reply only then.
    #[doc(hidden)]
    fn operation_id(&self) -> Option<&str> {
        None
    }

    /// The same operation, applied at most once per `id` within a horizon
    /// (default 5 minutes, [`Idempotent::horizon`]): sending it again
    /// returns the first run's reply and changes nothing. The plain
    /// operation is unchanged (same script, same cost); this one runs a
    /// generated variant of its script that keeps a record beside the
    /// operation's first key. See [`Idempotent`].
    ///
    /// # Errors
    ///
    /// Before any I/O, [`Error::InvalidArgument`]: `id` empty or longer
    /// than [`crate::script::MAX_ID_LEN`] bytes, or an operation that
    /// cannot carry one (a read-only one, which is safe to repeat anyway;
    /// one that already has an id; a script of your own).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nolock::{limits::TryIncrement, Operation};
    ///
    /// let op = TryIncrement::new(&nolock::limits::Counter::new(100, Duration::from_secs(60))?, "quota:alice")?
    ///     .idempotent("request-5f1c")?;
    /// assert_eq!(op.id(), "request-5f1c");
    /// # Ok::<(), nolock::Error>(())
    /// ```
    fn idempotent(self, id: impl Into<String>) -> Result<Idempotent<Self>>
    where
        Self: Sized,
    {
        Idempotent::new(self, id.into())
    }

    /// The same operation with its output passed through `f`: how
    /// operations of different kinds share one [`Batch`] (map each into one
    /// enum of yours and push them boxed, as
    /// `Batch<Box<dyn Operation<Output = YourEnum>>>`).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use nolock::{limits::{Admission, TryIncrement}, script::ScriptDir, Batch, Operation};
    ///
    /// static MY_SCRIPTS: ScriptDir = nolock::scripts!("$CARGO_MANIFEST_DIR/lua");
    ///
    /// #[derive(Debug)]
    /// enum Out {
    ///     Quota(Admission),
    ///     Score((i64, i64)),
    /// }
    ///
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let mut batch: Batch<Box<dyn Operation<Output = Out>>> = Batch::new();
    /// batch.push(Box::new(
    ///     TryIncrement::new(&nolock::limits::Counter::new(100, Duration::from_secs(60))?, "quota:alice")?.map(Out::Quota),
    /// ));
    /// batch.push(Box::new(
    ///     MY_SCRIPTS
    ///         .call::<(i64, i64)>("leaderboard/add", &["board:{weekly}"])?
    ///         .arg("alice")
    ///         .arg(10)
    ///         .map(Out::Score),
    /// ));
    /// for result in batch.run(conn).await {
    ///     println!("{:?}", result?);
    /// }
    /// # Ok(()) }
    /// ```
    fn map<U, F>(self, f: F) -> Map<Self, F>
    where
        Self: Sized,
        F: Fn(Self::Output) -> U + Send + Sync,
        U: Send,
    {
        Map { op: self, f }
    }
}

/// A boxed operation is an operation: a [`Batch`] of
/// `Box<dyn Operation<Output = T>>` holds operations of several kinds.
impl<O: Operation + ?Sized> Operation for Box<O> {
    type Output = O::Output;

    fn invocation(&self) -> &Invocation {
        (**self).invocation()
    }

    fn decode(&self, reply: Value) -> Result<O::Output> {
        (**self).decode(reply)
    }

    fn operation_id(&self) -> Option<&str> {
        (**self).operation_id()
    }
}

/// An operation whose output goes through a function: [`Operation::map`].
#[derive(Clone)]
pub struct Map<O, F> {
    op: O,
    f: F,
}

impl<O, F, U> Operation for Map<O, F>
where
    O: Operation,
    F: Fn(O::Output) -> U + Send + Sync,
    U: Send,
{
    type Output = U;

    fn invocation(&self) -> &Invocation {
        self.op.invocation()
    }

    fn decode(&self, reply: Value) -> Result<U> {
        self.op.decode(reply).map(&self.f)
    }

    fn operation_id(&self) -> Option<&str> {
        self.op.operation_id()
    }
}

impl<O: std::fmt::Debug, F> std::fmt::Debug for Map<O, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("op", &self.op)
            .finish_non_exhaustive()
    }
}

/// Run one operation on its own: one round trip, plus the `NOSCRIPT` fallback.
pub(crate) async fn run_one<O, C>(op: &O, conn: &mut C) -> Result<O::Output>
where
    O: Operation,
    C: ConnectionLike + Send,
{
    let reply = op.invocation().run(conn).await?;
    op.decode(reply)
}

/// A connection that can carry a [`Batch`].
///
/// Single-server connections send the whole batch as one pipeline. A cluster
/// connection returns itself from [`BatchConnection::as_cluster`], and the
/// batch is then split by node and the parts sent in parallel.
///
/// Implemented for redis-rs's `MultiplexedConnection`, `ConnectionManager`
/// and cluster `ClusterConnection`. A pooled connection that dereferences to
/// one of them is passed as `&mut *pooled` (e.g. a `deadpool_redis`
/// connection). Your own wrapper can implement it too: the default is the
/// single-server behaviour, and a wrapper around a cluster connection returns
/// it from [`BatchConnection::as_cluster`].
pub trait BatchConnection: ConnectionLike + Send {
    /// The cluster connection, when this is one.
    fn as_cluster(&mut self) -> Option<&mut ClusterConnection> {
        None
    }
}

impl BatchConnection for MultiplexedConnection {}

impl BatchConnection for ConnectionManager {}

impl BatchConnection for ClusterConnection {
    fn as_cluster(&mut self) -> Option<&mut ClusterConnection> {
        Some(self)
    }
}

/// Many operations of one kind, sent in one pipeline per server, with one
/// typed result per operation, in order. Operations of several kinds (yours
/// among them, [`crate::script::Call`]) share a batch as
/// `Batch<Box<dyn Operation<Output = T>>>`, each mapped into `T` with
/// [`Operation::map`].
///
/// On a single server, [`Batch::run`] costs one round trip for the whole
/// batch. On a cluster it asks a node for the slot map (one round trip),
/// then sends one pipeline per primary, all in parallel.
///
/// Each operation keeps the guarantees of its single call: it runs as one
/// atomic script, and a failure affects only its own entry.
///
/// * `NOSCRIPT` inside a batch is recovered: the server promises that those
///   entries did not run, so exactly they are sent again, in one more
///   pipeline per node that first loads their scripts with `SCRIPT LOAD`
///   (where that is refused, a third pipeline sends them as `EVAL`). No
///   entry ever runs twice.
/// * A server error for one entry (`WRONGTYPE`, a script's own check) is that
///   entry's [`Error::Redis`]; the others are unaffected.
/// * A lost connection makes every entry sent over it
///   [`Error::Indeterminate`]: each may or may not have run.
/// * On a cluster, if the topology changes while a batch is in flight, a
///   node may answer `MOVED` for some entries. redis-rs then reports one
///   error for that node's whole pipeline, so every entry of that part is
///   [`Error::Indeterminate`] (some may have run). Parts sent to other nodes
///   are unaffected. Nothing is retried.
/// * The cluster client must be built with `retries(0)`, as for single calls
///   (see the crate docs), and here for one more reason: with retries on,
///   redis-rs 1.8 answers a `MOVED` for one entry by sending the node's whole
///   pipeline again to the new owner, running its other entries twice.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use nolock::{limits::TryIncrement, Batch};
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let users = ["alice", "bob", "carol"];
/// let mut batch = Batch::new();
/// for user in users {
///     batch.push(TryIncrement::new(&nolock::limits::Counter::new(100, Duration::from_secs(60))?, &format!("quota:{user}"))?);
/// }
/// for (user, result) in users.iter().zip(batch.run(conn).await) {
///     match result {
///         Ok(a) if a.admitted => println!("{user}: ok, {} left", a.remaining),
///         Ok(_) => println!("{user}: over quota"),
///         Err(e) => println!("{user}: {e}"),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Batch<O> {
    ops: Vec<O>,
}

impl<O> Default for Batch<O> {
    fn default() -> Self {
        Batch { ops: Vec::new() }
    }
}

impl<O: Operation> Batch<O> {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// An empty batch with room for `n` operations.
    pub fn with_capacity(n: usize) -> Self {
        Batch {
            ops: Vec::with_capacity(n),
        }
    }

    /// Add an operation; its result will be at the same index.
    pub fn push(&mut self, op: O) -> &mut Self {
        self.ops.push(op);
        self
    }

    /// The operations, in order.
    pub fn ops(&self) -> &[O] {
        &self.ops
    }

    /// How many operations the batch holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Send every operation and return their results in order.
    ///
    /// Running the same batch twice applies every operation twice.
    ///
    /// # Errors
    ///
    /// Per entry, as its single call: [`Error::Redis`] when the server
    /// refused it (nothing happened), [`Error::Indeterminate`] when its
    /// reply was lost (see the type docs for clusters), and
    /// [`Error::CrossSlot`] for an operation whose keys span slots (not
    /// sent). When a cluster's slot map cannot be read, every entry gets
    /// that error and nothing is sent.
    pub async fn run<C>(&self, conn: &mut C) -> Vec<Result<O::Output>>
    where
        C: BatchConnection,
    {
        BATCHES.fetch_add(1, Relaxed);
        let calls: Vec<&Invocation> = self.ops.iter().map(Operation::invocation).collect();
        let run = observe::BatchRun::start(calls.first().map(|c| c.script().name()), calls.len());
        let results = run.within(self.send(conn, &calls)).await;
        run.finish(&results);
        results
    }

    /// Sends every entry (one pipeline per server, entries that got
    /// `NOSCRIPT` again after loading their scripts) and decodes the replies.
    async fn send<C>(&self, conn: &mut C, calls: &[&Invocation]) -> Vec<Result<O::Output>>
    where
        C: BatchConnection,
    {
        let mut replies: Vec<Option<Result<Value>>> = Vec::with_capacity(calls.len());
        let mut ready = Vec::with_capacity(calls.len());
        for (index, call) in calls.iter().enumerate() {
            match call.check() {
                Ok(()) => {
                    ready.push(index);
                    replies.push(None);
                }
                Err(err) => replies.push(Some(Err(err))),
            }
        }
        CALLS.fetch_add(ready.len() as u64, Relaxed);

        if ready.is_empty() {
            // Nothing to send.
        } else if let Some(cluster) = conn.as_cluster() {
            match node_groups(cluster, calls, ready).await {
                Ok(groups) => {
                    let parts = groups.into_iter().map(|(slot, indices)| {
                        let mut node = ClusterNode {
                            conn: cluster.clone(),
                            route: SingleNodeRoutingInfo::SpecificNode(Route::new(
                                slot,
                                SlotAddr::Master,
                            )),
                        };
                        let calls = &calls;
                        async move {
                            let results = send_part(&mut node, calls, &indices, true).await;
                            indices.into_iter().zip(results).collect::<Vec<_>>()
                        }
                    });
                    for part in join_all(parts).await {
                        for (index, result) in part {
                            replies[index] = Some(result);
                        }
                    }
                }
                Err(err) => {
                    for reply in replies.iter_mut().filter(|r| r.is_none()) {
                        *reply = Some(Err(Error::from_redis(err.clone())));
                    }
                }
            }
        } else {
            let results = send_part(conn, calls, &ready, false).await;
            for (index, result) in ready.into_iter().zip(results) {
                replies[index] = Some(result);
            }
        }

        let results: Vec<_> = self
            .ops
            .iter()
            .zip(replies)
            .map(|(op, reply)| match reply {
                Some(reply) => reply.and_then(|value| op.decode(value)),
                None => Err(Error::UnexpectedReply {
                    script: op.invocation().script().name(),
                    detail: "no reply was recorded for this batch entry".into(),
                }),
            })
            .collect();
        results
    }
}

impl<O: Operation> FromIterator<O> for Batch<O> {
    fn from_iter<I: IntoIterator<Item = O>>(iter: I) -> Self {
        Batch {
            ops: iter.into_iter().collect(),
        }
    }
}

impl<O: Operation> Extend<O> for Batch<O> {
    fn extend<I: IntoIterator<Item = O>>(&mut self, iter: I) {
        self.ops.extend(iter);
    }
}

/// Send the calls at `indices` as one pipeline over `conn`, then the ones
/// that got `NOSCRIPT` again, after a `SCRIPT LOAD` of their scripts, in one
/// more pipeline ([`resend`]). Returns one result per index, in order.
///
/// `cluster` tells how to read an error for the whole pipeline
/// ([`part_error`]).
async fn send_part<C>(
    conn: &mut C,
    calls: &[&Invocation],
    indices: &[usize],
    cluster: bool,
) -> Vec<Result<Value>>
where
    C: ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    for &index in indices {
        pipe.add_command(calls[index].command().clone());
    }
    let mut results: Vec<Result<Value>> = match send_pipeline(conn, &pipe).await {
        Ok(values) => values.into_iter().map(entry_result).collect(),
        Err(err) => {
            return indices
                .iter()
                .map(|_| Err(part_error(&err, cluster)))
                .collect()
        }
    };

    // NOSCRIPT: the script did not run; send exactly those entries again,
    // first with their scripts loaded, then (for any still missing one) as
    // `EVAL`.
    let missing = noscript(&results);
    FALLBACKS.fetch_add(missing.len() as u64, Relaxed);
    if !missing.is_empty() {
        observe::batch_noscript(
            calls.first().map(|c| c.script().name()),
            missing.len() as u64,
        );
    }
    for fallback in [Resend::Loaded, Resend::Eval] {
        let missing = noscript(&results);
        if missing.is_empty() {
            break;
        }
        let entries: Vec<&Invocation> = missing.iter().map(|&p| calls[indices[p]]).collect();
        for (position, result) in missing
            .into_iter()
            .zip(resend(conn, &entries, fallback, cluster).await)
        {
            results[position] = result;
        }
    }
    results
}

/// Positions of the results that are `NOSCRIPT`.
fn noscript(results: &[Result<Value>]) -> Vec<usize> {
    results
        .iter()
        .enumerate()
        .filter(|(_, result)| matches!(result, Err(Error::Redis(err)) if is_noscript(err)))
        .map(|(position, _)| position)
        .collect()
}

/// How entries that got `NOSCRIPT` are sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// One `SCRIPT LOAD` per distinct script, then the `EVALSHA`s, in one
    /// pipeline: the scripts become resident, out of reach of the `EVAL`
    /// script LRU of Redis >= 7.4 and Valkey >= 8.0 (see
    /// `Invocation::run`).
    Loaded,
    /// `EVAL`s with the sources, for entries that got `NOSCRIPT` even after
    /// the `SCRIPT LOAD` (refused by an ACL or a proxy).
    Eval,
}

/// Send `entries` again as one pipeline; one result per entry, in order.
///
/// A `SCRIPT LOAD` reply is not needed: if it failed, the entries of its
/// script get `NOSCRIPT` again and go out as `EVAL`. An error for the whole
/// pipeline is read as for the first send ([`part_error`]); on a cluster the
/// `SCRIPT LOAD`s cannot cause one (they have no key to redirect).
async fn resend<C>(
    conn: &mut C,
    entries: &[&Invocation],
    how: Resend,
    cluster: bool,
) -> Vec<Result<Value>>
where
    C: ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    let mut loads = 0;
    if how == Resend::Loaded {
        let mut scripts: Vec<&str> = Vec::new();
        for call in entries {
            let name = call.script().name();
            if !scripts.contains(&name) {
                scripts.push(name);
                pipe.add_command(call.load_command());
                loads += 1;
            }
        }
    }
    for call in entries {
        pipe.add_command(match how {
            Resend::Loaded => call.command().clone(),
            Resend::Eval => call.fallback_command(),
        });
    }
    match send_pipeline(conn, &pipe).await {
        Ok(values) => values.into_iter().skip(loads).map(entry_result).collect(),
        Err(err) => entries
            .iter()
            .map(|_| Err(part_error(&err, cluster)))
            .collect(),
    }
}

/// The error of a whole pipeline, for each of its entries. On a cluster
/// connection a server error there is one entry's redirect (`MOVED`, `ASK`,
/// `TRYAGAIN`, ...) that redis-rs reports instead of every reply, so entries
/// before it may have run: indeterminate.
fn part_error(err: &RedisError, cluster: bool) -> Error {
    match err.kind() {
        ErrorKind::Server(_) if cluster => Error::Indeterminate(err.clone()),
        _ => Error::from_redis(err.clone()),
    }
}

/// One pipeline round trip, with a check that every command got a reply.
async fn send_pipeline<C>(conn: &mut C, pipe: &Pipeline) -> Result<Vec<Value>, RedisError>
where
    C: ConnectionLike + Send,
{
    let values = conn.req_packed_commands(pipe, 0, pipe.len()).await?;
    if values.len() == pipe.len() {
        Ok(values)
    } else {
        Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "pipeline reply count differs from its command count",
        )))
    }
}

/// One entry's reply: a value, or the server's error for that entry alone.
fn entry_result(value: Value) -> Result<Value> {
    match value {
        Value::ServerError(err) => Err(Error::from_redis(err.into())),
        value => Ok(value),
    }
}

/// One cluster node, reached through the cluster connection by a slot it
/// owns: redis-rs resolves the node from its own slot map.
struct ClusterNode {
    conn: ClusterConnection,
    route: SingleNodeRoutingInfo,
}

impl ConnectionLike for ClusterNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(
            self.conn
                .route_pipeline(pipe.clone(), offset, count, self.route.clone()),
        )
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// Group the calls at `ready` by the primary that owns their slot, from the
/// cluster's own `CLUSTER SLOTS`. Each group is named by one of its slots,
/// which routes its pipeline. Keyless calls go with the first group.
async fn node_groups(
    cluster: &mut ClusterConnection,
    calls: &[&Invocation],
    ready: Vec<usize>,
) -> Result<Vec<(u16, Vec<usize>)>, RedisError> {
    let reply = cluster
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let ranges = slot_ranges(reply)?;
    let owner = |slot: u16| {
        ranges
            .iter()
            .find(|range| range.start <= slot && slot <= range.end)
            .map(|range| range.primary.as_str())
    };

    let mut groups: Vec<(&str, u16, Vec<usize>)> = Vec::new();
    let mut keyless = Vec::new();
    for index in ready {
        let Some(slot) = calls[index].slot() else {
            keyless.push(index);
            continue;
        };
        // A slot no node owns (the cluster is resharding or down): send it on
        // its own; the node redis-rs picks will answer for it.
        let primary = owner(slot).unwrap_or("");
        match groups
            .iter_mut()
            .find(|(p, _, _)| *p == primary && !p.is_empty())
        {
            Some((_, _, indices)) => indices.push(index),
            None => groups.push((primary, slot, vec![index])),
        }
    }
    let mut groups: Vec<(u16, Vec<usize>)> = groups
        .into_iter()
        .map(|(_, slot, indices)| (slot, indices))
        .collect();
    if !keyless.is_empty() {
        match groups.first_mut() {
            Some((_, indices)) => indices.extend(keyless),
            None => groups.push((0, keyless)),
        }
    }
    Ok(groups)
}

/// One line of `CLUSTER SLOTS`: a slot range and its primary's address.
struct SlotRange {
    start: u16,
    end: u16,
    primary: String,
}

/// Parse `CLUSTER SLOTS`: `[[start, end, [host, port, id, ...], replica...], ...]`.
fn slot_ranges(reply: Value) -> Result<Vec<SlotRange>, RedisError> {
    let bad = || {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "CLUSTER SLOTS reply of an unexpected shape",
        ))
    };
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    ranges
        .into_iter()
        .map(|range| {
            let Value::Array(fields) = range else {
                return Err(bad());
            };
            let slot = |value: Option<&Value>| match value {
                Some(Value::Int(n)) => u16::try_from(*n).map_err(|_| bad()),
                _ => Err(bad()),
            };
            let primary = match fields.get(2) {
                Some(Value::Array(node)) => format!("{:?}:{:?}", node.first(), node.get(1)),
                _ => return Err(bad()),
            };
            Ok(SlotRange {
                start: slot(fields.first())?,
                end: slot(fields.get(1))?,
                primary,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::invoke::tests::{NoIo, Scripted, NOSCRIPT};
    use crate::script::Script;

    static TWO_KEYS: Script = Script::embedded("test/two_keys", "return 1");

    impl BatchConnection for NoIo {}

    #[derive(Debug)]
    struct Probe(Invocation);

    impl Operation for Probe {
        type Output = Value;
        fn invocation(&self) -> &Invocation {
            &self.0
        }
        fn decode(&self, reply: Value) -> Result<Value> {
            Ok(reply)
        }
    }

    #[tokio::test]
    async fn a_cross_slot_entry_is_refused_alone_and_nothing_is_sent_for_it() {
        let batch: Batch<Probe> = [
            Probe(Invocation::new(&TWO_KEYS, &["{a}x", "{b}y"])),
            Probe(Invocation::new(&TWO_KEYS, &["{c}x", "{d}y"])),
        ]
        .into_iter()
        .collect();
        let mut conn = NoIo::default();
        let results = batch.run(&mut conn).await;
        assert_eq!(conn.sent, 0, "nothing to send");
        assert_eq!(results.len(), 2);
        assert!(results
            .iter()
            .all(|r| matches!(r, Err(Error::CrossSlot { first, second, .. }) if first != second)));

        // With one good entry, only it is sent (and fails with the connection).
        let mut batch = Batch::new();
        batch
            .push(Probe(Invocation::new(&TWO_KEYS, &["{a}x", "{b}y"])))
            .push(Probe(Invocation::new(&TWO_KEYS, &["{a}x", "{a}y"])));
        let results = batch.run(&mut conn).await;
        assert_eq!(conn.sent, 1, "one pipeline");
        assert!(matches!(results[0], Err(Error::CrossSlot { .. })));
        // NoIo fails with a client-side error, which may follow a send.
        assert!(matches!(results[1], Err(Error::Indeterminate(_))));
    }

    impl BatchConnection for Scripted {}

    static OTHER: Script = Script::embedded("test/other", "return 2");

    #[tokio::test]
    async fn noscript_entries_are_loaded_per_script_then_evaled_if_still_missing() {
        let batch: Batch<Probe> = [
            Probe(Invocation::new(&TWO_KEYS, &["a"])),
            Probe(Invocation::new(&TWO_KEYS, &["b"])),
            Probe(Invocation::new(&OTHER, &["c"])),
            Probe(Invocation::new(&TWO_KEYS, &["d"])),
        ]
        .into_iter()
        .collect();
        let noperm = "-NOPERM no permissions to run the 'script|load' command";
        let mut conn = Scripted::new(vec![
            Ok(vec![NOSCRIPT, ":2", NOSCRIPT, NOSCRIPT]),
            // One SCRIPT LOAD per script; OTHER's is refused.
            Ok(vec!["+sha", noperm, ":1", NOSCRIPT, ":4"]),
            Ok(vec![":3"]),
        ]);
        let results: Vec<Value> = batch
            .run(&mut conn)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(results, (1..=4).map(Value::Int).collect::<Vec<_>>());
        let two = TWO_KEYS.sha1();
        let other = OTHER.sha1();
        let line = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(
            conn.sent[1],
            line(&[
                "SCRIPT", "LOAD", "return 1", "|", "SCRIPT", "LOAD", "return 2", "|", "EVALSHA",
                two, "1", "a", "|", "EVALSHA", other, "1", "c", "|", "EVALSHA", two, "1", "d", "|"
            ])
        );
        assert_eq!(conn.sent[2], line(&["EVAL", "return 2", "1", "c", "|"]));
        assert_eq!(conn.sent.len(), 3);
    }

    #[test]
    fn cluster_slots_replies_are_parsed() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node(7000),
                node(7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node(7001)]),
        ]);
        let ranges = slot_ranges(reply).unwrap();
        assert_eq!(ranges.len(), 2);
        assert_eq!((ranges[0].start, ranges[0].end), (0, 5460));
        assert_eq!((ranges[1].start, ranges[1].end), (5461, 16383));
        assert_ne!(ranges[0].primary, ranges[1].primary);
        assert!(slot_ranges(Value::Int(1)).is_err());
        assert!(slot_ranges(Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
    }

    #[test]
    fn a_whole_cluster_pipeline_error_from_the_server_is_indeterminate() {
        let moved = RedisError::from((
            ErrorKind::Server(redis::ServerErrorKind::Moved),
            "MOVED 1 127.0.0.1:7000",
        ));
        assert!(matches!(part_error(&moved, true), Error::Indeterminate(_)));
        assert!(matches!(part_error(&moved, false), Error::Redis(_)));
        let lost = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(part_error(&lost, true), Error::Indeterminate(_)));
    }
}
