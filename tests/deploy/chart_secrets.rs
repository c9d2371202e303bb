//! Secrets in the rendered Deployment: settings taken from Secrets as environment
//! variables, TLS Secrets mounted as files with the settings naming those files, and the
//! user's own volumes.

use serde_json::{Value, json};
use tollgate_testkit::helm::{self, Manifests, Values};

use crate::chart_lint::SECRET_VALUES;

fn render(values: &str) -> Option<Manifests> {
    let helm = helm::binary()?;
    let values = Values::new(values);
    Some(helm::template(helm, "edge", Some(&values)).unwrap_or_else(|e| panic!("{e}")))
}

/// The container's variable `name`, as rendered.
fn var<'a>(manifests: &'a Manifests, name: &str) -> &'a Value {
    let env = &manifests.container()["env"];
    env.as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name}: {env:#}"))
}

/// The Secret and key the file at `path` comes from: the secret volume whose mount holds
/// it, and the item projecting it (or the file's own name, when the whole Secret is
/// mounted).
fn secret_file(manifests: &Manifests, path: &str) -> (String, String) {
    let mounts = &manifests.container()["volumeMounts"];
    let (mount, file) = mounts
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|m| {
            let dir = m["mountPath"].as_str()?;
            let file = path.strip_prefix(dir)?.strip_prefix('/')?;
            Some((m, file))
        })
        .unwrap_or_else(|| panic!("no volume mount holds {path}: {mounts:#}"));
    assert_eq!(mount["readOnly"], true, "{mount:#}");
    let volumes = &manifests.one("Deployment")["spec"]["template"]["spec"]["volumes"];
    let secret = &volumes
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume for {mount:#}: {volumes:#}"))["secret"];
    let name = secret["secretName"]
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not from a Secret: {secret:#}"));
    let key = match secret["items"].as_array() {
        None => file.to_owned(),
        Some(items) => items
            .iter()
            .find(|i| i["path"] == file)
            .and_then(|i| i["key"].as_str())
            .unwrap_or_else(|| panic!("{path}: no item projects {file}: {secret:#}"))
            .to_owned(),
    };
    (name.to_owned(), key)
}

/// Where the setting `name` says a file is, and the Secret and key it comes from.
fn file_setting(manifests: &Manifests, name: &str) -> (String, String) {
    let path = var(manifests, name)["value"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} names no file"))
        .to_owned();
    secret_file(manifests, &path)
}

#[test]
fn settings_come_from_secrets() {
    let Some(manifests) = render(SECRET_VALUES) else {
        return;
    };
    assert_eq!(
        var(&manifests, "ADMIN_TOKEN")["valueFrom"],
        json!({"secretKeyRef": {"name": "tollgate-admin", "key": "token"}})
    );
    assert_eq!(
        var(&manifests, "POSTGRES_URL")["valueFrom"],
        json!({"secretKeyRef": {"name": "tollgate-postgres", "key": "url"}})
    );
    assert_eq!(
        manifests.container()["envFrom"],
        json!([{"secretRef": {"name": "tollgate-settings"}}])
    );
    // A plain value stays a value.
    assert_eq!(var(&manifests, "LOG_LEVEL")["value"], "info");
}

#[test]
fn tls_secrets_are_mounted_where_the_settings_say() {
    let Some(manifests) = render(SECRET_VALUES) else {
        return;
    };
    for (setting, secret, key) in [
        ("GRPC_SERVER_TLS_CERT", "tollgate-tls", "tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "tollgate-tls", "tls.key"),
        ("GRPC_CLIENT_TLS_CACERT", "envoy-ca", "ca.crt"),
        ("REDIS_TLS_CACERT", "redis-tls", "ca.crt"),
        ("REDIS_TLS_CLIENT_CERT", "redis-tls", "tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "redis-tls", "tls.key"),
    ] {
        assert_eq!(
            file_setting(&manifests, setting),
            (secret.to_owned(), key.to_owned()),
            "{setting}"
        );
    }
    for (setting, value) in [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("HTTP_SERVER_USE_TLS", "true"),
        ("REDIS_TLS", "true"),
    ] {
        assert_eq!(var(&manifests, setting)["value"], value, "{setting}");
    }
    // PostgreSQL names its files in POSTGRES_URL: the whole Secret is there to name.
    assert_eq!(
        secret_file(&manifests, "/etc/tollgate/tls/postgres/ca.crt"),
        ("postgres-tls".to_owned(), "ca.crt".to_owned())
    );
    // The HTTP port speaks TLS: the kubelet probes it over HTTPS; gRPC is not h2c.
    let container = manifests.container();
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
    }
    let service = manifests.one("Service");
    assert_eq!(service["spec"]["ports"][0]["name"], "grpc");
    assert_eq!(service["spec"]["ports"][0]["appProtocol"], Value::Null);

    // Redis over TLS trusting the system's roots: nothing to mount, nothing named.
    let Some(system) = render("tls: {redis: {secretName: redis-tls, ca: false}}") else {
        return;
    };
    assert_eq!(var(&system, "REDIS_TLS")["value"], "true");
    let env = &system.container()["env"];
    assert!(
        !env.as_array().into_iter().flatten().any(|v| v["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("REDIS_TLS_"))),
        "{env:#}"
    );
    assert_eq!(
        system.container()["volumeMounts"].as_array().map(Vec::len),
        Some(1),
        "only the rules"
    );
}

#[test]
fn extra_volumes_are_mounted() {
    let Some(manifests) = render(SECRET_VALUES) else {
        return;
    };
    let pod = &manifests.one("Deployment")["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    assert!(
        volumes.contains(&json!({"name": "cache", "emptyDir": {}})),
        "{volumes:#?}"
    );
    let mounts = manifests.container()["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        mounts.contains(&json!({"name": "cache", "mountPath": "/var/cache/tollgate"})),
        "{mounts:#?}"
    );
    // The rules stay mounted where the image reads them, first.
    assert_eq!(mounts[0]["name"], "rules");
}
