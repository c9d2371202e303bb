//! Operating Tollgate: exact metrics after known traffic (per rule and per request value),
//! hot reload under load and with many concurrent callers, invalid rules that keep the
//! old ones serving, SIGHUP, ConfigMap swaps, response headers, and a graceful drain.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_testkit::grpc::{Code, RateLimitResponse, Rls, code, request};
use tollgate_testkit::process::Signal;
use tollgate_testkit::tollgate::{ConfigDir, Serve, Server};
use tollgate_testkit::wait;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const RULES: &str = r#"
domain: ops
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: detail
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
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

/// Serves the rule directory `config` with extra arguments.
fn start(config: ConfigDir, extra: &[&str]) -> Server {
    Serve::path(config.path()).keep(config).args(extra).start()
}

/// Polls until the rule for key `new` applies; returns how long it took.
async fn await_new_rule(rls: &mut Rls) -> Duration {
    let ((), took) = wait::until_async("the new rule applies", RELOAD_DEADLINE, async || match rls
        .check("ops", &[("new", "probe")])
        .await
        .current_limit
    {
        Some(_) => Ok(()),
        None => Err("no limit for `new` yet".to_owned()),
    })
    .await;
    took
}

/// Polls until the `/metrics` series `series` has the value `want`.
async fn await_metric(server: &Server, series: &str, want: f64) {
    let what = format!("{series} = {want}");
    wait::until_async(&what, RELOAD_DEADLINE, async || {
        match server.metric(series).await {
            Some(value) if value == want => Ok(()),
            other => Err(format!("{series} is {other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn metrics_count_known_traffic_exactly() {
    let server = start(ConfigDir::with_file("rules.yaml", RULES), &[]);
    let mut rls = server.client().await;
    for expected in [
        Code::Ok,
        Code::Ok,
        Code::Ok,
        Code::OverLimit,
        Code::OverLimit,
    ] {
        assert_eq!(code(&rls.check("ops", &[("user", "ann")]).await), expected);
    }
    assert_eq!(
        rls.check("ops", &[("nobody", "x")]).await.current_limit,
        None
    );
    let series = |name: &str| {
        format!(r#"ratelimit_service_rate_limit_{name}{{domain="ops",key1="user",key2=""}}"#)
    };
    assert_eq!(server.metric(&series("total_hits")).await, Some(5.0));
    assert_eq!(server.metric(&series("within_limit")).await, Some(3.0));
    assert_eq!(server.metric(&series("over_limit")).await, Some(2.0));
    // Limit 3, near threshold floor(3 × 0.8) = 2: only the third hit is near.
    assert_eq!(server.metric(&series("near_limit")).await, Some(1.0));
    assert_eq!(server.metric(&series("shadow_mode")).await, Some(0.0));
    assert_eq!(
        server
            .metric(r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#)
            .await,
        Some(6.0)
    );
    assert_eq!(
        server.metric("ratelimit_service_config_load_success").await,
        Some(1.0)
    );
    assert_eq!(server.metric("tollgate_counters").await, Some(1.0));
    assert_eq!(server.metric("tollgate_store_up").await, Some(1.0));
}

/// Every family on `/metrics` after traffic is typed counter, gauge or histogram with a
/// HELP that says something, and every sample belongs to one of them.
#[tokio::test]
async fn every_series_is_typed_and_explained() {
    let server = start(ConfigDir::with_file("rules.yaml", RULES), &[]);
    let mut rls = server.client().await;
    for _ in 0..4 {
        rls.check("ops", &[("user", "ann")]).await;
    }
    rls.check("ops", &[("detail", "a")]).await;
    rls.check("nosuch", &[("user", "ann")]).await;
    let page = server.get("/metrics").await;
    assert_eq!(
        page.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let mut helps = std::collections::HashMap::new();
    let mut types = std::collections::HashMap::new();
    for line in page.body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            helps.insert(name.to_owned(), help.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(
                ["counter", "gauge", "histogram"].contains(&kind),
                "{line}\n{}",
                page.body
            );
            assert!(
                helps.get(name).is_some_and(|h| h.len() > 10),
                "{name} has no HELP that says what it counts"
            );
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or(line);
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|s| name.strip_suffix(s))
                .find(|f| types.get(*f).is_some_and(|k| k == "histogram"))
                .unwrap_or(name);
            assert!(types.contains_key(family), "{line} has no TYPE");
        }
    }
    assert_eq!(
        types
            .get("ratelimit_service_rate_limit_total_hits")
            .map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        types
            .get("ratelimit_service_response_time_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    assert_eq!(
        helps["ratelimit_service_rate_limit_total_hits"],
        "Hits (hits_addend) asked of a rule's descriptor, admitted or not."
    );
}

/// A descriptor no rule matches is counted per domain (unknown domains past a cap as
/// `other`) and logged once per domain and keys.
#[tokio::test]
async fn unmatched_descriptors_are_counted_and_logged_once() {
    let server = start(ConfigDir::with_file("rules.yaml", RULES), &[]);
    let mut rls = server.client().await;
    for _ in 0..3 {
        rls.check("nosuch", &[("user", "ann")]).await;
        rls.check("ops", &[("usr", "ann")]).await;
    }
    rls.check("ops", &[("user", "ann")]).await;
    for i in 0..70 {
        rls.check(&format!("typo{i}"), &[("user", "ann")]).await;
    }
    let unmatched =
        |domain: &str| format!(r#"tollgate_unmatched_requests_total{{domain="{domain}"}}"#);
    assert_eq!(server.metric(&unmatched("nosuch")).await, Some(3.0));
    assert_eq!(server.metric(&unmatched("ops")).await, Some(3.0));
    // 64 unknown domains get their own label: nosuch and typo0..typo62; the rest share one.
    assert_eq!(server.metric(&unmatched("typo62")).await, Some(1.0));
    assert_eq!(server.metric(&unmatched("typo63")).await, None);
    assert_eq!(server.metric(&unmatched("other")).await, Some(7.0));
    // Stopped, so that every line it wrote has been read.
    let stderr = server.stop().stderr;
    let said = |what: &str| stderr.lines().filter(|l| l.contains(what)).count();
    assert_eq!(said("domain nosuch has no rules"), 1, "{stderr}");
    assert_eq!(
        said("domain ops has no rule for the entries usr"),
        1,
        "{stderr}"
    );
}

/// A rule with `detailed_metric` counts in series labelled with the request's values,
/// one per value, instead of one series for the rule.
#[tokio::test]
async fn detailed_metric_labels_series_with_request_values() {
    let server = start(ConfigDir::with_file("rules.yaml", RULES), &[]);
    let mut rls = server.client().await;
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&rls.check("ops", &[("detail", "a")]).await), expected);
    }
    assert_eq!(code(&rls.check("ops", &[("detail", "b")]).await), Code::Ok);
    let series = |name: &str, key1: &str| {
        format!(r#"ratelimit_service_rate_limit_{name}{{domain="ops",key1="{key1}",key2=""}}"#)
    };
    for (name, a, b) in [
        ("total_hits", 3.0, 1.0),
        ("within_limit", 2.0, 1.0),
        ("over_limit", 1.0, 0.0),
    ] {
        assert_eq!(
            server.metric(&series(name, "detail_a")).await,
            Some(a),
            "{name} of a"
        );
        assert_eq!(
            server.metric(&series(name, "detail_b")).await,
            Some(b),
            "{name} of b"
        );
    }
    let rule_level = server.metric(&series("total_hits", "detail")).await;
    assert!(
        rule_level.unwrap_or(0.0) == 0.0,
        "a detailed rule counts per value, not per rule: {rule_level:?}"
    );
}

/// A flood of distinct values cannot grow the metrics without bound: past
/// `--detailed-metric-limit` label sets, values share the rule's `key2="other"` series.
#[tokio::test]
async fn detailed_metric_label_sets_are_capped() {
    let server = start(
        ConfigDir::with_file("rules.yaml", RULES),
        &["--detailed-metric-limit", "2"],
    );
    let mut rls = server.client().await;
    for value in ["a", "b", "c", "d", "a", "e"] {
        assert_eq!(
            code(&rls.check("ops", &[("detail", value)]).await),
            Code::Ok
        );
    }
    let hits = |labels: &str| {
        format!("ratelimit_service_rate_limit_total_hits{{domain=\"ops\",{labels}}}")
    };
    for (labels, want) in [
        (r#"key1="detail_a",key2="""#, 2.0),
        (r#"key1="detail_b",key2="""#, 1.0),
        (r#"key1="detail",key2="other""#, 3.0),
    ] {
        assert_eq!(server.metric(&hits(labels)).await, Some(want), "{labels}");
    }
    let page = server.get("/metrics").await.body;
    let detail_series = page
        .lines()
        .filter(|l| {
            l.starts_with("ratelimit_service_rate_limit_total_hits{") && l.contains("detail")
        })
        .count();
    assert_eq!(detail_series, 3, "{page}");
}

#[tokio::test]
async fn a_valid_change_applies_under_load_without_a_failed_call() {
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let file = config.file("rules.yaml");
    let server = start(config, &[]);

    // Steady load on another key while the rules change; every call must succeed.
    let mut load = server.client().await;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_load = stop.clone();
    let background = tokio::spawn(async move {
        let (mut calls, mut failures) = (0u32, Vec::new());
        while !stop_load.load(Ordering::Relaxed) && calls < 100_000 {
            match load.call(request("ops", &[&[("load", "x")]])).await {
                Ok(r) if r.overall_code == i32::from(Code::Ok) => {}
                other => failures.push(format!("{other:?}")),
            }
            calls += 1;
        }
        (calls, failures)
    });

    let mut rls = server.client().await;
    assert_eq!(rls.check("ops", &[("new", "v")]).await.current_limit, None);
    std::fs::write(&file, with_new_rule()).expect("rewrite the rules");
    let took = await_new_rule(&mut rls).await;
    println!("reload applied after {took:?}");
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&rls.check("ops", &[("new", "v")]).await), expected);
    }
    stop.store(true, Ordering::Relaxed);
    let (calls, failures) = background.await.expect("the load task");
    assert!(calls > 0);
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed: {:?}",
        failures.len(),
        &failures[..1]
    );
    assert_eq!(
        server.metric("ratelimit_service_config_load_error").await,
        Some(0.0)
    );
}

/// Many callers at once while the rules are swapped: no call fails, every answer comes
/// from the old rules or the new ones, and a caller that has seen the new rules never
/// sees the old ones again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_many_concurrent_callers_answers_from_old_or_new_rules() {
    const CALLERS: usize = 16;
    let old = "domain: swap\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1000000, name: old}}\n";
    let new = "domain: swap\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 2000000, name: new}}\n";
    let config = ConfigDir::with_file("rules.yaml", old);
    let file = config.file("rules.yaml");
    let server = start(config, &[]);
    let swapped = Arc::new(AtomicBool::new(false));

    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let mut rls = server.client().await;
        let swapped = swapped.clone();
        callers.spawn(async move {
            let (mut seen_new, mut calls_after_swap) = (false, 0);
            // Until the swap, then at least 20 more calls, all with the new rules.
            while calls_after_swap < 20 || !seen_new {
                let value = format!("{caller}");
                let status = rls.check("swap", &[("k", &value)]).await;
                let name = status.current_limit.as_ref().map(|l| l.name.as_str());
                match name {
                    Some("old") => assert!(!seen_new, "caller {caller}: old rules after new ones"),
                    Some("new") => seen_new = true,
                    other => panic!("caller {caller}: an answer from neither rules: {other:?}"),
                }
                assert_eq!(code(&status), Code::Ok);
                if swapped.load(Ordering::Relaxed) {
                    calls_after_swap += 1;
                }
            }
        });
    }
    let mut rls = server.client().await;
    assert_eq!(
        rls.check("swap", &[("k", "probe")])
            .await
            .current_limit
            .map(|l| l.name),
        Some("old".to_owned())
    );
    std::fs::write(&file, new).expect("rewrite the rules");
    swapped.store(true, Ordering::Relaxed);
    tokio::time::timeout(RELOAD_DEADLINE, callers.join_all())
        .await
        .expect("every caller saw the new rules");
    assert_eq!(
        server.metric("ratelimit_service_config_load_error").await,
        Some(0.0)
    );
}

#[tokio::test]
async fn an_invalid_change_keeps_the_old_rules_and_is_counted() {
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let file = config.file("rules.yaml");
    let mut server = start(config, &[]);
    let mut rls = server.client().await;
    let s = rls.check("ops", &[("user", "bob")]).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 2));

    std::fs::write(
        &file,
        RULES.replace("requests_per_unit: 3", "requestsperunit: 3"),
    )
    .expect("break the rules");
    await_metric(&server, "ratelimit_service_config_load_error", 1.0).await;
    // The old limit of 3 still applies and still counts.
    let s = rls.check("ops", &[("user", "bob")]).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 1));

    // SIGHUP reloads too (nothing changed on disk, so only the signal can do it).
    server.signal(Signal::Hup);
    await_metric(&server, "ratelimit_service_config_load_error", 2.0).await;

    let output = server.stop();
    let logged = output.stderr_lines();
    assert!(
        logged
            .iter()
            .any(|l| l.contains("rules.yaml") && l.contains("requestsperunit")),
        "the log names the file and the problem: {logged:?}"
    );
}

