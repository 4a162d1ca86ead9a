//! `nolock::fence::Leader` (leader election on the fenced lock) against
//! real redis-servers: one leader at a time over many terms, a step-down
//! handed over before the TTL, a leader cut off past its lease replaced
//! and its writes refused, acknowledged terms, and bad input.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{self, Campaign, Leader, Lock, LockRelease, Role, Term, Write};
use nolock::{Backoff, Error, Loss};
use support::deployment::{both, Deployment};
use support::history::{check_fences, FenceOp, FenceReply, Outcome, Recorder};
use support::proxy::FaultProxy;
use support::{keys, prefix, raw, RedisServer};
use tokio::sync::watch;

/// A campaign backoff that notices a free role within 20 ms.
const QUICK: Backoff = Backoff {
    timeout: Duration::ZERO,
    initial_delay: Duration::from_millis(1),
    max_delay: Duration::from_millis(20),
};

fn leader(name: &str, ttl: Duration) -> Leader {
    Leader::new(name, Lock::new(ttl).unwrap())
        .unwrap()
        .with_campaign(QUICK)
        .unwrap()
}

/// The campaign's term, within `within`.
async fn elected(campaign: &Campaign, within: Duration) -> Term {
    tokio::time::timeout(within, campaign.elected())
        .await
        .unwrap_or_else(|_| panic!("not elected within {within:?}: {:?}", campaign.role()))
        .expect("the campaign task ended")
}

/// A pseudo-random number below `n` (the tests need spread, not secrecy).
fn below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.finish() % n.max(1)
}

type Slots = Arc<Vec<Mutex<Option<watch::Receiver<Role>>>>>;

/// One snapshot of every campaigner's role at a single instant, or `None`
/// when a role changed while it was read (then try again). Two passes under
/// the slots' locks (no campaigner swaps its receiver meanwhile): the roles
/// read in the first pass, if no receiver saw a change before the second,
/// all held at the instant between the passes.
fn snapshot(slots: &Slots) -> Option<Vec<bool>> {
    let mut held: Vec<_> = slots
        .iter()
        .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()))
        .collect();
    let leading: Vec<bool> = held
        .iter_mut()
        .map(|rx| {
            rx.as_mut()
                .is_some_and(|rx| rx.borrow_and_update().is_leader())
        })
        .collect();
    let changed = held.iter().any(|rx| {
        rx.as_ref()
            .is_some_and(|rx| rx.has_changed().unwrap_or(true))
    });
    (!changed).then_some(leading)
}

