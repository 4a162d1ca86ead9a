//! The per-process limiter behind [`OnFailure::Local`](super::OnFailure::Local).
//!
//! A GCRA kept in a `HashMap` (one theoretical arrival time per key, in
//! microseconds of a monotonic clock), the same decision rule as
//! `lua/rate/gcra/check.lua` with the quota divided by the replica count:
//! each of `n` replicas admits `rate / n` per period with a burst of
//! `burst / n` (at least 1), so `n` replicas together stay near the quota
//! while Redis is away. Written here rather than taken from the `governor`
//! crate: it is forty lines, it must read nolock's [`Quota`] exactly, it
//! needs the multi-limit all-or-nothing rule, and the core stays free of
//! another dependency tree.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::rate::{Quota, RateLimit};
use crate::{Error, Result};

/// How many keys the local limiter remembers. When it is full, keys whose
/// limiter is full again (TAT in the past) are forgotten, soonest first; if
/// none is, requests for new keys are denied: memory stays bounded under a
/// flood of distinct keys, at the price of refusing them while Redis is
/// away.
pub(crate) const MAX_KEYS: usize = 100_000;

#[derive(Debug)]
pub(crate) struct Local {
    replicas: u64,
    epoch: Instant,
    table: Mutex<Table>,
}

/// Key → TAT (microseconds since `epoch`), and the same pairs ordered by
/// TAT, so that making room forgets the keys full again soonest without a
/// scan: O(log n) per key forgotten, each key forgotten once.
#[derive(Debug, Default)]
struct Table {
    tat: HashMap<String, u128>,
    by_tat: BTreeSet<(u128, String)>,
}

impl Table {
    fn set(&mut self, key: &str, tat: u128) {
        if let Some(old) = self.tat.insert(key.to_owned(), tat) {
            self.by_tat.remove(&(old, key.to_owned()));
        }
        self.by_tat.insert((tat, key.to_owned()));
    }

    /// Forget keys full again by `now`, until `wanted` new keys fit.
    fn make_room(&mut self, wanted: usize, now: u128) -> bool {
        while self.tat.len() + wanted > MAX_KEYS {
            match self.by_tat.first() {
                Some((tat, _)) if *tat <= now => {
                    if let Some((_, key)) = self.by_tat.pop_first() {
                        self.tat.remove(&key);
                    }
                }
                _ => return false,
            }
        }
        true
    }
}

impl Local {
    pub(crate) fn new(replicas: u64) -> Local {
        Local {
            replicas: replicas.max(1),
            epoch: Instant::now(),
            table: Mutex::new(Table::default()),
        }
    }

    /// The local share of `quota`: `(interval µs, burst)`.
    fn share(&self, quota: &Quota) -> (u128, u128) {
        let interval = quota.emission_interval().as_micros() * u128::from(self.replicas);
        let burst = (quota.burst() / self.replicas).max(1);
        (interval, u128::from(burst))
    }

    /// Take `cost` from every `(key, quota)` if it fits on all of them; a
    /// denial takes nothing. Returns whether it was admitted and one
    /// [`RateLimit`] per limit, as the Redis scripts would.
    ///
    /// # Errors
    ///
    /// [`Error::InsufficientCapacity`] when `cost` is above a limit's local
    /// share of the burst: it could never be admitted here, however long
    /// the caller waited (as a cost above the burst is refused before Redis
    /// is asked).
    pub(crate) fn decide(
        &self,
        limits: &[(&str, &Quota)],
        cost: u64,
    ) -> Result<(bool, Vec<RateLimit>)> {
        for (_, quota) in limits {
            let (_, burst) = self.share(quota);
            if u128::from(cost) > burst {
                return Err(Error::InsufficientCapacity {
                    requested: cost,
                    limit: u64::try_from(burst).unwrap_or(u64::MAX),
                });
            }
        }
        let now = self.epoch.elapsed().as_micros();
        let at = SystemTime::now();
        let cost = u128::from(cost);
        // A poisoned lock only means another thread panicked mid-update of a
        // plain map of integers: the data is still usable.
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let new_keys = limits
            .iter()
            .filter(|(k, _)| !table.tat.contains_key(*k))
            .count();
        let room_for_keys = table.make_room(new_keys, now);
        let mut states = Vec::with_capacity(limits.len());
        for (key, quota) in limits {
            let (interval, burst) = self.share(quota);
            let tat = table.tat.get(*key).copied().unwrap_or(now).max(now);
            let fits = room_for_keys && tat - now + cost * interval <= burst * interval;
            states.push((tat, interval, burst, fits));
        }
        let admitted = states.iter().all(|s| s.3);
        let mut out = Vec::with_capacity(limits.len());
        for ((key, _), (mut tat, interval, burst, fits)) in limits.iter().zip(states) {
            if admitted {
                tat += cost * interval;
                table.set(key, tat);
            }
            let room = (burst * interval).saturating_sub(tat - now);
            // Waiting this long makes `cost` fit: it is at most the share's
            // burst (checked above), so the wait is finite and honest.
            let retry_after = (!fits).then(|| {
                let wait = (cost * interval).saturating_sub(room).max(1);
                ms_up(wait)
            });
            out.push(RateLimit {
                allowed: fits,
                limit: u64::try_from(burst).unwrap_or(u64::MAX),
                remaining: u64::try_from(room / interval).unwrap_or(u64::MAX),
                retry_after,
                reset_after: ms_up(tat - now),
                at,
                debt: 0,
                period_end: None,
            });
        }
        Ok((admitted, out))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert_eq!(table.tat.len(), table.by_tat.len());
        table.tat.len()
    }
}

