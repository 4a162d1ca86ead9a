//! Input checks shared by every operation. Each runs before any I/O and names
//! the argument it rejects.

use std::time::Duration;

use crate::{Error, Result};

/// Largest integer a script handles exactly: Lua numbers are IEEE doubles.
pub const MAX_INTEGER: u64 = (1 << 53) - 1;

/// Longest TTL or window accepted, in milliseconds. The same 2^53 - 1 bound:
/// scripts compute with these numbers, and it is far below what `PEXPIRE`
/// accepts (about 2^63 ms minus the current time).
pub const MAX_TTL: Duration = Duration::from_millis(MAX_INTEGER);

/// Longest value accepted, in bytes: 512 MiB, the largest string Redis stores
/// (`proto-max-bulk-len`'s default). Longer values are rejected before I/O
/// rather than sent and refused.
pub const MAX_VALUE_LEN: usize = 512 * 1024 * 1024;

pub(crate) fn key(key: &str) -> Result<()> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else {
        Ok(())
    }
}

/// A count, limit or cost: at least 1 and at most [`MAX_INTEGER`].
pub(crate) fn positive(what: &'static str, value: u64) -> Result<u64> {
    match value {
        0 => Err(Error::ZeroLimit { what }),
        v if v > MAX_INTEGER => Err(Error::OutOfRange {
            what,
            given: v,
            max: MAX_INTEGER,
        }),
        v => Ok(v),
    }
}

/// Any integer up to `max` (0 allowed), e.g. a time or a duration echoed back.
pub(crate) fn at_most(what: &'static str, value: u64, max: u64) -> Result<u64> {
    if value > max {
        Err(Error::OutOfRange {
            what,
            given: value,
            max,
        })
    } else {
        Ok(value)
    }
}

/// A duration as whole milliseconds: at least 1 ms, at most [`MAX_TTL`].
/// Sub-millisecond parts are dropped (Redis expiries have 1 ms resolution).
pub(crate) fn millis(what: &'static str, duration: Duration) -> Result<u64> {
    if duration > MAX_TTL {
        return Err(Error::DurationTooLong {
            what,
            given: duration,
            max: MAX_TTL,
        });
    }
    match duration.as_millis() {
        0 => Err(Error::ZeroDuration { what }),
        // Bounded by MAX_TTL above, so the cast cannot truncate.
        ms => Ok(ms as u64),
    }
}

/// A value to send as one string argument: at most [`MAX_VALUE_LEN`] bytes.
pub(crate) fn value<'a>(what: &'static str, value: &'a [u8]) -> Result<&'a [u8]> {
    if value.len() > MAX_VALUE_LEN {
        Err(Error::ValueTooLarge {
            what,
            len: value.len(),
            max: MAX_VALUE_LEN,
        })
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert!(matches!(
            millis("w", Duration::ZERO),
            Err(Error::ZeroDuration { what: "w" })
        ));
        assert!(millis("w", Duration::from_micros(999)).is_err());
        assert_eq!(millis("w", Duration::from_micros(1_999)).unwrap(), 1);
        assert_eq!(millis("w", MAX_TTL).unwrap(), MAX_INTEGER);
        assert!(matches!(
            millis("w", MAX_TTL + Duration::from_millis(1)),
            Err(Error::DurationTooLong { .. })
        ));
        assert!(millis("w", Duration::MAX).is_err());
    }

    #[test]
    fn counts() {
        assert!(matches!(
            positive("limit", 0),
            Err(Error::ZeroLimit { what: "limit" })
        ));
        assert_eq!(positive("limit", MAX_INTEGER).unwrap(), MAX_INTEGER);
        assert!(matches!(
            positive("limit", MAX_INTEGER + 1),
            Err(Error::OutOfRange { .. })
        ));
    }

    #[test]
    fn values() {
        assert!(value("v", b"").is_ok());
        // Zeroed pages from the allocator: the length is checked, the bytes never touched.
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        assert!(value("v", &big[..MAX_VALUE_LEN]).is_ok());
        assert!(matches!(
            value("v", &big),
            Err(Error::ValueTooLarge { what: "v", len, max: MAX_VALUE_LEN }) if len == MAX_VALUE_LEN + 1
        ));
    }

    #[test]
    fn keys() {
        assert!(matches!(key(""), Err(Error::EmptyKey)));
        assert!(key("k").is_ok());
    }
}