/// Three campaigners on one role, each stepping down after a term (or
/// giving up campaigning after a while) and campaigning again, for 100
/// terms. Over the whole run: terms strictly increase in the order they
/// were won (the history checker of `tests/fence*.rs`); no two campaigns
/// report `Leader` at one instant (atomic snapshots of their watches);
/// each term's own fenced writes apply; and every write made with an old
/// term's fence once a later term has written is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_campaigners_one_leader_at_a_time_with_increasing_terms() {
    const CAMPAIGNERS: usize = 3;
    const TERMS: u64 = 100;
    let redis = support::redis();
    let name = format!("{}role", prefix("leader"));
    let election = leader(&name, Duration::from_secs(5));
    let history = Arc::new(Recorder::<FenceOp, FenceReply>::new());
    let slots: Slots = Arc::new((0..CAMPAIGNERS).map(|_| Mutex::new(None)).collect());
    let terms = Arc::new(AtomicU64::new(0));
    let latest_written = Arc::new(AtomicU64::new(0));
    let stale_refused = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let sampler = {
        let (slots, stop) = (slots.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut taken, mut with_a_leader) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                if let Some(leading) = snapshot(&slots) {
                    let leaders = leading.iter().filter(|l| **l).count();
                    assert!(leaders <= 1, "two leaders at one instant: {leading:?}");
                    taken += 1;
                    with_a_leader += u64::from(leaders == 1);
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            (taken, with_a_leader)
        })
    };

    let mut tasks = Vec::new();
    for process in 0..CAMPAIGNERS {
        let (election, history, slots) = (election.clone(), history.clone(), slots.clone());
        let (terms, latest_written) = (terms.clone(), latest_written.clone());
        let (stale_refused, stop) = (stale_refused.clone(), stop.clone());
        let mut conn = redis.conn().await;
        tasks.push(tokio::spawn(async move {
            let mut zombies = Vec::new();
            while terms.load(Ordering::SeqCst) < TERMS {
                let campaign = election.campaign(conn.clone()).unwrap();
                *slots[process].lock().unwrap() = Some(campaign.watch());
                // Sometimes give up before winning: a candidate steps down too.
                let patience = Duration::from_millis(50 + below(400));
                let won = tokio::time::timeout(patience, campaign.elected()).await;
                let Ok(Some(term)) = won else {
                    let out = campaign.step_down().await.unwrap();
                    assert_ne!(out, Some(LockRelease::Lost), "a term lost without faults");
                    continue;
                };
                let n = term.number();
                history
                    .record(process, FenceOp::Acquire, async {
                        Ok(FenceReply::Granted(n))
                    })
                    .await;
                terms.fetch_add(1, Ordering::SeqCst);
                for step in 0..2 {
                    let value = format!("term {n} step {step}");
                    let op = FenceOp::Write {
                        fence: n,
                        value: value.clone(),
                    };
                    let out = history
                        .record(process, op, async {
                            term.fence().write(&mut conn, &value).await.map(reply)
                        })
                        .await;
                    assert!(
                        matches!(out, Outcome::Ok(FenceReply::Applied)),
                        "term {n}'s own write while leading: {out:?}"
                    );
                    latest_written.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(below(10))).await;
                }
                assert!(!term.is_over());
                assert_eq!(
                    campaign.step_down().await.unwrap(),
                    Some(LockRelease::Released)
                );
                assert!(term.is_over(), "stepping down ends the term");
                // A zombie of this term: once a later term has written, it
                // writes with the old fence, and must be refused.
                let (history, latest_written) = (history.clone(), latest_written.clone());
                let (stale_refused, stop) = (stale_refused.clone(), stop.clone());
                let mut conn = conn.clone();
                zombies.push(tokio::spawn(async move {
                    while latest_written.load(Ordering::SeqCst) <= n {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    let value = format!("zombie of term {n}");
                    let op = FenceOp::Write {
                        fence: n,
                        value: value.clone(),
                    };
                    let out = history
                        .record(process, op, async {
                            term.fence().write(&mut conn, &value).await.map(reply)
                        })
                        .await;
                    assert!(
                        matches!(out, Outcome::Ok(FenceReply::Stale(later)) if later > n),
                        "term {n}'s write after a later term wrote: {out:?}"
                    );
                    stale_refused.fetch_add(1, Ordering::SeqCst);
                }));
            }
            stop.store(true, Ordering::Relaxed);
            for zombie in zombies {
                zombie.await.expect("zombie writer");
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("100 terms within two minutes")
            .expect("campaigner");
    }
    stop.store(true, Ordering::Relaxed);
    let (taken, with_a_leader) = sampler.await.expect("sampler");

    let mut conn = redis.conn().await;
    let stored = fence::read(&mut conn, &name)
        .await
        .unwrap()
        .map(|f| (f.fence, String::from_utf8(f.value).unwrap()));
    let events = history.events();
    let verdict = check_fences(&events, stored);
    assert!(verdict.is_ok(), "{verdict:?}");
    let won = terms.load(Ordering::SeqCst);
    assert!(won >= TERMS, "{won} terms");
    // All but the zombies of the last term (no later term wrote) refused.
    assert!(
        stale_refused.load(Ordering::SeqCst) as u64 >= won - CAMPAIGNERS as u64,
        "{} stale writes refused of {won} terms",
        stale_refused.load(Ordering::SeqCst)
    );
    assert!(
        taken > 100 && with_a_leader > 10,
        "{taken} snapshots, {with_a_leader} with a leader"
    );
    let lock_key = nolock::keys::derive(&name, "lock");
    assert!(
        keys(&mut conn, &lock_key).await.is_empty(),
        "all stepped down"
    );
    eprintln!(
        "{} ({taken} snapshots, {with_a_leader} with a leader)",
        verdict.unwrap()
    );
}

fn reply(write: Write) -> FenceReply {
    match write {
        Write::Applied => FenceReply::Applied,
        Write::Stale { current_fence } => FenceReply::Stale(current_fence),
        _ => FenceReply::NotGranted,
    }
}

both!(shared: [a_term_hands_over_and_the_old_fence_is_refused], exclusive: []);

/// On a single server and on the 3x2 cluster (a role whose keys share one
/// slot, through the cluster client): a term, a step-down, the next term
/// greater, and the old term's fenced write refused.
async fn a_term_hands_over_and_the_old_fence_is_refused(d: &Deployment) {
    let name = format!("{}role", prefix("leader"));
    let election = leader(&name, Duration::from_secs(5));
    let first = election.campaign(d.conn().await).unwrap();
    let first_term = elected(&first, Duration::from_secs(5)).await;
    let second = election.campaign(d.conn().await).unwrap();
    let mut conn = d.conn().await;
    assert_eq!(
        first_term.fence().write(&mut conn, "first").await.unwrap(),
        Write::Applied
    );
    assert!(!second.role().is_leader());
    assert_eq!(
        first.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
    let second_term = elected(&second, Duration::from_secs(2)).await;
    assert!(second_term.number() > first_term.number());
    assert_eq!(
        first_term.fence().write(&mut conn, "late").await.unwrap(),
        Write::Stale {
            current_fence: second_term.number()
        }
    );
    let stored = fence::read(&mut conn, &name).await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"first"[..], first_term.number())
    );
    assert_eq!(
        second.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
}

/// A leader that steps down hands over at once: another campaign wins well
/// before the 5 s TTL would have run out, with a greater term; the old
/// term's tokens are cancelled and its watch ends with `SteppedDown`. A
/// campaign handle dropped while leading hands over the same way.
#[tokio::test]
async fn stepping_down_hands_over_before_the_ttl() {
    let ttl = Duration::from_secs(5);
    let redis = support::redis();
    let name = format!("{}role", prefix("leader"));
    // The default campaign backoff (up to 500 ms between attempts).
    let election = Leader::new(&name, Lock::new(ttl).unwrap()).unwrap();
    let first = election.campaign(redis.conn().await).unwrap();
    let first_term = elected(&first, Duration::from_secs(2)).await;
    let mut first_roles = first.watch();
    let token = first_term.cancellation_token();

    let second = election.campaign(redis.conn().await).unwrap();
    // Let it find the role held and back off to its longest sleeps.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(second.role(), Role::Candidate { last_error: None });

    let start = Instant::now();
    assert_eq!(
        first.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
    assert!(token.is_cancelled() && first_term.is_over());
    let second_term = elected(&second, ttl).await;
    let handover = start.elapsed();
    assert!(
        handover < ttl / 2,
        "handed over in {handover:?}, TTL {ttl:?}"
    );
    assert!(second_term.number() > first_term.number());
    assert_eq!(
        *first_roles.borrow_and_update(),
        Role::SteppedDown {
            term: Some(first_term.fence().clone())
        }
    );
    assert!(first_roles.changed().await.is_err(), "the channel ends");
    eprintln!("handed over in {handover:?} (TTL {ttl:?})");

    // Dropping the handle steps down too, without blocking.
    let third = election.campaign(redis.conn().await).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!third.role().is_leader());
    let start = Instant::now();
    drop(second);
    assert!(start.elapsed() < Duration::from_millis(50), "drop blocked");
    let third_term = elected(&third, ttl).await;
    let handover = start.elapsed();
    assert!(
        handover < ttl / 2,
        "handed over in {handover:?} after a drop, TTL {ttl:?}"
    );
    assert!(second_term.is_over() && third_term.number() > second_term.number());
    assert_eq!(
        third.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
}

/// `Leader::run`: the work gets the term, its output comes back, and the
/// role is released at once (no lock left behind).
#[tokio::test]
async fn run_returns_the_works_output_and_releases_the_role() {
    let redis = support::redis();
    let name = format!("{}role", prefix("leader"));
    let election = leader(&name, Duration::from_secs(30));
    let conn = redis.conn().await;
    let written = election
        .run(conn.clone(), |term| {
            let mut conn = conn.clone();
            async move { (term.number(), term.fence().write(&mut conn, "ran").await) }
        })
        .await
        .unwrap();
    assert!(matches!(written, (1, Ok(Write::Applied))), "{written:?}");
    let mut conn = redis.conn().await;
    let lock_key = nolock::keys::derive(&name, "lock");
    let exists: i64 = raw(&mut conn, &["EXISTS", &lock_key]).await;
    assert_eq!(exists, 0, "released when the work finished");
    // The next term is greater.
    let next = election
        .run(conn, |term| async move { term.number() })
        .await
        .unwrap();
    assert_eq!(next, 2);
}

/// A leader whose connection is cut off (a partition in the fault proxy:
/// no renewal reaches the server, none is answered) loses its term at its
/// lease's deadline; another campaign wins with a greater term once the
/// lease has expired on the server; the old leader's fenced write, made
/// when it can reach the server again, is refused; and the old leader,
/// healed, campaigns again without winning while the new one holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_past_its_lease_is_replaced_and_refused() {
    let ttl = Duration::from_millis(1000);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port).await;
    let name = format!("{}role", prefix("leader"));
    let election = leader(&name, ttl);
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_millis(150)));
    let through = redis::Client::open(proxy.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let mut direct = server.conn().await;

    let old = election.campaign(through).unwrap();
    let old_term = elected(&old, Duration::from_secs(2)).await;
    assert_eq!(
        old_term.fence().write(&mut direct, "old").await.unwrap(),
        Write::Applied
    );
    let rival = election.campaign(server.conn().await).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!rival.role().is_leader(), "{:?}", rival.role());

    let cut = Instant::now();
    proxy.partition();
    tokio::time::timeout(2 * ttl, old_term.ended())
        .await
        .expect("the cut-off leader's term ends at its deadline");
    // By the lease's deadline (under the TTL), plus scheduling delays on a
    // loaded machine: not by a later discovery (after the heal).
    let noticed = cut.elapsed();
    assert!(
        noticed < ttl + Duration::from_millis(250),
        "noticed after {noticed:?}, past the TTL"
    );
    let new_term = elected(&rival, 3 * ttl).await;
    let replaced = cut.elapsed();
    assert!(new_term.number() > old_term.number());
    match old.role() {
        Role::Lost {
            term,
            loss: Loss::RenewalFailed { .. },
        } => assert_eq!(term, *old_term.fence()),
        Role::Candidate {
            last_error: Some(_),
        } => {} // already campaigning again
        other => panic!("the old leader after the cut: {other:?}"),
    }
    assert_eq!(
        new_term.fence().write(&mut direct, "new").await.unwrap(),
        Write::Applied
    );
    // The old leader resumes and writes with its term's fence: refused.
    assert_eq!(
        old_term
            .fence()
            .write(&mut direct, "old, late")
            .await
            .unwrap(),
        Write::Stale {
            current_fence: new_term.number()
        }
    );
    let stored = fence::read(&mut direct, &name).await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"new"[..], new_term.number())
    );

    proxy.heal();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!old.role().is_leader(), "{:?}", old.role());
    assert!(rival.term().is_some(), "{:?}", rival.role());
    eprintln!("term lost {noticed:?} after the cut, replaced after {replaced:?} (TTL {ttl:?})");
    assert_eq!(old.step_down().await.unwrap(), None);
    assert_eq!(
        rival.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
}

