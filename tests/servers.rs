//! Where the servers users run differ for a script library, stated per server.
//!
//! `.ci/run` runs every integration test against Redis 7.0 (Debian's), Redis
//! 7.4, Redis 8.0 and Valkey 8.0. The tests here assert what each server does
//! differently, by the version it reports, rather than skipping:
//!
//! * the `NOSCRIPT` error text (nolock detects it by kind, never by text);
//! * the `EVAL` script LRU of Redis >= 7.4 and Valkey >= 8.0: scripts created
//!   by `EVAL` are evicted after 500 newer ones (`evicted_scripts` in
//!   `INFO stats`); scripts created by `SCRIPT LOAD` never are. On Redis a
//!   `SCRIPT LOAD` of a script that `EVAL` created leaves it in the LRU; on
//!   Valkey it takes it out. Redis 7.0 keeps every script;
//! * so nolock's `NOSCRIPT` fallback loads a missing script with
//!   `SCRIPT LOAD` (pipelined before the `EVALSHA`), and a script that came
//!   back that way survives any number of other `EVAL`s, alone and in a
//!   [`Batch`], on a single server and on a cluster;
//! * where `SCRIPT LOAD` is refused (an ACL user without `script|load`),
//!   calls still work through `EVAL`.
//!
//! `nolock::stats()` is process-wide: the tests that check it take [`STATS`].

mod support;

use std::time::Duration;

use nolock::limits::{self, TryIncrement};
use nolock::{Batch, Error, Scripts};
use redis::aio::MultiplexedConnection;
use support::cluster::RedisCluster;
use support::{command_calls, prefix, raw, RedisServer};
use tokio::sync::Mutex;

const MINUTE: Duration = Duration::from_secs(60);

/// The size of the `EVAL` script LRU where there is one.
const LRU: u64 = 500;

/// Distinct unrelated `EVAL`s that other clients send between two calls:
/// more than the LRU holds.
const OTHER_EVALS: u64 = 600;

/// Held by every test that reads `nolock::stats()`.
static STATS: Mutex<()> = Mutex::const_new(());

/// What a server says it is, from `INFO server`.
#[derive(Debug)]
struct Server {
    valkey: bool,
    /// `valkey_version` on Valkey, `redis_version` on Redis (Redis 8.0
    /// milestone 1 reports 7.9.224).
    version: (u32, u32),
}

impl Server {
    async fn of(conn: &mut MultiplexedConnection) -> Server {
        let info: String = raw(conn, &["INFO", "server"]).await;
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_owned)
        };
        let valkey = field("server_name").as_deref() == Some("valkey");
        let version = field(if valkey {
            "valkey_version"
        } else {
            "redis_version"
        })
        .unwrap_or_else(|| panic!("no version in INFO server: {info}"));
        let mut parts = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        Server { valkey, version }
    }

    /// Redis >= 7.4 and Valkey >= 8.0 evict `EVAL`-created scripts.
    fn has_eval_lru(&self) -> bool {
        if self.valkey {
            self.version >= (8, 0)
        } else {
            self.version >= (7, 4)
        }
    }

    /// On Valkey a `SCRIPT LOAD` takes an `EVAL`-created script out of the
    /// LRU; on Redis 7.4 and 8.0 it does not.
    fn load_protects_an_eval_script(&self) -> bool {
        self.valkey
    }
}

/// `evicted_scripts` from `INFO stats`; `None` where the server has no
/// such field (no LRU).
async fn evicted_scripts(conn: &mut MultiplexedConnection) -> Option<u64> {
    let info: String = raw(conn, &["INFO", "stats"]).await;
    info.lines()
        .find_map(|line| line.trim().strip_prefix("evicted_scripts:"))
        .map(|n| n.parse().expect("evicted_scripts is a number"))
}

