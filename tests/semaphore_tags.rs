//! The semaphore's tag (`lua/lib/tag.lua`): its set holds one member
//! `"by:m<P>"` scored 0, the size of the semaphore that granted last. Two
//! sizes on one key are refused with nothing written; a set written before
//! tags is read as before and tagged at its next grant; the client's
//! handles adopt a size changed through the stored configuration; the tag
//! is never a permit (never counted, listed, swept or ranked) and goes with
//! the key. On one server and on the local 3×2 cluster (`both!`).

mod support;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nolock::config::{Change, Family, Mode, Spec, State};
use nolock::rate::{Algorithm, Limiter, Quota};
use nolock::semaphore::{
    self, AcquirePermit, Permit, PermitAttempt, PermitExtend, PermitId, PermitRelease, Semaphore,
};
use nolock::{Backoff, Batch, Client, Error, Scripts};
use redis::aio::MultiplexedConnection;
use support::deployment::{both, AnyConn, Deployment};
use support::{prefix, raw};

const MINUTE: Duration = Duration::from_secs(60);

both!(
    shared: [
        two_sizes_on_one_key_are_refused_with_nothing_written,
        another_family_or_a_foreign_tag_is_refused_with_nothing_written,
        a_legacy_set_is_read_as_before_and_tagged_at_its_next_grant,
        a_keep_change_through_the_client_keeps_the_holders_and_retags,
        the_tag_is_never_counted_listed_ranked_or_swept,
        the_last_release_leaves_no_key,
        the_scripts_take_adopt_last_and_nothing_else_there,
        sixty_four_tasks_on_a_tagged_semaphore_never_exceed_its_permits,
    ],
    exclusive: [
        every_tagged_call_recovers_a_script_flush,
    ],
);

fn permit(outcome: PermitAttempt) -> Permit {
    match outcome {
        PermitAttempt::Acquired(permit) => permit,
        full => panic!("expected a permit, got {full:?}"),
    }
}

/// The key as stored, byte for byte, and when it expires: equal before and
/// after a call means the call wrote nothing.
async fn snapshot(d: &Deployment, key: &str) -> (Option<Vec<u8>>, i64) {
    let mut owner = d.owner(key).await;
    let dump: Option<Vec<u8>> = raw(&mut owner, &["DUMP", key]).await;
    let at: i64 = raw(&mut owner, &["PEXPIRETIME", key]).await;
    (dump, at)
}

/// Members with their scores, lowest first.
async fn members(d: &Deployment, key: &str) -> Vec<String> {
    let mut owner = d.owner(key).await;
    raw(&mut owner, &["ZRANGE", key, "0", "-1", "WITHSCORES"]).await
}

/// The set's tags: every member that begins with "by:".
async fn tags(d: &Deployment, key: &str) -> Vec<String> {
    let all = members(d, key).await;
    all.chunks(2)
        .filter(|pair| pair[0].starts_with("by:"))
        .map(|pair| format!("{} {}", pair[0], pair[1]))
        .collect()
}

async fn server_ms(owner: &mut MultiplexedConnection) -> u64 {
    let t: Vec<String> = raw(owner, &["TIME"]).await;
    t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000
}

fn mismatch(err: &Error, key: &str, stored: &str, ours: &str) -> bool {
    let want = format!("{key} holds state written by {stored}, not {ours}");
    err.is_definite() && matches!(err, Error::StateMismatch { detail } if detail.contains(&want))
}

