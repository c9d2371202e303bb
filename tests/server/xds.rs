//! Rules over xDS: a real Tollgate process subscribed to the test management server of
//! `tollgate-testkit` (ADS, State of the World, the real protocol), which pushes
//! `RateLimitConfig` resources and records every ACK and NACK.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use tollgate_testkit::envoy_gateway;
use tollgate_testkit::grpc::{Code, DescriptorStatus, Rls, code, request};
use tollgate_testkit::http;
use tollgate_testkit::pki::Pki;
use tollgate_testkit::process::{self, Finished, Signal};
use tollgate_testkit::tls;
use tollgate_testkit::tollgate::{self, ConfigDir, Serve, Server};
use tollgate_testkit::wait;
use tollgate_testkit::xds::{ServerTls, XdsServer, resource};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const NODE: &str = "tollgate-test";
/// How long a condition polled over HTTP may take.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long a `tollgate serve` that must refuse to start may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Resources
// ---------------------------------------------------------------------------

fn per(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit,
        ..Default::default()
    })
}

fn key(key: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        rate_limit,
        ..Default::default()
    }
}

/// One resource per domain, named after it, as Envoy Gateway makes them.
fn domain(name: &str, descriptors: Vec<RateLimitDescriptor>) -> Any {
    named(name, name, descriptors)
}

/// One domain with one limited key: the rules of most tests here.
fn single(name: &str, key_name: &str, unit: RateLimitUnit, requests_per_unit: u32) -> Vec<Any> {
    vec![domain(
        name,
        vec![key(key_name, per(unit, requests_per_unit))],
    )]
}

