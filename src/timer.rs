//! Sleeping on Tokio's timer without its panic.
//!
//! `tokio::time::sleep` panics when the runtime was built without the time
//! driver (`Builder::new_current_thread().enable_io().build()`) or when
//! there is no runtime at all. The calls of nolock that wait (a cluster
//! redirect's resend, [`crate::fence::Lock::with_wait`], a
//! [`crate::fence::Lease`]'s renewals) check first and return
//! [`Error::NoTimer`] instead, before any I/O where they can.
//!
//! Tokio has no public way to ask whether timers are enabled, so the check
//! builds a timer under `catch_unwind`. The panic is caught, but the
//! process's panic hook still prints it (once per refused call). With
//! `panic = "abort"` the process aborts as before: enable timers.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::{Error, Result};

/// A timer firing at `deadline`, or [`Error::NoTimer`].
pub(crate) fn sleep_until(deadline: Instant) -> Result<Sleep> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::NoTimer);
    }
    catch_unwind(AssertUnwindSafe(|| tokio::time::sleep_until(deadline)))
        .map_err(|_| Error::NoTimer)
}

/// A timer firing after `duration`, or [`Error::NoTimer`].
pub(crate) fn sleep(duration: Duration) -> Result<Sleep> {
    sleep_until(Instant::now() + duration)
}

/// [`Error::NoTimer`] unless this task can sleep.
pub(crate) fn check() -> Result<()> {
    sleep(Duration::ZERO).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_runtime_is_an_error_not_a_panic() {
        assert!(matches!(check(), Err(Error::NoTimer)));
    }

    #[test]
    fn a_runtime_without_timers_is_an_error_not_a_panic() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            assert!(matches!(check(), Err(Error::NoTimer)));
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            assert!(check().is_ok());
            sleep(Duration::from_millis(1)).expect("timer").await;
        });
    }
}
