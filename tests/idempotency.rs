//! Operation ids: a resend after a lost reply is answered from
//! the record and applies nothing; the plain calls are unchanged.
//!
//! Faults come from `support::proxy::FaultProxy::lose_replies`: the proxy
//! forwards the request, the server runs it, and the connection is cut
//! before the reply comes back (an `Error::Indeterminate` call).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nolock::cas::{
    self, Adjust, Adjustment, CompareAndDelete, CompareAndExpire, CompareAndSet, Expected,
    GetVersioned, SetIfAbsent, SetIfGreater, SetIfLess, SetIfVersion, Update,
};
use nolock::fence::{
    AcquireLock, AdvanceAttempt, AdvanceFence, ExtendLock, ForceAdvanceFence, Lock, LockExtend,
    LockRelease, ReadFenced, ReleaseLock, WriteFenced,
};
use nolock::limits::{self, TryIncrement};
use nolock::rate::{
    Algorithm, Check, Limiter, MultiCheck, MultiKey, MultiLimiter, MultiRefundCharge, Quota,
    RefundCharge,
};
use nolock::retry::{retry, RetryPolicy};
use nolock::script::Call;
use nolock::semaphore::{
    self, AcquirePermit, ExtendPermit, PermitAttempt, PermitExtend, ReleasePermit, Semaphore,
};
use nolock::Backoff;
use nolock::{Error, Operation, Scripts};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use support::proxy::FaultProxy;
use support::{prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

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

/// A connection that dials again after its socket failed: one fresh
/// `MultiplexedConnection` per cut. (redis-rs's `ConnectionManager` does the
/// same, but through this proxy, whose cuts also hit its reconnect
/// handshakes, it was seen stalling ~9.5 s per attempt in its reconnect
/// backoff: too slow for 200 tasks.)
struct Redial {
    client: redis::Client,
    conn: Option<MultiplexedConnection>,
}

impl Redial {
    fn new(proxy: &FaultProxy) -> Self {
        Redial {
            client: redis::Client::open(proxy.url()).unwrap(),
            conn: None,
        }
    }

    async fn conn(&mut self) -> redis::RedisResult<&mut MultiplexedConnection> {
        if self.conn.is_none() {
            self.conn = Some(self.client.get_multiplexed_async_connection().await?);
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    fn check<T>(&mut self, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if matches!(&result, Err(e) if e.is_io_error() || e.is_unrecoverable_error()) {
            self.conn = None;
        }
        result
    }
}

impl redis::aio::ConnectionLike for Redial {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let result = match self.conn().await {
                Ok(conn) => conn.req_packed_command(cmd).await,
                Err(e) => Err(e),
            };
            self.check(result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            let result = match self.conn().await {
                Ok(conn) => conn.req_packed_commands(pipe, offset, count).await,
                Err(e) => Err(e),
            };
            self.check(result)
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

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

async fn count(conn: &mut MultiplexedConnection, key: &str) -> u64 {
    limits::peek(conn, key).await.unwrap().count
}

#[tokio::test]
async fn a_lost_increment_is_sent_again_and_counted_once_with_the_first_reply() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let key = format!("{}quota", prefix("idem"));
    let op = TryIncrement::new(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &key)
        .unwrap()
        .idempotent("req-1")
        .unwrap();

    proxy.lose_replies(1);
    let err = op.run(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate(_)), "{err}");
    assert_eq!(
        count(&mut direct, &key).await,
        1,
        "the lost call was applied"
    );

    let resends = nolock::stats().retry_resends;
    let again = retry(&policy(), &mut conn, &op).await.unwrap();
    assert!(again.admitted);
    assert_eq!(again.count, 1);
    // The recorded reply: the PTTL the first run saw, the full window.
    assert_eq!(again.reset_after, Some(MINUTE + Duration::from_millis(1)));
    assert_eq!(count(&mut direct, &key).await, 1, "not applied twice");
    // And a loss inside `retry` itself: it sends again on its own.
    let second = TryIncrement::new(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &key)
        .unwrap()
        .idempotent("req-2")
        .unwrap();
    proxy.lose_replies(1);
    let a = retry(&policy(), &mut conn, &second).await.unwrap();
    assert_eq!((a.admitted, a.count), (true, 2));
    assert_eq!(count(&mut direct, &key).await, 2);
    assert!(nolock::stats().retry_resends > resends);
    assert!(proxy.stats().replies_lost >= 2);
}

#[tokio::test]
async fn without_an_id_a_lost_reply_is_not_sent_again() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let key = format!("{}quota", prefix("idem"));
    let op = TryIncrement::new(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &key).unwrap();
    proxy.lose_replies(1);
    let err = retry(&policy(), &mut conn, &op).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate(_)), "{err}");
    assert_eq!(count(&mut direct, &key).await, 1);
}

