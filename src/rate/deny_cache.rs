//! A per-process memory of recent denials ([`Limiter::with_local_deny_cache`]).
//!
//! After the server denies `cost` units at `key` with `retry_after = r`, a
//! check of `key` for `cost` or more units sent within `r - 1 ms` of the
//! first request's *sending* would be denied by the server too (nothing but
//! a refund or a reset frees capacity sooner), so it is answered here,
//! without a round trip. `r` is rounded up to the millisecond, so the
//! server's own wait is more than `r - 1 ms`; measuring from the moment the
//! denied request was sent, before the server decided, keeps the local
//! answer from outliving the server's. A refund through one of the
//! limiter's charges, and the limiter's `reset`, forget the key's entry.
//! An admission that left the limiter empty is remembered the same way, as
//! a denial of one unit or more until one unit fits again (the limiter
//! computes that time from the reply and its quota, rounding down).
//! The cache never admits: a smaller cost than the one denied, or an expired
//! entry, always goes to the server.
//!
//! Memory is bounded by `capacity` entries; each expires on its own. When the
//! cache is full the entry that expires first makes room (an expiry index
//! keeps that cheap), so a flood of distinct keys costs at most `capacity`
//! entries and evicts only the denials closest to their end.
//!
//! [`Limiter::with_local_deny_cache`]: super::Limiter::with_local_deny_cache

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::RateLimit;

const MS: Duration = Duration::from_millis(1);

/// One remembered denial.
#[derive(Debug, Clone, Copy)]
struct Denial {
    /// When the local denial ends: the denied request's send time + `retry_after`.
    until: Instant,
    /// The smallest cost it covers.
    cost: u64,
    /// The server's answer, aged when replayed.
    decision: RateLimit,
    /// When the denied request was sent, to age `decision` by.
    sent: Instant,
    /// Tie-breaker in the expiry index.
    seq: u64,
}

#[derive(Debug, Default)]
struct Entries {
    by_key: HashMap<String, Denial>,
    by_expiry: BTreeMap<(Instant, u64), String>,
    seq: u64,
}

/// The cache of one limiter (shared by its clones).
#[derive(Debug)]
pub(super) struct DenyCache {
    capacity: usize,
    entries: Mutex<Entries>,
}

impl DenyCache {
    pub(super) fn new(capacity: usize) -> Self {
        DenyCache {
            capacity,
            entries: Mutex::new(Entries::default()),
        }
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// A local denial of `cost` at `key` at `now`, if a remembered denial
    /// covers it.
    pub(super) fn denied(&self, key: &str, cost: u64, now: Instant) -> Option<RateLimit> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let d = entries.by_key.get(key)?;
        if now >= d.until || cost < d.cost {
            return None;
        }
        let aged = now.saturating_duration_since(d.sent);
        let mut decision = d.decision;
        decision.retry_after = Some(d.until.saturating_duration_since(now));
        decision.reset_after = decision.reset_after.saturating_sub(aged);
        decision.at = decision.at.checked_add(aged).unwrap_or(decision.at);
        Some(decision)
    }

