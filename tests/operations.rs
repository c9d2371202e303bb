//! Operating Tollgate: exact metrics after known traffic, hot reload under load, invalid
//! rules that keep the old ones serving, SIGHUP, response headers, and a graceful drain.

mod common;

use std::time::{Duration, Instant};

use common::{Code, ConfigDir, Server, code, http_get, request, serve_command};

const RULES: &str = r#"
domain: ops
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: load
    rate_limit: {unit: minute, requests_per_unit: 1000000}
"#;

/// How long a change may take to be noticed before the test gives up; the target (under a
/// second) is measured and printed, not asserted, as timing belongs to benchmarks.
const RELOAD_DEADLINE: Duration = Duration::from_secs(15);

/// `RULES` plus a rule for key `new`: 2 per hour.
fn with_new_rule() -> String {
    RULES.replace(
        "  - key: load",
        "  - key: new\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: load",
    )
}

/// The value of the first metric line that starts with `prefix` (name and labels).
fn metric(server: &Server, prefix: &str) -> Option<f64> {
    let page = http_get(server.http_addr(), "/metrics");
    assert_eq!(page.status, 200);
    page.body
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn start(config: ConfigDir, extra: &[&str]) -> Server {
    let mut cmd = serve_command(config.path());
    cmd.args(extra);
    Server::spawn(cmd).unwrap_or_else(|f| f.fail()).keep(config)
}

/// Polls `check` until true or the deadline; returns how long it took.
async fn until(what: &str, deadline: Duration, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < deadline,
            "{what}: not within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn metrics_count_known_traffic_exactly() {
    let server = start(ConfigDir::with_file("rules.yaml", RULES), &[]);
    let mut rls = server.client().await;
    for _ in 0..5 {
        rls.check("ops", &[("user", "ann")]).await;
    }
    rls.check("ops", &[("nobody", "x")]).await;
    let labels = r#"{domain="ops",key1="user",key2=""}"#;
    let value = |name: &str| {
        metric(
            &server,
            &format!("ratelimit_service_rate_limit_{name}{labels}"),
        )
    };
    assert_eq!(value("total_hits"), Some(5.0));
    assert_eq!(value("within_limit"), Some(3.0));
    assert_eq!(value("over_limit"), Some(2.0));
    // Limit 3, near threshold floor(3 × 0.8) = 2: only the third hit is near.
    assert_eq!(value("near_limit"), Some(1.0));
    assert_eq!(value("shadow_mode"), Some(0.0));
    assert_eq!(
        metric(
            &server,
            r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#
        ),
        Some(6.0)
    );
    assert_eq!(
        metric(&server, "ratelimit_service_config_load_success "),
        Some(1.0)
    );
    assert_eq!(metric(&server, "tollgate_counters "), Some(1.0));
    assert_eq!(metric(&server, "tollgate_store_up "), Some(1.0));
}

#[tokio::test]
async fn a_valid_change_applies_under_load_without_a_failed_call() {
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let file = config.file("rules.yaml");
    let server = start(config, &[]);

    // Steady load on another key while the rules change; every call must succeed.
    let mut load = server.client().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_load = stop.clone();
    let background = tokio::spawn(async move {
        let (mut calls, mut failures) = (0u32, Vec::new());
        while !stop_load.load(std::sync::atomic::Ordering::Relaxed) && calls < 100_000 {
            match load.call(request("ops", &[&[("load", "x")]])).await {
                Ok(r) if r.overall_code == i32::from(Code::Ok) => {}
                other => failures.push(format!("{other:?}")),
            }
            calls += 1;
        }
        (calls, failures)
    });

    let mut rls = server.client().await;
    assert!(
        rls.check("ops", &[("new", "v")])
            .await
            .current_limit
            .is_none()
    );
    let changed = with_new_rule();
    std::fs::write(&file, changed).expect("rewrite the rules");
    let took = until("the new rule applies", RELOAD_DEADLINE, async || {
        rls.check("ops", &[("new", "probe")])
            .await
            .current_limit
            .is_some()
    })
    .await;
    println!("reload applied after {took:?}");
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&rls.check("ops", &[("new", "v")]).await), expected);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (calls, failures) = background.await.expect("load task");
    assert!(calls > 0);
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed: {:?}",
        failures.len(),
        &failures[..1]
    );
    assert_eq!(
        metric(&server, "ratelimit_service_config_load_error "),
        Some(0.0)
    );
}