/// A lost reply, then the same operation (with its id) sent again by
/// `retry`: the first run's answer.
async fn lost_then_retried<O>(
    proxy: &FaultProxy,
    conn: &mut ConnectionManager,
    op: O,
    id: &str,
) -> O::Output
where
    O: Operation,
{
    let op = op.idempotent(id).unwrap();
    proxy.lose_replies(1);
    match op.run(conn).await {
        Err(Error::Indeterminate(_)) => {}
        Err(err) => panic!("{id}: {err}"),
        Ok(_) => panic!("{id}: the reply was not lost"),
    }
    retry(&policy(), conn, &op).await.unwrap()
}

/// A release whose reply is lost deleted the lock; sent again under its id
/// it answers `Released` again, where a plain resend answers `Lost` (the
/// lock is gone) and cannot be told apart from a lease that expired.
#[tokio::test]
async fn a_resent_release_is_told_apart_from_a_lost_lock() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let p = prefix("idem_release");
    let lock = Lock::new(MINUTE).unwrap();
    let grant = lock
        .acquire(&mut direct, &format!("{p}a"))
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let release = ReleaseLock::new(&grant);
    let again = lost_then_retried(&proxy, &mut conn, release, "release-a").await;
    assert_eq!(again, LockRelease::Released, "its own success");
    let holder: Option<String> = raw(
        &mut direct,
        &["GET", &nolock::keys::derive(&format!("{p}a"), "lock")],
    )
    .await;
    assert_eq!(holder, None);

    // Without an id, the resend finds the lock gone.
    let other = lock
        .acquire(&mut direct, &format!("{p}b"))
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let plain = ReleaseLock::new(&other);
    proxy.lose_replies(1);
    let mut batch = nolock::Batch::new();
    batch.push(plain);
    let first = batch.run(&mut conn).await.pop().unwrap().unwrap_err();
    assert!(matches!(first, Error::Indeterminate(_)), "{first}");
    let resent = batch.run(&mut conn).await.pop().unwrap().unwrap();
    assert_eq!(resent, LockRelease::Lost);
}

/// The fence's operation values and the semaphore's extension, each kind in
/// a `Batch` over several resources, answer as their single calls; an
/// `ExtendPermit` whose reply is lost, resent under its id, applies once.
#[tokio::test]
async fn fence_and_permit_values_in_batches_answer_as_single_calls() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let p = prefix("idem_fence_batch");
    let resources: Vec<String> = (0..3).map(|i| format!("{p}r{i}")).collect();
    let lock = Lock::new(MINUTE).unwrap();
    let mut acquires = nolock::Batch::new();
    for r in &resources {
        acquires.push(AcquireLock::new(&lock, r).unwrap());
    }
    let mut grants: Vec<_> = acquires
        .run(&mut conn)
        .await
        .into_iter()
        .map(|a| a.unwrap().acquired().expect("granted"))
        .collect();
    assert!(grants.iter().all(|g| g.fence().number() == 1));
    let mut extends = nolock::Batch::new();
    for g in &grants {
        extends.push(ExtendLock::new(g));
    }
    for (g, e) in grants.iter_mut().zip(extends.run(&mut conn).await) {
        let e = e.unwrap();
        assert!(matches!(e.outcome(), LockExtend::Extended { .. }), "{e:?}");
        g.apply(&e).unwrap();
    }
    let mut writes = nolock::Batch::new();
    for g in &grants {
        writes.push(WriteFenced::new(g.fence(), g.fence().resource()).unwrap());
    }
    for w in writes.run(&mut conn).await {
        assert!(w.unwrap().is_applied());
    }
    let mut reads = nolock::Batch::new();
    for r in &resources {
        reads.push(ReadFenced::new(r).unwrap());
    }
    for (r, read) in resources.iter().zip(reads.run(&mut conn).await) {
        let read = read.unwrap().expect("written");
        assert_eq!((read.value, read.fence), (r.as_bytes().to_vec(), 1));
    }
    // Under the live grants, the fleet-safe form leaves every counter alone.
    let mut held = nolock::Batch::new();
    for r in &resources {
        held.push(AdvanceFence::new(r, 5).unwrap());
    }
    for a in held.run(&mut conn).await {
        assert!(
            matches!(
                a.unwrap(),
                AdvanceAttempt::Held {
                    counter: 1,
                    expires_in: Some(_)
                }
            ),
            "a live grant keeps its counter"
        );
    }
    let mut advances = nolock::Batch::new();
    for r in &resources {
        advances.push(ForceAdvanceFence::new(r, 5).unwrap());
    }
    for a in advances.run(&mut conn).await {
        let a = a.unwrap();
        assert_eq!((a.raised, a.counter), (true, 6));
    }
    let mut releases = nolock::Batch::new();
    for g in &grants {
        releases.push(ReleaseLock::new(g));
    }
    for r in releases.run(&mut conn).await {
        assert_eq!(r.unwrap(), LockRelease::Released);
    }

    let sem = Semaphore::new(3, MINUTE).unwrap();
    let key = format!("{p}s");
    let mut permits = Vec::new();
    for _ in 0..2 {
        match sem.acquire(&mut direct, &key).await.unwrap() {
            PermitAttempt::Acquired(permit) => permits.push(permit),
            other => panic!("{other:?}"),
        }
    }
    let mut extends = nolock::Batch::new();
    for permit in &permits {
        extends.push(ExtendPermit::new(permit));
    }
    for (permit, e) in permits.iter_mut().zip(extends.run(&mut conn).await) {
        let e = e.unwrap();
        assert!(matches!(e.outcome(), PermitExtend::Extended { .. }));
        permit.apply(&e).unwrap();
    }
    let extended = lost_then_retried(
        &proxy,
        &mut conn,
        ExtendPermit::new(&permits[0]),
        "extend-permit",
    )
    .await;
    assert!(
        matches!(extended.outcome(), PermitExtend::Extended { .. }),
        "{extended:?}"
    );
    permits[0].apply(&extended).unwrap();
}

