//! The units a [`Reservoir`](super::Reservoir) holds, and every decision
//! it makes without I/O: which units may still be served (the decay), which
//! go back and how many of each (the lag), and the next batch's size.
//!
//! Its unit tests include a simulated GCRA server, against which random
//! histories (batch calls that take time, late serves, refunds) are held to
//! the limit's bound in every window.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Draw, ReservoirStats};
use crate::rate::Charge;

/// The units held: one entry per batch, oldest first.
#[derive(Debug)]
pub(super) struct Pool {
    batches: VecDeque<Held>,
    /// The batches' `left`, summed.
    pub(super) units: u64,
    /// `T` in nanoseconds: the microseconds the batch script is sent,
    /// times 1000 (at most 2^51 µs: no overflow).
    interval_ns: u64,
    /// Units admitted since the last batch call, and when that was.
    since: u64,
    last_fetch: Option<Instant>,
    /// Units admitted per second here, smoothed.
    rate: f64,
    /// After a batch call found too little: until when, and from which
    /// cost up, the server is sure to deny (its `retry_after` less 1 ms,
    /// from when the call was sent), so checks the pool cannot serve are
    /// denied here without a call.
    pub(super) denied: Option<(Instant, u64)>,
    pub(super) stats: ReservoirStats,
}

/// One batch: `granted` units charged by a call sent at `sent`.
#[derive(Debug)]
struct Held {
    charge: Charge,
    granted: u64,
    /// Units not admitted yet.
    unused: u64,
    /// Units it may still serve: at most `unused`, and at most
    /// `granted - ceil((now - sent) / T)` as of the last [`Pool::decay`].
    left: u64,
    /// `unused - left` when it last served a unit: what a refund must not
    /// give back (see [`Reservoir`](super::Reservoir)).
    lag: u64,
    sent: Instant,
    /// Until then the decay cannot take anything of `left`: `sent +
    /// (granted - left) × T`. A comparison instead of a division on the
    /// hot path.
    intact_until: Instant,
    /// When its reply came: `hold` counts from here, and the server holds
    /// nothing of it from `taken + granted × T` on.
    taken: Instant,
}

impl Held {
    /// `sent + (granted - left) × T`: the last instant at which
    /// `granted - ceil((τ - sent) / T)` is still at least `left`.
    fn intact(&self, interval_ns: u64) -> Instant {
        // At most burst × T ≤ 2^51 µs in nanoseconds: no overflow.
        let span = Duration::from_nanos((self.granted - self.left).saturating_mul(interval_ns));
        // Past the end of time: decided by the division every time.
        self.sent.checked_add(span).unwrap_or(self.sent)
    }
}

impl Pool {
    /// An empty pool for a limit whose batch script is sent `interval_us`.
    pub(super) fn new(interval_us: u64) -> Pool {
        Pool {
            batches: VecDeque::new(),
            units: 0,
            interval_ns: interval_us.max(1).saturating_mul(1000),
            since: 0,
            last_fetch: None,
            rate: 0.0,
            denied: None,
            stats: ReservoirStats::default(),
        }
    }

    /// Adds a batch: `charge`'s units, sent at `sent`, answered at `taken`.
    pub(super) fn add(&mut self, charge: Charge, sent: Instant, taken: Instant) {
        let granted = charge.cost();
        self.units += granted;
        self.batches.push_back(Held {
            charge,
            granted,
            unused: granted,
            left: granted,
            lag: 0,
            sent,
            intact_until: sent,
            taken,
        });
    }

    /// Takes out of the pool the units whose slots on the server's
    /// schedule may have begun by `now`: a batch serves at most
    /// `granted - ceil((now - sent) / T)`.
    pub(super) fn decay(&mut self, now: Instant) {
        for held in self.batches.iter_mut() {
            if held.left == 0 || now <= held.intact_until {
                continue;
            }
            let elapsed = now.saturating_duration_since(held.sent).as_nanos();
            let begun = u64::try_from(elapsed)
                .unwrap_or(u64::MAX)
                .div_ceil(self.interval_ns);
            let cap = held.granted.saturating_sub(begun);
            if held.left > cap {
                let gone = held.left - cap;
                held.left = cap;
                self.units -= gone;
                self.stats.decayed += gone;
            }
            held.intact_until = held.intact(self.interval_ns);
        }
    }

