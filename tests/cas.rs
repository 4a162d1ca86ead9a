//! `nolock::cas` against a real redis-server.
//!
//! Property tests (exact i64 arithmetic, concurrent debit/credit bounds) are
//! at the end; failing cases are kept in `tests/cas.proptest-regressions`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use nolock::cas::{self, Adjustment, Expected, Insert, Outcome, Update, Versioned, Watermark};
use nolock::{Error, MAX_VALUE_LEN};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use support::{command_calls, keys, prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    raw(conn, &["PTTL", key]).await
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

async fn connections(redis: &support::TestRedis, n: usize) -> Vec<MultiplexedConnection> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(redis.conn().await);
    }
    conns
}

fn mismatch(current: Option<&[u8]>) -> Outcome {
    Outcome::Mismatch {
        current: current.map(<[u8]>::to_vec),
    }
}

// ---------------------------------------------------------------------------
// compare-and-set, insert-if-absent, compare-and-delete, compare-and-expire

#[tokio::test]
async fn compare_and_set_writes_on_match_and_returns_the_current_value_on_mismatch() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}state", prefix("cas_set"));

    // Expected absent: creates once.
    let first = cas::compare_and_set(&mut conn, &key, Expected::Absent, "queued", None)
        .await
        .unwrap();
    assert_eq!(first, Outcome::Applied);
    assert_eq!(pttl(&mut conn, &key).await, -1, "no ttl asked, none set");
    let again = cas::compare_and_set(&mut conn, &key, Expected::Absent, "other", None)
        .await
        .unwrap();
    assert_eq!(again, mismatch(Some(b"queued")));

    // A wrong expected value: nothing written, current returned.
    let wrong = cas::compare_and_set(&mut conn, &key, Expected::value("running"), "done", None)
        .await
        .unwrap();
    assert_eq!(wrong, mismatch(Some(b"queued")));
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some(&b"queued"[..]));

    // The right one, with a TTL.
    let moved = cas::compare_and_set(
        &mut conn,
        &key,
        Expected::value("queued"),
        "running",
        Some(MINUTE),
    )
    .await
    .unwrap();
    assert!(moved.is_applied());
    let ttl = pttl(&mut conn, &key).await;
    assert!(ttl > 55_000 && ttl <= 60_000, "{ttl}");

    // No TTL given: the expiry is kept (KEEPTTL); a mismatch leaves it alone too.
    let kept = cas::compare_and_set(&mut conn, &key, Expected::value("running"), "done", None)
        .await
        .unwrap();
    assert!(kept.is_applied());
    let ttl_after = pttl(&mut conn, &key).await;
    assert!(ttl_after > 0 && ttl_after <= ttl, "{ttl_after}");
    let _ = cas::compare_and_set(&mut conn, &key, Expected::value("x"), "y", Some(MINUTE * 2))
        .await
        .unwrap();
    assert!(pttl(&mut conn, &key).await <= ttl);
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some(&b"done"[..]));

    // A value expected on a missing key: mismatch with no current value.
    let missing = format!("{key}:missing");
    let none = cas::compare_and_set(&mut conn, &missing, Expected::value("a"), "b", None)
        .await
        .unwrap();
    assert_eq!(none, mismatch(None));
    assert_eq!(get(&mut conn, &missing).await, None, "not created");
}

#[tokio::test]
async fn values_compare_byte_for_byte() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}bin", prefix("cas_bytes"));

    let binary: Vec<u8> = vec![0, 255, 0, b'\n', 0xC3, 0x28];
    assert!(
        cas::compare_and_set(&mut conn, &key, Expected::Absent, &binary, None)
            .await
            .unwrap()
            .is_applied()
    );
    // A prefix, or the same bytes plus a NUL, is not equal.
    for near in [&binary[..5], &[&binary[..], &[0]].concat()[..]] {
        let outcome = cas::compare_and_set(&mut conn, &key, Expected::value(near), "x", None)
            .await
            .unwrap();
        assert_eq!(outcome, mismatch(Some(&binary)));
    }
    // The empty string is a value, distinct from absent.
    assert!(
        cas::compare_and_set(&mut conn, &key, Expected::value(&binary), "", None)
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        cas::compare_and_set(&mut conn, &key, Expected::Absent, "x", None)
            .await
            .unwrap(),
        mismatch(Some(b""))
    );
    assert!(cas::compare_and_delete(&mut conn, &key, "")
        .await
        .unwrap()
        .is_applied());
}

#[tokio::test]
async fn set_if_absent_inserts_once_then_returns_the_existing_value() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("cas_absent");
    let key = format!("{p}idem");

    let first = cas::set_if_absent(&mut conn, &key, r#"{"status":201}"#, Some(MINUTE))
        .await
        .unwrap();
    assert_eq!(first, Insert::Inserted);
    assert!(first.is_inserted());
    let ttl = pttl(&mut conn, &key).await;
    assert!(ttl > 55_000, "{ttl}");

    let retry = cas::set_if_absent(&mut conn, &key, "other", Some(MINUTE * 10))
        .await
        .unwrap();
    assert_eq!(retry, Insert::Existing(br#"{"status":201}"#.to_vec()));
    assert!(pttl(&mut conn, &key).await <= ttl, "expiry untouched");

    let forever = format!("{p}forever");
    assert!(cas::set_if_absent(&mut conn, &forever, "v", None)
        .await
        .unwrap()
        .is_inserted());
    assert_eq!(pttl(&mut conn, &forever).await, -1);
}

#[tokio::test]
async fn compare_and_delete_deletes_only_the_expected_value() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}lease", prefix("cas_del"));
    let _: () = raw(&mut conn, &["SET", &key, "token-2", "PX", "60000"]).await;

    let wrong = cas::compare_and_delete(&mut conn, &key, "token-1")
        .await
        .unwrap();
    assert_eq!(wrong, mismatch(Some(b"token-2")));
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some(&b"token-2"[..]));

    let right = cas::compare_and_delete(&mut conn, &key, "token-2")
        .await
        .unwrap();
    assert_eq!(right, Outcome::Applied);
    assert_eq!(get(&mut conn, &key).await, None);

    let gone = cas::compare_and_delete(&mut conn, &key, "token-2")
        .await
        .unwrap();
    assert_eq!(gone, mismatch(None));
}

