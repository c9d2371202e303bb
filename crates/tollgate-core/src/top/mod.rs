//! Who is being limited: per rule, the heaviest keys by hits, by denials and by shadow
//! mode's would-be denials, over the last minute and the last hour, in fixed memory.
//!
//! Each rule keeps, per kind and span, [`SUB_WINDOWS`] Space-Saving sketches of
//! [`CAPACITY`] slots (`sketch.rs` states the error bound). The limiter records every
//! decided descriptor under one short lock per rule, reusing the counter key it built.

use std::hash::{DefaultHasher, Hasher};
use std::sync::Mutex;

use crate::clock::{NANOS_PER_SECOND, Timestamp};
use crate::lock::lock;

mod descriptor;
mod sketch;
pub(crate) mod snapshot;
mod window;

pub(crate) use descriptor::descriptor_of;
pub use sketch::CAPACITY;
pub use window::SUB_WINDOWS;
use window::{Estimate, Windowed};

/// What the keys are ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopBy {
    /// Descriptors decided.
    Hits,
    /// Descriptors denied.
    Denied,
    /// Descriptors that shadow mode admitted but the limit would have denied.
    Shadow,
}

/// The span the keys are ranked over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopWindow {
    /// The last minute (50 to 60 seconds: six sub-windows of ten).
    Minute,
    /// The last hour (50 to 60 minutes: six sub-windows of ten).
    Hour,
}

/// One heavy key of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopEntry {
    /// The rule's domain.
    pub domain: String,
    /// The rule's place in its domain: its levels joined with dots (`key_value.key`).
    pub rule: String,
    /// The descriptor's entries, `k=v,k2=v2`, as the counter key names them.
    pub descriptor: String,
    /// The true count is at most this.
    pub count: u64,
    /// And at least `count - error`.
    pub error: u64,
}

/// One rule's sketches, kept across rule reloads that keep the rule.
#[derive(Debug)]
pub(crate) struct RuleTop(Mutex<Kinds>);

/// A minute's and an hour's sketches for each [`TopBy`].
#[derive(Debug)]
struct Kinds([(Windowed, Windowed); 3]);

impl Default for RuleTop {
    fn default() -> Self {
        let spans = || {
            (
                Windowed::new(10 * NANOS_PER_SECOND),
                Windowed::new(600 * NANOS_PER_SECOND),
            )
        };
        Self(Mutex::new(Kinds([spans(), spans(), spans()])))
    }
}

fn index(by: TopBy) -> usize {
    match by {
        TopBy::Hits => 0,
        TopBy::Denied => 1,
        TopBy::Shadow => 2,
    }
}

/// The hash a sketch finds a key by. Fixed keys are safe here: a sketch compares the key
/// itself when hashes match, so colliding keys cost a comparison, never a wrong count.
pub(crate) fn hash_key(key: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(key.as_bytes());
    hasher.finish()
}

impl RuleTop {
    /// One descriptor of counter `key` decided at `now`: a hit, and a denial or a
    /// would-be denial when `denied` says so.
    pub(crate) fn record(&self, now: Timestamp, key: &str, denied: Option<TopBy>) {
        let hash = hash_key(key);
        let mut kinds = lock(&self.0);
        for by in std::iter::once(TopBy::Hits).chain(denied) {
            let (minute, hour) = &mut kinds.0[index(by)];
            minute.add(now, hash, key, 1);
            hour.add(now, hash, key, 1);
        }
    }

    /// The keys of the span ending at `now`, heaviest first.
    pub(crate) fn estimates(&self, now: Timestamp, by: TopBy, window: TopWindow) -> Vec<Estimate> {
        let kinds = lock(&self.0);
        let (minute, hour) = &kinds.0[index(by)];
        match window {
            TopWindow::Minute => minute.estimates(now),
            TopWindow::Hour => hour.estimates(now),
        }
    }
}

#[cfg(test)]
impl RuleTop {
    /// Slots held and bytes their keys reserve, over every sketch.
    fn footprint(&self) -> (usize, usize) {
        let kinds = lock(&self.0);
        kinds
            .0
            .iter()
            .flat_map(|(minute, hour)| [minute, hour])
            .map(Windowed::footprint)
            .fold((0, 0), |(s, b), (s2, b2)| (s + s2, b + b2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stays_fixed_as_a_million_distinct_keys_pass() {
        let top = RuleTop::default();
        let mut now = Timestamp::from_nanos(1_000 * NANOS_PER_SECOND);
        let mut after_warm_up = None;
        for i in 0..1_000_000u64 {
            // A key of fixed width, a tenth of them denied, time moving 10 ms per key:
            // almost three hours, so every sub-window turns over many times after the first
            // hour and twenty minutes.
            let denied = (i % 10 == 0).then_some(TopBy::Denied);
            top.record(now, &format!("web|ip={i:07}#s60.10"), denied);
            now = now + std::time::Duration::from_millis(10);
            if i == 500_000 {
                after_warm_up = Some(top.footprint());
            }
        }
        let (slots, bytes) = top.footprint();
        assert!(
            slots <= 2 * 2 * SUB_WINDOWS as usize * CAPACITY,
            "{slots} slots"
        );
        assert_eq!(Some((slots, bytes)), after_warm_up);
    }
}
