//! Calendar periods: [`Period`], [`Zone`], [`Unit`] and [`Weekday`], and
//! the boundaries a calendar quota sends to `lua/rate/calendar/*.lua`.
//!
//! A period is a calendar unit (a day, a week, a month, a year, or N of
//! one) in a time zone, or a run of seconds, minutes or hours counted from
//! the Unix epoch. The client computes boundaries (the zone's rules live
//! here, never in Redis); the server's clock picks the period it is in
//! (see [`Algorithm::Calendar`](super::Algorithm::Calendar)).
//!
//! [`Period`]'s documentation says where each boundary falls.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{Offset, TimeZone};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The unit a [`Period`] counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Unit {
    /// A millisecond of elapsed time, aligned to the Unix epoch.
    Millisecond,
    /// A second of elapsed time, aligned to the Unix epoch.
    Second,
    /// A minute of elapsed time, aligned to the Unix epoch.
    Minute,
    /// An hour of elapsed time, aligned to the Unix epoch.
    Hour,
    /// A calendar day in the period's zone (23, 24 or 25 hours).
    Day,
    /// A calendar week in the period's zone, from its first weekday.
    Week,
    /// A calendar month in the period's zone (28 to 31 days).
    Month,
    /// A calendar year in the period's zone (365 or 366 days).
    Year,
}

impl Unit {
    /// Its name, as in the serde form and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Millisecond => "millisecond",
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Elapsed-time units have a fixed length; calendar units do not.
    const fn fixed_ms(self) -> Option<i64> {
        match self {
            Unit::Millisecond => Some(1),
            Unit::Second => Some(1000),
            Unit::Minute => Some(60_000),
            Unit::Hour => Some(3_600_000),
            _ => None,
        }
    }

    /// The longest one unit can last on any wall clock: a day across a DST
    /// change gains at most an hour (a zone's offset changes by at most a
    /// day only in historical oddities, which jiff still resolves; this
    /// bound only sizes headers and how long markers are kept).
    const fn longest_ms(self) -> i64 {
        const DAY: i64 = 86_400_000;
        const SLACK: i64 = 3 * 3_600_000;
        match self {
            Unit::Millisecond | Unit::Second | Unit::Minute | Unit::Hour => match self.fixed_ms() {
                Some(ms) => ms,
                None => 0,
            },
            Unit::Day => DAY + SLACK,
            Unit::Week => 7 * DAY + SLACK,
            Unit::Month => 31 * DAY + SLACK,
            Unit::Year => 366 * DAY + SLACK,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Unit {
    type Err = Error;

    /// `millisecond`, `second`, `minute`, `hour`, `day`, `week`, `month` or
    /// `year` (a trailing `s` is accepted).
    fn from_str(s: &str) -> Result<Unit> {
        let one = s.strip_suffix('s').unwrap_or(s);
        [
            Unit::Millisecond,
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ]
        .into_iter()
        .find(|u| u.as_str() == one)
        .ok_or_else(|| Error::InvalidArgument {
            what: "period unit",
            reason: format!(
                "{s:?}: one of millisecond, second, minute, hour, day, week, month, year"
            ),
        })
    }
}

/// A day of the week: where a weekly [`Period`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weekday {
    /// ISO 8601's first day, and the default.
    Monday,
    #[allow(missing_docs)]
    Tuesday,
    #[allow(missing_docs)]
    Wednesday,
    #[allow(missing_docs)]
    Thursday,
    #[allow(missing_docs)]
    Friday,
    #[allow(missing_docs)]
    Saturday,
    /// The first day in the United States' calendars.
    Sunday,
}

impl Weekday {
    const ALL: [Weekday; 7] = [
        Weekday::Monday,
        Weekday::Tuesday,
        Weekday::Wednesday,
        Weekday::Thursday,
        Weekday::Friday,
        Weekday::Saturday,
        Weekday::Sunday,
    ];

    /// Its name in lower case, as in the serde form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Weekday::Monday => "monday",
            Weekday::Tuesday => "tuesday",
            Weekday::Wednesday => "wednesday",
            Weekday::Thursday => "thursday",
            Weekday::Friday => "friday",
            Weekday::Saturday => "saturday",
            Weekday::Sunday => "sunday",
        }
    }

    /// Days after Monday (Monday 0, Sunday 6).
    const fn days_after_monday(self) -> i64 {
        self as i64
    }
}

impl std::str::FromStr for Weekday {
    type Err = Error;

    fn from_str(s: &str) -> Result<Weekday> {
        let lower = s.to_ascii_lowercase();
        Weekday::ALL
            .into_iter()
            .find(|d| d.as_str() == lower || d.as_str()[..3] == lower)
            .ok_or_else(|| Error::InvalidArgument {
                what: "weekday",
                reason: format!("{s:?}: monday .. sunday"),
            })
    }
}

