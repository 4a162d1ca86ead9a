//! `cas::compare_and_set` on its two paths: the native `SET ... IFEQ ...
//! GET` where `Scripts::load` found it (Valkey 8.1 and later), and the
//! script everywhere else and always for `CompareAndSet` (the operation
//! value). Each case is set up twice, on two keys, and run once through
//! each path: the answers, the stored values, their expiries and the errors
//! must be the same. On a server without the option both are the script,
//! and the test says so; the server matrix (`.ci/servers`) runs it on
//! Valkey 8.1.8 and 9.1.2, where the native path is checked to be taken.
//!
//! `cargo test --test cas_native -- --nocapture` also prints the server time
//! per call of each path on the server it runs on.

mod support;

use std::sync::Arc;
use std::time::Duration;

use nolock::cas::{self, CompareAndSet, Expected, Outcome};
use nolock::{Batch, Scripts};
use redis::aio::MultiplexedConnection;
use support::{prefix, raw, RedisServer};

/// The flag `Scripts::load` sets is process-wide: these tests load
/// servers of different kinds, so they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `op` through the engine (a batch of one): always the script.
async fn by_script(conn: &mut MultiplexedConnection, op: CompareAndSet) -> nolock::Result<Outcome> {
    let mut results = [op].into_iter().collect::<Batch<_>>().run(conn).await;
    results.pop().expect("one result")
}