/// Every write of the fence and cas modules, its reply lost and sent again
/// under its id: applied once, answered with the first reply.
#[tokio::test]
async fn lost_fence_and_cas_writes_are_applied_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let p = prefix("idem_writes");
    let k = |s: &str| format!("{p}{s}");
    let lock = Lock::new(MINUTE).unwrap();
    // An acquire under a token of its own (its resend would also answer from
    // the lock; the id answers from the record).
    let attempt = AcquireLock::new(&lock, &k("r")).unwrap();
    let mut grant = lost_then_retried(&proxy, &mut conn, attempt, "acquire")
        .await
        .acquired()
        .expect("granted");
    assert_eq!(grant.fence().number(), 1);
    let counter: String = raw(
        &mut direct,
        &["GET", &nolock::keys::derive(&k("r"), "fence")],
    )
    .await;
    assert_eq!(counter, "1", "one grant");
    let extended = lost_then_retried(&proxy, &mut conn, ExtendLock::new(&grant), "extend").await;
    grant.apply(&extended).unwrap();
    assert!(matches!(extended.outcome(), LockExtend::Extended { .. }));
    let write = WriteFenced::new(grant.fence(), "v1").unwrap();
    assert!(lost_then_retried(&proxy, &mut conn, write, "write")
        .await
        .is_applied());
    let advanced = lost_then_retried(
        &proxy,
        &mut conn,
        ForceAdvanceFence::new(&k("r"), 5).unwrap(),
        "advance",
    )
    .await;
    assert_eq!(
        (advanced.raised, advanced.counter),
        (true, 6),
        "the first answer"
    );

    let set = CompareAndSet::new(&k("x"), Expected::Absent, "a", None).unwrap();
    assert!(lost_then_retried(&proxy, &mut conn, set, "cas")
        .await
        .is_applied());
    let ins = SetIfAbsent::new(&k("y"), "b", None).unwrap();
    assert!(lost_then_retried(&proxy, &mut conn, ins, "insert")
        .await
        .is_inserted());
    let exp = CompareAndExpire::new(&k("x"), "a", MINUTE).unwrap();
    assert!(lost_then_retried(&proxy, &mut conn, exp, "expire")
        .await
        .is_applied());
    let del = CompareAndDelete::new(&k("x"), "a").unwrap();
    assert!(lost_then_retried(&proxy, &mut conn, del, "delete")
        .await
        .is_applied());
    let up = SetIfGreater::new(&k("hw"), 3).unwrap();
    assert!(
        lost_then_retried(&proxy, &mut conn, up, "greater")
            .await
            .applied
    );
    let down = SetIfLess::new(&k("hw"), 1).unwrap();
    assert!(
        lost_then_retried(&proxy, &mut conn, down, "less")
            .await
            .applied
    );
    let hw: String = raw(&mut direct, &["GET", &k("hw")]).await;
    assert_eq!(hw, "1");
}

#[tokio::test]
async fn a_lost_rate_check_charges_its_units_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let key = format!("{}rl", prefix("idem"));
        let limiter = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        let op = Check::new(&limiter, &key, 3)
            .unwrap()
            .idempotent("r")
            .unwrap();
        proxy.lose_replies(1);
        let first = retry(&policy(), &mut conn, &op).await.unwrap();
        assert!(first.allowed, "{algorithm:?}");
        let again = op.run(&mut conn).await.unwrap();
        assert_eq!(
            again, first,
            "{algorithm:?}: the recorded decision, `at` included"
        );
        let left = limiter.peek(&mut direct, &key, 1).await.unwrap();
        assert_eq!(left.remaining, 7, "{algorithm:?}: 3 units charged once");
    }
}

