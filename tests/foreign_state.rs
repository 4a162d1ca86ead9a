//! Foreign data in a key: every script that reads stored state accepts only
//! the exact form nolock writes. Anything else, in every shape the issue
//! tracker found (`"5.0"`, `" 7"`, `"007"`, `"1e3"`, `"0x10"`, `"inf"`,
//! values past 2^53, a list, a hash with other fields) is a definite error,
//! never a reply nolock cannot decode, and the key is left byte-identical
//! (`DUMP` and `PEXPIRETIME`).

mod support;

use std::time::Duration;

use nolock::rate::{Algorithm, Charge, Limiter, Quota};
use nolock::{cas, limits, Error};
use redis::aio::MultiplexedConnection as Conn;
use support::{prefix, RedisServer};

/// Values that are not a counter, TAT or balance nolock could have written.
const NOT_NOLOCK: [&str; 9] = ["abc", "", "5.0", " 7", "007", "1e3", "0x10", "inf", "+5"];
/// Integers nolock never writes as a count or time (negative, past 2^53).
const OUT_OF_RANGE: [&str; 3] = ["-1", "9223372036854775807", "99999999999999999999"];

#[derive(Debug, Clone)]
enum Shape {
    Text(&'static str),
    List,
    /// A hash holding `fields`, e.g. nolock's fields with foreign values, or
    /// others besides them.
    Hash(Vec<(&'static str, &'static str)>),
}

async fn plant(conn: &mut Conn, key: &str, shape: &Shape) {
    let mut del = redis::cmd("DEL");
    let _: () = del.arg(key).query_async(conn).await.unwrap();
    let cmd = match shape {
        Shape::Text(v) => {
            let mut c = redis::cmd("SET");
            c.arg(key).arg(*v);
            c
        }
        Shape::List => {
            let mut c = redis::cmd("RPUSH");
            c.arg(key).arg("a").arg("b");
            c
        }
        Shape::Hash(fields) => {
            let mut c = redis::cmd("HSET");
            c.arg(key);
            for (f, v) in fields {
                c.arg(*f).arg(*v);
            }
            c
        }
    };
    let _: () = cmd.query_async(conn).await.unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(600_000)
        .query_async(conn)
        .await
        .unwrap();
}

async fn snapshot(conn: &mut Conn, key: &str) -> (Option<Vec<u8>>, i64) {
    let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    (dump, at)
}

/// A real charge of `l`, taken on a scratch key and pointed at `key`
/// through serde, as a copy that crossed a process boundary may be: the
/// server must refuse foreign data whatever the charge says.
async fn charge_at(conn: &mut Conn, l: &Limiter, key: &str) -> String {
    let scratch = prefix("scratch");
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
    json.replace(&from, &to)
}

/// Runs `op` on `key` holding each of `shapes`; each must be a definite
/// error that leaves the key as it was.
async fn refused<F, Fut, T>(conn: &mut Conn, what: &str, key: &str, shapes: &[Shape], op: F)
where
    F: Fn(Conn) -> Fut,
    Fut: std::future::Future<Output = nolock::Result<T>>,
    T: std::fmt::Debug,
{
    for shape in shapes {
        plant(conn, key, shape).await;
        let before = snapshot(conn, key).await;
        match op(conn.clone()).await {
            Err(err) => {
                assert!(
                    err.is_definite() && !matches!(err, Error::UnexpectedReply { .. }),
                    "{what} on {shape:?}: {err}"
                );
            }
            Ok(v) => panic!("{what} accepted {shape:?}: {v:?}"),
        }
        assert_eq!(
            snapshot(conn, key).await,
            before,
            "{what} on {shape:?}: key changed"
        );
    }
}

fn texts(values: &[&'static str]) -> Vec<Shape> {
    values.iter().map(|v| Shape::Text(v)).collect()
}

#[tokio::test]
async fn counters_and_tats_refuse_every_foreign_value_and_keep_the_key() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = prefix("foreign_string");
    let mut shapes = texts(&NOT_NOLOCK);
    shapes.extend(texts(&OUT_OF_RANGE));
    shapes.push(Shape::List);
    shapes.push(Shape::Hash(vec![("f", "1")]));

    refused(
        &mut conn,
        "limits::try_increment",
        &key,
        &shapes,
        |mut c| {
            let k = key.clone();
            async move { limits::try_increment(&mut c, &k, 10, Duration::from_secs(10)).await }
        },
    )
    .await;
    refused(&mut conn, "limits::peek", &key, &shapes, |mut c| {
        let k = key.clone();
        async move { limits::peek(&mut c, &k).await }
    })
    .await;
    for algorithm in [Algorithm::Gcra, Algorithm::FixedWindow] {
        every_rate_call_refuses(&mut conn, algorithm, &key, &shapes).await;
    }
}

/// A state tagged `tag` (lib/tag) whose count is foreign, and strings whose
/// prefix before ':' is no tag: foreign data, never a count.
fn tagged_foreign(tag: &str) -> Vec<Shape> {
    let mut values: Vec<String> = NOT_NOLOCK
        .iter()
        .chain(&OUT_OF_RANGE)
        .map(|v| format!("{tag}:{v}"))
        .collect();
    values.push(format!("{tag}:1:2"));
    values.push(format!("{tag}:{}", "1".repeat(60)));
    values.push(format!("{}:5", tag.to_uppercase()));
    values.push(":5".to_owned());
    values.push(format!("x{tag}!:5"));
    values
        .into_iter()
        .map(|v| Shape::Text(Box::leak(v.into_boxed_str())))
        .collect()
}

#[tokio::test]
async fn tagged_counters_and_windows_refuse_a_foreign_count_and_keep_the_key() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = prefix("foreign_tagged");
    let shapes = tagged_foreign("c10x10000");
    refused(
        &mut conn,
        "limits::try_increment",
        &key,
        &shapes,
        |mut c| {
            let k = key.clone();
            async move { limits::try_increment(&mut c, &k, 10, Duration::from_secs(10)).await }
        },
    )
    .await;
    refused(&mut conn, "limits::peek", &key, &shapes, |mut c| {
        let k = key.clone();
        async move { limits::peek(&mut c, &k).await }
    })
    .await;
    // Quota::per_second(10): a window of 1000 ms, a limit of 10.
    every_rate_call_refuses(
        &mut conn,
        Algorithm::FixedWindow,
        &key,
        &tagged_foreign("f1000x10"),
    )
    .await;
}