#[tokio::test]
async fn compare_and_expire_changes_only_the_expiry_of_the_expected_value() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}lease", prefix("cas_expire"));
    let _: () = raw(&mut conn, &["SET", &key, "token-1", "PX", "2000"]).await;

    let wrong = cas::compare_and_expire(&mut conn, &key, "token-9", MINUTE)
        .await
        .unwrap();
    assert_eq!(wrong, mismatch(Some(b"token-1")));
    assert!(pttl(&mut conn, &key).await <= 2000);

    let extended = cas::compare_and_expire(&mut conn, &key, "token-1", MINUTE)
        .await
        .unwrap();
    assert!(extended.is_applied());
    assert!(pttl(&mut conn, &key).await > 55_000);

    // It can shorten, too, and the key then really expires.
    let shortened = cas::compare_and_expire(&mut conn, &key, "token-1", Duration::from_millis(50))
        .await
        .unwrap();
    assert!(shortened.is_applied());
    let mut expired = false;
    for _ in 0..100 {
        if get(&mut conn, &key).await.is_none() {
            expired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(expired, "a 50 ms expiry took more than a second");
    let gone = cas::compare_and_expire(&mut conn, &key, "token-1", MINUTE)
        .await
        .unwrap();
    assert_eq!(gone, mismatch(None));
    assert_eq!(get(&mut conn, &key).await, None, "not recreated");
}

#[tokio::test]
async fn release_and_extend_still_work_on_a_server_out_of_memory() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let _: () = raw(&mut conn, &["SET", "lease", "tok"]).await;
    let _: () = raw(&mut conn, &["SET", "other", "x"]).await;
    // Any memory in use is now over the limit (maxmemory-policy noeviction).
    let _: () = raw(&mut conn, &["CONFIG", "SET", "maxmemory", "1"]).await;

    let err = cas::compare_and_set(&mut conn, "other", Expected::value("x"), "y", None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Redis(_)) && err.is_definite(), "{err}");

    let extended = cas::compare_and_expire(&mut conn, "lease", "tok", MINUTE)
        .await
        .unwrap();
    assert!(extended.is_applied(), "allow-oom");
    let released = cas::compare_and_delete(&mut conn, "lease", "tok")
        .await
        .unwrap();
    assert!(released.is_applied(), "allow-oom");
    assert_eq!(keys(&mut conn, "*").await, ["other"]);
    assert_eq!(get(&mut conn, "other").await.as_deref(), Some(&b"x"[..]));
}

#[tokio::test]
async fn keys_of_another_type_are_definite_errors_and_left_alone() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("cas_wrongtype");
    let list = format!("{p}list");
    let text = format!("{p}text");
    let _: () = raw(&mut conn, &["RPUSH", &list, "a"]).await;
    let _: () = raw(&mut conn, &["SET", &text, "hello"]).await;

    let errors = [
        cas::compare_and_set(&mut conn, &list, Expected::Absent, "v", None)
            .await
            .map(drop),
        cas::set_if_absent(&mut conn, &list, "v", None)
            .await
            .map(drop),
        cas::compare_and_delete(&mut conn, &list, "a")
            .await
            .map(drop),
        cas::compare_and_expire(&mut conn, &list, "a", MINUTE)
            .await
            .map(drop),
        cas::get_versioned::<u32, _>(&mut conn, &list)
            .await
            .map(drop),
        cas::set_if_version(&mut conn, &list, 0, &1).await.map(drop),
        cas::get_versioned::<u32, _>(&mut conn, &text)
            .await
            .map(drop),
        cas::set_if_version(&mut conn, &text, 0, &1).await.map(drop),
        cas::set_if_greater(&mut conn, &list, 1).await.map(drop),
        cas::set_if_less(&mut conn, &text, 1).await.map(drop),
        cas::debit(&mut conn, &list, 1).await.map(drop),
        cas::credit(&mut conn, &text, 1, None).await.map(drop),
    ];
    for (i, result) in errors.into_iter().enumerate() {
        let err = result.expect_err("an error");
        assert!(matches!(err, Error::Redis(_)), "#{i}: {err}");
        assert!(err.is_definite() && !err.is_invalid_input(), "#{i}");
    }
    let items: Vec<String> = raw(&mut conn, &["LRANGE", &list, "0", "-1"]).await;
    assert_eq!(items, ["a"]);
    assert_eq!(get(&mut conn, &text).await.as_deref(), Some(&b"hello"[..]));
    assert_eq!(pttl(&mut conn, &list).await, -1);
    assert_eq!(pttl(&mut conn, &text).await, -1);
}

// ---------------------------------------------------------------------------
// versioned values

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Profile {
    name: String,
    tags: Vec<String>,
    limits: BTreeMap<String, u64>,
    nickname: Option<String>,
    score: f64,
}

fn profile(name: &str) -> Profile {
    Profile {
        name: name.to_owned(),
        tags: vec!["ünïcödé ✓".into(), "quote \" and \\ backslash".into()],
        limits: [("daily".to_owned(), u64::MAX), ("hourly".to_owned(), 0)].into(),
        nickname: None,
        score: -1.5,
    }
}

