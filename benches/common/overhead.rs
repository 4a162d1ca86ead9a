//! What the library itself costs per call, measured without the network.
//!
//! Live runs on a shared 2-core machine swing by tens of percent from one
//! second to the next, far more than the few percent that separate
//! `try_increment` from a raw `EVALSHA` of its script. So the same two code
//! paths (the `script` and `raw` variants of [`Operation::Counter`]) also run
//! against a connection that packs each command as redis-rs would and
//! answers at once with a canned reply: the difference is the library's own
//! work (validating, building the call, counting it, decoding a typed reply).

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::ops::{Call, Key, Operation, Variant};
use super::Result;

/// Answers every command with `try_increment`'s reply `{1, 1, 60000}`.
struct Canned;

impl ConnectionLike for Canned {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        std::hint::black_box(cmd.get_packed_command());
        Box::pin(async {
            Ok(Value::Array(vec![
                Value::Int(1),
                Value::Int(1),
                Value::Int(60_000),
            ]))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Client-side time per call, without I/O.
#[derive(Debug, Clone, Copy)]
pub struct CpuCost {
    /// `nolock::limits::try_increment`.
    pub script: Duration,
    /// The hand-written `EVALSHA`.
    pub raw: Duration,
}

impl CpuCost {
    /// What the library adds per call (negative when it is cheaper).
    pub fn added_ns(&self) -> f64 {
        self.script.as_nanos() as f64 - self.raw.as_nanos() as f64
    }
}

/// The fastest of `rounds` alternated rounds of `calls` calls each: the
/// least disturbed measure of the same work.
pub async fn cpu_cost(calls: u32, rounds: usize) -> Result<CpuCost> {
    let key = Key::new("nolock-bench:overhead".to_owned());
    let call = Call {
        key: &key,
        capacity: super::CAPACITY,
        lock_ttl: super::LOCK_TTL,
        pause: None,
    };
    let mut rng = fastrand::Rng::with_seed(1);
    let mut best = [Duration::MAX; 2];
    for _ in 0..rounds {
        for (slot, variant) in best.iter_mut().zip([Variant::Script, Variant::Raw]) {
            let started = Instant::now();
            for _ in 0..calls {
                Operation::Counter
                    .call(variant, call, &mut Canned, &mut rng)
                    .await?;
            }
            *slot = (*slot).min(started.elapsed() / calls);
        }
    }
    Ok(CpuCost {
        script: best[0],
        raw: best[1],
    })
}