/// `OTHER_EVALS` distinct scripts run with `EVAL`, as other applications on
/// the same server would, in one pipeline.
async fn other_evals(conn: &mut MultiplexedConnection, tag: &str) {
    let mut pipe = redis::pipe();
    for i in 0..OTHER_EVALS {
        pipe.cmd("EVAL")
            .arg(format!("return 'another app {tag} {i}'"))
            .arg(0)
            .ignore();
    }
    let () = pipe.query_async(conn).await.expect("other EVALs");
}

async fn exists(conn: &mut MultiplexedConnection, sha: &str) -> bool {
    let found: Vec<bool> = raw(conn, &["SCRIPT", "EXISTS", sha]).await;
    found == [true]
}

fn sha_of(name: &str) -> &'static str {
    Scripts::all()
        .iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("no script {name}"))
        .sha1()
}

#[tokio::test]
async fn the_noscript_text_differs_and_nolock_reads_the_kind() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let this = Server::of(&mut conn).await;
    let err = redis::cmd("EVALSHA")
        .arg("0000000000000000000000000000000000000000")
        .arg(0)
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("NOSCRIPT"), "{err}");
    assert_eq!(
        err.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
    );
    let expected = if this.valkey {
        "No matching script."
    } else {
        "No matching script. Please use EVAL."
    };
    assert_eq!(err.detail(), Some(expected), "{this:?}");
}

/// The server behaviour the fallback has to live with, shown with scripts
/// of nolock's own: one created as the old fallback did (`EVAL`), one
/// created by `EVAL` then `SCRIPT LOAD` (`Scripts::load` after a fallback),
/// one by `SCRIPT LOAD` alone.
#[tokio::test]
async fn eval_scripts_are_evicted_where_there_is_an_lru_and_loaded_ones_never() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let this = Server::of(&mut conn).await;
    let [by_eval, eval_then_load, by_load] =
        ["limits/try_increment", "rate/gcra/peek", "limits/peek"]
            .map(|name| Scripts::all().iter().find(|s| s.name() == name).unwrap());

    // Scripts that only read ARGV: run with no keys, they touch nothing.
    let _: redis::Value = redis::cmd("EVAL")
        .arg("return 1")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    // EVAL compiles and caches a script even when its run fails on bad
    // arguments, which is all this needs.
    for script in [by_eval, eval_then_load] {
        let _ = redis::cmd("EVAL")
            .arg(script.source())
            .arg(0)
            .query_async::<redis::Value>(&mut conn)
            .await;
        assert!(exists(&mut conn, script.sha1()).await, "{}", script.name());
    }
    let _: String = raw(&mut conn, &["SCRIPT", "LOAD", eval_then_load.source()]).await;
    let _: String = raw(&mut conn, &["SCRIPT", "LOAD", by_load.source()]).await;

    other_evals(&mut conn, "lru").await;

    let survived = [
        exists(&mut conn, by_eval.sha1()).await,
        exists(&mut conn, eval_then_load.sha1()).await,
        exists(&mut conn, by_load.sha1()).await,
    ];
    let evicted = evicted_scripts(&mut conn).await;
    if this.has_eval_lru() {
        let protected = this.load_protects_an_eval_script();
        assert_eq!(survived, [false, protected, true], "{this:?}");
        // Everything EVAL created beyond the newest 500 is gone.
        let in_lru = OTHER_EVALS + 1 + u64::from(!protected);
        assert_eq!(evicted, Some(in_lru - LRU), "{this:?}");
    } else {
        // Redis 7.0: no LRU, every script stays until SCRIPT FLUSH, and
        // INFO has no evicted_scripts.
        assert_eq!(survived, [true, true, true], "{this:?}");
        assert_eq!(evicted, None, "{this:?}");
    }
}