async fn two_sizes_on_one_key_are_refused_with_nothing_written(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = prefix("tags_two_sizes");
    let three = Semaphore::new(3, MINUTE).unwrap();
    let one = Semaphore::new(1, MINUTE).unwrap();
    let held = permit(three.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(tags(d, &key).await, ["by:m3 0"]);

    let before = snapshot(d, &key).await;
    let err = one.acquire(&mut conn, &key).await.unwrap_err();
    assert!(mismatch(&err, &key, "m3", "m1"), "{err}");
    assert!(!err.is_invalid_input(), "the server decided");
    // The same as an operation value in a batch, and a sized peek.
    let err = Batch::from_iter([AcquirePermit::new(&one, &key).unwrap()])
        .run(&mut conn)
        .await
        .remove(0)
        .unwrap_err();
    assert!(mismatch(&err, &key, "m3", "m1"), "{err}");
    let err = one.peek(&mut conn, &key).await.unwrap_err();
    assert!(mismatch(&err, &key, "m3", "m1"), "{err}");
    assert_eq!(snapshot(d, &key).await, before, "nothing written");

    // What knows no size reads it: the free peek; an extension or release
    // of a holder (they carry no size, check the tag's form and change no
    // count).
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (1, 1));
    let mut same = one.restore(&key, held.id().clone(), 1).unwrap();
    assert!(matches!(
        same.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert_eq!(tags(d, &key).await, ["by:m3 0"], "the tag is kept");

    // The size that wrote it goes on: 3 holders, then full.
    let more: Vec<Permit> = vec![
        permit(three.acquire(&mut conn, &key).await.unwrap()),
        permit(three.acquire(&mut conn, &key).await.unwrap()),
    ];
    let full = three.acquire(&mut conn, &key).await.unwrap();
    assert!(
        matches!(full, PermitAttempt::Full { in_use: 3, .. }),
        "{full:?}"
    );
    assert_eq!(
        same.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    for p in more {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    assert!(!d.exists(&key).await, "gone with its last permit");
}

/// Every semaphore call on `key` must be a definite `Error::Redis` naming
/// it, with the key left byte for byte as it was.
async fn every_call_refuses(d: &Deployment, conn: &mut AnyConn, key: &str, what: &str) {
    let before = snapshot(d, key).await;
    let sem = Semaphore::new(3, MINUTE).unwrap();
    let mut stranger = sem.restore(key, PermitId::random().unwrap(), 1).unwrap();
    let stranger_again = sem.restore(key, stranger.id().clone(), 1).unwrap();
    let results = [
        sem.acquire(conn, key).await.map(|_| ()),
        sem.peek(conn, key).await.map(|_| ()),
        semaphore::peek(conn, key).await.map(|_| ()),
        stranger.extend(conn).await.map(|_| ()),
        stranger_again.release(conn).await.map(|_| ()),
    ];
    for (call, result) in ["acquire", "peek", "free peek", "extend", "release"]
        .iter()
        .zip(results)
    {
        let err = result.expect_err(&format!("{what}: {call} must refuse"));
        assert!(
            matches!(err, Error::Redis(_)) && err.is_definite(),
            "{what}: {call}: {err}"
        );
        assert!(err.to_string().contains(key), "{what}: {call}: {err}");
    }
    assert_eq!(snapshot(d, key).await, before, "{what}: nothing written");
}

async fn another_family_or_a_foreign_tag_is_refused_with_nothing_written(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("tags_foreign");

    // Another family's real state: a GCRA TAT (a string) and a token
    // bucket (a hash), written by their own limiters.
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let key = format!("{p}{algorithm}");
        let limiter = Limiter::new(algorithm, Quota::per_second(10).unwrap()).unwrap();
        assert!(limiter
            .check(&mut conn, &key, 1)
            .await
            .unwrap()
            .charge()
            .is_some());
        every_call_refuses(d, &mut conn, &key, &format!("{algorithm}")).await;
    }
    // A tagged string as another family writes it.
    let key = format!("{p}string");
    let mut owner = d.owner(&key).await;
    let now_us = server_ms(&mut owner).await * 1000;
    let _: () = raw(&mut owner, &["SET", &key, &format!("g100000x10:{now_us}")]).await;
    every_call_refuses(d, &mut conn, &key, "g100000x10:<now>").await;

    // Sorted sets whose tag is not one a semaphore writes.
    let id = PermitId::random().unwrap();
    let far = (server_ms(&mut owner).await + 60_000).to_string();
    let permit_member = format!("{}:1", id.as_str());
    let cases: [(&str, Vec<(&str, &str)>); 7] = [
        ("size 0", vec![("0", "by:m0")]),
        ("leading zero", vec![("0", "by:m03")]),
        ("past the largest", vec![("0", "by:m10001")]),
        ("scored as a permit", vec![("5", "by:m3")]),
        ("another letter", vec![("0", "by:g100000x10")]),
        ("two tags", vec![("0", "by:m1"), ("0", "by:m3")]),
        ("a tag alone scored 1", vec![("1", "by:m3")]),
    ];
    for (n, (what, tagged)) in cases.iter().enumerate() {
        let key = format!("{p}zset{n}");
        let mut owner = d.owner(&key).await;
        let _: i64 = raw(&mut owner, &["ZADD", &key, &far, &permit_member]).await;
        for (score, member) in tagged {
            let _: i64 = raw(&mut owner, &["ZADD", &key, score, member]).await;
        }
        every_call_refuses(d, &mut conn, &key, what).await;
    }
}

async fn a_legacy_set_is_read_as_before_and_tagged_at_its_next_grant(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = prefix("tags_legacy");
    let mut owner = d.owner(&key).await;
    // Two holders as nolock wrote them before tags: members "<id>:1" scored
    // with their expiry, the key expiring with the latest.
    let ids = [PermitId::random().unwrap(), PermitId::random().unwrap()];
    let expiry = (server_ms(&mut owner).await + 60_000).to_string();
    for id in &ids {
        let member = format!("{}:1", id.as_str());
        let _: i64 = raw(&mut owner, &["ZADD", &key, &expiry, &member]).await;
    }
    let _: i64 = raw(&mut owner, &["PEXPIREAT", &key, &expiry]).await;

    // Read as before, by any size: no tag to compare.
    for sem in [
        Semaphore::new(1, MINUTE).unwrap(),
        Semaphore::new(3, MINUTE).unwrap(),
    ] {
        let usage = sem.peek(&mut conn, &key).await.unwrap();
        assert_eq!((usage.in_use, usage.holders), (2, 2));
    }
    // A denial of a semaphore of 2 writes no tag (it writes nothing here).
    let before = snapshot(d, &key).await;
    let two = Semaphore::new(2, MINUTE).unwrap();
    let full = two.acquire(&mut conn, &key).await.unwrap();
    assert!(
        matches!(full, PermitAttempt::Full { in_use: 2, .. }),
        "{full:?}"
    );
    assert_eq!(snapshot(d, &key).await, before, "a denial tags nothing");
    // A legacy holder extends and releases as before, writing no tag.
    let three = Semaphore::new(3, MINUTE).unwrap();
    let mut first = three.restore(&key, ids[0].clone(), 1).unwrap();
    assert!(matches!(
        first.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert_eq!(
        first.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert!(tags(d, &key).await.is_empty());

    // The next grant tags it: the legacy holder still counts.
    let granted = permit(three.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(tags(d, &key).await, ["by:m3 0"]);
    assert_eq!(members(d, &key).await.len(), 2 * 3, "the tag and 2 holders");
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (2, 2));
    // Now the other size is refused.
    let err = two.acquire(&mut conn, &key).await.unwrap_err();
    assert!(mismatch(&err, &key, "m3", "m2"), "{err}");

    let second = three.restore(&key, ids[1].clone(), 1).unwrap();
    for p in [second, granted] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    assert!(!d.exists(&key).await);
}

async fn client(d: &Deployment) -> Client {
    let client = match d {
        Deployment::Single(server) => Client::connect(server.url()).await.unwrap(),
        Deployment::Cluster(cluster) => Client::connect_cluster(cluster.urls()).await.unwrap(),
    };
    client.config_poll(Duration::from_millis(50)).unwrap()
}

/// A name of its own per run: the deployment is shared.
fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{base}-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Waits (up to 2 s) until `handle` decides by `permits` in `mode`.
async fn learns(handle: &nolock::client::Semaphore, id: &str, permits: u64, mode: Mode) {
    let from = Instant::now();
    loop {
        let _ = handle.peek(id).await.unwrap();
        let config = handle.config().await.unwrap();
        if handle.permits() == permits && config.mode == mode {
            return;
        }
        assert!(
            from.elapsed() < Duration::from_secs(2),
            "never learned {permits} {mode:?}: {} {:?}",
            handle.permits(),
            config.mode
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_keep_change_through_the_client_keeps_the_holders_and_retags(d: &Deployment) {
    let name = unique("tags");
    let operator = client(d).await;
    let handle = client(d).await.semaphore(&name, 3, MINUTE).unwrap();
    let mut leases = Vec::new();
    for _ in 0..2 {
        match handle.acquire("t").await.unwrap() {
            PermitAttempt::Acquired(lease) => leases.push(lease),
            full => panic!("{full:?}"),
        }
    }
    let key = leases[0].key().to_owned();
    assert_eq!(tags(d, &key).await, ["by:m3 0"]);
    let seen = operator
        .configs()
        .inspect(Family::Semaphore, &name, "t")
        .await
        .unwrap();
    let State::Semaphore(state) = seen.state else {
        panic!("{seen:?}")
    };
    assert_eq!(state.key, key);
    assert_eq!((state.in_use, state.holders.len()), (2, 2), "no tag listed");
    // The raw API of another size is refused (it does not adopt).
    let mut conn = d.conn().await;
    let five = Semaphore::new(5, MINUTE).unwrap();
    let err = five.acquire(&mut conn, &key).await.unwrap_err();
    assert!(mismatch(&err, &key, "m3", "m5"), "{err}");

    // Keep: the holders stay, the new size decides; the next grant retags.
    operator
        .configs()
        .set(&name, Spec::semaphore(5, MINUTE), Change::Keep)
        .await
        .unwrap();
    learns(&handle, "t", 5, Mode::Normal).await;
    assert_eq!(handle.peek("t").await.unwrap().in_use, 2, "peek adopts");
    assert_eq!(tags(d, &key).await, ["by:m3 0"], "a peek writes nothing");
    for _ in 0..3 {
        match handle.acquire("t").await.unwrap() {
            PermitAttempt::Acquired(lease) => leases.push(lease),
            full => panic!("{full:?}"),
        }
    }
    assert_eq!(tags(d, &key).await, ["by:m5 0"], "retagged, one tag");
    assert!(matches!(
        handle.acquire("t").await.unwrap(),
        PermitAttempt::Full { in_use: 5, .. }
    ));
    assert!(leases.iter().all(|l| !l.is_lost()));
    let err = Semaphore::new(3, MINUTE)
        .unwrap()
        .acquire(&mut conn, &key)
        .await
        .unwrap_err();
    assert!(mismatch(&err, &key, "m5", "m3"), "{err}");
    assert_eq!(five.peek(&mut conn, &key).await.unwrap().in_use, 5);

    // Lowered to 2: nobody is admitted until enough holders leave, and a
    // denial leaves the tag as it is.
    operator
        .configs()
        .set(&name, Spec::semaphore(2, MINUTE), Change::Keep)
        .await
        .unwrap();
    learns(&handle, "t", 2, Mode::Normal).await;
    assert!(matches!(
        handle.acquire("t").await.unwrap(),
        PermitAttempt::Full { in_use: 5, .. }
    ));
    assert_eq!(tags(d, &key).await, ["by:m5 0"]);
    for lease in leases.drain(..4) {
        assert_eq!(lease.release().await.unwrap(), PermitRelease::Released);
    }
    match handle.acquire("t").await.unwrap() {
        PermitAttempt::Acquired(lease) => leases.push(lease),
        full => panic!("{full:?}"),
    }
    assert_eq!(tags(d, &key).await, ["by:m2 0"]);

    // Unlimited decides by the largest size, and retags; back to normal,
    // the stored size retags again. The holders stay throughout.
    operator
        .configs()
        .unlimit(Family::Semaphore, &name)
        .await
        .unwrap();
    // (It decides by semaphore::MAX_PERMITS.)
    learns(&handle, "t", 10_000, Mode::Unlimited).await;
    match handle.acquire("t").await.unwrap() {
        PermitAttempt::Acquired(lease) => leases.push(lease),
        full => panic!("{full:?}"),
    }
    assert_eq!(tags(d, &key).await, ["by:m10000 0"]);
    operator
        .configs()
        .unblock(Family::Semaphore, &name)
        .await
        .unwrap();
    learns(&handle, "t", 2, Mode::Normal).await;
    assert!(matches!(
        handle.acquire("t").await.unwrap(),
        PermitAttempt::Full { in_use: 3, .. }
    ));
    for lease in leases.drain(..2) {
        assert_eq!(lease.release().await.unwrap(), PermitRelease::Released);
    }
    match handle.acquire("t").await.unwrap() {
        PermitAttempt::Acquired(lease) => leases.push(lease),
        full => panic!("{full:?}"),
    }
    assert_eq!(tags(d, &key).await, ["by:m2 0"]);
    for lease in leases {
        assert!(!lease.is_lost());
        assert_eq!(lease.release().await.unwrap(), PermitRelease::Released);
    }
    assert!(!d.exists(&key).await);
}

async fn the_tag_is_never_counted_listed_ranked_or_swept(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = prefix("tags_never_a_permit");
    let short = Semaphore::new(2, Duration::from_secs(10)).unwrap();
    let long = Semaphore::new(2, MINUTE).unwrap();
    let a = permit(short.acquire(&mut conn, &key).await.unwrap());
    let b = permit(long.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(tags(d, &key).await, ["by:m2 0"]);

    // Counted: 2 of 2, not 3. Ranked: room comes when a's permit expires
    // (in about 10 s), not at the tag's score 0.
    let PermitAttempt::Full {
        retry_after,
        in_use,
    } = long.acquire(&mut conn, &key).await.unwrap()
    else {
        panic!("2 of 2 held");
    };
    assert_eq!(in_use, 2);
    assert!(
        retry_after > Duration::from_secs(9) && retry_after <= Duration::from_secs(10),
        "{retry_after:?}"
    );
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (2, 2));
    let next = usage.next_expiry.unwrap();
    assert!(next > Duration::from_secs(9), "{next:?}");

    // Swept: a's permit expires (its score set in the past, as if it had
    // stalled); the next acquire removes it and keeps the tag.
    let mut owner = d.owner(&key).await;
    let a_member = format!("{}:1", a.id().as_str());
    let _: i64 = raw(&mut owner, &["ZADD", &key, "XX", "1000", &a_member]).await;
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!((usage.in_use, usage.holders), (1, 1));
    let c = permit(long.acquire(&mut conn, &key).await.unwrap());
    let score: Option<f64> = raw(&mut owner, &["ZSCORE", &key, &a_member]).await;
    assert_eq!(score, None, "the expired permit is swept");
    assert_eq!(tags(d, &key).await, ["by:m2 0"], "the tag is not");
    assert_eq!(members(d, &key).await.len(), 2 * 3);

    // Every permit expired: none in use, and the tag still not swept.
    let b_member = format!("{}:1", b.id().as_str());
    let c_member = format!("{}:1", c.id().as_str());
    for m in [&b_member, &c_member] {
        let _: i64 = raw(&mut owner, &["ZADD", &key, "XX", "1000", m]).await;
    }
    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
    assert_eq!(
        (usage.in_use, usage.holders, usage.next_expiry),
        (0, 0, None)
    );
    let d_permit = permit(long.acquire_weighted(&mut conn, &key, 2).await.unwrap());
    assert_eq!(tags(d, &key).await, ["by:m2 0"]);
    assert_eq!(members(d, &key).await.len(), 2 * 3, "the tag and d's 2");
    for p in [a, b, c] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Lost);
    }
    assert_eq!(
        d_permit.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert!(!d.exists(&key).await);
}

async fn the_last_release_leaves_no_key(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("tags_last_release");
    let sem = Semaphore::new(3, MINUTE).unwrap();

    // Weighted holders, released one by one.
    let key = format!("{p}weighted");
    let two = permit(sem.acquire_weighted(&mut conn, &key, 2).await.unwrap());
    let one = permit(sem.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(
        two.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert_eq!(tags(d, &key).await, ["by:m3 0"], "kept while a permit is");
    assert_eq!(
        one.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert!(!d.exists(&key).await, "no tag left alone");

    // The last holder's permit expired: its release is Lost, and the key
    // still goes.
    let key = format!("{p}lost");
    let held = permit(sem.acquire(&mut conn, &key).await.unwrap());
    let mut owner = d.owner(&key).await;
    let member = format!("{}:1", held.id().as_str());
    let _: i64 = raw(&mut owner, &["ZADD", &key, "XX", "1000", &member]).await;
    assert_eq!(held.release(&mut conn).await.unwrap(), PermitRelease::Lost);
    assert!(!d.exists(&key).await);

    // An idle semaphore's key expires with its latest permit, tag and all.
    let key = format!("{p}idle");
    let short = Semaphore::new(3, Duration::from_millis(100)).unwrap();
    let _idle = permit(short.acquire(&mut conn, &key).await.unwrap());
    let mut owner = d.owner(&key).await;
    let pttl: i64 = raw(&mut owner, &["PTTL", &key]).await;
    assert!(pttl > 0 && pttl <= 100, "{pttl}");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!d.exists(&key).await);
}

async fn every_tagged_call_recovers_a_script_flush(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = prefix("tags_flush");
    let sem = Semaphore::new(2, MINUTE).unwrap();
    d.flush_scripts_everywhere().await;
    let mut held = permit(sem.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(tags(d, &key).await, ["by:m2 0"]);
    d.flush_scripts_everywhere().await;
    let err = Semaphore::new(1, MINUTE)
        .unwrap()
        .acquire(&mut conn, &key)
        .await
        .unwrap_err();
    assert!(mismatch(&err, &key, "m2", "m1"), "{err}");
    d.flush_scripts_everywhere().await;
    let err = Semaphore::new(1, MINUTE)
        .unwrap()
        .peek(&mut conn, &key)
        .await
        .unwrap_err();
    assert!(mismatch(&err, &key, "m2", "m1"), "{err}");
    d.flush_scripts_everywhere().await;
    assert_eq!(sem.peek(&mut conn, &key).await.unwrap().in_use, 1);
    d.flush_scripts_everywhere().await;
    assert!(matches!(
        held.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    d.flush_scripts_everywhere().await;
    assert_eq!(
        held.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert!(!d.exists(&key).await);
}

async fn sixty_four_tasks_on_a_tagged_semaphore_never_exceed_its_permits(d: &Deployment) {
    const PERMITS: u64 = 4;
    let key = prefix("tags_sixty_four");
    let running = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let grants = d
        .race(64, |mut conn| {
            let (key, running, peak) = (key.clone(), running.clone(), peak.clone());
            async move {
                let sem = Semaphore::new(PERMITS, MINUTE)
                    .unwrap()
                    .with_wait(Backoff::new(Duration::from_secs(10)));
                let mut granted = 0u32;
                for _ in 0..3 {
                    let PermitAttempt::Acquired(permit) =
                        sem.acquire(&mut conn, &key).await.unwrap()
                    else {
                        continue;
                    };
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    let usage = semaphore::peek(&mut conn, &key).await.unwrap();
                    assert!(usage.in_use <= PERMITS, "{usage:?}");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    let released = permit.release(&mut conn).await.unwrap();
                    assert_eq!(released, PermitRelease::Released);
                    granted += 1;
                }
                granted
            }
        })
        .await;
    let total: u32 = grants.iter().sum();
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= PERMITS, "{peak} holders at once");
    assert!(total >= 64, "{total} grants");
    assert!(!d.exists(&key).await, "every permit released, tag and all");
}

/// `script` run raw with EVAL: its source, one key and `args`.
async fn eval(
    conn: &mut AnyConn,
    script: &str,
    key: &str,
    args: &[&str],
) -> redis::RedisResult<Vec<i64>> {
    let source = Scripts::get(script).unwrap().source();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(source).arg(1).arg(key).arg(args);
    cmd.query_async(conn).await
}

/// The scripts' part of adopting, driven raw (the handles' part is the
/// Keep test above): "adopt" after an acquire's or a peek's arguments reads
/// another size and an acquire's grant retags; anything else in that place
/// is a bad argument, with nothing written.
async fn the_scripts_take_adopt_last_and_nothing_else_there(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = prefix("tags_raw_adopt");
    let (a, b) = (PermitId::random().unwrap(), PermitId::random().unwrap());
    let acquire = |id: &PermitId, permits: &'static str, extra: &'static [&'static str]| {
        let mut args = vec![
            id.as_str().to_owned(),
            permits.to_owned(),
            "1".into(),
            "60000".into(),
        ];
        args.extend(extra.iter().map(|e| (*e).to_owned()));
        args
    };
    let acquiring = conn.clone();
    let run = |args: Vec<String>| {
        let (mut conn, key) = (acquiring.clone(), key.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            eval(&mut conn, "semaphore/acquire", &key, &args).await
        }
    };
    assert_eq!(run(acquire(&a, "3", &[])).await.unwrap(), [1, 1]);
    let before = snapshot(d, &key).await;
    for bad in [&["adopted"][..], &["adopt", "adopt"], &[""]] {
        let args = acquire(&b, "2", bad);
        let err = run(args).await.unwrap_err();
        assert!(
            err.to_string().contains("expected 4 arguments"),
            "{bad:?}: {err}"
        );
    }
    for bad in [&["3", "adopted"][..], &["0"], &["03"], &["3", "adopt", "x"]] {
        let err = eval(&mut conn, "semaphore/peek", &key, bad)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("nolock semaphore/peek"),
            "{bad:?}: {err}"
        );
    }
    let err = run(acquire(&b, "2", &[])).await.unwrap_err();
    assert_eq!(err.code(), Some("NOLOCK_STATE"), "{err}");
    assert_eq!(snapshot(d, &key).await, before, "nothing written");

    // Adopting: read as it is (1 of size 2 held), and the grant retags.
    let read = eval(&mut conn, "semaphore/peek", &key, &["2", "adopt"])
        .await
        .unwrap();
    assert_eq!(read[..2], [1, 1]);
    assert_eq!(snapshot(d, &key).await, before, "a peek writes nothing");
    assert_eq!(run(acquire(&b, "2", &["adopt"])).await.unwrap(), [1, 2]);
    assert_eq!(tags(d, &key).await, ["by:m2 0"]);
    let c = PermitId::random().unwrap();
    let full = run(acquire(&c, "2", &[])).await.unwrap();
    assert_eq!(full[..1], [0], "{full:?}");
    for id in [&a, &b] {
        let released = eval(&mut conn, "semaphore/release", &key, &[id.as_str(), "1"]).await;
        assert_eq!(released.unwrap(), [1]);
    }
    assert!(!d.exists(&key).await);
}
