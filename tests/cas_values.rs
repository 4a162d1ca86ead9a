//! The `cas` calls as operation values, against a real redis-server.
//!
//! * Batches: each value goes in a [`Batch`] with others of its kind and
//!   answers as its single call does, in order; all kinds share one boxed
//!   batch, with or without operation ids.
//! * Lost replies: each value that writes, given an operation id, is sent
//!   again by `nolock::retry` after a reply lost on the way back (the fault
//!   proxy of `tests/support/proxy.rs` cuts the connection after the server
//!   ran the request) and answers with the first run's reply, without
//!   applying it a second time, even when the key changed in between and a
//!   plain resend would apply again.

mod support;

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use nolock::cas::{
    self, Adjust, Adjustment, CompareAndDelete, CompareAndExpire, CompareAndSet, Expected,
    GetVersioned, Insert, Outcome, SetIfAbsent, SetIfGreater, SetIfLess, SetIfVersion, Update,
    Versioned, Watermark,
};
use nolock::retry::{retry, RetryPolicy};
use nolock::{Backoff, Batch, Error, Idempotent, Operation};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use support::proxy::FaultProxy;
use support::{prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    raw(conn, &["GET", key]).await
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    raw(conn, &["PTTL", key]).await
}

/// `batch` run at once on `conn`, each result unwrapped.
async fn run_batch<O>(conn: &mut MultiplexedConnection, batch: &Batch<O>) -> Vec<O::Output>
where
    O: Operation,
{
    batch
        .run(conn)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("entry {i}: {e}")))
        .collect()
}

/// The same calls one by one: `single` runs call `i` on `conn`.
async fn run_single<T, F, Fut>(conn: &mut MultiplexedConnection, n: usize, mut single: F) -> Vec<T>
where
    F: FnMut(MultiplexedConnection, usize) -> Fut,
    Fut: Future<Output = nolock::Result<T>>,
{
    let mut out = Vec::new();
    for i in 0..n {
        out.push(single(conn.clone(), i).await.unwrap());
    }
    out
}

fn mismatch(current: Option<&str>) -> Outcome {
    Outcome::Mismatch {
        current: current.map(|c| c.as_bytes().to_vec()),
    }
}

// ---------------------------------------------------------------------------
// batches: each kind with others of its kind, the same answers as single calls