/// A refund whose reply was lost, sent again with its id, gives the units
/// back once. A plain refund of a copy of the same charge (serialized before
/// the first refund, as another process may hold it) gives back only what
/// is left of the charge: the server's record caps every copy at its cost.
#[tokio::test]
async fn a_lost_refund_gives_its_units_back_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let key = format!("{}refund", prefix("idem"));
        let limiter = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        let mut charge = limiter
            .check(&mut direct, &key, 5)
            .await
            .unwrap()
            .into_charge()
            .expect("admitted");
        assert_eq!(charge.held(), 5, "{algorithm:?}");
        let kept = serde_json::to_string(&charge).unwrap(); // a copy, as another process may keep
        let op = RefundCharge::new(&charge, 2)
            .unwrap()
            .idempotent("refund-1")
            .unwrap();

        proxy.lose_replies(1);
        let err = op.run(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::Indeterminate(_)), "{err}");
        let given = retry(&policy(), &mut conn, &op).await.unwrap();
        assert_eq!(given.credited, 2, "{algorithm:?}");
        given.apply_to(&mut charge);
        assert_eq!(charge.held(), 3);
        let left = limiter.peek(&mut direct, &key, 1).await.unwrap();
        assert_eq!(left.remaining, 7, "{algorithm:?}: 2 of 5 given back once");
        assert_eq!(
            op.run(&mut conn).await.unwrap(),
            given,
            "the recorded answer"
        );
        assert_eq!(
            limiter.peek(&mut direct, &key, 1).await.unwrap().remaining,
            7
        );

        // The copy still claims all 5: the server gives back the 3 left.
        let mut copy: nolock::rate::Charge = serde_json::from_str(&kept).unwrap();
        assert_eq!(copy.held(), 5);
        let again = copy.refund(&mut direct, 5).await.unwrap();
        assert_eq!(again.credited, 3, "{algorithm:?}: only what is left");
        let last = copy.refund(&mut direct, 2).await.unwrap();
        assert_eq!(last.credited, 0, "{algorithm:?}: nothing is left");
        let full = charge.refund(&mut direct, 3).await.unwrap();
        assert_eq!(full.credited, 0, "{algorithm:?}: the copy took the rest");
        assert_eq!(
            limiter.peek(&mut direct, &key, 1).await.unwrap().remaining,
            10,
            "{algorithm:?}: 5 given back in all, never more"
        );
    }
    // Built from a charge that holds nothing: refused before any I/O.
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_hour(1).unwrap()).unwrap();
    let key = format!("{}refund", prefix("idem"));
    let mut first = limiter
        .check(&mut direct, &key, 1)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let denied = limiter.check(&mut direct, &key, 1).await.unwrap();
    assert!(!denied.allowed && denied.charge().is_none());
    let err = RefundCharge::new(&first, 2).unwrap_err();
    assert!(err.is_invalid_input(), "more than it holds: {err}");
    assert_eq!(first.refund(&mut direct, 1).await.unwrap().credited, 1);
    let err = RefundCharge::new(&first, 1).unwrap_err();
    assert!(err.is_invalid_input(), "refunded in full: {err}");
}

/// The same for a multi-limit refund: every limit credited once.
#[tokio::test]
async fn a_lost_multi_limit_refund_gives_back_once_on_every_limit() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let limits = MultiLimiter::new(algorithm)
            .limit("user", Quota::per_hour(10).unwrap())
            .unwrap()
            .shared_limit("all", Quota::per_hour(20).unwrap())
            .unwrap();
        let tag = prefix("idem");
        let user = format!("{{{tag}}}:u");
        let all = format!("{{{tag}}}:all");
        let mut charge = limits
            .check(&mut direct, MultiKey::new(&user).shared("all", &all), 4)
            .await
            .unwrap();
        assert!(charge.allowed, "{algorithm:?}");
        let op = MultiRefundCharge::new(charge.charge().unwrap(), 3)
            .unwrap()
            .idempotent("multi-refund")
            .unwrap();
        let lost = proxy.stats().replies_lost;
        proxy.lose_replies(1);
        let given = retry(&policy(), &mut conn, &op).await.unwrap();
        assert_eq!(
            given.iter().map(|r| r.credited).collect::<Vec<_>>(),
            [3, 3],
            "{algorithm:?}"
        );
        assert_eq!(
            proxy.stats().replies_lost,
            lost + 1,
            "the first reply was lost"
        );
        assert_eq!(
            op.run(&mut conn).await.unwrap(),
            given,
            "the recorded answer"
        );
        let charge = charge.charge_mut().unwrap();
        charge.apply_refunds(&given);
        assert_eq!(charge.held(), 1, "1 of 4 still held on each limit");
        let now = limits
            .peek(&mut direct, MultiKey::new(&user).shared("all", &all), 1)
            .await
            .unwrap();
        assert_eq!(
            now.limits.iter().map(|l| l.remaining).collect::<Vec<_>>(),
            [9, 19],
            "{algorithm:?}: 1 of 4 still charged on each limit, 3 given back once"
        );
    }
}

