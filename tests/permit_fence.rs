//! Fenced permits (`Semaphore::fenced`) on a single server and on the local
//! 3x2 cluster: a history checker over random histories with pauses,
//! expiries and releases ("no fenced permit's stale write applies", per
//! seat fences strictly increase, never more than `permits` seats held),
//! a paused holder refused after its seat was granted again, the limit,
//! bad input, foreign data in the keys, a script flush, many tasks racing,
//! operation values in a batch, a lease keeping a fenced permit; and, on a
//! single server behind the fault proxy, a partitioned holder's late write
//! and a lost acquire reply asked again.

mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nolock::fence::{self, slot_counter, Write};
use nolock::keys::{derive, slot};
use nolock::semaphore::{
    AcquirePermit, Permit, PermitAttempt, PermitExtend, PermitId, PermitRelease, Semaphore,
    WritePermit,
};
use nolock::{Backoff, Error};
use support::deployment::{both, AnyConn, Deployment};
use support::prefix;

both!(
    shared: [
        a_random_history_never_applies_a_stale_write,
        a_paused_holder_is_refused_after_its_seat_was_granted_again,
        a_full_semaphore_answers_full_and_seats_stay_within_permits,
        bad_input_is_refused_before_anything_is_sent,
        many_tasks_racing_take_distinct_seats,
        a_lease_keeps_a_fenced_permit_and_its_seat,
        a_batch_takes_and_writes_fenced_permits_on_many_keys,
    ],
    exclusive: [
        fenced_calls_survive_a_script_flush,
        foreign_data_in_its_keys_is_refused_before_any_write,
    ],
);

const MINUTE: Duration = Duration::from_secs(60);

fn fenced(permits: u64, ttl: Duration) -> Semaphore {
    Semaphore::new(permits, ttl).unwrap().fenced()
}

fn permit(outcome: PermitAttempt) -> Permit {
    match outcome {
        PermitAttempt::Acquired(permit) => permit,
        full => panic!("expected a permit, got {full:?}"),
    }
}

fn seat_of(p: &Permit) -> (u64, u64) {
    let f = p.fence().expect("a fenced permit");
    (f.seat(), f.number())
}

// ---------------------------------------------------------------------------
// The history checker.

/// One grant as the client saw it (local clock).
#[derive(Debug, Clone, Copy)]
struct Grant {
    holder: usize,
    seat: u64,
    fence: u64,
    sent: Instant,
    answered: Instant,
    /// The permit's conservative local deadline (moved by extensions).
    deadline: Instant,
    /// When a release that answered `Released` was sent.
    released: Option<Instant>,
}

/// One fenced write as the client saw it.
#[derive(Debug, Clone, Copy)]
struct Wrote {
    holder: usize,
    seat: u64,
    fence: u64,
    sent: Instant,
    answered: Instant,
    applied: bool,
}

#[derive(Debug, Default, Clone)]
struct History {
    grants: Vec<Grant>,
    writes: Vec<Wrote>,
}

impl History {
    /// The part of the history whose grants were sent in `[from, to)`,
    /// with those grants' writes.
    fn window(&self, from: Instant, to: Instant) -> History {
        let grants: Vec<Grant> = self
            .grants
            .iter()
            .filter(|g| g.sent >= from && g.sent < to)
            .copied()
            .collect();
        let writes = self
            .writes
            .iter()
            .filter(|w| {
                grants
                    .iter()
                    .any(|g| g.holder == w.holder && g.fence == w.fence)
            })
            .copied()
            .collect();
        History { grants, writes }
    }
}