/// The time zone whose wall clock a calendar [`Period`] follows: UTC, a
/// fixed offset, a POSIX TZ rule, or (feature `tz`) an IANA zone.
///
/// A `Zone` is a small `Copy` value: the rules of every distinct zone name
/// a process uses are loaded once and kept for the life of the process
/// (there are about 600 IANA names, so this is bounded).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Zone(ZoneRepr);

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum ZoneRepr {
    Utc,
    /// Seconds east of UTC.
    Fixed(i32),
    /// An index into [`ZONES`].
    Loaded(u32),
}

/// The rules of every zone loaded by name: (its name, its rules).
static ZONES: RwLock<Vec<(String, TimeZone)>> = RwLock::new(Vec::new());

impl Zone {
    /// Coordinated Universal Time: no DST, days start at 00:00Z.
    pub const UTC: Zone = Zone(ZoneRepr::Utc);

    /// A fixed offset east of UTC, in seconds (`-5 * 3600` for UTC-5),
    /// without DST.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] beyond ±25:59:59.
    pub fn fixed(seconds_east: i32) -> Result<Zone> {
        Offset::from_seconds(seconds_east).map_err(|e| Error::InvalidArgument {
            what: "zone offset",
            reason: e.to_string(),
        })?;
        Ok(Zone(ZoneRepr::Fixed(seconds_east)))
    }

    /// A zone given by a POSIX TZ rule, such as `"CET-1CEST,M3.5.0,M10.5.0/3"`
    /// (central Europe since 1996). Needs no time-zone database, and says
    /// only what its rule says: no history.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the rule does not parse.
    pub fn posix(rule: &str) -> Result<Zone> {
        Zone::load(rule, || TimeZone::posix(rule))
    }

    /// An IANA zone (`"Europe/Berlin"`, `"America/Sao_Paulo"`) from the
    /// system's time-zone database, read once per name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the database has no such zone.
    #[cfg(feature = "tz")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tz")))]
    pub fn named(name: &str) -> Result<Zone> {
        if name == "UTC" {
            return Ok(Zone::UTC);
        }
        Zone::load(name, || TimeZone::get(name))
    }

    /// `UTC`, an offset (`+05:30`, `-08:00`), an IANA name (feature `tz`),
    /// or a POSIX TZ rule: what [`Zone::name`] gives back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when it is none of them.
    pub fn parse(text: &str) -> Result<Zone> {
        if text == "UTC" || text == "Z" {
            return Ok(Zone::UTC);
        }
        if let Some(seconds) = parse_offset(text) {
            return Zone::fixed(seconds);
        }
        #[cfg(feature = "tz")]
        if let Ok(zone) = Zone::named(text) {
            return Ok(zone);
        }
        Zone::posix(text).map_err(|_| Error::InvalidArgument {
            what: "zone",
            reason: if cfg!(feature = "tz") {
                format!("{text:?} is no IANA zone, offset or POSIX TZ rule")
            } else {
                format!(
                    "{text:?} is no offset or POSIX TZ rule \
                     (IANA names need the `tz` feature)"
                )
            },
        })
    }

