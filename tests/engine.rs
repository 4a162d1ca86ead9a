//! The script engine: registry, `SCRIPT LOAD`, and the `NOSCRIPT` fallback.
//!
//! The fallback counter in `nolock::stats()` is process-wide, so every check
//! of it lives in one test function: other tests running in parallel in this
//! binary would otherwise move it.

mod support;

use std::time::Duration;

use nolock::limits::{self, TryIncrement};
use nolock::{Batch, Scripts};
use support::{command_calls, prefix, raw, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn every_embedded_script_loads_with_the_local_sha1() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let loaded = Scripts::load(&mut conn).await.unwrap();
    let names: Vec<_> = Scripts::all().iter().map(|s| s.name()).collect();
    assert_eq!(loaded.scripts, names);
    assert!(names.contains(&"limits/try_increment"));
    assert!(names.contains(&"rate/gcra/refund"));
    assert!(names.contains(&"limits/peek"));

    for script in Scripts::all() {
        // The server's own hash of the source, independent of the load reply.
        let sha: String = raw(&mut conn, &["SCRIPT", "LOAD", script.source()]).await;
        assert_eq!(sha, script.sha1(), "{}", script.name());
        let exists: Vec<bool> = raw(&mut conn, &["SCRIPT", "EXISTS", script.sha1()]).await;
        assert_eq!(exists, [true], "{}", script.name());
    }
    // One pipelined round trip on a server outside a cluster: one SCRIPT
    // LOAD per script (plus one INFO server cluster), no more.
    assert_eq!(
        command_calls(&mut conn, "script|load").await,
        2 * Scripts::all().len() as u64
    );
    // One INFO from Scripts::load, one from the `command_calls` just above.
    assert_eq!(command_calls(&mut conn, "info").await, 2);
}

#[tokio::test]
async fn noscript_loads_the_script_once_and_is_counted() {
    let mut server = RedisServer::start();
    let mut conn = server.conn().await;
    let key = format!("{}c", prefix("fallback"));
    Scripts::load(&mut conn).await.unwrap();

    // Loaded: EVALSHA only.
    let before = nolock::stats();
    assert!(
        limits::try_increment(&mut conn, &key, 10, MINUTE)
            .await
            .unwrap()
            .admitted
    );
    let after = nolock::stats();
    assert_eq!(after.noscript_fallbacks, before.noscript_fallbacks);
    assert_eq!(after.calls, before.calls + 1);

    // Flushed: EVALSHA gets NOSCRIPT; SCRIPT LOAD + EVALSHA in one pipeline
    // load it again and run it once.
    let loads = command_calls(&mut conn, "script|load").await;
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let a = limits::try_increment(&mut conn, &key, 10, MINUTE)
        .await
        .unwrap();
    assert_eq!((a.admitted, a.count), (true, 2), "ran exactly once");
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 1
    );
    assert_eq!(command_calls(&mut conn, "script|load").await, loads + 1);
    assert_eq!(command_calls(&mut conn, "eval").await, 0);

    // The next call is back on EVALSHA.
    let evalsha = command_calls(&mut conn, "evalsha").await;
    let a = limits::try_increment(&mut conn, &key, 10, MINUTE)
        .await
        .unwrap();
    assert_eq!(a.count, 3);
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 1
    );
    assert_eq!(command_calls(&mut conn, "script|load").await, loads + 1);
    assert_eq!(command_calls(&mut conn, "evalsha").await, evalsha + 1);

    // Read-only scripts are loaded the same way, then run with EVALSHA_RO.
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let evalsha_ro = command_calls(&mut conn, "evalsha_ro").await;
    assert_eq!(limits::peek(&mut conn, &key).await.unwrap().count, 3);
    assert_eq!(command_calls(&mut conn, "script|load").await, loads + 2);
    assert_eq!(command_calls(&mut conn, "evalsha_ro").await, evalsha_ro + 2);
    assert_eq!(command_calls(&mut conn, "eval_ro").await, 0);
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 2
    );

    // A restart under a ConnectionManager: it reconnects, the new server has
    // an empty script cache and no data (no persistence), and calls succeed
    // through the fallback.
    let mut manager = redis::aio::ConnectionManager::new(server.client())
        .await
        .unwrap();
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    server.kill();
    let down = limits::try_increment(&mut manager, &key, 10, MINUTE).await;
    assert!(down.is_err(), "no server, no answer: {down:?}");
    server.restart();

    let mut result = None;
    for _ in 0..100 {
        match limits::try_increment(&mut manager, &key, 10, MINUTE).await {
            Ok(a) => {
                result = Some(a);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let a = result.expect("calls succeed again after the ConnectionManager reconnects");
    assert_eq!(
        (a.admitted, a.count),
        (true, 1),
        "fresh server, fresh counter"
    );
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 3
    );
    let a = limits::try_increment(&mut manager, &key, 10, MINUTE)
        .await
        .unwrap();
    assert_eq!(a.count, 2);
    assert_eq!(
        nolock::stats().noscript_fallbacks,
        before.noscript_fallbacks + 3
    );

    // Batches: one `batches` per run, one call per entry, and one fallback per
    // entry that came back NOSCRIPT (all of them after a flush).
    let batch: Batch<TryIncrement> = (0..10)
        .map(|i| {
            TryIncrement::new(
                &nolock::limits::Counter::new(5, MINUTE).unwrap(),
                &format!("{key}:batch:{i}"),
            )
            .unwrap()
        })
        .collect();
    Scripts::load(&mut manager).await.unwrap();
    let before = nolock::stats();
    assert!(batch.run(&mut manager).await.iter().all(|r| r.is_ok()));
    let after = nolock::stats();
    assert_eq!(after.batches, before.batches + 1);
    assert_eq!(after.calls, before.calls + 10);
    assert_eq!(after.noscript_fallbacks, before.noscript_fallbacks);

    let mut conn = server.conn().await;
    let _: () = raw(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let results = batch.run(&mut manager).await;
    assert!(results.iter().all(|r| matches!(r, Ok(a) if a.count == 2)));
    let after = nolock::stats();
    assert_eq!(after.batches, before.batches + 2);
    assert_eq!(after.calls, before.calls + 20);
    assert_eq!(after.noscript_fallbacks, before.noscript_fallbacks + 10);
    assert_eq!(after.redirects, before.redirects, "no cluster, no redirect");
}
