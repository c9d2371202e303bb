//! Redis over TLS: a redis-server with a certificate from a test CA made with the
//! `openssl` command, trusted by Tollgate through `SSL_CERT_FILE` (rustls' native roots)
//! or `REDIS_TLS_CACERT`; client certificates for `tls-auth-clients yes`; hostname checks
//! skipped while the chain is still checked; a Cluster and a sentinel set over TLS; the
//! settings' startup errors.

use tollgate_testkit::grpc::{Code, code, request};
use tollgate_testkit::keys::{Shape, redis_key};
use tollgate_testkit::load::timed_check;
use tollgate_testkit::pki::{Issued, Pki};
use tollgate_testkit::redis::cluster::RedisCluster;
use tollgate_testkit::redis::sentinel::SentinelSet;
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

/// `serve(url)` trusting `ca` through the setting, presenting `client` if given.
fn serve_trusting(url: &str, ca: &std::path::Path, client: Option<&Issued>) -> Serve {
    let serve = serve(url).env("REDIS_TLS_CACERT", ca);
    match client {
        Some(issued) => serve
            .env("REDIS_TLS_CLIENT_CERT", &issued.cert)
            .env("REDIS_TLS_CLIENT_KEY", &issued.key),
        None => serve,
    }
}

async fn assert_limits(server: &tollgate_testkit::tollgate::Server, user: &str) {
    assert_limits_with(&mut server.client().await, user).await;
}

/// Two requests of `user` admitted and the third denied.
async fn assert_limits_with(rls: &mut tollgate_testkit::grpc::Rls, user: &str) {
    let codes = [
        code(&rls.check("tls", &[("user", user)]).await),
        code(&rls.check("tls", &[("user", user)]).await),
        code(&rls.check("tls", &[("user", user)]).await),
    ];
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
}

#[tokio::test]
async fn a_redis_that_authenticates_clients_takes_the_client_certificate() {
    let pki = Pki::new();
    let redis = TlsRedis::start_with(&pki, "IP:127.0.0.1", true);
    let url = format!("rediss://{}", redis.host_port());
    let client = pki.issue("tollgate", "DNS:tollgate");

    let with_certificate = serve_trusting(&url, &pki.ca(), Some(&client))
        .start_connected()
        .await;
    assert_limits(&with_certificate, "ann").await;

    let without = serve_trusting(&url, &pki.ca(), None).start_without_store();
    assert_eq!(
        without.store_health().await,
        503,
        "no certificate, no Redis"
    );
}

#[tokio::test]
async fn hostname_checks_can_be_skipped_but_the_chain_is_still_checked() {
    let pki = Pki::new();
    // The certificate names a host the test does not connect to.
    let redis = TlsRedis::start_with(&pki, "DNS:redis.internal", false);
    let url = format!("rediss://{}", redis.host_port());

    let checked = serve_trusting(&url, &pki.ca(), None).start_without_store();
    assert_eq!(
        checked.store_health().await,
        503,
        "127.0.0.1 is not redis.internal"
    );

    let skipped = serve_trusting(&url, &pki.ca(), None)
        .env("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")
        .start_connected()
        .await;
    assert_limits(&skipped, "bob").await;

    let stranger = Pki::new();
    let untrusted = serve_trusting(&url, &stranger.ca(), None)
        .env("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")
        .start_without_store();
    assert_eq!(untrusted.store_health().await, 503, "another CA's chain");
}

