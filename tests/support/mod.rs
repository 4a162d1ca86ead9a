//! Test harness: real Redis servers, unique key prefixes.
//!
//! Each test starts its own `redis-server` on a free port ([`RedisServer`]),
//! so tests can flush, kill and restart it without disturbing one another.
//! [`redis`] uses `$REDIS_URL` instead when it is set, for the tests that only
//! need *a* server. [`cluster::RedisCluster`] starts a local 3×2 Redis
//! Cluster, and [`deployment::Deployment`] runs one test body against either.
//! [`window`] holds a rate limit's history to its bound in every window.
#![allow(dead_code)]

pub mod calendar;
pub mod clock;
pub mod cluster;
pub mod deployment;
pub mod faults;
pub mod history;
pub mod postgres;
pub mod proxy;
pub mod replicated;
pub mod server;
pub mod torture;
pub mod window;

use std::sync::atomic::{AtomicU32, Ordering};

pub use server::RedisServer;

/// A server for a test: the one at `$REDIS_URL` when set, else a new one.
/// Keep the returned guard alive for the length of the test.
pub struct TestRedis {
    pub url: String,
    pub server: Option<RedisServer>,
}

impl TestRedis {
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url.as_str()).expect("valid REDIS_URL")
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }
}

pub fn redis() -> TestRedis {
    if std::env::var_os("NOLOCK_ACL").is_some() {
        return acl_user();
    }
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => TestRedis { url, server: None },
        _ => {
            let server = RedisServer::start();
            TestRedis {
                url: server.url(),
                server: Some(server),
            }
        }
    }
}

/// Commands the tests send themselves to set up and inspect state; the
/// library never sends them (`nolock::acl`'s unit test checks every command
/// its scripts call against `acl::COMMANDS`).
pub const TEST_INSPECTION: &str = "+keys +rpush +lrange +hkeys +dump +info";

/// With `NOLOCK_ACL` set, [`redis`] gives a new server and the URL of a
/// user that has only `nolock::acl::COMMANDS` and `OPTIONAL_COMMANDS` (plus
/// [`TEST_INSPECTION`]) on the test key and channel prefixes, so a suite
/// shows nolock needs nothing more.
fn acl_user() -> TestRedis {
    let server = RedisServer::start();
    let rule = format!(
        "on >acl-pw resetkeys ~nolock-test:* ~{{nolock-test:* resetchannels &nolock-test:* \
         &{{nolock-test:* -@all {} {} {TEST_INSPECTION}",
        nolock::acl::COMMANDS,
        // The suites use the optional parts too (fence waiters, durability).
        nolock::acl::OPTIONAL_COMMANDS
    );
    let mut conn = server.client().get_connection().expect("connect as admin");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nolock-tests")
        .arg(rule.split_whitespace().collect::<Vec<_>>())
        .query::<()>(&mut conn)
        .expect("ACL SETUSER");
    TestRedis {
        url: server
            .url()
            .replace("redis://", "redis://nolock-tests:acl-pw@"),
        server: Some(server),
    }
}

/// A key prefix no other test (or test run on a shared server) uses.
pub fn prefix(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("nolock-test:{test}:{}:{n}:{nanos}:", std::process::id())
}

/// Run a raw command and return its reply, panicking with context on error.
pub async fn raw<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Every key on the server matching `pattern`, sorted.
pub async fn keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = raw(conn, &["KEYS", pattern]).await;
    keys.sort();
    keys
}

/// `calls` for `cmd` from `INFO commandstats` (0 when never called).
pub async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, cmd: &str) -> u64 {
    let info: String = raw(conn, &["INFO", "commandstats"]).await;
    let needle = format!("cmdstat_{}:calls=", cmd.to_lowercase());
    info.lines()
        .find_map(|line| line.strip_prefix(&needle))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A runtime built without timers (I/O only), and a connection to `server`
/// made and driven by a second runtime that has them, with no response or
/// connection timeout: only nolock's own sleeps meet the missing timer.
/// Keep the second runtime alive while the connection is used.
pub fn io_only_runtime_and_conn(
    server: &RedisServer,
) -> (
    tokio::runtime::Runtime,
    tokio::runtime::Runtime,
    redis::aio::MultiplexedConnection,
) {
    let io_only = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let driver = tokio::runtime::Runtime::new().unwrap();
    let conn = driver.block_on(async {
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(None);
        server
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    });
    (io_only, driver, conn)
}
