//! Which counter a descriptor counts on: its key, written the same way for deciding,
//! explaining, resetting and finding (`find.rs`), so that every API names one counter.

use std::sync::Arc;

use crate::counter::Counter;
use crate::key::{write_counter_key, write_reference_key};
use crate::rules::{Policy, Rule};
use crate::store::KeyLayout;

/// The counter the limits of `rule` are counted on for `entries` (in the descriptor's
/// order) in `domain`; none for an unlimited rule.
pub(super) fn rule_counter<'a>(
    layout: KeyLayout,
    domain: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
    rule: &'a Rule,
) -> Option<Counter> {
    let Policy::Limited { limits, shape } = &rule.policy else {
        return None;
    };
    let mut key = String::new();
    write_key(&mut key, layout, domain, entries, Some(rule), shape);
    Some(Counter::new(key, Arc::clone(limits)))
}

/// Writes the key of the counter of `entries` (in the descriptor's order) in `domain` into
/// `out`: `rule` (when one matched) may count every value of a wildcard on one counter;
/// `shape` is its limits' shape.
pub(super) fn write_key<'a>(
    out: &mut String,
    layout: KeyLayout,
    domain: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
    rule: Option<&'a Rule>,
    shape: &str,
) {
    let entries = entries
        .enumerate()
        .map(|(i, (k, v))| (k, rule.map_or(v, |r| r.key_value(i, v))));
    match layout {
        KeyLayout::Tollgate => write_counter_key(out, domain, entries, shape),
        KeyLayout::Reference => write_reference_key(out, domain, entries),
    }
}