#[tokio::test]
async fn compare_and_set_values_in_a_batch_answer_as_single_calls() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    type Step = (usize, Option<&'static str>, &'static str, Option<Duration>);
    // Key index, expected (None: absent), new value, ttl. Keys repeat, so
    // order matters.
    let steps: [Step; 6] = [
        (0, None, "queued", None),
        (0, None, "other", None),
        (0, Some("queued"), "running", Some(MINUTE)),
        (1, Some("x"), "y", None),
        (2, None, "", None),
        (2, Some(""), "z", None),
    ];
    let expected = |e: Option<&'static str>| e.map_or(Expected::Absent, Expected::value);
    let (batched, single) = (prefix("cas_set_batch"), prefix("cas_set_single"));
    let key = |p: &str, i: usize| format!("{p}{i}");

    let batch: Batch<CompareAndSet> = steps
        .iter()
        .map(|&(k, e, new, ttl)| CompareAndSet::new(&key(&batched, k), expected(e), new, ttl))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, steps.len(), |mut c, i| {
        let (k, e, new, ttl) = steps[i];
        let key = key(&single, k);
        async move { cas::compare_and_set(&mut c, &key, expected(e), new, ttl).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    assert_eq!(
        from_batch,
        [
            Outcome::Applied,
            mismatch(Some("queued")),
            Outcome::Applied,
            mismatch(None),
            Outcome::Applied,
            Outcome::Applied,
        ]
    );
    for p in [&batched, &single] {
        assert_eq!(get(&mut conn, &key(p, 0)).await.as_deref(), Some("running"));
        let ttl = pttl(&mut conn, &key(p, 0)).await;
        assert!(ttl > 55_000 && ttl <= 60_000, "{ttl}");
        assert_eq!(get(&mut conn, &key(p, 1)).await, None, "not created");
        assert_eq!(get(&mut conn, &key(p, 2)).await.as_deref(), Some("z"));
    }
}

#[tokio::test]
async fn set_if_absent_values_in_a_batch_answer_as_single_calls() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let steps: [(usize, &str, Option<Duration>); 4] = [
        (0, "a", Some(MINUTE)),
        (0, "b", None),
        (1, "c", None),
        (0, "d", Some(MINUTE * 10)),
    ];
    let (batched, single) = (prefix("cas_absent_batch"), prefix("cas_absent_single"));
    let key = |p: &str, i: usize| format!("{p}{i}");
    let batch: Batch<SetIfAbsent> = steps
        .iter()
        .map(|&(k, value, ttl)| SetIfAbsent::new(&key(&batched, k), value, ttl))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, steps.len(), |mut c, i| {
        let (k, value, ttl) = steps[i];
        let key = key(&single, k);
        async move { cas::set_if_absent(&mut c, &key, value, ttl).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    assert_eq!(
        from_batch,
        [
            Insert::Inserted,
            Insert::Existing(b"a".to_vec()),
            Insert::Inserted,
            Insert::Existing(b"a".to_vec()),
        ]
    );
    for p in [&batched, &single] {
        let ttl = pttl(&mut conn, &key(p, 0)).await;
        assert!(ttl > 55_000 && ttl <= 60_000, "expiry untouched: {ttl}");
        assert_eq!(pttl(&mut conn, &key(p, 1)).await, -1);
    }
}

#[tokio::test]
async fn compare_and_delete_and_expire_values_in_a_batch_answer_as_single_calls() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let (batched, single) = (prefix("cas_del_batch"), prefix("cas_del_single"));
    let key = |p: &str, i: usize| format!("{p}{i}");
    for p in [&batched, &single] {
        let _: () = raw(&mut conn, &["SET", &key(p, 0), "t1", "PX", "2000"]).await;
        let _: () = raw(&mut conn, &["SET", &key(p, 1), "t2", "PX", "2000"]).await;
    }

    // Deletes: a wrong token, the right one, again, another key.
    let deletes: [(usize, &str); 4] = [(0, "t2"), (0, "t1"), (0, "t1"), (1, "t2")];
    let batch: Batch<CompareAndDelete> = deletes
        .iter()
        .map(|&(k, token)| CompareAndDelete::new(&key(&batched, k), token))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, deletes.len(), |mut c, i| {
        let (k, token) = deletes[i];
        let key = key(&single, k);
        async move { cas::compare_and_delete(&mut c, &key, token).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    assert_eq!(
        from_batch,
        [
            mismatch(Some("t1")),
            Outcome::Applied,
            mismatch(None),
            Outcome::Applied
        ]
    );

    // Expiries: recreate key 0, then a wrong token, the right one, a key
    // that is gone.
    for p in [&batched, &single] {
        let _: () = raw(&mut conn, &["SET", &key(p, 0), "t3", "PX", "2000"]).await;
    }
    let extends: [(usize, &str); 3] = [(0, "t9"), (0, "t3"), (1, "t2")];
    let batch: Batch<CompareAndExpire> = extends
        .iter()
        .map(|&(k, token)| CompareAndExpire::new(&key(&batched, k), token, MINUTE))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, extends.len(), |mut c, i| {
        let (k, token) = extends[i];
        let key = key(&single, k);
        async move { cas::compare_and_expire(&mut c, &key, token, MINUTE).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    assert_eq!(
        from_batch,
        [mismatch(Some("t3")), Outcome::Applied, mismatch(None)]
    );
    for p in [&batched, &single] {
        assert!(pttl(&mut conn, &key(p, 0)).await > 55_000);
        assert_eq!(get(&mut conn, &key(p, 1)).await, None, "not recreated");
    }
}

#[tokio::test]
async fn watermark_values_in_a_batch_answer_as_single_calls() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let (batched, single) = (prefix("cas_mark_batch"), prefix("cas_mark_single"));
    let key = |p: &str, i: usize| format!("{p}{i}");
    let mark = |applied, value| Watermark { applied, value };

    let ups: [(usize, i64); 5] = [(0, 10), (0, 7), (0, 12), (1, i64::MIN), (0, 12)];
    let batch: Batch<SetIfGreater> = ups
        .iter()
        .map(|&(k, v)| SetIfGreater::new(&key(&batched, k), v))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, ups.len(), |mut c, i| {
        let (k, v) = ups[i];
        let key = key(&single, k);
        async move { cas::set_if_greater(&mut c, &key, v).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    assert_eq!(
        from_batch,
        [
            mark(true, 10),
            mark(false, 10),
            mark(true, 12),
            mark(true, i64::MIN),
            mark(false, 12)
        ]
    );

    let downs: [(usize, i64); 4] = [(2, 10), (2, 12), (2, -3), (0, 11)];
    let batch: Batch<SetIfLess> = downs
        .iter()
        .map(|&(k, v)| SetIfLess::new(&key(&batched, k), v))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, downs.len(), |mut c, i| {
        let (k, v) = downs[i];
        let key = key(&single, k);
        async move { cas::set_if_less(&mut c, &key, v).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    assert_eq!(
        from_batch,
        [
            mark(true, 10),
            mark(false, 10),
            mark(true, -3),
            mark(true, 11)
        ]
    );
    for p in [&batched, &single] {
        assert_eq!(get(&mut conn, &key(p, 0)).await.as_deref(), Some("11"));
        assert_eq!(get(&mut conn, &key(p, 2)).await.as_deref(), Some("-3"));
    }
}

#[tokio::test]
async fn versioned_values_in_a_batch_answer_as_single_calls() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let (batched, single) = (prefix("cas_ver_batch"), prefix("cas_ver_single"));
    let key = |p: &str, i: usize| format!("{p}{i}");
    let doc = |s: &str| vec![s.to_owned()];

    // Writes: create, a stale create, the next version, another key.
    let writes: Vec<(usize, u64, Vec<String>)> = vec![
        (0, 0, doc("a")),
        (0, 0, doc("b")),
        (0, 1, doc("c")),
        (1, 0, doc("d")),
    ];
    let batch: Batch<SetIfVersion<Vec<String>>> = writes
        .iter()
        .map(|(k, version, value)| SetIfVersion::new(&key(&batched, *k), *version, value))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, writes.len(), |mut c, i| {
        let (k, version, value) = writes[i].clone();
        let key = key(&single, k);
        async move { cas::set_if_version(&mut c, &key, version, &value).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    assert_eq!(
        from_batch,
        [
            Update::Written { version: 1 },
            Update::Conflict {
                current: Some(Versioned {
                    value: doc("a"),
                    version: 1
                })
            },
            Update::Written { version: 2 },
            Update::Written { version: 1 },
        ]
    );

    // Reads, a missing key among them; read-only values take no id.
    let reads = [0, 2, 1, 0];
    let batch: Batch<GetVersioned<Vec<String>>> = reads
        .iter()
        .map(|&k| GetVersioned::new(&key(&batched, k)))
        .collect::<nolock::Result<_>>()
        .unwrap();
    let from_batch = run_batch(&mut conn, &batch).await;
    let one_by_one = run_single(&mut conn, reads.len(), |mut c, i| {
        let key = key(&single, reads[i]);
        async move { cas::get_versioned::<Vec<String>, _>(&mut c, &key).await }
    })
    .await;
    assert_eq!(from_batch, one_by_one);
    let version = |value: &str, version| {
        Some(Versioned {
            value: doc(value),
            version,
        })
    };
    assert_eq!(
        from_batch,
        [version("c", 2), None, version("d", 1), version("c", 2)]
    );
    let err = GetVersioned::<Vec<String>>::new(&key(&batched, 0))
        .unwrap()
        .idempotent("r")
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
}

/// What every `cas` value returns, to share one batch.
#[derive(Debug, Clone, PartialEq)]
enum Out {
    Outcome(Outcome),
    Insert(Insert),
    Mark(Watermark),
    Balance(Adjustment),
    Update(Update<String>),
    Read(Option<Versioned<String>>),
}

/// Every kind in one batch, in the order a job's life needs them; with ids
/// on the writes, a second run of the same batch answers every entry as the
/// first run did and changes nothing.
#[tokio::test]
async fn every_kind_shares_one_batch_and_ids_replay_every_write() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("cas_mixed");
    let (job, mark, balance, doc, none) = (
        format!("{p}job"),
        format!("{p}mark"),
        format!("{p}balance"),
        format!("{p}doc"),
        format!("{p}none"),
    );
    type Op = Box<dyn Operation<Output = Out>>;
    fn write<O: Operation + 'static>(op: O, id: &str, f: fn(O::Output) -> Out) -> Op {
        Box::new(op.idempotent(id).unwrap().map(f))
    }
    let batch: Batch<Op> = vec![
        write(
            SetIfAbsent::new(&job, "queued", None).unwrap(),
            "1",
            Out::Insert,
        ),
        write(
            CompareAndSet::new(&job, Expected::value("queued"), "running", None).unwrap(),
            "2",
            Out::Outcome,
        ),
        write(
            CompareAndExpire::new(&job, "running", MINUTE).unwrap(),
            "3",
            Out::Outcome,
        ),
        write(SetIfGreater::new(&mark, 5).unwrap(), "4", Out::Mark),
        write(SetIfLess::new(&mark, 3).unwrap(), "5", Out::Mark),
        write(
            Adjust::credit(&balance, 10, None).unwrap(),
            "6",
            Out::Balance,
        ),
        write(SetIfVersion::new(&doc, 0, "v1").unwrap(), "7", Out::Update),
        Box::new(GetVersioned::new(&doc).unwrap().map(Out::Read)),
        write(
            CompareAndDelete::new(&job, "running").unwrap(),
            "8",
            Out::Outcome,
        ),
        Box::new(GetVersioned::new(&none).unwrap().map(Out::Read)),
    ]
    .into_iter()
    .collect();
    let first = run_batch(&mut conn, &batch).await;
    assert_eq!(
        first,
        [
            Out::Insert(Insert::Inserted),
            Out::Outcome(Outcome::Applied),
            Out::Outcome(Outcome::Applied),
            Out::Mark(Watermark {
                applied: true,
                value: 5
            }),
            Out::Mark(Watermark {
                applied: true,
                value: 3
            }),
            Out::Balance(Adjustment::Applied { balance: 10 }),
            Out::Update(Update::Written { version: 1 }),
            Out::Read(Some(Versioned {
                value: "v1".to_owned(),
                version: 1
            })),
            Out::Outcome(Outcome::Applied),
            Out::Read(None),
        ]
    );
    let again = run_batch(&mut conn, &batch).await;
    assert_eq!(again, first, "every write answered from its record");
    assert_eq!(get(&mut conn, &job).await, None, "not inserted again");
    assert_eq!(get(&mut conn, &mark).await.as_deref(), Some("3"));
    assert_eq!(get(&mut conn, &balance).await.as_deref(), Some("10"));
    let stored = cas::get_versioned::<String, _>(&mut conn, &doc)
        .await
        .unwrap();
    assert_eq!(stored.map(|v| v.version), Some(1), "written once");
}

// ---------------------------------------------------------------------------
// lost replies: sent again with an id, applied once, answered from the record

fn policy() -> RetryPolicy {
    RetryPolicy {
        backoff: Backoff {
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(50),
            ..Backoff::new(Duration::from_secs(20))
        },
        max_attempts: 50,
    }
}

/// A server, a fault proxy in front of it, a reconnecting connection
/// through the proxy and a direct one.
async fn setup() -> (
    RedisServer,
    FaultProxy,
    ConnectionManager,
    MultiplexedConnection,
) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port).await;
    let through = proxy.manager().await;
    let mut direct = server.conn().await;
    // Loaded, so that the first request through the proxy runs the script
    // rather than meeting NOSCRIPT (a lost NOSCRIPT would prove nothing).
    nolock::Scripts::load(&mut direct).await.unwrap();
    (server, proxy, through, direct)
}

/// Run `op` once with its reply lost: the server applied it, the caller got
/// `Indeterminate`.
async fn lose_the_reply<O>(proxy: &FaultProxy, conn: &mut ConnectionManager, op: &Idempotent<O>)
where
    O: Operation,
    O::Output: Debug,
{
    let lost = proxy.stats().replies_lost;
    proxy.lose_replies(1);
    let err = op.run(conn).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate(_)), "{err}");
    assert_eq!(proxy.stats().replies_lost, lost + 1, "the reply was lost");
}

/// Send `op` again with `retry`, then once more: both answers are `first`.
async fn resent<O>(conn: &mut ConnectionManager, op: &O, first: O::Output)
where
    O: Operation,
    O::Output: PartialEq + Debug,
{
    assert_eq!(retry(&policy(), conn, op).await.unwrap(), first);
    assert_eq!(
        retry(&policy(), conn, op).await.unwrap(),
        first,
        "and again"
    );
}

#[tokio::test]
async fn a_lost_compare_and_set_is_applied_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let job = format!("{}job", prefix("cas_lost_set"));
    let _: () = raw(&mut direct, &["SET", &job, "queued"]).await;
    let start = CompareAndSet::new(&job, Expected::value("queued"), "running", None)
        .unwrap()
        .idempotent("worker-1:start")
        .unwrap();
    lose_the_reply(&proxy, &mut conn, &start).await;
    assert_eq!(get(&mut direct, &job).await.as_deref(), Some("running"));

    // Another worker moves the job back before the resend arrives.
    let back = cas::compare_and_set(
        &mut direct,
        &job,
        Expected::value("running"),
        "queued",
        None,
    )
    .await
    .unwrap();
    assert!(back.is_applied());
    resent(&mut conn, &start, Outcome::Applied).await;
    assert_eq!(
        get(&mut direct, &job).await.as_deref(),
        Some("queued"),
        "the resend was not applied again"
    );
    // Without the id, the same resend would have applied a second time.
    let plain = cas::compare_and_set(&mut conn, &job, Expected::value("queued"), "running", None)
        .await
        .unwrap();
    assert_eq!(plain, Outcome::Applied, "the hazard the id removes");
}

#[tokio::test]
async fn a_lost_set_if_absent_is_inserted_once_and_answers_inserted() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let claim = format!("{}idem", prefix("cas_lost_absent"));
    let op = SetIfAbsent::new(&claim, "pending", Some(MINUTE))
        .unwrap()
        .idempotent("request-7f3a")
        .unwrap();
    lose_the_reply(&proxy, &mut conn, &op).await;
    assert_eq!(get(&mut direct, &claim).await.as_deref(), Some("pending"));
    // A plain resend cannot tell its own insert from someone else's.
    let plain = cas::set_if_absent(&mut conn, &claim, "pending", Some(MINUTE))
        .await
        .unwrap();
    assert_eq!(plain, Insert::Existing(b"pending".to_vec()));
    // With the id it answers as the first run did.
    resent(&mut conn, &op, Insert::Inserted).await;

    // The claim is done with and deleted: the resend does not bring it back.
    let done = cas::compare_and_delete(&mut direct, &claim, "pending")
        .await
        .unwrap();
    assert!(done.is_applied());
    resent(&mut conn, &op, Insert::Inserted).await;
    assert_eq!(get(&mut direct, &claim).await, None, "inserted once");
}

#[tokio::test]
async fn a_lost_compare_and_delete_deletes_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let marker = format!("{}marker", prefix("cas_lost_delete"));
    let _: () = raw(&mut direct, &["SET", &marker, "pending"]).await;
    let op = CompareAndDelete::new(&marker, "pending")
        .unwrap()
        .idempotent("clear-1")
        .unwrap();
    lose_the_reply(&proxy, &mut conn, &op).await;
    assert_eq!(get(&mut direct, &marker).await, None);

    // Another request sets its own marker, with the same bytes.
    let theirs = cas::set_if_absent(&mut direct, &marker, "pending", None)
        .await
        .unwrap();
    assert!(theirs.is_inserted());
    resent(&mut conn, &op, Outcome::Applied).await;
    assert_eq!(
        get(&mut direct, &marker).await.as_deref(),
        Some("pending"),
        "the other request's marker survives the resend"
    );
}