    /// Takes `cost` from the oldest batches, if the pool holds that much
    /// at `now`.
    pub(super) fn take(&mut self, cost: u64, now: Instant) -> bool {
        self.decay(now);
        self.serve(cost)
    }

    /// Takes `cost` from the oldest batches, if the pool holds that much,
    /// as of the last [`Pool::decay`].
    pub(super) fn serve(&mut self, cost: u64) -> bool {
        if self.units < cost {
            return false;
        }
        let mut need = cost;
        for held in self.batches.iter_mut() {
            if need == 0 {
                break;
            }
            let used = held.left.min(need);
            if used == 0 {
                continue;
            }
            held.left -= used;
            held.unused -= used;
            held.lag = held.unused - held.left;
            held.intact_until = held.intact(self.interval_ns);
            need -= used;
        }
        // A batch used up has nothing to give back.
        while self.batches.front().is_some_and(|h| h.unused == 0) {
            self.batches.pop_front();
        }
        self.units -= cost;
        self.since += cost;
        self.stats.admitted += cost;
        true
    }

    /// Removes the batches that can serve nothing more and those held
    /// since before `cutoff` (all with `None`), as of `now`: their charges
    /// and how much of each to give back (its unused units less its lag;
    /// nothing once the server has drained it by any clock).
    pub(super) fn expire(&mut self, cutoff: Option<Instant>, now: Instant) -> Vec<(Charge, u64)> {
        self.decay(now);
        let mut out = Vec::new();
        let mut kept = VecDeque::with_capacity(self.batches.len());
        let interval = Duration::from_nanos(self.interval_ns);
        for held in self.batches.drain(..) {
            let due = cutoff.is_none_or(|c| held.taken <= c);
            if !due && held.left > 0 {
                kept.push_back(held);
                continue;
            }
            self.units -= held.left;
            self.stats.returned += held.left;
            // The server ran the call before its reply came: by then plus
            // the batch's length it has drained all of it.
            let drained = u32::try_from(held.granted)
                .ok()
                .and_then(|g| held.taken.checked_add(interval.checked_mul(g)?))
                .is_some_and(|end| now >= end);
            let give = if drained { 0 } else { held.unused - held.lag };
            out.push((held.charge, give));
        }
        self.batches = kept;
        out
    }

    /// The next batch's size for a request of `cost`: what this process
    /// admits in `hold` at its recent rate, within `[cost, max]`.
    pub(super) fn batch(&mut self, cost: u64, hold: Duration, max: u64, now: Instant) -> u64 {
        if let Some(last) = self.last_fetch {
            let elapsed = now.saturating_duration_since(last).as_secs_f64().max(1e-6);
            let recent = self.since as f64 / elapsed;
            self.rate = if self.rate == 0.0 {
                recent
            } else {
                0.5 * self.rate + 0.5 * recent
            };
        }
        self.last_fetch = Some(now);
        self.since = 0;
        let want = (self.rate * hold.as_secs_f64()).ceil();
        // Saturating float to integer: a huge rate asks for `max`.
        (want as u64).clamp(cost, max.max(cost))
    }
}

