//! Where Tollgate keeps a counter: the counter key is `domain|key=value|…#SHAPE`, the shape
//! naming each limit's algorithm and window; PostgreSQL rows are keyed `PREFIX` and the
//! counter key, Redis keys are `PREFIX{COUNTER KEY}:v3` (the braces make the whole counter
//! key the Redis Cluster hash tag; `:v3` names the layout of the value). Every test that
//! looks a counter up in a store builds its key here, from the limit's parameters.

use std::fmt;
use std::time::Duration;

/// What identifies one limit's counter state: its algorithm, window and precision (the
/// quota is left out, so that a reload changing only the quota keeps the counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A sliding window of `precision` sub-windows.
    Sliding {
        window: Duration,
        precision: u32,
    },
    Fixed {
        window: Duration,
    },
    /// A token or leaky bucket: both keep one GCRA state.
    Bucket {
        window: Duration,
    },
    /// A calendar window: `multiplier` calendar `unit`s in the IANA `zone` (as the rule
    /// names it, canonically spelt).
    Calendar {
        unit: &'static str,
        multiplier: u32,
        zone: &'static str,
    },
}

impl Shape {
    /// A sliding window with the default precision of 10 sub-windows.
    pub fn sliding(window: Duration) -> Self {
        Self::Sliding {
            window,
            precision: 10,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Shape::Sliding { window, precision } => {
                write!(f, "s{}.{precision}", window.as_nanos())
            }
            Shape::Fixed { window } => write!(f, "f{}", window.as_nanos()),
            Shape::Bucket { window } => write!(f, "g{}", window.as_nanos()),
            Shape::Calendar {
                unit,
                multiplier: 1,
                zone,
            } => write!(f, "c{unit}@{zone}"),
            Shape::Calendar {
                unit,
                multiplier,
                zone,
            } => write!(f, "c{unit}{multiplier}@{zone}"),
        }
    }
}

/// The key of the counter for `entries` in `domain` under limits of `shapes`.
/// Only components that need no escaping are supported (asserted).
pub fn counter_key(domain: &str, entries: &[(&str, &str)], shapes: &[Shape]) -> String {
    let special = |s: &str| s.contains(['%', '|', '=', '#', '{', '}']);
    assert!(
        !special(domain) && entries.iter().all(|(k, v)| !special(k) && !special(v)),
        "counter_key builds keys only of components that need no escaping"
    );
    let mut key = domain.to_owned();
    for (k, v) in entries {
        key.push_str(&format!("|{k}={v}"));
    }
    let shapes: Vec<String> = shapes.iter().map(Shape::to_string).collect();
    key.push_str(&format!("#{}", shapes.join(",")));
    key
}

/// The Redis key of the counter for `entries` in `domain` under limits of `shapes`.
pub fn redis_key(prefix: &str, domain: &str, entries: &[(&str, &str)], shapes: &[Shape]) -> String {
    format!("{prefix}{{{}}}:v3", counter_key(domain, entries, shapes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_as_tollgate_writes_them() {
        let minute = Duration::from_secs(60);
        assert_eq!(
            redis_key("p:", "rl", &[("user", "ann")], &[Shape::sliding(minute)]),
            "p:{rl|user=ann#s60000000000.10}:v3"
        );
        let shapes = [
            Shape::Fixed { window: minute },
            Shape::Bucket { window: minute },
        ];
        assert_eq!(
            counter_key("d", &[("a", "1"), ("b", "2")], &shapes),
            "d|a=1|b=2#f60000000000,g60000000000"
        );
    }
}
