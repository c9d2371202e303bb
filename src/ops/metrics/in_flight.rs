//! Per-rule series of in-flight rules: slots acquired, released and expired, and the
//! slots held as the store last answered for the rule's counter.

use super::rules::DescriptorLabels;
use super::types::PlainCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tollgate_core::{InFlight, Limited};

/// The in-flight families, one series per rule label set, created only for in-flight rules.
#[derive(Debug, Clone, Default)]
pub(super) struct InFlightFamilies {
    acquired: Family<DescriptorLabels, PlainCounter>,
    released: Family<DescriptorLabels, PlainCounter>,
    expired: Family<DescriptorLabels, PlainCounter>,
    held: Family<DescriptorLabels, Gauge>,
}

impl InFlightFamilies {
    pub(super) fn register(&self, registry: &mut Registry) {
        for (name, help, family) in [
            (
                "acquired_total",
                "Slots an in-flight rule let requests take",
                &self.acquired,
            ),
            (
                "released_total",
                "Slots released by a refund (is_negative_hits)",
                &self.released,
            ),
            (
                "expired_total",
                "Slots not released within expire_after, dropped when a call found them",
                &self.expired,
            ),
        ] {
            registry.register(format!("tollgate_in_flight_{name}"), help, family.clone());
        }
        registry.register(
            "tollgate_in_flight_held",
            "Slots held on an in-flight rule's counter, as the store last answered this instance",
            self.held.clone(),
        );
    }

    /// The handles of one label set.
    pub(super) fn stats(&self, labels: &DescriptorLabels) -> InFlightStats {
        InFlightStats {
            acquired: self.acquired.get_or_create(labels).clone(),
            released: self.released.get_or_create(labels).clone(),
            expired: self.expired.get_or_create(labels).clone(),
            held: self.held.get_or_create(labels).clone(),
        }
    }
}

/// The in-flight series of one rule (or one request value of a detailed rule).
#[derive(Debug, Clone, Default)]
pub(crate) struct InFlightStats {
    acquired: PlainCounter,
    released: PlainCounter,
    expired: PlainCounter,
    held: Gauge,
}

impl InFlightStats {
    /// Counts what one call did to the slots, as the store answered it.
    pub(super) fn record(&self, outcome: &Limited, slots: InFlight) {
        if outcome.admitted {
            self.acquired.inc_by(outcome.hits);
        }
        self.released.inc_by(slots.released);
        self.expired.inc_by(slots.expired);
        self.held.set(i64::try_from(slots.held).unwrap_or(i64::MAX));
    }
}
