//! The manifests `helm template` renders: what the container runs, as whom, where the
//! rules are mounted, and the objects and numbers the values ask for.

use serde_json::{Value, json};
use tollgate_testkit::helm::{self, Manifests, Values};
use tollgate_testkit::tollgate::{self, ConfigDir};

use crate::chart_lint::OTHER_VALUES;
use crate::image::Image;

fn render(values: Option<&str>) -> Option<Manifests> {
    let helm = helm::binary()?;
    let values = values.map(Values::new);
    Some(helm::template(helm, "edge", values.as_ref()).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn the_container_runs_what_the_image_provides() {
    let Some(defaults) = render(None) else { return };
    let image = Image::read();
    assert_eq!(image.entrypoint, ["tollgate", "serve"]);
    assert!(image.cmd.is_empty(), "CMD adds nothing: {:?}", image.cmd);
    let container = defaults.container();
    assert_eq!(
        container["command"],
        Value::Null,
        "the image's entrypoint runs"
    );
    assert_eq!(container["args"], Value::Null, "{container:#}");
    assert_eq!(
        container["image"], "tollgate:0.1.0",
        "the chart's appVersion"
    );
    // Arguments from the values follow the entrypoint, as Docker's CMD would.
    let Some(other) = render(Some(OTHER_VALUES)) else {
        return;
    };
    assert_eq!(other.container()["command"], Value::Null);
    assert_eq!(other.container()["args"], json!(["--log-format", "json"]));
    assert_eq!(
        other.container()["image"],
        "registry.example/tollgate:1.2.3"
    );
    assert_eq!(other.container()["imagePullPolicy"], "Always");
}

#[test]
fn the_pod_runs_as_nobody_on_a_read_only_root_filesystem() {
    let Some(manifests) = render(None) else {
        return;
    };
    let pod = &manifests.one("Deployment")["spec"]["template"]["spec"];
    let security = &pod["securityContext"];
    assert_eq!(security["runAsNonRoot"], true, "{security:#}");
    assert_eq!(security["runAsUser"], 65534);
    assert_eq!(security["runAsGroup"], 65534);
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    let container = &manifests.container()["securityContext"];
    assert_eq!(container["readOnlyRootFilesystem"], true, "{container:#}");
    assert_eq!(container["allowPrivilegeEscalation"], false);
    assert_eq!(container["capabilities"]["drop"], json!(["ALL"]));
    // Service links would put GRPC_PORT=tcp://… into the environment for a Service
    // named `grpc`, and Tollgate reads GRPC_PORT.
    assert_eq!(pod["enableServiceLinks"], false);
}

#[test]
fn the_rules_configmap_is_mounted_where_the_image_reads_rules() {
    for values in [None, Some(OTHER_VALUES)] {
        let Some(manifests) = render(values) else {
            return;
        };
        let container = manifests.container();
        let mounts = container["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let [mount] = mounts.as_slice() else {
            panic!("one volume mount expected: {container:#}");
        };
        assert_eq!(mount["mountPath"], Image::read().rules_dir.as_str());
        assert_eq!(mount["readOnly"], true);
        let pod = &manifests.one("Deployment")["spec"]["template"]["spec"];
        let volume = &pod["volumes"][0];
        assert_eq!(volume["name"], mount["name"]);
        let configmap = manifests.one("ConfigMap");
        assert_eq!(volume["configMap"]["name"], configmap["metadata"]["name"]);
        // What the ConfigMap holds is rules Tollgate accepts.
        let dir = ConfigDir::new();
        let files = configmap["data"].as_object().expect("ConfigMap data");
        for (name, text) in files {
            dir.write(name, text.as_str().expect("text data"));
        }
        let checked = tollgate::check_config(dir.path());
        assert!(checked.status.success(), "{checked:?}");
    }
    // The chart's example serves until files are given; given ones replace it.
    let files = |manifests: &Manifests| -> Vec<String> {
        let data = manifests.one("ConfigMap")["data"].as_object().cloned();
        data.into_iter().flatten().map(|(name, _)| name).collect()
    };
    let (Some(defaults), Some(other)) = (render(None), render(Some(OTHER_VALUES))) else {
        return;
    };
    assert_eq!(files(&defaults), ["rules.yaml"]);
    assert_eq!(files(&other), ["edge.yaml"]);
    // An existing ConfigMap is mounted instead of one the chart makes.
    let Some(theirs) = render(Some("rules: {existingConfigMap: team-rules}")) else {
        return;
    };
    assert!(theirs.all("ConfigMap").is_empty());
    let pod = &theirs.one("Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "team-rules");
}

#[test]
fn ports_and_probes_follow_the_values() {
    for (values, http, grpc) in [(None, 8080, 8081), (Some(OTHER_VALUES), 9080, 9081)] {
        let Some(manifests) = render(values) else {
            return;
        };
        assert_eq!(manifests.container_port("http"), http);
        assert_eq!(manifests.container_port("grpc"), grpc);
        let env = manifests.env();
        assert!(env.contains(&("PORT".into(), http.to_string())), "{env:?}");
        assert!(
            env.contains(&("GRPC_PORT".into(), grpc.to_string())),
            "{env:?}"
        );
        let container = manifests.container();
        for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
            let get = &container[probe]["httpGet"];
            assert_eq!(get["port"], "http", "{probe}: {get:#}");
            assert_eq!(get["path"], "/healthcheck", "{probe}: {get:#}");
        }
        let service = manifests.one("Service");
        let ports = service["spec"]["ports"].as_array().expect("Service ports");
        let by_name = |name: &str| {
            ports
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("no Service port {name}: {service:#}"))
        };
        for (name, number) in [("http", http), ("grpc", grpc)] {
            assert_eq!(by_name(name)["port"], number);
            assert_eq!(by_name(name)["targetPort"], name);
        }
        assert_eq!(by_name("grpc")["appProtocol"], "kubernetes.io/h2c");
    }
}

#[test]
fn the_debug_port_is_off_unless_enabled_and_then_declared() {
    let Some(defaults) = render(None) else { return };
    // Off: Tollgate would otherwise open 6070 on every interface, undeclared.
    let env = defaults.env();
    assert!(
        env.contains(&("DEBUG_PORT".into(), "off".into())),
        "{env:?}"
    );
    let ports = &defaults.container()["ports"];
    let names: Vec<&Value> = ports
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| &p["name"])
        .collect();
    assert_eq!(names, ["http", "grpc"], "{ports:#}");

    let enabled = "debug: {enabled: true}";
    let (Some(on), Some(on_service)) = (
        render(Some(enabled)),
        render(Some("debug: {enabled: true, port: 6071, service: true}")),
    ) else {
        return;
    };
    assert_eq!(on.container_port("debug"), 6070);
    assert!(on.env().contains(&("DEBUG_PORT".into(), "6070".into())));
    let service_ports = |manifests: &Manifests| -> Vec<Value> {
        manifests.one("Service")["spec"]["ports"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        !service_ports(&on).iter().any(|p| p["name"] == "debug"),
        "only on the Service when asked: {:#?}",
        service_ports(&on)
    );
    assert_eq!(on_service.container_port("debug"), 6071);
    assert!(
        on_service
            .env()
            .contains(&("DEBUG_PORT".into(), "6071".into()))
    );
    let debug = service_ports(&on_service)
        .into_iter()
        .find(|p| p["name"] == "debug")
        .expect("a debug Service port");
    assert_eq!(debug["port"], 6071);
    assert_eq!(debug["targetPort"], "debug");
}

#[test]
fn optional_objects_and_sizes_follow_the_values() {
    let Some(defaults) = render(None) else { return };
    assert_eq!(
        defaults.kinds(),
        ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    );
    assert_eq!(defaults.one("Deployment")["spec"]["replicas"], 1);
    assert!(!defaults.env().iter().any(|(name, _)| name == "REDIS_URL"));

    let Some(other) = render(Some(OTHER_VALUES)) else {
        return;
    };
    assert_eq!(
        other.kinds(),
        [
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "ServiceMonitor"
        ]
    );
    assert_eq!(other.one("Deployment")["spec"]["replicas"], 3);
    let env = other.env();
    for expected in [
        ("REDIS_URL", "redis://redis.example:6379"),
        ("LOG_LEVEL", "debug"),
        ("MAX_COUNTERS", "50000"),
    ] {
        assert!(
            env.contains(&(expected.0.into(), expected.1.into())),
            "{env:?}"
        );
    }
    assert_eq!(other.container()["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(other.container()["resources"]["requests"]["cpu"], "250m");
    assert_eq!(
        other.one("PodDisruptionBudget")["spec"]["maxUnavailable"],
        2
    );
    let monitor = other.one("ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "http");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "15s");
    let selector = &monitor["spec"]["selector"]["matchLabels"];
    assert_eq!(selector, &other.one("Service")["spec"]["selector"]);

    // A Secret that exists already is referred to, not made.
    let existing = "redis: {existingSecret: {name: shared-redis, key: address}}\n\
                    podDisruptionBudget: {enabled: false}";
    let Some(theirs) = render(Some(existing)) else {
        return;
    };
    assert_eq!(theirs.kinds(), ["ConfigMap", "Deployment", "Service"]);
    let vars = theirs.container()["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let redis = vars
        .iter()
        .find(|v| v["name"] == "REDIS_URL")
        .unwrap_or_else(|| panic!("no REDIS_URL: {vars:#?}"));
    assert_eq!(
        redis["valueFrom"]["secretKeyRef"],
        json!({"name": "shared-redis", "key": "address"})
    );
}
