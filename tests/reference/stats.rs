//! Stats as the reference reports them. The reference and Tollgate, each with a
//! statsd_exporter mapped by the reference's own mapping
//! (`examples/prom-statsd-exporter/conf.yaml` of its module) and the reference's
//! settings (`USE_STATSD`, `STATSD_HOST`, `STATSD_PORT`), get the same requests: the
//! Prometheus series the two exporters derive are the same, so a statsd pipeline keeps
//! its dashboards after a switch. Tollgate's debug port serves the same stats as
//! `name: value` lines on `/stats`, and the rules on `/rlconfig`.

use std::time::Duration;

use tollgate_testkit::grpc::{Code, request};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::reference::{self, Installed, Reference, RuntimeRoot, plain_env};
use tollgate_testkit::statsd_exporter::StatsdExporter;
use tollgate_testkit::{free_port, http, wait};

use crate::support::{tollgate_with_env, vars, work_dir};

const RULES: &str = "\
domain: stats
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /a
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 100}
";

/// The requests each server gets: three for one user (the third over its limit), two
/// for a nested descriptor.
const REQUESTS: &[&[(&str, &str)]] = &[
    &[("user", "ann")],
    &[("user", "ann")],
    &[("user", "ann")],
    &[("path", "/a"), ("method", "GET")],
    &[("path", "/a"), ("method", "POST")],
];

/// Series of the reference's mapping that both must send; timings differ by nature.
fn reference_series(page: &str) -> Vec<String> {
    let mut lines: Vec<String> = page
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_") && !l.contains("response_time"))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Reference,
    Tollgate,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_gives_the_references_series() {
    let test = "stats::statsd_gives_the_references_series";
    let Some(installed) = reference::or_skip(test) else {
        return;
    };
    let reference = exported(installed, Target::Reference).await;
    let tollgate = exported(installed, Target::Tollgate).await;
    assert!(
        reference
            .iter()
            .any(|l| l.contains("rate_limit_over_limit") && l.contains("key1=\"user\"")),
        "the reference's exporter has no over_limit series: {reference:#?}"
    );
    assert_eq!(
        tollgate, reference,
        "statsd_exporter's series from Tollgate (left) and from the reference (right)"
    );
}

/// The series `target`'s statsd output becomes once every request is counted in it.
async fn exported(installed: &Installed, target: Target) -> Vec<String> {
    let mapping = installed
        .module_dir
        .join("examples/prom-statsd-exporter/conf.yaml");
    let exporter = StatsdExporter::start(installed, &mapping).await;
    let redis = RedisServer::start();
    let root = RuntimeRoot::new_in(&work_dir("stats"));
    root.write("stats.yaml", RULES);
    let mut env = plain_env(&redis.host_port(), &root);
    env.retain(|(name, _)| name != "DISABLE_STATS");
    env.extend(vars(&[
        ("USE_STATSD", "true"),
        ("STATSD_HOST", &exporter.statsd.ip().to_string()),
        ("STATSD_PORT", &exporter.statsd.port().to_string()),
        ("STATS_FLUSH_INTERVAL", "1s"),
    ]));
    let (mut client, _server): (_, Box<dyn std::any::Any>) = match target {
        Target::Reference => {
            let server = Reference::start(installed, &env).await;
            (server.client().await, Box::new(server))
        }
        Target::Tollgate => {
            let server = tollgate_with_env(&env).start_connected().await;
            (server.client().await, Box::new(server))
        }
    };
    for descriptor in REQUESTS {
        let answer = client.call(request("stats", &[descriptor])).await;
        assert!(answer.is_ok(), "{target:?}: {answer:?}");
    }
    let done = |page: &str| {
        page.contains("ratelimit_service_rate_limit_total_hits") && {
            let series = reference_series(page);
            let hits: Vec<&String> = series.iter().filter(|l| l.contains("total_hits")).collect();
            hits.iter()
                .any(|l| l.contains("key1=\"user\"") && l.ends_with(" 3"))
                && hits
                    .iter()
                    .any(|l| l.contains("key1=\"path_/a\"") && l.ends_with(" 2"))
        }
    };
    let mut page = String::new();
    wait::until_async(
        &format!("{target:?}'s stats in statsd_exporter"),
        Duration::from_secs(20),
        async || {
            page = exporter.metrics().await;
            if done(&page) {
                Ok(())
            } else {
                Err(reference_series(&page).join("\n"))
            }
        },
    )
    .await;
    // One more flush: whatever was still on its way has arrived.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    reference_series(&exporter.metrics().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_port_serves_rules_and_stats() {
    let root = RuntimeRoot::new_in(&work_dir("debug_port"));
    root.write("stats.yaml", RULES);
    let mut env = root.env();
    env.extend(vars(&[("RUNTIME_WATCH_ROOT", "false")]));
    let port = free_port();
    let server = tollgate_with_env(&env)
        .env("DEBUG_PORT", port.to_string())
        .start_connected()
        .await;
    let mut client = server.client().await;
    for descriptor in REQUESTS {
        client
            .call(request("stats", &[descriptor]))
            .await
            .expect("an answer");
    }
    let over = client
        .call(request("stats", &[&[("user", "ann")]]))
        .await
        .expect("an answer");
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    let debug = std::net::SocketAddr::from(([127, 0, 0, 1], port));

    let stats = http::get(debug, "/stats").await;
    assert_eq!(stats.status, 200, "{stats:?}");
    for line in [
        "ratelimit.service.rate_limit.stats.user.total_hits: 4\n",
        "ratelimit.service.rate_limit.stats.user.over_limit: 2\n",
        "ratelimit.service.rate_limit.stats.path_/a.method.total_hits: 2\n",
        "ratelimit_server.ShouldRateLimit.total_requests: 6\n",
        "ratelimit.service.config_load_success: 1\n",
    ] {
        assert!(
            stats.body.contains(line),
            "no {line:?} in /stats:\n{}",
            stats.body
        );
    }
    let rules = http::get(debug, "/rlconfig").await;
    assert_eq!(rules.status, 200);
    assert!(
        rules
            .body
            .contains("stats.user: unit=MINUTE requests_per_unit=2"),
        "{}",
        rules.body
    );
    let index = http::get(debug, "/").await;
    assert!(index.body.contains("/rlconfig") && index.body.contains("/stats"));
}
