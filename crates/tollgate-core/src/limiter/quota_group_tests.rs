//! Quota groups through [`Limiter::decide`]: the three scenarios of Envoy AI Gateway's
//! issue 2460, and the metadata a request is answered with.

use std::sync::Arc;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::rules::{MetaValue, Metadata, merge_metadata};
use crate::store::MemoryStore;

const SECOND: u64 = crate::clock::NANOS_PER_SECOND;

/// Two models, each a group of its default bucket (3 an hour) and its per-tenant buckets
/// (2 an hour), as Envoy AI Gateway's QuotaPolicy sends them; `plain` is no budget.
const RULES: &str = r#"
domain: ai
descriptors:
  - key: model
    value: a
    quota_mode: true
    quota_group: model-a
    metadata: {model: a}
    rate_limit: {unit: hour, requests_per_unit: 3}
    descriptors:
      - key: tenant
        quota_mode: true
        quota_group: model-a
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: model
    value: b
    quota_mode: true
    quota_group: model-b
    metadata: {model: b}
    rate_limit: {unit: hour, requests_per_unit: 3}
    descriptors:
      - key: tenant
        quota_mode: true
        quota_group: model-b
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: lone
    quota_mode: true
    quota_group: alone
    metadata: {lone: yes}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

fn limiter() -> Limiter {
    let clock = ManualClock::new(Timestamp::from_nanos(1_000 * SECOND));
    let rules = Rules::from_yaml("rules.yaml", RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        Arc::new(clock),
    ));
    Limiter::with_recorder(rules, store, Options::default(), ())
}

/// A model's default bucket and the tenant's, with `hits`.
fn model(name: &'static str, tenant: &'static str, hits: Hits) -> [Descriptor<'static>; 2] {
    [
        Descriptor::new([("model", name)]).with_hits(hits),
        Descriptor::new([("model", name), ("tenant", tenant)]).with_hits(hits),
    ]
}

async fn decide(l: &Limiter, descriptors: Vec<Descriptor<'_>>) -> Decision {
    l.decide(&Request::new("ai", descriptors))
        .await
        .expect("decides")
}

/// The metadata the answer carries, merged as the gRPC adapter merges it.
fn metadata(decision: &Decision) -> Metadata {
    let mut merged = Metadata::new();
    for limited in decision.descriptors.iter().filter_map(Outcome::limited) {
        if let Some(meta) = limited.answered_metadata() {
            merge_metadata(&mut merged, meta);
        }
    }
    merged
}

fn text(s: &str) -> MetaValue {
    MetaValue::String(s.into())
}

/// Both models checked at once, as the route's request-time descriptors.
fn candidates(tenant: &'static str) -> Vec<Descriptor<'static>> {
    let [a, at] = model("a", tenant, Hits::Check);
    let [b, bt] = model("b", tenant, Hits::Check);
    vec![a, at, b, bt]
}

/// Charges `n` to a model at stream end, as Envoy would for the model that served.
async fn serve(l: &Limiter, name: &'static str, tenant: &'static str, n: u64) {
    decide(l, model(name, tenant, Hits::Consume(n)).to_vec()).await;
}

#[tokio::test]
async fn a_model_exhausted_sends_the_request_to_the_other() {
    // Scenario 1: model a's default bucket used up by others; b has quota.
    let l = limiter();
    serve(&l, "a", "other", 4).await;
    let answer = decide(&l, candidates("t")).await;
    assert!(!answer.over_limit, "model b still has quota");
    let only_b = Metadata::from([("model".to_owned(), text("b"))]);
    assert_eq!(metadata(&answer), only_b, "only b is a candidate");
}

#[tokio::test]
async fn a_request_is_routed_to_neither_exhausted_model_and_refused_when_both_are() {
    // Scenario 2: the tenant has spent its bucket of a (3 of 2) while a's default bucket
    // is at its limit, not past it: a is no candidate. Then b likewise, and 429.
    let l = limiter();
    let first = decide(&l, candidates("t")).await;
    assert_eq!(metadata(&first).get("model"), Some(&text("a")), "a first");
    serve(&l, "a", "t", 3).await;
    let second = decide(&l, candidates("t")).await;
    assert!(!second.over_limit);
    assert_eq!(metadata(&second).get("model"), Some(&text("b")));
    serve(&l, "b", "t", 3).await;
    let third = decide(&l, candidates("t")).await;
    assert!(third.over_limit, "every group is over");
    assert_eq!(metadata(&third), Metadata::new());
}

#[tokio::test]
async fn a_tenant_exhausted_inside_a_models_group_is_refused() {
    // Scenario 3: the tenant's bucket of 2 is spent (charged 3: a budget at its limit
    // still passes a check); model b's default bucket has room.
    let l = limiter();
    serve(&l, "b", "t", 3).await;
    let checked = decide(&l, model("b", "t", Hits::Check).to_vec()).await;
    assert!(
        checked.over_limit,
        "the group is over: its tenant bucket is"
    );
    assert!(
        !checked.descriptors[0].is_over(),
        "the default bucket alone had room"
    );
    assert_eq!(metadata(&checked), Metadata::new(), "b is no candidate");
    // Another tenant of b is served.
    assert!(
        !decide(&l, model("b", "u", Hits::Check).to_vec())
            .await
            .over_limit
    );
}

#[tokio::test]
async fn a_group_of_one_and_budgets_without_a_group_answer_as_before() {
    let l = limiter();
    let lone = || Descriptor::new([("lone", "x")]);
    assert!(!decide(&l, vec![lone()]).await.over_limit);
    let over = decide(&l, vec![lone()]).await;
    assert!(over.over_limit, "the one group is over");
    // Beside a group that has quota the request passes, without lone's metadata.
    let [a, at] = model("a", "t", Hits::Check);
    let beside = decide(&l, vec![lone().with_hits(Hits::Check), a, at]).await;
    assert!(!beside.over_limit);
    assert_eq!(
        metadata(&beside),
        Metadata::from([("model".to_owned(), text("a"))])
    );
    // A descriptor that is no budget denies on its own, groups or not.
    decide(&l, vec![Descriptor::new([("plain", "p")])]).await;
    let [a, at] = model("a", "t", Hits::Check);
    let plain = decide(&l, vec![Descriptor::new([("plain", "p")]), a, at]).await;
    assert!(plain.over_limit);
}

#[tokio::test]
async fn descriptors_no_rule_matches_join_no_group() {
    let l = limiter();
    serve(&l, "b", "t", 3).await;
    let [b, bt] = model("b", "t", Hits::Check);
    let unknown = Descriptor::new([("model", "zzz")]);
    let answer = decide(&l, vec![unknown, b, bt]).await;
    assert!(answer.over_limit, "an unknown model is no candidate");
}
