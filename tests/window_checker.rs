//! The window checker's self-test (`tests/support/window.rs`), no server:
//! hand-built histories that over-admit inside a window but not from the
//! start of the run are caught, as are credits that make room they should
//! not (after a reset, at their own time instead of their admission's),
//! excess admitted over, and reservoir draws past the bound; histories
//! exactly at the bound pass, and draws whose interval is not wholly inside
//! a window never raise a false alarm.

mod support;

use std::time::Duration;

use support::window::{check, Bound, History};

const MS: u64 = 1_000;
const S: u64 = 1_000_000;

fn rate(burst: u64, t_us: u64) -> Bound {
    Bound::rate_everywhere(burst, Duration::from_micros(t_us))
}

fn caught(h: &History, bound: Bound) -> String {
    match check(h, bound) {
        Ok(verdict) => panic!("not caught: {verdict}; {:?}", h.events()),
        Err(e) => {
            eprintln!("caught: {e}");
            e.message
        }
    }
}

fn passes(h: &History, bound: Bound) -> String {
    check(h, bound).unwrap_or_else(|e| panic!("a false alarm: {e}"))
}

#[test]
fn a_burst_after_a_long_idle_is_caught_though_the_run_from_its_start_is_under() {
    // Burst 10, T = 100 ms: 10 admitted, 10 s idle, then 18 in 2 ms.
    let mut h = History::new();
    for _ in 0..10 {
        h.admit(0, 1);
    }
    for k in 0..18 {
        h.admit(10 * S + k * 2 * MS / 17, 1);
    }
    // From the start of the run: 28 units in 10.002 s, under 10 + 100.
    const { assert!(28 <= 10 + (10 * S + 2 * MS) / (100 * MS)) };
    let e = caught(&h, rate(10, 100 * MS));
    assert!(e.contains("18 units in [10000000, 10002000] us"), "{e}");
    // Two apart as far as the burst refills: fine.
    let mut h = History::new();
    h.admit(0, 10);
    h.admit(10 * S, 10);
    h.admit(11 * S, 10);
    passes(&h, rate(10, 100 * MS));
}

#[test]
fn a_history_exactly_at_the_bound_passes_and_one_microsecond_early_fails() {
    // Burst 10, T = 100 ms: 10 at once, then one every T for 5 s.
    let t = 100 * MS;
    let mut h = History::new();
    h.admit(0, 10);
    for k in 1..=50 {
        h.admit(k * t, 1);
    }
    let verdict = passes(&h, rate(10, t));
    assert!(
        verdict.contains("closest approach to the bound 0 us"),
        "{verdict}"
    );
    // The same with the last unit 1 us before its time.
    let mut early = History::new();
    early.admit(0, 10);
    for k in 1..50 {
        early.admit(k * t, 1);
    }
    early.admit(50 * t - 1, 1);
    caught(&early, rate(10, t));
    // The horizon-limited bound judges the same.
    caught(&early, Bound::rate(10, Duration::from_micros(t)));
}

#[test]
fn credits_count_against_the_admission_they_undo() {
    // 10 per hour (T = 360 s): A takes 5, B takes 5, B settles at 8 (3 of
    // excess), A refunds 5. Then 2 fit, not 4.
    let t = 360 * S;
    let history = |after: u64| {
        let mut h = History::new();
        let a = h.admit(0, 5);
        h.admit(MS, 5);
        h.excess(2 * MS, 3);
        h.credit(a, 5);
        for k in 0..after {
            h.admit(3 * MS + k, 1);
        }
        h
    };
    passes(&history(2), rate(10, t));
    let e = caught(&history(4), rate(10, t));
    assert!(e.contains("admitted@0:5-5"), "the credit is shown: {e}");
}

#[test]
fn a_credit_long_after_its_admission_makes_no_room_at_its_own_time() {
    // Burst 10, T = 1 s. A takes 10; 20 s later (A long drained) a refund
    // of A credits 10, then 20 are admitted at once. Counted at its own
    // time the credit would excuse 10 of them; attributed to A it does not.
    let mut h = History::new();
    let a = h.admit(0, 10);
    h.credit(a, 10);
    h.admit(20 * S, 10);
    h.admit(20 * S + MS, 10);
    caught(&h, rate(10, S));
}

#[test]
fn a_credit_does_not_excuse_what_was_admitted_before_it() {
    let mut h = History::new();
    let a = h.admit(0, 10);
    h.admit(MS, 10); // over: 20 in 1 ms
    h.credit(a, 10); // too late to make that room
    caught(&h, rate(10, S));
    // Before it, it does.
    let mut h = History::new();
    let a = h.admit(0, 10);
    h.credit(a, 10);
    h.admit(MS, 10);
    passes(&h, rate(10, S));
}