#[tokio::test]
async fn a_lost_debit_is_debited_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let key = format!("{}wallet", prefix("idem"));
    let _ = cas::credit(&mut direct, &key, 100, None).await.unwrap();
    let op = Adjust::debit(&key, 30)
        .unwrap()
        .idempotent("payment-1")
        .unwrap();
    proxy.lose_replies(1);
    let first = retry(&policy(), &mut conn, &op).await.unwrap();
    assert!(first.is_applied() && first.balance() == 70, "{first:?}");
    for _ in 0..3 {
        assert_eq!(op.run(&mut conn).await.unwrap(), first);
    }
    let balance: i64 = raw(&mut direct, &["GET", &key]).await;
    assert_eq!(balance, 70);
}

#[tokio::test]
async fn ids_are_independent_and_a_reused_id_with_other_arguments_is_refused() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}quota", prefix("idem"));
    let one = |n, id: &str| {
        TryIncrement::by(&nolock::limits::Counter::new(100, MINUTE).unwrap(), &key, n)
            .unwrap()
            .idempotent(id)
            .unwrap()
    };
    assert_eq!(one(1, "a").run(&mut conn).await.unwrap().count, 1);
    assert_eq!(one(1, "b").run(&mut conn).await.unwrap().count, 2);
    assert_eq!(
        one(1, "a").run(&mut conn).await.unwrap().count,
        1,
        "replayed"
    );
    // `x` and `{x}`-like ids, and ids that mimic the key layout, are distinct.
    for id in ["{a}", "a:", "once#a", "a}"] {
        assert!(one(1, id).run(&mut conn).await.unwrap().admitted);
    }
    assert_eq!(count(&mut conn, &key).await, 6);

    let err = one(2, "a").run(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::IdReused { .. }), "{err}");
    assert!(err.is_definite() && !err.is_invalid_input());
    let resends = nolock::stats().retry_resends;
    let err = retry(&policy(), &mut conn, &one(2, "a")).await.unwrap_err();
    assert!(matches!(err, Error::IdReused { .. }), "{err}");
    assert_eq!(nolock::stats().retry_resends, resends, "never retried");
    // Another operation on the same first key with the same id: refused too.
    let other_op = TryIncrement::by(&nolock::limits::Counter::new(7, MINUTE).unwrap(), &key, 2)
        .unwrap()
        .idempotent("a")
        .unwrap();
    assert!(matches!(
        other_op.run(&mut conn).await,
        Err(Error::IdReused { .. })
    ));
    assert_eq!(count(&mut conn, &key).await, 6, "nothing written");
    // The same id on another key is another record.
    let other = format!("{key}2");
    let op = TryIncrement::new(&nolock::limits::Counter::new(5, MINUTE).unwrap(), &other)
        .unwrap()
        .idempotent("a")
        .unwrap();
    assert_eq!(op.run(&mut conn).await.unwrap().count, 1);
}

#[tokio::test]
async fn records_expire_after_the_horizon_and_idle_keys_still_expire() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}quota", prefix("idem"));
    let op = TryIncrement::new(&nolock::limits::Counter::new(100, MINUTE).unwrap(), &key)
        .unwrap()
        .idempotent("a")
        .unwrap()
        .horizon(Duration::from_millis(40))
        .unwrap();
    assert_eq!(op.run(&mut conn).await.unwrap().count, 1);
    assert_eq!(op.run(&mut conn).await.unwrap().count, 1);
    let pttl: i64 = raw(&mut conn, &["PTTL", op.record_key()]).await;
    assert!((1..=40).contains(&pttl), "{pttl}");
    tokio::time::sleep(Duration::from_millis(80)).await;
    let exists: i64 = raw(&mut conn, &["EXISTS", op.record_key()]).await;
    assert_eq!(exists, 0, "the record expired");
    assert_eq!(
        op.run(&mut conn).await.unwrap().count,
        2,
        "forgotten: applied again"
    );

    // A counter whose window ends expires on time, though its record lives on.
    let short = format!("{}short", prefix("idem"));
    let op = TryIncrement::new(
        &nolock::limits::Counter::new(100, Duration::from_millis(40)).unwrap(),
        &short,
    )
    .unwrap()
    .idempotent("a")
    .unwrap();
    let _ = op.run(&mut conn).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let exists: i64 = raw(&mut conn, &["EXISTS", &short]).await;
    assert_eq!(exists, 0, "the counter expired");
    let record_ttl: i64 = raw(&mut conn, &["PTTL", op.record_key()]).await;
    assert!(
        record_ttl > 200_000,
        "{record_ttl}: the record keeps its own TTL"
    );
    let size: i64 = raw(&mut conn, &["STRLEN", op.record_key()]).await;
    assert!(size < 100, "{size} bytes per record");
}