    fn load(
        name: &str,
        rules: impl FnOnce() -> std::result::Result<TimeZone, jiff::Error>,
    ) -> Result<Zone> {
        let read = ZONES.read().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = read.iter().position(|(n, _)| n == name) {
            return Ok(Zone(ZoneRepr::Loaded(i as u32)));
        }
        drop(read);
        let tz = rules().map_err(|e| Error::InvalidArgument {
            what: "zone",
            reason: format!("{name:?}: {e}"),
        })?;
        // The database's own spelling ("europe/berlin" finds
        // "Europe/Berlin"): one zone, one name, one tag.
        let canonical = tz.iana_name().unwrap_or(name).to_owned();
        let name = canonical.as_str();
        let mut write = ZONES.write().unwrap_or_else(|e| e.into_inner());
        let i = match write.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                write.push((name.to_owned(), tz));
                write.len() - 1
            }
        };
        Ok(Zone(ZoneRepr::Loaded(i as u32)))
    }

    /// Its name: `UTC`, `+05:30`, or the name it was loaded by.
    pub fn name(&self) -> String {
        match self.0 {
            ZoneRepr::Utc => "UTC".to_owned(),
            ZoneRepr::Fixed(s) => {
                let sign = if s < 0 { '-' } else { '+' };
                let a = s.unsigned_abs();
                let (h, m, sec) = (a / 3600, a / 60 % 60, a % 60);
                if sec == 0 {
                    format!("{sign}{h:02}:{m:02}")
                } else {
                    format!("{sign}{h:02}:{m:02}:{sec:02}")
                }
            }
            ZoneRepr::Loaded(i) => Self::with_loaded(i, |n, _| n.to_owned()),
        }
    }

    fn with_loaded<T>(i: u32, f: impl FnOnce(&str, &TimeZone) -> T) -> T {
        let read = ZONES.read().unwrap_or_else(|e| e.into_inner());
        let (name, tz) = &read[i as usize];
        f(name, tz)
    }

    fn rules(&self) -> TimeZone {
        match self.0 {
            ZoneRepr::Utc => TimeZone::UTC,
            ZoneRepr::Fixed(s) => TimeZone::fixed(Offset::from_seconds(s).unwrap_or(Offset::UTC)),
            ZoneRepr::Loaded(i) => Self::with_loaded(i, |_, tz| tz.clone()),
        }
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({})", self.name())
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for Zone {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for Zone {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Zone, D::Error> {
        let text = String::deserialize(d)?;
        Zone::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// `+HH:MM`, `-HH:MM` or `±HH:MM:SS` as seconds east of UTC.
fn parse_offset(text: &str) -> Option<i32> {
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let mut parts = rest.split(':');
    let field = |p: &str, max: i32| -> Option<i32> {
        let v: i32 =
            (p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit())).then(|| p.parse().ok())??;
        (v <= max).then_some(v)
    };
    let (h, m) = (field(parts.next()?, 25)?, field(parts.next()?, 59)?);
    // Seconds are optional, but when present they must be valid.
    let s = match parts.next() {
        Some(p) => field(p, 59)?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(sign * (h * 3600 + m * 60 + s))
}

/// A calendar period: `every` [`Unit`]s, on the wall clock of a [`Zone`]
/// for days and longer.
///
/// # Where the boundaries fall
///
/// * **Milliseconds, seconds, minutes, hours**: elapsed time, `N × unit`
///   long, aligned to the Unix epoch (so an hour ends at the same instant everywhere;
///   the zone, the week's start and the day's start do not apply).
/// * **Days**: a day starts at the period's day start (midnight unless
///   [`Period::days_start_at`]) on the zone's wall clock; N days are
///   counted from 1970-01-01.
/// * **Weeks**: start on [`Period::weeks_start_on`] (Monday by default) at
///   the day start; N weeks are counted from the week holding 1970-01-01.
/// * **Months**: start on the 1st at the day start; N months are counted
///   from January of year 0, so 3 months are the quarters and 6 the halves.
/// * **Years**: start on 1 January at the day start; N years from year 0.
///
/// A wall-clock start that falls in a DST gap (the clocks jump over it)
/// is read with the offset before the jump, so it moves later by the
/// gap's length (jiff's "compatible" rule: 02:30 on Berlin's spring-forward
/// night is 03:30 CEST, a São Paulo midnight that does not exist is
/// 01:00); one that falls in a fold (the clocks repeat an hour) is its
/// first occurrence. So a day is 23 or 25 hours long across a DST change, every
/// instant is in exactly one period, and periods follow each other without
/// gap or overlap.
///
/// # Example
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use nolock::rate::{Period, Weekday, Zone};
///
/// # fn main() -> nolock::Result<()> {
/// // Months in UTC+1 (no DST), resetting at 06:00 on the 1st.
/// let month = Period::MONTH.in_zone(Zone::fixed(3600)?).days_start_at(6, 0)?;
/// // 2024-02-10T00:00:00Z is in February 2024: from 1 February 05:00Z
/// // to 1 March 05:00Z (a leap year: 29 days).
/// let at = UNIX_EPOCH + Duration::from_secs(1_707_523_200);
/// let feb = month.containing(at)?;
/// assert_eq!(feb.end.duration_since(feb.start).unwrap(), Duration::from_secs(29 * 86_400));
///
/// let weeks = Period::WEEK.weeks_start_on(Weekday::Sunday);
/// assert_eq!(weeks.to_string(), "1 week in UTC from 00:00, weeks from sunday");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "PeriodParts", into = "PeriodParts")]
pub struct Period {
    unit: Unit,
    every: u32,
    zone: Zone,
    week_start: Weekday,
    /// Seconds after midnight at which a day starts, below 86 400.
    day_start: u32,
}

impl Period {
    /// One calendar day, midnight to midnight in UTC.
    pub const DAY: Period = Period::of(Unit::Day, 1);
    /// One calendar week, Monday 00:00 to Monday 00:00 in UTC.
    pub const WEEK: Period = Period::of(Unit::Week, 1);
    /// One calendar month, the 1st at 00:00 to the next 1st, in UTC.
    pub const MONTH: Period = Period::of(Unit::Month, 1);
    /// One calendar year, 1 January at 00:00 to the next, in UTC.
    pub const YEAR: Period = Period::of(Unit::Year, 1);

    const fn of(unit: Unit, every: u32) -> Period {
        Period {
            unit,
            every,
            zone: Zone::UTC,
            week_start: Weekday::Monday,
            day_start: 0,
        }
    }

    /// `every` units (at least 1): 3 months are quarters, 15 minutes are
    /// the quarter hours.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLimit`] for 0; [`Error::OutOfRange`] when the period
    /// could last longer than [`MAX_PERIOD`](super::MAX_PERIOD).
    pub fn new(unit: Unit, every: u32) -> Result<Period> {
        if every == 0 {
            return Err(Error::ZeroLimit {
                what: "period length",
            });
        }
        let max = super::MAX_PERIOD.as_millis() as i64;
        let most = max / unit.longest_ms();
        if i64::from(every) > most {
            return Err(Error::OutOfRange {
                what: "period length (at most MAX_PERIOD)",
                given: u64::from(every),
                max: most as u64,
            });
        }
        Ok(Period::of(unit, every))
    }

    /// `n` milliseconds, aligned to the Unix epoch. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn millis(n: u32) -> Result<Period> {
        Period::new(Unit::Millisecond, n)
    }

    /// The period of a quota that is no calendar quota
    /// ([`Quota::per`](super::Quota::per)) under
    /// [`Algorithm::Calendar`](super::Algorithm::Calendar): runs of its
    /// length aligned to the Unix epoch, in the largest unit that divides
    /// it (a minute is `1 minute`, 1500 ms is `1500 millisecond`).
    pub(super) fn elapsed(ms: u64) -> Result<Period> {
        let units = [
            (Unit::Hour, 3_600_000),
            (Unit::Minute, 60_000),
            (Unit::Second, 1000),
            (Unit::Millisecond, 1),
        ];
        let (unit, size) = units
            .into_iter()
            .find(|(_, size)| ms.is_multiple_of(*size))
            .unwrap_or((Unit::Millisecond, 1));
        let every = u32::try_from(ms / size).map_err(|_| Error::OutOfRange {
            what: "calendar period (in its largest whole unit)",
            given: ms / size,
            max: u64::from(u32::MAX),
        })?;
        Period::new(unit, every)
    }

    /// `n` seconds, aligned to the Unix epoch. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn seconds(n: u32) -> Result<Period> {
        Period::new(Unit::Second, n)
    }

    /// `n` minutes, aligned to the Unix epoch. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn minutes(n: u32) -> Result<Period> {
        Period::new(Unit::Minute, n)
    }

    /// `n` hours, aligned to the Unix epoch. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn hours(n: u32) -> Result<Period> {
        Period::new(Unit::Hour, n)
    }

    /// `n` calendar days. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn days(n: u32) -> Result<Period> {
        Period::new(Unit::Day, n)
    }

    /// `n` calendar weeks. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn weeks(n: u32) -> Result<Period> {
        Period::new(Unit::Week, n)
    }

    /// `n` calendar months. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn months(n: u32) -> Result<Period> {
        Period::new(Unit::Month, n)
    }

    /// `n` calendar years. See [`Period::new`].
    ///
    /// # Errors
    ///
    /// As [`Period::new`].
    pub fn years(n: u32) -> Result<Period> {
        Period::new(Unit::Year, n)
    }

    /// The same period on `zone`'s wall clock. Seconds, minutes and hours
    /// count elapsed time and keep UTC: the zone does not move them.
    #[must_use]
    pub fn in_zone(self, zone: Zone) -> Period {
        if self.unit.fixed_ms().is_some() {
            return self;
        }
        Period { zone, ..self }
    }

    /// Weeks start on `day` (Monday by default). Only weeks have a first
    /// day; other units are returned as they are.
    #[must_use]
    pub fn weeks_start_on(self, day: Weekday) -> Period {
        if self.unit != Unit::Week {
            return self;
        }
        Period {
            week_start: day,
            ..self
        }
    }

    /// Days start at `hour:minute` on the zone's wall clock (midnight by
    /// default): a daily quota that resets at 06:00, a month that starts on
    /// the 1st at 06:00. Seconds, minutes and hours are returned as they are.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an hour above 23 or a minute above 59.
    pub fn days_start_at(self, hour: u8, minute: u8) -> Result<Period> {
        if hour > 23 || minute > 59 {
            return Err(Error::InvalidArgument {
                what: "day start",
                reason: format!("{hour:02}:{minute:02} is no time of day"),
            });
        }
        if self.unit.fixed_ms().is_some() {
            return Ok(self);
        }
        Ok(Period {
            day_start: u32::from(hour) * 3600 + u32::from(minute) * 60,
            ..self
        })
    }

    /// The unit.
    pub const fn unit(&self) -> Unit {
        self.unit
    }

    /// How many units one period lasts.
    pub const fn every(&self) -> u32 {
        self.every
    }

    /// The zone whose wall clock it follows (UTC for elapsed-time units).
    pub const fn zone(&self) -> Zone {
        self.zone
    }

    /// The first day of a week.
    pub const fn week_start(&self) -> Weekday {
        self.week_start
    }

    /// When a day starts, after midnight on the zone's wall clock.
    pub const fn day_start(&self) -> Duration {
        Duration::from_secs(self.day_start as u64)
    }

    /// The longest one period can last: its length for elapsed-time units;
    /// for calendar units, the longest month, week or year plus three
    /// hours for offset changes. Used for the `w` of the `RateLimit-Policy`
    /// header and for how long a reset is remembered.
    pub fn longest(&self) -> Duration {
        Duration::from_millis((self.unit.longest_ms() * i64::from(self.every)) as u64)
    }

    /// The period holding `at`: `start <= at < end`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an instant before the Unix epoch or
    /// past the year 9999.
    pub fn containing(&self, at: SystemTime) -> Result<std::ops::Range<SystemTime>> {
        let ms = at
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .ok_or_else(|| out_of_calendar("before the Unix epoch"))?;
        let k = self.index_of(ms)?;
        let (start, end) = (self.bound(k)?, self.bound(k + 1)?);
        let time = |ms: i64| {
            let d = Duration::from_millis(ms.unsigned_abs());
            if ms >= 0 {
                UNIX_EPOCH + d
            } else {
                UNIX_EPOCH - d
            }
        };
        Ok(time(start)..time(end))
    }

    /// The boundaries a calendar script takes: the starts of the period
    /// before the one holding `ms`, of that one, of the next, and the end
    /// of the next (ms since the epoch). The server picks the one holding
    /// its own clock; three periods absorb a client clock off by up to a
    /// period either way.
    pub(super) fn candidates(&self, ms: i64) -> Result<[u64; 4]> {
        let k = self.index_of(ms)?;
        let mut out = [0; 4];
        for (slot, j) in out.iter_mut().zip(k - 1..) {
            *slot = u64::try_from(self.bound(j)?.max(0)).unwrap_or(0);
        }
        Ok(out)
    }

    /// The number in the state's tag (`k<number>x<limit>`): a 32-bit
    /// FNV-1a hash of the period's canonical text without its zone
    /// (`1 month from 00:00`), so two calendar limits of different kinds
    /// of period never read one state the same way.
    ///
    /// The zone is left out on purpose: it moves where a period starts,
    /// not what a period is. A customer whose zone changes keeps the
    /// stored period (and its count) until it ends, then counts in the new
    /// zone's periods, with no refusal; two processes with other zones for
    /// one key share the stored period, as with stale zone data.
    pub(super) fn tag_number(&self) -> u64 {
        let text = Period {
            zone: Zone::UTC,
            ..*self
        }
        .to_string();
        let text = text.replacen(" in UTC", "", 1);
        let mut h: u32 = 0x811c_9dc5;
        for b in text.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        u64::from(h)
    }

    /// The index of the period holding `ms`.
    fn index_of(&self, ms: i64) -> Result<i64> {
        if let Some(unit) = self.unit.fixed_ms() {
            return Ok(ms.div_euclid(unit * i64::from(self.every)));
        }
        let ts = Timestamp::from_millisecond(ms).map_err(|_| out_of_calendar("out of range"))?;
        let wall = self.zone.rules().to_datetime(ts);
        let shifted = wall
            .checked_sub(jiff::SignedDuration::from_secs(i64::from(self.day_start)))
            .map_err(|_| out_of_calendar("out of range"))?;
        let mut k = self.index_of_date(shifted.date())?;
        // The wall clock's date gives the period but for starts moved by a
        // gap or a fold; the boundaries themselves decide.
        while self.bound(k)? > ms {
            k -= 1;
        }
        while self.bound(k + 1)? <= ms {
            k += 1;
        }
        Ok(k)
    }

    fn index_of_date(&self, date: Date) -> Result<i64> {
        let every = i64::from(self.every);
        Ok(match self.unit {
            Unit::Day => epoch_days(date)?.div_euclid(every),
            Unit::Week => {
                let days = epoch_days(date)?;
                (days - self.first_week()).div_euclid(7 * every)
            }
            Unit::Month => {
                (i64::from(date.year()) * 12 + i64::from(date.month()) - 1).div_euclid(every)
            }
            Unit::Year => i64::from(date.year()).div_euclid(every),
            Unit::Millisecond | Unit::Second | Unit::Minute | Unit::Hour => {
                unreachable!("elapsed-time units")
            }
        })
    }

    /// Days from 1970-01-01 to the first week start on or before it
    /// (1970-01-01 was a Thursday).
    fn first_week(&self) -> i64 {
        -(3 - self.week_start.days_after_monday()).rem_euclid(7)
    }

    /// The first instant (ms) of period `k`.
    fn bound(&self, k: i64) -> Result<i64> {
        let every = i64::from(self.every);
        if let Some(unit) = self.unit.fixed_ms() {
            return k
                .checked_mul(unit * every)
                .ok_or_else(|| out_of_calendar("out of range"));
        }
        let date = match self.unit {
            Unit::Day => from_epoch_days(k * every)?,
            Unit::Week => from_epoch_days(self.first_week() + k * 7 * every)?,
            Unit::Month => {
                let m = k * every;
                let year = i16::try_from(m.div_euclid(12)).map_err(|_| out_of_calendar("year"))?;
                Date::new(year, (m.rem_euclid(12) + 1) as i8, 1)
                    .map_err(|_| out_of_calendar("year"))?
            }
            Unit::Year => {
                let year = i16::try_from(k * every).map_err(|_| out_of_calendar("year"))?;
                Date::new(year, 1, 1).map_err(|_| out_of_calendar("year"))?
            }
            Unit::Millisecond | Unit::Second | Unit::Minute | Unit::Hour => {
                unreachable!("elapsed-time units")
            }
        };
        let time = Time::new(
            (self.day_start / 3600) as i8,
            (self.day_start / 60 % 60) as i8,
            0,
            0,
        )
        .map_err(|_| out_of_calendar("day start"))?;
        let wall = DateTime::from_parts(date, time);
        let ts = self
            .zone
            .rules()
            .to_ambiguous_timestamp(wall)
            .compatible()
            .map_err(|_| out_of_calendar("out of range"))?;
        Ok(ts.as_millisecond())
    }
}

