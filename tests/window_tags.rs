//! State tags of the token bucket (`b<T>x<C>`) and the sliding window
//! (`s<w>x<L>`), the head of each state's string (`"b<T>x<C>:<tokens>:<at>"`,
//! `"s<w>x<L>:<start>:<count>:<previous>"`: `lua/lib/tag.lua`,
//! `lua/lib/state.lua`), on a single `redis-server` and a local Redis
//! Cluster (`both!`).
//!
//! A state written by another limit (other numbers, or another algorithm,
//! GCRA and fixed windows included) is refused with `Error::StateMismatch`
//! by check, peek, check_at_most and refund, the key left as it was; an
//! untagged string is a definite error, another type `WRONGTYPE`. A hash of
//! the forms before (`{tokens, at, by}`, and `{tokens, at}` before tags) is
//! read as it was and replaced by the tagged string at its next write; a
//! call ending in "adopt" (what a managed handle sends after a declared
//! change of its numbers) reads its own algorithm's state of other numbers
//! and retags it, never another algorithm's.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use nolock::rate::{Algorithm, Charge, Limiter, Quota};
use nolock::{Error, Scripts};
use support::deployment::{both, AnyConn, Deployment};
use support::{prefix, raw};

/// The period of every limit here: windows are aligned on the epoch, and a
/// day's window is not crossed while a test runs (but at midnight UTC);
/// a bucket refills one of 10 tokens in 2.4 hours.
const DAY: Duration = Duration::from_secs(86_400);
const MAX: u64 = 9_007_199_254_740_991;

both!(
    shared: [
        other_numbers_are_refused_and_the_state_is_left_alone,
        another_algorithm_is_refused_and_left_alone,
        a_hash_from_before_tags_is_read_and_tagged_by_its_next_write,
        refunds_and_partial_grants_keep_and_check_the_tag,
        adopting_retags_its_own_algorithm_only,
        foreign_hashes_stay_foreign_with_a_tag,
        concurrent_limits_of_other_numbers_never_share_a_key,
    ],
    exclusive: [
        a_script_flush_before_a_tagged_call_is_survived,
    ],
);

fn limiter(algorithm: Algorithm, rate: u64, period: Duration) -> Limiter {
    Limiter::new(algorithm, Quota::per(rate, period).unwrap()).unwrap()
}

/// The two numbers the scripts take per limit: the interval per token in
/// µs and the capacity; the window in ms and the limit.
fn params(algorithm: Algorithm, rate: u64, period: Duration) -> (u64, u64) {
    let q = Quota::per(rate, period).unwrap();
    match algorithm {
        Algorithm::TokenBucket => (q.emission_interval().as_micros() as u64, q.burst()),
        Algorithm::SlidingWindow => (q.period().as_millis() as u64, q.rate()),
        other => panic!("{other}"),
    }
}

/// The tag a limiter of `rate` per `period` writes: its letter and its
/// script's two numbers.
fn tag(algorithm: Algorithm, rate: u64, period: Duration) -> String {
    let (a, b) = params(algorithm, rate, period);
    let letter = if algorithm == Algorithm::TokenBucket {
        'b'
    } else {
        's'
    };
    format!("{letter}{a}x{b}")
}

/// The two algorithms whose state holds several numbers (a hash before
/// 2026-12-05).
const HASHED: [Algorithm; 2] = [Algorithm::TokenBucket, Algorithm::SlidingWindow];

/// The names of the numbers after a state's tag, by the tag's letter.
fn field_names(tag: &str) -> &'static [&'static str] {
    match tag.as_bytes().first() {
        Some(b'b') => &["tokens", "at"],
        Some(b's') => &["start", "count", "previous"],
        _ => panic!("not a bucket's or a window's tag: {tag}"),
    }
}

