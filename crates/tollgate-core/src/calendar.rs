//! Calendar windows: a day, week, month or year (or a multiple of one) that starts at
//! midnight in a time zone, as UTC instants. jiff and its bundled time-zone database do
//! the civil arithmetic; the stores only ever see the UTC boundaries computed here.
//!
//! A multiple is counted from a fixed origin, so every instance cuts the same windows:
//! days from 1970-01-01, weeks from Monday 1969-12-29, months from January of year 0
//! (3 months are quarters, 6 halves), years from year 0.

use jiff::Span;
use jiff::civil::Date;
use jiff::tz::TimeZone;

use crate::clock::{NANOS_PER_SECOND, Timestamp};
use crate::unit::Unit;

/// The longest calendar window: its boundaries stay far inside jiff's range and below
/// 2^53 microseconds, where the Redis script's numbers are exact.
pub const MAX_CALENDAR_YEARS: u32 = 100;

/// Where a limit's windows start and end: `multiplier` calendar `unit`s in `zone`.
/// Cheap to clone (the zone is reference-counted); equal when the zone's name is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    unit: Unit,
    multiplier: u32,
    zone: TimeZone,
}

/// Why a calendar cannot be built; each names the rule field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// Second, minute or hour: every zone agrees on them.
    #[error("calendar applies to day, week, month or year, not {0}")]
    Unit(&'static str),
    /// Not a name in the time-zone database.
    #[error("unknown time zone '{0}' (expected an IANA name such as Europe/Berlin)")]
    Zone(String),
    /// More than [`MAX_CALENDAR_YEARS`].
    #[error("a calendar window is at most {MAX_CALENDAR_YEARS} years")]
    TooLong,
}

/// One window: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) start: Timestamp,
    pub(crate) end: Timestamp,
}

impl Calendar {
    /// Windows of `multiplier` calendar `unit`s in the IANA zone `zone` (any case).
    pub fn new(unit: Unit, multiplier: u32, zone: &str) -> Result<Self, CalendarError> {
        if matches!(unit, Unit::Second | Unit::Minute | Unit::Hour) {
            return Err(CalendarError::Unit(unit.as_str()));
        }
        let years = u64::from(multiplier) * unit.seconds() / Unit::Year.seconds();
        if multiplier == 0 || years > u64::from(MAX_CALENDAR_YEARS) {
            return Err(CalendarError::TooLong);
        }
        // jiff answers a few names (`Etc/Unknown`) with a zone no database holds.
        let zone = TimeZone::get(zone)
            .ok()
            .filter(|z| z.iana_name().is_some_and(|n| n != "Etc/Unknown"))
            .ok_or_else(|| CalendarError::Zone(zone.to_owned()))?;
        Ok(Self {
            unit,
            multiplier,
            zone,
        })
    }

    /// The zone's canonical name (`UTC`, `Europe/Berlin`).
    pub fn zone_name(&self) -> &str {
        self.zone.iana_name().unwrap_or("UTC")
    }

    /// The calendar unit.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// Units per window.
    pub fn multiplier(&self) -> u32 {
        self.multiplier
    }

    /// The window holding `now`. Past what jiff can represent (after the year 9999, so
    /// never from a [`Timestamp`]) a window from now that never ends.
    pub(crate) fn window_at(&self, now: Timestamp) -> Window {
        self.period_at(now)
            .and_then(|first| {
                Some(Window {
                    start: self.start_of(first)?,
                    end: self.start_of(first + i64::from(self.multiplier))?,
                })
            })
            .unwrap_or(Window {
                start: now,
                end: Timestamp::MAX,
            })
    }

    /// Three consecutive boundaries around `now`: those of the window holding it and of
    /// its nearer neighbour. A store whose clock differs from the caller's by less than
    /// half a window finds its own now between the first and the last.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn boundaries(&self, now: Timestamp) -> [Timestamp; 3] {
        let here = self.window_at(now);
        if now.since(here.start) < here.end.since(now) {
            let before = self.window_at(here.start - std::time::Duration::from_nanos(1));
            [before.start, here.start, here.end]
        } else {
            let after = self.window_at(here.end);
            [here.start, here.end, after.end]
        }
    }

    /// Appends what identifies these windows: unit, multiplier and zone.
    pub(crate) fn write_shape(&self, out: &mut String) {
        out.push_str(self.unit.as_str());
        if self.multiplier > 1 {
            out.push_str(&self.multiplier.to_string());
        }
        out.push('@');
        out.push_str(self.zone_name());
    }

    /// The index of the first unit of the window holding `now`, counted from the origin.
    fn period_at(&self, now: Timestamp) -> Option<i64> {
        let now = jiff::Timestamp::from_nanosecond(i128::from(now.as_nanos())).ok()?;
        let date = self.zone.to_datetime(now).date();
        let index = match self.unit {
            Unit::Day => days_between(origin_day()?, date)?,
            Unit::Week => days_between(origin_monday()?, date)?.div_euclid(7),
            Unit::Month => i64::from(date.year()) * 12 + i64::from(date.month()) - 1,
            _ => i64::from(date.year()),
        };
        let multiplier = i64::from(self.multiplier);
        Some(index.div_euclid(multiplier) * multiplier)
    }

    /// The first instant of the unit `index` in the zone: midnight, or the first instant
    /// after a gap that swallows midnight.
    fn start_of(&self, index: i64) -> Option<Timestamp> {
        let date = match self.unit {
            Unit::Day => origin_day()?.checked_add(Span::new().try_days(index).ok()?),
            Unit::Week => {
                origin_monday()?.checked_add(Span::new().try_days(index.checked_mul(7)?).ok()?)
            }
            Unit::Month => {
                let year = i16::try_from(index.div_euclid(12)).ok()?;
                let month = i8::try_from(index.rem_euclid(12) + 1).ok()?;
                Date::new(year, month, 1)
            }
            _ => Date::new(i16::try_from(index).ok()?, 1, 1),
        }
        .ok()?;
        let start = date.to_zoned_datetime(self.zone.clone()).ok()?.timestamp();
        let seconds = u64::try_from(start.as_second()).ok()?;
        seconds
            .checked_mul(NANOS_PER_SECOND)
            .map(Timestamp::from_nanos)
    }
}

fn origin_day() -> Option<Date> {
    Date::new(1970, 1, 1).ok()
}

fn origin_monday() -> Option<Date> {
    Date::new(1969, 12, 29).ok()
}

fn days_between(from: Date, to: Date) -> Option<i64> {
    Some(from.duration_until(to).as_secs().div_euclid(86_400))
}

#[cfg(test)]
mod tests;