#[tokio::test]
async fn script_flush_between_the_first_try_and_the_retry() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    let key = format!("{}quota", prefix("idem"));
    nolock::Scripts::load(&mut direct).await.unwrap();
    let op = TryIncrement::new(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &key)
        .unwrap()
        .idempotent("req")
        .unwrap();
    proxy.lose_replies(1);
    assert!(op.run(&mut conn).await.is_err());
    let _: () = raw(&mut direct, &["SCRIPT", "FLUSH"]).await;
    let fallbacks = nolock::stats().noscript_fallbacks;
    let a = retry(&policy(), &mut conn, &op).await.unwrap();
    assert_eq!((a.admitted, a.count), (true, 1));
    assert!(
        nolock::stats().noscript_fallbacks > fallbacks,
        "NOSCRIPT was met"
    );
    assert_eq!(count(&mut direct, &key).await, 1);
}

/// 200 tasks, each with its own connection and ids, through a proxy that
/// cuts connections at random: every id is counted exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_retrying_their_own_ids_through_random_drops_count_exactly() {
    const TASKS: u64 = 200;
    const OPS: u64 = 10;
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port).await);
    let key = format!("{}shared", prefix("idem"));
    let wallet = format!("{}wallet", prefix("idem"));
    let mut direct = server.conn().await;
    nolock::Scripts::load(&mut direct).await.unwrap();
    let _ = cas::credit(&mut direct, &wallet, 1_000_000, None)
        .await
        .unwrap();

    let done = Arc::new(AtomicU64::new(0));
    let chaos = {
        let (proxy, done) = (proxy.clone(), done.clone());
        tokio::spawn(async move {
            // Two cuts at a time (the next only once the last have hit),
            // every 0-2 ms until three quarters of the tasks are done, so
            // the last few tasks are not cut on every attempt.
            let mut cuts = 0;
            while done.load(Ordering::SeqCst) < TASKS * 3 / 4 {
                if proxy.stats().replies_lost >= cuts {
                    proxy.lose_replies(2);
                    cuts += 2;
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..3))).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (proxy, key, wallet, done) = (proxy.clone(), key.clone(), wallet.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Redial::new(&proxy);
            for i in 0..OPS {
                let id = format!("task-{t}-op-{i}");
                let inc = TryIncrement::new(
                    &nolock::limits::Counter::new(1_000_000, MINUTE).unwrap(),
                    &key,
                )
                .unwrap()
                .idempotent(id.as_str())
                .unwrap();
                let a = retry(&policy(), &mut conn, &inc).await.expect("increment");
                assert!(a.admitted);
                let debit = Adjust::debit(&wallet, 3).unwrap().idempotent(id).unwrap();
                let d = retry(&policy(), &mut conn, &debit).await.expect("debit");
                assert!(d.is_applied());
            }
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    chaos.await.unwrap();
    assert_eq!(count(&mut direct, &key).await, TASKS * OPS);
    let balance: i64 = raw(&mut direct, &["GET", &wallet]).await;
    assert_eq!(balance, 1_000_000 - 3 * (TASKS * OPS) as i64);
    let lost = proxy.stats().replies_lost;
    assert!(
        lost >= 50,
        "only {lost} replies lost: the test proved little"
    );
    eprintln!("{lost} replies lost, totals exact");
}

/// For every operation that can carry an id: the reply of a resend (from the
/// record) decodes to exactly what the first run returned.
#[tokio::test]
async fn every_wrapped_operation_replays_its_first_reply_exactly() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let p = prefix("idem");
    let k = |s: &str| format!("{p}{s}");

    async fn twice<O>(conn: &mut MultiplexedConnection, op: O) -> O::Output
    where
        O: Operation,
        O::Output: PartialEq + std::fmt::Debug,
    {
        let id = format!("{:?}", std::time::Instant::now());
        let op = op.idempotent(id).unwrap();
        let first = op.run(conn).await.unwrap();
        let again = op.run(conn).await.unwrap();
        assert_eq!(first, again);
        first
    }

    // limits: admitted, then denied.
    let _ = twice(
        &mut conn,
        TryIncrement::new(&nolock::limits::Counter::new(1, MINUTE).unwrap(), &k("c")).unwrap(),
    )
    .await;
    let denied = twice(
        &mut conn,
        TryIncrement::new(&nolock::limits::Counter::new(1, MINUTE).unwrap(), &k("c")).unwrap(),
    )
    .await;
    assert!(!denied.admitted);
    // rate: every algorithm, single and multi-limit, allowed and denied.
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let limiter = Limiter::new(algorithm, Quota::per_hour(2).unwrap()).unwrap();
        let key = k(&format!("{algorithm:?}"));
        let yes = twice(&mut conn, Check::new(&limiter, &key, 2).unwrap()).await;
        let no = twice(&mut conn, Check::new(&limiter, &key, 1).unwrap()).await;
        assert!(!no.allowed && no.retry_after.is_some());
        let back = twice(
            &mut conn,
            RefundCharge::new(yes.charge().unwrap(), 1).unwrap(),
        )
        .await;
        assert_eq!(back.credited, 1, "{algorithm:?}");
        let multi = MultiLimiter::new(algorithm)
            .limit("s", Quota::per_second(5).unwrap())
            .unwrap()
            .shared_limit("all", Quota::per_hour(1).unwrap())
            .unwrap();
        let user = format!("{{{}}}:u", k(&format!("m{algorithm:?}")));
        let all = format!("{{{}}}:all", k(&format!("m{algorithm:?}")));
        let check =
            || MultiCheck::new(&multi, MultiKey::new(&user).shared("all", &all), 1).unwrap();
        assert!(twice(&mut conn, check()).await.allowed);
        assert_eq!(twice(&mut conn, check()).await.denied_by, Some(1));
    }
    // cas: debit applied and refused, credit, versioned write and conflict.
    let _ = twice(&mut conn, Adjust::credit(&k("w"), 5, None).unwrap()).await;
    let _ = twice(&mut conn, Adjust::debit(&k("w"), 3).unwrap()).await;
    let refused = twice(&mut conn, Adjust::debit(&k("w"), 3).unwrap()).await;
    assert!(
        matches!(refused, Adjustment::Insufficient { .. }),
        "{refused:?}"
    );
    let cfg = vec!["eu".to_owned(), "us\u{0}\u{ff}".to_owned()];
    let w: Update<Vec<String>> =
        twice(&mut conn, SetIfVersion::new(&k("v"), 0, &cfg).unwrap()).await;
    assert_eq!(w, Update::Written { version: 1 });
    let conflict: Update<Vec<String>> =
        twice(&mut conn, SetIfVersion::new(&k("v"), 0, &cfg).unwrap()).await;
    assert!(matches!(conflict, Update::Conflict { current: Some(ref v) } if v.value == cfg));
    // A read has no at-most-once variant: asking for one is a typed error.
    let get = GetVersioned::<Vec<String>>::new(&k("v")).unwrap();
    assert!(matches!(
        get.clone().idempotent("read"),
        Err(Error::InvalidArgument { .. })
    ));
    let mut reads = nolock::Batch::new();
    reads.push(get);
    let read = reads.run(&mut conn).await.pop().unwrap().unwrap();
    assert_eq!(read.map(|v| (v.version, v.value)), Some((1, cfg.clone())));
    // cas: every compare-and-x as a value; a resend after the key moved on
    // still gets the first answer.
    let set = twice(
        &mut conn,
        CompareAndSet::new(&k("x1"), Expected::Absent, "a", None).unwrap(),
    )
    .await;
    assert_eq!(set, cas::Outcome::Applied);
    let ins = twice(&mut conn, SetIfAbsent::new(&k("x1"), "b", None).unwrap()).await;
    assert_eq!(ins, cas::Insert::Existing(b"a".to_vec()));
    let exp = twice(
        &mut conn,
        CompareAndExpire::new(&k("x1"), "a", MINUTE).unwrap(),
    )
    .await;
    assert_eq!(exp, cas::Outcome::Applied);
    let del = twice(&mut conn, CompareAndDelete::new(&k("x1"), "a").unwrap()).await;
    assert_eq!(del, cas::Outcome::Applied);
    let up = twice(&mut conn, SetIfGreater::new(&k("hw"), 7).unwrap()).await;
    assert!(up.applied && up.value == 7, "{up:?}");
    let down = twice(&mut conn, SetIfLess::new(&k("hw"), 9).unwrap()).await;
    assert!(!down.applied && down.value == 7, "{down:?}");
    // semaphore: acquired, full, released.
    let acquire = AcquirePermit::new(&Semaphore::new(1, MINUTE).unwrap(), &k("s")).unwrap();
    let got = twice(&mut conn, acquire).await;
    let permit = got.acquired().expect("a permit");
    let full = twice(
        &mut conn,
        AcquirePermit::new(&Semaphore::new(1, MINUTE).unwrap(), &k("s")).unwrap(),
    )
    .await;
    assert!(!full.is_acquired());
    let _ = twice(&mut conn, ReleasePermit::new(&permit)).await;
    assert_eq!(semaphore::peek(&mut conn, &k("s")).await.unwrap().in_use, 0);

    // Raw replies of scripts with other shapes (strings, nil, nested):
    // byte-for-byte the same `redis::Value`.
    let raw_twice = |name: &'static str, keys: Vec<String>, args: Vec<&'static str>| {
        let script = Scripts::get(name).unwrap();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut call = Call::<redis::Value>::new(script, &keys);
        for a in args {
            call = call.arg(a);
        }
        call.idempotent(format!("raw-{name}")).unwrap()
    };
    let fence = |part| nolock::keys::derive(&k("r"), part);
    for (name, keys, args) in [
        (
            "fence/acquire",
            vec![fence("lock"), fence("fence")],
            vec!["tok", "60000"],
        ),
        ("cas/compare_and_set", vec![k("x")], vec!["new", "0", "old"]),
        ("cas/compare_and_set", vec![k("y")], vec!["new", "0"]),
        (
            "cas/watermark",
            vec![k("m")],
            vec!["-9223372036854775808", "less"],
        ),
    ] {
        let op = raw_twice(name, keys, args);
        let first = op.run(&mut conn).await.unwrap();
        let again = op.run(&mut conn).await.unwrap();
        assert_eq!(first, again, "{name}");
    }
}