/// The invariants of fenced permits over a history of a semaphore of
/// `permits`:
///
/// 1. every seat is in 1..=permits, and no fence repeats (one counter);
/// 2. per seat, a grant answered before another was sent has the smaller
///    fence (fences strictly increase per seat);
/// 3. per seat, the holding intervals `[answered, end]` of two grants never
///    overlap (`end`: the local deadline, or the release), so never more
///    than `permits` seats (and permits) are held at once;
/// 4. no stale write applies: a write applied under grant `g` was sent
///    before any newer grant of `g`'s seat was answered, and before `g`'s
///    own deadline passed or its release was sent;
/// 5. per seat, writes that applied one after another in real time carry
///    non-decreasing fences (the value's watermark).
fn check(h: &History, permits: u64) -> Result<(), String> {
    let mut fences = HashSet::new();
    for g in &h.grants {
        if g.seat == 0 || g.seat > permits {
            return Err(format!("seat outside 1..={permits}: {g:?}"));
        }
        if !fences.insert(g.fence) {
            return Err(format!("fence {} repeated", g.fence));
        }
    }
    let end = |g: &Grant| g.released.map_or(g.deadline, |r| r.min(g.deadline));
    for a in &h.grants {
        for b in &h.grants {
            if a.seat != b.seat || a.fence == b.fence {
                continue;
            }
            if a.answered < b.sent && a.fence >= b.fence {
                return Err(format!(
                    "seat {}: fence went back: {a:?} then {b:?}",
                    a.seat
                ));
            }
            if a.fence < b.fence && b.answered < end(a) && a.answered < end(b) {
                return Err(format!(
                    "seat {}: two holders at once: {a:?} and {b:?}",
                    a.seat
                ));
            }
        }
        let at = a.answered;
        let held = h
            .grants
            .iter()
            .filter(|g| g.answered <= at && at < end(g))
            .count();
        if held as u64 > permits {
            return Err(format!("{held} permits held at once, above {permits}"));
        }
    }
    for w in h.writes.iter().filter(|w| w.applied) {
        let Some(g) = h
            .grants
            .iter()
            .find(|g| g.holder == w.holder && g.fence == w.fence)
        else {
            return Err(format!("an applied write under no grant: {w:?}"));
        };
        if w.seat != g.seat {
            return Err(format!("a write on another seat than its grant's: {w:?}"));
        }
        if g.released.is_some_and(|r| r < w.sent) {
            return Err(format!("a write after its release applied: {w:?}"));
        }
        if let Some(newer) = h
            .grants
            .iter()
            .find(|n| n.seat == w.seat && n.fence > w.fence && n.answered < w.sent)
        {
            return Err(format!(
                "stale write applied: {w:?} after {newer:?} held its seat"
            ));
        }
        for v in h.writes.iter().filter(|v| v.applied && v.seat == w.seat) {
            if v.answered < w.sent && v.fence > w.fence {
                return Err(format!(
                    "seat {}: the value went back: {v:?} then {w:?}",
                    w.seat
                ));
            }
        }
    }
    Ok(())
}

/// [`check`] on the whole history and on every window between 8 points of
/// it (36 windows): the invariants hold in each part, not only from the
/// start (a checker that only compares with the first grant would miss a
/// late violation).
fn check_windows(h: &History, permits: u64) -> Result<(), String> {
    let mut times: Vec<Instant> = h.grants.iter().map(|g| g.sent).collect();
    times.sort();
    if times.is_empty() {
        return check(h, permits);
    }
    let far = *times.last().unwrap() + Duration::from_secs(3600);
    let mut points: Vec<Instant> = (0..8).map(|i| times[i * times.len() / 8]).collect();
    points.push(far);
    for (i, from) in points.iter().enumerate() {
        for to in &points[i + 1..] {
            check(&h.window(*from, *to), permits).map_err(|e| format!("window {i}: {e}"))?;
        }
    }
    check(h, permits)
}

/// The checker itself must fail on the violations it names (its mutation
/// check): a stale write that applied, two holders of one seat, a fence
/// that went back on a seat, a seat beyond the size, too many holders, and
/// a violation late in a long history (seen in its windows too).
#[test]
fn the_checker_catches_every_violation_it_names() {
    let t = Instant::now();
    let ms = |n: u64| t + Duration::from_millis(n);
    let grant = |holder, seat, fence, at: u64, until: u64| Grant {
        holder,
        seat,
        fence,
        sent: ms(at),
        answered: ms(at + 1),
        deadline: ms(until),
        released: None,
    };
    let write = |holder, seat, fence, at: u64, applied| Wrote {
        holder,
        seat,
        fence,
        sent: ms(at),
        answered: ms(at + 1),
        applied,
    };
    let good = History {
        grants: vec![
            grant(0, 1, 5, 0, 50),
            grant(1, 1, 9, 60, 200),
            grant(2, 2, 7, 10, 90),
        ],
        writes: vec![
            write(0, 1, 5, 20, true),
            write(0, 1, 5, 70, false),
            write(1, 1, 9, 80, true),
            write(2, 2, 7, 30, true),
        ],
    };
    check_windows(&good, 2).unwrap();

    let mut stale = good.clone();
    stale.writes[1].applied = true;
    assert!(check_windows(&stale, 2)
        .unwrap_err()
        .contains("stale write"));

    let mut shared = good.clone();
    shared.grants[1] = grant(1, 1, 9, 30, 200);
    assert!(check(&shared, 2).unwrap_err().contains("two holders"));

    let mut back = good.clone();
    back.grants[1].fence = 4;
    back.writes[2].fence = 4;
    assert!(check(&back, 2).unwrap_err().contains("went back"));

    let mut beyond = good.clone();
    beyond.grants[2].seat = 3;
    beyond.writes[3].seat = 3;
    assert!(check(&beyond, 2).unwrap_err().contains("outside"));
    assert!(check(&good, 1).is_err(), "2 seats held in a semaphore of 1");

    let mut repeat = good.clone();
    repeat.grants[2].fence = 5;
    assert!(check(&repeat, 2).unwrap_err().contains("repeated"));

    // A long clean history, then one stale write at its very end: found by
    // the whole check and by the late windows alike.
    let mut long = History::default();
    for i in 0..40u64 {
        long.grants
            .push(grant(i as usize, 1, 10 + i, i * 100, i * 100 + 50));
        long.writes
            .push(write(i as usize, 1, 10 + i, i * 100 + 10, true));
    }
    check_windows(&long, 1).unwrap();
    long.writes.push(write(3, 1, 13, 3990, true));
    let err = check_windows(&long, 1).unwrap_err();
    assert!(err.contains("stale write"), "{err}");
    let late = long.window(ms(3500), ms(10_000));
    assert!(
        check(&late, 1).is_ok(),
        "the stale write's grant is not in the late window"
    );
}