#[test]
fn redis_tls_settings_that_cannot_apply_stop_startup() {
    let pki = Pki::new();
    let client = pki.issue("tollgate", "DNS:tollgate");
    let cases = [
        (
            serve("rediss://127.0.0.1:1").env("REDIS_TLS_CLIENT_CERT", &client.cert),
            "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together",
        ),
        (
            serve("redis://127.0.0.1:1").env("REDIS_TLS_CACERT", pki.ca()),
            "set REDIS_TLS=true or use rediss:// addresses",
        ),
        (
            serve("rediss://127.0.0.1:1").env("REDIS_TLS_CACERT", pki.dir().join("none.crt")),
            "none.crt: cannot read",
        ),
        (
            serve("master,127.0.0.1:1")
                .args(["--redis-type", "sentinel", "--redis-tls"])
                .env("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            "not available with REDIS_TYPE=sentinel",
        ),
    ];
    for (serve, reason) in cases {
        let refused = serve.refused(&format!("want {reason:?}"));
        assert_eq!(refused.status.code(), Some(1), "{}", refused.stderr);
        assert!(
            refused.stderr.contains(reason),
            "want {reason:?} in\n{}",
            refused.stderr
        );
    }
}

/// A Redis Cluster over TLS that authenticates clients: Tollgate reaches every master on
/// its TLS port (Redis names those ports to TLS clients), presenting its certificate;
/// without one, there is no store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_takes_the_ca_and_the_client_certificate() {
    let pki = Pki::new();
    let cluster = tokio::task::block_in_place(|| RedisCluster::start_tls(&pki, true));
    let client = pki.issue("tollgate", "DNS:tollgate");
    let url = cluster.tls_url();
    let cluster_tls = |serve: Serve| serve.args(["--redis-type", "cluster", "--redis-tls"]);

    let server = cluster_tls(serve_trusting(&url, &pki.ca(), Some(&client)))
        .start_connected()
        .await;
    // Counters on every master: users until each node holds one.
    let mut rls = server.client().await;
    let mut nodes_used = std::collections::BTreeSet::new();
    for i in 0..40 {
        let user = format!("user-{i}");
        let hour = Shape::sliding(std::time::Duration::from_secs(3_600));
        let key = redis_key("", "tls", &[("user", &user)], &[hour]);
        assert_limits_with(&mut rls, &user).await;
        assert!(cluster.exists(&key), "{key} in the cluster");
        nodes_used.insert(cluster.node_of(&key));
        if nodes_used.len() == 3 {
            break;
        }
    }
    assert_eq!(nodes_used.len(), 3, "counters on every master");

    let without = cluster_tls(serve_trusting(&url, &pki.ca(), None)).start_without_store();
    assert_eq!(
        without.store_health().await,
        503,
        "no certificate, no cluster"
    );
}

/// A sentinel set over TLS that authenticates clients: Tollgate asks the sentinel over
/// TLS, reaches the master it names (its TLS port) over TLS with the same CA and client
/// certificate, and follows a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_set_over_tls_takes_the_ca_and_the_client_certificate() {
    let pki = Pki::new();
    let mut set = tokio::task::block_in_place(|| SentinelSet::start_tls(&pki, true));
    let client = pki.issue("tollgate", "DNS:tollgate");
    let url = set.tls_url();
    let sentinel_tls = |serve: Serve| serve.args(["--redis-type", "sentinel", "--redis-tls"]);

    let server = sentinel_tls(serve_trusting(&url, &pki.ca(), Some(&client)))
        .start_connected()
        .await;
    assert_limits(&server, "before").await;
    let hour = Shape::sliding(std::time::Duration::from_secs(3_600));
    let key = redis_key("", "tls", &[("user", "before")], &[hour]);
    assert!(set.master.exists(&key), "{key} on the master");

    tokio::task::block_in_place(|| set.kill_master_and_await_failover());
    let mut rls = server.client().await;
    tollgate_testkit::wait::until_async(
        "limiting on the promoted replica",
        std::time::Duration::from_secs(60),
        async || {
            // Unavailable while the store reconnects (`--on-store-error error`).
            let answer = timed_check(&mut rls, "tls", &[("user", "after")]).await;
            let key = redis_key("", "tls", &[("user", "after")], &[hour]);
            match answer.result == Ok(Code::Ok) && set.replica.exists(&key) {
                true => Ok(()),
                false => Err(format!("{answer:?}, not counted on the new master yet")),
            }
        },
    )
    .await;

    let without = sentinel_tls(serve_trusting(&url, &pki.ca(), None)).start_without_store();
    assert_eq!(
        without.store_health().await,
        503,
        "no certificate, no sentinel"
    );
}
