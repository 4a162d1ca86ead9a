#![cfg(feature = "tz")]
//! The calendar arithmetic of `rate::Period` (no server): where every
//! period starts and ends, to the millisecond, for each unit and N of one,
//! month and year lengths (leap years and centuries), week starts, day
//! starts, DST changes in both hemispheres (days of 23 and 25 hours, months
//! an hour shorter or longer, a day start inside a gap or a fold), zones
//! with 30- and 45-minute offsets, a skipped calendar day, fixed offsets,
//! the text and serde forms, and the inputs that are refused.
//!
//! Expected instants are written as RFC 3339 text with the offset the wall
//! clock showed (checked against `zdump -v` of the system's tzdata), parsed
//! by jiff's parser only: never computed by the code under test. The
//! parser itself is anchored to epoch seconds from `date -u -d ... +%s`.
//! A property test then checks, for random instants from 1972 to 2150 and
//! periods of every unit in eleven zones, that every instant is in exactly
//! one period, periods are contiguous, start where the calendar says and
//! last as long as the calendar says. Failing cases are kept in
//! `tests/calendar_periods.proptest-regressions`.

use std::ops::Range;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use nolock::rate::{Period, Unit, Weekday, Zone};
use nolock::Error;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// An RFC 3339 instant.
fn ts(text: &str) -> Timestamp {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} is no RFC 3339 instant: {e}"))
}

fn sys(t: Timestamp) -> SystemTime {
    SystemTime::try_from(t).unwrap()
}

fn stamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap()
}

fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap())
}

/// The period holding `at`, as instants.
fn period(p: &Period, at: Timestamp) -> (Timestamp, Timestamp) {
    let r = p
        .containing(sys(at))
        .unwrap_or_else(|e| panic!("{p} at {at}: {e}"));
    (stamp(r.start), stamp(r.end))
}

/// The period holding `at` is `start .. end`.
#[track_caller]
fn holds(p: &Period, at: &str, start: &str, end: &str) {
    assert_eq!(period(p, ts(at)), (ts(start), ts(end)), "{p} at {at}");
}

/// `boundary` ends the period `before .. boundary` and starts `boundary ..
/// after`: its last millisecond is in the first, and the boundary itself
/// (the next period's first millisecond) in the second.
#[track_caller]
fn turns(p: &Period, before: &str, boundary: &str, after: &str) {
    let b = ts(boundary);
    let last = b - SignedDuration::from_millis(1);
    assert_eq!(
        period(p, last),
        (ts(before), b),
        "{p}: the last millisecond before {boundary}"
    );
    assert_eq!(
        period(p, b),
        (b, ts(after)),
        "{p}: the first millisecond at {boundary}"
    );
}

fn length(r: &(Timestamp, Timestamp)) -> i64 {
    r.1.as_millisecond() - r.0.as_millisecond()
}

