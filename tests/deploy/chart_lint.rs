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

/// Secrets as environment variables and as TLS files, extra volumes, the debug port.
pub(crate) const SECRET_VALUES: &str = r#"
replicaCount: 2
debug: {enabled: true, port: 6071, service: true}
env:
  ADMIN_TOKEN: {valueFrom: {secretKeyRef: {name: tollgate-admin, key: token}}}
  POSTGRES_URL: {valueFrom: {secretKeyRef: {name: tollgate-postgres, key: url}}}
envFrom: [{secretRef: {name: tollgate-settings}}]
tls:
  server: {secretName: tollgate-tls, http: true, clientCASecretName: envoy-ca}
  redis: {secretName: redis-tls, clientCert: true}
  postgres: {secretName: postgres-tls}
extraVolumes: [{name: cache, emptyDir: {}}]
extraVolumeMounts: [{name: cache, mountPath: /var/cache/tollgate}]
"#;

#[test]
fn the_chart_lints_clean_with_its_own_and_other_values() {
    let Some(helm) = helm::binary() else { return };
    for values in [
        None,
        Some(Values::new(OTHER_VALUES)),
        Some(Values::new(SECRET_VALUES)),
    ] {
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
        (
            "env: {DEBUG_PORT: '6070'}",
            "env.DEBUG_PORT: the chart decides DEBUG_PORT through debug.enabled and debug.port"
                .to_owned(),
        ),
        (
            "tls: {server: {secretName: tollgate-tls}}\nenv: {GRPC_SERVER_TLS_CERT: /mine.crt}",
            "env.GRPC_SERVER_TLS_CERT: the chart decides GRPC_SERVER_TLS_CERT through tls"
                .to_owned(),
        ),
        (
            "tls: {redis: {secretName: redis-tls}}\nenv: {REDIS_TLS_CACERT: /mine.crt}",
            "env.REDIS_TLS_CACERT: the chart decides REDIS_TLS_CACERT through tls".to_owned(),
        ),
        (
            "tls: {server: {http: true}}",
            "tls.server.http and tls.server.clientCASecretName need tls.server.secretName"
                .to_owned(),
        ),
        (
            "tls: {redis: {secretName: redis-tls}}\nredis: {url: 'redis://r:6379'}",
            "tls.redis: redis.url is redis://, which is never TLS; write rediss:// or host:port"
                .to_owned(),
        ),
        (
            "env: {ADMIN_TOKEN: {secretKeyRef: {name: admin, key: token}}}",
            "env.ADMIN_TOKEN: a value, or {valueFrom: {secretKeyRef:".to_owned(),
        ),
    ] {
        let refused = helm::template(helm, "t", Some(&Values::new(values)))
            .expect_err(&format!("helm template accepted `{values}`"));
        assert!(refused.contains(&expected), "`{values}`: {refused}");
    }
}

#[test]
fn replicas_on_the_memory_store_are_refused_unless_meant() {
    let Some(helm) = helm::binary() else { return };
    let refused = |values: &str| {
        helm::template(helm, "t", Some(&Values::new(values)))
            .expect_err(&format!("helm template accepted `{values}`"))
    };
    let memory = "replicaCount 2 on the memory store: each replica would count alone, so \
                  every limit would admit 2 times its number. Share the counters (redis.url, \
                  redis.existingSecret, or env.POSTGRES_URL), or set \
                  allowMemoryStoreReplicas: true if that is what you mean";
    for values in [
        "replicaCount: 2",
        "replicaCount: 2\nenv: {BACKEND_TYPE: memory}\nredis: {url: 'redis://r:6379'}",
    ] {
        let message = refused(values);
        assert!(message.contains(memory), "`{values}`: {message}");
    }
    // One replica, a shared store, or the user saying so renders.
    for values in [
        "replicaCount: 1",
        "replicaCount: 3\nredis: {url: 'redis://r:6379'}",
        "replicaCount: 3\nredis: {existingSecret: {name: redis, key: url}}",
        "replicaCount: 3\nenv: {POSTGRES_URL: {valueFrom: {secretKeyRef: {name: pg, key: url}}}}",
        "replicaCount: 3\nenv: {BACKEND_TYPE: {valueFrom: {configMapKeyRef: {name: s, key: b}}}}",
        "replicaCount: 2\nallowMemoryStoreReplicas: true",
    ] {
        let manifests = helm::template(helm, "t", Some(&Values::new(values)))
            .unwrap_or_else(|e| panic!("`{values}`: {e}"));
        let replicas = &manifests.one("Deployment")["spec"]["replicas"];
        assert!(replicas.as_u64().is_some_and(|n| n >= 1), "{replicas}");
    }
    // The chart's own values render: one replica until a store is shared.
    let defaults = helm::template(helm, "t", None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(defaults.one("Deployment")["spec"]["replicas"], 1);
}