fn named(resource_name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> Any {
    resource(RateLimitConfig {
        name: resource_name.into(),
        domain: domain.into(),
        descriptors,
    })
}

// ---------------------------------------------------------------------------
// Tollgate
// ---------------------------------------------------------------------------

/// `tollgate serve` with rules from `xds`, quick to reconnect, plus `env`, on free ports.
fn xds_command(xds: &XdsServer, env: &[(&str, &str)]) -> Command {
    xds_command_on(xds, env, "127.0.0.1:0", "127.0.0.1:0")
}

/// [`xds_command`] on the given gRPC and HTTP addresses.
fn xds_command_on(xds: &XdsServer, env: &[(&str, &str)], grpc: &str, http: &str) -> Command {
    let mut cmd = tollgate::serve_on(grpc, http);
    cmd.envs(xds.client_env(NODE)).envs(env.iter().copied());
    cmd
}

/// Starts `cmd` off the async workers (the readiness line may wait for a push).
async fn start(cmd: Command) -> Server {
    tokio::task::spawn_blocking(move || Serve::custom(cmd).start())
        .await
        .expect("start tollgate")
}

/// Runs `cmd`, which must exit by itself (refusing to start).
fn run(cmd: Command) -> Finished {
    process::run("tollgate serve", cmd, EXIT_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

/// The status of one `key=value` descriptor of `domain`: its code and limit per unit.
async fn ask(server: &Server, domain: &str, key: &str, value: &str) -> (Code, Option<u32>) {
    let status = server.client().await.check(domain, &[(key, value)]).await;
    (
        code(&status),
        status.current_limit.map(|l| l.requests_per_unit),
    )
}

/// Asks `n` times; returns how many were admitted.
async fn admitted(server: &Server, domain: &str, key: &str, value: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if ask(server, domain, key, value).await.0 == Code::Ok {
            ok += 1;
        }
    }
    ok
}

/// Polls `/metrics` until `holds` is true of the value of `series`.
async fn await_metric(server: &Server, series: &str, holds: impl Fn(Option<f64>) -> bool) {
    let what = format!("{series} as expected");
    wait::until_async(&what, DEADLINE, async || {
        match server.metric(series).await {
            value if holds(value) => Ok(()),
            value => Err(format!("{series} is {value:?}")),
        }
    })
    .await;
}

async fn grpc_health(server: &Server) -> ServingStatus {
    let mut health = HealthClient::new(server.channel().await);
    let reply = health
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .expect("health check");
    ServingStatus::try_from(reply.into_inner().status).expect("known status")
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// The first push, a push that changes a limit, and one that adds and removes domains:
/// each is in force once ACKed, and `/rlconfig` and the metrics say which version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_replace_the_rules_and_are_acked_once_live() {
    let xds = XdsServer::start().await;
    xds.set(NODE, "1", single("shop", "user", RateLimitUnit::Minute, 2));
    let server = start(xds_command(
        &xds,
        &[
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-tenant:blue,x-zone:a",
            ),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "cluster=edge,bad-entry"),
        ],
    ))
    .await;

    let subscription = xds.wait_subscription(NODE, 0).await;
    assert_eq!(
        subscription.type_url,
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    assert!(
        subscription.resource_names.is_empty(),
        "a wildcard subscription"
    );
    assert_eq!(
        subscription.headers.get("x-tenant").map(String::as_str),
        Some("blue")
    );
    assert_eq!(
        subscription.headers.get("x-zone").map(String::as_str),
        Some("a")
    );
    assert_eq!(
        subscription.node_metadata,
        HashMap::from([("cluster".to_owned(), "edge".to_owned())])
    );
    // FORCE_START_WITHOUT_INITIAL_CONFIG=false: ready means the first rules are in force.
    xds.wait_ack(NODE, "1").await;
    assert_eq!(admitted(&server, "shop", "user", "ann", 3).await, 2);

    // A changed limit.
    let pushed = Instant::now();
    xds.set(NODE, "2", single("shop", "user", RateLimitUnit::Minute, 5));
    xds.wait_ack(NODE, "2").await;
    eprintln!(
        "push → ACK (rules live) of version 2 took {:?}",
        pushed.elapsed()
    );
    assert_eq!(
        ask(&server, "shop", "user", "bob").await,
        (Code::Ok, Some(5))
    );
    assert_eq!(admitted(&server, "shop", "user", "bob", 5).await, 4);

    // Domains added and removed: `shop` goes, `api` and `web` come.
    xds.set(
        NODE,
        "3",
        vec![
            domain("api", vec![key("token", per(RateLimitUnit::Hour, 1))]),
            domain("web", vec![key("ip", per(RateLimitUnit::Second, 100))]),
        ],
    );
    xds.wait_ack(NODE, "3").await;
    assert_eq!(ask(&server, "shop", "user", "carl").await, (Code::Ok, None));
    assert_eq!(ask(&server, "api", "token", "t").await, (Code::Ok, Some(1)));
    assert_eq!(
        ask(&server, "api", "token", "t").await,
        (Code::OverLimit, Some(1))
    );
    assert_eq!(ask(&server, "web", "ip", "x").await, (Code::Ok, Some(100)));

    let page = server.get("/rlconfig").await.body;
    let head: Vec<&str> = page.lines().take(3).collect();
    assert_eq!(
        head,
        [
            format!("# source: xDS server {}, version \"3\"", xds.addr()).as_str(),
            "# domain api: resource api",
            "# domain web: resource web",
        ],
        "{page}"
    );
    assert!(
        page.contains("api.token: unit=HOUR requests_per_unit=1"),
        "{page}"
    );
    assert!(!page.contains("shop"), "{page}");
    assert_eq!(
        server.metric("ratelimit_service_config_load_success").await,
        Some(3.0)
    );
    assert_eq!(
        server.metric("ratelimit_service_config_load_error").await,
        Some(0.0)
    );
    assert_eq!(server.metric("tollgate_xds_connected").await, Some(1.0));
    assert_eq!(
        server
            .metric("tollgate_xds_config_info{version=\"3\"}")
            .await,
        Some(1.0)
    );
    let age = server
        .metric("tollgate_xds_seconds_since_update")
        .await
        .expect("age of the rules");
    assert!((0.0..60.0).contains(&age), "{age}");
    // The entry that is not key=value was dropped with a warning.
    let stderr = server.stop().stderr;
    assert!(stderr.contains("'bad-entry' is not key=value"), "{stderr}");
}

/// A push that does not compile is NACKed with every problem (named by resource), the
/// last good version and the received nonce; the previous rules keep answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_push_is_nacked_and_the_old_rules_keep_serving() {
    let xds = XdsServer::start().await;
    xds.set(NODE, "1", single("shop", "user", RateLimitUnit::Minute, 2));
    let server = start(xds_command(&xds, &[])).await;
    xds.wait_ack(NODE, "1").await;

    let mut bad_unit = key("user", per(RateLimitUnit::Minute, 1));
    if let Some(policy) = bad_unit.rate_limit.as_mut() {
        policy.unit = RateLimitUnit::Unknown as i32;
    }
    xds.set(
        NODE,
        "2",
        vec![
            domain("shop", vec![bad_unit]),
            domain("other", vec![key("", per(RateLimitUnit::Second, 1))]),
        ],
    );
    let nack = xds.wait_nack(NODE, "2").await;
    assert_eq!(nack.version_info, "1", "the version still in force");
    let sent = xds.sent();
    let v2 = sent
        .iter()
        .find(|s| s.version == "2")
        .expect("version 2 sent");
    assert_eq!(nack.response_nonce, v2.nonce);
    let error = nack.error.expect("error detail");
    assert_eq!(
        error.lines().collect::<Vec<_>>(),
        [
            "shop: descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'",
            "other: descriptors[0]: descriptor has empty key",
        ]
    );
    assert_eq!(
        admitted(&server, "shop", "user", "ann", 3).await,
        2,
        "version 1 answers"
    );
    assert_eq!(
        server.metric("ratelimit_service_config_load_error").await,
        Some(1.0)
    );
    assert_eq!(server.metric("tollgate_xds_nacks_total").await, Some(1.0));
    assert_eq!(
        server
            .metric("tollgate_xds_config_info{version=\"1\"}")
            .await,
        Some(1.0)
    );

    // The next good version is taken.
    xds.set(NODE, "3", single("shop", "user", RateLimitUnit::Minute, 9));
    xds.wait_ack(NODE, "3").await;
    assert_eq!(
        ask(&server, "shop", "user", "bob").await,
        (Code::Ok, Some(9))
    );
}