/// Flush, one call (it falls back), 600 other `EVAL`s, one more call: no
/// second fallback, because the fallback loaded the script with
/// `SCRIPT LOAD`. The same through a `Batch`.
#[tokio::test]
async fn a_script_back_from_a_fallback_outlives_other_apps_evals() {
    let _stats = STATS.lock().await;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let this = Server::of(&mut conn).await;
    let key = format!("{}c", prefix("lru_single"));
    let sha = sha_of("limits/try_increment");

    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let before = nolock::stats();
    let a = limits::try_increment(&mut conn, &key, 10, MINUTE).await;
    assert_eq!(a.unwrap().count, 1);
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 1
    );

    other_evals(&mut conn, "single").await;
    assert!(exists(&mut conn, sha).await, "{this:?}");
    let a = limits::try_increment(&mut conn, &key, 10, MINUTE).await;
    assert_eq!(a.unwrap().count, 2, "ran once");
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 1,
        "no second fallback on {this:?}"
    );
    // Every EVAL the server saw came from the other applications.
    assert_eq!(command_calls(&mut conn, "eval").await, OTHER_EVALS);
    assert_eq!(command_calls(&mut conn, "script|load").await, 1);
    let evicted = evicted_scripts(&mut conn).await;
    if this.has_eval_lru() {
        // The LRU did evict: the other applications' oldest scripts.
        assert_eq!(evicted, Some(OTHER_EVALS - LRU), "{this:?}");
    } else {
        assert_eq!(evicted, None, "Redis 7.0 has no EVAL LRU: {this:?}");
    }

    // A batch: every entry falls back once, then survives as well.
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let batch: Batch<TryIncrement> = (0..20)
        .map(|i| {
            TryIncrement::new(
                &nolock::limits::Counter::new(10, MINUTE).unwrap(),
                &format!("{key}:{i}"),
            )
            .unwrap()
        })
        .collect();
    let before = nolock::stats();
    let results = batch.run(&mut conn).await;
    assert!(results.iter().all(|r| matches!(r, Ok(a) if a.count == 1)));
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 20
    );
    // One SCRIPT LOAD for the 20 entries.
    assert_eq!(command_calls(&mut conn, "script|load").await, 2);

    other_evals(&mut conn, "batch").await;
    let results = batch.run(&mut conn).await;
    assert!(results.iter().all(|r| matches!(r, Ok(a) if a.count == 2)));
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 20,
        "no second fallback on {this:?}"
    );
    assert_eq!(command_calls(&mut conn, "eval").await, 2 * OTHER_EVALS);
}

/// An ACL user without `script|load` (as some proxies and managed services
/// set up): `Scripts::load` is refused, and calls go through `EVAL`, alone
/// and in a batch. Where the server has an `EVAL` LRU, such scripts can be
/// evicted again; nolock then falls back again.
#[tokio::test]
async fn without_script_load_permission_calls_go_through_eval() {
    let _stats = STATS.lock().await;
    let server = RedisServer::start();
    let mut admin = server.conn().await;
    let this = Server::of(&mut admin).await;
    let _: () = raw(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">app-password",
            "~*",
            "&*",
            "+@all",
            "-script|load",
        ],
    )
    .await;
    let url = format!("redis://app:app-password@127.0.0.1:{}/", server.port);
    let mut app = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let refused = Scripts::load(&mut app).await.unwrap_err();
    assert!(
        matches!(&refused, Error::Redis(e) if e.code() == Some("NOPERM")),
        "{refused}"
    );

    let key = format!("{}c", prefix("acl"));
    let before = nolock::stats();
    let a = limits::try_increment(&mut app, &key, 10, MINUTE).await;
    assert_eq!(a.unwrap().count, 1, "ran once");
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 1
    );
    assert_eq!(command_calls(&mut admin, "eval").await, 1);
    // The EVAL cached it: the next call is a plain EVALSHA.
    let a = limits::try_increment(&mut app, &key, 10, MINUTE).await;
    assert_eq!(a.unwrap().count, 2);
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 1
    );

    let batch: Batch<TryIncrement> = (0..5)
        .map(|i| {
            TryIncrement::new(
                &nolock::limits::Counter::new(10, MINUTE).unwrap(),
                &format!("{key}:{i}"),
            )
            .unwrap()
        })
        .collect();
    let _: () = raw(&mut admin, &["SCRIPT", "FLUSH"]).await;
    let results = batch.run(&mut app).await;
    assert!(results.iter().all(|r| matches!(r, Ok(a) if a.count == 1)));
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 6
    );
    assert_eq!(command_calls(&mut admin, "eval").await, 6);

    // 600 other EVALs: the script EVAL created is gone where there is an
    // LRU, and the next call falls back again (and still runs once).
    other_evals(&mut admin, "acl").await;
    let a = limits::try_increment(&mut app, &key, 10, MINUTE).await;
    assert_eq!(a.unwrap().count, 3, "ran once");
    let again = u64::from(this.has_eval_lru());
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 6 + again,
        "{this:?}"
    );
}

