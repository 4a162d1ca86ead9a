//! Fences in bounded memory: [`FenceSource`], and the one fence counter of
//! each cluster slot ([`slot_counter`]).
//!
//! A per-resource counter (`{r}:fence`) must never expire, so every resource
//! ever locked keeps a key. [`FenceSource::PerSlot`] draws fences instead
//! from a counter shared by every resource whose lock hashes to one cluster
//! slot, kept in that slot so the acquire script reads and writes it with
//! the lock in one atomic step. It only grows, so each resource's fences
//! still strictly increase and never repeat (even after its lock expired and
//! it was locked again), and there are at most 16384 counters however many
//! resources are locked. No clock is assumed.

use std::sync::OnceLock;

use crate::keys;

/// Where a [`super::Lock`] draws its fences from.
///
/// ```
/// use std::time::Duration;
/// use nolock::fence::{FenceSource, Lock};
///
/// let orders = Lock::new(Duration::from_secs(30))?.with_fence_source(FenceSource::PerSlot);
/// assert_eq!(orders.fence_source(), FenceSource::PerSlot);
/// assert_eq!(Lock::new(Duration::from_secs(30))?.fence_source(), FenceSource::PerResource);
/// # Ok::<(), nolock::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FenceSource {
    /// One counter per resource, `keys::derive(resource, "fence")`, which
    /// never expires: one key for every resource ever locked. Fenced writes
    /// ([`super::Fence::write`]) compare with that counter, so the newest
    /// grant may write even after its lease ended, until the next grant.
    #[default]
    PerResource,
    /// One counter per cluster slot ([`slot_counter`]), shared by every
    /// resource whose lock is in that slot: at most 16384 keys, and nothing
    /// per resource outlives its lock. A grant's fence is the slot counter's
    /// next value, or above the resource's own counter when one exists (a
    /// resource locked before the switch, or raised by
    /// [`super::advance`]), so switching never makes a fence go back.
    /// Fenced writes compare with the fence the lock holds, so a grant
    /// writes only while its lease lives ([`super::Write::Ended`] after).
    PerSlot,
}

/// The fence counter of the cluster slot `slot` (0..16384) used by
/// [`FenceSource::PerSlot`]: `{<tag>}!nolock:fences`, `<tag>` the first
/// short text (base 36 digits) that hashes to `slot`. No key made by
/// [`keys::derive`] has this form (there a `}` is followed by `:`, `#` or
/// `~`), so it never meets a user's key.
///
/// A Redis user restricted by ACL key patterns (see [`crate::acl`]) needs
/// these keys too: grant `~{*}!nolock:fences` (in an ACL glob `{` and `}`
/// are plain characters).
///
/// ```
/// use nolock::fence::slot_counter;
/// use nolock::keys::slot;
///
/// assert_eq!(slot(slot_counter(12182)), 12182);
/// assert_eq!(slot(slot_counter(slot("{order:42}:lock"))), slot("{order:42}:lock"));
/// assert!(slot_counter(0).ends_with("}!nolock:fences"));
/// ```
///
/// # Panics
///
/// When `slot` is 16384 or more (no cluster slot has that number).
pub fn slot_counter(slot: u16) -> &'static str {
    &counters()[usize::from(slot)]
}

/// The 16384 counter keys, computed once (a few milliseconds).
fn counters() -> &'static [String] {
    static COUNTERS: OnceLock<Vec<String>> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        let mut found: Vec<Option<String>> = vec![None; 16384];
        let mut missing = found.len();
        let mut n: u64 = 0;
        while missing > 0 {
            let tag = base36(n);
            let slot = usize::from(keys::slot(&tag));
            if found[slot].is_none() {
                found[slot] = Some(format!("{{{tag}}}!nolock:fences"));
                missing -= 1;
            }
            n += 1;
        }
        found.into_iter().flatten().collect()
    })
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_function_matches_redis_cluster() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(keys::slot("foo"), 12182);
        assert_eq!(keys::slot("bar"), 5061);
        // CRC16/XMODEM check value: CRC16("123456789") = 0x31C3, below 16384.
        assert_eq!(keys::slot("123456789"), 0x31C3);
        assert_eq!(keys::slot("{user1000}.following"), keys::slot("user1000"));
    }

    #[test]
    fn every_slot_has_its_own_counter_in_that_slot() {
        let all = counters();
        assert_eq!(all.len(), 16384);
        let mut seen = std::collections::HashSet::new();
        for (slot, key) in all.iter().enumerate() {
            assert_eq!(usize::from(keys::slot(key)), slot, "{key}");
            assert!(seen.insert(key.as_str()));
            // Short tags: at most 4 base-36 digits.
            assert!(keys::hash_tag(key).len() <= 4, "{key}");
        }
        assert_eq!(base36(0), "0");
        assert_eq!(base36(36 * 36 - 1), "zz");
    }
}
