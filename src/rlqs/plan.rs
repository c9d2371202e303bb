//! From a bucket to the domain's rules: which rule it falls under, the counter it shares
//! with `ShouldRateLimit` (found by the core, `Limiter::find_bucket`), and the limit's
//! rate. Each bucket is planned once per rule set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_core::rules::Policy;
use tollgate_core::{Counter, Found, Limit, Limiter, Recorder, Rule};

use super::report::BucketKey;
use super::table::Strategy;
use tollgate_core::lock;

/// Plans kept at most; past this the cache starts again (buckets are bounded per stream,
/// not overall).
const MAX_PLANS: usize = 100_000;

/// What the rules say about one bucket: a fixed answer, or the counter its usage is
/// charged on and the rate its streams divide.
#[derive(Debug)]
pub(crate) enum Plan {
    /// No rule matches: the configured default.
    NoRule,
    /// Unlimited (allow all) or a limit of 0 (deny all): nothing to count.
    Fixed(Strategy),
    /// Counted on `counter`, the one `ShouldRateLimit` uses for the same entries.
    Counted {
        rule: Rule,
        counter: Counter,
        /// The limits' rate: the lowest of requests per second of each.
        per_s: f64,
        /// The window of the limit that sets the rate.
        window: Duration,
        /// The shortest window of the limits.
        shortest: Duration,
    },
}

/// The plan of `bucket` under the limiter's rules.
pub(crate) fn plan<R: Recorder>(limiter: &Limiter<R>, bucket: &BucketKey) -> Plan {
    let (rule, counter) = match limiter.find_bucket(&bucket.domain, &bucket.pairs()) {
        Found::NoRule => return Plan::NoRule,
        Found::Unlimited(_) => return Plan::Fixed(Strategy::AllowAll),
        Found::Limited { rule, counter } => (rule, counter),
    };
    let limits = match rule.policy() {
        // RLQS reports usage, never a request's end: it cannot release a slot.
        policy if policy.in_flight() => return Plan::Fixed(Strategy::AllowAll),
        Policy::Limited { limits, .. } => limits,
        Policy::Unlimited { .. } => return Plan::Fixed(Strategy::AllowAll),
    };
    // A shadow-mode rule never denies: it is counted like any other.
    if !rule.shadow_mode() && limits.iter().any(|l| l.requests_per_unit() == 0) {
        return Plan::Fixed(Strategy::DenyAll);
    }
    // A window is never empty (a limit's unit is at least a second).
    let per_s_of = |l: &Limit| f64::from(l.requests_per_unit()) / l.window().as_secs_f64();
    let binding = limits
        .iter()
        .min_by(|a, b| per_s_of(a).total_cmp(&per_s_of(b)));
    let (per_s, window) =
        binding.map_or((0.0, Duration::from_secs(1)), |l| (per_s_of(l), l.window()));
    let shortest = limits.iter().map(Limit::window).min().unwrap_or(window);
    Plan::Counted {
        rule,
        counter,
        per_s,
        window,
        shortest,
    }
}

/// Each bucket's plan under the rules in force, made at its first use and kept until
/// rules are installed or the bucket's last stream leaves.
#[derive(Default)]
pub(crate) struct Plans {
    inner: Mutex<Cached>,
}

/// The plans and the rule set they were made under, behind one lock so that a plan made
/// under rules replaced meanwhile is never kept.
#[derive(Default)]
struct Cached {
    /// Counts rule sets: a plan made under an older one is not kept.
    generation: u64,
    plans: HashMap<BucketKey, Arc<Plan>>,
}

impl Plans {
    /// The plan of `bucket`, made now if it has none.
    pub(crate) fn get<R: Recorder>(&self, limiter: &Limiter<R>, bucket: &BucketKey) -> Arc<Plan> {
        let generation = {
            let cached = self.lock();
            if let Some(plan) = cached.plans.get(bucket) {
                return plan.clone();
            }
            cached.generation
        };
        let plan = Arc::new(plan(limiter, bucket));
        let mut cached = self.lock();
        if cached.generation == generation {
            if cached.plans.len() >= MAX_PLANS {
                cached.plans.clear();
            }
            cached.plans.insert(bucket.clone(), plan.clone());
        }
        plan
    }

    /// Rules were installed: every plan is made again at its next use.
    pub(crate) fn invalidate(&self) {
        let mut cached = self.lock();
        cached.generation = cached.generation.wrapping_add(1);
        cached.plans.clear();
    }

    /// No stream reports `bucket` any more; the map's room is given back once it is
    /// mostly empty, so that a burst of buckets does not pin its memory.
    pub(crate) fn forget(&self, bucket: &BucketKey) {
        let mut cached = self.lock();
        cached.plans.remove(bucket);
        if cached.plans.capacity() > 64 && cached.plans.len() < cached.plans.capacity() / 4 {
            cached.plans.shrink_to_fit();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        lock(&self.inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_core::{Descriptor, MemoryStore, Request, Rules, Store};

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
  - key: fast
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: slots
    in_flight: {max: 2, expire_after: 60s}
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

    fn limiter(yaml: &str) -> Limiter {
        let rules = Rules::from_yaml("r.yaml", yaml).expect("rules");
        Limiter::new(rules, Store::Memory(MemoryStore::default()))
    }

    #[test]
    fn unlimited_zero_and_unmatched_buckets_need_no_counter() {
        let limiter = limiter(RULES);
        let plan = |pairs: &[(&str, &str)]| plan(&limiter, &bucket(pairs));
        assert!(matches!(
            plan(&[("free", "x")]),
            Plan::Fixed(Strategy::AllowAll)
        ));
        assert!(matches!(
            plan(&[("banned", "x")]),
            Plan::Fixed(Strategy::DenyAll)
        ));
        assert!(matches!(plan(&[("nope", "x")]), Plan::NoRule));
        assert!(
            matches!(plan(&[("slots", "x")]), Plan::Fixed(Strategy::AllowAll)),
            "RLQS cannot release slots"
        );
        let other_domain = BucketKey {
            domain: Arc::from("e"),
            ..bucket(&[("free", "x")])
        };
        assert!(matches!(super::plan(&limiter, &other_domain), Plan::NoRule));
        let Plan::Counted { per_s, window, .. } = plan(&[("fast", "x")]) else {
            panic!("a counted bucket");
        };
        assert_eq!((per_s, window), (20.0, Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn a_bucket_counts_on_the_counter_should_rate_limit_uses() {
        let limiter = limiter(RULES);
        let Plan::Counted { counter, .. } =
            plan(&limiter, &bucket(&[("path", "/a"), ("user", "ann")]))
        else {
            panic!("the bucket should be counted");
        };
        counter
            .charge(limiter.store(), 2)
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

    #[test]
    fn a_bucket_is_planned_once_per_rule_set() {
        let limiter = limiter(RULES);
        let plans = Plans::default();
        let fast = bucket(&[("fast", "x")]);
        let first = plans.get(&limiter, &fast);
        assert!(Arc::ptr_eq(&first, &plans.get(&limiter, &fast)));
        limiter.install(Rules::from_yaml("r.yaml", &RULES.replace("20}", "0}")).expect("rules"));
        assert!(
            Arc::ptr_eq(&first, &plans.get(&limiter, &fast)),
            "until invalidated"
        );
        plans.invalidate();
        assert!(matches!(
            *plans.get(&limiter, &fast),
            Plan::Fixed(Strategy::DenyAll)
        ));
        plans.forget(&fast);
        assert!(plans.lock().plans.is_empty());
    }
}
