//! The rendered Deployment run as the kubelet would run it: the image's entrypoint with
//! the container's arguments and environment (the Redis URL taken from the rendered
//! Secret), the rules ConfigMap's files where the volume mount puts them, against a real
//! redis-server; every probe and the ServiceMonitor's path are then asked on the ports
//! the manifests name. With the TLS values, the mounted Secrets' files serve gRPC over
//! mutual TLS and the probes over HTTPS, and reach a Redis that speaks only TLS and asks
//! for a client certificate.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use tollgate_testkit::grpc::{self, Code, Rls, Unit, assert_limited, limit};
use tollgate_testkit::helm::{self, Manifests, Values};
use tollgate_testkit::pki::Pki;
use tollgate_testkit::process::Signal;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::redis::tls::TlsRedis;
use tollgate_testkit::tollgate::{self, ConfigDir, Serve};
use tollgate_testkit::{free_port, loopback, wait};
use tollgate_testkit::{http, tls};

use crate::image::Image;

/// The rules in the ConfigMap.
const RULES: &str = "
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 60, name: per-tenant}
";

/// The reference's runtime root, where the image's default rules path begins.
const RUNTIME_ROOT: &str = "/srv/runtime_data/current";

/// The probes' paths and port names, from the container.
fn probes(manifests: &Manifests) -> Vec<(String, String, String)> {
    let container = manifests.container();
    ["startupProbe", "livenessProbe", "readinessProbe"]
        .into_iter()
        .map(|probe| {
            let get = &container[probe]["httpGet"];
            let field = |name: &str| {
                get[name]
                    .as_str()
                    .unwrap_or_else(|| panic!("{probe}.httpGet.{name}: {get:#}"))
                    .to_owned()
            };
            (probe.to_owned(), field("path"), field("port"))
        })
        .collect()
}

/// The ConfigMap's rules are the ones in force: a tenant's first call is admitted under
/// its limit.
async fn assert_rules_in_force(mut rls: Rls) {
    let status = rls.check("edge", &[("tenant", "acme")]).await;
    assert_limited(
        &status,
        Code::Ok,
        &limit(60, Unit::Minute, "per-tenant"),
        59,
    );
}

/// A Secret's file the test stands in for: the Secret's name, its key, the file.
type SecretFile<'a> = (&'a str, &'a str, &'a Path);

