//! From a bucket to the domain's rules: which rule it falls under and which counter it
//! shares with `ShouldRateLimit`.

use tollgate_core::rules::Policy;
use tollgate_core::{Limit, Rule, Rules, counter_key};

use super::report::BucketKey;
use super::table::Strategy;

/// What the rules say about one bucket.
#[derive(Debug)]
pub(crate) enum Plan<'r> {
    /// No rule matches: the configured default.
    NoRule,
    /// Unlimited (allow all) or a limit of 0 (deny all): nothing to count.
    Fixed(Strategy),
    /// Counted on `key`, the counter `ShouldRateLimit` uses for the same entries.
    Counted {
        rule: &'r Rule,
        key: String,
        limits: &'r [Limit],
    },
}

/// The plan of `bucket` under `rules`: its entries are placed in the order the rules nest
/// (`Domain::find_unordered`), so the counter is the one of the descriptor
/// `ShouldRateLimit` would get with those entries in that order.
pub(crate) fn plan<'r>(rules: &'r Rules, bucket: &BucketKey) -> Plan<'r> {
    let pairs = bucket.pairs();
    let Some((ordered, rule)) = rules
        .domain(&bucket.domain)
        .and_then(|d| d.find_unordered(&pairs))
    else {
        return Plan::NoRule;
    };
    match rule.policy() {
        Policy::Unlimited { .. } => Plan::Fixed(Strategy::AllowAll),
        // A shadow-mode rule never denies: it is counted like any other.
        Policy::Limited { limits, .. }
            if !rule.shadow_mode() && limits.iter().any(|l| l.requests_per_unit() == 0) =>
        {
            Plan::Fixed(Strategy::DenyAll)
        }
        Policy::Limited { limits, .. } => {
            let entries = ordered.into_iter().enumerate();
            let entries = entries.map(|(i, (k, v))| (k, rule.key_value(i, v)));
            Plan::Counted {
                rule,
                key: counter_key(&bucket.domain, entries, limits),
                limits,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_core::{Descriptor, Limiter, MemoryStore, Request, Store};

    use super::*;

    const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
"#;

    fn bucket(pairs: &[(&str, &str)]) -> BucketKey {
        let mut entries: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        entries.sort_unstable();
        BucketKey {
            domain: Arc::from("d"),
            entries: entries.into(),
        }
    }

    #[test]
    fn unlimited_zero_and_unmatched_buckets_need_no_counter() {
        let rules = Rules::from_yaml("r.yaml", RULES).expect("rules");
        assert!(matches!(
            plan(&rules, &bucket(&[("free", "x")])),
            Plan::Fixed(Strategy::AllowAll)
        ));
        assert!(matches!(
            plan(&rules, &bucket(&[("banned", "x")])),
            Plan::Fixed(Strategy::DenyAll)
        ));
        assert!(matches!(
            plan(&rules, &bucket(&[("nope", "x")])),
            Plan::NoRule
        ));
        let other_domain = BucketKey {
            domain: Arc::from("e"),
            ..bucket(&[("free", "x")])
        };
        assert!(matches!(plan(&rules, &other_domain), Plan::NoRule));
    }

    #[tokio::test]
    async fn a_bucket_counts_on_the_counter_should_rate_limit_uses() {
        let rules = Rules::from_yaml("r.yaml", RULES).expect("rules");
        let Plan::Counted { key, limits, .. } =
            plan(&rules, &bucket(&[("path", "/a"), ("user", "ann")]))
        else {
            panic!("the bucket should be counted");
        };
        let (key, limits) = (key.clone(), limits.to_vec());
        let store = Store::Memory(MemoryStore::default());
        let limiter = Limiter::new(rules, store.clone());
        store
            .apply(&key, &limits, tollgate_core::Hits::Charge(2))
            .await
            .expect("memory store");
        let request = Request::new(
            "d",
            vec![Descriptor::new([("user", "ann"), ("path", "/a")])],
        );
        let decision = limiter.decide(&request).await.expect("decided");
        assert!(!decision.over_limit, "the third of 3 fits");
        assert!(limiter.decide(&request).await.expect("decided").over_limit);
    }
}
