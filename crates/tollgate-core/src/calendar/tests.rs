use std::time::Duration;

use super::*;

const HOUR: Duration = Duration::from_secs(3_600);
const DAY: Duration = Duration::from_secs(86_400);

/// An RFC 3339 instant.
fn at(instant: &str) -> Timestamp {
    let t: jiff::Timestamp = instant.parse().expect("a valid instant");
    Timestamp::from_nanos(u64::try_from(t.as_nanosecond()).expect("after 1970"))
}

fn calendar(unit: Unit, multiplier: u32, zone: &str) -> Calendar {
    Calendar::new(unit, multiplier, zone).expect("a valid calendar")
}

/// Asserts, for each `"INSTANT in START/END"`, that the window holding the instant is
/// `[START, END)` (RFC 3339 UTC instants; the window as an ISO 8601 interval).
#[track_caller]
fn assert_windows(c: &Calendar, cases: &[&str]) {
    let show = |t: Timestamp| {
        jiff::Timestamp::from_nanosecond(i128::from(t.as_nanos()))
            .expect("in range")
            .to_string()
    };
    for case in cases {
        let (instant, interval) = case.split_once(" in ").expect("INSTANT in START/END");
        let w = c.window_at(at(instant));
        let got = format!("{}/{}", show(w.start), show(w.end));
        assert_eq!(
            got,
            interval,
            "the {} window holding {instant}",
            c.zone_name()
        );
    }
}

fn length(c: &Calendar, instant: &str) -> Duration {
    let w = c.window_at(at(instant));
    w.end.since(w.start)
}

#[test]
fn months_are_28_to_31_days_and_february_knows_leap_years() {
    let month = calendar(Unit::Month, 1, "UTC");
    for (instant, days) in [
        ("2026-02-14T12:00:00Z", 28),
        ("2028-02-29T23:59:59Z", 29),
        ("2100-02-01T00:00:00Z", 28),
        ("2000-02-10T00:00:00Z", 29),
        ("2026-04-30T10:00:00Z", 30),
        ("2026-01-31T23:59:59Z", 31),
    ] {
        assert_eq!(length(&month, instant), days * DAY, "{instant}");
    }
    assert_windows(
        &month,
        &["2028-02-29T23:59:59Z in 2028-02-01T00:00:00Z/2028-03-01T00:00:00Z"],
    );
    let year = calendar(Unit::Year, 1, "UTC");
    assert_eq!(length(&year, "2028-07-01T00:00:00Z"), 366 * DAY);
    assert_eq!(length(&year, "2026-07-01T00:00:00Z"), 365 * DAY);
}

#[test]
fn local_days_are_23_and_25_hours_long_on_daylight_saving_changes() {
    let berlin = calendar(Unit::Day, 1, "Europe/Berlin");
    assert_windows(
        &berlin,
        &[
            "2026-03-29T12:00:00Z in 2026-03-28T23:00:00Z/2026-03-29T22:00:00Z",
            "2026-10-25T12:00:00Z in 2026-10-24T22:00:00Z/2026-10-25T23:00:00Z",
        ],
    );
    assert_eq!(length(&berlin, "2026-06-01T12:00:00Z"), 24 * HOUR);
    let new_york = calendar(Unit::Day, 1, "America/New_York");
    assert_windows(
        &new_york,
        &[
            "2026-03-08T12:00:00Z in 2026-03-08T05:00:00Z/2026-03-09T04:00:00Z",
            "2026-11-01T12:00:00Z in 2026-11-01T04:00:00Z/2026-11-02T05:00:00Z",
        ],
    );
    // A month holding a change is an hour shorter or longer than its days.
    let month = calendar(Unit::Month, 1, "Europe/Berlin");
    assert_eq!(length(&month, "2026-03-15T00:00:00Z"), 31 * DAY - HOUR);
    assert_eq!(length(&month, "2026-10-15T00:00:00Z"), 31 * DAY + HOUR);
}

#[test]
fn a_day_whose_midnight_falls_in_a_gap_starts_when_the_gap_ends() {
    // Havana moves its clocks from 00:00 to 01:00: 2026-03-08 starts at 01:00 local.
    let havana = calendar(Unit::Day, 1, "America/Havana");
    assert_windows(
        &havana,
        &[
            "2026-03-08T12:00:00Z in 2026-03-08T05:00:00Z/2026-03-09T04:00:00Z",
            "2026-03-08T04:59:59Z in 2026-03-07T05:00:00Z/2026-03-08T05:00:00Z",
        ],
    );
}

