//! The time units of the reference's YAML and of Envoy's API.

/// A time unit as Envoy knows it; month is 30 days and year 365 days, as in the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Parses a unit name, case-insensitively.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(name))
    }

    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit's length.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit closest to a window of `seconds` on a log scale (ties go to the smaller), so
    /// that a 30 s window is reported as a minute and a 20 s window as a second.
    pub fn nearest(seconds: u64) -> Self {
        let target = (seconds.max(1) as f64).ln();
        let mut best = Unit::Second;
        for unit in Self::ALL {
            let distance = ((unit.seconds() as f64).ln() - target).abs();
            let best_distance = ((best.seconds() as f64).ln() - target).abs();
            if distance < best_distance {
                best = unit;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::Unit;

    #[test]
    fn parses_case_insensitively_and_rejects_others() {
        assert_eq!(Unit::parse("SECOND"), Some(Unit::Second));
        assert_eq!(Unit::parse("Week"), Some(Unit::Week));
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::parse(""), None);
    }

    #[test]
    fn month_and_year_are_fixed_lengths() {
        assert_eq!(Unit::Month.seconds(), 2_592_000);
        assert_eq!(Unit::Year.seconds(), 31_536_000);
    }

    #[test]
    fn nearest_unit_on_a_log_scale() {
        assert_eq!(Unit::nearest(1), Unit::Second);
        assert_eq!(Unit::nearest(5), Unit::Second);
        assert_eq!(Unit::nearest(30), Unit::Minute);
        assert_eq!(Unit::nearest(300), Unit::Minute);
        assert_eq!(Unit::nearest(2 * 3_600), Unit::Hour);
        assert_eq!(Unit::nearest(2 * 86_400), Unit::Day);
        assert_eq!(Unit::nearest(14 * 86_400), Unit::Week);
        assert_eq!(Unit::nearest(400 * 86_400), Unit::Year);
    }
}
