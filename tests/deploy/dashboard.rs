//! The Grafana dashboard queries series that exist: a real Tollgate on a real Redis, with
//! rules over xDS, serves admitted, denied and invalid ShouldRateLimit calls and an RLQS
//! report, and another from a rule file takes and releases in-flight slots (xDS has no
//! in-flight rules); then every metric each panel and variable selects must be on one of
//! their `/metrics` pages, with every label the query names or groups by.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use serde_json::Value;
use tokio_stream::StreamExt;
use tollgate_testkit::grpc::{Code, code, request};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{self, Serve};
use tollgate_testkit::xds::{XdsServer, resource};

use crate::promql::{self, Uses};

const NODE: &str = "dashboard";
/// Labels Prometheus adds when it scrapes, which `/metrics` does not carry.
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// Every query of the dashboard: panel targets (rows included) and variable queries,
/// with where they are, for messages.
fn queries(dashboard: &Value) -> Vec<(String, Uses)> {
    fn panels(list: &Value, out: &mut Vec<(String, Uses)>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_default();
                assert!(
                    !expr.is_empty(),
                    "panel {title:?} has a target without expr"
                );
                out.push((format!("panel {title:?}: {expr}"), promql::uses(expr)));
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"].as_str().unwrap_or_default();
        let (mut uses, label) = promql::label_values(query)
            .unwrap_or_else(|| panic!("variable query is not label_values(…): {query}"));
        uses.grouping.push(label);
        out.push((format!("variable {}: {query}", variable["name"]), uses));
    }
    out
}

/// Sample names of a Prometheus text page, each with the label names it carries.
fn series(page: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_owned()).or_default();
        if line[end..].starts_with('{') {
            labels.extend(label_names(&line[end + 1..]));
        }
    }
    out
}

/// The label names of `a="x",b="y\"z"} 1`.
fn label_names(rest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = rest.chars();
    let mut name = String::new();
    while let Some(c) = chars.next() {
        match c {
            '=' => {
                names.push(std::mem::take(&mut name));
                let _opening = chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            ',' => {}
            '}' => break,
            c => name.push(c),
        }
    }
    names
}

fn rules() -> RateLimitConfig {
    let per_minute = |key: &str, n| RateLimitDescriptor {
        key: key.into(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Minute as i32,
            requests_per_unit: n,
            ..Default::default()
        }),
        ..Default::default()
    };
    RateLimitConfig {
        name: "edge".into(),
        domain: "edge".into(),
        descriptors: vec![per_minute("tenant", 2), per_minute("user", 100)],
    }
}

/// One usage report for `{user: ann}`, on a stream kept open until the answer is read.
async fn rlqs_report(server: &tollgate::Server) {
    let report = RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("user".to_owned(), "ann".to_owned())].into(),
            }),
            time_elapsed: None,
            num_requests_allowed: 3,
            num_requests_denied: 1,
        }],
    };
    let reports = tokio_stream::iter([report]).chain(tokio_stream::pending());
    let mut client = RateLimitQuotaServiceClient::new(server.channel().await);
    let mut answers = client
        .stream_rate_limit_quotas(reports)
        .await
        .expect("the RLQS stream opens")
        .into_inner();
    let answer = tokio::time::timeout(tollgate_testkit::grpc::TIMEOUT, answers.message())
        .await
        .expect("an RLQS answer in time")
        .expect("an RLQS answer, not an error");
    assert!(answer.is_some(), "the stream ended without an assignment");
}

/// The `/metrics` page of a Tollgate whose in-flight rule took a slot and released it.
async fn in_flight_page() -> String {
    let rules = concat!(
        "domain: edge\ndescriptors:\n",
        tollgate_testkit::in_flight_rules!()
    );
    let server = Serve::rules(rules).start();
    let mut client = server.client().await;
    for release in [false, true] {
        let answer = client
            .check_own_hits("edge", &[("slots", "ann")], 1, release)
            .await;
        assert_eq!(code(&answer), Code::Ok, "{answer:?}");
    }
    let page = server.get("/metrics").await;
    assert_eq!(page.status, 200, "{page:?}");
    page.body
}

#[tokio::test]
async fn every_series_the_dashboard_queries_exists_after_real_traffic() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/tollgate.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let dashboard: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let queries = queries(&dashboard);
    assert!(queries.len() > 20, "{} queries", queries.len());

    let redis = RedisServer::start();
    let xds = XdsServer::start().await;
    xds.set(NODE, "1", vec![resource(rules())]);
    let command = tollgate::serve_from_env();
    // The top keys panel reads a family /metrics shows only when asked.
    let server = Serve::custom(command)
        .redis("single", &redis.url())
        .env("METRICS_TOP_KEYS", "true");
    let server = xds
        .client_env(NODE)
        .into_iter()
        .fold(server, |serve, (key, value)| serve.env(key, value));
    let server = tokio::task::spawn_blocking(|| server.start())
        .await
        .expect("start tollgate");
    server
        .await_store_health(200, tollgate::STORE_CONNECT_TIMEOUT)
        .await;
    xds.wait_ack(NODE, "1").await;

    // Admitted, then denied by a round trip, then denied from the local view.
    let mut client = server.client().await;
    let codes: Vec<Code> = {
        let mut codes = Vec::new();
        for _ in 0..4 {
            codes.push(code(&client.check("edge", &[("tenant", "acme")]).await));
        }
        codes
    };
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok, Code::OverLimit, Code::OverLimit]
    );
    let invalid = client.invalid(request("", &[&[("tenant", "acme")]])).await;
    assert!(invalid.contains("domain"), "{invalid}");
    rlqs_report(&server).await;

    let page = server.get("/metrics").await;
    assert_eq!(page.status, 200, "{page:?}");
    let mut exported = series(&page.body);
    exported.extend(series(&in_flight_page().await));
    let mut missing = Vec::new();
    for (place, uses) in &queries {
        for (metric, labels) in &uses.selectors {
            let Some(has) = exported.get(metric) else {
                missing.push(format!("{place}: no series {metric}"));
                continue;
            };
            for label in labels {
                if !has.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                    missing.push(format!("{place}: {metric} has no label {label}"));
                }
            }
        }
        for label in &uses.grouping {
            let carried = uses
                .selectors
                .iter()
                .any(|(metric, _)| exported.get(metric).is_some_and(|has| has.contains(label)));
            if !carried && !TARGET_LABELS.contains(&label.as_str()) {
                missing.push(format!("{place}: no selected series has label {label}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries what /metrics does not have:\n{}\n\n/metrics:\n{}",
        missing.join("\n"),
        page.body
    );
}

#[test]
fn label_names_of_a_sample_line_are_read_past_escapes() {
    let page = "# TYPE a counter\na_total{x=\"1\",y=\"q\\\"},z\"} 3\nb 1\n";
    let got = series(page);
    assert_eq!(
        got.get("a_total")
            .map(|l| l.iter().cloned().collect::<Vec<_>>()),
        Some(vec!["x".to_owned(), "y".to_owned()])
    );
    assert_eq!(got.get("b").map(BTreeSet::len), Some(0));
}