/// A campaign attempt whose reply is lost (the server granted the role,
/// the campaign saw its connection drop) is recognised by the next attempt,
/// under the same token: the campaign wins that grant's term at once,
/// instead of finding the role held by nobody for the 30 s TTL.
#[tokio::test]
async fn an_attempt_whose_reply_was_lost_is_won_by_the_next() {
    let ttl = Duration::from_secs(30);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port).await;
    let mut direct = server.conn().await;
    // Loaded, so that the first attempt runs the script (a lost NOSCRIPT
    // would prove nothing).
    nolock::Scripts::load(&mut direct).await.unwrap();
    let through = proxy.manager().await;
    let name = format!("{}role", prefix("leader"));
    let election = leader(&name, ttl);
    proxy.lose_replies(1);
    let campaign = election.campaign(through).unwrap();
    let start = Instant::now();
    let term = elected(&campaign, Duration::from_secs(5)).await;
    assert_eq!(proxy.stats().replies_lost, 1, "the first reply was lost");
    assert_eq!(
        term.number(),
        1,
        "the lost attempt's grant, not a second one"
    );
    let fence_key = nolock::keys::derive(&name, "fence");
    let counter: u64 = raw(&mut direct, &["GET", &fence_key]).await;
    assert_eq!(counter, 1);
    eprintln!("won after a lost reply in {:?}", start.elapsed());
    assert_eq!(
        campaign.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
}