#[tokio::test]
async fn versioned_values_round_trip_a_struct_and_count_every_write() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}profile", prefix("cas_versioned"));

    assert_eq!(
        cas::get_versioned::<Profile, _>(&mut conn, &key)
            .await
            .unwrap(),
        None
    );
    let created = cas::set_if_version(&mut conn, &key, 0, &profile("ada"))
        .await
        .unwrap();
    assert_eq!(created, Update::Written { version: 1 });
    let read = cas::get_versioned::<Profile, _>(&mut conn, &key)
        .await
        .unwrap();
    assert_eq!(
        read,
        Some(Versioned {
            value: profile("ada"),
            version: 1
        })
    );

    // The documented layout: one hash, `v` = JSON, `ver` = version.
    let fields: BTreeMap<String, String> = raw(&mut conn, &["HGETALL", &key]).await;
    assert_eq!(fields.keys().collect::<Vec<_>>(), ["v", "ver"]);
    assert_eq!(fields["ver"], "1");
    assert_eq!(
        serde_json::from_str::<Profile>(&fields["v"]).unwrap(),
        profile("ada")
    );

    let mut edited = profile("ada");
    edited.nickname = Some("countess".into());
    edited.tags.push("second".into());
    let second = cas::set_if_version(&mut conn, &key, 1, &edited)
        .await
        .unwrap();
    assert!(second.is_written());
    assert_eq!(second, Update::Written { version: 2 });

    // A writer still on version 1 gets the current value and version back.
    let stale = cas::set_if_version(&mut conn, &key, 1, &profile("eve"))
        .await
        .unwrap();
    assert_eq!(
        stale,
        Update::Conflict {
            current: Some(Versioned {
                value: edited.clone(),
                version: 2
            })
        }
    );
    // So does one that thinks it is creating.
    let create_again = cas::set_if_version(&mut conn, &key, 0, &profile("eve"))
        .await
        .unwrap();
    assert!(!create_again.is_written());
    let now = cas::get_versioned::<Profile, _>(&mut conn, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((now.value, now.version), (edited, 2));

    // A write keeps an expiry that someone set on the key.
    let _: () = raw(&mut conn, &["PEXPIRE", &key, "60000"]).await;
    let third = cas::set_if_version(&mut conn, &key, 2, &profile("bob"))
        .await
        .unwrap();
    assert_eq!(third, Update::Written { version: 3 });
    assert!(pttl(&mut conn, &key).await > 0);

    // Expecting a version of a key that does not exist: conflict, nothing created.
    let missing = format!("{key}:missing");
    let none = cas::set_if_version(&mut conn, &missing, 4, &profile("x"))
        .await
        .unwrap();
    assert_eq!(none, Update::Conflict { current: None });
    assert!(keys(&mut conn, &missing).await.is_empty());
}

#[tokio::test]
async fn versions_past_two_to_the_53_stay_exact_and_i64_max_is_an_overflow() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}v", prefix("cas_big_version"));

    // 2^53 + 1: a double would round it to 2^53.
    let _: () = raw(
        &mut conn,
        &["HSET", &key, "v", "7", "ver", "9007199254740993"],
    )
    .await;
    let read = cas::get_versioned::<u32, _>(&mut conn, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.version, 9_007_199_254_740_993);
    let stale = cas::set_if_version(&mut conn, &key, 9_007_199_254_740_992, &8)
        .await
        .unwrap();
    assert!(!stale.is_written(), "2^53 must not match 2^53 + 1");
    let written = cas::set_if_version(&mut conn, &key, 9_007_199_254_740_993, &8)
        .await
        .unwrap();
    assert_eq!(
        written,
        Update::Written {
            version: 9_007_199_254_740_994
        }
    );

    let max = i64::MAX.to_string();
    let _: () = raw(&mut conn, &["HSET", &key, "v", "7", "ver", &max]).await;
    let err = cas::set_if_version(&mut conn, &key, i64::MAX as u64, &9)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Overflow {
                what: "version",
                value: i64::MAX,
                delta: 1
            }
        ),
        "{err}"
    );
    assert!(err.is_definite());
    let fields: BTreeMap<String, String> = raw(&mut conn, &["HGETALL", &key]).await;
    assert_eq!(
        (fields["v"].as_str(), &fields["ver"]),
        ("7", &max),
        "nothing written"
    );
}

#[tokio::test]
async fn stored_data_of_the_wrong_shape_is_a_typed_error() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("cas_shape");

    // JSON, but not a Profile: Decode, on read and on a conflict.
    let other = format!("{p}other");
    assert!(
        cas::set_if_version(&mut conn, &other, 0, &"just text".to_owned())
            .await
            .unwrap()
            .is_written()
    );
    let err = cas::get_versioned::<Profile, _>(&mut conn, &other)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Decode(_)) && err.is_definite(),
        "{err}"
    );
    let err = cas::set_if_version(&mut conn, &other, 0, &profile("a"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Decode(_)), "{err}");
    let fields: BTreeMap<String, String> = raw(&mut conn, &["HGETALL", &other]).await;
    assert_eq!(fields["ver"], "1", "nothing written");

    // A hash that set_if_version did not write: a script error, untouched.
    let foreign = format!("{p}foreign");
    let _: () = raw(&mut conn, &["HSET", &foreign, "name", "x"]).await;
    for ver in ["", "01", "-1", "abc"] {
        if !ver.is_empty() {
            let _: () = raw(&mut conn, &["HSET", &foreign, "v", "1", "ver", ver]).await;
        }
        let err = cas::get_versioned::<u32, _>(&mut conn, &foreign)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "{ver}: {err}");
        let err = cas::set_if_version(&mut conn, &foreign, 0, &1)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "{ver}: {err}");
    }
    let name: String = raw(&mut conn, &["HGET", &foreign, "name"]).await;
    assert_eq!(name, "x");
}

// ---------------------------------------------------------------------------
// monotonic integers