/// The state at `key` as named fields: a string `"<tag>:<n>:<n>..."` as
/// `by` and the algorithm's names, a hash (the older form) as it is; empty
/// when the key is missing.
async fn state_fields(d: &Deployment, key: &str) -> BTreeMap<String, String> {
    let mut owner = d.owner(key).await;
    let kind: String = raw(&mut owner, &["TYPE", key]).await;
    match kind.as_str() {
        "none" => BTreeMap::new(),
        "hash" => raw(&mut owner, &["HGETALL", key]).await,
        "string" => {
            let value: String = raw(&mut owner, &["GET", key]).await;
            let mut parts = value.split(':');
            let by = parts.next().unwrap().to_owned();
            let names = field_names(&by);
            let values: Vec<&str> = parts.collect();
            assert_eq!(values.len(), names.len(), "{key}: {value}");
            let mut out: BTreeMap<String, String> = names
                .iter()
                .zip(values)
                .map(|(n, v)| ((*n).to_owned(), v.to_owned()))
                .collect();
            out.insert("by".to_owned(), by);
            out
        }
        other => panic!("{key} is a {other}"),
    }
}

/// The key's type, its value as stored (a string, or a hash's fields) and
/// its absolute expiry: equal snapshots mean nothing was written.
async fn snapshot(d: &Deployment, key: &str) -> (String, String, i64) {
    let mut owner = d.owner(key).await;
    let kind: String = raw(&mut owner, &["TYPE", key]).await;
    let value = match kind.as_str() {
        "string" => raw::<String>(&mut owner, &["GET", key]).await,
        "hash" => format!(
            "{:?}",
            raw::<BTreeMap<String, String>>(&mut owner, &["HGETALL", key]).await
        ),
        "list" => format!(
            "{:?}",
            raw::<Vec<String>>(&mut owner, &["LRANGE", key, "0", "-1"]).await
        ),
        _ => String::new(),
    };
    let expiry: i64 = raw(&mut owner, &["PEXPIRETIME", key]).await;
    (kind, value, expiry)
}

/// The server clock of the node that owns `key`, in microseconds.
async fn server_us(d: &Deployment, key: &str) -> u64 {
    let mut owner = d.owner(key).await;
    let t: Vec<u64> = raw(&mut owner, &["TIME"]).await;
    t[0] * 1_000_000 + t[1]
}

/// A refusal naming the key, the stored tag and the call's.
fn is_mismatch<T: std::fmt::Debug>(
    got: &nolock::Result<T>,
    key: &str,
    stored: &str,
    ours: &str,
) -> bool {
    match got {
        Err(err @ Error::StateMismatch { detail }) => {
            err.is_definite()
                && detail.contains(key)
                && detail.contains(&format!("written by {stored}, not {ours}"))
        }
        _ => false,
    }
}

/// A copy of a real charge of `l` (taken on a scratch key of its own, in
/// `key`'s slot)
/// pointed at `key` through serde, as a charge that crossed a process
/// boundary may be.
async fn charge_at(conn: &mut AnyConn, l: &Limiter, key: &str) -> Charge {
    let (a, b) = params(l.algorithm(), l.quota().rate(), l.quota().period());
    let scratch = format!("{key}:scratch:{a}:{b}");
    let charge = l
        .check(conn, &scratch, 1)
        .await
        .unwrap()
        .into_charge()
        .unwrap();
    let json = serde_json::to_string(&charge).unwrap();
    let from = format!("\"keys\":[{}]", serde_json::to_string(&scratch).unwrap());
    let to = format!("\"keys\":[{}]", serde_json::to_string(key).unwrap());
    assert!(json.contains(&from), "{json}");
    serde_json::from_str(&json.replace(&from, &to)).unwrap()
}

/// Keys in one slot: `{p}name`.
fn slot_key(p: &str, name: &str) -> String {
    format!("{{{p}}}{name}")
}

/// Check, peek, check_at_most (bucket) and refund by `l` on `key`, each
/// refused as written by `stored` and leaving the key as it was.
async fn all_refused(d: &Deployment, conn: &mut AnyConn, l: &Limiter, key: &str, stored: &str) {
    let ours = tag(l.algorithm(), l.quota().rate(), l.quota().period());
    let before = snapshot(d, key).await;
    let what = l.algorithm();
    let got = l.check(conn, key, 1).await;
    assert!(
        is_mismatch(&got, key, stored, &ours),
        "{what} check: {got:?}"
    );
    let got = l.peek(conn, key, 1).await;
    assert!(
        is_mismatch(&got, key, stored, &ours),
        "{what} peek: {got:?}"
    );
    if l.algorithm() == Algorithm::TokenBucket {
        let got = l.check_at_most(conn, key, 5).await;
        assert!(
            is_mismatch(&got, key, stored, &ours),
            "{what} at most: {got:?}"
        );
    }
    let mut charge = charge_at(conn, l, key).await;
    let got = charge.refund(conn, 1).await;
    assert!(
        is_mismatch(&got, key, stored, &ours),
        "{what} refund: {got:?}"
    );
    assert_eq!(snapshot(d, key).await, before, "{what}: the state changed");
}