/// Acknowledged terms: with `Lock::acknowledged`, a term starts only once
/// the replica has its grant. While the replication link is held, no term
/// is won (the campaign shows the error and keeps trying, nothing stays
/// held); once it flows again, the campaign wins.
#[tokio::test]
async fn acknowledged_terms_wait_for_the_replica() {
    let mut pair = support::replicated::pair().await;
    let name = format!("{}role", prefix("leader"));
    let lock = Lock::new(Duration::from_secs(10))
        .unwrap()
        .acknowledged(1, Duration::from_millis(100))
        .unwrap();
    let election = Leader::new(&name, lock)
        .unwrap()
        .with_campaign(QUICK)
        .unwrap();
    let first = election.campaign(pair.p.clone()).unwrap();
    let first_term = elected(&first, Duration::from_secs(2)).await;
    assert_eq!(
        first.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );

    pair.link.partition();
    let second = election.campaign(pair.p.clone()).unwrap();
    let mut roles = second.watch();
    let failed = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            if let Role::Candidate {
                last_error: Some(error),
            } = &*roles.borrow_and_update()
            {
                return error.clone();
            }
            roles.changed().await.unwrap();
        }
    })
    .await
    .expect("an unacknowledged attempt");
    assert!(failed.contains("replica"), "{failed}");
    let watching = Instant::now();
    while watching.elapsed() < Duration::from_millis(300) {
        assert!(!second.role().is_leader(), "{:?}", second.role());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Stepping down waits for the attempt in flight, which gives its
    // unconfirmed grant back: nothing stays held.
    assert_eq!(second.step_down().await.unwrap(), None);
    let lock_key = nolock::keys::derive(&name, "lock");
    let held: i64 = raw(&mut pair.p, &["EXISTS", &lock_key]).await;
    assert_eq!(held, 0, "an unconfirmed grant is given back");

    pair.link.heal();
    let third = election.campaign(pair.p.clone()).unwrap();
    let third_term = elected(&third, Duration::from_secs(5)).await;
    assert!(third_term.number() > first_term.number());
    assert_eq!(
        third.step_down().await.unwrap(),
        Some(LockRelease::Released)
    );
}