fn named(name: &str) -> Zone {
    Zone::named(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

// ---------------------------------------------------------------- anchors

#[test]
fn the_expected_instants_are_anchored_to_hand_written_epoch_seconds() {
    // From `date -u -d <date> +%s`.
    for (text, secs) in [
        ("1971-01-01T00:00:00Z", 31_536_000),
        ("2000-03-01T00:00:00Z", 951_868_800),
        ("2023-03-01T00:00:00Z", 1_677_628_800),
        ("2024-01-01T00:00:00Z", 1_704_067_200),
        ("2024-03-01T00:00:00Z", 1_709_251_200),
        ("2024-03-04T00:00:00Z", 1_709_510_400),
        ("2100-03-01T00:00:00Z", 4_107_542_400),
        ("2150-01-01T00:00:00Z", 5_680_281_600),
        // An offset is subtracted: 01:00 at UTC+1 is midnight UTC.
        ("2024-01-01T01:00:00+01:00", 1_704_067_200),
        ("2023-12-31T19:00:00-05:00", 1_704_067_200),
    ] {
        assert_eq!(ts(text).as_second(), secs, "{text}");
    }
    // And the helper agrees with the plain epoch arithmetic.
    let p = Period::DAY;
    let r = p.containing(at_ms(1_709_510_400_000 + 1)).unwrap();
    assert_eq!(
        (ms(r.start), ms(r.end)),
        (1_709_510_400_000, 1_709_596_800_000)
    );
}

// ------------------------------------------------------- each unit's edges

#[test]
fn seconds_minutes_and_hours_turn_on_the_millisecond() {
    turns(
        &Period::seconds(1).unwrap(),
        "2024-03-04T10:14:59Z",
        "2024-03-04T10:15:00Z",
        "2024-03-04T10:15:01Z",
    );
    turns(
        &Period::minutes(1).unwrap(),
        "2024-03-04T10:14:00Z",
        "2024-03-04T10:15:00Z",
        "2024-03-04T10:16:00Z",
    );
    turns(
        &Period::hours(1).unwrap(),
        "2024-03-04T09:00:00Z",
        "2024-03-04T10:00:00Z",
        "2024-03-04T11:00:00Z",
    );
    // Midnight of a new year is one more second, minute and hour.
    turns(
        &Period::seconds(1).unwrap(),
        "2024-12-31T23:59:59Z",
        "2025-01-01T00:00:00Z",
        "2025-01-01T00:00:01Z",
    );
}

#[test]
fn n_seconds_minutes_and_hours_count_from_the_epoch_in_every_zone() {
    let quarter_hour = Period::minutes(15).unwrap();
    turns(
        &quarter_hour,
        "2024-03-04T10:00:00Z",
        "2024-03-04T10:15:00Z",
        "2024-03-04T10:30:00Z",
    );
    turns(
        &quarter_hour,
        "2024-03-04T23:45:00Z",
        "2024-03-05T00:00:00Z",
        "2024-03-05T00:15:00Z",
    );
    // 10 s and 6 h divide a day; 7 h does not: 1 709 510 400 s (2024-03-04
    // 00:00Z) is 67 837 × 25 200 s + 18 000 s, so its 7-hour period started
    // 5 hours before, at 19:00Z the day before.
    holds(
        &Period::seconds(10).unwrap(),
        "2024-03-04T10:15:09.999Z",
        "2024-03-04T10:15:00Z",
        "2024-03-04T10:15:10Z",
    );
    holds(
        &Period::hours(6).unwrap(),
        "2024-03-04T17:59:59.999Z",
        "2024-03-04T12:00:00Z",
        "2024-03-04T18:00:00Z",
    );
    assert_eq!(1_709_510_400 - 67_837 * 25_200, 18_000);
    turns(
        &Period::hours(7).unwrap(),
        "2024-03-03T12:00:00Z",
        "2024-03-03T19:00:00Z",
        "2024-03-04T02:00:00Z",
    );
    // The zone does not move elapsed time: an hour in Kolkata (UTC+05:30)
    // and in Kathmandu (UTC+05:45) still ends at the top of a UTC hour.
    for zone in [named("Asia/Kolkata"), named("Asia/Kathmandu")] {
        let hour = Period::hours(1).unwrap().in_zone(zone);
        assert_eq!(hour.zone(), Zone::UTC);
        assert_eq!(hour, Period::hours(1).unwrap());
        holds(
            &hour,
            "2024-03-04T10:44:00Z",
            "2024-03-04T10:00:00Z",
            "2024-03-04T11:00:00Z",
        );
        let quarters = Period::minutes(15).unwrap().in_zone(zone);
        holds(
            &quarters,
            "2024-03-04T10:44:00Z",
            "2024-03-04T10:30:00Z",
            "2024-03-04T10:45:00Z",
        );
    }
}

#[test]
fn days_turn_at_midnight_and_n_days_count_from_1970_01_01() {
    turns(
        &Period::DAY,
        "2024-03-03T00:00:00Z",
        "2024-03-04T00:00:00Z",
        "2024-03-05T00:00:00Z",
    );
    // 2024-03-04 is epoch day 1 709 510 400 / 86 400 = 19 786 = 3 × 6 595
    // + 1: its 3-day period started on day 19 785, 2024-03-03.
    assert_eq!(1_709_510_400 / 86_400, 19_786);
    let three = Period::days(3).unwrap();
    holds(
        &three,
        "2024-03-04T12:00:00Z",
        "2024-03-03T00:00:00Z",
        "2024-03-06T00:00:00Z",
    );
    turns(
        &three,
        "2024-02-29T00:00:00Z",
        "2024-03-03T00:00:00Z",
        "2024-03-06T00:00:00Z",
    );
    // The first: 1970-01-01 to 1970-01-04.
    holds(
        &three,
        "1970-01-01T00:00:00Z",
        "1970-01-01T00:00:00Z",
        "1970-01-04T00:00:00Z",
    );
}

#[test]
fn weeks_start_on_monday_by_default_and_on_sunday_or_saturday_when_asked() {
    // 2024-03-04 was a Monday (epoch day 19 786; 1970-01-01, day 0, was a
    // Thursday, and 19 786 = 7 × 2 826 + 4: four days after a Thursday).
    assert_eq!(19_786 % 7, 4);
    let monday = Period::WEEK;
    assert_eq!(monday.week_start(), Weekday::Monday);
    turns(
        &monday,
        "2024-02-26T00:00:00Z",
        "2024-03-04T00:00:00Z",
        "2024-03-11T00:00:00Z",
    );
    let sunday = Period::WEEK.weeks_start_on(Weekday::Sunday);
    turns(
        &sunday,
        "2024-02-25T00:00:00Z",
        "2024-03-03T00:00:00Z",
        "2024-03-10T00:00:00Z",
    );
    let saturday = Period::WEEK.weeks_start_on(Weekday::Saturday);
    turns(
        &saturday,
        "2024-02-24T00:00:00Z",
        "2024-03-02T00:00:00Z",
        "2024-03-09T00:00:00Z",
    );
    // Wednesday 2024-03-06 noon in each.
    let wed = "2024-03-06T12:00:00Z";
    holds(&monday, wed, "2024-03-04T00:00:00Z", "2024-03-11T00:00:00Z");
    holds(&sunday, wed, "2024-03-03T00:00:00Z", "2024-03-10T00:00:00Z");
    holds(
        &saturday,
        wed,
        "2024-03-02T00:00:00Z",
        "2024-03-09T00:00:00Z",
    );
    // Weeks cross a year's end: Monday 2024-12-30 to Monday 2025-01-06.
    holds(
        &monday,
        "2025-01-01T00:00:00Z",
        "2024-12-30T00:00:00Z",
        "2025-01-06T00:00:00Z",
    );
    // A Sunday week in Berlin starts at local midnight (UTC+1 in March).
    holds(
        &sunday.in_zone(named("Europe/Berlin")),
        wed,
        "2024-03-03T00:00:00+01:00",
        "2024-03-10T00:00:00+01:00",
    );
}

#[test]
fn two_weeks_count_from_the_week_holding_1970_01_01() {
    // Monday weeks: the first started Monday 1969-12-29 (epoch day -3), so
    // fortnights start on days -3 + 14k: 2024-03-04 (day 19 786) is in the
    // one from day -3 + 14 × 1 413 = 19 779, Monday 2024-02-26.
    assert_eq!(-3 + 14 * 1_413, 19_779);
    assert_eq!(19_786 - 19_779, 7);
    let two = Period::weeks(2).unwrap();
    turns(
        &two,
        "2024-02-12T00:00:00Z",
        "2024-02-26T00:00:00Z",
        "2024-03-11T00:00:00Z",
    );
    holds(
        &two,
        "2024-03-10T23:59:59.999Z",
        "2024-02-26T00:00:00Z",
        "2024-03-11T00:00:00Z",
    );
    // Sunday weeks: the first started Sunday 1969-12-28 (day -4); 19 786 + 4
    // = 14 × 1 413 + 8, so 2024-03-04 is in the one from day 19 778, Sunday
    // 2024-02-25.
    assert_eq!(19_786 + 4 - 14 * 1_413, 8);
    let two_sundays = two.weeks_start_on(Weekday::Sunday);
    holds(
        &two_sundays,
        "2024-03-04T00:00:00Z",
        "2024-02-25T00:00:00Z",
        "2024-03-10T00:00:00Z",
    );
    // The second and third fortnights, the first to start after the epoch
    // (for the first, see
    // `a_period_that_started_before_the_epoch_keeps_its_start`).
    turns(
        &two,
        "1970-01-12T00:00:00Z",
        "1970-01-26T00:00:00Z",
        "1970-02-09T00:00:00Z",
    );
    holds(
        &two,
        "1970-01-12T00:00:00Z",
        "1970-01-12T00:00:00Z",
        "1970-01-26T00:00:00Z",
    );
}

#[test]
fn months_end_on_the_last_millisecond_of_their_last_day() {
    let month = Period::MONTH;
    // 31 January.
    turns(
        &month,
        "2024-01-01T00:00:00Z",
        "2024-02-01T00:00:00Z",
        "2024-03-01T00:00:00Z",
    );
    // 28 February 2023, 29 February 2024 (leap).
    turns(
        &month,
        "2023-02-01T00:00:00Z",
        "2023-03-01T00:00:00Z",
        "2023-04-01T00:00:00Z",
    );
    holds(
        &month,
        "2024-02-29T23:59:59.999Z",
        "2024-02-01T00:00:00Z",
        "2024-03-01T00:00:00Z",
    );
    turns(
        &month,
        "2024-02-01T00:00:00Z",
        "2024-03-01T00:00:00Z",
        "2024-04-01T00:00:00Z",
    );
    // 30 April.
    turns(
        &month,
        "2024-04-01T00:00:00Z",
        "2024-05-01T00:00:00Z",
        "2024-06-01T00:00:00Z",
    );
    holds(
        &month,
        "2024-04-30T23:59:59.999Z",
        "2024-04-01T00:00:00Z",
        "2024-05-01T00:00:00Z",
    );
    // 31 December, into the next year.
    turns(
        &month,
        "2024-12-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
        "2025-02-01T00:00:00Z",
    );
    // The lengths, from the epoch seconds above: February 2023 is 28 days,
    // February 2024 is 29.
    assert_eq!(
        length(&period(&month, ts("2023-02-10T00:00:00Z"))),
        (1_677_628_800 - 1_675_209_600) * 1000
    );
    assert_eq!(1_677_628_800 - 1_675_209_600, 28 * 86_400);
    assert_eq!(
        length(&period(&month, ts("2024-02-10T00:00:00Z"))),
        29 * DAY
    );
}

#[test]
fn quarters_and_halves_are_counted_from_january() {
    let quarter = Period::months(3).unwrap();
    turns(
        &quarter,
        "2024-01-01T00:00:00Z",
        "2024-04-01T00:00:00Z",
        "2024-07-01T00:00:00Z",
    );
    turns(
        &quarter,
        "2024-07-01T00:00:00Z",
        "2024-10-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
    );
    turns(
        &quarter,
        "2024-10-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
        "2025-04-01T00:00:00Z",
    );
    // Q1 2024 is 31 + 29 + 31 = 91 days, Q1 2023 90.
    assert_eq!(
        length(&period(&quarter, ts("2024-02-15T00:00:00Z"))),
        91 * DAY
    );
    assert_eq!(
        length(&period(&quarter, ts("2023-02-15T00:00:00Z"))),
        90 * DAY
    );
    let half = Period::months(6).unwrap();
    turns(
        &half,
        "2024-01-01T00:00:00Z",
        "2024-07-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
    );
    // Five months do not divide a year: counted from January of year 0,
    // month 2024 × 12 + 2 (March 2024, 0-based) = 24 290 = 5 × 4 858, so a
    // five-month period starts in March 2024.
    assert_eq!((2024 * 12 + 2) % 5, 0);
    holds(
        &Period::months(5).unwrap(),
        "2024-05-15T00:00:00Z",
        "2024-03-01T00:00:00Z",
        "2024-08-01T00:00:00Z",
    );
}

#[test]
fn years_and_two_year_periods_turn_on_1_january() {
    turns(
        &Period::YEAR,
        "2024-01-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
    );
    // Two years from year 0: even years start them.
    let two = Period::years(2).unwrap();
    turns(
        &two,
        "2024-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
        "2028-01-01T00:00:00Z",
    );
    holds(
        &two,
        "2025-12-31T23:59:59.999Z",
        "2024-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
    );
    // 2024 (leap) + 2025: 366 + 365 days.
    assert_eq!(length(&period(&two, ts("2025-06-01T00:00:00Z"))), 731 * DAY);
}

#[test]
fn centuries_are_leap_years_only_when_divisible_by_400() {
    let year = Period::YEAR;
    let month = Period::MONTH;
    // 2000: divisible by 400, a leap year (29 February; 366 days). From the
    // anchors: 2000-03-01 is 951 868 800 s; 2000-02-01 is 31 + 29 days
    // after 2000-01-01 (946 684 800 s).
    assert_eq!(946_684_800 + 60 * 86_400, 951_868_800);
    assert_eq!(
        length(&period(&month, ts("2000-02-29T12:00:00Z"))),
        29 * DAY
    );
    assert_eq!(
        period(&month, ts("2000-02-29T23:59:59.999Z")).1,
        ts("2000-03-01T00:00:00Z")
    );
    assert_eq!(
        length(&period(&year, ts("2000-06-01T00:00:00Z"))),
        366 * DAY
    );
    // 2100: divisible by 100 but not by 400, not a leap year: February
    // ends on the 28th (2100-03-01 is 4 107 542 400 s, 28 days after
    // 2100-02-01).
    let feb_2100 = period(&month, ts("2100-02-28T23:59:59.999Z"));
    assert_eq!(
        feb_2100,
        (ts("2100-02-01T00:00:00Z"), ts("2100-03-01T00:00:00Z"))
    );
    assert_eq!(feb_2100.1.as_second(), 4_107_542_400);
    assert_eq!(length(&feb_2100), 28 * DAY);
    assert_eq!(
        length(&period(&year, ts("2100-06-01T00:00:00Z"))),
        365 * DAY
    );
    // 2200 and 2300 are not leap years; 2400 is.
    for (y, leap) in [(2200, false), (2300, false), (2400, true), (2024, true)] {
        let feb = period(&month, ts(&format!("{y}-02-15T00:00:00Z")));
        assert_eq!(length(&feb), if leap { 29 } else { 28 } * DAY, "{y}");
        let whole = period(&year, ts(&format!("{y}-07-01T00:00:00Z")));
        assert_eq!(length(&whole), if leap { 366 } else { 365 } * DAY, "{y}");
    }
    // 1900 follows the same rule as 2100 but is before the Unix epoch,
    // which `containing` refuses rather than counting back.
    let before = UNIX_EPOCH - Duration::from_secs(2_203_891_200); // 1900-03-01
    assert!(matches!(
        month.containing(before),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(ts("1900-03-01T00:00:00Z").as_second(), -2_203_891_200);
}

// -------------------------------------------------------------- day starts

#[test]
fn a_daily_reset_at_six_moves_every_day_boundary() {
    let day = Period::DAY.days_start_at(6, 0).unwrap();
    assert_eq!(day.day_start(), Duration::from_secs(6 * 3600));
    turns(
        &day,
        "2024-05-09T06:00:00Z",
        "2024-05-10T06:00:00Z",
        "2024-05-11T06:00:00Z",
    );
    // Midnight belongs to the day that started the evening before.
    holds(
        &day,
        "2024-05-10T00:00:00Z",
        "2024-05-09T06:00:00Z",
        "2024-05-10T06:00:00Z",
    );
    // On Berlin's wall clock (UTC+2 in May): 06:00 local is 04:00Z.
    let berlin = day.in_zone(named("Europe/Berlin"));
    turns(
        &berlin,
        "2024-05-09T06:00:00+02:00",
        "2024-05-10T06:00:00+02:00",
        "2024-05-11T06:00:00+02:00",
    );
    assert_eq!(ts("2024-05-10T06:00:00+02:00"), ts("2024-05-10T04:00:00Z"));
    // Weeks at 06:00 start on Monday 06:00.
    holds(
        &Period::WEEK.days_start_at(6, 0).unwrap(),
        "2024-03-04T05:59:59.999Z",
        "2024-02-26T06:00:00Z",
        "2024-03-04T06:00:00Z",
    );
    // A day start with minutes: 23:30 (the day is named by its start).
    let late = Period::DAY.days_start_at(23, 30).unwrap();
    turns(
        &late,
        "2024-05-08T23:30:00Z",
        "2024-05-09T23:30:00Z",
        "2024-05-10T23:30:00Z",
    );
}

#[test]
fn a_monthly_reset_at_six_on_the_first() {
    let month = Period::MONTH.days_start_at(6, 0).unwrap();
    turns(
        &month,
        "2024-04-01T06:00:00Z",
        "2024-05-01T06:00:00Z",
        "2024-06-01T06:00:00Z",
    );
    // February 2024 still has 29 days: 1 February 06:00 to 1 March 06:00.
    holds(
        &month,
        "2024-03-01T05:59:59.999Z",
        "2024-02-01T06:00:00Z",
        "2024-03-01T06:00:00Z",
    );
    // The year's first hours belong to December.
    holds(
        &month,
        "2025-01-01T05:00:00Z",
        "2024-12-01T06:00:00Z",
        "2025-01-01T06:00:00Z",
    );
    // A year resetting at 06:00 on 1 January.
    turns(
        &Period::YEAR.days_start_at(6, 0).unwrap(),
        "2024-01-01T06:00:00Z",
        "2025-01-01T06:00:00Z",
        "2026-01-01T06:00:00Z",
    );
    // In a fixed UTC+1: 06:00 local on the 1st is 05:00Z.
    let plus_one = month.in_zone(Zone::fixed(3600).unwrap());
    turns(
        &plus_one,
        "2024-01-01T06:00:00+01:00",
        "2024-02-01T06:00:00+01:00",
        "2024-03-01T06:00:00+01:00",
    );
}

// --------------------------------------------------------------------- DST

#[test]
fn berlin_days_of_23_and_25_hours_and_months_an_hour_short_and_long() {
    // zdump: 2024-03-31 01:00Z, 02:00 CET -> 03:00 CEST; 2024-10-27
    // 01:00Z, 03:00 CEST -> 02:00 CET.
    let zone = named("Europe/Berlin");
    let day = Period::DAY.in_zone(zone);
    turns(
        &day,
        "2024-03-30T00:00:00+01:00",
        "2024-03-31T00:00:00+01:00",
        "2024-04-01T00:00:00+02:00",
    );
    let spring = period(&day, ts("2024-03-31T12:00:00+02:00"));
    assert_eq!(length(&spring), 23 * HOUR);
    // The hour the clocks skip does not split the day.
    holds(
        &day,
        "2024-03-31T01:00:00Z",
        "2024-03-31T00:00:00+01:00",
        "2024-04-01T00:00:00+02:00",
    );
    turns(
        &day,
        "2024-10-26T00:00:00+02:00",
        "2024-10-27T00:00:00+02:00",
        "2024-10-28T00:00:00+01:00",
    );
    let autumn = period(&day, ts("2024-10-27T12:00:00+01:00"));
    assert_eq!(length(&autumn), 25 * HOUR);
    // Both 02:30s of 27 October are in that day.
    for second_half in ["2024-10-27T02:30:00+02:00", "2024-10-27T02:30:00+01:00"] {
        assert_eq!(period(&day, ts(second_half)), autumn, "{second_half}");
    }
    // The days around them are 24 hours.
    assert_eq!(length(&period(&day, ts("2024-03-30T12:00:00Z"))), 24 * HOUR);
    assert_eq!(length(&period(&day, ts("2024-10-28T12:00:00Z"))), 24 * HOUR);

    let month = Period::MONTH.in_zone(zone);
    // March 2024: 31 days less the skipped hour.
    let march = period(&month, ts("2024-03-15T00:00:00Z"));
    assert_eq!(
        march,
        (
            ts("2024-03-01T00:00:00+01:00"),
            ts("2024-04-01T00:00:00+02:00")
        )
    );
    assert_eq!(length(&march), 31 * DAY - HOUR);
    // October 2024: 31 days and the repeated hour.
    let october = period(&month, ts("2024-10-15T00:00:00Z"));
    assert_eq!(
        october,
        (
            ts("2024-10-01T00:00:00+02:00"),
            ts("2024-11-01T00:00:00+01:00")
        )
    );
    assert_eq!(length(&october), 31 * DAY + HOUR);
    // May has no change: exactly 31 × 24 h.
    assert_eq!(
        length(&period(&month, ts("2024-05-15T00:00:00Z"))),
        31 * DAY
    );
    // A year holds both changes: 366 × 24 h in 2024.
    assert_eq!(
        length(&period(
            &Period::YEAR.in_zone(zone),
            ts("2024-05-15T00:00:00Z")
        )),
        366 * DAY
    );
    // A week holding the spring change is 7 × 24 h less an hour.
    assert_eq!(
        period(&Period::WEEK.in_zone(zone), ts("2024-03-31T12:00:00Z")),
        (
            ts("2024-03-25T00:00:00+01:00"),
            ts("2024-04-01T00:00:00+02:00")
        )
    );
}

#[test]
fn sydney_days_of_23_and_25_hours_and_months_an_hour_short_and_long() {
    // Southern hemisphere. zdump: 2024-04-06 16:00Z, 03:00 AEDT (+11) ->
    // 02:00 AEST (+10); 2024-10-05 16:00Z, 02:00 AEST -> 03:00 AEDT.
    let zone = named("Australia/Sydney");
    let day = Period::DAY.in_zone(zone);
    turns(
        &day,
        "2024-04-06T00:00:00+11:00",
        "2024-04-07T00:00:00+11:00",
        "2024-04-08T00:00:00+10:00",
    );
    assert_eq!(
        length(&period(&day, ts("2024-04-07T12:00:00+10:00"))),
        25 * HOUR
    );
    turns(
        &day,
        "2024-10-05T00:00:00+10:00",
        "2024-10-06T00:00:00+10:00",
        "2024-10-07T00:00:00+11:00",
    );
    assert_eq!(
        length(&period(&day, ts("2024-10-06T12:00:00+11:00"))),
        23 * HOUR
    );
    let month = Period::MONTH.in_zone(zone);
    let april = period(&month, ts("2024-04-15T00:00:00Z"));
    assert_eq!(
        april,
        (
            ts("2024-04-01T00:00:00+11:00"),
            ts("2024-05-01T00:00:00+10:00")
        )
    );
    assert_eq!(length(&april), 30 * DAY + HOUR);
    let october = period(&month, ts("2024-10-15T00:00:00Z"));
    assert_eq!(
        october,
        (
            ts("2024-10-01T00:00:00+10:00"),
            ts("2024-11-01T00:00:00+11:00")
        )
    );
    assert_eq!(length(&october), 31 * DAY - HOUR);
    // Sydney's year starts in summer time: 1 January 00:00 AEDT.
    turns(
        &Period::YEAR.in_zone(zone),
        "2024-01-01T00:00:00+11:00",
        "2025-01-01T00:00:00+11:00",
        "2026-01-01T00:00:00+11:00",
    );
    // A quarter holding the April change: Q2 is 91 days and an hour.
    let q2 = period(
        &Period::months(3).unwrap().in_zone(zone),
        ts("2024-05-01T00:00:00Z"),
    );
    assert_eq!(
        q2,
        (
            ts("2024-04-01T00:00:00+11:00"),
            ts("2024-07-01T00:00:00+10:00")
        )
    );
    assert_eq!(length(&q2), 91 * DAY + HOUR);
}

#[test]
fn sao_paulo_and_santiago_change_at_midnight_so_their_day_starts_move() {
    // São Paulo, 2018-11-04 03:00Z: midnight -03 -> 01:00 -02. Midnight does
    // not exist that day; the day starts at 01:00 -02, the same instant as
    // the midnight that would have been (03:00Z).
    let sp = named("America/Sao_Paulo");
    let day = Period::DAY.in_zone(sp);
    turns(
        &day,
        "2018-11-03T00:00:00-03:00",
        "2018-11-04T01:00:00-02:00",
        "2018-11-05T00:00:00-02:00",
    );
    assert_eq!(ts("2018-11-04T01:00:00-02:00"), ts("2018-11-04T03:00:00Z"));
    assert_eq!(
        length(&period(&day, ts("2018-11-04T12:00:00-02:00"))),
        23 * HOUR
    );
    // 2019-02-17 02:00Z: midnight -02 -> 23:00 -03 on the 16th, which is
    // 25 hours long.
    turns(
        &day,
        "2019-02-16T00:00:00-02:00",
        "2019-02-17T00:00:00-03:00",
        "2019-02-18T00:00:00-03:00",
    );
    let long = period(&day, ts("2019-02-16T23:30:00-03:00"));
    assert_eq!(long, period(&day, ts("2019-02-16T23:30:00-02:00")));
    assert_eq!(length(&long), 25 * HOUR);
    // The months: November 2018 30 days less an hour, February 2019 28
    // days and an hour.
    let month = Period::MONTH.in_zone(sp);
    let nov = period(&month, ts("2018-11-15T00:00:00Z"));
    assert_eq!(
        nov,
        (
            ts("2018-11-01T00:00:00-03:00"),
            ts("2018-12-01T00:00:00-02:00")
        )
    );
    assert_eq!(length(&nov), 30 * DAY - HOUR);
    let feb = period(&month, ts("2019-02-15T00:00:00Z"));
    assert_eq!(
        feb,
        (
            ts("2019-02-01T00:00:00-02:00"),
            ts("2019-03-01T00:00:00-03:00")
        )
    );
    assert_eq!(length(&feb), 28 * DAY + HOUR);
    // Brazil has had no DST since 2019: every day of 2024 is 24 hours.
    assert_eq!(length(&period(&day, ts("2024-11-04T12:00:00Z"))), 24 * HOUR);

    // Santiago, zdump: 2024-04-07 03:00Z, 24:00 -03 -> 23:00 -04 (the 6th
    // is 25 hours); 2024-09-08 04:00Z, 24:00 -04 -> 01:00 -03 (the 8th is
    // 23 hours and starts at 01:00 -03).
    let cl = named("America/Santiago");
    let day = Period::DAY.in_zone(cl);
    turns(
        &day,
        "2024-04-06T00:00:00-03:00",
        "2024-04-07T00:00:00-04:00",
        "2024-04-08T00:00:00-04:00",
    );
    assert_eq!(
        length(&period(&day, ts("2024-04-06T12:00:00-03:00"))),
        25 * HOUR
    );
    turns(
        &day,
        "2024-09-07T00:00:00-04:00",
        "2024-09-08T01:00:00-03:00",
        "2024-09-09T00:00:00-03:00",
    );
    assert_eq!(
        length(&period(&day, ts("2024-09-08T12:00:00-03:00"))),
        23 * HOUR
    );
    let month = Period::MONTH.in_zone(cl);
    assert_eq!(
        length(&period(&month, ts("2024-04-15T00:00:00Z"))),
        30 * DAY + HOUR
    );
    assert_eq!(
        length(&period(&month, ts("2024-09-15T00:00:00Z"))),
        30 * DAY - HOUR
    );
}

#[test]
fn lord_howe_changes_by_half_an_hour() {
    // zdump: 2024-04-06 15:00Z, 02:00 +11 -> 01:30 +10:30; 2024-10-05
    // 15:30Z, 02:00 +10:30 -> 02:30 +11.
    let day = Period::DAY.in_zone(named("Australia/Lord_Howe"));
    let long = period(&day, ts("2024-04-07T12:00:00+10:30"));
    assert_eq!(
        long,
        (
            ts("2024-04-07T00:00:00+11:00"),
            ts("2024-04-08T00:00:00+10:30")
        )
    );
    assert_eq!(length(&long), 24 * HOUR + HOUR / 2);
    let short = period(&day, ts("2024-10-06T12:00:00+11:00"));
    assert_eq!(
        short,
        (
            ts("2024-10-06T00:00:00+10:30"),
            ts("2024-10-07T00:00:00+11:00")
        )
    );
    assert_eq!(length(&short), 23 * HOUR + HOUR / 2);
}

/// A day start at 02:30 in Berlin. On 2024-03-31 the wall clock jumps from
/// 02:00 CET to 03:00 CEST, so 02:30 does not exist; the period starts at
/// the instant 02:30 would have been with the offset before the change
/// (jiff's "compatible" rule), 01:30Z, which the wall clock shows as 03:30
/// CEST. Every instant is still in exactly one period: the day of the 30th
/// runs 24 hours up to it (its last hour, 03:00 to 03:30 CEST, past the
/// wall-clock 02:30), the day of the 31st 23 hours from it.
#[test]
fn a_day_start_in_the_spring_gap_moves_to_the_later_wall_time() {
    let day = Period::DAY
        .in_zone(named("Europe/Berlin"))
        .days_start_at(2, 30)
        .unwrap();
    assert_eq!(ts("2024-03-31T03:30:00+02:00"), ts("2024-03-31T01:30:00Z"));
    turns(
        &day,
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:30:00+02:00",
        "2024-04-01T02:30:00+02:00",
    );
    // 03:00 CEST (01:00Z), after the missing 02:30, is still the 30th's.
    holds(
        &day,
        "2024-03-31T03:00:00+02:00",
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:30:00+02:00",
    );
    // 01:59:59.999 CET, the last instant before the jump, too.
    holds(
        &day,
        "2024-03-31T01:59:59.999+01:00",
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:30:00+02:00",
    );
    let before = period(&day, ts("2024-03-30T12:00:00Z"));
    let gap_day = period(&day, ts("2024-03-31T12:00:00Z"));
    assert_eq!(length(&before), 24 * HOUR);
    assert_eq!(length(&gap_day), 23 * HOUR);
    assert_eq!(before.1, gap_day.0);
    // A month starting at 02:30 on the 1st never meets a gap in Berlin (the
    // changes are on Sundays at the end of March and October); at 06:00 on
    // 1 April, March is 31 days less the hour.
    let month = Period::MONTH
        .in_zone(named("Europe/Berlin"))
        .days_start_at(6, 0)
        .unwrap();
    let march = period(&month, ts("2024-03-31T12:00:00Z"));
    assert_eq!(
        march,
        (
            ts("2024-03-01T06:00:00+01:00"),
            ts("2024-04-01T06:00:00+02:00")
        )
    );
    assert_eq!(length(&march), 31 * DAY - HOUR);
}

/// On 2024-10-27 Berlin's wall clock shows 02:30 twice (00:30Z in CEST,
/// 01:30Z in CET); a day start at 02:30 is the first of them, and the
/// second is inside the day it started: that day is 25 hours.
#[test]
fn a_day_start_in_the_autumn_fold_is_its_first_occurrence() {
    let day = Period::DAY
        .in_zone(named("Europe/Berlin"))
        .days_start_at(2, 30)
        .unwrap();
    turns(
        &day,
        "2024-10-26T02:30:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-28T02:30:00+01:00",
    );
    let fold_day = period(&day, ts("2024-10-27T02:30:00+01:00"));
    assert_eq!(
        fold_day,
        (
            ts("2024-10-27T02:30:00+02:00"),
            ts("2024-10-28T02:30:00+01:00")
        )
    );
    assert_eq!(length(&fold_day), 25 * HOUR);
    // After the first 02:30 the wall clock goes back from 03:00 CEST to
    // 02:00 CET: those instants show a time before 02:30 but are in the
    // day that already started.
    for repeated in [
        "2024-10-27T02:00:00+01:00",
        "2024-10-27T02:29:59.999+01:00",
        "2024-10-27T02:59:59.999+02:00",
    ] {
        assert_eq!(period(&day, ts(repeated)), fold_day, "{repeated}");
    }
    assert_eq!(length(&period(&day, ts("2024-10-26T12:00:00Z"))), 24 * HOUR);
}

// ------------------------------------------------- unusual offsets and days

#[test]
fn days_in_zones_with_30_and_45_minute_offsets() {
    let kolkata = Period::DAY.in_zone(named("Asia/Kolkata"));
    turns(
        &kolkata,
        "2024-05-09T00:00:00+05:30",
        "2024-05-10T00:00:00+05:30",
        "2024-05-11T00:00:00+05:30",
    );
    assert_eq!(ts("2024-05-10T00:00:00+05:30"), ts("2024-05-09T18:30:00Z"));
    let kathmandu = Period::DAY.in_zone(named("Asia/Kathmandu"));
    turns(
        &kathmandu,
        "2024-05-09T00:00:00+05:45",
        "2024-05-10T00:00:00+05:45",
        "2024-05-11T00:00:00+05:45",
    );
    assert_eq!(ts("2024-05-10T00:00:00+05:45"), ts("2024-05-09T18:15:00Z"));
    // Nepal moved from +05:30 to +05:45 at midnight on 1986-01-01 (zdump:
    // 1985-12-31 18:30Z, 23:59:59 +05:30 -> 00:15 +05:45): local
    // midnight is where the gap starts, so 1 January starts at 18:30Z and
    // lasts 23 h 45 min.
    let first = period(&kathmandu, ts("1986-01-01T12:00:00+05:45"));
    assert_eq!(
        first,
        (
            ts("1986-01-01T00:00:00+05:30"),
            ts("1986-01-02T00:00:00+05:45")
        )
    );
    assert_eq!(length(&first), 24 * HOUR - HOUR / 4);
    // Weeks and months at +05:30, from 06:00 local.
    let zone = named("Asia/Kolkata");
    holds(
        &Period::WEEK.in_zone(zone).days_start_at(6, 0).unwrap(),
        "2024-03-04T00:29:59.999Z",
        "2024-02-26T06:00:00+05:30",
        "2024-03-04T06:00:00+05:30",
    );
    holds(
        &Period::MONTH.in_zone(zone).days_start_at(6, 0).unwrap(),
        "2024-03-01T00:29:59.999Z",
        "2024-02-01T06:00:00+05:30",
        "2024-03-01T06:00:00+05:30",
    );
}

/// Samoa skipped 30 December 2011 (zdump: 2011-12-30 10:00Z, 23:59:59 -10
/// on the 29th -> 00:00 +14 on the 31st). That day has no period of its
/// own: the 29th ends where the 31st starts, and December is 30 days.
#[test]
fn a_skipped_calendar_day_has_no_period_and_leaves_no_gap() {
    let zone = named("Pacific/Apia");
    let day = Period::DAY.in_zone(zone);
    turns(
        &day,
        "2011-12-29T00:00:00-10:00",
        "2011-12-31T00:00:00+14:00",
        "2012-01-01T00:00:00+14:00",
    );
    assert_eq!(ts("2011-12-31T00:00:00+14:00"), ts("2011-12-30T10:00:00Z"));
    let december = period(&Period::MONTH.in_zone(zone), ts("2011-12-15T00:00:00Z"));
    assert_eq!(
        december,
        (
            ts("2011-12-01T00:00:00-10:00"),
            ts("2012-01-01T00:00:00+14:00")
        )
    );
    assert_eq!(length(&december), 30 * DAY);
    // Its week, Monday 26 December to Monday 2 January, has six days.
    let week = period(&Period::WEEK.in_zone(zone), ts("2011-12-30T12:00:00Z"));
    assert_eq!(
        week,
        (
            ts("2011-12-26T00:00:00-10:00"),
            ts("2012-01-02T00:00:00+14:00")
        )
    );
    assert_eq!(length(&week), 6 * DAY);
}

#[test]
fn fixed_offsets_keep_every_day_24_hours() {
    let minus_five = Zone::fixed(-5 * 3600).unwrap();
    assert_eq!(minus_five.name(), "-05:00");
    let day = Period::DAY.in_zone(minus_five);
    turns(
        &day,
        "2024-03-09T00:00:00-05:00",
        "2024-03-10T00:00:00-05:00",
        "2024-03-11T00:00:00-05:00",
    );
    // Across New York's spring change the fixed zone stays 24 hours,
    // New York does not.
    assert_eq!(length(&period(&day, ts("2024-03-10T12:00:00Z"))), 24 * HOUR);
    assert_eq!(
        length(&period(
            &Period::DAY.in_zone(named("America/New_York")),
            ts("2024-03-10T12:00:00Z")
        )),
        23 * HOUR
    );
    let nepal = Zone::fixed(5 * 3600 + 45 * 60).unwrap();
    assert_eq!(nepal.name(), "+05:45");
    assert_eq!(Zone::parse("+05:45").unwrap(), nepal);
    turns(
        &Period::WEEK.in_zone(nepal),
        "2024-02-26T00:00:00+05:45",
        "2024-03-04T00:00:00+05:45",
        "2024-03-11T00:00:00+05:45",
    );
    // The year at -05:00 ends at 05:00Z on 1 January.
    turns(
        &Period::YEAR.in_zone(minus_five),
        "2024-01-01T00:00:00-05:00",
        "2025-01-01T00:00:00-05:00",
        "2026-01-01T00:00:00-05:00",
    );
    // Seconds in an offset: +05:53:28 (Kathmandu's LMT, as an example).
    let odd = Zone::fixed(5 * 3600 + 53 * 60 + 28).unwrap();
    assert_eq!(odd.name(), "+05:53:28");
    assert_eq!(Zone::parse("+05:53:28").unwrap(), odd);
    turns(
        &Period::DAY.in_zone(odd),
        "2024-05-09T00:00:00+05:53:28",
        "2024-05-10T00:00:00+05:53:28",
        "2024-05-11T00:00:00+05:53:28",
    );
    // The largest offsets: ±25:59:59.
    let most = 25 * 3600 + 59 * 60 + 59;
    assert_eq!(Zone::fixed(most).unwrap().name(), "+25:59:59");
    assert_eq!(Zone::fixed(-most).unwrap().name(), "-25:59:59");
    holds(
        &Period::DAY.in_zone(Zone::fixed(most).unwrap()),
        "2024-05-10T12:00:00Z",
        "2024-05-11T00:00:00+25:59:59",
        "2024-05-12T00:00:00+25:59:59",
    );
    // A POSIX rule: central Europe since 1996, with no database.
    let cet = Zone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
    assert_eq!(
        period(&Period::DAY.in_zone(cet), ts("2024-10-27T12:00:00Z")),
        (
            ts("2024-10-27T00:00:00+02:00"),
            ts("2024-10-28T00:00:00+01:00")
        )
    );
}

/// The periods holding the epoch's first hours started before it: the
/// first Monday week on 1969-12-29, a day at UTC+05:45 at 18:15Z on
/// 1969-12-31. `containing` once turned a negative start into
/// `UNIX_EPOCH + (start as u64) ms`, about 584 million years later; it is
/// `UNIX_EPOCH - |start|`.
#[test]
fn a_period_that_started_before_the_epoch_keeps_its_start() {
    let first = Period::WEEK.containing(UNIX_EPOCH).unwrap();
    assert_eq!(
        first,
        UNIX_EPOCH - Duration::from_secs(3 * 86_400)..UNIX_EPOCH + Duration::from_secs(4 * 86_400)
    );
    let nepal = Period::DAY.in_zone(Zone::fixed(5 * 3600 + 45 * 60).unwrap());
    let day = nepal.containing(UNIX_EPOCH).unwrap();
    assert_eq!(
        day,
        UNIX_EPOCH - Duration::from_secs(5 * 3600 + 45 * 60)
            ..UNIX_EPOCH + Duration::from_secs(18 * 3600 + 15 * 60)
    );
}

// ------------------------------------------------------- text, serde, errors

#[test]
fn the_text_and_serde_forms_round_trip() {
    let berlin = named("Europe/Berlin");
    for (p, text) in [
        (Period::DAY, "1 day in UTC from 00:00"),
        (Period::minutes(15).unwrap(), "15 minute"),
        (Period::seconds(1).unwrap(), "1 second"),
        (Period::hours(7).unwrap(), "7 hour"),
        (
            Period::WEEK.weeks_start_on(Weekday::Sunday),
            "1 week in UTC from 00:00, weeks from sunday",
        ),
        (
            Period::weeks(2)
                .unwrap()
                .in_zone(berlin)
                .weeks_start_on(Weekday::Saturday)
                .days_start_at(6, 0)
                .unwrap(),
            "2 week in Europe/Berlin from 06:00, weeks from saturday",
        ),
        (
            Period::months(3)
                .unwrap()
                .in_zone(named("Asia/Kathmandu"))
                .days_start_at(23, 59)
                .unwrap(),
            "3 month in Asia/Kathmandu from 23:59",
        ),
        (
            Period::years(2)
                .unwrap()
                .in_zone(Zone::fixed(-(3 * 3600 + 30 * 60)).unwrap()),
            "2 year in -03:30 from 00:00",
        ),
        (
            Period::DAY
                .in_zone(Zone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap())
                .days_start_at(2, 30)
                .unwrap(),
            "1 day in CET-1CEST,M3.5.0,M10.5.0/3 from 02:30",
        ),
    ] {
        assert_eq!(p.to_string(), text);
        let json = serde_json::to_string(&p).unwrap();
        let back: Period = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p, "{json}");
        assert_eq!(back.to_string(), text, "{json}");
    }
    // The full serde form, and defaults for everything but the unit.
    let p: Period = serde_json::from_str(
        r#"{"unit":"month","every":1,"zone":"Europe/Berlin","week_start":"monday","day_start":"06:00"}"#,
    )
    .unwrap();
    assert_eq!(
        p,
        Period::MONTH.in_zone(berlin).days_start_at(6, 0).unwrap()
    );
    assert_eq!(
        serde_json::to_value(p).unwrap(),
        serde_json::json!({"unit": "month", "every": 1, "zone": "Europe/Berlin",
                           "week_start": "monday", "day_start": "06:00"})
    );
    let p: Period = serde_json::from_str(r#"{"unit":"month"}"#).unwrap();
    assert_eq!(p, Period::MONTH);
    let p: Period = serde_json::from_str(r#"{"unit":"week","week_start":"sunday"}"#).unwrap();
    assert_eq!(p, Period::WEEK.weeks_start_on(Weekday::Sunday));
    // Elapsed-time units drop a zone, a week start and a day start.
    let p: Period = serde_json::from_str(
        r#"{"unit":"minute","every":15,"zone":"Asia/Kolkata","day_start":"06:00"}"#,
    )
    .unwrap();
    assert_eq!(p, Period::minutes(15).unwrap());
    // Zones by every name they have.
    for (text, zone) in [
        ("UTC", Zone::UTC),
        ("Z", Zone::UTC),
        ("+05:30", Zone::fixed(19_800).unwrap()),
        ("-08:00", Zone::fixed(-28_800).unwrap()),
        ("Europe/Berlin", berlin),
    ] {
        assert_eq!(Zone::parse(text).unwrap(), zone, "{text}");
        let json = serde_json::to_string(&zone).unwrap();
        assert_eq!(serde_json::from_str::<Zone>(&json).unwrap(), zone);
        assert_eq!(Zone::parse(&zone.name()).unwrap(), zone, "{text}");
    }
    assert_eq!(Zone::named("UTC").unwrap(), Zone::UTC);
    // A zone loaded twice is the same zone.
    assert_eq!(named("America/Sao_Paulo"), named("America/Sao_Paulo"));
    // Units and weekdays by name.
    for (text, unit) in [
        ("second", Unit::Second),
        ("minutes", Unit::Minute),
        ("hour", Unit::Hour),
        ("days", Unit::Day),
        ("week", Unit::Week),
        ("months", Unit::Month),
        ("year", Unit::Year),
    ] {
        assert_eq!(text.parse::<Unit>().unwrap(), unit);
        assert_eq!(unit.as_str().parse::<Unit>().unwrap(), unit);
    }
    for (text, day) in [
        ("monday", Weekday::Monday),
        ("Sun", Weekday::Sunday),
        ("SATURDAY", Weekday::Saturday),
        ("wed", Weekday::Wednesday),
    ] {
        assert_eq!(text.parse::<Weekday>().unwrap(), day, "{text}");
    }
}

#[test]
fn bad_inputs_are_refused() {
    // Zero units.
    assert!(matches!(
        Period::new(Unit::Day, 0),
        Err(Error::ZeroLimit { .. })
    ));
    assert!(matches!(Period::months(0), Err(Error::ZeroLimit { .. })));
    assert!(serde_json::from_str::<Period>(r#"{"unit":"day","every":0}"#).is_err());
    // Longer than MAX_PERIOD (about 71 years).
    assert!(matches!(Period::years(100), Err(Error::OutOfRange { .. })));
    assert!(Period::years(70).is_ok());
    // Day starts.
    for (h, m) in [(24, 0), (23, 60), (255, 0)] {
        assert!(
            matches!(
                Period::DAY.days_start_at(h, m),
                Err(Error::InvalidArgument { .. })
            ),
            "{h}:{m}"
        );
    }
    for bad in [
        "24:00", "23:60", "6:00", "06:0", "0600", "06:00:00", "", "ab:cd", "-1:00",
    ] {
        let json = format!(r#"{{"unit":"day","day_start":"{bad}"}}"#);
        assert!(serde_json::from_str::<Period>(&json).is_err(), "{bad:?}");
    }
    let ok: Period = serde_json::from_str(r#"{"unit":"day","day_start":"23:59"}"#).unwrap();
    assert_eq!(ok.day_start(), Duration::from_secs(23 * 3600 + 59 * 60));
    // Units and weekdays.
    assert!("fortnight".parse::<Unit>().is_err());
    assert!(serde_json::from_str::<Period>(r#"{"unit":"months"}"#).is_err());
    assert!("mo".parse::<Weekday>().is_err());
    assert!(serde_json::from_str::<Period>(r#"{"unit":"week","week_start":"someday"}"#).is_err());
    // Zones.
    for bad in [
        "Mars/Olympus_Mons",
        "Europe/Berlinn",
        "nowhere/at all",
        "",
        "+",
        "Europe/",
    ] {
        assert!(
            matches!(Zone::parse(bad), Err(Error::InvalidArgument { .. })),
            "{bad:?}"
        );
    }
    assert!(matches!(
        Zone::named("Mars/Olympus_Mons"),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(
        serde_json::from_str::<Period>(r#"{"unit":"day","zone":"Mars/Olympus_Mons"}"#).is_err()
    );
    // Offsets: beyond ±25:59:59, minutes or seconds of 60, one digit,
    // trailing parts.
    let most = 25 * 3600 + 59 * 60 + 59;
    assert!(matches!(
        Zone::fixed(most + 1),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        Zone::fixed(-most - 1),
        Err(Error::InvalidArgument { .. })
    ));
    for bad in [
        "+26:00",
        "-26:00",
        "+05:60",
        "+05:30:60",
        "+5:30",
        "+05:3",
        "+0530",
        "+05:30:",
        "+05:30:xx",
        "+05:30:00:00",
        "+05",
        "+-5:00",
        "++05:00",
    ] {
        assert!(Zone::parse(bad).is_err(), "{bad:?} parsed");
    }
    assert!(serde_json::from_str::<Zone>(r#""+26:00""#).is_err());
    // Before the Unix epoch.
    assert!(matches!(
        Period::DAY.containing(UNIX_EPOCH - Duration::from_millis(1)),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(Period::seconds(1)
        .unwrap()
        .containing(UNIX_EPOCH - Duration::from_secs(3600))
        .is_err());
}

// --------------------------------------------------------------- property

/// A zone of the property test: the zone, the same rules as jiff reads them
/// (to check where a period starts), and the widest swing of its offset
/// from 1971 to 2150 (per `zdump -v`), which bounds how far a period's
/// length can stray from its calendar length.
struct TestZone {
    zone: Zone,
    rules: TimeZone,
    swing_ms: i64,
}

fn test_zones() -> Vec<TestZone> {
    let iana = |name: &str, swing_ms: i64| TestZone {
        zone: named(name),
        rules: TimeZone::get(name).unwrap(),
        swing_ms,
    };
    let fixed = |seconds: i32| TestZone {
        zone: Zone::fixed(seconds).unwrap(),
        rules: TimeZone::fixed(jiff::tz::Offset::from_seconds(seconds).unwrap()),
        swing_ms: 0,
    };
    let cet = "CET-1CEST,M3.5.0,M10.5.0/3";
    vec![
        TestZone {
            zone: Zone::UTC,
            rules: TimeZone::UTC,
            swing_ms: 0,
        },
        iana("Europe/Berlin", HOUR),
        iana("America/New_York", HOUR),
        iana("Australia/Sydney", HOUR),
        iana("America/Sao_Paulo", HOUR),
        iana("America/Santiago", HOUR),
        iana("Asia/Kolkata", 0),
        iana("Asia/Kathmandu", HOUR / 4),
        // +10:00 before March 1981, then +10:30 with summer times of +11:30
        // (1981-1985) and +11.
        iana("Australia/Lord_Howe", 3 * HOUR / 2),
        fixed(-5 * 3600),
        fixed(5 * 3600 + 45 * 60),
        TestZone {
            zone: Zone::posix(cet).unwrap(),
            rules: TimeZone::posix(cet).unwrap(),
            swing_ms: HOUR,
        },
    ]
}

struct Case {
    period: Period,
    /// Index into `test_zones()`.
    zone: usize,
}

fn cases() -> &'static (Vec<TestZone>, Vec<Case>) {
    static CASES: OnceLock<(Vec<TestZone>, Vec<Case>)> = OnceLock::new();
    CASES.get_or_init(|| {
        let zones = test_zones();
        let mut cases = Vec::new();
        for (unit, every) in [
            (Unit::Second, 1),
            (Unit::Second, 10),
            (Unit::Minute, 1),
            (Unit::Minute, 15),
            (Unit::Hour, 1),
            (Unit::Hour, 7),
        ] {
            cases.push(Case {
                period: Period::new(unit, every).unwrap(),
                zone: 0,
            });
        }
        for (z, _) in zones.iter().enumerate() {
            for (unit, every) in [
                (Unit::Day, 1),
                (Unit::Day, 3),
                (Unit::Week, 1),
                (Unit::Week, 2),
                (Unit::Month, 1),
                (Unit::Month, 3),
                (Unit::Month, 5),
                (Unit::Year, 1),
                (Unit::Year, 2),
            ] {
                for (h, m) in [(0, 0), (2, 30), (6, 0), (23, 30)] {
                    for week_start in [Weekday::Monday, Weekday::Sunday, Weekday::Saturday] {
                        if unit != Unit::Week && week_start != Weekday::Monday {
                            continue;
                        }
                        let period = Period::new(unit, every)
                            .unwrap()
                            .in_zone(zones[z].zone)
                            .weeks_start_on(week_start)
                            .days_start_at(h, m)
                            .unwrap();
                        cases.push(Case { period, zone: z });
                    }
                }
            }
        }
        (zones, cases)
    })
}

/// The shortest and longest calendar length of `every` units, ms.
fn calendar_bounds(unit: Unit, every: i64) -> (i64, i64) {
    match unit {
        Unit::Millisecond => (every, every),
        Unit::Second => (every * 1000, every * 1000),
        Unit::Minute => (every * 60_000, every * 60_000),
        Unit::Hour => (every * HOUR, every * HOUR),
        Unit::Day => (every * DAY, every * DAY),
        Unit::Week => (every * 7 * DAY, every * 7 * DAY),
        // 1 month: 28..=31 days; 3: 89 (Jan-Mar, common) ..= 92 (Jul-Sep);
        // 5: 150 (Nov-Mar or Oct-Feb... common) ..= 153.
        Unit::Month => match every {
            1 => (28 * DAY, 31 * DAY),
            3 => (89 * DAY, 92 * DAY),
            5 => (150 * DAY, 153 * DAY),
            _ => unreachable!("months of the property test"),
        },
        Unit::Year => (every * 365 * DAY, every * 365 * DAY + DAY),
        other => unreachable!("no unit {other} in the property test"),
    }
}

/// Checks one instant against one period; an `Err` names what failed.
fn check(case: &Case, zones: &[TestZone], t_ms: i64) -> Result<(), String> {
    let p = &case.period;
    let z = &zones[case.zone];
    let t = at_ms(t_ms);
    let r: Range<SystemTime> = p.containing(t).map_err(|e| e.to_string())?;
    let (start, end) = (ms(r.start), ms(r.end));
    let shown = || {
        format!(
            "{p} at {}: {} .. {}",
            stamp(t),
            stamp(r.start),
            stamp(r.end)
        )
    };
    if !(start <= t_ms && t_ms < end) {
        return Err(format!("not inside: {}", shown()));
    }
    // The same period from its first and its last millisecond.
    for inside in [start, end - 1] {
        let again = p.containing(at_ms(inside)).map_err(|e| e.to_string())?;
        if again != r {
            return Err(format!("{} from {inside}: {again:?}", shown()));
        }
    }
    // Contiguous: the next starts at its end, the previous ends at its
    // start.
    let next = p.containing(r.end).map_err(|e| e.to_string())?;
    if next.start != r.end || next.end <= next.start {
        return Err(format!("next {:?}: {}", next, shown()));
    }
    // (Only its end: the start of a period that started before the epoch
    // is wrong, see `a_period_that_started_before_the_epoch_keeps_its_start`.)
    if start > 0 {
        let prev = p.containing(at_ms(start - 1)).map_err(|e| e.to_string())?;
        if prev.end != r.start {
            return Err(format!("previous ends at {}: {}", stamp(prev.end), shown()));
        }
    }
    // As long as the calendar says, give or take the zone's offset swing.
    let (short, long) = calendar_bounds(p.unit(), i64::from(p.every()));
    let len = end - start;
    if len < short - z.swing_ms || len > long + z.swing_ms {
        return Err(format!("length {len} ms: {}", shown()));
    }
    // It starts where the calendar says.
    let every = i64::from(p.every());
    match p.unit() {
        Unit::Millisecond | Unit::Second | Unit::Minute | Unit::Hour => {
            if start % short != 0 {
                return Err(format!("not aligned to the epoch: {}", shown()));
            }
        }
        Unit::Day | Unit::Week | Unit::Month | Unit::Year => {
            let day_start = SignedDuration::try_from(p.day_start()).unwrap();
            let first = Timestamp::from_millisecond(start).unwrap();
            let wall: DateTime = z.rules.to_datetime(first);
            // The calendar date the period starts on (the wall clock less
            // the day start; a start moved by a gap stays on its date).
            let date: Date = (wall - day_start).date();
            let at = Time::MIN + day_start;
            let expected = z
                .rules
                .to_ambiguous_timestamp(date.to_datetime(at))
                .compatible()
                .unwrap();
            if expected != first {
                return Err(format!(
                    "starts at {wall} on the wall clock, not at {date} {at}: {}",
                    shown()
                ));
            }
            let epoch_day = TimeZone::UTC
                .to_timestamp(date.to_datetime(Time::MIN))
                .unwrap()
                .as_second()
                .div_euclid(86_400);
            let aligned = match p.unit() {
                Unit::Day => epoch_day.rem_euclid(every) == 0,
                Unit::Week => {
                    let want = match p.week_start() {
                        Weekday::Monday => 0,
                        Weekday::Tuesday => 1,
                        Weekday::Wednesday => 2,
                        Weekday::Thursday => 3,
                        Weekday::Friday => 4,
                        Weekday::Saturday => 5,
                        Weekday::Sunday => 6,
                    };
                    // Weeks of `every` count from the one holding
                    // 1970-01-01 (a Thursday, Monday-offset 3).
                    let first_week = -((3 - want) as i64).rem_euclid(7);
                    date.weekday().to_monday_zero_offset() == want
                        && (epoch_day - first_week).rem_euclid(7 * every) == 0
                }
                Unit::Month => {
                    date.day() == 1
                        && (i64::from(date.year()) * 12 + i64::from(date.month()) - 1)
                            .rem_euclid(every)
                            == 0
                }
                Unit::Year => {
                    date.day() == 1
                        && date.month() == 1
                        && i64::from(date.year()).rem_euclid(every) == 0
                }
                _ => unreachable!(),
            };
            if !aligned {
                return Err(format!("{date} starts no such period: {}", shown()));
            }
        }
        other => unreachable!("no unit {other} in the property test"),
    }
    Ok(())
}

/// 1972-01-01T00:00Z (730 days after the epoch): from there on, every
/// period of the cases started after the epoch (periods that started
/// before it have their own test,
/// `a_period_that_started_before_the_epoch_keeps_its_start`).
const FROM_1972_MS: i64 = 730 * 86_400_000;
/// 2150-01-01T00:00Z.
const TO_2150_MS: i64 = 5_680_281_600_000;

#[test]
fn every_instant_is_in_exactly_one_period_of_calendar_length() {
    let (zones, cases) = cases();
    let config = Config {
        cases: 4096,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    proptest!(config, |(c in 0..cases.len(), t in FROM_1972_MS..TO_2150_MS)| {
        if let Err(why) = check(&cases[c], zones, t) {
            prop_assert!(false, "{}", why);
        }
    });
}

/// The same checks on every daily case near the DST changes, gaps and folds
/// the named tests look at, five minutes apart for 2.5 hours either way: random instants rarely land there.
#[test]
fn every_instant_near_an_offset_change_is_in_exactly_one_period() {
    let (zones, cases) = cases();
    for change in [
        "2024-03-31T01:00:00Z",
        "2024-10-27T01:00:00Z",
        "2024-04-06T16:00:00Z",
        "2024-10-05T16:00:00Z",
        "2018-11-04T03:00:00Z",
        "2019-02-17T02:00:00Z",
        "2024-04-07T03:00:00Z",
        "2024-09-08T04:00:00Z",
        "1985-12-31T18:30:00Z",
        "1981-02-28T14:00:00Z",
        "2024-04-06T15:00:00Z",
        "2024-10-05T15:30:00Z",
    ] {
        let at = ts(change).as_millisecond();
        for case in cases.iter().filter(|c| c.period.unit() == Unit::Day) {
            for step in -30..=30 {
                let t = at + step * 5 * 60_000;
                if let Err(why) = check(case, zones, t) {
                    panic!("near {change}: {why}");
                }
            }
        }
    }
}
