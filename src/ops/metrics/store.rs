//! The store's own figures (counters, round trips, debts, health), read from its snapshot
//! at every scrape.

use super::types::{encode_histogram, encode_plain_counter};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use tollgate_core::Store;

/// Store internals, read when scraped.
#[derive(Debug)]
pub(super) struct StoreCollector(pub(super) Store);

impl prometheus_client::collector::Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64| {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)
        };
        let counter = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64| {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            encode_plain_counter(value, metric)
        };
        let stats = self.0.stats();
        let entries = i64::try_from(stats.counters).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "tollgate_counters",
            "Counters held in memory (the local view for a shared store)",
            entries,
        )?;
        gauge(
            &mut encoder,
            "tollgate_counter_bytes",
            "Bytes the counters take in memory (bounded by --max-counter-memory)",
            i64::try_from(stats.bytes).unwrap_or(i64::MAX),
        )?;
        counter(
            &mut encoder,
            "tollgate_counter_evictions_total",
            "Counters evicted to stay under --max-counters and --max-counter-memory",
            stats.evictions,
        )?;
        counter(
            &mut encoder,
            "tollgate_counters_expired_total",
            "Counters dropped after their windows passed",
            stats.expired,
        )?;
        gauge(
            &mut encoder,
            "tollgate_store_up",
            "1 while the counter store answers",
            i64::from(stats.up),
        )?;
        let Some(s) = stats.shared else {
            return Ok(());
        };
        for (name, help, value) in [
            (
                "tollgate_store_round_trips_total",
                "Requests decided by a round trip to the shared store",
                s.round_trips,
            ),
            (
                "tollgate_local_denials_total",
                "Requests denied from the local view, without a round trip",
                s.local_denials,
            ),
            (
                "tollgate_store_fallbacks_total",
                "Requests decided per --on-store-error",
                s.fallbacks,
            ),
            (
                "tollgate_store_refreshes_total",
                "Background reads of counters the local view denies",
                s.refreshes,
            ),
            (
                "tollgate_store_reconnects_total",
                "Times the store connection came up",
                s.reconnects,
            ),
            (
                "tollgate_store_disagreements_total",
                "Round trips where the store and the local algorithm decided differently (the store decided)",
                s.disagreements,
            ),
            (
                "tollgate_store_decreases_announced_total",
                "Counters this instance decreased (refunds, lease units given back) and announced to the others",
                s.decreases_announced,
            ),
            (
                "tollgate_store_announcements_heard_total",
                "Resets and decreases heard from the instances sharing the store, this one included",
                s.announcements_heard,
            ),
            (
                "tollgate_store_debt_charged_total",
                "Units admitted without the store that were then counted in it",
                s.debt_charged,
            ),
            (
                "tollgate_store_debt_forgiven_total",
                "Units admitted without the store and never counted in it: their windows passed first, or too many counters owed at once",
                s.debt_forgiven,
            ),
            (
                "tollgate_store_credited_total",
                "Units given back to the store that this instance had given back without it (refunds, calls run after their requests were refused, slots taken for requests answered without one)",
                s.credited,
            ),
            (
                "tollgate_store_calls_in_doubt_total",
                "Calls whose connection broke after they were sent: each taken as whichever leaves the store's count higher",
                s.calls_in_doubt,
            ),
            (
                "tollgate_store_lease_taken_total",
                "Blocks of units hot counters leased from the shared store",
                s.leases_taken,
            ),
            (
                "tollgate_store_lease_units_leased_total",
                "Units in leased blocks, counted in the shared store when taken",
                s.lease_units_leased,
            ),
            (
                "tollgate_store_lease_units_returned_total",
                "Leased units not spent and given back to the shared store",
                s.lease_units_returned,
            ),
            (
                "tollgate_store_lease_local_admissions_total",
                "Requests admitted from a leased block, without a round trip",
                s.lease_local_admissions,
            ),
        ] {
            counter(&mut encoder, name, help, value)?;
        }
        gauge(
            &mut encoder,
            "tollgate_store_debts",
            "Counters owing the store units admitted without it",
            i64::try_from(s.debts).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut encoder,
            "tollgate_store_debt_units",
            "Units admitted without the store and not yet counted in it",
            i64::try_from(s.debt_units).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut encoder,
            "tollgate_store_credit_units",
            "Units this instance gave back without the store, still to be given back to it",
            i64::try_from(s.credit_units).unwrap_or(i64::MAX),
        )?;
        labelled(
            &mut encoder,
            ("tollgate_store_errors_total", "Store failures by kind"),
            "kind",
            [
                ("timeout", s.timeouts),
                ("connection", s.connection_errors),
                ("script", s.script_errors),
            ],
        )?;
        if let Some(ignored) = self.0.ignored_announcements() {
            labelled(
                &mut encoder,
                (
                    "tollgate_store_announcements_ignored_total",
                    "Announcements heard from the store and not believed, by reason",
                ),
                "reason",
                [
                    ("stamp", ignored.stamps),
                    ("top_oversized", ignored.oversized_tops),
                    ("top_instances", ignored.crowded_tops),
                    ("top_count", ignored.implausible_top_entries),
                ],
            )?;
        }
        let metric = encoder.encode_descriptor(
            "tollgate_store_round_trip_seconds",
            "Latency of round trips to the shared store",
            None,
            MetricType::Histogram,
        )?;
        encode_histogram(&s.latency, metric)
    }
}

/// A counter `(name, help)` with one series per value of `label`.
fn labelled<const N: usize>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    label: &str,
    series: [(&str, u64); N],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value_of_label, value) in series {
        let labels = [(label, value_of_label)];
        encode_plain_counter(value, metric.encode_family(&labels)?)?;
    }
    Ok(())
}
