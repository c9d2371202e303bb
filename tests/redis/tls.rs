//! Redis over TLS: a redis-server with a certificate from a test CA made with the
//! `openssl` command, trusted by Tollgate through `SSL_CERT_FILE` (rustls' native roots).

use tollgate_testkit::grpc::{Code, code, request};
use tollgate_testkit::pki::Pki;
use tollgate_testkit::redis::tls::TlsRedis;
use tollgate_testkit::tollgate::Serve;

const RULES: &str =
    "domain: tls\ndescriptors:\n  - {key: user, rate_limit: {unit: hour, requests_per_unit: 2}}\n";

/// Tollgate on the TLS Redis at `url`, failing requests when the store fails, with a
/// store timeout long enough for a loaded machine.
fn serve(url: &str) -> Serve {
    Serve::rules(RULES)
        .args(["--redis-url", url, "--on-store-error", "error"])
        .args(["--store-timeout", "1s"])
}

#[tokio::test]
async fn limits_over_tls_with_either_url_form() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki);

    let by_flag = serve(&redis.host_port())
        .args(["--redis-tls"])
        .env("SSL_CERT_FILE", pki.ca())
        .start_connected()
        .await;
    let by_scheme = serve(&format!("rediss://{}", redis.host_port()))
        .env("SSL_CERT_FILE", pki.ca())
        .start_connected()
        .await;

    // One shared counter through both: 2 admitted, then denied.
    let mut a = by_flag.client().await;
    let mut b = by_scheme.client().await;
    assert_eq!(code(&a.check("tls", &[("user", "ann")]).await), Code::Ok);
    assert_eq!(code(&b.check("tls", &[("user", "ann")]).await), Code::Ok);
    assert_eq!(
        code(&a.check("tls", &[("user", "ann")]).await),
        Code::OverLimit
    );
    assert_eq!(
        code(&b.check("tls", &[("user", "ann")]).await),
        Code::OverLimit
    );
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki);
    let server = serve(&format!("rediss://{}", redis.host_port())).start_without_store();
    // The store never comes up, and with --on-store-error error requests say so.
    assert_eq!(server.store_health().await, 503);
    let mut rls = server.client().await;
    let err = rls
        .call(request("tls", &[&[("user", "ann")]]))
        .await
        .expect_err("no store, no answer");
    assert_eq!(err.code(), tonic::Code::Unavailable);
}