/// The headers a response asks Envoy to add, as (name, value).
fn headers_to_add(response: &RateLimitResponse) -> Vec<(&str, &str)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
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
    assert_eq!(
        headers_to_add(&response),
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
    assert_eq!(
        headers_to_add(&response),
        [
            ("RateLimit-Policy", "\"descriptor-0\";q=3;w=60"),
            ("RateLimit", "\"descriptor-0\";r=2;t=60")
        ]
    );
}

/// The reference's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER name
/// the three headers.
#[tokio::test]
async fn reference_header_names_are_the_settings() {
    let server = Serve::rules(RULES)
        .env("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
        .env("LIMIT_LIMIT_HEADER", "X-Quota")
        .env("LIMIT_REMAINING_HEADER", "X-Quota-Left")
        .env("LIMIT_RESET_HEADER", "X-Quota-Reset")
        .start();
    let mut rls = server.client().await;
    let response = rls.ok(request("ops", &[&[("user", "n")]])).await;
    assert_eq!(
        headers_to_add(&response),
        [
            ("X-Quota", "3"),
            ("X-Quota-Left", "2"),
            ("X-Quota-Reset", "60")
        ]
    );
    let refused = Serve::rules(RULES)
        .env("LIMIT_RESET_HEADER", "bad header")
        .refused("an invalid header name stops startup");
    assert!(
        refused
            .stderr
            .contains("'bad header' is not an HTTP header name"),
        "{}",
        refused.stderr
    );
}

/// LOG_FORMAT=json writes the reference's fields: `@timestamp`, `level`, `@message`.
#[tokio::test]
async fn json_logs_have_the_references_field_names() {
    let server = Serve::rules(RULES).env("LOG_FORMAT", "json").start();
    // The line may still be on its way through the pipe when the server answers.
    let line = server
        .stderr()
        .wait_for(|l| l.contains("rules loaded"), Duration::from_secs(10))
        .unwrap_or_else(|e| {
            panic!(
                "no 'rules loaded' line ({e:?}): {:#?}",
                server.stderr().all()
            )
        });
    let parsed: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(parsed["@message"], "rules loaded", "{line}");
    assert_eq!(parsed["level"], "info", "{line}");
    let timestamp = parsed["@timestamp"].as_str().unwrap_or_default();
    assert!(
        timestamp.len() >= 20 && timestamp.ends_with('Z') && timestamp.as_bytes()[10] == b'T',
        "{line}"
    );
    assert_eq!(parsed["domains"], 1, "{line}");
}

/// SIGTERM with a shutdown delay: HTTP and gRPC health fail at once (so load balancers
/// and Envoy stop sending), calls are still answered while the delay runs, and the
/// process then exits 0.
#[tokio::test]
async fn sigterm_fails_health_first_and_keeps_answering_until_it_stops() {
    let mut server = start(
        ConfigDir::with_file("rules.yaml", RULES),
        &["--shutdown-delay", "3s"],
    );
    let mut rls = server.client().await;
    let mut health = HealthClient::new(server.channel().await);
    assert_eq!(server.get("/healthcheck").await.status, 200);
    server.signal(Signal::Term);
    wait::until_async(
        "/healthcheck failing",
        Duration::from_secs(10),
        async || match server.get("/healthcheck").await {
            resp if resp.status == 500 => Ok(resp),
            resp => Err(format!("{resp:?}")),
        },
    )
    .await;
    assert_eq!(server.get("/healthcheck").await.body, "draining");
    for service in ["", "ratelimit"] {
        let resp = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("grpc.health.v1.Health/Check while draining")
            .into_inner();
        assert_eq!(
            resp.status,
            ServingStatus::NotServing as i32,
            "gRPC health of {service:?} while draining"
        );
    }
    // Draining, not gone: calls are still answered.
    let s = rls.check("ops", &[("user", "drain")]).await;
    assert_eq!(code(&s), Code::Ok);
    let finished = tokio::task::spawn_blocking(move || server.wait_exit(Duration::from_secs(20)))
        .await
        .expect("wait for the exit");
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
    assert_eq!(rls.check("ops", &[("new", "v")]).await.current_limit, None);

    std::fs::create_dir(dir.join("..2026_01_02")).expect("a new data directory");
    std::fs::write(dir.join("..2026_01_02/rules.yaml"), with_new_rule()).expect("new rules");
    symlink("..2026_01_02", dir.join("..data_tmp")).expect("link ..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");

    await_new_rule(&mut rls).await;
    assert_eq!(
        server.metric("ratelimit_service_config_load_error").await,
        Some(0.0)
    );
    assert_eq!(
        server.metric("ratelimit_service_config_load_success").await,
        Some(2.0),
        "one load at start, one after the swap: the dot-entries are not loaded"
    );
}

/// Opening and reading the rules (a `cat`, a second instance, a backup tool) is not a
/// change: before the fix, each reload's own reads triggered the next one, forever.
#[tokio::test]
async fn reading_the_rules_does_not_reload_them() {
    /// An absence can only be seen over time: several of the watcher's 150 ms settle
    /// periods, in which the old loop reloaded again and again.
    const QUIET: Duration = Duration::from_secs(1);
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let file = config.file("rules.yaml");
    let dir = config.path().to_owned();
    let mut server = start(config, &[]);
    let success = "ratelimit_service_config_load_success";
    for _ in 0..20 {
        std::fs::read_dir(&dir).expect("list").for_each(drop);
        std::fs::read_to_string(&file).expect("read");
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(server.metric(success).await, Some(1.0), "reads reloaded");
    // A reload reads every file itself.
    server.signal(Signal::Hup);
    await_metric(&server, success, 2.0).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(server.metric(success).await, Some(2.0), "a reload reloaded");
}

/// A rules directory that a careless operator left hostile: a self-symlink, a FIFO and a
/// link to `/dev/zero` named like rules. Each reload fails naming the path, promptly, and
/// the old rules keep serving; `check-config` says the same and exits.
#[cfg(unix)]
#[tokio::test]
async fn hostile_entries_in_the_rules_directory_fail_the_reload_not_the_server() {
    use std::os::unix::fs::symlink;
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let dir = config.path().to_owned();
    let server = start(config, &[]);
    let mut rls = server.client().await;

    /// Makes one hostile entry at the path.
    type Make = fn(&std::path::Path);
    let hostile: [(&str, Make); 3] = [
        ("loop", |p| symlink(".", p).expect("self-symlink")),
        ("x.yaml", |p| {
            let made = std::process::Command::new("mkfifo")
                .arg(p)
                .status()
                .expect("mkfifo");
            assert!(made.success());
        }),
        ("z.yaml", |p| {
            symlink("/dev/zero", p).expect("link /dev/zero")
        }),
    ];
    for (errors, (name, make)) in (1..).zip(hostile) {
        let path = dir.join(name);
        make(&path);
        await_metric(
            &server,
            "ratelimit_service_config_load_error",
            errors.into(),
        )
        .await;
        assert_eq!(server.get("/healthcheck").await.status, 200);
        let s = rls.check("ops", &[("user", name)]).await;
        assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 2), "old rules");

        let checked = tollgate_testkit::tollgate::check_config(&dir);
        assert_eq!(checked.status.code(), Some(1), "{checked:?}");
        assert!(
            checked.stderr.contains(&path.display().to_string()),
            "check-config names {}: {checked:?}",
            path.display()
        );
        std::fs::remove_file(&path).expect("remove");
        // The removal is a change too, and the directory is valid again.
        await_metric(
            &server,
            "ratelimit_service_config_load_success",
            (errors + 1).into(),
        )
        .await;
    }
}
