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

/// The key of `part` (`"lock"`, `"fence"`, a limit's name) for the user key
/// `key`: one key per pair, in the user key's cluster slot.
///
/// # Layout
///
/// The first `{...}` group of the result is its hash tag, and what follows the
/// `}` tells how to read the rest:
///
/// | user key | derived key | slot |
/// |---|---|---|
/// | no hash tag, no `}` (`payout:42`) | `{payout:42}:part` | the user key's |
/// | a hash tag (`{u1}:rl`, `{x}`) | `{u1}#7:{u1}:rl:part`: the tag, `#`, the byte length of the user key, `:`, the user key, `:`, the part | the user key's |
/// | no hash tag but a `}` (`a}b`, `{}x`), or empty | `{a)b~}~3:a}b:part`: every `}` of the key turned into `)` and a `~` appended make the tag, then `~`, length, `:`, key, `:`, part | shared by all parts of the key, **not** the user key's |
///
/// Two different `(key, part)` pairs never give the same derived key: the
/// character after the first `}` says which row the key came from, and in
/// the last two rows the user key is written out in full behind its length,
/// so the part starts at a known place. In particular the resources `x` and
/// `{x}` are different (`{x}:lock` and `{x}#3:{x}:lock`), and so are the
/// user ids `alice` and `{alice}`. `tests/properties.rs` and the unit tests
/// below check both properties over keys made of `{`, `}`, `:` and letters.
///
/// Why the last row cannot keep the slot: Redis hashes such a key in full,
/// and a hash tag cannot contain `}`, so no other key with a tag hashes the
/// same text. Give such keys a hash tag of your own (`{a}b}` hashes `a`) when
/// they must sit beside other keys.
///
/// **Layout change**: this layout replaces one in which a tagged key
/// `{u1}:rl` derived `{u1}:rl:part` and `x` and `{x}` shared their derived
/// keys. Keys without a tag or a `}` keep their old names; for other keys,
/// limits and fence counters start again under the new names (raise a fence
/// counter with [`crate::fence::advance`]).
///
/// ```
/// use nolock::keys::{derive, slot};
/// assert_eq!(derive("rl", "fence"), "{rl}:fence");
/// assert_eq!(derive("{u1}:rl", "fence"), "{u1}#7:{u1}:rl:fence");
/// assert_ne!(derive("x", "lock"), derive("{x}", "lock"));
/// assert_eq!(slot(&derive("{u1}:rl", "a")), slot("{u1}:rl"));
/// assert_eq!(slot(&derive("a}b", "x")), slot(&derive("a}b", "y")));
/// ```
pub fn derive(key: &str, part: &str) -> String {
    let tag = hash_tag(key);
    if tag.len() < key.len() {
        // The tag holds no `}` (it ends at the first one), so it ends the group.
        format!("{{{tag}}}#{}:{key}:{part}", key.len())
    } else if !key.is_empty() && !key.contains('}') {
        // Redis hashes the whole key, and `{key}` makes it the tag.
        format!("{{{key}}}:{part}")
    } else {
        let tag = key.replace('}', ")");
        format!("{{{tag}~}}~{}:{key}:{part}", key.len())
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

    /// Reads a derived key back into its user key and part: a left inverse
    /// of [`derive`], so `derive` is injective.
    pub(crate) fn underive(derived: &str) -> Option<(String, String)> {
        let body = derived.strip_prefix('{')?;
        let close = body.find('}')?;
        let (tag, rest) = (&body[..close], &body[close + 1..]);
        let (mark, rest) = (rest.chars().next()?, &rest[1..]);
        if mark == ':' {
            return Some((tag.to_owned(), rest.to_owned()));
        }
        if mark != '#' && mark != '~' {
            return None;
        }
        let colon = rest.find(':')?;
        let len: usize = rest[..colon].parse().ok()?;
        let rest = &rest[colon + 1..];
        let key = rest.get(..len)?;
        let part = rest.get(len..)?.strip_prefix(':')?;
        Some((key.to_owned(), part.to_owned()))
    }

    fn tagged_or_plain(key: &str) -> bool {
        hash_tag(key).len() < key.len() || (!key.is_empty() && !key.contains('}'))
    }

    #[test]
    fn derived_keys_read_back_and_keep_the_slot() {
        let keys = [
            "", "x", "{x}", "x{}", "{}x", "{}", "}", "{", "a}b", "}x", "{a}{b}", "{a{b}", "a:b",
            "{a}:b", "{a}b", "a{b", "}{", "{:}", "x#1:x", "x)~",
        ];
        for key in keys {
            for part in ["", "lock", "a:b", "{c}", "}"] {
                let d = derive(key, part);
                assert_eq!(
                    underive(&d),
                    Some((key.into(), part.into())),
                    "{key:?} {part:?}"
                );
                assert_eq!(slot(&d), slot(&derive(key, "other")), "{key:?}");
                if tagged_or_plain(key) {
                    assert_eq!(slot(&d), slot(key), "{key:?} -> {d:?}");
                }
            }
        }
    }

    fn text() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[{}:a~#)0-9]{0,12}").expect("valid regex")
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            cases: 2_000,
            ..Default::default()
        })]

        /// Injective (a left inverse exists) and slot-keeping, over keys full
        /// of `{`, `}`, `:`, empty tags and the layout's own marks.
        #[test]
        fn derive_is_injective_and_keeps_the_slot(key in text(), part in text(), other in text()) {
            let d = derive(&key, &part);
            proptest::prop_assert_eq!(underive(&d), Some((key.clone(), part.clone())));
            proptest::prop_assert_eq!(slot(&d), slot(&derive(&key, &other)));
            if tagged_or_plain(&key) {
                proptest::prop_assert_eq!(slot(&d), slot(&key));
            }
            if key != other {
                proptest::prop_assert_ne!(d, derive(&other, &part));
            }
        }
    }

    #[test]
    fn every_short_key_derives_distinct_keys() {
        // Every key of up to 5 characters from `{`, `}`, `:`, `a`, `~`, with
        // parts that mimic separators: no two (key, part) pairs meet.
        let alphabet = ['{', '}', ':', 'a', '~'];
        let mut keys = vec![String::new()];
        let mut frontier = vec![String::new()];
        for _ in 0..5 {
            frontier = frontier
                .iter()
                .flat_map(|k| alphabet.iter().map(move |c| format!("{k}{c}")))
                .collect();
            keys.extend(frontier.iter().cloned());
        }
        let mut seen = std::collections::HashMap::new();
        for key in &keys {
            for part in ["", "a", ":a", "a:", "}"] {
                if let Some(earlier) = seen.insert(derive(key, part), (key.clone(), part)) {
                    panic!(
                        "{earlier:?} and {:?} share {}",
                        (key, part),
                        derive(key, part)
                    );
                }
            }
        }
    }
}