/// Microseconds rounded up to whole milliseconds, as the scripts report.
fn ms_up(us: u128) -> Duration {
    Duration::from_millis(u64::try_from(us.div_ceil(1000)).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_is_divided_by_the_replicas() {
        let q = Quota::per_second(10).unwrap();
        let local = Local::new(2);
        // 5 per second per replica, burst 5.
        let admitted = (0..8)
            .filter(|_| local.decide(&[("k", &q)], 1).unwrap().0)
            .count();
        assert_eq!(admitted, 5);
        let (ok, d) = local.decide(&[("k", &q)], 1).unwrap();
        assert!(!ok);
        assert_eq!(d[0].limit, 5);
        assert!(d[0].retry_after.unwrap() <= Duration::from_millis(200));
        assert!(d[0].retry_after.unwrap() > Duration::ZERO);
        // Another key has its own state.
        assert!(local.decide(&[("other", &q)], 1).unwrap().0);
    }

    #[test]
    fn a_cost_above_the_local_share_is_refused_not_promised_a_retry() {
        // 10 per second over 4 replicas: a burst of 2 each.
        let q = Quota::per_second(10).unwrap();
        let local = Local::new(4);
        for cost in [3, 10] {
            assert!(matches!(
                local.decide(&[("k", &q)], cost),
                Err(Error::InsufficientCapacity { requested, limit: 2 }) if requested == cost
            ));
        }
        // A cost that fits the share gets a retry_after that keeps its promise.
        assert!(local.decide(&[("k", &q)], 2).unwrap().0);
        let (ok, d) = local.decide(&[("k", &q)], 2).unwrap();
        assert!(!ok);
        let wait = d[0].retry_after.expect("denied");
        assert!(wait <= Duration::from_millis(801), "{wait:?}");
        std::thread::sleep(wait);
        assert!(
            local.decide(&[("k", &q)], 2).unwrap().0,
            "admitted after retry_after"
        );
    }

    #[test]
    fn several_limits_are_all_or_nothing() {
        let wide = Quota::per_second(100).unwrap();
        let narrow = Quota::per_second(2).unwrap();
        let local = Local::new(1);
        assert!(local.decide(&[("a", &wide), ("n", &narrow)], 2).unwrap().0);
        let (ok, d) = local.decide(&[("a", &wide), ("n", &narrow)], 1).unwrap();
        assert!(!ok && d[0].allowed && !d[1].allowed);
        // The denial took nothing from the wide limit.
        assert_eq!(local.decide(&[("a", &wide)], 1).unwrap().1[0].remaining, 97);
    }

    #[test]
    fn memory_is_bounded() {
        let q = Quota::per_hour(1).unwrap();
        let local = Local::new(1);
        for i in 0..MAX_KEYS {
            assert!(local.decide(&[(&i.to_string(), &q)], 1).unwrap().0);
        }
        // Full, and nothing is full again within an hour: new keys are refused.
        assert!(!local.decide(&[("new", &q)], 1).unwrap().0);
        assert_eq!(local.len(), MAX_KEYS);
    }

    #[test]
    fn a_full_table_forgets_the_keys_full_again_soonest() {
        let short = Quota::per(1, Duration::from_millis(5)).unwrap();
        let long = Quota::per_hour(1).unwrap();
        let local = Local::new(1);
        // Half the table full again within 5 ms, half within an hour.
        for i in 0..MAX_KEYS {
            let q = if i % 2 == 0 { &short } else { &long };
            assert!(local.decide(&[(&i.to_string(), q)], 1).unwrap().0);
        }
        std::thread::sleep(Duration::from_millis(10));
        for i in 0..MAX_KEYS / 2 {
            let key = format!("new{i}");
            assert!(local.decide(&[(&key, &long)], 1).unwrap().0, "{key}");
        }
        assert_eq!(local.len(), MAX_KEYS);
        // The hour-long keys were kept: each is still denied.
        assert!(!local.decide(&[("1", &long)], 1).unwrap().0);
        assert!(!local.decide(&[("one more", &long)], 1).unwrap().0);
    }
}
