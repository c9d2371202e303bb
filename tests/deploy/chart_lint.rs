//! `helm lint --strict` passes with the chart's values and with every optional part
//! turned on, and values that would contradict what the chart sets itself are refused by
//! name instead of rendering a Deployment that does something else.

use tollgate_testkit::helm::{self, Values};

/// Every optional object on, every value changed.
pub(crate) const OTHER_VALUES: &str = r#"
replicaCount: 3
image: {repository: registry.example/tollgate, tag: "1.2.3", pullPolicy: Always}
ports: {http: 9080, grpc: 9081}
extraArgs: ["--log-format", "json"]
env: {LOG_LEVEL: debug, MAX_COUNTERS: 50000}
rules: {files: {edge.yaml: "domain: edge\ndescriptors: [{key: tenant, rate_limit: {unit: minute, requests_per_unit: 60}}]\n"}}
redis: {url: "redis://redis.example:6379"}
serviceMonitor: {enabled: true, interval: 15s, labels: {release: prometheus}}
podDisruptionBudget: {enabled: true, maxUnavailable: 2}
resources: {requests: {cpu: 250m, memory: 256Mi}, limits: {memory: 1Gi}}
"#;

#[test]
fn the_chart_lints_clean_with_its_own_and_other_values() {
    let Some(helm) = helm::binary() else { return };
    for values in [None, Some(Values::new(OTHER_VALUES))] {
        let out = helm::lint(helm, values.as_ref());
        assert!(
            out.status.success(),
            "helm lint --strict failed:\n{}{}",
            out.stdout,
            out.stderr
        );
        assert!(out.stdout.contains("0 chart(s) failed"), "{}", out.stdout);
    }
}

#[test]
fn values_that_contradict_the_chart_are_refused_by_name() {
    let Some(helm) = helm::binary() else { return };
    let rules = "rules.files or rules.existingConfigMap (mounted where the image reads rules)";
    for (values, expected) in [
        (
            "env: {PORT: '9999'}",
            "env.PORT: the chart decides PORT through ports.http".to_owned(),
        ),
        (
            "env: {GRPC_ADDR: ':1'}",
            "env.GRPC_ADDR: the chart decides GRPC_ADDR through ports.grpc".to_owned(),
        ),
        (
            "env: {REDIS_URL: 'redis://x:6379'}",
            "env.REDIS_URL: the chart decides REDIS_URL through redis.url or redis.existingSecret"
                .to_owned(),
        ),
        (
            "env: {RUNTIME_ROOT: /data}",
            format!("env.RUNTIME_ROOT: the chart decides RUNTIME_ROOT through {rules}"),
        ),
        (
            "redis: {url: 'redis://x:6379', existingSecret: {name: redis, key: url}}",
            "redis.url and redis.existingSecret.name are both set; keep one".to_owned(),
        ),
        (
            "rules: {existingConfigMap: mine, files: {a.yaml: 'domain: a'}}",
            "rules.files and rules.existingConfigMap are both set; keep one".to_owned(),
        ),
    ] {
        let refused = helm::template(helm, "t", Some(&Values::new(values)))
            .expect_err(&format!("helm template accepted `{values}`"));
        assert!(refused.contains(&expected), "`{values}`: {refused}");
    }
}