impl Pool {
    /// A decision without I/O: admitted from the pool, or denied by a
    /// recent denial of the server; `None` when only Redis can tell.
    pub(super) fn local(&mut self, cost: u64) -> Option<Draw> {
        // The one clock read of a local decision.
        let now = Instant::now();
        if self.take(cost, now) {
            self.stats.local += 1;
            return Some(Draw {
                allowed: true,
                local: true,
                retry_after: None,
            });
        }
        match self.denied {
            Some((until, from)) if now < until && cost >= from => {
                self.stats.local += 1;
                Some(Draw {
                    allowed: false,
                    local: true,
                    retry_after: Some(until - now + Duration::from_millis(1)),
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::{Algorithm, Limiter, Quota};

    #[test]
    fn the_batch_follows_the_local_rate_within_its_bounds() {
        let mut pool = Pool::new(1);
        let t0 = Instant::now();
        let hold = Duration::from_millis(100);
        assert_eq!(
            pool.batch(3, hold, 500, t0),
            3,
            "no rate yet: just the cost"
        );
        pool.since = 100; // 100 units in 10 ms: 10 000 per second
        assert_eq!(
            pool.batch(1, hold, 500, t0 + Duration::from_millis(10)),
            500,
            "capped"
        );
        // Then one unit a second: the smoothed rate halves at each call.
        let mut b = 500;
        for s in 1..=8 {
            pool.since = 1;
            b = pool.batch(1, hold, 500, t0 + Duration::from_millis(10 + 1000 * s));
        }
        assert!((1..10).contains(&b), "light traffic, small batches: {b}");
        assert_eq!(
            pool.batch(7, hold, 5, t0 + Duration::from_secs(60)),
            7,
            "at least the cost"
        );
    }

    fn pool_with_batch(interval_us: u64, granted: u64, sent: Instant) -> Pool {
        let mut pool = Pool::new(interval_us);
        let limiter = Limiter::new(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
        let charge =
            limiter
                .issuer("k", granted)
                .charge(granted, std::time::UNIX_EPOCH, Duration::ZERO);
        pool.add(charge, sent, sent);
        pool
    }

    #[test]
    fn a_batch_decays_one_unit_per_interval_begun_since_it_was_sent() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // 10 per second: T = 100 ms; a batch of 10.
        let mut pool = pool_with_batch(100_000, 10, t0);
        assert!(pool.take(2, t0), "nothing has begun at the send");
        assert_eq!((pool.units, pool.stats.decayed), (8, 0));
        // 1 ns into slot 1: its unit may have started draining.
        assert!(pool.take(1, t0 + Duration::from_nanos(1)));
        assert_eq!((pool.units, pool.stats.decayed), (7, 0));
        // 250 ms: 3 slots begun, so at most 7 of 10 left; 7 unused.
        assert!(pool.take(1, t0 + ms(250)));
        assert_eq!((pool.units, pool.stats.decayed), (6, 0));
        // 800 ms: at most 2 left of the 6.
        assert!(!pool.take(3, t0 + ms(800)));
        assert_eq!((pool.units, pool.stats.decayed), (2, 4));
        assert!(pool.take(2, t0 + ms(800)));
        // Used 6, decayed 4 (all of them by its last serve): nothing to
        // give back, it can serve nothing more, so the tick returns it now.
        let back = pool.expire(Some(t0), t0 + ms(801));
        assert_eq!(back.iter().map(|(_, n)| *n).collect::<Vec<_>>(), [0]);
        assert!(pool.batches.is_empty());
        let s = pool.stats;
        assert_eq!(s.admitted + pool.units + s.returned + s.decayed, 10);
    }

    #[test]
    fn a_refund_gives_back_the_unused_units_less_the_lag() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut pool = pool_with_batch(100_000, 10, t0);
        // Served late: 4 units at 550 ms (6 slots begun, 4 left).
        assert!(pool.take(4, t0 + ms(550)));
        assert_eq!((pool.units, pool.stats.decayed), (0, 6));
        // 6 unused, 6 decayed before the last serve: nothing back, or the
        // server would free slots those 4 stand on.
        let back = pool.expire(None, t0 + ms(560));
        assert_eq!(back[0].1, 0);
        // Never served: everything unused goes back (the server credits
        // only what it has not drained).
        let mut pool = pool_with_batch(100_000, 10, t0);
        assert!(pool.take(1, t0));
        let back = pool.expire(None, t0 + ms(450));
        assert_eq!(
            (back[0].1, pool.stats.returned, pool.stats.decayed),
            (9, 5, 4)
        );
        // Drained by any clock (reply + 10 × T passed): no call at all.
        let mut pool = pool_with_batch(100_000, 10, t0);
        assert_eq!(pool.expire(None, t0 + ms(1000))[0].1, 0);
    }

    /// The server's GCRA, in integer microseconds, as the scripts decide.
    struct Gcra {
        tat: u64,
        t: u64,
        burst: u64,
    }

    impl Gcra {
        /// `check_at_most`: as many of `max` as fit at `now`.
        fn at_most(&mut self, now: u64, max: u64) -> u64 {
            let base = self.tat.max(now);
            let room = (now + self.burst * self.t).saturating_sub(base) / self.t;
            let granted = room.min(max);
            self.tat = base + granted * self.t;
            granted
        }

        /// A refund of `give` of a charge of `held` admitted at `at`
        /// (`lua/rate/gcra/refund.lua`).
        fn refund(&mut self, now: u64, at: u64, held: u64, give: u64) {
            let back = (give.min(held) * self.t).min((at + held * self.t).saturating_sub(now));
            self.tat = self.tat.saturating_sub(back).max(now);
        }
    }

    /// Random histories of one reservoir and another client on one GCRA
    /// limit, with batch calls that take time, late local serves and
    /// refunds: every window `[t1, t2]` of admissions (the server's instant
    /// for what it decided, the local instant for what the pool served)
    /// holds at most `burst + floor((t2 - t1) / T)`.
    #[test]
    fn random_histories_keep_the_bound_in_every_window() {
        let base = Instant::now();
        let at = |us: u64| base + Duration::from_micros(us);
        for seed in 0..300 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let t = [1, 7, 100, 1_000][rng.usize(0..4)];
            let burst = rng.u64(1..40);
            let limiter = Limiter::new(
                Algorithm::Gcra,
                Quota::per(1_000, Duration::from_micros(1_000 * t))
                    .unwrap()
                    .with_burst(burst)
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(limiter.quota().interval_us(), t);
            let mut server = Gcra { tat: 0, t, burst };
            let mut pool = Pool::new(t);
            let mut admitted: Vec<u64> = Vec::new();
            let mut now = 1_000_000u64;
            for _ in 0..400 {
                now += rng.u64(0..3 * t);
                match rng.u8(0..10) {
                    // A batch call: sent now, run d1 later, answered d2
                    // after that; the request's own cost served at once.
                    0..=2 => {
                        let (d1, d2) = (rng.u64(0..2 * t), rng.u64(0..2 * t));
                        let (sent, ran) = (now, now + d1);
                        now = ran + d2;
                        let cost = rng.u64(1..=burst.min(3));
                        let granted = server.at_most(ran, rng.u64(cost..=burst));
                        pool.decay(at(now));
                        pool.stats.granted += granted;
                        if granted > 0 {
                            let charge = limiter.issuer("k", granted).charge(
                                granted,
                                std::time::UNIX_EPOCH + Duration::from_micros(ran),
                                Duration::ZERO,
                            );
                            pool.add(charge, at(sent), at(now));
                        }
                        if pool.serve(cost) {
                            admitted.extend(std::iter::repeat_n(ran, cost as usize));
                        }
                    }
                    // Local decisions.
                    3..=6 => {
                        let cost = rng.u64(1..=burst.min(3));
                        if pool.take(cost, at(now)) {
                            admitted.extend(std::iter::repeat_n(now, cost as usize));
                        }
                    }
                    // Another client, one call per decision.
                    7 | 8 => {
                        let cost = rng.u64(1..=burst);
                        if server.tat.max(now) + cost * t <= now + burst * t {
                            server.at_most(now, cost);
                            admitted.extend(std::iter::repeat_n(now, cost as usize));
                        }
                    }
                    // The tick: some batches go back, their refunds run a
                    // little later.
                    _ => {
                        let cutoff = now.saturating_sub(rng.u64(0..20 * t));
                        let back = pool.expire(Some(at(cutoff)), at(now));
                        now += rng.u64(0..t);
                        for (charge, give) in back {
                            let ran = u64::try_from(
                                charge
                                    .at()
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .unwrap()
                                    .as_micros(),
                            )
                            .unwrap();
                            server.refund(now, ran, charge.held(), give);
                        }
                    }
                }
            }
            admitted.sort_unstable();
            for (i, &t1) in admitted.iter().enumerate() {
                for (count, &t2) in (1u64..).zip(&admitted[i..]) {
                    let bound = burst + (t2 - t1) / t;
                    assert!(
                        count <= bound,
                        "seed {seed}, T {t} us, burst {burst}: {count} admitted in [{t1}, {t2}] > {bound}"
                    );
                }
            }
            let s = pool.stats;
            assert_eq!(s.admitted + pool.units + s.returned + s.decayed, s.granted);
        }
    }
}