#[tokio::test]
async fn set_if_greater_and_less_only_move_one_way() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("cas_monotonic");
    let high = format!("{p}high");
    let low = format!("{p}low");

    let mark = |applied, value| Watermark { applied, value };
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, 10).await.unwrap(),
        mark(true, 10)
    );
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, 7).await.unwrap(),
        mark(false, 10)
    );
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, 10).await.unwrap(),
        mark(false, 10),
        "equal is not greater"
    );
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, 12).await.unwrap(),
        mark(true, 12)
    );

    assert_eq!(
        cas::set_if_less(&mut conn, &low, 10).await.unwrap(),
        mark(true, 10)
    );
    assert_eq!(
        cas::set_if_less(&mut conn, &low, 12).await.unwrap(),
        mark(false, 10)
    );
    assert_eq!(
        cas::set_if_less(&mut conn, &low, -3).await.unwrap(),
        mark(true, -3)
    );
    assert_eq!(
        cas::set_if_less(&mut conn, &low, i64::MIN).await.unwrap(),
        mark(true, i64::MIN)
    );
    assert_eq!(
        cas::set_if_less(&mut conn, &low, i64::MIN).await.unwrap(),
        mark(false, i64::MIN)
    );

    // Exact where doubles are not: 2^53 and 2^53 + 1, i64::MAX - 1 and i64::MAX.
    let _: () = raw(&mut conn, &["SET", &high, "9007199254740992"]).await;
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, 9_007_199_254_740_993)
            .await
            .unwrap(),
        mark(true, 9_007_199_254_740_993)
    );
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, i64::MAX - 1)
            .await
            .unwrap(),
        mark(true, i64::MAX - 1)
    );
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, i64::MAX)
            .await
            .unwrap(),
        mark(true, i64::MAX)
    );
    assert_eq!(
        cas::set_if_greater(&mut conn, &high, i64::MAX - 1)
            .await
            .unwrap(),
        mark(false, i64::MAX)
    );
    let stored: String = raw(&mut conn, &["GET", &high]).await;
    assert_eq!(stored, i64::MAX.to_string());

    // The expiry is kept.
    let _: () = raw(&mut conn, &["SET", &low, "5", "PX", "60000"]).await;
    assert_eq!(
        cas::set_if_less(&mut conn, &low, 4).await.unwrap(),
        mark(true, 4)
    );
    assert!(pttl(&mut conn, &low).await > 0);
}

#[tokio::test]
async fn non_integers_are_errors_and_left_alone() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}n", prefix("cas_nonint"));
    // Forms INCRBY rejects too, and one past i64::MAX.
    for stored in [
        "abc",
        "1.5",
        "007",
        "+1",
        "-0",
        " 1",
        "",
        "9223372036854775808",
    ] {
        let _: () = raw(&mut conn, &["SET", &key, stored]).await;
        for result in [
            cas::set_if_greater(&mut conn, &key, 1).await.map(drop),
            cas::set_if_less(&mut conn, &key, 1).await.map(drop),
            cas::debit(&mut conn, &key, 1).await.map(drop),
            cas::credit(&mut conn, &key, 1, None).await.map(drop),
            cas::adjust(&mut conn, &key, 0, ..).await.map(drop),
        ] {
            let err = result.expect_err(stored);
            assert!(matches!(err, Error::Redis(_)), "{stored:?}: {err}");
        }
        let now: String = raw(&mut conn, &["GET", &key]).await;
        assert_eq!(now, stored);
    }
}

// ---------------------------------------------------------------------------
// guarded arithmetic

#[tokio::test]
async fn debit_and_credit_apply_only_within_their_bounds() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("cas_balance");
    let key = format!("{p}credits");

    // A missing key is 0: a debit is refused and creates nothing.
    assert_eq!(
        cas::debit(&mut conn, &key, 1).await.unwrap(),
        Adjustment::Insufficient { balance: 0 }
    );
    assert!(keys(&mut conn, &format!("{p}*")).await.is_empty());

    assert_eq!(
        cas::credit(&mut conn, &key, 10, Some(100)).await.unwrap(),
        Adjustment::Applied { balance: 10 }
    );
    assert_eq!(pttl(&mut conn, &key).await, -1, "created without expiry");
    assert_eq!(
        cas::debit(&mut conn, &key, 7).await.unwrap(),
        Adjustment::Applied { balance: 3 }
    );
    let refused = cas::debit(&mut conn, &key, 7).await.unwrap();
    assert_eq!(refused, Adjustment::Insufficient { balance: 3 });
    assert!(!refused.is_applied());
    assert_eq!(
        cas::debit(&mut conn, &key, 3).await.unwrap(),
        Adjustment::Applied { balance: 0 },
        "down to exactly the floor"
    );
    assert_eq!(
        cas::credit(&mut conn, &key, 100, Some(100)).await.unwrap(),
        Adjustment::Applied { balance: 100 },
        "up to exactly the ceiling"
    );
    let over = cas::credit(&mut conn, &key, 1, Some(100)).await.unwrap();
    assert_eq!(over, Adjustment::AboveCeiling { balance: 100 });
    assert_eq!(over.balance(), 100);
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, "100");

    // Keeps an expiry that was set.
    let _: () = raw(&mut conn, &["PEXPIRE", &key, "60000"]).await;
    assert!(cas::debit(&mut conn, &key, 1).await.unwrap().is_applied());
    assert!(pttl(&mut conn, &key).await > 0);

    // The general form: an overdraft line, a level kept in both directions,
    // and a zero delta that only reads.
    let wallet = format!("{p}wallet");
    assert_eq!(
        cas::adjust(&mut conn, &wallet, -600, -1000..)
            .await
            .unwrap(),
        Adjustment::Applied { balance: -600 }
    );
    assert_eq!(
        cas::adjust(&mut conn, &wallet, -401, -1000..)
            .await
            .unwrap(),
        Adjustment::Insufficient { balance: -600 }
    );
    assert_eq!(
        cas::adjust(&mut conn, &wallet, 0, 0..=0).await.unwrap(),
        Adjustment::Applied { balance: -600 }
    );
    // Below the floor already: a credit may still move it back up; a debit may not.
    assert_eq!(
        cas::adjust(&mut conn, &wallet, 100, 0..=100).await.unwrap(),
        Adjustment::Applied { balance: -500 }
    );
    assert_eq!(
        cas::adjust(&mut conn, &wallet, -1, 0..=100).await.unwrap(),
        Adjustment::Insufficient { balance: -500 }
    );
    assert_eq!(
        cas::adjust(&mut conn, &wallet, 601, 0..=100).await.unwrap(),
        Adjustment::AboveCeiling { balance: -500 }
    );
    assert_eq!(
        cas::adjust(&mut conn, &wallet, 600, 0..=100).await.unwrap(),
        Adjustment::Applied { balance: 100 }
    );
    let missing = format!("{p}missing");
    assert_eq!(
        cas::adjust(&mut conn, &missing, 0, ..).await.unwrap(),
        Adjustment::Applied { balance: 0 }
    );
    assert!(
        keys(&mut conn, &missing).await.is_empty(),
        "a read creates nothing"
    );
}

