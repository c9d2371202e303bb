//! Counters by name: the one way, for every API, to find the counter a rule's limits share
//! for a descriptor or for a bucket of entries in no order (RLQS), and to consume, charge,
//! refund, reserve and read it on a store. `ShouldRateLimit` ([`crate::Limiter::decide`])
//! writes its keys with the same function, so both APIs name the same counter.

use std::time::Duration;

use crate::algo::{Hits, Verdict};
use crate::key::{write_counter_key, write_reference_key};
use crate::limit::Limit;
use crate::limiter::{Limiter, Recorder};
use crate::request::Descriptor;
use crate::rules::{Policy, Rule, Rules};
use crate::store::{KeyLayout, Store, StoreError};

/// Keys of a counter's companions start with this; counter keys start with an escaped
/// domain (or, in the reference's layout, a domain), which never begins with a bare `%`.
const COMPANION_PREFIX: char = '%';

/// One counter: its key in the store and the limits counted on it. Found through
/// [`Limiter::find_descriptor`] or [`Limiter::find_bucket`], or built for a request's own
/// limit ([`Counter::for_limits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    key: String,
    limits: Box<[Limit]>,
}

/// What the rules say about one descriptor or bucket: whether a rule applies, and if it
/// limits, the counter its limits are counted on for these entries.
#[derive(Debug, Clone)]
pub enum Found {
    /// No rule of the domain applies (or there is no such domain).
    NoRule,
    /// The rule is unlimited: nothing is counted.
    Unlimited(Rule),
    /// The rule's limits, counted on `counter`.
    Limited {
        /// The rule that applies.
        rule: Rule,
        /// Where its limits are counted for these entries.
        counter: Counter,
    },
}

/// What a counter answered to one operation, about its tightest limit: of the denying
/// limits the one with the longest wait, else the one with the fewest units left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Whether the units fit every limit (a consume counted them; a charge counted them
    /// anyway; a read or refund: whether the counter is within its limits).
    pub admitted: bool,
    /// Units left under the tightest limit (for a denial: left before it).
    pub remaining: u64,
    /// Which of [`Counter::limits`] that is.
    pub limit_index: usize,
    /// Admitted: until the counted units are forgotten; denied: until the same units would
    /// fit, with no other traffic.
    pub reset: Duration,
}

impl<R: Recorder> Limiter<R> {
    /// The rule and counter of `descriptor` in `domain`, as [`Limiter::decide`] counts it
    /// when the descriptor carries no limit of its own (`replaces` across a request's
    /// descriptors aside: that is a matter of the whole request).
    pub fn find_descriptor(&self, domain: &str, descriptor: &Descriptor<'_>) -> Found {
        let rules = self.rules();
        let rule = rules
            .domain(domain)
            .and_then(|d| d.find(descriptor.pairs()));
        found(self.store().key_layout(), domain, descriptor.pairs(), rule)
    }

    /// The rule and counter of `entries` in `domain`, given in no order (an RLQS bucket
    /// id): they are placed in the order the rules nest, and the counter is the one the
    /// descriptor of those entries in that order has ([`Limiter::find_descriptor`]).
    pub fn find_bucket(&self, domain: &str, entries: &[(&str, &str)]) -> Found {
        let rules: &Rules = &self.rules();
        match rules.domain(domain).and_then(|d| d.find_unordered(entries)) {
            Some((ordered, rule)) => found(
                self.store().key_layout(),
                domain,
                ordered.into_iter(),
                Some(rule),
            ),
            None => Found::NoRule,
        }
    }
}

impl Counter {
    /// The counter of a descriptor that carries its own `limits` (a request's limit
    /// override), in Tollgate's key layout.
    pub fn for_limits<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
        limits: &[Limit],
    ) -> Self {
        let mut key = String::new();
        write_counter_key(&mut key, domain, entries, &Limit::shape_of(limits));
        Self {
            key,
            limits: limits.into(),
        }
    }

    /// A counter of its own beside this one, named by `tag` and this counter's key, with
    /// other `limits`: for figures kept per counter (RLQS counts demand on one). Never the
    /// key of a descriptor's counter.
    pub fn companion(&self, tag: &str, limits: &[Limit]) -> Self {
        Self {
            key: format!("{COMPANION_PREFIX}{tag}|{}", self.key),
            limits: limits.into(),
        }
    }

    /// The key in the store.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The limits, in the rule's order.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// Counts `n` units if every limit has room for them.
    pub async fn consume(&self, store: &Store, n: u64) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Consume(n)).await
    }

    /// Counts `n` units whether or not they fit: usage reported after the fact.
    pub async fn charge(&self, store: &Store, n: u64) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Charge(n)).await
    }

    /// Gives back `n` units counted earlier.
    pub async fn refund(&self, store: &Store, n: u64) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Refund(n)).await
    }

    /// What is left, as it is (unlike a check of one more unit).
    pub async fn read(&self, store: &Store) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Charge(0)).await
    }

    /// Consumes up to `n` units: all of them if they fit, else what is left, when other
    /// clients take room as this asks. Returns how many were counted.
    pub async fn reserve(&self, store: &Store, n: u64) -> Result<u64, StoreError> {
        let mut asked = n;
        // Twice at most: a second refusal means the room is being taken as we ask.
        for _ in 0..2 {
            let reading = self.consume(store, asked).await?;
            if reading.admitted {
                return Ok(asked);
            }
            asked = reading.remaining.min(asked);
            if asked == 0 {
                break;
            }
        }
        Ok(0)
    }

    async fn apply(&self, store: &Store, hits: Hits) -> Result<Reading, StoreError> {
        let verdict: Verdict = store.apply(&self.key, &self.limits, hits).await?;
        Ok(Reading {
            admitted: verdict.decision.admitted,
            remaining: verdict.decision.remaining,
            limit_index: verdict.limit_index,
            reset: verdict.decision.reset,
        })
    }
}

/// Writes the key of the counter of `entries` (in the descriptor's order) in `domain` into
/// `out`: `rule` (when one matched) may count every value of a wildcard on one counter;
/// `shape` is its limits' shape.
pub(crate) fn write_key<'a>(
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

fn found<'a>(
    layout: KeyLayout,
    domain: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
    rule: Option<&'a Rule>,
) -> Found {
    let Some(rule) = rule else {
        return Found::NoRule;
    };
    match &rule.policy {
        Policy::Unlimited { .. } => Found::Unlimited(rule.clone()),
        Policy::Limited { limits, shape } => {
            let mut key = String::new();
            write_key(&mut key, layout, domain, entries, Some(rule), shape);
            Found::Limited {
                rule: rule.clone(),
                counter: Counter {
                    key,
                    limits: limits.clone(),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests;