fn out_of_calendar(why: &str) -> Error {
    Error::InvalidArgument {
        what: "instant",
        reason: format!("outside the calendar periods can count ({why})"),
    }
}

fn epoch_days(date: Date) -> Result<i64> {
    let epoch = Date::constant(1970, 1, 1);
    let span = date
        .since(epoch)
        .map_err(|_| out_of_calendar("out of range"))?;
    Ok(i64::from(span.get_days()))
}

fn from_epoch_days(days: i64) -> Result<Date> {
    Date::constant(1970, 1, 1)
        .checked_add(
            jiff::Span::new()
                .try_days(days)
                .map_err(|_| out_of_calendar("day"))?,
        )
        .map_err(|_| out_of_calendar("out of range"))
}

impl fmt::Display for Period {
    /// `3 month in Europe/Berlin from 06:00` and, for weeks, `, weeks from
    /// sunday`: the canonical text (its tag number is a hash of it without
    /// the zone).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.every, self.unit)?;
        if self.unit.fixed_ms().is_some() {
            return Ok(());
        }
        let (h, m) = (self.day_start / 3600, self.day_start / 60 % 60);
        write!(f, " in {} from {h:02}:{m:02}", self.zone)?;
        if self.unit == Unit::Week {
            write!(f, ", weeks from {}", self.week_start.as_str())?;
        }
        Ok(())
    }
}