#[tokio::test]
async fn overflow_near_the_i64_limits_is_an_error_and_writes_nothing() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}b", prefix("cas_overflow"));

    let near_max = (i64::MAX - 5).to_string();
    let _: () = raw(&mut conn, &["SET", &key, &near_max, "PX", "60000"]).await;
    for result in [
        cas::credit(&mut conn, &key, 6, None).await,
        cas::credit(&mut conn, &key, i64::MAX as u64, Some(i64::MAX)).await,
        cas::adjust(&mut conn, &key, 10, ..).await,
    ] {
        let err = result.unwrap_err();
        assert!(
            matches!(err, Error::Overflow { what: "balance", value, delta: 6.. } if value == i64::MAX - 5),
            "{err}"
        );
        assert!(err.is_definite() && !err.is_invalid_input());
    }
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, near_max, "nothing written");
    assert!(pttl(&mut conn, &key).await > 0, "expiry untouched");
    // Right up to the limit is fine.
    assert_eq!(
        cas::credit(&mut conn, &key, 5, None).await.unwrap(),
        Adjustment::Applied { balance: i64::MAX }
    );

    let near_min = (i64::MIN + 5).to_string();
    let _: () = raw(&mut conn, &["SET", &key, &near_min]).await;
    let err = cas::adjust(&mut conn, &key, -6, ..).await.unwrap_err();
    assert!(matches!(err, Error::Overflow { value, delta: -6, .. } if value == i64::MIN + 5));
    let err = cas::adjust(&mut conn, &key, i64::MIN, ..)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }));
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, near_min, "nothing written");
    assert_eq!(
        cas::adjust(&mut conn, &key, -5, ..).await.unwrap(),
        Adjustment::Applied { balance: i64::MIN }
    );
    // A result outside i64 is an overflow whatever the bounds, even where
    // the floor would refuse it anyway.
    assert!(matches!(
        cas::debit(&mut conn, &key, 1).await,
        Err(Error::Overflow {
            value: i64::MIN,
            delta: -1,
            ..
        })
    ));
    assert_eq!(
        cas::debit(&mut conn, &key, 1 << 62).await.unwrap_err().to_string(),
        "balance -9223372036854775808 -4611686018427387904 would overflow a 64-bit signed integer; nothing was written"
    );
    assert_eq!(
        cas::credit(&mut conn, &key, i64::MAX as u64, None)
            .await
            .unwrap(),
        Adjustment::Applied { balance: -1 }
    );
}

// ---------------------------------------------------------------------------
// input checks, SCRIPT FLUSH

#[tokio::test]
async fn bad_input_is_a_typed_error_and_nothing_is_sent() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let sent = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let mut n = 0;
            for cmd in ["evalsha", "evalsha_ro", "eval", "eval_ro"] {
                n += command_calls(&mut conn, cmd).await;
            }
            n
        }
    };
    let before = sent(&mut conn).await;
    // Zeroed pages from the allocator: the length is checked, the bytes never touched.
    let huge = vec![0u8; MAX_VALUE_LEN + 1];
    let map_with_tuple_keys: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let c = &mut conn;

    macro_rules! rejects {
        ($call:expr, $pattern:pat) => {{
            let err = $call.await.map(drop).unwrap_err();
            assert!(matches!(err, $pattern), "{}: {err}", stringify!($call));
            assert!(err.is_invalid_input(), "{}", stringify!($call));
            assert!(err.is_definite());
        }};
    }
    rejects!(
        cas::compare_and_set(c, "", Expected::Absent, "v", None),
        Error::EmptyKey
    );
    rejects!(
        cas::compare_and_set(c, "k", Expected::Absent, "v", Some(Duration::ZERO)),
        Error::ZeroDuration { what: "ttl" }
    );
    rejects!(
        cas::compare_and_set(
            c,
            "k",
            Expected::Absent,
            "v",
            Some(Duration::from_micros(999))
        ),
        Error::ZeroDuration { what: "ttl" }
    );
    rejects!(
        cas::compare_and_set(c, "k", Expected::Absent, "v", Some(Duration::MAX)),
        Error::DurationTooLong { what: "ttl", .. }
    );
    rejects!(
        cas::compare_and_set(c, "k", Expected::Absent, &huge, None),
        Error::ValueTooLarge { what: "value", .. }
    );
    rejects!(
        cas::compare_and_set(c, "k", Expected::value(&huge), "v", None),
        Error::ValueTooLarge {
            what: "expected",
            ..
        }
    );
    rejects!(cas::set_if_absent(c, "", "v", None), Error::EmptyKey);
    rejects!(
        cas::set_if_absent(c, "k", "v", Some(Duration::ZERO)),
        Error::ZeroDuration { what: "ttl" }
    );
    rejects!(
        cas::set_if_absent(c, "k", &huge, None),
        Error::ValueTooLarge { .. }
    );
    rejects!(cas::compare_and_delete(c, "", "v"), Error::EmptyKey);
    rejects!(
        cas::compare_and_delete(c, "k", &huge),
        Error::ValueTooLarge { .. }
    );
    rejects!(cas::compare_and_expire(c, "", "v", MINUTE), Error::EmptyKey);
    rejects!(
        cas::compare_and_expire(c, "k", "v", Duration::ZERO),
        Error::ZeroDuration { what: "ttl" }
    );
    rejects!(
        cas::compare_and_expire(c, "k", "v", Duration::MAX),
        Error::DurationTooLong { .. }
    );
    rejects!(cas::get_versioned::<u32, _>(c, ""), Error::EmptyKey);
    rejects!(cas::set_if_version(c, "", 0, &1), Error::EmptyKey);
    rejects!(
        cas::set_if_version(c, "k", 1 << 63, &1),
        Error::OutOfRange {
            what: "version",
            ..
        }
    );
    rejects!(
        cas::set_if_version(c, "k", 0, &map_with_tuple_keys),
        Error::Encode(_)
    );
    rejects!(cas::set_if_greater(c, "", 1), Error::EmptyKey);
    rejects!(cas::set_if_less(c, "", 1), Error::EmptyKey);
    rejects!(cas::debit(c, "", 1), Error::EmptyKey);
    rejects!(cas::debit(c, "k", 0), Error::ZeroLimit { what: "amount" });
    rejects!(
        cas::debit(c, "k", u64::MAX),
        Error::OutOfRange { what: "amount", .. }
    );
    rejects!(
        cas::credit(c, "k", 0, None),
        Error::ZeroLimit { what: "amount" }
    );
    rejects!(
        cas::credit(c, "k", 1 << 63, None),
        Error::OutOfRange { what: "amount", .. }
    );
    rejects!(cas::adjust(c, "", 1, ..), Error::EmptyKey);
    rejects!(
        cas::adjust(c, "k", 1, 5..5),
        Error::EmptyRange { what: "bounds" }
    );
    rejects!(
        cas::adjust(c, "k", -1, ..i64::MIN),
        Error::EmptyRange { .. }
    );

    let dbsize: i64 = raw(&mut conn, &["DBSIZE"]).await;
    assert_eq!(dbsize, 0, "nothing written");
    assert_eq!(sent(&mut conn).await, before, "no script call was sent");
}