/// The management server goes away and comes back: the rules in force keep answering
/// meanwhile, the stream is reopened from the version in force, and pushes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_management_server_restart_keeps_the_rules_in_force() {
    let xds = XdsServer::start().await;
    xds.set(NODE, "1", single("shop", "user", RateLimitUnit::Minute, 2));
    let server = start(xds_command(&xds, &[])).await;
    let first = xds.wait_ack(NODE, "1").await;

    let mut xds = xds;
    xds.stop().await;
    await_metric(&server, "tollgate_xds_connected", |v| v == Some(0.0)).await;
    assert_eq!(
        admitted(&server, "shop", "user", "ann", 3).await,
        2,
        "rules still in force"
    );

    let xds = xds.restart().await;
    let again = xds.wait_subscription(NODE, first.stream).await;
    assert_eq!(again.version_info, "1", "resumes from the version in force");
    assert_eq!(again.response_nonce, "");
    xds.set(NODE, "2", single("shop", "user", RateLimitUnit::Minute, 4));
    xds.wait_ack(NODE, "2").await;
    assert_eq!(
        ask(&server, "shop", "user", "bob").await,
        (Code::Ok, Some(4))
    );
    assert!(
        server
            .metric("tollgate_xds_reconnects_total")
            .await
            .is_some_and(|n| n >= 1.0)
    );
}

