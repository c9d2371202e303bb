//! Descriptors that matched no rule: counted per domain and logged once per domain and
//! keys, both bounded, so that a typo in a domain or key shows instead of silently
//! leaving traffic unlimited.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tollgate_core::{Descriptor, NoMatch};

use crate::ops::metrics::types::PlainCounter;
use tollgate_core::lock;

/// Domains the rules lack that get a label of their own; the rest share `other`.
const MAX_UNKNOWN_DOMAINS: usize = 64;
/// Domain-and-keys combinations logged; past it, one line says the rest are not.
const MAX_LOGGED: usize = 1024;
/// The label of unknown domains past [`MAX_UNKNOWN_DOMAINS`].
const OTHER: &str = "other";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

/// What has been labelled and logged so far. A descriptor seen before allocates nothing:
/// its counter is found by the domain's text, its log line by a hash.
#[derive(Debug, Default)]
struct Seen {
    /// The counter of each label given out: the rules' domains, unknown ones, `other`.
    counters: HashMap<Box<str>, PlainCounter>,
    unknown_domains: usize,
    /// Hashes of the domain-and-keys combinations logged.
    logged: HashSet<u64>,
    said_full: bool,
}

/// The count and the log of descriptors no rule limits.
#[derive(Debug, Default)]
pub(crate) struct Unmatched {
    counts: Family<DomainLabels, PlainCounter>,
    hasher: RandomState,
    seen: Mutex<Seen>,
}

impl Unmatched {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "tollgate_unmatched_requests_total",
            "Descriptors of requests that matched no rule and were not limited, by domain (unknown domains past 64 as other)",
            self.counts.clone(),
        );
    }

    /// Counts one descriptor of `domain` that matched no rule, and logs the first of each
    /// domain and set of keys.
    pub(crate) fn record(&self, domain: &str, descriptor: &Descriptor<'_>, why: NoMatch) {
        let mut hasher = self.hasher.build_hasher();
        domain.hash(&mut hasher);
        for (key, _) in descriptor.pairs() {
            key.hash(&mut hasher);
        }
        let combination = hasher.finish();
        // Updates under this lock are plain inserts: a poisoned lock is still usable.
        let mut seen = lock(&self.seen);
        self.count(&mut seen, domain, why);
        if seen.logged.contains(&combination) {
            return;
        }
        if seen.logged.len() >= MAX_LOGGED {
            if !seen.said_full {
                seen.said_full = true;
                tracing::info!(
                    "{MAX_LOGGED} kinds of descriptors matched no rule; no more are logged (tollgate_unmatched_requests_total counts them)"
                );
            }
            return;
        }
        seen.logged.insert(combination);
        drop(seen);
        let keys = descriptor
            .pairs()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
            .join(",");
        let reason = no_match_reason(domain, &keys, why);
        tracing::info!(
            domain,
            keys,
            "no rule matched: {reason}; the descriptor is not limited"
        );
    }

    /// Counts one on `domain`'s label: its own, or past [`MAX_UNKNOWN_DOMAINS`] unknown
    /// domains, `other`'s.
    fn count(&self, seen: &mut Seen, domain: &str, why: NoMatch) {
        let label = match why {
            _ if seen.counters.contains_key(domain) => domain,
            NoMatch::NoRule => domain,
            NoMatch::NoDomain if seen.unknown_domains < MAX_UNKNOWN_DOMAINS => {
                seen.unknown_domains += 1;
                domain
            }
            NoMatch::NoDomain => OTHER,
        };
        if let Some(counter) = seen.counters.get(label) {
            counter.inc();
            return;
        }
        let labels = DomainLabels {
            domain: label.to_owned(),
        };
        let counter = self.counts.get_or_create(&labels).clone();
        counter.inc();
        seen.counters.insert(label.into(), counter);
    }
}

/// Why nothing matched, in words (`keys`: the descriptor's keys, comma-separated); the
/// log of unmatched descriptors says the same.
pub(crate) fn no_match_reason(domain: &str, keys: &str, why: NoMatch) -> String {
    match why {
        NoMatch::NoDomain => format!("domain {domain} has no rules"),
        NoMatch::NoRule => format!("domain {domain} has no rule for the entries {keys}"),
    }
}
