//! How a bucket's remaining budget is divided among the streams that report it: pure
//! arithmetic, no time and no protocol.

/// Weight of the newest interval in a stream's smoothed demand.
const DEMAND_WEIGHT: f64 = 0.5;

/// A stream's demand after a report of `observed` requests (allowed + denied) in one
/// reporting interval: an exponentially weighted average, so that one quiet interval does
/// not take a busy stream's share away at once.
pub(crate) fn smooth(previous: Option<f64>, observed: u64) -> f64 {
    let observed = observed as f64;
    match previous {
        None => observed,
        Some(before) => before + DEMAND_WEIGHT * (observed - before),
    }
}

/// What one stream of a bucket may admit until its next report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Split {
    /// Units of the limit not yet counted in the store (limit − count).
    pub(crate) remaining: u64,
    /// Units granted and not yet reported, by every stream of the bucket (including the
    /// one asking), and by streams gone within the window: they may be spent already.
    pub(crate) outstanding: u64,
    /// The asking stream's smoothed demand.
    pub(crate) demand: f64,
    /// Every subscribed stream's demand, the asking one included.
    pub(crate) total_demand: f64,
    /// Subscribed streams, the asking one included.
    pub(crate) streams: usize,
}

impl Split {
    /// The grant: the stream's demand-proportional part of what is not counted yet, but
    /// never more than what no other grant may already be using, so that counted plus
    /// granted never exceeds the limit.
    pub(crate) fn grant(&self) -> u64 {
        let free = self.remaining.saturating_sub(self.outstanding);
        let fair = if self.total_demand > 0.0 {
            // Rounded down: the parts never add up to more than the whole.
            (self.remaining as f64 * (self.demand / self.total_demand)).floor() as u64
        } else {
            self.remaining / self.streams.max(1) as u64
        };
        fair.min(free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(remaining: u64, outstanding: u64, demand: f64, total_demand: f64) -> Split {
        Split {
            remaining,
            outstanding,
            demand,
            total_demand,
            streams: 2,
        }
    }

    #[test]
    fn demand_is_smoothed_from_the_first_report_on() {
        assert_eq!(smooth(None, 40), 40.0);
        assert_eq!(smooth(Some(40.0), 0), 20.0);
        assert_eq!(smooth(Some(20.0), 100), 60.0);
    }

    #[test]
    fn grants_follow_demand_and_never_overlap_what_others_hold() {
        assert_eq!(split(100, 0, 3.0, 4.0).grant(), 75);
        assert_eq!(split(100, 0, 1.0, 4.0).grant(), 25);
        // Another stream holds 50 it may have spent: only 50 are free.
        assert_eq!(split(100, 50, 3.0, 4.0).grant(), 50);
        assert_eq!(split(100, 100, 3.0, 4.0).grant(), 0);
        assert_eq!(split(0, 0, 3.0, 4.0).grant(), 0);
        // Nobody has asked for anything yet: equal parts.
        assert_eq!(split(9, 0, 0.0, 0.0).grant(), 4);
    }
}
