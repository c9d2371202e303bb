//! The heaviest keys of each rule as one gauge family, `tollgate_top_key_requests`, built
//! afresh at every scrape: at most [`PER_RULE`] series per rule and ranking, whose labels
//! are replaced as the keys change, never accumulated. Only the `/metrics` page shows it
//! (keys name clients); statsd and the debug port's stats do not.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode_registry;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tollgate_core::top::{TopBy, TopWindow};
use tollgate_core::{Limiter, Recorder, TopQuery};

/// Keys per rule and ranking.
pub(crate) const PER_RULE: usize = 5;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopLabels {
    domain: String,
    rule: String,
    by: &'static str,
    descriptor: String,
}

/// Appends the family, in the Prometheus text format, to `out`.
pub(crate) fn encode<R: Recorder>(limiter: &Limiter<R>, out: &mut String) -> std::fmt::Result {
    let family = Family::<TopLabels, Gauge>::default();
    for (by, name) in [
        (TopBy::Hits, "hits"),
        (TopBy::Denied, "denied"),
        (TopBy::Shadow, "shadow"),
    ] {
        let query = TopQuery {
            domain: None,
            rule: None,
            by,
            window: TopWindow::Minute,
            n: PER_RULE,
            fleet: false,
        };
        for entry in limiter.top_per_rule(&query) {
            let labels = TopLabels {
                domain: entry.domain,
                rule: entry.rule,
                by: name,
                descriptor: entry.descriptor,
            };
            family
                .get_or_create(&labels)
                .set(i64::try_from(entry.count).unwrap_or(i64::MAX));
        }
    }
    let mut registry = Registry::default();
    registry.register(
        "tollgate_top_key_requests",
        "Requests of one of a rule's heaviest keys in the last minute, by hits, denied or \
         shadow (would-be denials); an upper bound (GET /top gives its error)",
        family,
    );
    encode_registry(out, &registry)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tollgate_core::{
        Capacity, Descriptor, ManualClock, MemoryStore, Options, Request, Rules, Store, Timestamp,
    };

    use super::*;

    async fn traffic(limiter: &Limiter, value: &str, times: usize) {
        for _ in 0..times {
            let request = Request::new("web", vec![Descriptor::new([("ip", value)])]);
            limiter.decide(&request).await.expect("decides");
        }
    }

    fn page(limiter: &Limiter) -> String {
        let mut out = String::new();
        encode(limiter, &mut out).expect("encodes");
        out
    }

    #[tokio::test]
    async fn the_family_keeps_the_few_heaviest_and_replaces_them() {
        let clock = ManualClock::new(Timestamp::from_nanos(1_000_000_000_000));
        let rules = Rules::from_yaml(
            "rules.yaml",
            "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )
        .expect("rules load");
        let store = Store::Memory(MemoryStore::new(
            Capacity::default(),
            Arc::new(clock.clone()),
        ));
        let limiter = Limiter::with_recorder(rules, store, Options::default(), ());
        for (i, value) in ["a", "b", "c", "d", "e", "f", "g"].iter().enumerate() {
            traffic(&limiter, value, 10 - i).await;
        }
        let before = page(&limiter);
        let line =
            r#"tollgate_top_key_requests{domain="web",rule="ip",by="denied",descriptor="ip=a"} 9"#;
        assert!(before.contains(line), "{before}");
        let series = |page: &str, by: &str| page.matches(&format!("by=\"{by}\"")).count();
        assert_eq!(
            (series(&before, "hits"), series(&before, "denied")),
            (PER_RULE, PER_RULE)
        );
        assert!(!before.contains("ip=f"), "{before}");

        clock.advance(Duration::from_secs(61));
        traffic(&limiter, "z", 2).await;
        let after = page(&limiter);
        assert!(
            after.contains(r#"by="denied",descriptor="ip=z"} 1"#),
            "{after}"
        );
        assert!(!after.contains("ip=a"), "{after}");
    }
}