/// What a key holds before a case.
#[derive(Debug, Clone, Copy)]
enum Before {
    Absent,
    Value(&'static str),
    ValueWithTtl(&'static str),
    Hash,
    List,
}

async fn prepare(conn: &mut MultiplexedConnection, key: &str, before: Before) {
    let _: () = raw(conn, &["DEL", key]).await;
    match before {
        Before::Absent => {}
        Before::Value(v) => raw(conn, &["SET", key, v]).await,
        Before::ValueWithTtl(v) => raw(conn, &["SET", key, v, "PX", "600000"]).await,
        Before::Hash => {
            let _: i64 = raw(conn, &["HSET", key, "f", "v"]).await;
        }
        Before::List => {
            let _: i64 = raw(conn, &["RPUSH", key, "a"]).await;
        }
    }
}

/// What a case left: the answer (or the error's kind), the value and
/// whether it expires.
#[derive(Debug, PartialEq)]
struct After {
    answer: Result<Outcome, String>,
    stored: Option<String>,
    expires: bool,
}

async fn after(
    conn: &mut MultiplexedConnection,
    key: &str,
    answer: nolock::Result<Outcome>,
) -> After {
    let kind: String = raw(conn, &["TYPE", key]).await;
    let stored = if kind == "string" {
        raw(conn, &["GET", key]).await
    } else {
        Some(format!("<{kind}>"))
    };
    let pttl: i64 = raw(conn, &["PTTL", key]).await;
    After {
        answer: answer.map_err(|e| match e {
            nolock::Error::Redis(err) => format!("{:?} {:?}", err.kind(), err.code()),
            other => format!("{other:?}"),
        }),
        stored,
        expires: pttl > 0,
    }
}

/// The commands the server counted, by name.
async fn calls(conn: &mut MultiplexedConnection, command: &str) -> (u64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")));
    let field = |name: &str| -> f64 {
        line.and_then(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
    };
    (field("calls") as u64, field("usec"))
}

async fn reset_stats(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

async fn valkey_at_least_8_1(conn: &mut MultiplexedConnection) -> bool {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.trim().strip_prefix("valkey_version:"))
        .and_then(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .is_some_and(|version| version >= (8, 1))
}

#[tokio::test]
async fn both_paths_answer_and_write_the_same() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let loaded = Scripts::load(&mut conn).await.expect("load");
    let native = valkey_at_least_8_1(&mut conn).await;
    assert_eq!(
        loaded.set_ifeq, native,
        "SET IFEQ is found exactly on Valkey >= 8.1"
    );
    if !native {
        eprintln!("this server has no SET ... IFEQ: both paths are the script here");
    }
    let p = prefix("cas_native");
    let ttl = Some(Duration::from_secs(30));
    let cases: Vec<(Before, &str, Option<Duration>)> = vec![
        (Before::Value("a"), "a", None),
        (Before::Value("a"), "a", ttl),
        (Before::ValueWithTtl("a"), "a", None), // KEEPTTL keeps it
        (Before::ValueWithTtl("a"), "a", ttl),
        (Before::Value("b"), "a", None),
        (Before::ValueWithTtl("b"), "a", ttl), // a mismatch leaves the TTL
        (Before::Value(""), "", None),         // the empty string is a value
        (Before::Value("a"), "", None),
        (Before::Absent, "a", None), // never created by a compare
        (Before::Absent, "", ttl),
        (Before::Hash, "a", None),
        (Before::List, "a", ttl),
    ];
    let (evalsha_before, _) = calls(&mut conn, "evalsha").await;
    for (i, (before, expected, ttl)) in cases.iter().enumerate() {
        let (one, two) = (format!("{p}{i}:call"), format!("{p}{i}:value"));
        prepare(&mut conn, &one, *before).await;
        prepare(&mut conn, &two, *before).await;
        let direct =
            cas::compare_and_set(&mut conn, &one, Expected::value(expected), "new", *ttl).await;
        let op = CompareAndSet::new(&two, Expected::value(expected), "new", *ttl).expect("valid");
        let scripted = by_script(&mut conn, op).await;
        let (direct, scripted) = (
            after(&mut conn, &one, direct).await,
            after(&mut conn, &two, scripted).await,
        );
        assert_eq!(
            direct, scripted,
            "case {i}: {before:?}, expected {expected:?}, ttl {ttl:?}"
        );
    }
    // What each path sent: the values always a script, the free function
    // a script only where the server has no SET IFEQ.
    let (evalsha_after, _) = calls(&mut conn, "evalsha").await;
    let n = cases.len() as u64;
    let scripts = if native { n } else { 2 * n };
    assert_eq!(evalsha_after - evalsha_before, scripts);
}

/// 40 tasks add 1 to one counter with compare-and-set loops: the count is
/// exactly the number of `Applied` answers, on whichever path this server
/// takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_compare_and_set_loops_lose_no_update() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    Scripts::load(&mut conn).await.expect("load");
    let key: Arc<str> = format!("{}counter", prefix("cas_native")).into();
    let _: () = raw(&mut conn, &["SET", &key, "0"]).await;
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let (mut conn, key) = (conn.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut applied = 0u64;
            for _ in 0..10 {
                let mut seen: String = raw(&mut conn, &["GET", &key]).await;
                loop {
                    let next = (seen.parse::<u64>().expect("a count") + 1).to_string();
                    match cas::compare_and_set(&mut conn, &key, Expected::value(&seen), &next, None)
                        .await
                        .expect("a definite answer")
                    {
                        Outcome::Applied => break,
                        Outcome::Mismatch { current } => {
                            seen = String::from_utf8(current.expect("the counter exists"))
                                .expect("text");
                        }
                    }
                }
                applied += 1;
            }
            applied
        }));
    }
    let mut applied = 0;
    for task in tasks {
        applied += task.await.expect("task");
    }
    let stored: String = raw(&mut conn, &["GET", &key]).await;
    assert_eq!(applied, 400);
    assert_eq!(stored, "400");
}

