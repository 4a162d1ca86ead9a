//! Fixed window: `lua/rate/fixed_window/{check,peek,refund}.lua`.
//!
//! Each limit sends its window (ms) and its limit (the quota's rate). The
//! window's end is the key's expiry; the scripts read it with `PEXPIRETIME`
//! and compare it with `TIME`, so one clock reading decides both the window
//! and the `retry_after` the caller is told.
//! See [`Algorithm::FixedWindow`](super::Algorithm::FixedWindow).

use super::{Quota, Scripts3};
use crate::script::embedded;
use crate::{Error, Result};

pub(super) static SCRIPTS: Scripts3 = Scripts3 {
    check: embedded!("rate/fixed_window/check"),
    peek: embedded!("rate/fixed_window/peek"),
    refund: embedded!("rate/fixed_window/refund"),
};

pub(super) fn params(quota: &Quota) -> [u64; 2] {
    [quota.period_ms(), quota.rate()]
}

/// Windows admit `rate` per period; a burst other than the rate would be
/// silently ignored, so it is refused.
pub(super) fn accept(quota: &Quota) -> Result<()> {
    if quota.burst() != quota.rate() {
        return Err(Error::InvalidArgument {
            what: "quota",
            reason: format!(
                "windows admit `rate` ({}) per period and have no separate burst ({}); \
                 use Algorithm::Gcra or Algorithm::TokenBucket for a burst",
                quota.rate(),
                quota.burst()
            ),
        });
    }
    Ok(())
}
