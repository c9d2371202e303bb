//! Descriptors that matched no rule: counted per domain and logged once per domain and
//! keys, both bounded, so that a typo in a domain or key shows instead of silently
//! leaving traffic unlimited.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tollgate_core::{Descriptor, NoMatch};

use crate::explain::no_match_reason;
use crate::metrics::PlainCounter;

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

/// What has been labelled and logged so far.
#[derive(Debug, Default)]
struct Seen {
    unknown_domains: HashSet<String>,
    logged: HashSet<(String, String)>,
    said_full: bool,
}

/// The count and the log of descriptors no rule limits.
#[derive(Debug, Default)]
pub(crate) struct Unmatched {
    counts: Family<DomainLabels, PlainCounter>,
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
        let keys = descriptor
            .pairs()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
            .join(",");
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let label = match why {
            NoMatch::NoRule => domain,
            NoMatch::NoDomain if seen.unknown_domains.contains(domain) => domain,
            NoMatch::NoDomain if seen.unknown_domains.len() < MAX_UNKNOWN_DOMAINS => {
                seen.unknown_domains.insert(domain.to_owned());
                domain
            }
            NoMatch::NoDomain => OTHER,
        };
        self.counts
            .get_or_create(&DomainLabels {
                domain: label.to_owned(),
            })
            .inc();
        let first = (domain.to_owned(), keys);
        if seen.logged.contains(&first) {
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
        let (domain, keys) = &first;
        let reason = no_match_reason(domain, keys, why);
        tracing::info!(
            domain,
            keys,
            "no rule matched: {reason}; the descriptor is not limited"
        );
        seen.logged.insert(first);
    }
}
