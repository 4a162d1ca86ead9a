//! The `nolock` binary (feature `cli`) end to end, against throwaway
//! servers: set → list → show → block/unblock/unlimit → inspect of state
//! written through the library, bad input (exit 2, nothing written),
//! unknown names (exit 3), foreign data in the registry (exit 4), the
//! `--json` shapes, and the same main flow on a 3×2 cluster.
//!
//! State for `inspect` is written by the operation-level API on the very
//! key a handle of that name uses (`{nolock:<kind>:<name>:<id>}`), so
//! these tests hold whether or not the handles read the registry yet.

mod support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nolock::rate::{Algorithm, Limiter, Quota};
use serde_json::Value;
use support::cluster::RedisCluster;
use support::RedisServer;

/// Runs the binary against `url` (never the caller's `REDIS_URL`); a `url`
/// written `cluster=<seed>,<seed>,...` runs it with `--cluster`, so one
/// flow serves a server and a cluster.
fn nolock(url: &str, args: &[&str]) -> Output {
    let (cluster, url) = match url.strip_prefix("cluster=") {
        Some(seeds) => (true, seeds),
        None => (false, url),
    };
    let mut command = Command::new(env!("CARGO_BIN_EXE_nolock"));
    command.env_remove("REDIS_URL").arg("--url").arg(url);
    if cluster {
        command.arg("--cluster");
    }
    command.args(args).output().expect("run the nolock binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs a command that must succeed, and returns its standard output.
fn ok(url: &str, args: &[&str]) -> String {
    let out = nolock(url, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: stdout {} stderr {}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// Runs a `--json` command that must succeed, and parses its output.
fn ok_json(url: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let text = ok(url, &all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
}

/// Runs a command that must fail with `code`, and returns its one line of stderr.
fn fails(url: &str, args: &[&str], code: i32) -> String {
    let out = nolock(url, args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: stdout {} stderr {}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).is_empty(), "{args:?}: {}", stdout(&out));
    stderr(&out)
}

/// The line a failure printed: exactly one, starting `nolock: `.
fn one_line(err: &str) -> &str {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("nolock: "), "{err}");
    lines[0]
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<u64>(conn)
        .await
        .unwrap()
        == 1
}

/// Sets one configuration of each family; `api` is both a rate limit and a counter.
fn set_all(url: &str) {
    ok(
        url,
        &[
            "set",
            "rate-limit",
            "api",
            "--algorithm",
            "gcra",
            "--rate",
            "10",
            "--per",
            "1h",
            "--burst",
            "10",
        ],
    );
    ok(
        url,
        &["set", "counter", "api", "--limit", "5", "--window", "60s"],
    );
    ok(
        url,
        &["set", "semaphore", "jobs", "--permits", "3", "--ttl", "30s"],
    );
    ok(url, &["set", "lock", "payout", "--ttl", "10s"]);
    ok(
        url,
        &[
            "set",
            "rate-limits",
            "tiers",
            "--member-limit",
            "user=10/1h:20",
            "--scope-limit",
            "tenant=1000/1d",
        ],
    );
}

/// The main flow: set, list (table and JSON), show, switches.
fn main_flow(url: &str) {
    set_all(url);

    let table = ok(url, &["list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 6, "{table}");
    assert!(lines[0].starts_with("FAMILY"), "{table}");
    for row in [
        "gcra 10/1h burst 10",
        "counter 5/1min",
        "semaphore 3 ttl 30s",
        "lock ttl 10s",
        "user per member 10/1h burst 20, tenant per scope 1000/1d burst 1000",
    ] {
        assert!(table.contains(row), "{row:?} not in\n{table}");
    }

    let list = ok_json(url, &["list"]);
    let list = list.as_array().expect("list --json is an array");
    let seen: Vec<(String, String)> = list
        .iter()
        .map(|c| {
            (
                c["family"].as_str().unwrap().to_owned(),
                c["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("rate-limit", "api"),
        ("rate-limits", "tiers"),
        ("counter", "api"),
        ("semaphore", "jobs"),
        ("lock", "payout"),
    ];
    assert_eq!(
        seen,
        expected
            .iter()
            .map(|(f, n)| (f.to_string(), n.to_string()))
            .collect::<Vec<_>>()
    );
    let rate = &list[0];
    assert_eq!(rate["spec"]["kind"], "rate-limit");
    assert_eq!(rate["spec"]["algorithm"], "gcra");
    assert_eq!(rate["spec"]["rate"], 10);
    assert_eq!(rate["spec"]["period_ms"], 3_600_000);
    assert_eq!(rate["spec"]["burst"], 10);
    assert_eq!(rate["mode"], "normal");
    assert_eq!(rate["generation"], 0);
    assert!(rate["epoch"].as_u64().unwrap() >= 1);
    assert!(rate["changed_at_ms"].as_u64().unwrap() > 1_700_000_000_000);
    let tiers = &list[1]["spec"]["limits"];
    assert_eq!(tiers[0]["name"], "user", "the order given is kept");
    assert_eq!(tiers[0]["per"], "member");
    assert_eq!(tiers[0]["burst"], 20);
    assert_eq!(tiers[1]["name"], "tenant");
    assert_eq!(tiers[1]["burst"], 1000);

    // show: every family of a name, or one.
    let both = ok_json(url, &["show", "api"]);
    let families: Vec<&str> = both
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["family"].as_str().unwrap())
        .collect();
    assert_eq!(families, ["rate-limit", "counter"]);
    let shown = ok(url, &["show", "api"]);
    assert_eq!(shown.lines().count(), 3, "{shown}");
    let counter = ok_json(url, &["show", "api", "--family", "counter"]);
    assert_eq!(counter.as_array().unwrap().len(), 1);
    assert_eq!(counter[0]["spec"]["limit"], 5);

    // Switches: the JSON of the written configuration, and the table.
    let blocked = ok_json(url, &["block", "counter", "api"]);
    assert_eq!(blocked["mode"], "blocked");
    assert_eq!(blocked["family"], "counter");
    assert!(ok(url, &["show", "api", "--family", "counter"]).contains("blocked"));
    // The rate limit of the same name is untouched.
    assert_eq!(
        ok_json(url, &["show", "api", "--family", "rate-limit"])[0]["mode"],
        "normal"
    );
    assert_eq!(
        ok_json(url, &["unblock", "counter", "api"])["mode"],
        "normal"
    );
    assert_eq!(
        ok_json(url, &["unlimit", "semaphore", "jobs"])["mode"],
        "unlimited"
    );
    assert_eq!(
        ok_json(url, &["unblock", "semaphore", "jobs"])["mode"],
        "normal"
    );
    // A lock cannot be unlimited: bad input.
    let err = fails(url, &["unlimit", "lock", "payout"], 2);
    assert!(one_line(&err).contains("lock"), "{err}");

    // A change keeps the mode, and a reset moves the generation.
    ok(url, &["block", "rate-limit", "api"]);
    let changed = ok_json(
        url,
        &[
            "set",
            "rate-limit",
            "api",
            "--rate",
            "20",
            "--per",
            "1m",
            "--reset",
        ],
    );
    assert_eq!(changed["mode"], "blocked");
    assert_eq!(changed["generation"], 1);
    assert_eq!(
        changed["spec"]["burst"], 20,
        "the burst defaults to the rate"
    );
    ok(url, &["unblock", "rate-limit", "api"]);
}

#[test]
fn the_main_flow_on_one_server() {
    let server = RedisServer::start();
    main_flow(&server.url());
    // REDIS_URL is the default URL.
    let out = Command::new(env!("CARGO_BIN_EXE_nolock"))
        .env("REDIS_URL", server.url())
        .args(["list", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 5);
}

/// `set` without `--algorithm` keeps a stored rate limit's algorithm
/// (changing it would start every id afresh); with it, it changes.
#[test]
fn set_keeps_the_stored_algorithm_unless_given() {
    let server = RedisServer::start();
    let url = server.url();
    let algorithm = |v: &Value| v["spec"]["algorithm"].as_str().unwrap().to_owned();
    let first = ok_json(
        &url,
        &[
            "set",
            "rate-limit",
            "alg",
            "--algorithm",
            "sliding_window",
            "--rate",
            "10",
            "--per",
            "1m",
        ],
    );
    assert_eq!(algorithm(&first), "sliding_window");
    let raised = ok_json(
        &url,
        &["set", "rate-limit", "alg", "--rate", "20", "--per", "1m"],
    );
    assert_eq!(algorithm(&raised), "sliding_window");
    assert_eq!(raised["spec"]["rate"], 20);
    let changed = ok_json(
        &url,
        &[
            "set",
            "rate-limit",
            "alg",
            "--algorithm",
            "gcra",
            "--rate",
            "20",
            "--per",
            "1m",
        ],
    );
    assert_eq!(algorithm(&changed), "gcra");
    // A name not stored yet gets the default, gcra.
    let fresh = ok_json(
        &url,
        &["set", "rate-limit", "fresh", "--rate", "5", "--per", "1s"],
    );
    assert_eq!(algorithm(&fresh), "gcra");
}

#[test]
fn the_main_flow_on_a_cluster() {
    let cluster = RedisCluster::start();
    let seeds = format!("cluster={}", cluster.urls().join(","));
    main_flow(&seeds);

    // Inspect state written through the library, on the key's own node.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = nolock::Client::connect_cluster(cluster.urls())
            .await
            .unwrap();
        let mut conn = client.connection();
        let counter = nolock::limits::Counter::new(5, Duration::from_secs(60)).unwrap();
        for _ in 0..2 {
            let _ = counter
                .try_increment(&mut conn, "{nolock:counter:api:bob}")
                .await
                .unwrap();
        }
        let lock = nolock::fence::Lock::new(Duration::from_secs(10)).unwrap();
        let _ = lock
            .acquire(&mut conn, "{nolock:lock:payout:t7}")
            .await
            .unwrap();
    });
    let seen = ok_json(&seeds, &["inspect", "counter", "api", "bob"]);
    assert_eq!(seen["state"]["count"], 2);
    assert_eq!(seen["state"]["remaining"], 3);
    let seen = ok_json(&seeds, &["inspect", "lock", "payout", "t7"]);
    assert_eq!(seen["state"]["held"], true);
    assert_eq!(seen["state"]["fence"], 1);

    // Durability: one report per primary.
    let reports = ok_json(&seeds, &["durability"]);
    let reports = reports.as_array().unwrap();
    assert_eq!(reports.len(), 3, "{reports:?}");
    assert!(reports.iter().all(|r| r["role"] == "master"));
    assert!(reports.iter().all(|r| r["connected_replicas"] == 1));

    // Several URLs without --cluster are a usage error.
    let err = fails(&cluster.urls().join(","), &["list"], 2);
    assert!(one_line(&err).contains("--cluster"), "{err}");
}

#[tokio::test]
async fn inspect_reads_what_the_library_wrote() {
    let server = RedisServer::start();
    let url = server.url();
    set_all(&url);
    let mut conn = server.conn().await;

    // A rate limit: 3 of 10 taken on the key the handle `api` uses.
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_hour(10).unwrap()).unwrap();
    let _ = limiter
        .check(&mut conn, "{nolock:gcra:api:alice}", 3)
        .await
        .unwrap();
    let seen = ok_json(&url, &["inspect", "rate-limit", "api", "alice"]);
    assert_eq!(seen["family"], "rate-limit");
    assert_eq!(seen["id"], "alice");
    let state = &seen["state"];
    assert_eq!(state["kind"], "rate-limit");
    assert_eq!(state["key"], "{nolock:gcra:api:alice}");
    assert_eq!(
        (state["remaining"].as_u64(), state["limit"].as_u64()),
        (Some(7), Some(10))
    );
    let reset = state["reset_after_ms"].as_u64().unwrap();
    assert!(
        reset > 1_000_000 && reset <= 1_080_000,
        "3 units of 6 min: {reset}"
    );
    assert_eq!(state["retry_after_ms"], Value::Null);
    assert_eq!(state["debt"], 0);
    let text = ok(&url, &["inspect", "rate-limit", "api", "alice"]);
    assert!(text.contains("remaining   7 of 10"), "{text}");
    // Inspecting wrote nothing: a second look sees the same remaining.
    let again = ok_json(&url, &["inspect", "rate-limit", "api", "alice"]);
    assert_eq!(again["state"]["remaining"], 7);
    // An id nobody used is full.
    let fresh = ok_json(&url, &["inspect", "rate-limit", "api", "nobody"]);
    assert_eq!(fresh["state"]["remaining"], 10);
    assert!(!exists(&mut conn, "{nolock:gcra:api:nobody}").await);
    // Checks made through the handles, with the stored numbers (whether the
    // handles read the registry or send their own, the numbers agree).
    let client = nolock::Client::connect(url.as_str()).await.unwrap();
    let api = client
        .rate_limit("api", Quota::per_hour(10).unwrap())
        .unwrap();
    let counted = client.counter("api", 5, Duration::from_secs(60)).unwrap();
    for _ in 0..2 {
        let _ = api.check("carol").await.unwrap();
        let _ = counted.increment("carol").await.unwrap();
    }
    let carol = ok_json(&url, &["inspect", "rate-limit", "api", "carol"]);
    assert_eq!(carol["state"]["remaining"], 8);
    let carol = ok_json(&url, &["inspect", "counter", "api", "carol"]);
    assert_eq!(carol["state"]["count"], 2);

    // A counter: 2 of 5.
    let counter = nolock::limits::Counter::new(5, Duration::from_secs(60)).unwrap();
    for _ in 0..2 {
        let _ = counter
            .try_increment(&mut conn, "{nolock:counter:api:bob}")
            .await
            .unwrap();
    }
    let seen = ok_json(&url, &["inspect", "counter", "api", "bob"]);
    let state = &seen["state"];
    assert_eq!(
        (state["count"].as_u64(), state["limit"].as_u64()),
        (Some(2), Some(5))
    );
    assert_eq!(state["remaining"], 3);
    let reset = state["reset_after_ms"].as_u64().unwrap();
    assert!(reset > 50_000 && reset <= 60_001, "{reset}");

    // A semaphore: one holder of 2 permits, then one of 1.
    let semaphore = nolock::semaphore::Semaphore::new(3, Duration::from_secs(30)).unwrap();
    let key = "{nolock:semaphore:jobs:exports}";
    let first = semaphore.acquire_weighted(&mut conn, key, 2).await.unwrap();
    assert!(first.is_acquired());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = semaphore.acquire(&mut conn, key).await.unwrap();
    assert!(second.is_acquired());
    let seen = ok_json(&url, &["inspect", "semaphore", "jobs", "exports"]);
    let state = &seen["state"];
    assert_eq!(
        (state["in_use"].as_u64(), state["permits"].as_u64()),
        (Some(3), Some(3))
    );
    let holders = state["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert_eq!(holders[0]["weight"], 2, "soonest to expire first");
    assert_eq!(holders[1]["weight"], 1);
    for h in holders {
        let left = h["expires_in_ms"].as_u64().unwrap();
        assert!(left > 20_000 && left <= 30_000, "{left}");
    }
    // No permit id is shown: it is a secret.
    let text = ok(&url, &["inspect", "semaphore", "jobs", "exports"]);
    assert!(text.contains("in use      3 of 3"), "{text}");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Every holder's member, not the tag ("by:m3").
    for member in members.iter().filter(|m| !m.starts_with("by:")) {
        let id = &member[..32];
        assert!(!text.contains(id), "{text}");
        assert!(!seen.to_string().contains(id));
    }

    // A lock: free, then held with fence 1; never the owner token.
    let free = ok_json(&url, &["inspect", "lock", "payout", "t7"]);
    assert_eq!(free["state"]["held"], false);
    assert_eq!(free["state"]["counter"], 0);
    assert_eq!(free["state"]["resource"], "{nolock:lock:payout:t7}");
    let lock = nolock::fence::Lock::new(Duration::from_secs(10)).unwrap();
    let token = nolock::fence::Token::random().unwrap();
    let _ = lock
        .acquire_as(&mut conn, "{nolock:lock:payout:t7}", &token)
        .await
        .unwrap();
    let held = ok_json(&url, &["inspect", "lock", "payout", "t7"]);
    let state = &held["state"];
    assert_eq!(
        (state["held"].as_bool(), state["fence"].as_u64()),
        (Some(true), Some(1))
    );
    assert_eq!(state["counter"], 1);
    let left = state["expires_in_ms"].as_u64().unwrap();
    assert!(left > 5_000 && left <= 10_000, "{left}");
    let text = ok(&url, &["inspect", "lock", "payout", "t7"]);
    assert!(text.contains("fence 1"), "{text}");
    assert!(!text.contains(token.as_str()) && !held.to_string().contains(token.as_str()));

    // Rate limits decided together: 4 units for alice at acme.
    let tiers = client
        .rate_limits("tiers")
        .per_member("user", Quota::per_hour(10).unwrap().with_burst(20).unwrap())
        .per_scope(
            "tenant",
            Quota::per(1000, Duration::from_secs(86_400)).unwrap(),
        )
        .build()
        .unwrap();
    let alice = nolock::client::Scope::new("acme").member("alice");
    let admitted = tiers.check_cost(&alice, 4).await.unwrap();
    assert_eq!(admitted.remaining, 16);
    let both = ok_json(
        &url,
        &[
            "inspect",
            "rate-limits",
            "tiers",
            "acme",
            "--member",
            "alice",
        ],
    );
    assert_eq!(both["member"], "alice");
    let limits = both["state"]["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2);
    assert_eq!(limits[0]["limit_name"], "user");
    assert_eq!(limits[0]["remaining"], 16);
    assert_eq!(limits[1]["limit_name"], "tenant");
    assert_eq!(limits[1]["remaining"], 996);
    // Without a member, the scope's limits only.
    let scope = ok_json(&url, &["inspect", "rate-limits", "tiers", "acme"]);
    let limits = scope["state"]["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0]["per"], "scope");
    assert_eq!(limits[0]["remaining"], 996);
    // --member belongs to rate-limits only.
    fails(
        &url,
        &["inspect", "counter", "api", "bob", "--member", "x"],
        2,
    );

    // After a reset the next generation's keys are read: alice is full again.
    ok(
        &url,
        &[
            "set",
            "rate-limit",
            "api",
            "--rate",
            "10",
            "--per",
            "1h",
            "--reset",
        ],
    );
    let reset = ok_json(&url, &["inspect", "rate-limit", "api", "alice"]);
    assert_eq!(reset["generation"], 1);
    assert_eq!(reset["state"]["key"], "{nolock:gcra:api~1:alice}");
    assert_eq!(reset["state"]["remaining"], 10);
}

#[tokio::test]
async fn bad_input_exits_2_and_writes_nothing() {
    let server = RedisServer::start();
    let url = server.url();
    let cases: &[&[&str]] = &[
        &["set", "counter", "api", "--limit", "ten", "--window", "60s"],
        &["set", "counter", "api", "--limit", "10", "--window", "60"],
        &["set", "counter", "api", "--limit", "10", "--window", "1w"],
        &["set", "counter", "api", "--limit", "10"],
        &["set", "counter", "api", "--limit", "0", "--window", "60s"],
        &[
            "set",
            "counter",
            "api",
            "--limit",
            "10",
            "--window",
            "60s",
            "--permits",
            "3",
        ],
        &["set", "kounter", "api", "--limit", "10", "--window", "60s"],
        &[
            "set",
            "counter",
            "api",
            "--limit",
            "10",
            "--window",
            "60s",
            "--algorithm",
            "gcra",
        ],
        &["set", "counter", "a b", "--limit", "10", "--window", "60s"],
        &["set", "lock", "payout", "--ttl", "10s", "--reset"],
        &[
            "set",
            "rate-limit",
            "api",
            "--rate",
            "10",
            "--per",
            "1m",
            "--algorithm",
            "leaky",
        ],
        &[
            "set",
            "rate-limit",
            "api",
            "--rate",
            "10",
            "--per",
            "1m",
            "--algorithm",
            "fixed_window",
            "--burst",
            "20",
        ],
        &["set", "rate-limits", "tiers"],
        &["set", "rate-limits", "tiers", "--member-limit", "user=10"],
        &[
            "set",
            "rate-limits",
            "tiers",
            "--member-limit",
            "u=1/1s",
            "--scope-limit",
            "u=1/1s",
        ],
        &["block", "kounter", "api"],
        &["inspect", "counter", "a b", "x"],
        &["list", "--bogus"],
        &[],
    ];
    for args in cases {
        let out = nolock(&url, args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: stdout {} stderr {}",
            stdout(&out),
            stderr(&out)
        );
        assert!(!stderr(&out).is_empty(), "{args:?}");
    }
    // Our own refusals are one line; clap's usage errors are clap's.
    let err = fails(&url, &["set", "counter", "api", "--limit", "10"], 2);
    assert!(one_line(&err).contains("--window"), "{err}");
    let err = fails(
        &url,
        &[
            "set", "counter", "api", "--limit", "10", "--window", "60s", "--ttl", "1s",
        ],
        2,
    );
    assert!(
        one_line(&err).contains("--ttl does not apply to a counter"),
        "{err}"
    );
    let mut conn = server.conn().await;
    assert!(!exists(&mut conn, nolock::config::REGISTRY_KEY).await);
    assert!(!exists(&mut conn, nolock::config::EPOCH_KEY).await);

    // --help documents the exit codes.
    let help = ok(&url, &["--help"]);
    for line in [
        "0  done",
        "1  Redis",
        "2  usage",
        "3  not found",
        "4  foreign",
    ] {
        assert!(help.contains(line), "{line:?} not in\n{help}");
    }
}

#[test]
fn unknown_names_exit_3() {
    let server = RedisServer::start();
    let url = server.url();
    ok(&url, &["set", "lock", "payout", "--ttl", "10s"]);
    for args in [
        &["show", "nope"][..],
        &["show", "payout", "--family", "counter"],
        &["block", "counter", "nope"],
        &["unblock", "lock", "nope"],
        &["unlimit", "semaphore", "nope"],
        &["inspect", "counter", "payout", "x"],
    ] {
        let err = fails(&url, args, 3);
        let line = one_line(&err);
        assert!(line.contains("nope") || line.contains("payout"), "{line}");
    }
    // Nothing was created by the refusals.
    assert_eq!(ok_json(&url, &["list"]).as_array().unwrap().len(), 1);
    // An empty registry lists as empty, not as an error.
    let empty = RedisServer::start();
    assert_eq!(ok_json(&empty.url(), &["list"]), Value::Array(vec![]));
    assert!(ok(&empty.url(), &["list"]).contains("no configurations"));
}

#[tokio::test]
async fn foreign_data_in_the_registry_exits_4_naming_the_key() {
    let server = RedisServer::start();
    let url = server.url();
    ok(&url, &["set", "lock", "payout", "--ttl", "10s"]);
    let mut conn = server.conn().await;
    let _: () = redis::cmd("HSET")
        .arg(nolock::config::REGISTRY_KEY)
        .arg("counter:x")
        .arg("garbage")
        .query_async(&mut conn)
        .await
        .unwrap();
    for args in [
        &["list"][..],
        &["show", "x"],
        &["show", "x", "--family", "counter"],
        &["inspect", "counter", "x", "bob"],
        &["block", "counter", "x"],
        &["set", "counter", "x", "--limit", "1", "--window", "1s"],
    ] {
        let err = fails(&url, args, 4);
        let line = one_line(&err);
        assert!(line.contains("{nolock:config}"), "{args:?}: {line}");
        assert!(line.contains("counter:x"), "{args:?}: {line}");
    }
    // The garbage was left as it was.
    let kept: String = redis::cmd("HGET")
        .arg(nolock::config::REGISTRY_KEY)
        .arg("counter:x")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kept, "garbage");

    // The registry key holding a string.
    let _: () = redis::cmd("DEL")
        .arg(nolock::config::REGISTRY_KEY)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(nolock::config::REGISTRY_KEY)
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = fails(&url, &["list"], 4);
    assert!(one_line(&err).contains("{nolock:config}"), "{err}");
}

#[test]
fn an_unreachable_server_exits_1() {
    let port = support::server::free_port();
    let started = Instant::now();
    let err = fails(&format!("redis://127.0.0.1:{port}/"), &["list"], 1);
    assert!(one_line(&err).contains("cannot connect"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // A malformed URL is bad input: exit 2, one line.
    let err = fails("not-a-url", &["list"], 2);
    assert!(one_line(&err).contains("--url number 1"), "{err}");
    // A password in a URL never reaches the output.
    let secret = format!("redis://:hunter2@127.0.0.1:{port}/");
    let err = fails(&secret, &["list"], 1);
    assert!(!one_line(&err).contains("hunter2"), "{err}");
    let help = Command::new(env!("CARGO_BIN_EXE_nolock"))
        .env("REDIS_URL", &secret)
        .arg("--help")
        .output()
        .unwrap();
    assert!(!stdout(&help).contains("hunter2"), "{}", stdout(&help));
}

#[test]
fn durability_reports_a_lone_server() {
    let server = RedisServer::start();
    let reports = ok_json(&server.url(), &["durability"]);
    let report = &reports.as_array().unwrap()[0];
    assert_eq!(report["role"], "master");
    assert_eq!(report["connected_replicas"], 0);
    assert!(report["appendonly"].is_boolean());
    assert_eq!(
        report["fences_can_go_back"].as_bool(),
        Some(report["restart"] != "Keeps")
    );
    assert_eq!(report["node"], format!("127.0.0.1:{}", server.port));
    assert_eq!(report["source"], "config");
    assert_eq!(report["appendfsync"], "everysec");
    let table = ok(&server.url(), &["durability"]);
    assert!(table.starts_with("NODE"), "{table}");
    assert!(table.contains("master"), "{table}");
}

#[tokio::test]
async fn inspect_through_the_library_names_what_is_wrong() {
    use nolock::config::{Family, LimitSpec, Per, Spec};
    use nolock::Error;

    let server = RedisServer::start();
    let client = nolock::Client::connect(server.url()).await.unwrap();
    let configs = client.configs();

    match configs.inspect(Family::Counter, "nope", "x").await {
        Err(Error::UnknownConfig { family, name }) => {
            assert_eq!((family, name.as_str()), ("counter", "nope"));
        }
        other => panic!("{other:?}"),
    }

    // Limits per member only: a scope alone reads nothing, so it is refused.
    let per_member = Spec::RateLimits {
        algorithm: Algorithm::Gcra,
        limits: vec![LimitSpec {
            name: "user".into(),
            per: Per::Member,
            rate: 10,
            period_ms: 1000,
            burst: 10,
            calendar: None,
        }],
    };
    configs.declare("m", per_member).await.unwrap();
    assert!(matches!(
        configs.inspect(Family::RateLimits, "m", "acme").await,
        Err(Error::InvalidArgument { .. })
    ));
    let seen = configs.inspect_member("m", "acme", "alice").await.unwrap();
    assert_eq!(seen.member.as_deref(), Some("alice"));
    assert!(seen.to_string().contains("user (per member)"), "{seen}");
    // A member of a counter, an empty id: refused.
    configs
        .declare("c", Spec::counter(5, Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(matches!(
        configs.inspect_member("c", "acme", "alice").await,
        Err(Error::UnknownConfig { .. })
    ));
    assert!(matches!(
        configs.inspect(Family::Counter, "c", "").await,
        Err(Error::InvalidArgument { .. })
    ));

    // Foreign state at the keys read: a definite error naming the key,
    // and the key left as it was.
    configs
        .declare("jobs", Spec::semaphore(3, Duration::from_secs(30)))
        .await
        .unwrap();
    configs
        .declare("payout", Spec::lock(Duration::from_secs(10)))
        .await
        .unwrap();
    let mut conn = server.conn().await;
    let semaphore = "{nolock:semaphore:jobs:x}";
    let counter = nolock::keys::derive("{nolock:lock:payout:t7}", "fence");
    for key in [semaphore, counter.as_str()] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("not nolock's")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    for (family, name, id, key) in [
        (Family::Semaphore, "jobs", "x", semaphore),
        (Family::Lock, "payout", "t7", counter.as_str()),
    ] {
        match configs.inspect(family, name, id).await {
            Err(err @ Error::Redis(_)) => assert!(err.to_string().contains(key), "{err}"),
            other => panic!("{family}: {other:?}"),
        }
        let kept: String = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kept, "not nolock's");
    }
}

#[test]
fn durability_reads_info_where_config_get_is_refused() {
    let server = RedisServer::start();
    let mut conn = server.client().get_connection().unwrap();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("operator")
        .arg(&["on", ">op-pw", "~*", "&*", "+@all", "-config"][..])
        .query::<()>(&mut conn)
        .unwrap();
    let url = server.url().replace("redis://", "redis://operator:op-pw@");
    let reports = ok_json(&url, &["durability"]);
    let report = &reports[0];
    assert_eq!(report["source"], "info");
    assert_eq!(report["role"], "master");
    assert_eq!(report["appendfsync"], Value::Null);
    assert!(report["appendonly"].is_boolean());
}

/// A calendar quota set from the command line: stored with its period,
/// printed with it by `show` and `list`, read back by the library as the
/// quota it names; `set` without `--algorithm` keeps it calendar.
#[tokio::test]
async fn calendar_periods_are_set_and_shown() {
    use nolock::config::{Family, Spec};
    use nolock::rate::{Period, Weekday, Zone};

    let server = RedisServer::start();
    let url = server.url();
    let set = ok_json(
        &url,
        &[
            "set",
            "rate-limit",
            "plan",
            "--algorithm",
            "calendar",
            "--rate",
            "10000",
            "--calendar",
            "month",
            "--zone",
            "Europe/Berlin",
        ],
    );
    assert_eq!(set["spec"]["algorithm"], "calendar");
    assert_eq!(set["spec"]["rate"], 10000);
    assert_eq!(set["spec"]["burst"], 10000);
    assert_eq!(
        set["spec"]["calendar"],
        serde_json::json!({"unit": "month", "every": 1, "zone": "Europe/Berlin",
                           "week_start": "monday", "day_start": "00:00"})
    );
    let table = ok(&url, &["show", "plan"]);
    assert!(
        table.contains("calendar 10000 per 1 month in Europe/Berlin from 00:00"),
        "{table}"
    );
    // Raised mid-month without --algorithm: still calendar, a day start set.
    let raised = ok_json(
        &url,
        &[
            "set",
            "rate-limit",
            "plan",
            "--rate",
            "20000",
            "--calendar",
            "months",
            "--every",
            "1",
            "--zone",
            "Europe/Berlin",
            "--day-start",
            "06:00",
        ],
    );
    assert_eq!(raised["spec"]["algorithm"], "calendar");
    assert_eq!(raised["spec"]["calendar"]["day_start"], "06:00");
    // Weeks from Sunday, every two, at an offset.
    ok(
        &url,
        &[
            "set",
            "rate-limit",
            "fortnight",
            "--rate",
            "5",
            "--calendar",
            "week",
            "--every",
            "2",
            "--week-start",
            "sun",
            "--zone",
            "+01:00",
        ],
    );
    // A stored gcra limit given a calendar period becomes calendar (its
    // algorithm is not kept: a calendar period takes no other).
    ok(
        &url,
        &["set", "rate-limit", "api", "--rate", "5", "--per", "1s"],
    );
    let switched = ok_json(
        &url,
        &[
            "set",
            "rate-limit",
            "api",
            "--rate",
            "500",
            "--calendar",
            "day",
            "--day-start",
            "06:00",
        ],
    );
    assert_eq!(switched["spec"]["algorithm"], "calendar");
    // Several limits: a calendar second and a month, the zone applies to
    // the month (seconds count elapsed time).
    let multi = ok_json(
        &url,
        &[
            "set",
            "rate-limits",
            "quota",
            "--member-limit",
            "user=10/second",
            "--scope-limit",
            "tenant=100000/month",
            "--zone",
            "+02:00",
        ],
    );
    assert_eq!(multi["spec"]["algorithm"], "calendar");
    assert_eq!(multi["spec"]["limits"][0]["calendar"]["unit"], "second");
    assert_eq!(multi["spec"]["limits"][0]["calendar"]["zone"], "UTC");
    assert_eq!(multi["spec"]["limits"][1]["calendar"]["zone"], "+02:00");
    let list = ok(&url, &["list"]);
    for line in [
        "calendar 20000 per 1 month in Europe/Berlin from 06:00",
        "calendar 5 per 2 week in +01:00 from 00:00, weeks from sunday",
        "calendar 500 per 1 day in UTC from 06:00",
        "calendar user per member 10 per 1 second, tenant per scope 100000 per 1 month in +02:00 from 00:00",
    ] {
        assert!(list.contains(line), "{line:?} not in\n{list}");
    }

    // The library reads what the command line wrote.
    let client = nolock::Client::connect(url.as_str()).await.unwrap();
    let configs = client.configs();
    let plan = configs
        .get(Family::RateLimit, "plan")
        .await
        .unwrap()
        .unwrap();
    let period = Period::MONTH
        .in_zone(Zone::parse("Europe/Berlin").unwrap())
        .days_start_at(6, 0)
        .unwrap();
    assert_eq!(
        plan.spec,
        Spec::rate_limit(
            Algorithm::Calendar,
            Quota::calendar(20_000, period).unwrap()
        )
    );
    let fortnight = configs
        .get(Family::RateLimit, "fortnight")
        .await
        .unwrap()
        .unwrap();
    let weeks = fortnight.spec.quota().unwrap().calendar_period().unwrap();
    assert_eq!((weeks.every(), weeks.week_start()), (2, Weekday::Sunday));

    // State written through a handle of that name reads back by inspect.
    let handle = client
        .rate_limit("plan", Quota::calendar(20_000, period).unwrap())
        .unwrap();
    handle.insist().await.unwrap();
    assert_eq!(
        handle.check_cost("acme", 5).await.unwrap().remaining,
        19_995
    );
    let seen = ok_json(&url, &["inspect", "rate-limit", "plan", "acme"]);
    assert_eq!(seen["state"]["remaining"], 19_995, "{seen}");
    assert_eq!(seen["state"]["limit"], 20_000, "{seen}");
    let end = handle.peek("acme").await.unwrap().period_end.unwrap();
    let end_ms = end
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!(seen["state"]["period_end_ms"], end_ms, "{seen}");
    let text = ok(&url, &["inspect", "rate-limit", "plan", "acme"]);
    assert!(text.contains("period ends 20"), "{text}");

    // A calendar limit set without --algorithm keeps calendar: a period
    // given as a duration is then wall-clock runs of it from the epoch
    // (here minutes), still decided as a calendar limit.
    ok(
        &url,
        &["set", "rate-limit", "plan", "--rate", "5", "--per", "1m"],
    );
    let minutes = configs
        .get(Family::RateLimit, "plan")
        .await
        .unwrap()
        .unwrap();
    match &minutes.spec {
        Spec::RateLimit {
            algorithm,
            calendar,
            rate,
            period_ms,
            ..
        } => {
            assert_eq!(
                (*algorithm, *calendar, *rate, *period_ms),
                (Algorithm::Calendar, None, 5, 60_000)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(minutes.epoch > plan.epoch);
    // With --algorithm it can go back to a rolling limit.
    ok(
        &url,
        &[
            "set",
            "rate-limit",
            "plan",
            "--algorithm",
            "gcra",
            "--rate",
            "5",
            "--per",
            "1m",
        ],
    );
}

/// Bad calendar input exits 2 with a message naming what is wrong, and
/// writes nothing.
#[tokio::test]
async fn bad_calendar_input_exits_2_and_writes_nothing() {
    let server = RedisServer::start();
    let url = server.url();
    let set = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = vec!["set", "rate-limit", "plan", "--rate", "10"];
        args.extend_from_slice(extra);
        args
    };
    // clap's own refusals of a value: the value is named.
    for (extra, named) in [
        (&["--calendar", "fortnight"][..], "fortnight"),
        (
            &["--calendar", "month", "--zone", "Mars/Olympus"],
            "Mars/Olympus",
        ),
        (&["--calendar", "day", "--day-start", "24:00"], "24:00"),
        (&["--calendar", "day", "--day-start", "6:00"], "6:00"),
        (&["--calendar", "week", "--week-start", "funday"], "funday"),
        (&["--calendar", "month", "--every", "x"], "x"),
    ] {
        let args = set(extra);
        let err = fails(&url, &args, 2);
        assert!(err.contains(named), "{args:?}: {err}");
    }
    // Our own: one line each, saying why.
    for (extra, why) in [
        (
            &["--algorithm", "calendar", "--per", "1m"][..],
            "--calendar",
        ),
        (
            &["--algorithm", "gcra", "--calendar", "month"],
            "only algorithm calendar",
        ),
        (
            &["--calendar", "month", "--burst", "20"],
            "--burst does not apply to a calendar period",
        ),
        (
            &["--calendar", "month", "--per", "1m"],
            "--per does not apply to a calendar period",
        ),
        (
            &["--per", "1m", "--zone", "+01:00"],
            "--zone needs --calendar",
        ),
        (&["--per", "1m", "--every", "2"], "--every needs --calendar"),
        (
            &["--calendar", "second", "--zone", "+01:00"],
            "--zone applies to calendar periods of days",
        ),
        (
            &["--calendar", "month", "--week-start", "sunday"],
            "--week-start applies to calendar periods of weeks",
        ),
        (&["--calendar", "month", "--every", "0"], "period length"),
    ] {
        let args = set(extra);
        let err = fails(&url, &args, 2);
        assert!(one_line(&err).contains(why), "{args:?}: {err}");
    }
    let err = fails(
        &url,
        &[
            "set",
            "rate-limit",
            "plan",
            "--rate",
            "0",
            "--calendar",
            "month",
        ],
        2,
    );
    assert!(one_line(&err).contains("rate"), "{err}");
    // Limits of several: a calendar limit has no burst; zone options need
    // a period that takes them. (A calendar limit beside one of a duration
    // is valid: under the calendar algorithm the duration is wall-clock
    // runs of it from the epoch.)
    for (args, code) in [
        (
            &["set", "rate-limits", "q", "--scope-limit", "m=10/month:20"][..],
            2,
        ),
        (
            &[
                "set",
                "rate-limits",
                "q",
                "--scope-limit",
                "a=10/second",
                "--zone",
                "+01:00",
            ],
            2,
        ),
        (
            &[
                "set",
                "counter",
                "c",
                "--limit",
                "1",
                "--window",
                "1s",
                "--calendar",
                "day",
            ],
            2,
        ),
    ] {
        let err = fails(&url, args, code);
        assert!(!err.is_empty(), "{args:?}");
    }
    let mut conn = server.conn().await;
    assert!(!exists(&mut conn, nolock::config::REGISTRY_KEY).await);
    assert!(!exists(&mut conn, nolock::config::EPOCH_KEY).await);

    // --help says how to write one.
    let help = ok(&url, &["set", "--help"]);
    for text in [
        "--calendar <UNIT>",
        "--every <N>",
        "--zone <ZONE>",
        "--day-start <HH:MM>",
        "--week-start <DAY>",
        "NAME=RATE/[N]UNIT",
        "--calendar month",
    ] {
        assert!(help.contains(text), "{text:?} not in\n{help}");
    }
}
