//! Quota groups and all or none over gRPC: Envoy AI Gateway's two models, each a group of
//! its default bucket and its tenants' buckets (ai-gateway#2460), from a rule file and
//! over xDS (the rule metadata's key `quota_group`); the answer's dynamic metadata names
//! only the models whose groups are not over; the issue's `org` and `user` requests.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tollgate_testkit::grpc::{Code, RateLimitRequest, RateLimitResponse, Rls, overall, request};
use tollgate_testkit::xds::{XdsServer, resource};

use crate::in_process::{InProcess, Running};

const NODE: &str = "tollgate-test";

/// Two models, a default bucket of 10 an hour each and tenant buckets of 2, grouped per
/// model; `plain` is no budget; `org` and `user` are the issue's limits.
const RULES: &str = r#"
domain: ai
descriptors:
  - key: model
    value: a
    quota_mode: true
    quota_group: model-a
    metadata: {model: a}
    rate_limit: {unit: hour, requests_per_unit: 10}
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
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: tenant
        quota_mode: true
        quota_group: model-b
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: org
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

fn serve_file() -> Running {
    InProcess::rules(RULES)
        .env("RESPONSE_DYNAMIC_METADATA", "true")
        .start()
}

/// `models`' default and tenant buckets for `tenant`, each with `n` hits of its own.
fn candidates(models: &[&str], tenant: &str, n: u64) -> RateLimitRequest {
    let mut descriptors: Vec<Vec<(&str, &str)>> = Vec::new();
    for &model in models {
        descriptors.push(vec![("model", model)]);
        descriptors.push(vec![("model", model), ("tenant", tenant)]);
    }
    let lists: Vec<&[(&str, &str)]> = descriptors.iter().map(Vec::as_slice).collect();
    let mut req = request("ai", &lists);
    for d in &mut req.descriptors {
        d.hits_addend = Some(UInt64Value { value: n });
    }
    req
}

/// The answer's `metadata.model`, if the answer names one.
fn routed_to(resp: &RateLimitResponse) -> Option<String> {
    let metadata = resp.dynamic_metadata.as_ref()?.fields.get("metadata")?;
    let Some(Kind::StructValue(metadata)) = &metadata.kind else {
        panic!("metadata is a struct: {resp:?}");
    };
    assert!(
        !metadata.fields.contains_key("quota_group"),
        "the group's name is no metadata: {resp:?}"
    );
    match &metadata.fields.get("model")?.kind {
        Some(Kind::StringValue(model)) => Some(model.clone()),
        other => panic!("model is a string: {other:?}"),
    }
}

/// The scenarios of ai-gateway#2460 through `rls` (on [`RULES`] or the same over xDS):
/// a model exhausted by others routes to the other; a tenant exhausted inside a model's
/// group is refused though the model's default bucket has room; both exhausted, 429.
async fn assert_routes_to_the_model_with_quota(rls: &mut Rls) {
    let first = rls.ok(candidates(&["a", "b"], "t", 0)).await;
    assert_eq!(overall(&first), Code::Ok);
    assert_eq!(
        routed_to(&first).as_deref(),
        Some("a"),
        "a first: {first:?}"
    );
    // Model a's default bucket spent by another tenant (a budget is over once charged
    // past its limit; at it, a check still fits): b has quota.
    rls.ok(candidates(&["a"], "other", 11)).await;
    let second = rls.ok(candidates(&["a", "b"], "t", 0)).await;
    assert_eq!(overall(&second), Code::Ok);
    assert_eq!(routed_to(&second).as_deref(), Some("b"), "{second:?}");
    // The issue's check: the tenant's bucket of b (2) spent, b's default bucket has room.
    rls.ok(candidates(&["b"], "t", 3)).await;
    let tenant = rls.ok(candidates(&["b"], "t", 0)).await;
    assert_eq!(overall(&tenant), Code::OverLimit, "{tenant:?}");
    assert_eq!(routed_to(&tenant), None);
    // Both models out of quota for this tenant: 429, and no model named.
    let both = rls.ok(candidates(&["a", "b"], "t", 0)).await;
    assert_eq!(overall(&both), Code::OverLimit, "{both:?}");
    assert_eq!(routed_to(&both), None);
    // Another tenant of b still gets b.
    let other = rls.ok(candidates(&["a", "b"], "u", 0)).await;
    assert_eq!(overall(&other), Code::Ok);
    assert_eq!(routed_to(&other).as_deref(), Some("b"));
}

