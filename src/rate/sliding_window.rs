//! Sliding window: `lua/rate/sliding_window/{check,peek,refund}.lua`.
//!
//! Each limit sends its window (ms) and its limit (the quota's rate). The
//! scripts compare `previous × (w - e)` with `(limit - count - cost) × w`
//! in integers, which is exact while `limit × w <= 2^53 - 1`.
//! See [`Algorithm::SlidingWindow`](super::Algorithm::SlidingWindow).

use super::{fixed_window, Quota, Scripts3};
use crate::script::embedded;
use crate::{validate::MAX_INTEGER, Error, Result};

pub(super) static SCRIPTS: Scripts3 = Scripts3 {
    check: embedded!("rate/sliding_window/check"),
    peek: embedded!("rate/sliding_window/peek"),
    refund: embedded!("rate/sliding_window/refund"),
};

pub(super) fn params(quota: &Quota) -> [u64; 2] {
    [quota.period_ms(), quota.rate()]
}

pub(super) fn accept(quota: &Quota) -> Result<()> {
    fixed_window::accept(quota)?;
    let product = quota.rate().saturating_mul(quota.period_ms());
    if product > MAX_INTEGER {
        return Err(Error::OutOfRange {
            what: "rate × period in ms (sliding window)",
            given: product,
            max: MAX_INTEGER,
        });
    }
    Ok(())
}
