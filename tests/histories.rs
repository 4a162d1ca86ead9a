//! Seeded, randomised runs of every module under random faults, judged by
//! the history checkers of `tests/support/history.rs` (each states its
//! invariant). A few seconds per scenario here; `cargo run --release
//! --example torture -- --seconds 600 [--seed S] [--cluster | --clock]` runs
//! longer.
//!
//! `NOLOCK_SEED=<n>` replays a seed (each run prints its own);
//! `NOLOCK_TORTURE_SECS=<n>` lengthens the runs.

mod support;

use std::time::Duration;

use support::torture::{run, Config};

fn config(cluster: bool, clock: bool) -> Config {
    let seed = std::env::var("NOLOCK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let secs = std::env::var("NOLOCK_TORTURE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    Config {
        seed,
        duration: Duration::from_secs(secs),
        clients: 8,
        cluster,
        clock,
    }
}

async fn judge(config: Config) {
    eprintln!(
        "histories: seed {} (replay with NOLOCK_SEED={})",
        config.seed, config.seed
    );
    let report = run(config).await;
    eprintln!("{}", report.table());
    assert!(report.passed(), "a checker failed:\n{}", report.table());
    assert!(
        report.faults.values().sum::<u64>() > 0,
        "no fault was injected"
    );
}

/// One server behind the fault proxy: lost replies, delays, held replies,
/// partitions both ways (then healed), refused and cut connections, SCRIPT
/// FLUSH, CLIENT KILL, CLIENT PAUSE, BUSY, OOM, kill -9 and restart from
/// the AOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_module_keeps_its_invariant_on_one_server_under_faults() {
    judge(config(false, false)).await;
}

/// The 3×2 cluster: SCRIPT FLUSH, CLIENT KILL, CLIENT PAUSE and BUSY on
/// primaries, slot migrations, coordinated failovers and forced ones
/// (`FORCE`, `TAKEOVER`: what they may forget counts as unknown; fence
/// grants and permits are acknowledged and must survive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_module_keeps_its_invariant_on_the_cluster_under_faults() {
    judge(config(true, false)).await;
}

/// One server under libfaketime, its clock stepped forward 5-200 ms at a
/// time among the other faults (kill -9 and restart keep the offset): every
/// checker keeps its exact bound in server time. Skipped where libfaketime
/// cannot run a server (failed under `CI=true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_module_keeps_its_invariant_on_one_server_whose_clock_steps_forward() {
    if support::clock::skewed_or_skip("torture with clock steps", &[]).is_none() {
        return;
    }
    judge(config(false, true)).await;
}

/// The checkers' "plus some subset of the unknown calls", by bitset, against
/// the sums of every subset listed by brute force.
#[test]
fn the_subset_sum_check_finds_exactly_the_sums_of_subsets() {
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..300 {
        let deltas: Vec<i64> = (0..rng.usize(0..12)).map(|_| rng.i64(-90..90)).collect();
        let mut sums = std::collections::BTreeSet::new();
        for mask in 0u32..(1 << deltas.len()) {
            let s: i64 = (0..deltas.len())
                .filter(|i| mask >> i & 1 == 1)
                .map(|i| deltas[i])
                .sum();
            sums.insert(s);
        }
        for target in -1200..1200 {
            assert_eq!(
                support::history::subset_sum_reaches(&deltas, target),
                sums.contains(&target),
                "{deltas:?} {target}"
            );
        }
    }
}

/// The leaders' checkers refuse what they exist to catch: a term given to
/// two campaigners, a campaigner's term going back, and a stale leader's
/// write applied after a later term's.
#[test]
fn the_leader_checkers_refuse_two_holders_of_a_term_and_a_stale_write() {
    use support::history::{check_fences, check_terms, Event, FenceOp, FenceReply, Outcome};

    assert!(check_terms(&[(0, 1), (1, 2), (0, 3)]).is_ok());
    assert!(check_terms(&[(0, 1), (1, 1)]).is_err(), "a term twice");
    assert!(
        check_terms(&[(0, 3), (1, 4), (0, 2)]).is_err(),
        "a term back"
    );

    let write = |fence: u64, from: u64, to: u64| Event {
        process: fence as usize,
        op: FenceOp::Write {
            fence,
            value: format!("f{fence}"),
        },
        invoked: Duration::from_millis(from),
        completed: Duration::from_millis(to),
        invoked_us: from * 1000,
        completed_us: to * 1000,
        outcome: Outcome::Ok(FenceReply::Applied),
    };
    let in_order = [write(1, 0, 1), write(2, 2, 3)];
    assert!(check_fences(&in_order, Some((2, "f2".into()))).is_ok());
    let stale = [write(2, 0, 1), write(1, 2, 3)];
    assert!(check_fences(&stale, Some((2, "f2".into()))).is_err());
    assert!(
        check_fences(&in_order, Some((1, "f1".into()))).is_err(),
        "stored below applied"
    );
}