#[tokio::test]
async fn every_operation_works_after_script_flush() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let p = prefix("cas_flush");
    let (s, v, n) = (format!("{p}s"), format!("{p}v"), format!("{p}n"));
    let loaded = nolock::Scripts::load(&mut conn).await.unwrap();
    let loads_before = command_calls(&mut conn, "script|load").await;

    let mut evals = 0;
    let mut flushed = |conn: &mut MultiplexedConnection| {
        evals += 1;
        let mut conn = conn.clone();
        async move {
            let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
        }
    };
    let c = &mut conn;

    flushed(c).await;
    assert!(cas::set_if_absent(c, &s, "a", None)
        .await
        .unwrap()
        .is_inserted());
    flushed(c).await;
    assert!(cas::compare_and_set(c, &s, Expected::value("a"), "b", None)
        .await
        .unwrap()
        .is_applied());
    flushed(c).await;
    assert!(cas::compare_and_expire(c, &s, "b", MINUTE)
        .await
        .unwrap()
        .is_applied());
    flushed(c).await;
    assert!(cas::compare_and_delete(c, &s, "b")
        .await
        .unwrap()
        .is_applied());
    flushed(c).await;
    assert_eq!(
        cas::set_if_version(c, &v, 0, &"x".to_owned())
            .await
            .unwrap(),
        Update::Written { version: 1 }
    );
    flushed(c).await;
    let read = cas::get_versioned::<String, _>(c, &v)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((read.value.as_str(), read.version), ("x", 1));
    flushed(c).await;
    assert!(cas::set_if_greater(c, &n, 5).await.unwrap().applied);
    flushed(c).await;
    assert!(cas::set_if_less(c, &n, 3).await.unwrap().applied);
    flushed(c).await;
    assert_eq!(
        cas::credit(c, &n, 4, None).await.unwrap(),
        Adjustment::Applied { balance: 7 }
    );
    flushed(c).await;
    assert_eq!(
        cas::debit(c, &n, 7).await.unwrap(),
        Adjustment::Applied { balance: 0 }
    );

    // Each call after a flush ran exactly once, after a SCRIPT LOAD of its
    // script (never as EVAL / EVAL_RO, which the EVAL LRU could evict).
    // (On Valkey >= 8.1 compare_and_set is the native SET IFEQ: no script.)
    let native = u64::from(loaded.set_ifeq);
    let loads = command_calls(&mut conn, "script|load").await - loads_before;
    let eval = command_calls(&mut conn, "eval").await;
    let eval_ro = command_calls(&mut conn, "eval_ro").await;
    assert_eq!((loads, eval, eval_ro), (evals - native, 0, 0));
    let stored: String = raw(&mut conn, &["GET", &n]).await;
    assert_eq!(stored, "0");
}