async fn other_numbers_are_refused_and_the_state_is_left_alone(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("other_numbers");
    for algorithm in HASHED {
        let key = slot_key(&p, algorithm.name());
        let ten = limiter(algorithm, 10, DAY);
        let mut first = ten.check(&mut conn, &key, 3).await.unwrap();
        assert!(first.allowed);
        let ten_tag = tag(algorithm, 10, DAY);
        // 10 per day: a token per 8640 s in µs, or a window of 86 400 000 ms.
        let literal = match algorithm {
            Algorithm::TokenBucket => "b8640000000x10",
            _ => "s86400000x10",
        };
        assert_eq!(ten_tag, literal);
        let fields = state_fields(d, &key).await;
        assert_eq!(fields.get("by"), Some(&ten_tag), "{algorithm}: {fields:?}");
        assert_eq!(
            fields.len(),
            if algorithm == Algorithm::TokenBucket {
                3
            } else {
                4
            }
        );

        // Another capacity or limit, and another period: each refused.
        for other in [limiter(algorithm, 20, DAY), limiter(algorithm, 10, 2 * DAY)] {
            all_refused(d, &mut conn, &other, &key, &ten_tag).await;
        }
        // The writer itself goes on, from the state it wrote.
        let next = ten.check(&mut conn, &key, 1).await.unwrap();
        assert_eq!((next.allowed, next.remaining), (true, 6), "{algorithm}");
        let r = first
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 3)
            .await
            .unwrap();
        assert_eq!(r.credited, 3, "{algorithm}");
        assert_eq!(state_fields(d, &key).await.get("by"), Some(&ten_tag));
    }
}

async fn another_algorithm_is_refused_and_left_alone(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("other_algorithm");
    let bucket = limiter(Algorithm::TokenBucket, 10, DAY);
    let window = limiter(Algorithm::SlidingWindow, 10, DAY);

    // A state of the other algorithm here: refused by its tag, even with
    // the same rate and period.
    let key = slot_key(&p, "window");
    assert!(window.check(&mut conn, &key, 1).await.unwrap().allowed);
    all_refused(
        d,
        &mut conn,
        &bucket,
        &key,
        &tag(Algorithm::SlidingWindow, 10, DAY),
    )
    .await;
    let key = slot_key(&p, "bucket");
    assert!(bucket.check(&mut conn, &key, 1).await.unwrap().allowed);
    all_refused(
        d,
        &mut conn,
        &window,
        &key,
        &tag(Algorithm::TokenBucket, 10, DAY),
    )
    .await;

    // A GCRA state (as gcra/check writes it), a tagged GCRA or fixed-window
    // value: refused by their tags, before any write, the key keeping its
    // value and expiry.
    let gcra_key = slot_key(&p, "gcra");
    let gcra = limiter(Algorithm::Gcra, 10, DAY);
    assert!(gcra.check(&mut conn, &gcra_key, 1).await.unwrap().allowed);
    let gcra_tag = format!(
        "g{}x10",
        Quota::per(10, DAY).unwrap().emission_interval().as_micros()
    );
    let now = server_us(d, &gcra_key).await;
    let tagged = [
        (slot_key(&p, "g"), format!("g100000x10:{now}")),
        (slot_key(&p, "f"), "f1000x5:3".to_owned()),
    ];
    let mut owner = d.owner(&gcra_key).await;
    for (key, value) in &tagged {
        let _: () = raw(&mut owner, &["SET", key, value, "PX", "600000"]).await;
    }
    for (key, stored) in [
        (&gcra_key, gcra_tag.as_str()),
        (&tagged[0].0, "g100000x10"),
        (&tagged[1].0, "f1000x5"),
    ] {
        for l in [&bucket, &window] {
            all_refused(d, &mut conn, l, key, stored).await;
        }
    }

    // An untagged string (a bare number, a word) is foreign: a definite
    // error. A list is WRONGTYPE. Each key keeps its value and expiry.
    let list = slot_key(&p, "list");
    let _: i64 = raw(&mut owner, &["RPUSH", &list, "a", "b"]).await;
    let bare = [
        (slot_key(&p, "bare"), "1764950000000000"),
        (slot_key(&p, "word"), "hello:world"),
    ];
    for (key, value) in &bare {
        let _: () = raw(&mut owner, &["SET", key, value, "PX", "600000"]).await;
    }
    for key in [&list, &bare[0].0, &bare[1].0] {
        for l in [&bucket, &window] {
            let before = snapshot(d, key).await;
            let definite = |got: &nolock::Result<_>| {
                matches!(got, Err(e @ Error::Redis(r))
                    if e.is_definite() && (key != &list || r.code() == Some("WRONGTYPE")))
            };
            let what = format!("{} on {key}", l.algorithm());
            let got = l.check(&mut conn, key, 1).await.map(|d| d.remaining);
            assert!(definite(&got), "{what}: {got:?}");
            let got = l.peek(&mut conn, key, 1).await.map(|s| s.remaining);
            assert!(definite(&got), "{what}: {got:?}");
            if l.algorithm() == Algorithm::TokenBucket {
                let got = l.check_at_most(&mut conn, key, 2).await.map(|p| p.granted);
                assert!(definite(&got), "{what}: {got:?}");
            }
            let mut charge = charge_at(&mut conn, l, key).await;
            let got = charge.refund(&mut conn, 1).await.map(|r| r.credited);
            assert!(definite(&got), "{what}: {got:?}");
            assert_eq!(snapshot(d, key).await, before, "{what}: the key changed");
        }
    }
}