/// The rendered container as a `tollgate` process: the image's entrypoint with the
/// container's arguments and environment, over a temporary root standing for the
/// container's filesystem, in which each volume's files are where its mount puts them:
/// the ConfigMap's data, and the `secrets` files for the Secret volumes. Paths into the
/// mounts in the environment are taken under that root.
fn pod(manifests: &Manifests, secrets: &[SecretFile]) -> Serve {
    let root = ConfigDir::new();
    let pod = &manifests.one("Deployment")["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let mounts = manifests.container()["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut mount_paths = Vec::new();
    for mount in &mounts {
        let dir = mount["mountPath"].as_str().expect("a mount path");
        mount_paths.push(dir.to_owned());
        let volume = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume for {mount:#}"));
        let files: Vec<(String, String)> = match (&volume["configMap"], &volume["secret"]) {
            (Value::Object(_), _) => {
                let data = manifests.one("ConfigMap")["data"].as_object().cloned();
                data.into_iter()
                    .flatten()
                    .map(|(name, text)| (name, text.as_str().expect("text").to_owned()))
                    .collect()
            }
            (_, secret @ Value::Object(_)) => secret_files(secret, secrets),
            _ => panic!("a volume the test cannot stand in for: {volume:#}"),
        };
        for (name, text) in files {
            let file = Path::new(dir.trim_start_matches('/')).join(name);
            root.write(file.to_str().expect("a UTF-8 path"), &text);
        }
    }
    let under_root = |value: String| match mount_paths.iter().any(|m| value.starts_with(m.as_str()))
    {
        true => root
            .path()
            .join(value.trim_start_matches('/'))
            .display()
            .to_string(),
        false => value,
    };
    let env: Vec<(String, String)> = manifests
        .env()
        .into_iter()
        .map(|(name, value)| (name, under_root(value)))
        .collect();
    let runtime_root = root.path().join(RUNTIME_ROOT.trim_start_matches('/'));

    let image = Image::read();
    let args = manifests.container()["args"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut command = tollgate::command();
    command
        .args(&image.entrypoint[1..])
        .args(args.iter().map(|a| a.as_str().expect("a string argument")))
        .envs(env)
        // The container's root is the temporary directory; and on the test machine,
        // loopback instead of every interface.
        .env("RUNTIME_ROOT", &runtime_root)
        .env("HOST", "127.0.0.1")
        .env("GRPC_HOST", "127.0.0.1");
    Serve::custom(command).keep(root)
}

/// The files a Secret volume projects, as name and text, from the test's `secrets`.
fn secret_files(volume: &Value, secrets: &[SecretFile]) -> Vec<(String, String)> {
    let name = volume["secretName"].as_str().expect("a Secret name");
    let read = |key: &str| {
        let (_, _, file) = secrets
            .iter()
            .find(|(secret, k, _)| *secret == name && *k == key)
            .unwrap_or_else(|| panic!("the test has no {key} for Secret {name}"));
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    };
    match volume["items"].as_array() {
        Some(items) => items
            .iter()
            .map(|item| {
                let key = item["key"].as_str().expect("an item key");
                let path = item["path"].as_str().expect("an item path");
                (path.to_owned(), read(key))
            })
            .collect(),
        None => secrets
            .iter()
            .filter(|(secret, _, _)| *secret == name)
            .map(|(_, key, _)| ((*key).to_owned(), read(key)))
            .collect(),
    }
}

#[tokio::test]
async fn the_rendered_deployment_serves_its_probes_and_metrics_on_redis() {
    let Some(helm) = helm::binary() else { return };
    let redis = RedisServer::start();
    let (http_port, grpc_port) = (free_port(), free_port());
    let values = json!({
        "ports": {"http": http_port, "grpc": grpc_port},
        "extraArgs": ["--log-format", "json"],
        "redis": {"url": redis.url()},
        "serviceMonitor": {"enabled": true},
        "rules": {"files": {"edge.yaml": RULES}},
    });
    // JSON is YAML.
    let values = Values::new(&values.to_string());
    let manifests = helm::template(helm, "edge", Some(&values)).unwrap_or_else(|e| panic!("{e}"));

    let mut server = pod(&manifests, &[]).start_connected().await;

    assert_eq!(
        server.http_addr(),
        loopback(manifests.container_port("http"))
    );
    assert_eq!(
        server.grpc_addr(),
        loopback(manifests.container_port("grpc"))
    );
    for (probe, path, port) in probes(&manifests) {
        let answer = http::get(loopback(manifests.container_port(&port)), &path).await;
        assert_eq!(
            answer.status, 200,
            "{probe} GET {path} on {port}: {answer:?}"
        );
    }
    let endpoint = &manifests.one("ServiceMonitor")["spec"]["endpoints"][0];
    let (port, path) = (
        endpoint["port"].as_str().expect("a port name"),
        endpoint["path"].as_str().expect("a path"),
    );
    let scraped = http::get(loopback(manifests.container_port(port)), path).await;
    assert_eq!(scraped.status, 200, "{scraped:?}");
    assert!(
        scraped.body.contains("tollgate_store_up 1"),
        "{}",
        scraped.body
    );

    // Counted in Redis.
    assert_rules_in_force(server.client().await).await;
    // Under load the answer may come before the count lands (a call past its wait goes on
    // in the background): the key is awaited, not expected at once.
    let (keys, _) = wait::until_async(
        "the counter in Redis",
        Duration::from_secs(10),
        async || {
            let keys: Vec<String> = redis.query(&["KEYS", "*tenant*"]);
            match keys.is_empty() {
                true => Err("no key yet".to_owned()),
                false => Ok(keys),
            }
        },
    )
    .await;
    assert_eq!(keys.len(), 1, "{keys:?}");

    // On SIGTERM the readiness probe fails while the pod drains (SHUTDOWN_DELAY).
    server.signal(Signal::Term);
    let (_, readiness_path, readiness_port) = probes(&manifests).remove(2);
    let readiness = loopback(manifests.container_port(&readiness_port));
    wait::until_async(
        "readiness failing while draining",
        Duration::from_secs(5),
        async || match http::send(readiness, http::Method::GET, &readiness_path, &[], "").await {
            Ok(answer) if answer.status == 500 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}

#[tokio::test]
async fn the_rendered_tls_secrets_serve_grpc_over_mutual_tls_and_https_probes() {
    let Some(helm) = helm::binary() else { return };
    let (http_port, grpc_port) = (free_port(), free_port());
    let values = json!({
        "ports": {"http": http_port, "grpc": grpc_port},
        "rules": {"files": {"edge.yaml": RULES}},
        "tls": {"server": {
            "secretName": "tollgate-tls",
            "http": true,
            "clientCASecretName": "envoy-ca",
        }},
    });
    let values = Values::new(&values.to_string());
    let manifests = helm::template(helm, "edge", Some(&values)).unwrap_or_else(|e| panic!("{e}"));
    let pki = Pki::new();
    let server = pki.issue("tollgate", "DNS:localhost,IP:127.0.0.1");
    let envoy = pki.issue("envoy", "DNS:envoy");
    let ca = pki.ca();
    let secrets: [SecretFile; 3] = [
        ("tollgate-tls", "tls.crt", &server.cert),
        ("tollgate-tls", "tls.key", &server.key),
        ("envoy-ca", "ca.crt", &ca),
    ];
    let server = pod(&manifests, &secrets).start();

    // The kubelet asks the probes over HTTPS, without a client certificate.
    for (probe, path, port) in probes(&manifests) {
        assert_eq!(
            manifests.container()[&probe]["httpGet"]["scheme"],
            "HTTPS",
            "{probe}"
        );
        let addr = loopback(manifests.container_port(&port));
        let answer = tls::https_get(addr, &ca, &path)
            .await
            .unwrap_or_else(|e| panic!("{probe} GET {path} over HTTPS: {e}"));
        assert_eq!(answer.status, 200, "{probe}: {answer:?}");
    }
    // gRPC takes clients of the mounted CA only.
    let grpc = loopback(manifests.container_port("grpc"));
    let channel = tls::grpc_channel(grpc, &ca, Some(&envoy))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_rules_in_force(Rls::new(channel)).await;
    let anonymous = async {
        let channel = tls::grpc_channel(grpc, &ca, None).await?;
        Rls::new(channel)
            .call(grpc::request("edge", &[&[("tenant", "acme")]]))
            .await
            .map_err(|status| format!("{status:?}"))
    };
    assert!(
        anonymous.await.is_err(),
        "a client without a certificate was served by {}",
        server.grpc_addr()
    );
}

#[tokio::test]
async fn the_rendered_redis_tls_secret_connects_with_a_client_certificate() {
    let Some(helm) = helm::binary() else { return };
    let pki = Pki::new();
    // Redis asks for a client certificate of the CA: only the mounted pair gets in.
    let redis = TlsRedis::start_with(&pki, "IP:127.0.0.1", true);
    let values = json!({
        "ports": {"http": free_port(), "grpc": free_port()},
        "rules": {"files": {"edge.yaml": RULES}},
        "redis": {"url": redis.host_port()},
        "tls": {"redis": {"secretName": "redis-tls", "clientCert": true}},
    });
    let values = Values::new(&values.to_string());
    let manifests = helm::template(helm, "edge", Some(&values)).unwrap_or_else(|e| panic!("{e}"));
    let client = pki.issue("tollgate", "DNS:tollgate");
    let ca = pki.ca();
    let secrets: [SecretFile; 3] = [
        ("redis-tls", "ca.crt", &ca),
        ("redis-tls", "tls.crt", &client.cert),
        ("redis-tls", "tls.key", &client.key),
    ];
    let server = pod(&manifests, &secrets).start_connected().await;
    assert_rules_in_force(server.client().await).await;
}