/// A [`Period`] as serde sees it: `{"unit": "month", "every": 1, "zone":
/// "Europe/Berlin", "week_start": "monday", "day_start": "06:00"}`, checked
/// on the way in; all but `unit` may be left out.
#[derive(Serialize, Deserialize)]
struct PeriodParts {
    unit: Unit,
    #[serde(default = "one")]
    every: u32,
    #[serde(default = "utc")]
    zone: Zone,
    #[serde(default = "monday")]
    week_start: Weekday,
    #[serde(default = "midnight")]
    day_start: String,
}

fn one() -> u32 {
    1
}
fn utc() -> Zone {
    Zone::UTC
}
fn monday() -> Weekday {
    Weekday::Monday
}
fn midnight() -> String {
    "00:00".to_owned()
}

impl From<Period> for PeriodParts {
    fn from(p: Period) -> Self {
        PeriodParts {
            unit: p.unit,
            every: p.every,
            zone: p.zone,
            week_start: p.week_start,
            day_start: format!("{:02}:{:02}", p.day_start / 3600, p.day_start / 60 % 60),
        }
    }
}

impl TryFrom<PeriodParts> for Period {
    type Error = Error;

    fn try_from(p: PeriodParts) -> Result<Period> {
        let (hour, minute) = parse_time_of_day(&p.day_start)?;
        Period::new(p.unit, p.every)?
            .in_zone(p.zone)
            .weeks_start_on(p.week_start)
            .days_start_at(hour, minute)
    }
}