/// TLS to the management server with a client certificate it requires; the server's
/// certificate names only `xds.test`, which CONFIG_GRPC_XDS_SERVER_TLS_SAN asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_and_a_server_name() {
    let pki = Pki::new();
    let server_cert = pki.issue("xds-server", "DNS:xds.test");
    let client_cert = pki.issue("tollgate", "DNS:tollgate.test");
    let xds = XdsServer::start_tls(ServerTls {
        cert: server_cert.cert,
        key: server_cert.key,
        client_ca: pki.ca(),
    })
    .await;
    xds.set(NODE, "1", single("tls", "user", RateLimitUnit::Hour, 1));
    let path = |p: &std::path::Path| p.display().to_string();
    let (cert, key_file, ca) = (
        path(&client_cert.cert),
        path(&client_cert.key),
        path(&pki.ca()),
    );
    let tls_env = [
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key_file.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.test"),
    ];
    let server = start(xds_command(&xds, &tls_env)).await;
    xds.wait_ack(NODE, "1").await;
    assert_eq!(admitted(&server, "tls", "user", "ann", 2).await, 1);

    // A key that is not the certificate's stops startup, naming both files.
    let other = pki.issue("other", "DNS:other.test");
    let wrong_key = path(&other.key);
    let mut env = tls_env.to_vec();
    env[2] = ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", wrong_key.as_str());
    let failed = run(xds_command(&xds, &env));
    assert_eq!(failed.status.code(), Some(1), "{}", failed.stderr);
    assert!(
        failed.stderr.contains(&format!(
            "{cert} and {wrong_key}: the key does not belong to the certificate"
        )),
        "{}",
        failed.stderr
    );
    // A missing CA file is named too.
    env[2] = ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key_file.as_str());
    env[3] = ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.crt");
    let failed = run(xds_command(&xds, &env));
    assert!(
        failed.stderr.contains("/nonexistent/ca.crt: cannot read"),
        "{}",
        failed.stderr
    );
}

/// FORCE_START_WITHOUT_INITIAL_CONFIG=false (the default): no port opens until the
/// first rules are in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_nothing_is_served_before_the_first_rules() {
    let xds = XdsServer::start().await;
    let (grpc, http) = (free_addr(), free_addr());
    let cmd = xds_command_on(&xds, &[], &grpc.to_string(), &http.to_string());
    let starting = tokio::task::spawn_blocking(move || Serve::custom(cmd).try_start());

    xds.wait_subscription(NODE, 0).await;
    assert!(!starting.is_finished(), "ready before any rules");
    for addr in [grpc, http] {
        let refused = std::net::TcpStream::connect(addr);
        assert!(
            refused.is_err(),
            "{addr} accepts connections before any rules"
        );
    }
    xds.set(NODE, "1", single("late", "user", RateLimitUnit::Minute, 1));
    let server = starting
        .await
        .expect("start tollgate")
        .unwrap_or_else(|exit| panic!("{exit:?}"));
    assert_eq!(server.grpc_addr(), grpc);
    assert_eq!(
        ask(&server, "late", "user", "ann").await,
        (Code::Ok, Some(1))
    );
}

/// SIGTERM while waiting for the first rules (nothing is served yet): the process exits at
/// once, and cleanly, instead of waiting for rules that may never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_waiting_for_the_first_rules_exits() {
    let xds = XdsServer::start().await;
    let mut starting = Serve::custom(xds_command(&xds, &[]))
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    xds.wait_subscription(NODE, 0).await;
    starting.signal(Signal::Term);
    let finished = tokio::task::spawn_blocking(move || starting.wait_exit(EXIT_TIMEOUT))
        .await
        .expect("wait for the exit");
    assert!(finished.status.success(), "{finished:?}");
    assert!(
        !finished.stdout.contains("tollgate listening"),
        "nothing was served: {finished:?}"
    );
}

/// FORCE_START_WITHOUT_INITIAL_CONFIG=true: served at once, with the reference's error
/// until rules arrive; HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED keeps health checks failing
/// until rules with a domain are in force, and again when a push leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_answers_an_error_until_rules_arrive_and_health_follows_them() {
    let xds = XdsServer::start().await;
    let server = start(xds_command(
        &xds,
        &[
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ],
    ))
    .await;
    let status = server
        .client()
        .await
        .call(request("early", &[&[("user", "ann")]]))
        .await
        .expect_err("no rules yet");
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(status.message(), "no rate limit configuration loaded");
    let json = http::post_json(
        server.http_addr(),
        "/json",
        r#"{"domain":"early","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#,
    )
    .await;
    assert_eq!(
        (json.status, json.body.trim_end()),
        (500, "no rate limit configuration loaded")
    );
    assert_eq!(server.get("/healthcheck").await.status, 500);
    assert_eq!(grpc_health(&server).await, ServingStatus::NotServing);

    xds.set(NODE, "1", single("early", "user", RateLimitUnit::Minute, 1));
    xds.wait_ack(NODE, "1").await;
    assert_eq!(
        ask(&server, "early", "user", "ann").await,
        (Code::Ok, Some(1))
    );
    assert_eq!(server.get("/healthcheck").await.status, 200);
    assert_eq!(grpc_health(&server).await, ServingStatus::Serving);

    // No resources at all: zero domains, unhealthy again.
    xds.set(NODE, "2", vec![]);
    xds.wait_ack(NODE, "2").await;
    let reply = server.get("/healthcheck").await;
    assert_eq!(reply.status, 500, "{}", reply.body);
    assert_eq!(grpc_health(&server).await, ServingStatus::NotServing);
    assert_eq!(ask(&server, "early", "user", "bob").await, (Code::Ok, None));
}

