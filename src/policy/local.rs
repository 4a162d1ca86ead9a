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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::rate::{Quota, RateLimit};

/// How many keys the local limiter remembers. When it is full, keys whose
/// limiter is full again (TAT in the past) are forgotten; if it is still
/// full, requests for new keys are denied: memory stays bounded under a flood
/// of distinct keys, at the price of refusing them while Redis is away.
pub(crate) const MAX_KEYS: usize = 100_000;

#[derive(Debug)]
pub(crate) struct Local {
    replicas: u64,
    epoch: Instant,
    /// Key → TAT, microseconds since `epoch`.
    tat: Mutex<HashMap<String, u128>>,
}

impl Local {
    pub(crate) fn new(replicas: u64) -> Local {
        Local {
            replicas: replicas.max(1),
            epoch: Instant::now(),
            tat: Mutex::new(HashMap::new()),
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
    pub(crate) fn decide(&self, limits: &[(&str, &Quota)], cost: u64) -> (bool, Vec<RateLimit>) {
        let now = self.epoch.elapsed().as_micros();
        let at = SystemTime::now();
        let cost = u128::from(cost);
        // A poisoned lock only means another thread panicked mid-update of a
        // plain map of integers: the data is still usable.
        let mut map = self.tat.lock().unwrap_or_else(|e| e.into_inner());
        let new_keys = limits.iter().filter(|(k, _)| !map.contains_key(*k)).count();
        if map.len() + new_keys > MAX_KEYS {
            map.retain(|_, tat| *tat > now);
        }
        let room_for_keys = map.len() + new_keys <= MAX_KEYS;
        let mut states = Vec::with_capacity(limits.len());
        for (key, quota) in limits {
            let (interval, burst) = self.share(quota);
            let tat = map.get(*key).copied().unwrap_or(now).max(now);
            let fits = room_for_keys && tat - now + cost * interval <= burst * interval;
            states.push((tat, interval, burst, fits));
        }
        let admitted = states.iter().all(|s| s.3);
        let mut out = Vec::with_capacity(limits.len());
        for ((key, _), (mut tat, interval, burst, fits)) in limits.iter().zip(states) {
            if admitted {
                tat += cost * interval;
                map.insert((*key).to_owned(), tat);
            }
            let room = (burst * interval).saturating_sub(tat - now);
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
                // Nothing was taken in Redis: a refund of a local decision
                // must not give Redis units back.
                charged: 0,
            });
        }
        (admitted, out)
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
        let admitted = (0..8).filter(|_| local.decide(&[("k", &q)], 1).0).count();
        assert_eq!(admitted, 5);
        let (ok, d) = local.decide(&[("k", &q)], 1);
        assert!(!ok);
        assert_eq!(d[0].limit, 5);
        assert!(d[0].retry_after.unwrap() <= Duration::from_millis(200));
        assert!(d[0].retry_after.unwrap() > Duration::ZERO);
        // Another key has its own state.
        assert!(local.decide(&[("other", &q)], 1).0);
    }

    #[test]
    fn several_limits_are_all_or_nothing() {
        let wide = Quota::per_second(100).unwrap();
        let narrow = Quota::per_second(2).unwrap();
        let local = Local::new(1);
        assert!(local.decide(&[("a", &wide), ("n", &narrow)], 2).0);
        let (ok, d) = local.decide(&[("a", &wide), ("n", &narrow)], 1);
        assert!(!ok && d[0].allowed && !d[1].allowed);
        // The denial took nothing from the wide limit.
        assert_eq!(local.decide(&[("a", &wide)], 1).1[0].remaining, 97);
    }

    #[test]
    fn memory_is_bounded() {
        let q = Quota::per_hour(1).unwrap();
        let local = Local::new(1);
        for i in 0..MAX_KEYS {
            assert!(local.decide(&[(&i.to_string(), &q)], 1).0);
        }
        // Full, and nothing is full again within an hour: new keys are refused.
        assert!(!local.decide(&[("new", &q)], 1).0);
        assert!(local.tat.lock().unwrap().len() <= MAX_KEYS);
    }
}