#[tokio::test]
async fn a_batch_entry_may_carry_an_id() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}quota", prefix("idem"));
    let op = |id: Option<&str>| -> Box<dyn Operation<Output = limits::Admission>> {
        let plain =
            TryIncrement::new(&nolock::limits::Counter::new(100, MINUTE).unwrap(), &key).unwrap();
        match id {
            Some(id) => Box::new(plain.idempotent(id).unwrap()),
            None => Box::new(plain),
        }
    };
    let batch: nolock::Batch<_> = [op(Some("a")), op(None), op(Some("b"))]
        .into_iter()
        .collect();
    let first: Vec<u64> = batch
        .run(&mut conn)
        .await
        .into_iter()
        .map(|r| r.unwrap().count)
        .collect();
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let second: Vec<u64> = batch
        .run(&mut conn)
        .await
        .into_iter()
        .map(|r| r.unwrap().count)
        .collect();
    assert_eq!(first, [1, 2, 3]);
    assert_eq!(
        second,
        [1, 4, 3],
        "the id'd entries replayed, the plain one applied"
    );
    assert_eq!(count(&mut conn, &key).await, 4);
}

/// Foreign data already at an operation's record key: a string that is not
/// a record of this operation is `IdReused`, another type is a definite
/// Redis error; either way the operation does not run and nothing is written.
#[tokio::test]
async fn foreign_data_at_a_record_key_refuses_the_operation_and_writes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}quota", prefix("idem"));
    let op = TryIncrement::new(&nolock::limits::Counter::new(10, MINUTE).unwrap(), &key)
        .unwrap()
        .idempotent("foreign")
        .unwrap();
    let record = op.record_key().to_owned();

    let _: () = raw(&mut conn, &["SET", &record, "not a record"]).await;
    let err = op.run(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::IdReused { .. }), "{err}");
    assert!(err.is_definite());
    assert_eq!(count(&mut conn, &key).await, 0, "the operation did not run");
    let kept: String = raw(&mut conn, &["GET", &record]).await;
    assert_eq!(kept, "not a record");

    let _: () = raw(&mut conn, &["DEL", &record]).await;
    let _: () = raw(&mut conn, &["RPUSH", &record, "x"]).await;
    let err = op.run(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::Redis(_)), "{err}");
    assert!(err.is_definite());
    assert_eq!(count(&mut conn, &key).await, 0, "the operation did not run");
    let len: i64 = raw(&mut conn, &["LLEN", &record]).await;
    assert_eq!(len, 1);

    // Once the foreign key is gone the operation runs, once.
    let _: () = raw(&mut conn, &["DEL", &record]).await;
    assert_eq!(op.run(&mut conn).await.unwrap().count, 1);
    assert_eq!(op.run(&mut conn).await.unwrap().count, 1);
    assert_eq!(count(&mut conn, &key).await, 1);
}

