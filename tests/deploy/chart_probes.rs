//! The rendered Deployment run as the kubelet would run it: the image's entrypoint with
//! the container's arguments and environment (the Redis URL taken from the rendered
//! Secret), the rules ConfigMap's files where the volume mount puts them, against a real
//! redis-server; every probe and the ServiceMonitor's path are then asked on the ports
//! the manifests name.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use tollgate_testkit::grpc::{Code, Unit, assert_limited, limit};
use tollgate_testkit::helm::{self, Manifests, Values};
use tollgate_testkit::http;
use tollgate_testkit::process::Signal;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{self, ConfigDir, Serve};
use tollgate_testkit::{free_port, loopback, wait};

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

    // The volume mount, under a temporary root standing for the container's filesystem.
    let root = ConfigDir::new();
    let mount = manifests.container()["volumeMounts"][0]["mountPath"]
        .as_str()
        .expect("a rules mount")
        .to_owned();
    let configmap = manifests.one("ConfigMap")["data"]
        .as_object()
        .cloned()
        .expect("rules data");
    for (name, text) in &configmap {
        let file = Path::new(mount.trim_start_matches('/')).join(name);
        root.write(
            file.to_str().expect("a UTF-8 path"),
            text.as_str().expect("text"),
        );
    }
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
        .envs(manifests.env())
        // The container's root is the temporary directory; and on the test machine,
        // loopback instead of every interface.
        .env("RUNTIME_ROOT", &runtime_root)
        .env("HOST", "127.0.0.1")
        .env("GRPC_HOST", "127.0.0.1");
    let mut server = Serve::custom(command).keep(root).start_connected().await;

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

    // The ConfigMap's rules are the ones in force, counted in Redis.
    let status = server
        .client()
        .await
        .check("edge", &[("tenant", "acme")])
        .await;
    assert_limited(
        &status,
        Code::Ok,
        &limit(60, Unit::Minute, "per-tenant"),
        59,
    );
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