async fn a_hash_from_before_tags_is_read_and_tagged_by_its_next_write(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("legacy");
    for algorithm in HASHED {
        let ours = tag(algorithm, 10, DAY);
        // The hash before tags, and the tagged hash of the release before
        // states were strings.
        for by in [None, Some(ours.as_str())] {
            let key = slot_key(&p, &format!("{}-{}", algorithm.name(), by.is_some()));
            let l = limiter(algorithm, 10, DAY);
            let mut owner = d.owner(&key).await;
            // Today's exact numbers, 4 units left: a bucket of 4 tokens
            // refilled up to now; a window of 6 counted in the day holding
            // now.
            let now = server_us(d, &key).await;
            let start = now / 1000 / 86_400_000 * 86_400_000;
            let mut legacy: Vec<String> = match algorithm {
                Algorithm::TokenBucket => {
                    vec!["tokens".into(), "4".into(), "at".into(), now.to_string()]
                }
                _ => ["start", &start.to_string(), "count", "6", "previous", "0"]
                    .map(str::to_owned)
                    .into(),
            };
            if let Some(by) = by {
                legacy.extend(["by".to_owned(), by.to_owned()]);
            }
            let hset = |key: &str, fields: &[String]| {
                let mut args = vec!["HSET".to_owned(), key.to_owned()];
                args.extend(fields.iter().cloned());
                args
            };
            let args = hset(&key, &legacy);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _: () = raw(&mut owner, &args).await;
            let _: () = raw(&mut owner, &["PEXPIRE", &key, "600000"]).await;
            let untouched = snapshot(d, &key).await;

            // Read as today; a peek and a denial write nothing.
            let peeked = l.peek(&mut conn, &key, 1).await.unwrap();
            assert_eq!((peeked.allowed, peeked.remaining), (true, 4), "{algorithm}");
            let denied = l.check(&mut conn, &key, 5).await.unwrap();
            assert!(!denied.allowed, "{algorithm}: {denied:?}");
            assert_eq!(snapshot(d, &key).await, untouched, "{algorithm}");
            // Other numbers are refused on a tagged hash, which stays.
            if by.is_some() {
                all_refused(d, &mut conn, &limiter(algorithm, 20, DAY), &key, &ours).await;
            }

            // The first admitted write replaces it with the tagged string:
            // other numbers are refused from then on.
            let admitted = l.check(&mut conn, &key, 1).await.unwrap();
            assert_eq!(
                (admitted.allowed, admitted.remaining),
                (true, 3),
                "{algorithm}"
            );
            assert_eq!(snapshot(d, &key).await.0, "string", "{algorithm}");
            let fields = state_fields(d, &key).await;
            assert_eq!(fields.get("by"), Some(&ours), "{algorithm}: {fields:?}");
            all_refused(d, &mut conn, &limiter(algorithm, 20, DAY), &key, &ours).await;

            // A refund of a state in the older form (the same numbers, as
            // a hash without a tag) gives back and writes the string.
            let mut charge = admitted.into_charge().unwrap();
            let older: Vec<String> = fields
                .iter()
                .filter(|(name, _)| *name != "by")
                .flat_map(|(name, value)| [name.clone(), value.clone()])
                .collect();
            let _: i64 = raw(&mut owner, &["DEL", &key]).await;
            let args = hset(&key, &older);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _: () = raw(&mut owner, &args).await;
            let _: () = raw(&mut owner, &["PEXPIRE", &key, "600000"]).await;
            let r = charge.refund(&mut conn, 1).await.unwrap();
            assert_eq!((r.credited, r.remaining), (1, 4), "{algorithm}");
            assert_eq!(snapshot(d, &key).await.0, "string", "{algorithm}");
            assert_eq!(
                state_fields(d, &key).await.get("by"),
                Some(&ours),
                "{algorithm}"
            );
        }
    }
}

