//! Token bucket: `lua/rate/token_bucket/{check,peek,refund}.lua`.
//!
//! Each bucket sends the time per token `T` (µs, rounded up) and its capacity
//! (the quota's burst); the scripts keep `"b<T>x<C>:<tokens>:<at>"` and refill whole tokens
//! only, carrying the remainder in `at`, so the arithmetic stays in integers.
//! See [`Algorithm::TokenBucket`](super::Algorithm::TokenBucket).

use super::{Quota, Scripts3};
use crate::script::embedded;

pub(super) static SCRIPTS: Scripts3 = Scripts3 {
    check: embedded!("rate/token_bucket/check"),
    peek: embedded!("rate/token_bucket/peek"),
    refund: embedded!("rate/token_bucket/refund"),
};

pub(super) fn params(quota: &Quota) -> [u64; 2] {
    [quota.interval_us(), quota.burst()]
}