/// Server time per call of each path, printed (no assertion: a shared
/// machine's timings are not a test). On a server without the option, only
/// the script's.
#[tokio::test]
async fn server_time_per_call_of_each_path() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let loaded = Scripts::load(&mut conn).await.expect("load");
    let key = format!("{}timed", prefix("cas_native"));
    let _: () = raw(&mut conn, &["SET", &key, "0"]).await;
    const N: u64 = 2_000;
    reset_stats(&mut conn).await;
    for i in 0..N {
        let (seen, next) = (i.to_string(), (i + 1).to_string());
        let op = CompareAndSet::new(&key, Expected::value(&seen), &next, None).expect("valid");
        assert!(by_script(&mut conn, op).await.expect("script").is_applied());
    }
    let (script_calls, script_us) = calls(&mut conn, "evalsha").await;
    assert_eq!(script_calls, N);
    let script = script_us / N as f64;
    if !loaded.set_ifeq {
        eprintln!("compare_and_set by script: {script:.2} µs of server time per call");
        return;
    }
    // Warm-up native calls, then the timed ones.
    for i in N..2 * N {
        let (seen, next) = (i.to_string(), (i + 1).to_string());
        let outcome = cas::compare_and_set(&mut conn, &key, Expected::value(&seen), &next, None)
            .await
            .expect("native");
        assert!(outcome.is_applied());
    }
    reset_stats(&mut conn).await;
    for i in 2 * N..3 * N {
        let (seen, next) = (i.to_string(), (i + 1).to_string());
        let outcome = cas::compare_and_set(&mut conn, &key, Expected::value(&seen), &next, None)
            .await
            .expect("native");
        assert!(outcome.is_applied());
    }
    let (native_calls, native_us) = calls(&mut conn, "set").await;
    assert_eq!(
        native_calls, N,
        "no script ran: every SET was a native call"
    );
    assert_eq!(calls(&mut conn, "evalsha").await.0, 0);
    let native = native_us / N as f64;
    eprintln!(
        "compare_and_set, server time per call: script {script:.2} µs, native SET IFEQ \
         {native:.2} µs ({:.2}x)",
        native / script
    );
}

/// A process that loaded a server with the option and then calls one
/// without it (a rolling upgrade, a second deployment): the call there is
/// refused with `syntax error`, nothing runs, and the script answers, once.
/// Needs the Valkey 8.1.8 build of `../shared/servers` beside the default
/// server; without it (a clone outside CI) the test says so and passes.
#[tokio::test]
async fn a_server_without_the_option_gets_the_script_after_its_refusal() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let valkey = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/servers/valkey-8.1.8/bin/redis-server");
    if !valkey.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{} is missing",
            valkey.display()
        );
        eprintln!("skipped: no {}", valkey.display());
        return;
    }
    let newer = RedisServer::start_tries(
        Some(&valkey.display().to_string()),
        &[],
        &[],
        3,
        Duration::from_secs(5),
    )
    .expect("start Valkey 8.1.8");
    let older = RedisServer::start();
    let mut older_conn = older.conn().await;
    if valkey_at_least_8_1(&mut older_conn).await {
        eprintln!("skipped: the default server has SET IFEQ too");
        return;
    }
    // The older server's scripts first (its load records "no IFEQ"), then
    // the newer one's: the process now takes the native path.
    assert!(!Scripts::load(&mut older_conn).await.expect("load").set_ifeq);
    let loaded = Scripts::load(&mut newer.conn().await).await.expect("load");
    assert!(loaded.set_ifeq);
    let key = format!("{}older", prefix("cas_native"));
    let _: () = raw(&mut older_conn, &["SET", &key, "a"]).await;
    let (evalsha_before, _) = calls(&mut older_conn, "evalsha").await;
    let outcome = cas::compare_and_set(&mut older_conn, &key, Expected::value("a"), "b", None)
        .await
        .expect("the script answers after the refusal");
    assert_eq!(outcome, Outcome::Applied);
    let stored: String = raw(&mut older_conn, &["GET", &key]).await;
    assert_eq!(stored, "b");
    let (evalsha_after, _) = calls(&mut older_conn, "evalsha").await;
    assert_eq!(evalsha_after - evalsha_before, 1, "the script ran once");
    let again = cas::compare_and_set(&mut older_conn, &key, Expected::value("a"), "c", None)
        .await
        .expect("a mismatch");
    assert_eq!(
        again,
        Outcome::Mismatch {
            current: Some(b"b".to_vec())
        }
    );
}