#[tokio::test]
async fn a_request_goes_to_the_model_whose_group_has_quota() {
    let server = serve_file();
    assert_routes_to_the_model_with_quota(&mut server.client().await).await;
}

#[tokio::test]
async fn a_limit_outside_quota_mode_refuses_whatever_the_groups() {
    let server = serve_file();
    let mut rls = server.client().await;
    let with_plain = || {
        let mut req = candidates(&["a"], "t", 0);
        req.descriptors
            .push(tollgate_testkit::grpc::descriptor(&[("plain", "p")]));
        req
    };
    assert_eq!(overall(&rls.ok(with_plain()).await), Code::Ok);
    let refused = rls.ok(with_plain()).await;
    assert_eq!(overall(&refused), Code::OverLimit, "plain is over");
    assert_eq!(
        routed_to(&refused).as_deref(),
        Some("a"),
        "a still has quota"
    );
}

/// The issue's first finding: `org` 100 and `user` 1 a minute, three requests carrying
/// both; one is admitted, and `org` counts that one only.
#[tokio::test]
async fn a_request_refused_by_its_user_leaves_its_organisation_uncounted() {
    let server = serve_file();
    let mut rls = server.client().await;
    let both = request("ai", &[&[("org", "acme")], &[("user", "ann")]]);
    let codes: Vec<Code> = [
        rls.ok(both.clone()).await,
        rls.ok(both.clone()).await,
        rls.ok(both.clone()).await,
    ]
    .iter()
    .map(overall)
    .collect();
    assert_eq!(codes, [Code::Ok, Code::OverLimit, Code::OverLimit]);
    let org = rls.check_own_hits("ai", &[("org", "acme")], 0, false).await;
    assert_eq!(
        org.limit_remaining, 99,
        "org counted the admitted request only"
    );
}

/// One bucket over xDS: `quota_mode`, `metadata` with the group under `quota_group`.
fn bucket(
    key: &str,
    value: &str,
    per_hour: u32,
    group: &str,
    model: Option<&str>,
) -> RateLimitDescriptor {
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    };
    let mut fields = std::collections::BTreeMap::from([("quota_group".to_owned(), text(group))]);
    if let Some(model) = model {
        fields.insert("model".to_owned(), text(model));
    }
    RateLimitDescriptor {
        key: key.to_owned(),
        value: value.to_owned(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Hour as i32,
            requests_per_unit: per_hour,
            ..Default::default()
        }),
        quota_mode: true,
        metadata: Some(Struct {
            fields: fields.into_iter().collect(),
        }),
        ..Default::default()
    }
}

/// The same scenarios with the rules pushed over xDS, where `RateLimitDescriptor` has no
/// field for a group: its `metadata` key `quota_group` names it.
#[tokio::test]
async fn over_xds_the_metadata_key_names_the_group() {
    let xds = XdsServer::start().await;
    let model = |name: &str| {
        let group = format!("model-{name}");
        let mut default = bucket("model", name, 10, &group, Some(name));
        default.descriptors = vec![bucket("tenant", "", 2, &group, None)];
        default
    };
    let config = RateLimitConfig {
        name: "ai".into(),
        domain: "ai".into(),
        descriptors: vec![model("a"), model("b")],
    };
    xds.set(NODE, "1", vec![resource(config)]);
    let mut server = InProcess::from_env().env("RESPONSE_DYNAMIC_METADATA", "true");
    for (name, value) in xds.client_env(NODE) {
        server = server.env(name, &value);
    }
    let server = server.start();
    xds.wait_ack(NODE, "1").await;
    assert_routes_to_the_model_with_quota(&mut server.client().await).await;
}