#[tokio::test]
async fn a_lost_compare_and_expire_extends_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let lease = format!("{}lease", prefix("cas_lost_expire"));
    let _: () = raw(&mut direct, &["SET", &lease, "tok", "PX", "2000"]).await;
    let op = CompareAndExpire::new(&lease, "tok", MINUTE)
        .unwrap()
        .idempotent("extend-1")
        .unwrap();
    lose_the_reply(&proxy, &mut conn, &op).await;
    assert!(pttl(&mut direct, &lease).await > 55_000, "extended");

    // The holder then shortens its lease (its work is nearly done).
    let short = cas::compare_and_expire(&mut direct, &lease, "tok", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(short.is_applied());
    resent(&mut conn, &op, Outcome::Applied).await;
    let ttl = pttl(&mut direct, &lease).await;
    assert!(ttl > 0 && ttl <= 5_000, "not extended again: {ttl}");
}

#[tokio::test]
async fn a_lost_watermark_is_stored_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let p = prefix("cas_lost_mark");
    let (high, low) = (format!("{p}high"), format!("{p}low"));

    let up = SetIfGreater::new(&high, 10)
        .unwrap()
        .idempotent("offset-10")
        .unwrap();
    lose_the_reply(&proxy, &mut conn, &up).await;
    assert_eq!(get(&mut direct, &high).await.as_deref(), Some("10"));
    // Reset below it (a replay from an earlier offset, by an operator).
    let _: () = raw(&mut direct, &["SET", &high, "5"]).await;
    let mark = Watermark {
        applied: true,
        value: 10,
    };
    resent(&mut conn, &up, mark).await;
    assert_eq!(get(&mut direct, &high).await.as_deref(), Some("5"));

    let down = SetIfLess::new(&low, 3)
        .unwrap()
        .idempotent("bid-3")
        .unwrap();
    lose_the_reply(&proxy, &mut conn, &down).await;
    assert_eq!(get(&mut direct, &low).await.as_deref(), Some("3"));
    let _: () = raw(&mut direct, &["SET", &low, "8"]).await;
    let mark = Watermark {
        applied: true,
        value: 3,
    };
    resent(&mut conn, &down, mark).await;
    assert_eq!(get(&mut direct, &low).await.as_deref(), Some("8"));
}

#[tokio::test]
async fn a_lost_versioned_write_is_written_once_and_answers_written() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let doc = format!("{}doc", prefix("cas_lost_version"));
    let op = SetIfVersion::<String>::new(&doc, 0, "first")
        .unwrap()
        .idempotent("create-1")
        .unwrap();
    lose_the_reply(&proxy, &mut conn, &op).await;
    // A plain resend reads its own write back as a conflict.
    let plain = cas::set_if_version(&mut conn, &doc, 0, &"first".to_owned())
        .await
        .unwrap();
    assert!(!plain.is_written(), "{plain:?}");
    resent(&mut conn, &op, Update::Written { version: 1 }).await;

    // A second writer moves it on; the resend does not write again.
    let next = cas::set_if_version(&mut direct, &doc, 1, &"second".to_owned())
        .await
        .unwrap();
    assert_eq!(next, Update::Written { version: 2 });
    resent(&mut conn, &op, Update::Written { version: 1 }).await;
    let stored = cas::get_versioned::<String, _>(&mut direct, &doc)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stored.value.as_str(), stored.version), ("second", 2));
}