#[test]
fn east_of_utc_the_local_month_starts_on_the_previous_utc_day() {
    let tokyo = calendar(Unit::Month, 1, "Asia/Tokyo");
    assert_windows(
        &tokyo,
        &[
            "2026-02-28T15:00:00Z in 2026-02-28T15:00:00Z/2026-03-31T15:00:00Z",
            "2026-02-28T14:59:59Z in 2026-01-31T15:00:00Z/2026-02-28T15:00:00Z",
        ],
    );
    // Auckland leaves daylight saving on 5 April: April is an hour longer than 30 days.
    let auckland = calendar(Unit::Month, 1, "Pacific/Auckland");
    assert_windows(
        &auckland,
        &["2026-04-10T00:00:00Z in 2026-03-31T11:00:00Z/2026-04-30T12:00:00Z"],
    );
}

#[test]
fn iso_weeks_start_on_monday_across_the_year_boundary() {
    let week = calendar(Unit::Week, 1, "UTC");
    assert_windows(
        &week,
        &["2026-12-31T18:00:00Z in 2026-12-28T00:00:00Z/2027-01-04T00:00:00Z"],
    );
    let berlin = calendar(Unit::Week, 1, "Europe/Berlin");
    assert_windows(
        &berlin,
        &[
            "2027-01-03T22:59:59Z in 2026-12-27T23:00:00Z/2027-01-03T23:00:00Z",
            "2027-01-03T23:00:00Z in 2027-01-03T23:00:00Z/2027-01-10T23:00:00Z",
        ],
    );
}

#[test]
fn three_months_are_quarters_from_january() {
    let quarter = calendar(Unit::Month, 3, "Europe/Berlin");
    assert_windows(
        &quarter,
        &["2026-05-15T00:00:00Z in 2026-03-31T22:00:00Z/2026-06-30T22:00:00Z"],
    );
    let utc = calendar(Unit::Month, 3, "UTC");
    assert_eq!(length(&utc, "2026-02-01T00:00:00Z"), 90 * DAY);
    assert_eq!(length(&utc, "2028-02-01T00:00:00Z"), 91 * DAY);
    assert_eq!(length(&utc, "2026-08-01T00:00:00Z"), 92 * DAY);
    assert_windows(
        &utc,
        &["2026-12-31T23:59:59Z in 2026-10-01T00:00:00Z/2027-01-01T00:00:00Z"],
    );
}

#[test]
fn years_start_on_the_first_of_january_in_the_zone() {
    let year = calendar(Unit::Year, 1, "Europe/Berlin");
    assert_windows(
        &year,
        &["2026-06-01T00:00:00Z in 2025-12-31T23:00:00Z/2026-12-31T23:00:00Z"],
    );
    let two = calendar(Unit::Year, 2, "UTC");
    assert_windows(
        &two,
        &["2027-06-01T00:00:00Z in 2026-01-01T00:00:00Z/2028-01-01T00:00:00Z"],
    );
}

#[cfg(any(feature = "redis", feature = "postgres"))]
#[test]
fn boundaries_hold_the_window_and_its_nearer_neighbour() {
    let day = calendar(Unit::Day, 1, "Europe/Berlin");
    // Early in the 23-hour day: the previous day's start, this day's, its end.
    assert_eq!(
        day.boundaries(at("2026-03-29T01:00:00Z")),
        [
            at("2026-03-27T23:00:00Z"),
            at("2026-03-28T23:00:00Z"),
            at("2026-03-29T22:00:00Z")
        ]
    );
    // Late in it: this day, then the next.
    assert_eq!(
        day.boundaries(at("2026-03-29T20:00:00Z")),
        [
            at("2026-03-28T23:00:00Z"),
            at("2026-03-29T22:00:00Z"),
            at("2026-03-30T22:00:00Z")
        ]
    );
}

#[test]
fn invalid_calendars_say_why() {
    assert_eq!(
        Calendar::new(Unit::Hour, 1, "UTC"),
        Err(CalendarError::Unit("hour"))
    );
    assert_eq!(
        Calendar::new(Unit::Day, 1, "Mars/Olympus"),
        Err(CalendarError::Zone("Mars/Olympus".into()))
    );
    assert_eq!(
        Calendar::new(Unit::Year, 101, "UTC"),
        Err(CalendarError::TooLong)
    );
    assert_eq!(
        Calendar::new(Unit::Day, 1, "Etc/Unknown"),
        Err(CalendarError::Zone("Etc/Unknown".into()))
    );
}

#[test]
fn the_shape_names_the_zone_canonically() {
    let mut a = String::new();
    calendar(Unit::Month, 3, "europe/berlin").write_shape(&mut a);
    assert_eq!(a, "month3@Europe/Berlin");
    let mut b = String::new();
    calendar(Unit::Day, 1, "UTC").write_shape(&mut b);
    assert_eq!(b, "day@UTC");
}