async fn refunds_and_partial_grants_keep_and_check_the_tag(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("refund_at_most");
    for algorithm in HASHED {
        let key = slot_key(&p, algorithm.name());
        let l = limiter(algorithm, 10, DAY);
        let ours = tag(algorithm, 10, DAY);
        let mut first = l.check(&mut conn, &key, 4).await.unwrap();
        let r = first
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 3)
            .await
            .unwrap();
        assert_eq!((r.credited, r.remaining), (3, 9), "{algorithm}");
        let fields = state_fields(d, &key).await;
        assert_eq!(fields.get("by"), Some(&ours), "{algorithm}: {fields:?}");

        // A settlement above the reservation charges the excess, tagged.
        let second = l.check(&mut conn, &key, 2).await.unwrap();
        let settled = second
            .into_charge()
            .unwrap()
            .settle(&mut conn, 5)
            .await
            .unwrap()
            .settled()
            .unwrap();
        assert_eq!(settled.state.remaining, 4, "{algorithm}: {settled:?}");
        assert_eq!(
            state_fields(d, &key).await.get("by"),
            Some(&ours),
            "{algorithm}"
        );
        if algorithm == Algorithm::TokenBucket {
            let grant = l.check_at_most(&mut conn, &key, 20).await.unwrap();
            assert_eq!((grant.granted, grant.state.remaining), (4, 0));
            let fields = state_fields(d, &key).await;
            assert_eq!(fields.get("tokens").map(String::as_str), Some("0"));
            assert_eq!(fields.get("by"), Some(&ours), "{fields:?}");
            // Nothing granted: nothing written.
            let before = snapshot(d, &key).await;
            assert_eq!(
                l.check_at_most(&mut conn, &key, 20).await.unwrap().granted,
                0
            );
            assert_eq!(snapshot(d, &key).await, before);
            // A partial grant on a missing key tags the bucket it creates.
            let fresh = slot_key(&p, "fresh");
            assert_eq!(
                l.check_at_most(&mut conn, &fresh, 3).await.unwrap().granted,
                3
            );
            assert_eq!(state_fields(d, &fresh).await.get("by"), Some(&ours));
        }
        all_refused(d, &mut conn, &limiter(algorithm, 5, DAY), &key, &ours).await;
    }
}

/// `script` run raw with EVAL: its source, keys and arguments.
async fn eval(
    conn: &mut AnyConn,
    script: &str,
    keys: &[&str],
    args: &[String],
) -> redis::RedisResult<Vec<i64>> {
    let source = Scripts::get(script).unwrap().source();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(source).arg(keys.len()).arg(keys).arg(args);
    cmd.query_async(conn).await
}