/// MERGE_DOMAIN_CONFIG over xDS: resources sharing a domain merge; without it they are a
/// NACKed duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_of_one_domain_merge_only_when_asked() {
    let resources = || {
        vec![
            named(
                "part-a",
                "shared",
                vec![key("a", per(RateLimitUnit::Minute, 1))],
            ),
            named(
                "part-b",
                "shared",
                vec![key("b", per(RateLimitUnit::Minute, 2))],
            ),
        ]
    };
    let xds = XdsServer::start().await;
    xds.set(NODE, "1", resources());
    let merged = start(xds_command(&xds, &[("MERGE_DOMAIN_CONFIG", "true")])).await;
    assert_eq!(ask(&merged, "shared", "a", "x").await, (Code::Ok, Some(1)));
    assert_eq!(ask(&merged, "shared", "b", "x").await, (Code::Ok, Some(2)));
    let page = merged.get("/rlconfig").await.body;
    assert!(
        page.contains("# domain shared: resource part-a, part-b"),
        "{page}"
    );

    let strict = XdsServer::start().await;
    strict.set(NODE, "1", resources());
    let _server = start(xds_command(
        &strict,
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")],
    ))
    .await;
    let nack = strict.wait_nack(NODE, "1").await;
    assert_eq!(
        nack.error.as_deref(),
        Some("part-b: domain: duplicate domain 'shared' (also in part-a)")
    );
}

/// Envoy Gateway's ratelimit Deployment environment, as it sets it (paths and address
/// pointed at this test's certificates and server): Tollgate comes up without a warning,
/// serves what is pushed over mutual TLS (Envoy Gateway's CA setting enforced), and
/// refuses a client without a certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_environment_serves_pushed_rules() {
    let pki = Pki::new();
    // One certificate for both ends, as EG mounts one secret at /certs.
    let shared = pki.issue(
        "envoy-rate-limit",
        "IP:127.0.0.1,DNS:envoy-gateway,DNS:localhost",
    );
    let xds = XdsServer::start_tls(ServerTls {
        cert: shared.cert.clone(),
        key: shared.key.clone(),
        client_ca: pki.ca(),
    })
    .await;
    // EG: one resource per domain, named after it; the snapshot keyed by this node id.
    xds.set(
        "envoy-ratelimit",
        "1",
        vec![domain(
            "default/eg/http",
            vec![RateLimitDescriptor {
                key: "rule-0-match-0".into(),
                value: "rule-0-match-0".into(),
                rate_limit: per(RateLimitUnit::Hour, 2),
                ..Default::default()
            }],
        )],
    );
    let (cert, key_file, ca) = (
        shared.cert.display().to_string(),
        shared.key.display().to_string(),
        pki.ca().display().to_string(),
    );
    let mut cmd = tollgate::serve_from_env();
    cmd.envs(envoy_gateway::ENV);
    cmd.envs([
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_URL", &xds.addr().to_string()),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key_file),
        ("GRPC_SERVER_TLS_CA_CERT", &ca),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &cert),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &key_file),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ]);
    let server = start(cmd).await;
    xds.wait_ack("envoy-ratelimit", "1").await;
    let (d, k) = ("default/eg/http", "rule-0-match-0");
    let channel = tls::grpc_channel(server.grpc_addr(), &pki.ca(), Some(&shared))
        .await
        .expect("mutual TLS with Envoy Gateway's certificate");
    let mut client = Rls::new(channel);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(code(&client.check(d, &[(k, k)]).await));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    let anonymous = match tls::grpc_channel(server.grpc_addr(), &pki.ca(), None).await {
        Ok(channel) => Rls::new(channel)
            .call(request(d, &[&[(k, k)]]))
            .await
            .is_err(),
        Err(_) => true,
    };
    assert!(anonymous, "a client without a certificate was answered");
    assert_eq!(server.get("/healthcheck").await.status, 200);
    let stderr = server.stop().stderr;
    for quiet in [
        "not supported",
        "USE_STATSD",
        "RUNTIME_WATCH_ROOT",
        "PROMETHEUS_MAPPER_YAML",
        "REDIS_SOCKET_TYPE",
    ] {
        assert!(
            !stderr.contains(quiet),
            "{quiet} is a no-op and needs no warning: {stderr}"
        );
    }
}