#[test]
fn a_reset_starts_a_new_epoch_and_a_credit_from_before_it_makes_no_room() {
    // 10 per hour: A takes 5, reset, B takes 10, A refunds 5, C takes 5.
    let t = 360 * S;
    let mut h = History::new();
    let a = h.admit(0, 5);
    h.reset();
    h.admit(MS, 10);
    h.credit(a, 5);
    passes(&h, rate(10, t));
    h.admit(2 * MS, 5);
    let e = caught(&h, rate(10, t));
    assert!(e.contains("15 units") && e.contains("epoch 1"), "{e}");
    // No window spans a reset: 10, reset, 10 is fine, without it not.
    let mut h = History::new();
    h.admit(0, 10);
    h.reset();
    h.admit(MS, 10);
    passes(&h, rate(10, t));
    let mut h = History::new();
    h.admit(0, 10);
    h.admit(MS, 10);
    caught(&h, rate(10, t));
}

#[test]
fn excess_counts_at_the_settlement_and_may_go_past_the_bound_as_a_debt() {
    // Burst 10, T = 10 ms: 10 admitted, then a settlement charges 5 more.
    let t = 10 * MS;
    let mut h = History::new();
    h.admit(0, 10);
    h.excess(MS, 5);
    passes(&h, rate(10, t)); // a debt, not an admission
                             // The next unit fits once the debt drained: 16 in [0, 6T].
    let mut fits = h.clone();
    fits.admit(6 * t, 1);
    passes(&fits, rate(10, t));
    h.admit(6 * t - 1, 1);
    caught(&h, rate(10, t));
}

#[test]
fn reservoir_draws_past_the_bound_are_caught() {
    // 10/s, burst 10: 10 from the server, then 8 served locally in 2.4 ms.
    let t = 100 * MS;
    let mut h = History::new();
    h.admit(S, 10);
    for k in 0..8 {
        let from = S + 100 + k * 300;
        h.draw(from, from + 200, 1);
    }
    let e = caught(&h, Bound::rate(10, Duration::from_micros(t)));
    assert!(e.contains("18 units"), "{e}");
    // 2,000/s, burst 100 (T = 500 us): 112 draws within 5 ms.
    let mut h = History::new();
    for k in 0..112 {
        let from = 10 * S + k * 40;
        h.draw(from, from + 30, 1);
    }
    caught(&h, Bound::rate(100, Duration::from_micros(500)));
}

#[test]
fn a_draw_counts_only_in_the_windows_that_hold_its_whole_interval() {
    // 10 admitted at 1 s; a draw of 5 known only to lie in [0.5 s, 1.0005 s]:
    // it may have been long before them, so no window is over.
    let t = 100 * MS;
    let mut h = History::new();
    h.draw(S / 2, S + 500, 5);
    h.admit(S, 10);
    passes(&h, rate(10, t));
    // Wholly after them, it is counted.
    h.draw(S + 600, S + 700, 1);
    caught(&h, rate(10, t));
}

#[test]
fn loose_credits_count_in_the_windows_they_may_have_run_in() {
    let mut h = History::new();
    h.admit(0, 10);
    h.loose_credit(MS, 2 * MS, 10);
    h.admit(3 * MS, 10);
    passes(&h, rate(10, S));
    let mut h = History::new();
    h.admit(0, 10);
    h.admit(MS, 10);
    h.loose_credit(5 * MS, 6 * MS, 10);
    caught(&h, rate(10, S));
}

#[test]
fn windows_hold_their_limit_per_epoch_and_window() {
    let mut h = History::new();
    h.admit_in(100, 0, 6);
    h.admit_in(100, MS, 4);
    h.admit_in(200, 150 * MS, 10);
    passes(&h, Bound::windows(10));
    h.admit_in(200, 160 * MS, 1);
    let e = caught(&h, Bound::windows(10));
    assert!(e.contains("11 units") && e.contains("window 200"), "{e}");
    // Excess then an admission over the limit.
    let mut h = History::new();
    h.admit_in(1, 0, 5);
    h.excess_in(1, MS, 3);
    h.admit_in(1, 2 * MS, 2);
    passes(&h, Bound::windows(10));
    h.admit_in(1, 3 * MS, 1);
    caught(&h, Bound::windows(10));
    // A credit of the window before makes no room in this one.
    let mut h = History::new();
    let a = h.admit_in(1, 0, 10);
    h.admit_in(2, 100 * MS, 10);
    h.credit(a, 10);
    h.admit_in(2, 101 * MS, 1);
    caught(&h, Bound::windows(10));
    // A credit of this window does, from when it ran.
    let mut h = History::new();
    let a = h.admit_in(2, 100 * MS, 10);
    h.credit(a, 4);
    h.admit_in(2, 101 * MS, 4);
    passes(&h, Bound::windows(10));
    // A reset starts the windows again; a credit from before it makes no
    // room after it.
    let mut h = History::new();
    let a = h.admit_in(1, 0, 10);
    h.reset();
    h.admit_in(1, MS, 10);
    passes(&h, Bound::windows(10));
    h.credit(a, 10);
    h.admit_in(1, 2 * MS, 1);
    caught(&h, Bound::windows(10));
}