/// check, peek and refund of `algorithm` on `key` holding each of `shapes`.
async fn every_rate_call_refuses(
    conn: &mut Conn,
    algorithm: Algorithm,
    key: &str,
    shapes: &[Shape],
) {
    let l = Limiter::new(algorithm, Quota::per_second(10).unwrap()).unwrap();
    let name = format!("{algorithm}");
    refused(conn, &name, key, shapes, |mut c| {
        let (k, l) = (key.to_owned(), l.clone());
        async move { l.check(&mut c, &k, 1).await }
    })
    .await;
    refused(conn, &name, key, shapes, |mut c| {
        let (k, l) = (key.to_owned(), l.clone());
        async move { l.peek(&mut c, &k, 1).await }
    })
    .await;
    let json = charge_at(conn, &l, key).await;
    refused(conn, &name, key, shapes, |mut c| {
        let json = json.clone();
        async move {
            let mut charge: Charge = serde_json::from_str(&json).unwrap();
            charge.refund(&mut c, 1).await
        }
    })
    .await;
}

#[tokio::test]
async fn hash_states_refuse_foreign_fields_and_values_and_keep_the_key() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = prefix("foreign_hash");
    for (algorithm, fields) in [
        (Algorithm::TokenBucket, vec!["tokens", "at"]),
        (Algorithm::SlidingWindow, vec!["start", "count", "previous"]),
    ] {
        let mut shapes = vec![Shape::List, Shape::Text("5")];
        // nolock's fields, one of them foreign.
        for bad in NOT_NOLOCK.iter().chain(&OUT_OF_RANGE) {
            let mut h: Vec<_> = fields.iter().map(|f| (*f, "1")).collect();
            h[0].1 = bad;
            shapes.push(Shape::Hash(h));
        }
        // nolock's fields and another one; and one field missing.
        let mut extra: Vec<_> = fields.iter().map(|f| (*f, "1")).collect();
        extra.push(("other", "1"));
        shapes.push(Shape::Hash(extra));
        shapes.push(Shape::Hash(fields[1..].iter().map(|f| (*f, "1")).collect()));

        every_rate_call_refuses(&mut conn, algorithm, &key, &shapes).await;
    }
}

#[tokio::test]
async fn balances_refuse_what_is_not_a_canonical_i64_and_keep_the_key() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = prefix("foreign_balance");
    // "-1" and i64::MAX are balances; past i64 is not.
    let mut shapes = texts(&NOT_NOLOCK);
    shapes.push(Shape::Text("99999999999999999999"));
    shapes.push(Shape::Text("9223372036854775808"));
    shapes.push(Shape::List);
    refused(&mut conn, "cas::debit", &key, &shapes, |mut c| {
        let k = key.clone();
        async move { cas::debit(&mut c, &k, 1).await }
    })
    .await;
    refused(&mut conn, "cas::set_if_greater", &key, &shapes, |mut c| {
        let k = key.clone();
        async move { cas::set_if_greater(&mut c, &k, 1).await }
    })
    .await;
}