/// Bad input is refused with typed errors before anything is sent: an
/// empty role, a lock that waits, a zero campaign delay, and a campaign on
/// a runtime without timers. The server saw no script call and holds no
/// key.
#[test]
fn bad_input_is_refused_with_nothing_written() {
    let server = RedisServer::start();
    let (io_only, _driver, conn) = support::io_only_runtime_and_conn(&server);
    let lock = Lock::new(Duration::from_secs(5)).unwrap();
    assert!(matches!(
        Leader::new("", lock.clone()),
        Err(Error::EmptyKey)
    ));
    let waiting = lock.clone().with_wait(Backoff::new(Duration::from_secs(1)));
    assert!(matches!(
        Leader::new("role", waiting),
        Err(Error::InvalidArgument { what: "lock", .. })
    ));
    let zero = Backoff {
        initial_delay: Duration::ZERO,
        ..QUICK
    };
    assert!(matches!(
        Leader::new("role", lock.clone())
            .unwrap()
            .with_campaign(zero),
        Err(Error::ZeroDuration {
            what: "initial_delay"
        })
    ));
    let election = Leader::new("role", lock).unwrap();
    io_only.block_on(async {
        assert!(matches!(
            election.campaign(conn.clone()),
            Err(Error::NoTimer)
        ));
        assert!(matches!(
            election.run(conn.clone(), |_term| async {}).await,
            Err(Error::NoTimer)
        ));
    });
    let driver = tokio::runtime::Runtime::new().unwrap();
    driver.block_on(async {
        let mut conn = server.conn().await;
        assert!(keys(&mut conn, "*").await.is_empty(), "nothing written");
        for cmd in ["evalsha", "eval", "set"] {
            assert_eq!(support::command_calls(&mut conn, cmd).await, 0, "{cmd}");
        }
    });
}