// ---------------------------------------------------------------------------
// races

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hundred_writers_of_the_same_version_have_exactly_one_winner() {
    let redis = support::redis();
    let key = format!("{}doc", prefix("cas_version_race"));
    let mut conn = redis.conn().await;
    assert!(
        cas::set_if_version(&mut conn, &key, 0, &"initial".to_owned())
            .await
            .unwrap()
            .is_written()
    );

    let conns = connections(&redis, 8).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let mut conn = conns[i % conns.len()].clone();
            let (key, barrier) = (key.clone(), barrier.clone());
            tokio::spawn(async move {
                let read = cas::get_versioned::<String, _>(&mut conn, &key)
                    .await
                    .unwrap()
                    .unwrap();
                barrier.wait().await; // every task has read before any writes
                let mine = format!("writer {i}");
                let update = cas::set_if_version(&mut conn, &key, read.version, &mine)
                    .await
                    .unwrap();
                (read.version, mine, update)
            })
        })
        .collect();

    let mut winners = Vec::new();
    let mut conflicts = Vec::new();
    for task in tasks {
        let (read, mine, update) = task.await.unwrap();
        assert_eq!(read, 1, "everyone read the same version");
        match update {
            Update::Written { version } => winners.push((mine, version)),
            Update::Conflict { current } => conflicts.push(current),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner");
    let (winner, version) = winners.pop().unwrap();
    assert_eq!(version, 2);
    assert_eq!(conflicts.len(), 99);
    for current in conflicts {
        assert_eq!(
            current,
            Some(Versioned {
                value: winner.clone(),
                version: 2
            })
        );
    }
    let stored = cas::get_versioned::<String, _>(&mut conn, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stored.value, stored.version), (winner, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_debits_never_overdraw() {
    let redis = support::redis();
    let key = format!("{}balance", prefix("cas_debit_race"));
    let mut conn = redis.conn().await;
    let _: () = raw(&mut conn, &["SET", &key, "1000"]).await;

    let conns = connections(&redis, 8).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(200));
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let mut conn = conns[i % conns.len()].clone();
            let (key, barrier) = (key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                cas::debit(&mut conn, &key, 7).await.unwrap()
            })
        })
        .collect();

    let mut applied = BTreeSet::new();
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            Adjustment::Applied { balance } => {
                assert!(balance >= 0);
                assert!(applied.insert(balance), "balance {balance} seen twice");
            }
            Adjustment::Insufficient { balance } => {
                assert!((0..7).contains(&balance), "refused only when short");
                refused += 1;
            }
            other => panic!("a debit is only checked against its floor: {other:?}"),
        }
    }
    let successes = applied.len() as i64;
    assert_eq!(successes, 1000 / 7, "floor(1000 / 7) debits fit");
    assert_eq!(refused, 200 - successes);
    // Every intermediate balance was reported exactly once.
    assert_eq!(
        applied,
        (1..=successes)
            .map(|k| 1000 - 7 * k)
            .collect::<BTreeSet<_>>()
    );
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(stored, (1000 - 7 * successes).to_string());
    assert_eq!(stored, "6");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_inserts_and_swaps_have_exactly_one_winner() {
    let redis = support::redis();
    let p = prefix("cas_swap_race");
    let (claim, state) = (format!("{p}claim"), format!("{p}state"));
    let mut conn = redis.conn().await;
    let _: () = raw(&mut conn, &["SET", &state, "queued"]).await;

    let conns = connections(&redis, 8).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let mut conn = conns[i % conns.len()].clone();
            let (claim, state, barrier) = (claim.clone(), state.clone(), barrier.clone());
            tokio::spawn(async move {
                let me = format!("worker-{i}");
                barrier.wait().await;
                let insert = cas::set_if_absent(&mut conn, &claim, &me, Some(MINUTE))
                    .await
                    .unwrap();
                let swap =
                    cas::compare_and_set(&mut conn, &state, Expected::value("queued"), &me, None)
                        .await
                        .unwrap();
                (me, insert, swap)
            })
        })
        .collect();

    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let claimed: Vec<_> = results
        .iter()
        .filter(|(_, insert, _)| insert.is_inserted())
        .map(|(me, _, _)| me.clone())
        .collect();
    let swapped: Vec<_> = results
        .iter()
        .filter(|(_, _, swap)| swap.is_applied())
        .map(|(me, _, _)| me.clone())
        .collect();
    assert_eq!((claimed.len(), swapped.len()), (1, 1));
    for (_, insert, swap) in &results {
        if !insert.is_inserted() {
            assert_eq!(*insert, Insert::Existing(claimed[0].clone().into_bytes()));
        }
        if !swap.is_applied() {
            assert_eq!(*swap, mismatch(Some(swapped[0].as_bytes())));
        }
    }
}

// ---------------------------------------------------------------------------
// properties

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Integers biased to the places where doubles, limbs and wrapping go wrong.
fn edgy_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        -1000i64..1000,
        (i64::MAX - 1000)..=i64::MAX,
        i64::MIN..=(i64::MIN + 1000),
        ((1i64 << 53) - 1000)..((1i64 << 53) + 1000),
        (-(1i64 << 53) - 1000)..(-(1i64 << 53) + 1000),
        // Next to multiples of 10^9, where the script's limbs carry.
        (-9_223_372_035i64..9_223_372_035, -3i64..3).prop_map(|(hi, d)| hi * 1_000_000_000 + d),
        Just(0),
        Just(i64::MAX),
        Just(i64::MIN),
    ]
}

/// What `adjust` must do, computed in i128; `None` for an overflow.
fn model(balance: i64, delta: i64, floor: i64, ceiling: i64) -> Option<Adjustment> {
    let new = i64::try_from(i128::from(balance) + i128::from(delta)).ok()?;
    Some(if delta < 0 && new < floor {
        Adjustment::Insufficient { balance }
    } else if delta > 0 && new > ceiling {
        Adjustment::AboveCeiling { balance }
    } else {
        Adjustment::Applied { balance: new }
    })
}

