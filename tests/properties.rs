//! Property tests of invariants under random limits, costs and interleavings.
//! Failing cases are kept in `tests/properties.proptest-regressions`.

mod support;

use std::time::Duration;

use nolock::limits;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use support::{prefix, RedisServer};

#[derive(Debug, Clone)]
struct Request {
    cost: u64,
    delay_us: u64,
    conn: usize,
}

fn scenario() -> impl Strategy<Value = (u64, Vec<Request>)> {
    (1u64..40).prop_flat_map(|limit| {
        let request =
            (1..=limit.min(12), 0u64..1500, 0usize..4).prop_map(|(cost, delay_us, conn)| Request {
                cost,
                delay_us,
                conn,
            });
        (Just(limit), prop::collection::vec(request, 1..80))
    })
}

/// A bounded counter never holds more than its limit, every admitted cost is
/// in the final count exactly once, and every denial was justified: the
/// counter only grows here, so a request denied at count c (c + cost > limit)
/// still does not fit at the end.
#[test]
fn a_bounded_counter_never_exceeds_its_limit() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let conns: Vec<_> = rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..4 {
            conns.push(server.conn().await);
        }
        conns
    });

    let config = Config {
        cases: 64,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    runner
        .run(&scenario(), |(limit, requests)| {
            let key = format!("{}c", prefix("prop"));
            let results = rt.block_on(async {
                let tasks: Vec<_> = requests
                    .iter()
                    .map(|r| {
                        let mut conn = conns[r.conn].clone();
                        let (key, r) = (key.clone(), r.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_micros(r.delay_us)).await;
                            let a = nolock::limits::Counter::new(limit, Duration::from_secs(60))
                                .unwrap()
                                .try_increment_by(&mut conn, &key, r.cost)
                                .await
                                .unwrap();
                            (r.cost, a)
                        })
                    })
                    .collect();
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.unwrap());
                }
                out
            });
            let final_count = rt.block_on(async {
                let mut conn = conns[0].clone();
                limits::peek(&mut conn, &key).await.unwrap().count
            });

            let admitted: u64 = results
                .iter()
                .filter(|(_, a)| a.admitted)
                .map(|(c, _)| c)
                .sum();
            prop_assert!(
                final_count <= limit,
                "count {} > limit {}",
                final_count,
                limit
            );
            prop_assert_eq!(final_count, admitted);
            let mut seen = std::collections::BTreeSet::new();
            for (cost, a) in &results {
                prop_assert!(a.count <= limit);
                if a.admitted {
                    prop_assert!(seen.insert(a.count), "two admissions saw count {}", a.count);
                } else {
                    prop_assert!(
                        a.count + cost > limit,
                        "denied {} at {} under {}",
                        cost,
                        a.count,
                        limit
                    );
                    prop_assert!(final_count + cost > limit);
                }
            }
            Ok(())
        })
        .unwrap();
}