fn strings(args: &[&dyn ToString]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Handles send "adopt" last after a declared change of their numbers
/// (the Rust side of that is the managed handles'); the scripts' part of
/// it, driven raw: a state of the same algorithm and other numbers is read
/// as it is and retagged at the call's write; another algorithm's is
/// refused even so; anything but "adopt" in that place is a bad argument.
async fn adopting_retags_its_own_algorithm_only(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("adopt");
    for algorithm in HASHED {
        let name = algorithm.name();
        let key = slot_key(&p, name);
        let (record, reset) = (slot_key(&p, "record"), slot_key(&p, "reset"));
        let ten = limiter(algorithm, 10, DAY);
        assert!(ten.check(&mut conn, &key, 3).await.unwrap().allowed);
        let (ten_tag, twenty_tag) = (tag(algorithm, 10, DAY), tag(algorithm, 20, DAY));
        let (a, b) = params(algorithm, 20, DAY);
        let check = format!("rate/{name}/check");
        let peek = format!("rate/{name}/peek");

        // Without "adopt", refused; a wrong last argument is refused too.
        let before = snapshot(d, &key).await;
        let err = eval(&mut conn, &check, &[&key], &strings(&[&1, &a, &b]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("NOLOCK_STATE"), "{err}");
        for bad in ["adopted", "1"] {
            let mut args = strings(&[&1, &a, &b]);
            args.push(bad.to_owned());
            let err = eval(&mut conn, &check, &[&key], &args).await.unwrap_err();
            assert_eq!(err.code(), Some("ERR"), "{err}");
            let err = eval(&mut conn, &peek, &[&key], &args).await.unwrap_err();
            assert_eq!(err.code(), Some("ERR"), "{err}");
        }
        assert_eq!(snapshot(d, &key).await, before);

        // A peek adopts for reading and writes nothing.
        let adopt = |mut v: Vec<String>| {
            v.push("adopt".to_owned());
            v
        };
        let reply = eval(&mut conn, &peek, &[&key], &adopt(strings(&[&1, &a, &b])))
            .await
            .unwrap();
        assert_eq!(reply[0], 1, "{reply:?}");
        assert_eq!(snapshot(d, &key).await, before);

        // A check adopts: reads the 3 units taken and retags.
        let reply = eval(&mut conn, &check, &[&key], &adopt(strings(&[&1, &a, &b])))
            .await
            .unwrap();
        assert_eq!(reply[0], 1, "{reply:?}");
        // The state as it was: a bucket's 7 tokens (now of 20), a window's
        // count of 3; one more taken.
        let left = match algorithm {
            Algorithm::TokenBucket => reply[2],
            _ => reply[3],
        };
        assert_eq!(
            left,
            if algorithm == Algorithm::TokenBucket {
                6
            } else {
                4
            },
            "{algorithm}: {reply:?}"
        );
        assert_eq!(state_fields(d, &key).await.get("by"), Some(&twenty_tag));
        // The old numbers are the other limit now.
        let got = ten.check(&mut conn, &key, 1).await;
        assert!(is_mismatch(&got, &key, &twenty_tag, &ten_tag), "{got:?}");

        // A refund adopts: back to the first numbers.
        let (ta, tb) = params(algorithm, 10, DAY);
        let at = server_us(d, &key).await;
        let settle = at / 1000 + 60_000;
        let refund = format!("rate/{name}/refund");
        let args = adopt(strings(&[&1, &0, &at, &1, &settle, &MAX, &ta, &tb, &1, &0]));
        let reply = eval(&mut conn, &refund, &[&key, &record, &reset], &args)
            .await
            .unwrap();
        assert_eq!((reply[0], reply[2]), (0, 1), "{algorithm}: {reply:?}");
        assert_eq!(state_fields(d, &key).await.get("by"), Some(&ten_tag));

        if algorithm == Algorithm::TokenBucket {
            let at_most = "rate/token_bucket/check_at_most";
            let args = strings(&[&2, &a, &b]);
            let err = eval(&mut conn, at_most, &[&key], &args).await.unwrap_err();
            assert_eq!(err.code(), Some("NOLOCK_STATE"), "{err}");
            let reply = eval(&mut conn, at_most, &[&key], &adopt(args))
                .await
                .unwrap();
            assert_eq!(reply[0], 2, "{reply:?}");
            assert_eq!(state_fields(d, &key).await.get("by"), Some(&twenty_tag));
        }

        // Another algorithm's hash: refused even when adopting.
        let other = slot_key(&p, &format!("other-{name}"));
        let other_algorithm = if algorithm == Algorithm::TokenBucket {
            Algorithm::SlidingWindow
        } else {
            Algorithm::TokenBucket
        };
        let other_limiter = limiter(other_algorithm, 20, DAY);
        assert!(
            other_limiter
                .check(&mut conn, &other, 1)
                .await
                .unwrap()
                .allowed
        );
        let before = snapshot(d, &other).await;
        for script in [&check, &peek] {
            let err = eval(&mut conn, script, &[&other], &adopt(strings(&[&1, &a, &b])))
                .await
                .unwrap_err();
            assert_eq!(err.code(), Some("NOLOCK_STATE"), "{script}: {err}");
        }
        let args = adopt(strings(&[&1, &0, &at, &1, &settle, &MAX, &a, &b, &1, &0]));
        let err = eval(&mut conn, &refund, &[&other, &record, &reset], &args)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("NOLOCK_STATE"), "{err}");
        assert_eq!(snapshot(d, &other).await, before);
        let _: i64 = raw(&mut d.owner(&record).await, &["DEL", &record]).await;
    }
}

/// The tag does not make foreign data acceptable: nolock's fields with a
/// foreign value, or one more field, stay a definite error (not a
/// mismatch), the key left alone: as a hash (the older form) and as the
/// tagged string.
async fn foreign_hashes_stay_foreign_with_a_tag(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("foreign_tagged");
    for algorithm in HASHED {
        let key = slot_key(&p, algorithm.name());
        let l = limiter(algorithm, 10, DAY);
        let ours = tag(algorithm, 10, DAY);
        let fields: &[&str] = match algorithm {
            Algorithm::TokenBucket => &["tokens", "at"],
            _ => &["start", "count", "previous"],
        };
        let mut owner = d.owner(&key).await;
        let shapes: Vec<Vec<(&str, &str)>> = vec![
            // A foreign value beside our tag.
            fields
                .iter()
                .map(|f| (*f, "007"))
                .chain([("by", ours.as_str())])
                .collect(),
            // One more field.
            fields
                .iter()
                .map(|f| (*f, "1"))
                .chain([("by", ours.as_str()), ("x", "1")])
                .collect(),
            // A field missing.
            fields[1..]
                .iter()
                .map(|f| (*f, "1"))
                .chain([("by", ours.as_str())])
                .collect(),
            // The tag alone.
            vec![("by", ours.as_str())],
        ];
        for shape in shapes {
            let _: i64 = raw(&mut owner, &["DEL", &key]).await;
            let mut args = vec!["HSET", key.as_str()];
            for (f, v) in &shape {
                args.push(f);
                args.push(v);
            }
            let _: () = raw(&mut owner, &args).await;
            let before = snapshot(d, &key).await;
            let got = l.check(&mut conn, &key, 1).await.map(|d| d.allowed);
            assert!(
                matches!(&got, Err(e @ Error::Redis(_)) if e.is_definite()),
                "{algorithm} {shape:?}: {got:?}"
            );
            let got = l.peek(&mut conn, &key, 1).await.map(|s| s.allowed);
            assert!(
                matches!(got, Err(Error::Redis(_))),
                "{algorithm} {shape:?}: {got:?}"
            );
            assert_eq!(snapshot(d, &key).await, before, "{algorithm} {shape:?}");
        }

        // The string form with our tag and numbers that are not nolock's:
        // each a definite error, never a mismatch, the key left alone.
        let n = fields.len();
        let numbers = |v: &[&str]| format!("{ours}:{}", v.join(":"));
        let ones = vec!["1"; n];
        let with = |i: usize, v: &'static str| {
            let mut all = ones.clone();
            all[i] = v;
            numbers(&all)
        };
        let mut strings = vec![
            numbers(&vec!["1"; n + 1]),
            numbers(&vec!["1"; n - 1]),
            format!("{ours}:"),
            format!("{ours}:{}:", ones.join(":")),
            format!("{ours}:{} ", ones.join(":")),
            format!("{ours}::{}", ones.join(":")),
        ];
        for i in 0..n {
            for bad in [
                "007",
                "-1",
                "+1",
                "1e3",
                " 1",
                "0x10",
                "1.0",
                "",
                "9007199254740992",
                "12345678901234567",
            ] {
                strings.push(with(i, bad));
            }
        }
        for value in strings {
            let _: () = raw(&mut owner, &["SET", &key, &value, "PX", "600000"]).await;
            let before = snapshot(d, &key).await;
            let got = l.check(&mut conn, &key, 1).await.map(|d| d.allowed);
            assert!(
                matches!(&got, Err(e @ Error::Redis(_)) if e.is_definite()),
                "{algorithm} {value:?}: {got:?}"
            );
            let got = l.peek(&mut conn, &key, 1).await.map(|s| s.allowed);
            assert!(
                matches!(got, Err(Error::Redis(_))),
                "{algorithm} {value:?}: {got:?}"
            );
            if algorithm == Algorithm::TokenBucket {
                let got = l.check_at_most(&mut conn, &key, 1).await.map(|g| g.granted);
                assert!(
                    matches!(&got, Err(e @ Error::Redis(_)) if e.is_definite()),
                    "{algorithm} {value:?}: {got:?}"
                );
            }
            assert_eq!(snapshot(d, &key).await, before, "{algorithm} {value:?}");
        }
    }
}