/// The script's 64-bit arithmetic (two base-10^9 limbs in Lua doubles) agrees
/// with exact arithmetic everywhere, including next to 2^53 and the i64
/// limits; refusals and overflows write nothing; the monotonic scripts
/// compare exactly too.
#[test]
fn adjust_and_watermarks_match_exact_i64_arithmetic() {
    let server = RedisServer::start();
    let rt = runtime();
    let conn = rt.block_on(server.conn());
    let key = format!("{}b", prefix("cas_prop_exact"));
    let strategy = (edgy_i64(), edgy_i64(), edgy_i64(), edgy_i64());
    runner(512)
        .run(&strategy, |(balance, delta, a, b)| {
            let (floor, ceiling) = (a.min(b), a.max(b));
            let mut conn = conn.clone();
            rt.block_on(async {
                let _: () = raw(&mut conn, &["SET", &key, &balance.to_string()]).await;
                let got = cas::adjust(&mut conn, &key, delta, floor..=ceiling).await;
                let stored: String = raw(&mut conn, &["GET", &key]).await;
                match model(balance, delta, floor, ceiling) {
                    None => {
                        prop_assert!(
                            matches!(got, Err(Error::Overflow { value, delta: d, .. }) if value == balance && d == delta),
                            "{:?}",
                            got
                        );
                        prop_assert_eq!(stored, balance.to_string());
                    }
                    Some(expected) => {
                        prop_assert_eq!(got.as_ref().ok(), Some(&expected), "{:?}", got);
                        prop_assert_eq!(stored, expected.balance().to_string());
                    }
                }

                let _: () = raw(&mut conn, &["SET", &key, &balance.to_string()]).await;
                let high = cas::set_if_greater(&mut conn, &key, delta).await.unwrap();
                prop_assert_eq!(high.applied, delta > balance);
                prop_assert_eq!(high.value, balance.max(delta));
                let low = cas::set_if_less(&mut conn, &key, a).await.unwrap();
                prop_assert_eq!(low.applied, a < high.value);
                prop_assert_eq!(low.value, high.value.min(a));
                let stored: String = raw(&mut conn, &["GET", &key]).await;
                prop_assert_eq!(stored, low.value.to_string());
                Ok(())
            })
        })
        .unwrap();
}

/// Every sum of two values next to multiples of 10^9 (where the script's
/// limbs carry and borrow), against exact arithmetic: a table, because
/// random draws rarely land on an exact carry.
#[tokio::test]
async fn limb_carries_and_borrows_are_exact() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let key = format!("{}b", prefix("cas_limbs"));
    let values: Vec<i64> = [-9_223_372_036i64, -2, -1, 0, 1, 2, 9_223_372_035]
        .iter()
        .flat_map(|hi| (-2..=2).map(move |d| hi * 1_000_000_000 + d))
        .chain([i64::MIN, i64::MIN + 1, i64::MAX - 1, i64::MAX])
        .collect();
    for &balance in &values {
        let _: () = raw(&mut conn, &["SET", &key, &balance.to_string()]).await;
        for &delta in &values {
            let got = cas::adjust(&mut conn, &key, delta, ..).await;
            let stored: String = raw(&mut conn, &["GET", &key]).await;
            match model(balance, delta, i64::MIN, i64::MAX) {
                None => {
                    assert!(
                        matches!(got, Err(Error::Overflow { .. })),
                        "{balance} {delta:+}: {got:?}"
                    );
                    assert_eq!(stored, balance.to_string());
                }
                Some(expected) => {
                    assert_eq!(got.unwrap(), expected, "{balance} {delta:+}");
                    assert_eq!(stored, expected.balance().to_string());
                    let _: () = raw(&mut conn, &["SET", &key, &balance.to_string()]).await;
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
struct BalanceOp {
    credit: bool,
    amount: u64,
    delay_us: u64,
    conn: usize,
}

/// Concurrent debits and credits over several connections: every reported
/// balance is within [0, ceiling], every refusal was justified by the
/// balance it saw, and the final balance is exactly the start plus the
/// applied credits minus the applied debits.
#[test]
fn concurrent_debits_and_credits_stay_within_bounds() {
    let server = RedisServer::start();
    let rt = runtime();
    let conns = rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..4 {
            conns.push(server.conn().await);
        }
        conns
    });
    let scenario = (1i64..200).prop_flat_map(|ceiling| {
        let op = (any::<bool>(), 1..=(ceiling as u64), 0u64..1500, 0usize..4).prop_map(
            |(credit, amount, delay_us, conn)| BalanceOp {
                credit,
                amount,
                delay_us,
                conn,
            },
        );
        (Just(ceiling), 0..=ceiling, prop::collection::vec(op, 1..60))
    });
    runner(48)
        .run(&scenario, |(ceiling, start, ops)| {
            let key = format!("{}b", prefix("cas_prop_bounds"));
            let results = rt.block_on(async {
                let mut conn = conns[0].clone();
                let _: () = raw(&mut conn, &["SET", &key, &start.to_string()]).await;
                let tasks: Vec<_> = ops
                    .iter()
                    .map(|op| {
                        let (mut conn, key, op) = (conns[op.conn].clone(), key.clone(), op.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_micros(op.delay_us)).await;
                            let outcome = if op.credit {
                                cas::credit(&mut conn, &key, op.amount, Some(ceiling)).await
                            } else {
                                cas::debit(&mut conn, &key, op.amount).await
                            };
                            (op, outcome.unwrap())
                        })
                    })
                    .collect();
                let mut out = Vec::new();
                for task in tasks {
                    out.push(task.await.unwrap());
                }
                out
            });
            let mut conn = conns[0].clone();
            let stored: String = rt.block_on(raw(&mut conn, &["GET", &key]));
            let final_balance: i64 = stored.parse().unwrap();

            let mut expected = start;
            for (op, outcome) in &results {
                let amount = op.amount as i64;
                prop_assert!((0..=ceiling).contains(&outcome.balance()), "{:?}", outcome);
                match (op.credit, *outcome) {
                    (true, Adjustment::Applied { .. }) => expected += amount,
                    (false, Adjustment::Applied { .. }) => expected -= amount,
                    (false, Adjustment::Insufficient { balance }) => {
                        prop_assert!(balance < amount)
                    }
                    (true, Adjustment::AboveCeiling { balance }) => {
                        prop_assert!(balance + amount > ceiling)
                    }
                    (_, other) => prop_assert!(false, "{:?} for {:?}", other, op),
                }
            }
            prop_assert!((0..=ceiling).contains(&final_balance));
            prop_assert_eq!(final_balance, expected);
            Ok(())
        })
        .unwrap();
}