/// `HH:MM` as an hour and a minute.
pub(crate) fn parse_time_of_day(text: &str) -> Result<(u8, u8)> {
    let bad = || Error::InvalidArgument {
        what: "day start",
        reason: format!("{text:?}: HH:MM, 00:00 to 23:59"),
    };
    let (h, m) = text.split_once(':').ok_or_else(bad)?;
    let digits = |s: &str| -> Option<u8> {
        (s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
    };
    match (digits(h), digits(m)) {
        (Some(h), Some(m)) if h < 24 && m < 60 => Ok((h, m)),
        _ => Err(bad()),
    }
}

/// The server's clock minus this process's, in ms, as the last calendar
/// reply showed it: calendar calls compute their boundaries for the server's
/// time as best known, so a client clock that is hours off still sends
/// the period the server is in (and when it does not, the server refuses
/// and says its time, and the call is built again once).
static SERVER_AHEAD_MS: AtomicI64 = AtomicI64::new(0);

thread_local! {
    /// The server's time (ms) a call is being built again for, after the
    /// server refused the first one ([`run_rebuilt`]): that call uses the
    /// time the server just gave, not the shared estimate, which another
    /// task may have moved meanwhile (towards another server).
    static REBUILDING_AT: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
}

/// This process's best estimate of the server's clock, ms since the epoch.
pub(super) fn server_now_ms() -> i64 {
    if let Some(ms) = REBUILDING_AT.with(std::cell::Cell::get) {
        return ms;
    }
    let local = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    local + SERVER_AHEAD_MS.load(Ordering::Relaxed)
}

/// Learns the server's clock from a reply's `now` (µs since the epoch).
pub(super) fn saw_server_time(server_us: u64) {
    let local = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let server = (server_us / 1000) as i64;
    SERVER_AHEAD_MS.store(server - local, Ordering::Relaxed);
}

/// The server's time (ms) in a NOLOCK_PERIOD refusal ("... the server
/// time <ms> ms is outside ...").
fn server_time_in(detail: &str) -> Option<i64> {
    detail
        .split("server time ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<i64>().ok())
}

/// Learns the server's clock from a NOLOCK_PERIOD refusal.
pub(crate) fn saw_server_time_in(detail: &str) {
    if let Some(ms) = server_time_in(detail) {
        saw_server_time(ms as u64 * 1000);
    }
}

/// Builds a calendar call again after the server refused `err` (a
/// [`Error::PeriodMismatch`]), for the time the server gave in it; any other
/// error is returned as it is.
pub(super) fn rebuild<O>(err: Error, build: impl Fn() -> Result<O>) -> Result<O> {
    let Error::PeriodMismatch { detail } = &err else {
        return Err(err);
    };
    let Some(ms) = server_time_in(detail) else {
        return Err(err);
    };
    REBUILDING_AT.with(|at| at.set(Some(ms)));
    let op = build();
    REBUILDING_AT.with(|at| at.set(None));
    op
}

/// Runs the operation `build` makes; when a calendar call was refused
/// because the server's clock was outside the periods it computed, builds
/// it again for the server's time the refusal gave and runs it once more.
/// Other operations never get that refusal, so this costs them nothing.
pub(super) async fn run_rebuilt<O, C>(
    build: impl Fn() -> Result<O>,
    conn: &mut C,
) -> Result<O::Output>
where
    O: crate::script::Operation,
    C: redis::aio::ConnectionLike + Send,
{
    match crate::script::run_one(&build()?, conn).await {
        Err(err @ Error::PeriodMismatch { .. }) => {
            crate::script::run_one(&rebuild(err, build)?, conn).await
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(y: i16, mo: i8, d: i8, h: i8, mi: i8, zone: &TimeZone) -> i64 {
        zone.to_timestamp(jiff::civil::date(y, mo, d).at(h, mi, 0, 0))
            .unwrap()
            .as_millisecond()
    }

    fn period_of(p: &Period, at: i64) -> (i64, i64) {
        let k = p.index_of(at).unwrap();
        (p.bound(k).unwrap(), p.bound(k + 1).unwrap())
    }

    #[test]
    fn months_end_on_the_last_millisecond_of_their_last_day() {
        let utc = TimeZone::UTC;
        let p = Period::MONTH;
        for (y, m, days) in [
            (2024, 1, 31),
            (2024, 2, 29),
            (2023, 2, 28),
            (2024, 4, 30),
            (2024, 12, 31),
        ] {
            let start = ms(y, m, 1, 0, 0, &utc);
            let end = start + days * 86_400_000;
            assert_eq!(period_of(&p, start), (start, end), "{y}-{m}");
            assert_eq!(period_of(&p, end - 1), (start, end), "{y}-{m} last ms");
            assert_eq!(period_of(&p, end).0, end, "{y}-{m} next");
        }
    }

    #[test]
    fn weeks_start_on_their_first_day() {
        let utc = TimeZone::UTC;
        // 2024-03-04 was a Monday; 2024-03-03 a Sunday.
        let monday = ms(2024, 3, 4, 0, 0, &utc);
        let sunday = ms(2024, 3, 3, 0, 0, &utc);
        let wed = ms(2024, 3, 6, 12, 0, &utc);
        assert_eq!(
            period_of(&Period::WEEK, wed),
            (monday, monday + 7 * 86_400_000)
        );
        let us = Period::WEEK.weeks_start_on(Weekday::Sunday);
        assert_eq!(period_of(&us, wed), (sunday, sunday + 7 * 86_400_000));
        assert_eq!(period_of(&us, sunday - 1).1, sunday);
    }

    #[test]
    fn days_across_dst_are_23_and_25_hours_in_both_hemispheres() {
        let berlin = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        let zone = Zone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        let day = Period::DAY.in_zone(zone);
        let spring = ms(2024, 3, 31, 12, 0, &berlin);
        let (s, e) = period_of(&day, spring);
        assert_eq!(e - s, 23 * 3_600_000);
        let autumn = ms(2024, 10, 27, 12, 0, &berlin);
        let (s, e) = period_of(&day, autumn);
        assert_eq!(e - s, 25 * 3_600_000);
        // Southern hemisphere: Chile (CLT-4, summer time from September's
        // first Sunday to April's first Sunday, changing at 24:00).
        let chile = Zone::posix("<-04>4<-03>,M9.1.6/24,M4.1.6/24").unwrap();
        let cl = TimeZone::posix("<-04>4<-03>,M9.1.6/24,M4.1.6/24").unwrap();
        let day = Period::DAY.in_zone(chile);
        let (s, e) = period_of(&day, ms(2024, 9, 8, 12, 0, &cl));
        assert_eq!(e - s, 23 * 3_600_000, "the first day of summer time");
        let (s, e) = period_of(&day, ms(2024, 4, 7, 12, 0, &cl));
        assert_eq!(e - s, 24 * 3_600_000, "the 25-hour day is the 6th");
        let (s, e) = period_of(&day, ms(2024, 4, 6, 12, 0, &cl));
        assert_eq!(e - s, 25 * 3_600_000);
    }

    #[test]
    fn a_day_start_at_six_moves_every_boundary() {
        let utc = TimeZone::UTC;
        let p = Period::DAY.days_start_at(6, 0).unwrap();
        let six = ms(2024, 5, 10, 6, 0, &utc);
        assert_eq!(period_of(&p, six), (six, six + 86_400_000));
        assert_eq!(period_of(&p, six - 1), (six - 86_400_000, six));
        let m = Period::MONTH.days_start_at(6, 0).unwrap();
        assert_eq!(period_of(&m, six).0, ms(2024, 5, 1, 6, 0, &utc));
        assert_eq!(
            period_of(&m, ms(2024, 5, 1, 5, 59, &utc)).1,
            ms(2024, 5, 1, 6, 0, &utc)
        );
    }

    #[test]
    fn elapsed_units_align_to_the_epoch_and_candidates_span_three_periods() {
        let p = Period::seconds(10)
            .unwrap()
            .in_zone(Zone::fixed(3600).unwrap());
        assert_eq!(p.zone(), Zone::UTC);
        assert_eq!(period_of(&p, 1_234_567), (1_230_000, 1_240_000));
        assert_eq!(
            p.candidates(1_234_567).unwrap(),
            [1_220_000, 1_230_000, 1_240_000, 1_250_000]
        );
    }

    #[test]
    fn the_text_and_serde_forms_round_trip() {
        let p = Period::months(3)
            .unwrap()
            .in_zone(Zone::fixed(-5 * 3600).unwrap())
            .days_start_at(6, 30)
            .unwrap();
        assert_eq!(p.to_string(), "3 month in -05:00 from 06:30");
        let json = serde_json::to_string(&p).unwrap();
        let back: Period = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.tag_number(), p.tag_number());
        assert_ne!(Period::MONTH.tag_number(), Period::DAY.tag_number());
        assert!(serde_json::from_str::<Period>(r#"{"unit":"day","every":0}"#).is_err());
        assert!(serde_json::from_str::<Period>(r#"{"unit":"day","day_start":"24:00"}"#).is_err());
        assert!(Zone::parse("+05:30").unwrap().name() == "+05:30");
        assert!(Zone::parse("nowhere/at all").is_err());
    }
}