/// 64 tasks, half of them with other numbers, on one fresh key: the first
/// call to run tags it, every call of the other limit is refused, and the
/// winner admits exactly its capacity.
async fn concurrent_limits_of_other_numbers_never_share_a_key(d: &Deployment) {
    let p = prefix("race");
    let caps = [16u64, 20];
    for algorithm in HASHED {
        let key = slot_key(&p, algorithm.name());
        let limiters = caps.map(|cap| limiter(algorithm, cap, DAY));
        let tags = caps.map(|cap| tag(algorithm, cap, DAY));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = d
            .race(64, |mut conn| {
                let which = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2;
                let (key, l) = (key.clone(), limiters[which].clone());
                async move { (which, l.check(&mut conn, &key, 1).await.map(|d| d.allowed)) }
            })
            .await;
        let winner = results
            .iter()
            .find(|(_, got)| got.is_ok())
            .map(|(which, _)| *which)
            .expect("one limit wrote the key");
        let loser = 1 - winner;
        let mut admitted = 0;
        for (which, got) in &results {
            if *which == winner {
                admitted += u64::from(*got.as_ref().unwrap());
            } else {
                assert!(
                    is_mismatch(got, &key, &tags[winner], &tags[loser]),
                    "{algorithm}: {got:?}"
                );
            }
        }
        assert_eq!(admitted, caps[winner], "{algorithm}: {results:?}");
        let fields = state_fields(d, &key).await;
        assert_eq!(
            fields.get("by"),
            Some(&tags[winner]),
            "{algorithm}: {fields:?}"
        );
    }
}