/// A settlement whose reply was lost, sent again with its id, charges its
/// excess once and answers with the first reply; without an id the resend
/// changes nothing either (the server recorded the settlement) but says so.
#[tokio::test]
async fn a_lost_settlement_is_applied_once() {
    let (_server, proxy, mut conn, mut direct) = setup().await;
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let key = format!("{}settle", prefix("idem"));
        let limiter = Limiter::new(algorithm, Quota::per_hour(10).unwrap()).unwrap();
        let charge = limiter
            .check(&mut direct, &key, 4)
            .await
            .unwrap()
            .into_charge()
            .unwrap();
        let op = nolock::rate::SettleCharge::new(&charge, 7)
            .unwrap()
            .idempotent("settle-1")
            .unwrap();
        proxy.lose_replies(1);
        let err = op.run(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::Indeterminate(_)), "{err}");
        let first = retry(&policy(), &mut conn, &op).await.unwrap();
        let Some(s) = first.clone().settled() else {
            panic!("{algorithm:?}: {first:?}")
        };
        assert_eq!(s.charged, 3, "{algorithm:?}");
        assert_eq!(
            op.run(&mut conn).await.unwrap(),
            first,
            "the recorded answer"
        );
        assert_eq!(
            charge.settle(&mut direct, 7).await.unwrap(),
            nolock::rate::Settle::AlreadySettled,
            "{algorithm:?}: a plain resend changes nothing"
        );
        let left = limiter.peek(&mut direct, &key, 1).await.unwrap();
        assert_eq!(left.remaining, 3, "{algorithm:?}: 7 charged, once");
    }
}