/// The file source honours HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED and MERGE_DOMAIN_CONFIG
/// too, and `/rlconfig` names the files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_rules_honour_the_health_and_merge_settings() {
    let config = ConfigDir::new();
    config.write("empty/.keep", "");
    let empty = Serve::path(&config.path().join("empty"))
        .env("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")
        .start();
    assert_eq!(empty.get("/healthcheck").await.status, 500);
    let file = config.write(
        "empty/a.yaml",
        "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
    );
    wait::until_async(
        "healthy once a domain is loaded",
        DEADLINE,
        async || match empty.get("/healthcheck").await.status {
            200 => Ok(()),
            other => Err(format!("{other}")),
        },
    )
    .await;
    let page = empty.get("/rlconfig").await.body;
    assert!(
        page.contains(&format!("# domain d: file {}", file.display())),
        "{page}"
    );

    let merge = ConfigDir::new();
    merge.write(
        "a.yaml",
        "domain: m\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
    );
    merge.write(
        "b.yaml",
        "domain: m\ndescriptors:\n  - {key: b, rate_limit: {unit: hour, requests_per_unit: 2}}\n",
    );
    let refused = Serve::path(merge.path()).refused("duplicate domains");
    assert_eq!(refused.status.code(), Some(1), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("duplicate domain 'm'"),
        "{}",
        refused.stderr
    );
    let merged = Serve::path(merge.path())
        .env("MERGE_DOMAIN_CONFIG", "true")
        .start();
    assert_eq!(ask(&merged, "m", "a", "x").await, (Code::Ok, Some(1)));
    assert_eq!(ask(&merged, "m", "b", "x").await, (Code::Ok, Some(2)));
}

/// CONFIG_TYPE takes the reference's two values only; file and xDS settings do not mix.
#[test]
fn config_type_is_checked_at_startup() {
    let mut cmd = tollgate::command();
    cmd.args(["serve"]).env("CONFIG_TYPE", "GRPC_XDS_DELTA");
    let bad = run(cmd);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("invalid value 'GRPC_XDS_DELTA'")
            && bad
                .stderr
                .contains("[possible values: FILE, GRPC_XDS_SOTW]"),
        "{}",
        bad.stderr
    );
    let config = ConfigDir::with_file("r.yaml", "domain: d\n");
    let both = Serve::path(&config.file("r.yaml"))
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .refused("files with CONFIG_TYPE=GRPC_XDS_SOTW");
    assert_eq!(both.status.code(), Some(1), "{}", both.stderr);
    assert!(
        both.stderr.contains("CONFIG_TYPE=GRPC_XDS_SOTW"),
        "{}",
        both.stderr
    );
}

/// Decisions do not depend on the source: the same rules as a YAML file and as xDS
/// resources give the same answers to the same request sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_and_xds_rules_decide_alike() {
    const YAML: &str = r#"
