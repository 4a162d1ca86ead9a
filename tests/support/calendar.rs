//! Calendar quotas in tests: instants as ms since the epoch, the number in
//! a calendar state's tag, and the boundaries a client sends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nolock::rate::Period;

/// `t` in ms since the epoch.
pub fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The instant `ms` after the epoch.
pub fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms as u64)
}

/// The number in a calendar state's tag: a 32-bit FNV-1a of the period's
/// text without its zone (`1 month from 00:00`), computed here
/// independently of `Period::tag_number` (the tests check that the states
/// the API writes carry it).
pub fn tag_number(period: &Period) -> u64 {
    let text = period
        .to_string()
        .replacen(&format!(" in {}", period.zone()), "", 1);
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    u64::from(h)
}

/// The period holding `now` (ms): its start and end.
pub fn period_of(period: &Period, now: i64) -> (i64, i64) {
    let p = period.containing(at_ms(now)).unwrap();
    (ms(p.start), ms(p.end))
}

/// The four boundaries a client whose clock reads `now` sends: the period
/// before the one holding `now`, that one, and the next.
pub fn candidates(period: &Period, now: i64) -> [i64; 4] {
    let (start, end) = period_of(period, now);
    let (before, _) = period_of(period, start - 1);
    let (_, after) = period_of(period, end);
    [before, start, end, after]
}

/// Waits, when the wall-clock minute ends within 10 s, for the next one: a
/// calendar limit of a minute (`Quota::per_minute` under
/// `Algorithm::Calendar`) counts in wall-clock minutes, and a test sequence
/// that expects one count must not straddle two (the test servers run on
/// this machine's clock).
pub async fn room_in_this_minute() {
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 60_000;
    if into > 50_000 {
        tokio::time::sleep(Duration::from_millis(60_050 - into as u64)).await;
    }
}