    /// Remember the server's `decision` on `cost` units at `key`, for a
    /// request sent at `sent`. An admission forgets the key, unless it left
    /// the limiter empty for `empty_for` (computed by the limiter, which
    /// knows its algorithm): then checks of one unit or more are denied
    /// until `sent + empty_for`.
    pub(super) fn record(
        &self,
        key: &str,
        cost: u64,
        decision: &RateLimit,
        sent: Instant,
        empty_for: Option<Duration>,
    ) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entries = &mut *entries;
        if let Some(old) = entries.by_key.remove(key) {
            entries.by_expiry.remove(&(old.until, old.seq));
        }
        let mut decision = *decision;
        let (retry, cost) = match (decision.allowed, decision.retry_after, empty_for) {
            // Rounded up by the server: its own wait is more than r - 1 ms.
            (false, Some(r), _) if r > MS => (r - MS, cost),
            (true, _, Some(wait)) if decision.remaining == 0 && !wait.is_zero() => {
                // Replayed as the denial the server would give.
                decision.allowed = false;
                decision.retry_after = Some(wait);
                (wait, 1)
            }
            _ => return,
        };
        let Some(until) = sent.checked_add(retry) else {
            return;
        };
        let now = Instant::now();
        while let Some((&(at, seq), _)) = entries.by_expiry.first_key_value() {
            if at > now && entries.by_key.len() < self.capacity {
                break;
            }
            if let Some(key) = entries.by_expiry.remove(&(at, seq)) {
                entries.by_key.remove(&key);
            }
        }
        if self.capacity == 0 {
            return;
        }
        entries.seq += 1;
        let seq = entries.seq;
        entries.by_expiry.insert((until, seq), key.to_owned());
        entries.by_key.insert(
            key.to_owned(),
            Denial {
                until,
                cost,
                decision,
                sent,
                seq,
            },
        );
    }

    /// Forget `key`'s entry: a refund or a reset made room the entry does
    /// not know of.
    pub(super) fn forget(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = entries.by_key.remove(key) {
            entries.by_expiry.remove(&(old.until, old.seq));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert_eq!(entries.by_key.len(), entries.by_expiry.len());
        entries.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn denial(retry_ms: u64) -> RateLimit {
        RateLimit {
            allowed: false,
            limit: 10,
            remaining: 0,
            retry_after: Some(Duration::from_millis(retry_ms)),
            reset_after: Duration::from_millis(retry_ms),
            at: SystemTime::UNIX_EPOCH,
            debt: 0,
            period_end: None,
        }
    }

    #[test]
    fn a_denial_covers_its_cost_and_more_until_retry_after_less_a_millisecond_from_sending() {
        let cache = DenyCache::new(8);
        let sent = Instant::now();
        cache.record("k", 3, &denial(100), sent, None);
        let soon = sent + Duration::from_millis(40);
        let local = cache.denied("k", 3, soon).expect("covered");
        assert!(!local.allowed);
        // The server's 100 ms is rounded up: its own wait may be 99.001 ms.
        assert_eq!(local.retry_after, Some(Duration::from_millis(59)));
        assert_eq!(local.reset_after, Duration::from_millis(60));
        assert!(cache.denied("k", 5, soon).is_some(), "a larger cost too");
        assert!(
            cache.denied("k", 2, soon).is_none(),
            "a smaller cost may fit"
        );
        assert!(cache.denied("other", 3, soon).is_none());
        assert!(cache
            .denied("k", 3, sent + Duration::from_millis(99))
            .is_none());
        // A 1 ms denial may already be over when its reply arrives.
        cache.record("short", 1, &denial(1), sent, None);
        assert!(cache.denied("short", 1, sent).is_none());
    }

    #[test]
    fn a_forgotten_key_goes_to_the_server_again() {
        let cache = DenyCache::new(8);
        let sent = Instant::now();
        cache.record("k", 1, &denial(100), sent, None);
        cache.record("j", 1, &denial(100), sent, None);
        cache.forget("k");
        cache.forget("absent");
        assert!(cache.denied("k", 1, sent).is_none());
        assert!(cache.denied("j", 1, sent).is_some());
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn an_admission_forgets_the_key_and_nothing_is_cached_without_a_retry() {
        let cache = DenyCache::new(8);
        let sent = Instant::now();
        cache.record("k", 1, &denial(100), sent, None);
        let mut admitted = denial(0);
        admitted.allowed = true;
        admitted.retry_after = None;
        cache.record("k", 1, &admitted, sent, None);
        assert!(cache.denied("k", 1, sent).is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn an_admission_that_left_nothing_denies_one_unit_for_its_empty_time() {
        let cache = DenyCache::new(8);
        let sent = Instant::now();
        let mut admitted = denial(0);
        admitted.allowed = true;
        admitted.retry_after = None;
        cache.record("k", 1, &admitted, sent, Some(Duration::from_millis(50)));
        let local = cache
            .denied("k", 1, sent + Duration::from_millis(20))
            .expect("covered");
        assert!(!local.allowed);
        assert_eq!(local.retry_after, Some(Duration::from_millis(30)));
        assert!(cache
            .denied("k", 1, sent + Duration::from_millis(50))
            .is_none());
        // Units were left: nothing to remember.
        admitted.remaining = 1;
        cache.record("k", 1, &admitted, sent, Some(Duration::from_millis(50)));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn memory_is_bounded_and_the_soonest_expiry_makes_room() {
        let cache = DenyCache::new(3);
        let sent = Instant::now();
        for (i, ms) in [500u64, 100, 900, 700].into_iter().enumerate() {
            cache.record(&format!("k{i}"), 1, &denial(ms), sent, None);
        }
        assert_eq!(cache.len(), 3);
        assert!(
            cache.denied("k1", 1, sent).is_none(),
            "100 ms expired first"
        );
        for k in ["k0", "k2", "k3"] {
            assert!(cache.denied(k, 1, sent).is_some(), "{k}");
        }
        let zero = DenyCache::new(0);
        zero.record("k", 1, &denial(100), sent, None);
        assert_eq!(zero.len(), 0);
    }
}