async fn a_script_flush_before_a_tagged_call_is_survived(d: &Deployment) {
    let mut conn = d.conn().await;
    let p = prefix("flush");
    for algorithm in HASHED {
        let key = slot_key(&p, algorithm.name());
        let l = limiter(algorithm, 10, DAY);
        let ours = tag(algorithm, 10, DAY);
        let mut first = l.check(&mut conn, &key, 2).await.unwrap();
        d.flush_scripts_everywhere().await;
        let other = limiter(algorithm, 20, DAY);
        let got = other.check(&mut conn, &key, 1).await;
        assert!(
            is_mismatch(&got, &key, &ours, &tag(algorithm, 20, DAY)),
            "{got:?}"
        );
        d.flush_scripts_everywhere().await;
        let next = l.check(&mut conn, &key, 1).await.unwrap();
        assert_eq!((next.allowed, next.remaining), (true, 7), "{algorithm}");
        d.flush_scripts_everywhere().await;
        assert_eq!(l.peek(&mut conn, &key, 1).await.unwrap().remaining, 7);
        d.flush_scripts_everywhere().await;
        let r = first
            .charge_mut()
            .unwrap()
            .refund(&mut conn, 2)
            .await
            .unwrap();
        assert_eq!(r.credited, 2, "{algorithm}");
        assert_eq!(state_fields(d, &key).await.get("by"), Some(&ours));
    }
}
