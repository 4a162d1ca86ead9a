//! GCRA: `lua/rate/gcra/{check,peek,refund}.lua`.
//!
//! Each limit sends its emission interval `T` (µs, rounded up) and its burst;
//! the scripts keep the theoretical arrival time (µs since the Unix epoch) and
//! decide with integers only, so `b × T <= 2^51` (checked by [`Quota`]) keeps
//! every intermediate exact. See [`Algorithm::Gcra`](super::Algorithm::Gcra).

use super::{Quota, Scripts3};
use crate::script::embedded;

pub(super) static SCRIPTS: Scripts3 = Scripts3 {
    check: embedded!("rate/gcra/check"),
    peek: embedded!("rate/gcra/peek"),
    refund: embedded!("rate/gcra/refund"),
};

pub(super) fn params(quota: &Quota) -> [u64; 2] {
    [quota.interval_us(), quota.burst()]
}