domain: eq
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 5, name: vip}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 4, name: api, replaces: [{name: vip}]}
  - key: path
    value: /free/*
    rate_limit: {unlimited: true}
  - key: org
    descriptors:
      - key: team
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 2}
"#;
    let named_limit = |unit, n, name: &str, replaces: &[&str]| {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            name: name.into(),
            replaces: replaces
                .iter()
                .map(|r| RateLimitReplace { name: (*r).into() })
                .collect(),
            ..Default::default()
        })
    };
    let valued = |k: &str, v: &str, rate_limit| RateLimitDescriptor {
        key: k.into(),
        value: v.into(),
        rate_limit,
        ..Default::default()
    };
    let resources = vec![domain(
        "eq",
        vec![
            key("user", per(RateLimitUnit::Minute, 3)),
            valued(
                "user",
                "vip",
                named_limit(RateLimitUnit::Minute, 5, "vip", &[]),
            ),
            valued(
                "path",
                "/api/*",
                named_limit(RateLimitUnit::Hour, 4, "api", &["vip"]),
            ),
            valued(
                "path",
                "/free/*",
                Some(RateLimitPolicy {
                    unlimited: true,
                    ..Default::default()
                }),
            ),
            RateLimitDescriptor {
                key: "org".into(),
                descriptors: vec![RateLimitDescriptor {
                    key: "team".into(),
                    shadow_mode: true,
                    rate_limit: per(RateLimitUnit::Second, 2),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
    )];
    let xds = XdsServer::start().await;
    xds.set(NODE, "1", resources);
    let from_xds = start(xds_command(&xds, &[])).await;
    let from_yaml = Serve::rules(YAML).start();
    let (mut a, mut b) = (from_yaml.client().await, from_xds.client().await);

    // (descriptors, each a list of entries; the request's hits_addend)
    type Step<'a> = (Vec<&'a [(&'a str, &'a str)]>, u32);
    let sequence: Vec<Step> = vec![
        (vec![&[("user", "ann")]], 0),
        (vec![&[("user", "ann")]], 2),
        (vec![&[("user", "ann")]], 0),
        (vec![&[("user", "vip")], &[("path", "/api/x")]], 0),
        (vec![&[("user", "vip")]], 3),
        (vec![&[("user", "vip")]], 0),
        (vec![&[("path", "/api/y")]], 3),
        (vec![&[("path", "/free/z")], &[("user", "bob")]], 0),
        (vec![&[("org", "o"), ("team", "t")]], 0),
        (vec![&[("org", "o"), ("team", "t")]], 2),
        (vec![&[("org", "o")]], 0),
        (vec![&[("nobody", "x")]], 0),
    ];
    for (i, (descriptors, hits)) in sequence.into_iter().enumerate() {
        let mut req = request("eq", &descriptors);
        req.hits_addend = hits;
        let (yaml, via_xds) = (a.ok(req.clone()).await, b.ok(req).await);
        assert_eq!(yaml.overall_code, via_xds.overall_code, "request {i}");
        for (s, t) in yaml.statuses.iter().zip(&via_xds.statuses) {
            assert_eq!(
                (s.code, &s.current_limit, s.limit_remaining),
                (t.code, &t.current_limit, t.limit_remaining),
                "request {i}: {yaml:?} vs {via_xds:?}"
            );
            let reset = |st: &DescriptorStatus| st.duration_until_reset.map(|d| d.seconds);
            let (r, q) = (reset(s), reset(t));
            assert!(
                r == q || r.zip(q).is_some_and(|(r, q)| r.abs_diff(q) <= 1),
                "request {i}: resets {r:?} vs {q:?}"
            );
        }
    }
}

/// XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES bounds what a response may weigh: a larger one breaks
/// the stream (and is retried) while the rules in force stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_above_the_message_size_limit_are_refused() {
    let xds = XdsServer::start().await;
    xds.set(NODE, "1", single("small", "user", RateLimitUnit::Minute, 1));
    let server = start(xds_command(
        &xds,
        &[("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "400")],
    ))
    .await;
    xds.wait_ack(NODE, "1").await;
    let many = (0..50)
        .map(|i| key(&format!("key-{i}"), per(RateLimitUnit::Hour, i)))
        .collect();
    xds.set(NODE, "2", vec![domain("large", many)]);
    // The oversized response breaks the stream.
    await_metric(&server, "tollgate_xds_reconnects_total", |v| {
        v.is_some_and(|n| n >= 1.0)
    })
    .await;
    assert_eq!(
        ask(&server, "small", "user", "ann").await,
        (Code::Ok, Some(1))
    );
    assert!(
        xds.requests().iter().all(|r| r.version_info != "2"),
        "version 2 was never taken"
    );
    let stderr = server.stop().stderr;
    assert!(stderr.contains("message length too large"), "{stderr}");
}