#[tokio::test]
async fn an_invalid_change_keeps_the_old_rules_and_is_counted() {
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let file = config.file("rules.yaml");
    let server = start(config, &[]);
    let mut rls = server.client().await;
    rls.check("ops", &[("user", "bob")]).await;

    std::fs::write(
        &file,
        RULES.replace("requests_per_unit: 3", "requestsperunit: 3"),
    )
    .expect("break the rules");
    until("the error is counted", RELOAD_DEADLINE, async || {
        metric(&server, "ratelimit_service_config_load_error ") == Some(1.0)
    })
    .await;
    // The old limit of 3 still applies and still counts.
    let s = rls.check("ops", &[("user", "bob")]).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 1));

    // SIGHUP reloads too (nothing changed on disk, so only the signal can do it).
    server.signal("HUP");
    until("SIGHUP reloads", RELOAD_DEADLINE, async || {
        metric(&server, "ratelimit_service_config_load_error ") == Some(2.0)
    })
    .await;

    let output = server.stop();
    let logged = output.stderr_lines();
    assert!(
        logged
            .iter()
            .any(|l| l.contains("rules.yaml") && l.contains("requestsperunit")),
        "the log names the file and the problem: {logged:?}"
    );
}

#[tokio::test]
async fn reference_and_draft_response_headers() {
    let server = start(
        ConfigDir::with_file("rules.yaml", RULES),
        &["--limit-response-headers"],
    );
    let mut rls = server.client().await;
    let response = rls
        .ok(request("ops", &[&[("user", "h")], &[("load", "h")]]))
        .await;
    let headers: Vec<_> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(
        headers,
        [
            ("RateLimit-Limit", "3"),
            ("RateLimit-Remaining", "2"),
            ("RateLimit-Reset", "60")
        ]
    );

    let draft = start(
        ConfigDir::with_file("rules.yaml", RULES),
        &[
            "--limit-response-headers",
            "--response-headers-format",
            "draft",
        ],
    );
    let mut rls = draft.client().await;
    let response = rls.ok(request("ops", &[&[("user", "h")]])).await;
    let headers: Vec<_> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(
        headers,
        [
            ("RateLimit-Policy", "\"descriptor-0\";q=3;w=60"),
            ("RateLimit", "\"descriptor-0\";r=2;t=60")
        ]
    );
}

#[tokio::test]
async fn sigterm_fails_health_first_and_keeps_answering_until_it_stops() {
    let server = start(
        ConfigDir::with_file("rules.yaml", RULES),
        &["--shutdown-delay", "3s"],
    );
    let mut rls = server.client().await;
    assert_eq!(http_get(server.http_addr(), "/healthcheck").status, 200);
    server.signal("TERM");
    until("health fails", Duration::from_secs(10), async || {
        http_get(server.http_addr(), "/healthcheck").status == 500
    })
    .await;
    assert_eq!(
        http_get(server.http_addr(), "/healthcheck").body,
        "draining"
    );
    // Draining, not gone: calls are still answered.
    let s = rls.check("ops", &[("user", "drain")]).await;
    assert_eq!(code(&s), Code::Ok);
    let finished = server.wait_exit(Duration::from_secs(20));
    assert!(
        finished.status.success(),
        "a drained shutdown exits 0: {:?}",
        finished.status
    );
}

/// A Kubernetes ConfigMap volume: files are links through `..data`, which the kubelet swaps
/// atomically to a new timestamped directory. Dot-entries are not loaded twice.
#[cfg(unix)]
#[tokio::test]
async fn a_configmap_symlink_swap_reloads() {
    use std::os::unix::fs::symlink;
    let config = ConfigDir::new();
    let dir = config.path().to_owned();
    config.write("..2026_01_01/rules.yaml", RULES);
    symlink("..2026_01_01", dir.join("..data")).expect("link ..data");
    symlink("..data/rules.yaml", dir.join("rules.yaml")).expect("link rules.yaml");
    let server = start(config, &[]);
    let mut rls = server.client().await;
    assert!(
        rls.check("ops", &[("new", "v")])
            .await
            .current_limit
            .is_none()
    );

    let changed = with_new_rule();
    std::fs::create_dir(dir.join("..2026_01_02")).expect("new data dir");
    std::fs::write(dir.join("..2026_01_02/rules.yaml"), changed).expect("new rules");
    symlink("..2026_01_02", dir.join("..data_tmp")).expect("link ..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");

    until("the swapped rules apply", RELOAD_DEADLINE, async || {
        rls.check("ops", &[("new", "probe")])
            .await
            .current_limit
            .is_some()
    })
    .await;
    assert_eq!(
        metric(&server, "ratelimit_service_config_load_error "),
        Some(0.0)
    );
}
