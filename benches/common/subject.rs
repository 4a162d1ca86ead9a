//! What a benchmark call is made of, shared by every operation (`ops`) and
//! the semaphore runs (`semaphore`): how it is written ([`Variant`]), the
//! keys it works on ([`Key`]) and one call's parameters ([`Call`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How an operation is written. Serialized as `script`, `raw`, `lock`, `watch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// The nolock call.
    #[default]
    Script,
    /// The same script by a hand-written redis-rs `EVALSHA`.
    Raw,
    /// Read, decide, write under a distributed lock ([`super::lock`]).
    Lock,
    /// Optimistic `WATCH`/`MULTI`/`EXEC`, retried on conflict.
    Watch,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Script => "script",
            Variant::Raw => "raw",
            Variant::Lock => "lock",
            Variant::Watch => "watch",
        }
    }
}

/// The names one operation works on: its data key and, for `lock`, the lock.
#[derive(Debug, Clone)]
pub struct Key {
    pub data: String,
    pub lock: String,
}

impl Key {
    pub fn new(data: String) -> Self {
        let lock = format!("{data}:lock");
        Key { data, lock }
    }
}

/// One call: where, against what capacity, and whether this holder pauses.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub key: &'a Key,
    pub capacity: u64,
    pub lock_ttl: Duration,
    /// An injected pause: inside the critical section for `lock` (after the
    /// decision, before the write) and `watch` (before `EXEC`); after the call
    /// for `script` and `raw`, which have no critical section on the client.
    pub pause: Option<Duration>,
}