/// 6 workers on one fenced semaphore of 3 take permits with 25..60 ms TTLs,
/// write under each, then release, let it expire, pause past it and write
/// again, or extend and write again; the history must pass [`check`] in
/// every window, paused writes must be refused, and each seat's value must
/// hold the greatest fence that applied on it.
async fn a_random_history_never_applies_a_stale_write(d: &Deployment) {
    const PERMITS: u64 = 3;
    let key = format!("{}exporters", prefix("permit-history"));
    let history: Arc<Mutex<History>> = Arc::default();
    let paused_refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..6usize {
        let mut conn: AnyConn = d.conn().await;
        let (key, history, paused_refused) = (key.clone(), history.clone(), paused_refused.clone());
        workers.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(w as u64 + 17);
            for round in 0..60usize {
                let holder = w * 1000 + round;
                let ttl = Duration::from_millis(rng.u64(25..60));
                let sem = fenced(PERMITS, ttl);
                let sent = Instant::now();
                let outcome = sem.acquire(&mut conn, &key).await.unwrap();
                let answered = Instant::now();
                let PermitAttempt::Acquired(mut p) = outcome else {
                    tokio::time::sleep(Duration::from_millis(rng.u64(1..10))).await;
                    continue;
                };
                let (seat, fence) = seat_of(&p);
                let index = {
                    let mut h = history.lock().unwrap();
                    h.grants.push(Grant {
                        holder,
                        seat,
                        fence,
                        sent,
                        answered,
                        deadline: p.deadline(),
                        released: None,
                    });
                    h.grants.len() - 1
                };
                let write = |applied: bool, sent: Instant| {
                    history.lock().unwrap().writes.push(Wrote {
                        holder,
                        seat,
                        fence,
                        sent,
                        answered: Instant::now(),
                        applied,
                    });
                };
                let value = format!("{seat}:{fence}");
                let at = Instant::now();
                let out = p.write(&mut conn, &value).await.unwrap();
                write(out.is_applied(), at);
                match rng.u8(..4) {
                    0 => {
                        let at = Instant::now();
                        if p.release(&mut conn).await.unwrap() == PermitRelease::Released {
                            history.lock().unwrap().grants[index].released = Some(at);
                        }
                    }
                    1 => {} // left to expire
                    2 => {
                        // Paused past the permit: its write must not apply.
                        tokio::time::sleep(ttl + Duration::from_millis(15)).await;
                        let at = Instant::now();
                        let late = p.write(&mut conn, "late").await.unwrap();
                        assert!(
                            matches!(late, Write::Ended | Write::Stale { .. }),
                            "a paused holder's write was {late:?}"
                        );
                        paused_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        write(late.is_applied(), at);
                        assert_eq!(p.extend(&mut conn).await.unwrap(), PermitExtend::Lost);
                    }
                    _ => {
                        if let PermitExtend::Extended { deadline } =
                            p.extend(&mut conn).await.unwrap()
                        {
                            history.lock().unwrap().grants[index].deadline = deadline;
                            let at = Instant::now();
                            let out = p.write(&mut conn, &value).await.unwrap();
                            write(out.is_applied(), at);
                        }
                        let at = Instant::now();
                        if p.release(&mut conn).await.unwrap() == PermitRelease::Released {
                            history.lock().unwrap().grants[index].released = Some(at);
                        }
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    assert!(
        history.grants.len() >= 60,
        "too few grants: {}",
        history.grants.len()
    );
    assert!(paused_refused.load(std::sync::atomic::Ordering::Relaxed) > 0);
    let reused = history
        .grants
        .iter()
        .map(|g| g.seat)
        .collect::<HashSet<_>>();
    assert!(reused.len() as u64 <= PERMITS);
    check_windows(&history, PERMITS).unwrap();
    // Each seat's value holds the greatest fence applied on it.
    let mut conn = d.conn().await;
    let sem = fenced(PERMITS, MINUTE);
    for seat in 1..=PERMITS {
        let applied = history
            .writes
            .iter()
            .filter(|w| w.applied && w.seat == seat)
            .map(|w| w.fence)
            .max();
        let probe = sem
            .restore_fenced(&key, PermitId::random().unwrap(), seat, 1)
            .unwrap();
        let value_key = probe.fence().unwrap().value_key();
        let stored = fence::read_unbound(&mut conn, &value_key).await.unwrap();
        assert_eq!(stored.as_ref().map(|s| s.fence), applied, "seat {seat}");
        if let Some(stored) = stored {
            assert_eq!(
                stored.value,
                format!("{seat}:{}", stored.fence).into_bytes()
            );
        }
    }
}

/// Combination over time: a permit acquired, written, paused past its
/// expiry; its seat granted again (a greater fence) and written; the old
/// holder's write, extension and release are all refused, and the new
/// holder is unaffected. Then: a retry under the same id gets the same seat
/// and fence; a fence above the seat's is not granted; after a release the
/// seat's writes end and the next grant of it has a greater fence.
async fn a_paused_holder_is_refused_after_its_seat_was_granted_again(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}exporters", prefix("permit-paused"));
    let short = fenced(2, Duration::from_millis(40));
    let long = fenced(2, MINUTE);
    let mut old = permit(short.acquire(&mut conn, &key).await.unwrap());
    let other = permit(long.acquire(&mut conn, &key).await.unwrap());
    let (old_seat, old_fence) = seat_of(&old);
    assert_eq!((old_seat, seat_of(&other).0), (1, 2));
    assert_eq!(old.write(&mut conn, "old").await.unwrap(), Write::Applied);
    assert_eq!(old.write(&mut conn, "old2").await.unwrap(), Write::Applied);
    // Paused past its expiry: nobody holds the seat yet, but it has ended.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(old.write(&mut conn, "late").await.unwrap(), Write::Ended);
    let new = permit(long.acquire(&mut conn, &key).await.unwrap());
    let (new_seat, new_fence) = seat_of(&new);
    assert_eq!(new_seat, old_seat, "the lowest free seat");
    assert!(new_fence > old_fence);
    // Refused before the new holder wrote, and after.
    assert_eq!(
        old.write(&mut conn, "stale").await.unwrap(),
        Write::Stale {
            current_fence: new_fence
        }
    );
    assert_eq!(new.write(&mut conn, "new").await.unwrap(), Write::Applied);
    assert_eq!(
        old.write(&mut conn, "stale").await.unwrap(),
        Write::Stale {
            current_fence: new_fence
        }
    );
    assert_eq!(old.extend(&mut conn).await.unwrap(), PermitExtend::Lost);
    let value_key = new.fence().unwrap().value_key();
    assert_eq!(old.release(&mut conn).await.unwrap(), PermitRelease::Lost);
    let stored = fence::read_unbound(&mut conn, &value_key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stored.value, stored.fence), (b"new".to_vec(), new_fence));
    // The new holder is unaffected.
    let mut new = new;
    assert!(matches!(
        new.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    assert_eq!(new.write(&mut conn, "new2").await.unwrap(), Write::Applied);
    assert_eq!(other.write(&mut conn, "o").await.unwrap(), Write::Applied);
    // A fence above the seat's: never granted; another seat's fence: refused.
    let ahead = long
        .restore_fenced(&key, new.id().clone(), new_seat, new_fence + 1)
        .unwrap();
    assert_eq!(
        ahead.write(&mut conn, "x").await.unwrap(),
        Write::NotGranted { counter: new_fence }
    );
    let wrong_seat = long
        .restore_fenced(&key, new.id().clone(), 2, new_fence)
        .unwrap();
    assert!(!wrong_seat.write(&mut conn, "x").await.unwrap().is_applied());
    // A retry under the same id: the same seat and fence, nothing drawn.
    let id = PermitId::random().unwrap();
    let third = fenced(3, MINUTE);
    let key3 = format!("{key}:retry");
    let first = permit(third.acquire_as(&mut conn, &key3, &id, 1).await.unwrap());
    let again = permit(third.acquire_as(&mut conn, &key3, &id, 1).await.unwrap());
    assert_eq!(seat_of(&first), seat_of(&again));
    assert_eq!(first.fence(), again.fence());
    let _ = (first, again);
    // The same id, expired and granted again: its seat again, a new fence;
    // the old incarnation's fence is stale although its id lives again.
    let id = PermitId::random().unwrap();
    let brief = fenced(3, Duration::from_millis(30));
    let key4 = format!("{key}:again");
    let before = permit(brief.acquire_as(&mut conn, &key4, &id, 1).await.unwrap());
    let before_fence = before.fence().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = permit(
        fenced(3, MINUTE)
            .acquire_as(&mut conn, &key4, &id, 1)
            .await
            .unwrap(),
    );
    assert_eq!(seat_of(&after).0, before_fence.seat());
    assert!(seat_of(&after).1 > before_fence.number());
    assert_eq!(
        before_fence.write(&mut conn, "old").await.unwrap(),
        Write::Stale {
            current_fence: seat_of(&after).1
        }
    );
    assert_eq!(after.write(&mut conn, "new").await.unwrap(), Write::Applied);
    // Its old incarnation cannot extend the new one's permit either.
    let mut before = before;
    assert_eq!(before.extend(&mut conn).await.unwrap(), PermitExtend::Lost);
    assert_eq!(after.write(&mut conn, "new").await.unwrap(), Write::Applied);
    let _ = (before, after);
    // Released: its writes end; the seat's next grant has a greater fence.
    let other_fence = other.fence().unwrap();
    assert_eq!(
        other.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    assert_eq!(
        other_fence.write(&mut conn, "x").await.unwrap(),
        Write::Ended
    );
    let next = permit(long.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(seat_of(&next).0, 2);
    assert!(seat_of(&next).1 > new_fence);
    for p in [new, next] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
}

/// The limit: `permits` seats 1..permits, then `Full` (nothing written); a
/// released seat is the next one granted. Plain and fenced holders of one
/// key count together.
async fn a_full_semaphore_answers_full_and_seats_stay_within_permits(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}limit", prefix("permit-limit"));
    let sem = fenced(3, MINUTE);
    let mut held = Vec::new();
    for want in 1..=3 {
        let p = permit(sem.acquire(&mut conn, &key).await.unwrap());
        assert_eq!(seat_of(&p).0, want);
        held.push(p);
    }
    let seats_key = derive(&key, "seats");
    let mut owner = d.owner(&key).await;
    let before: Vec<u8> = support::raw(&mut owner, &["DUMP", &seats_key]).await;
    match sem.acquire(&mut conn, &key).await.unwrap() {
        PermitAttempt::Full {
            in_use,
            retry_after,
        } => {
            assert_eq!(in_use, 3);
            assert!(retry_after <= MINUTE);
        }
        acquired => panic!("a fourth permit: {acquired:?}"),
    }
    let after: Vec<u8> = support::raw(&mut owner, &["DUMP", &seats_key]).await;
    assert_eq!(before, after, "a denial wrote the seats");
    let second = held.remove(1);
    let freed = seat_of(&second);
    assert_eq!(
        second.release(&mut conn).await.unwrap(),
        PermitRelease::Released
    );
    let p = permit(sem.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(seat_of(&p).0, 2);
    assert!(seat_of(&p).1 > freed.1);
    held.push(p);
    // The seats hash expires with the permits.
    let ttl: i64 = support::raw(&mut owner, &["PTTL", &seats_key]).await;
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    for p in held {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
    // A plain holder counts: with it, only 2 fenced seats.
    let plain = Semaphore::new(3, MINUTE).unwrap();
    let plain_permit = permit(plain.acquire(&mut conn, &key).await.unwrap());
    assert!(plain_permit.fence().is_none());
    let a = permit(sem.acquire(&mut conn, &key).await.unwrap());
    let b = permit(sem.acquire(&mut conn, &key).await.unwrap());
    assert!(matches!(
        sem.acquire(&mut conn, &key).await.unwrap(),
        PermitAttempt::Full { in_use: 3, .. }
    ));
    assert_ne!(seat_of(&a).0, seat_of(&b).0);
    let usage = plain.peek(&mut conn, &key).await.unwrap();
    assert_eq!(usage.in_use, 3);
    for p in [plain_permit, a, b] {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
}

/// Bad input is a typed error before any I/O: weights above 1, a fence or
/// seat out of range, a fenced restore on a plain semaphore, a write under
/// a plain permit, an empty key.
async fn bad_input_is_refused_before_anything_is_sent(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}bad", prefix("permit-bad"));
    let sem = fenced(3, MINUTE);
    for err in [
        sem.acquire_weighted(&mut conn, &key, 2).await.unwrap_err(),
        AcquirePermit::weighted(&sem, &key, 3).unwrap_err(),
        sem.restore(&key, PermitId::random().unwrap(), 2)
            .unwrap_err(),
    ] {
        assert!(
            matches!(err, Error::InvalidArgument { what: "weight", .. }),
            "{err}"
        );
    }
    assert!(matches!(
        sem.acquire(&mut conn, "").await.unwrap_err(),
        Error::EmptyKey
    ));
    let id = PermitId::random().unwrap();
    assert!(matches!(
        sem.restore_fenced(&key, id.clone(), 0, 1),
        Err(Error::ZeroLimit { what: "seat" })
    ));
    assert!(matches!(
        sem.restore_fenced(&key, id.clone(), 4, 1),
        Err(Error::OutOfRange { what: "seat", .. })
    ));
    assert!(matches!(
        sem.restore_fenced(&key, id.clone(), 1, 0),
        Err(Error::ZeroLimit { what: "fence" })
    ));
    assert!(matches!(
        sem.restore_fenced(&key, id.clone(), 1, u64::MAX),
        Err(Error::OutOfRange { what: "fence", .. })
    ));
    let plain = Semaphore::new(3, MINUTE).unwrap();
    assert!(matches!(
        plain.restore_fenced(&key, id.clone(), 1, 1),
        Err(Error::InvalidArgument { what: "permit", .. })
    ));
    let plain_permit = plain.restore(&key, id, 1).unwrap();
    assert!(matches!(
        plain_permit.write(&mut conn, "v").await,
        Err(Error::InvalidArgument { what: "permit", .. })
    ));
    // Nothing was written anywhere.
    assert!(!d.exists(&key).await);
    assert!(!d.exists(&derive(&key, "seats")).await);
}

/// Many tasks race for 5 seats: exactly 5 win, on seats 1..5, with
/// distinct fences; the rest are told `Full`.
async fn many_tasks_racing_take_distinct_seats(d: &Deployment) {
    let key = format!("{}race", prefix("permit-race"));
    let outcomes = d
        .race(40, |mut conn| {
            let key = key.clone();
            async move {
                fenced(5, MINUTE)
                    .acquire(&mut conn, &key)
                    .await
                    .unwrap()
                    .acquired()
                    .map(|p| seat_of(&p))
            }
        })
        .await;
    let won: Vec<(u64, u64)> = outcomes.into_iter().flatten().collect();
    assert_eq!(won.len(), 5, "{won:?}");
    let seats: HashSet<u64> = won.iter().map(|w| w.0).collect();
    assert_eq!(seats, (1..=5).collect());
    let fences: HashSet<u64> = won.iter().map(|w| w.1).collect();
    assert_eq!(fences.len(), 5);
}

/// A lease renews a fenced permit (`extend_fenced`) past its TTL, and its
/// writes keep applying; after the lease is released they end.
async fn a_lease_keeps_a_fenced_permit_and_its_seat(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}lease", prefix("permit-lease"));
    let sem = fenced(2, Duration::from_millis(90));
    let lease = sem
        .lease(d.conn().await, &key)
        .await
        .unwrap()
        .acquired()
        .expect("a free semaphore");
    let fence = lease.permit().fence().expect("fenced");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!lease.is_lost());
    assert_eq!(
        fence.write(&mut conn, "kept").await.unwrap(),
        Write::Applied
    );
    assert_eq!(lease.release().await.unwrap(), PermitRelease::Released);
    assert_eq!(fence.write(&mut conn, "after").await.unwrap(), Write::Ended);
}

/// After `SCRIPT FLUSH` (every node) each fenced call falls back to EVAL.
async fn fenced_calls_survive_a_script_flush(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}flush", prefix("permit-flush"));
    let sem = fenced(2, MINUTE);
    d.flush_scripts_everywhere().await;
    let mut p = permit(sem.acquire(&mut conn, &key).await.unwrap());
    d.flush_scripts_everywhere().await;
    assert_eq!(p.write(&mut conn, "v").await.unwrap(), Write::Applied);
    d.flush_scripts_everywhere().await;
    assert!(matches!(
        p.extend(&mut conn).await.unwrap(),
        PermitExtend::Extended { .. }
    ));
    d.flush_scripts_everywhere().await;
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    // And with a waiting semaphore (the retry loop builds each attempt).
    d.flush_scripts_everywhere().await;
    let waiting = sem.with_wait(Backoff::new(Duration::from_secs(1)));
    let p = permit(waiting.acquire(&mut conn, &key).await.unwrap());
    assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
}

/// Foreign data in any of a fenced permit's keys (the semaphore, its seats,
/// the slot counter, a seat's value) is a definite error naming the key,
/// with nothing written in any of them. Exclusive: the slot counter is
/// shared.
async fn foreign_data_in_its_keys_is_refused_before_any_write(d: &Deployment) {
    let mut conn = d.conn().await;
    let key = format!("{}foreign", prefix("permit-foreign"));
    let seats = derive(&key, "seats");
    let counter = slot_counter(slot(&key));
    let sem = fenced(3, MINUTE);
    let mut owner = d.owner(&key).await;
    let saved: Option<Vec<u8>> = support::raw(&mut owner, &["DUMP", counter]).await;
    let holder = PermitId::random().unwrap();
    let entry = format!("5:{}", holder.as_str());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["SET", &key, "x"], "not a semaphore"),
        (vec!["ZADD", &key, "5", "worker-1"], "not a semaphore"),
        (vec!["SET", &seats, "x"], "seats"),
        (vec!["HSET", &seats, "one", &entry], "not a seat"),
        (vec!["HSET", &seats, "0", &entry], "not a seat"),
        (vec!["HSET", &seats, "1", "5:worker"], "not a seat"),
        (vec!["HSET", &seats, "1", "05:x"], "not a seat"),
        (vec!["SET", counter, "not a number"], "non-counter"),
        (vec!["SET", counter, "9223372036854775807"], "non-counter"),
        (vec!["HSET", counter, "f", "1"], "WRONGTYPE"),
    ];
    let dump = |owner: &mut redis::aio::MultiplexedConnection| {
        let (key, seats) = (key.clone(), seats.clone());
        let mut owner = owner.clone();
        async move {
            let mut out = Vec::new();
            for k in [key.as_str(), seats.as_str(), counter] {
                out.push(support::raw::<Option<Vec<u8>>>(&mut owner, &["DUMP", k]).await);
            }
            out
        }
    };
    for (setup, expect) in cases {
        for k in [key.as_str(), seats.as_str(), counter] {
            let _: () = support::raw(&mut owner, &["DEL", k]).await;
        }
        let _: redis::Value = support::raw(&mut owner, &setup).await;
        let before = dump(&mut owner).await;
        let err = sem.acquire(&mut conn, &key).await.expect_err(expect);
        assert!(err.is_definite(), "{setup:?}: {err}");
        assert!(err.to_string().contains(expect), "{setup:?}: {err}");
        assert_eq!(
            before,
            dump(&mut owner).await,
            "{setup:?}: something was written"
        );
    }
    for k in [key.as_str(), seats.as_str(), counter] {
        let _: () = support::raw(&mut owner, &["DEL", k]).await;
    }
    if let Some(dump) = saved {
        let _: () = redis::cmd("RESTORE")
            .arg(counter)
            .arg(0)
            .arg(dump)
            .query_async(&mut owner)
            .await
            .unwrap();
    }
    // The write and extension check the seats and the value too.
    let mut p = permit(sem.acquire(&mut conn, &key).await.unwrap());
    let f = p.fence().unwrap();
    let value_key = f.value_key();
    let _: () = support::raw(&mut owner, &["SET", &value_key, "x"]).await;
    let err = p.write(&mut conn, "v").await.unwrap_err();
    assert!(
        err.is_definite() && err.to_string().contains("WRONGTYPE"),
        "{err}"
    );
    let _: () = support::raw(&mut owner, &["DEL", &value_key]).await;
    let _: () = support::raw(&mut owner, &["HSET", &value_key, "value", "x"]).await;
    let err = p.write(&mut conn, "v").await.unwrap_err();
    assert!(err.to_string().contains("no fence field"), "{err}");
    let _: () = support::raw(&mut owner, &["DEL", &value_key]).await;
    let seat = f.seat().to_string();
    let _: () = support::raw(&mut owner, &["HSET", &seats, &seat, "9:not-an-id"]).await;
    let before = dump(&mut owner).await;
    let err = p.write(&mut conn, "v").await.unwrap_err();
    assert!(
        err.is_definite() && err.to_string().contains("not a seat"),
        "{err}"
    );
    let err = p.extend(&mut conn).await.unwrap_err();
    assert!(
        err.is_definite() && err.to_string().contains("not a seat"),
        "{err}"
    );
    assert_eq!(before, dump(&mut owner).await);
    assert!(!d.exists(&value_key).await);
    let _: () = support::raw(&mut owner, &["DEL", &key, &seats]).await;
}

/// Operation values in a batch (many keys, many slots): fenced acquires
/// take seat 1 of each key with distinct fences, and fenced writes apply.
async fn a_batch_takes_and_writes_fenced_permits_on_many_keys(d: &Deployment) {
    let mut conn = d.conn().await;
    let base = prefix("permit-batch");
    let sem = fenced(2, MINUTE);
    let keys: Vec<String> = (0..20).map(|i| format!("{base}{i}")).collect();
    let mut batch = nolock::Batch::new();
    for key in &keys {
        batch.push(AcquirePermit::new(&sem, key).unwrap());
    }
    let permits: Vec<Permit> = batch
        .run(&mut conn)
        .await
        .into_iter()
        .map(|outcome| permit(outcome.unwrap()))
        .collect();
    let mut writes = nolock::Batch::new();
    for (key, p) in keys.iter().zip(&permits) {
        let f = p.fence().unwrap();
        assert_eq!((f.key(), f.seat()), (key.as_str(), 1));
        writes.push(WritePermit::new(&f, "b").unwrap());
    }
    for out in writes.run(&mut conn).await {
        assert_eq!(out.unwrap(), Write::Applied);
    }
    for p in permits {
        assert_eq!(p.release(&mut conn).await.unwrap(), PermitRelease::Released);
    }
}

/// A connection through the fault proxy, with `timeout` for each reply.
async fn through(
    proxy: &support::proxy::FaultProxy,
    timeout: Duration,
) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(timeout));
    redis::Client::open(proxy.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect through the proxy")
}

/// A holder cut off by a partition (requests and replies held by the fault
/// proxy) past its permit's expiry: its write, queued in the partition,
/// reaches the server after the seat's next holder wrote and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holders_write_is_refused_once_the_partition_heals() {
    let server = support::RedisServer::start();
    let proxy = support::proxy::FaultProxy::start(server.port).await;
    let mut cut_off = through(&proxy, Duration::from_secs(5)).await;
    let mut conn = server.conn().await;
    let key = format!("{}exporters", prefix("permit-partition"));
    let old = permit(
        fenced(2, Duration::from_millis(150))
            .acquire(&mut cut_off, &key)
            .await
            .unwrap(),
    );
    let old_fence = old.fence().unwrap();
    proxy.partition();
    let queued = tokio::spawn(async move { old_fence.write(&mut cut_off, "old").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = permit(fenced(2, MINUTE).acquire(&mut conn, &key).await.unwrap());
    assert_eq!(seat_of(&new).0, seat_of(&old).0);
    assert_eq!(new.write(&mut conn, "new").await.unwrap(), Write::Applied);
    proxy.heal();
    let late = queued.await.unwrap().unwrap();
    assert_eq!(
        late,
        Write::Stale {
            current_fence: seat_of(&new).1
        }
    );
    let stored = fence::read_unbound(&mut conn, &new.fence().unwrap().value_key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.value, b"new".to_vec());
}

/// An acquire whose reply is lost (the fault proxy cuts the connection
/// after the server ran it) is indeterminate; asked again under the same id
/// it answers the same seat and fence, and only one fence was drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_asked_again_answers_the_same_seat_and_fence() {
    let server = support::RedisServer::start();
    let proxy = support::proxy::FaultProxy::start(server.port).await;
    let key = format!("{}exporters", prefix("permit-lost"));
    let sem = fenced(2, MINUTE);
    let id = PermitId::random().unwrap();
    let mut conn = through(&proxy, Duration::from_secs(2)).await;
    proxy.lose_replies(1);
    let err = sem.acquire_as(&mut conn, &key, &id, 1).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate(_)), "{err:?}");
    let mut conn = through(&proxy, Duration::from_secs(2)).await;
    let p = permit(sem.acquire_as(&mut conn, &key, &id, 1).await.unwrap());
    let mut direct = server.conn().await;
    let counter: String = support::raw(&mut direct, &["GET", slot_counter(slot(&key))]).await;
    assert_eq!(
        seat_of(&p),
        (1, counter.parse().unwrap()),
        "one fence drawn"
    );
    assert_eq!(sem.peek(&mut direct, &key).await.unwrap().in_use, 1);
    assert_eq!(p.write(&mut conn, "v").await.unwrap(), Write::Applied);
}
