//! Envoy asking Tollgate over mutual TLS (examples/envoy/tls/envoy.yaml): limits are
//! enforced through it, a client certificate Tollgate does not accept gets no answers,
//! and with connections aged out every second and the server certificate rotated in the
//! middle of traffic, no request fails.

use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_testkit::envoy::{Envoy, Params, Upstream, render_with};
use tollgate_testkit::http;
use tollgate_testkit::pki::{Issued, Pki};
use tollgate_testkit::tls;
use tollgate_testkit::tollgate::{ConfigDir, Serve, Server};
use tollgate_testkit::wait;

use crate::support::{KEY_LIMIT, cluster_stat, tollgate, within_one_minute};

/// The TLS variant of the example Envoy configuration.
const TLS_ENVOY_YAML: &str = include_str!("../../examples/envoy/tls/envoy.yaml");
/// The SPIFFE ID Tollgate accepts from Envoy.
const ENVOY_ID: &str = "spiffe://example.org/envoy";
const DEADLINE: Duration = Duration::from_secs(30);

/// The example's Tollgate with mutual TLS: `server`'s certificate, clients of `pki`'s CA
/// naming [`ENVOY_ID`].
fn tollgate_tls(pki: &Pki, server: &Issued) -> Serve {
    tollgate()
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", &server.cert)
        .env("GRPC_SERVER_TLS_KEY", &server.key)
        .env("GRPC_CLIENT_TLS_CACERT", pki.ca())
        .env("GRPC_CLIENT_TLS_SAN", ENVOY_ID)
}

/// Envoy on the TLS example, presenting `client`, trusting `pki`'s CA; failures to reach
/// Tollgate answer 500 (`failure_mode_deny`), so that they cannot pass for admissions.
async fn envoy_tls(upstream: &Upstream, tollgate: &Server, pki: &Pki, client: &Issued) -> Envoy {
    let params = Params {
        upstream: upstream.addr,
        ratelimit: tollgate.grpc_addr(),
        failure_mode_deny: true,
    };
    let file = |path: &Path| format!("{{ filename: {} }}", path.display());
    let yaml = render_with(
        TLS_ENVOY_YAML,
        &params,
        vec![
            (
                "{ filename: /etc/envoy/certs/envoy.crt }",
                file(&client.cert),
            ),
            (
                "{ filename: /etc/envoy/certs/envoy.key }",
                file(&client.key),
            ),
            ("{ filename: /etc/envoy/certs/ca.crt }", file(&pki.ca())),
        ],
    );
    Envoy::start(&yaml).await
}

/// The server certificate names `tollgate`, as Envoy's `match_typed_subject_alt_names`
/// wants, and localhost for the tests' own handshakes.
const SERVER_NAMES: &str = "DNS:tollgate,DNS:localhost,IP:127.0.0.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_is_limited_through_mutual_tls() {
    let pki = Pki::new();
    let tollgate = tollgate_tls(&pki, &pki.issue("tollgate", SERVER_NAMES)).start();
    let upstream = Upstream::start().await;
    let envoy = envoy_tls(
        &upstream,
        &tollgate,
        &pki,
        &pki.issue("envoy", &format!("URI:{ENVOY_ID}")),
    )
    .await;
    let statuses = within_one_minute(async |n| {
        let key = format!("tls-{n}");
        let mut statuses = Vec::new();
        for _ in 0..KEY_LIMIT + 2 {
            statuses.push(envoy.get("/orders", &[("x-api-key", &key)]).await.status);
        }
        statuses
    })
    .await;
    let mut want = vec![200; KEY_LIMIT];
    want.extend([429, 429]);
    assert_eq!(statuses, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_whose_certificate_names_another_client_gets_no_answers() {
    let pki = Pki::new();
    let tollgate = tollgate_tls(&pki, &pki.issue("tollgate", SERVER_NAMES)).start();
    let upstream = Upstream::start().await;
    let impostor = pki.issue("impostor", "URI:spiffe://example.org/not-envoy");
    let envoy = envoy_tls(&upstream, &tollgate, &pki, &impostor).await;
    let resp = envoy.get("/orders", &[("x-api-key", "impostor")]).await;
    assert_eq!(
        resp.status, 500,
        "failure_mode_deny: Tollgate refused the handshake: {resp:?}"
    );
    assert_eq!(upstream.hits(), 0);
}

/// Connections live a second (and a second of grace); the server certificate is replaced
/// during the traffic. Every request is answered by the limiter (the `/static/` paths are
/// unlimited, so 200), Envoy opened several connections, and new handshakes present the
/// new certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aged_connections_and_a_rotated_certificate_fail_no_request() {
    let pki = Pki::new();
    let (first, second) = (
        pki.issue("first", SERVER_NAMES),
        pki.issue("second", SERVER_NAMES),
    );
    let mounted = ConfigDir::new();
    let files = Issued {
        cert: mounted.file("tls.crt"),
        key: mounted.file("tls.key"),
    };
    let install = |from: &Issued| {
        for (src, dst) in [(&from.cert, &files.cert), (&from.key, &files.key)] {
            let staged = dst.with_extension("staged");
            std::fs::copy(src, &staged).expect("stage");
            std::fs::rename(&staged, dst).expect("rename into place");
        }
    };
    install(&first);
    let tollgate = tollgate_tls(&pki, &files)
        .env("GRPC_MAX_CONNECTION_AGE", "1s")
        .env("GRPC_MAX_CONNECTION_AGE_GRACE", "1s")
        .start();
    let upstream = Upstream::start().await;
    let client = pki.issue("envoy", &format!("URI:{ENVOY_ID}"));
    let envoy = envoy_tls(&upstream, &tollgate, &pki, &client).await;

    // 50 requests a second: under the example's 100 per second per client address.
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    let mut statuses = std::collections::BTreeMap::new();
    let started = Instant::now();
    let mut rotated = false;
    while started.elapsed() < Duration::from_secs(5) {
        pace.tick().await;
        if !rotated && started.elapsed() > Duration::from_millis(2_500) {
            install(&second);
            rotated = true;
        }
        let status = envoy.get("/static/logo.png", &[]).await.status;
        let at = started.elapsed().as_millis();
        statuses.entry(status).or_insert_with(Vec::new).push(at);
    }
    let stats = http::get(envoy.admin, "/stats?filter=cluster.ratelimit").await;
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        [200],
        "{statuses:?}\n{}",
        stats.body
    );

    let want = tls::certificate_der(&second.cert);
    wait::until_async("the rotated certificate presented", DEADLINE, async || {
        match tls::server_certificate(tollgate.grpc_addr(), &pki.ca()).await {
            Ok(der) if der == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let connections = cluster_stat(&envoy, "ratelimit", "upstream_cx_total").await;
    assert!(
        connections >= 3,
        "Envoy reconnected as connections aged: {connections} connections"
    );
}