/// On a cluster the `SCRIPT LOAD` goes to the node that owns the key (the
/// pipeline is routed by its `EVALSHA`), alone and per node in a batch, and
/// the scripts survive other applications' `EVAL`s on every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_load_reaches_the_keys_node_and_outlives_the_lru() {
    let _stats = STATS.lock().await;
    let cluster = RedisCluster::start();
    let mut conn = cluster.conn().await;
    let shards = cluster.shards().await;
    let mut primaries = Vec::new();
    for shard in &shards {
        primaries.push((shard.primary, cluster.node(shard.primary).await));
    }
    let this = Server::of(&mut primaries[0].1).await;
    let sha = sha_of("limits/try_increment");
    let p = prefix("lru_cluster");
    // One key per primary.
    let mut keys = Vec::new();
    for (port, _) in &primaries {
        let key = (0..)
            .map(|i| format!("{p}{i}"))
            .find(|k| {
                let slot = nolock::keys::slot(k);
                shards
                    .iter()
                    .find(|s| s.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
                    .is_some_and(|s| s.primary == *port)
            })
            .unwrap();
        keys.push(key);
    }
    cluster.flush_scripts_everywhere().await;

    // Single calls: one fallback and one SCRIPT LOAD per primary, each on
    // the primary that owns the key.
    let before = nolock::stats();
    for key in &keys {
        let a = limits::try_increment(&mut conn, key, 10, MINUTE).await;
        assert_eq!(a.unwrap().count, 1);
    }
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 3
    );
    for (port, node) in &mut primaries {
        assert_eq!(command_calls(node, "script|load").await, 1, ":{port}");
        assert_eq!(command_calls(node, "eval").await, 0, ":{port}");
        other_evals(node, "cluster").await;
        assert!(exists(node, sha).await, ":{port} {this:?}");
    }
    for key in &keys {
        let a = limits::try_increment(&mut conn, key, 10, MINUTE).await;
        assert_eq!(a.unwrap().count, 2);
    }
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 3,
        "no second fallback on {this:?}"
    );

    // A batch over all three primaries: one SCRIPT LOAD per node.
    cluster.flush_scripts_everywhere().await;
    let batch: Batch<TryIncrement> = (0..30)
        .map(|i| {
            TryIncrement::new(
                &nolock::limits::Counter::new(10, MINUTE).unwrap(),
                &format!("{p}b{i}"),
            )
            .unwrap()
        })
        .collect();
    let before = nolock::stats();
    let results = batch.run(&mut conn).await;
    assert!(results.iter().all(|r| matches!(r, Ok(a) if a.count == 1)));
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 30
    );
    for (port, node) in &mut primaries {
        assert_eq!(command_calls(node, "script|load").await, 2, ":{port}");
        other_evals(node, "cluster batch").await;
    }
    let results = batch.run(&mut conn).await;
    assert!(results.iter().all(|r| matches!(r, Ok(a) if a.count == 2)));
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 30,
        "no second fallback on {this:?}"
    );
    for (port, node) in &mut primaries {
        assert_eq!(
            command_calls(node, "eval").await,
            2 * OTHER_EVALS,
            ":{port}"
        );
    }
}
