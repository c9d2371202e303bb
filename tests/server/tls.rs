//! gRPC over TLS and mutual TLS (client CA, DNS and URI names), certificates rotated while
//! serving, the HTTP port over TLS, the TLS settings' startup errors, and connections
//! aged out without failing calls.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_testkit::admin::TOKEN;
use tollgate_testkit::grpc::{Code, Rls, overall, request};
use tollgate_testkit::http;
use tollgate_testkit::pki::{Issued, Pki};
use tollgate_testkit::process;
use tollgate_testkit::raw_grpc::{RawGrpc, SHOULD_RATE_LIMIT, frame};
use tollgate_testkit::tls::{self, certificate_der, grpc_channel, https_get};
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, ConfigDir, Serve, Server};
use tollgate_testkit::wait;
use tonic::transport::Endpoint;

const RULES: &str =
    "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1000000}}\n";
const DEADLINE: Duration = Duration::from_secs(30);
/// The server certificate's names: what clients connect to.
const SERVER_NAMES: &str = "DNS:localhost,IP:127.0.0.1";

/// Tollgate serving gRPC over TLS with `server`'s certificate.
fn serve_tls(server: &Issued) -> Serve {
    Serve::rules(RULES)
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", &server.cert)
        .env("GRPC_SERVER_TLS_KEY", &server.key)
}

async fn start(serve: Serve) -> Server {
    tokio::task::spawn_blocking(move || serve.start())
        .await
        .expect("start tollgate")
}

/// One call on a new TLS channel trusting `ca`, presenting `client`; the failure as a
/// message.
async fn call_tls(server: &Server, ca: &Path, client: Option<&Issued>) -> Result<Code, String> {
    let channel = grpc_channel(server.grpc_addr(), ca, client).await?;
    call(&mut Rls::new(channel)).await
}

async fn call(rls: &mut Rls) -> Result<Code, String> {
    rls.call(request("d", &[&[("k", "v")]]))
        .await
        .map(|resp| overall(&resp))
        .map_err(|status| format!("{status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_served_over_tls_and_refused_in_plaintext() {
    let pki = Pki::new();
    let server = start(serve_tls(&pki.issue("server", SERVER_NAMES))).await;
    assert_eq!(call_tls(&server, &pki.ca(), None).await, Ok(Code::Ok));

    let plaintext = async {
        let channel = Endpoint::from_shared(format!("http://{}", server.grpc_addr()))
            .map_err(|e| e.to_string())?
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        call(&mut Rls::new(channel)).await
    };
    assert!(plaintext.await.is_err(), "plaintext gRPC on a TLS port");
    let stranger = Pki::new();
    let untrusted = call_tls(&server, &stranger.ca(), None).await;
    assert!(
        untrusted.is_err(),
        "a certificate of another CA: {untrusted:?}"
    );
}

/// Envoy Gateway's CA setting turns mutual TLS on; the names allowed are a DNS name and a
/// SPIFFE ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_the_ca_s_certificates_with_an_allowed_name() {
    let pki = Pki::new();
    let spiffe = "spiffe://cluster.local/ns/gateway/sa/envoy";
    let server = start(
        serve_tls(&pki.issue("server", SERVER_NAMES))
            .env("GRPC_SERVER_TLS_CA_CERT", pki.ca())
            .env("GRPC_CLIENT_TLS_SAN", format!("envoy.internal, {spiffe}")),
    )
    .await;
    let ca = pki.ca();
    let by_dns = pki.issue("by-dns", "DNS:envoy.internal");
    let by_uri = pki.issue("by-uri", &format!("URI:{spiffe}"));
    let wrong_name = pki.issue("wrong-name", "DNS:other.internal,URI:spiffe://x/y");
    let stranger = Pki::new();
    let foreign = stranger.issue("foreign", "DNS:envoy.internal");

    assert_eq!(call_tls(&server, &ca, Some(&by_dns)).await, Ok(Code::Ok));
    assert_eq!(call_tls(&server, &ca, Some(&by_uri)).await, Ok(Code::Ok));
    for (what, client) in [
        ("no certificate", None),
        ("a name not allowed", Some(&wrong_name)),
        ("another CA's certificate", Some(&foreign)),
    ] {
        let refused = call_tls(&server, &ca, client).await;
        assert!(refused.is_err(), "{what}: {refused:?}");
    }
    assert_eq!(
        call_tls(&server, &ca, Some(&by_dns)).await,
        Ok(Code::Ok),
        "refusals leave the server serving"
    );
}

/// Writes `contents` to `path` the way Kubernetes and careful tools do: a new file renamed
/// over the old one.
fn replace(path: &Path, contents: &[u8]) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, contents).expect("write the new file");
    std::fs::rename(&staged, path).expect("rename it into place");
}

