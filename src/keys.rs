//! Cluster slots and hash tags.
//!
//! Redis Cluster places a key by the CRC16 of its *hash tag*: the text between
//! the first `{` and the next `}`, when that is not empty; otherwise the whole
//! key. A script may only touch keys of one slot, so scripts that need several
//! keys derive them from one user key with a shared tag
//! ([`derive()`]), and operations that take several user keys check that they
//! share a slot ([`slot`]) before anything is sent.

/// The part of `key` that Redis Cluster hashes.
///
/// ```
/// assert_eq!(nolock::keys::hash_tag("{user:42}:limit"), "user:42");
/// assert_eq!(nolock::keys::hash_tag("plain"), "plain");
/// assert_eq!(nolock::keys::hash_tag("{}x"), "{}x"); // an empty tag does not count
/// ```
pub fn hash_tag(key: &str) -> &str {
    let Some(open) = key.find('{') else {
        return key;
    };
    match key[open + 1..].find('}') {
        Some(0) | None => key,
        Some(len) => &key[open + 1..open + 1 + len],
    }
}

/// The cluster slot (0..16384) of `key`.
///
/// ```
/// // Keys with the same hash tag share a slot.
/// assert_eq!(nolock::keys::slot("{a}:x"), nolock::keys::slot("{a}:y"));
/// assert_eq!(nolock::keys::slot("foo"), 12182);
/// ```
pub fn slot(key: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).as_bytes()) % 16384
}

/// A key for `part` that lands in the same slot as `key`.
///
/// When `key` already carries a hash tag it is kept as is (`{u1}:rl` gives
/// `{u1}:rl:part`); otherwise the whole key becomes the tag (`rl` gives
/// `{rl}:part`). A key that starts with `}` would make that tag empty, so it
/// gets a `~` in front (`}x` gives `{~}x}:part`).
///
/// ```
/// use nolock::keys::{derive, slot};
/// assert_eq!(derive("{u1}:rl", "fence"), "{u1}:rl:fence");
/// assert_eq!(derive("rl", "fence"), "{rl}:fence");
/// assert_eq!(slot(&derive("a{b", "x")), slot(&derive("a{b", "y")));
/// ```
pub fn derive(key: &str, part: &str) -> String {
    if hash_tag(key).len() < key.len() {
        format!("{key}:{part}")
    } else if key.starts_with('}') {
        format!("{{~{key}}}:{part}")
    } else {
        format!("{{{key}}}:{part}")
    }
}

/// The first key and its slot, and the first key in another slot, when
/// `keys` do not all share one cluster slot. Every multi-key check of the
/// crate goes through here (the engine before sending, `rate::MultiLimiter`
/// before it builds anything).
pub(crate) fn split_slot<'k>(keys: &[&'k str]) -> Option<[(&'k str, u16); 2]> {
    let (&first, rest) = keys.split_first()?;
    let slot = slot(first);
    rest.iter()
        .map(|&key| (key, self::slot(key)))
        .find(|&(_, other)| other != slot)
        .map(|other| [(first, slot), other])
}

/// [`crate::Error::CrossSlot`] when `keys` span several cluster slots.
pub(crate) fn same_slot(keys: &[&str]) -> crate::Result<()> {
    match split_slot(keys) {
        None => Ok(()),
        Some([(first, first_slot), (second, second_slot)]) => Err(crate::Error::CrossSlot {
            first: first.to_owned(),
            first_slot,
            second: second.to_owned(),
            second_slot,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_slot_names_the_first_key_of_another_slot() {
        assert_eq!(split_slot(&[]), None);
        assert_eq!(split_slot(&["{a}x", "{a}y"]), None);
        let [(first, _), (second, other)] = split_slot(&["{a}x", "{a}y", "{b}z", "{c}w"]).unwrap();
        assert_eq!((first, second, other), ("{a}x", "{b}z", slot("b")));
        assert!(matches!(
            same_slot(&["{a}x", "{b}z"]),
            Err(crate::Error::CrossSlot { .. })
        ));
    }

    #[test]
    fn tags_follow_the_redis_rules() {
        assert_eq!(hash_tag("{a}{b}"), "a");
        assert_eq!(hash_tag("x{a}y"), "a");
        assert_eq!(hash_tag("{a"), "{a");
        assert_eq!(hash_tag("a}{"), "a}{");
        assert_eq!(hash_tag("{}{a}"), "{}{a}");
    }

    #[test]
    fn slots_match_redis() {
        // Reference values from `CLUSTER KEYSLOT` on Redis 7.0.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
    }

    #[test]
    fn derived_keys_share_the_user_keys_slot_when_tagged() {
        for key in ["{t}", "x{t}y", "{t}:rl"] {
            assert_eq!(slot(&derive(key, "a")), slot(key), "{key}");
        }
        for key in ["plain", "{}x", "a{b", "}{", "}", "a}b"] {
            assert_eq!(slot(&derive(key, "a")), slot(&derive(key, "b")), "{key}");
        }
    }
}