fn copy_pair(from: &Issued, dir: &ConfigDir) -> Issued {
    let pair = Issued {
        cert: dir.file("tls.crt"),
        key: dir.file("tls.key"),
    };
    replace(&pair.cert, &std::fs::read(&from.cert).expect("read cert"));
    replace(&pair.key, &std::fs::read(&from.key).expect("read key"));
    pair
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_serves_new_handshakes_while_calls_continue() {
    let (old_ca, new_ca) = (Pki::new(), Pki::new());
    let (old, new) = (
        old_ca.issue("old", SERVER_NAMES),
        new_ca.issue("new", SERVER_NAMES),
    );
    let mounted = ConfigDir::new();
    let files = copy_pair(&old, &mounted);
    let server = start(serve_tls(&files)).await;

    // Calls on one connection all through the rotation.
    let channel = grpc_channel(server.grpc_addr(), &old_ca.ca(), None)
        .await
        .expect("connect");
    let (stop, answered, failed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let traffic = tokio::spawn({
        let (stop, answered, failed) = (stop.clone(), answered.clone(), failed.clone());
        let mut rls = Rls::new(channel);
        async move {
            while !stop.load(Ordering::Relaxed) {
                match call(&mut rls).await {
                    Ok(Code::Ok) => answered.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }
    });

    // A broken certificate is refused; the old one keeps serving new handshakes.
    replace(&files.cert, b"-----BEGIN CERTIFICATE-----\nbroken\n");
    wait::until_async(
        "the broken certificate rejected",
        DEADLINE,
        async || match server.stderr().text().contains("TLS files rejected") {
            true => Ok(()),
            false => Err(server.stderr().tail(5)),
        },
    )
    .await;
    let presented = tls::server_certificate(server.grpc_addr(), &old_ca.ca()).await;
    assert_eq!(presented, Ok(certificate_der(&old.cert)));

    // The new pair: the next handshakes present it.
    copy_pair(&new, &mounted);
    let want = certificate_der(&new.cert);
    wait::until_async("the new certificate presented", DEADLINE, async || {
        match tls::server_certificate(server.grpc_addr(), &new_ca.ca()).await {
            Ok(der) if der == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(call_tls(&server, &new_ca.ca(), None).await, Ok(Code::Ok));
    assert!(
        call_tls(&server, &old_ca.ca(), None).await.is_err(),
        "the old CA no longer vouches for the server"
    );

    stop.store(true, Ordering::Relaxed);
    traffic.await.expect("traffic task");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "calls failed");
    assert!(answered.load(Ordering::Relaxed) > 0, "no calls made");
}

/// A refused handshake is what a TLS mistake looks like from the server (and Envoy's
/// `failure_mode_deny: false` lets requests through unlimited meanwhile): it is logged at
/// the default level, at most one line per period however many clients are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_handshakes_are_warned_about_at_the_default_level_rate_limited() {
    const REFUSED: usize = 20;
    /// The server's period between two lines of the same kind.
    const PERIOD: Duration = Duration::from_secs(10);
    let pki = Pki::new();
    let started = std::time::Instant::now();
    let server = start(
        serve_tls(&pki.issue("server", SERVER_NAMES)).env("GRPC_CLIENT_TLS_CACERT", pki.ca()),
    )
    .await;
    for _ in 0..REFUSED {
        let refused = call_tls(&server, &pki.ca(), None).await;
        assert!(refused.is_err(), "no client certificate: {refused:?}");
    }
    let is_warning = |line: &str| line.contains("WARN") && line.contains("TLS handshake refused");
    let line = server
        .stderr()
        .wait_for(is_warning, DEADLINE)
        .unwrap_or_else(|e| panic!("{e:?}: {}", server.stderr().tail(10)));
    assert!(line.contains("gRPC port"), "{line}");
    assert!(line.contains("certificate"), "says why: {line}");
    let lines = server.stderr().all();
    let warnings = lines.iter().filter(|l| is_warning(l)).count();
    let periods = started.elapsed().as_secs() / PERIOD.as_secs() + 1;
    assert!(
        warnings as u64 <= periods,
        "{warnings} lines for {REFUSED} refusals in {periods} periods: {lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_serves_tls_on_request_without_asking_for_client_certificates() {
    let pki = Pki::new();
    let server = start(
        serve_tls(&pki.issue("server", SERVER_NAMES))
            .env("GRPC_CLIENT_TLS_CACERT", pki.ca())
            .env("HTTP_SERVER_USE_TLS", "true"),
    )
    .await;
    let health = https_get(server.http_addr(), &pki.ca(), "/healthcheck").await;
    assert_eq!(health.map(|r| r.status), Ok(200));
    let plaintext = http::send(
        server.http_addr(),
        http::Method::GET,
        "/healthcheck",
        &[],
        "",
    )
    .await;
    assert!(
        plaintext.is_err(),
        "plaintext HTTP on a TLS port: {plaintext:?}"
    );
}

/// `--tls` took an optional value, so `tollgate override --tls list` read `list` as that
/// value and failed. It is a switch before a subcommand; `--tls=true` still parses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_commands_take_tls_as_a_switch_before_their_subcommand() {
    let pki = Pki::new();
    let server = start(
        serve_tls(&pki.issue("server", SERVER_NAMES))
            .env("HTTP_SERVER_USE_TLS", "true")
            .env("ADMIN_TOKEN", TOKEN),
    )
    .await;
    for tls in ["--tls", "--tls=true"] {
        let mut cmd = tollgate::command();
        cmd.args(["override", "--http-addr", &server.http_addr().to_string()])
            .args([tls, "list"])
            .env("ADMIN_TOKEN", TOKEN)
            .env("TOLLGATE_TLS_CA", pki.ca());
        let out = process::run("tollgate override --tls list", cmd, COMMAND_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "{tls}: {out:?}");
        assert!(out.stdout.starts_with("0 override(s)"), "{tls}: {out:?}");
    }
}

#[test]
fn tls_settings_that_cannot_work_stop_startup_with_the_reason() {
    let pki = Pki::new();
    let (one, other) = (
        pki.issue("one", SERVER_NAMES),
        pki.issue("other", SERVER_NAMES),
    );
    let mismatched = Issued {
        cert: one.cert.clone(),
        key: other.key.clone(),
    };
    let missing = Issued {
        cert: pki.dir().join("missing.crt"),
        key: one.key.clone(),
    };
    let cases: Vec<(&str, Serve, String)> = vec![
        (
            "key of another certificate",
            serve_tls(&mismatched),
            format!(
                "{} and {}: the key does not belong to the certificate",
                one.cert.display(),
                other.key.display()
            ),
        ),
        (
            "missing certificate",
            serve_tls(&missing),
            format!("{}: cannot read", missing.cert.display()),
        ),
        (
            "a name to check without a CA",
            serve_tls(&one).env("GRPC_CLIENT_TLS_SAN", "envoy.internal"),
            "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT".into(),
        ),
        (
            "a client CA over plaintext",
            Serve::rules(RULES).env("GRPC_CLIENT_TLS_CACERT", pki.ca()),
            "needs GRPC_SERVER_USE_TLS=true".into(),
        ),
        (
            "TLS without a key",
            Serve::rules(RULES)
                .env("GRPC_SERVER_USE_TLS", "true")
                .env("GRPC_SERVER_TLS_CERT", &one.cert),
            "GRPC_SERVER_USE_TLS=true needs both GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
                .into(),
        ),
        (
            "two different client CAs",
            serve_tls(&one)
                .env("GRPC_CLIENT_TLS_CACERT", pki.ca())
                .env("GRPC_SERVER_TLS_CA_CERT", &one.cert),
            "name different client CAs".into(),
        ),
    ];
    for (what, serve, reason) in cases {
        let refused = serve.refused(what);
        assert_eq!(refused.status.code(), Some(1), "{what}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(&reason),
            "{what}: want {reason:?} in\n{}",
            refused.stderr
        );
    }
}

/// An aged connection is asked to go away and closed once its calls are done, long before
/// its grace runs out. (That no
/// call fails across the reconnect needs a client that handles GOAWAY as HTTP/2 asks, as
/// Envoy does: tests/envoy/tls.rs. tonic's channel can lose a call sent in the instant
/// the connection closes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_closed_after_their_age() {
    let server = start(
        Serve::rules(RULES)
            .env("GRPC_MAX_CONNECTION_AGE", "1s")
            .env("GRPC_MAX_CONNECTION_AGE_GRACE", "20s"),
    )
    .await;
    let mut raw = RawGrpc::connect(server.grpc_addr()).await;
    let message = prost::Message::encode_to_vec(&request("d", &[&[("k", "v")]]));
    let ended = raw.call(SHOULD_RATE_LIMIT, frame(&message), true).await;
    assert_eq!(ended.status, 0, "{ended:?}");
    assert!(
        raw.closed_within(Duration::from_secs(10)).await,
        "the connection outlived its age and grace"
    );
    let mut fresh = server.client().await;
    assert_eq!(
        call(&mut fresh).await,
        Ok(Code::Ok),
        "a new connection serves"
    );
}
