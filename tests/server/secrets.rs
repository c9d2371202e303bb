//! No secret is ever printed: not by the help (which shows the environment's values), not
//! in the refusal of a bad setting, not in the logs of a store that cannot be reached.

use std::process::Command;

use tollgate_testkit::free_port;
use tollgate_testkit::process::{self, Finished};
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, Serve};

const PASSWORD: &str = "hunter2-s3cret";

const RULES: &str =
    "domain: sec\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

fn run(cmd: Command) -> Finished {
    process::run("tollgate", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

fn assert_no_password(finished: &Finished) {
    for (stream, text) in [("stdout", &finished.stdout), ("stderr", &finished.stderr)] {
        assert!(
            !text.contains(PASSWORD),
            "the password on {stream}:\n{text}"
        );
    }
}

#[test]
fn help_shows_no_secret_of_the_environment() {
    let mut cmd = tollgate::command();
    cmd.args(["serve", "--help"])
        .env("REDIS_URL", format!("redis://:{PASSWORD}@127.0.0.1:6379"))
        .env("REDIS_AUTH", PASSWORD)
        .env("POSTGRES_URL", format!("postgres://u:{PASSWORD}@db/x"))
        .env("ADMIN_TOKEN", PASSWORD)
        .env(
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            format!("authorization:{PASSWORD}"),
        )
        .env(
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("https://u:{PASSWORD}@x:1"),
        );
    let help = run(cmd);
    assert!(help.status.success(), "{help:?}");
    assert!(help.stdout.contains("[env: REDIS_URL]"), "{}", help.stdout);
    assert_no_password(&help);
}

#[test]
fn an_unparsable_redis_url_is_refused_without_its_password() {
    let refused = Serve::rules(RULES)
        .env(
            "REDIS_URL",
            format!("redis://:{PASSWORD}@127.0.0.1:notaport"),
        )
        .refused("an unparsable REDIS_URL");
    assert!(
        refused
            .stderr
            .contains("invalid Redis address 'redis://:***@127.0.0.1:notaport'"),
        "{refused:?}"
    );
    assert_no_password(&refused);
}

#[test]
fn the_sentinel_password_refusal_does_not_repeat_it() {
    let refused = Serve::rules(RULES)
        .env("REDIS_SENTINEL_AUTH", PASSWORD)
        .refused("REDIS_SENTINEL_AUTH");
    assert!(
        refused
            .stderr
            .contains("REDIS_SENTINEL_AUTH=*** is not supported"),
        "{refused:?}"
    );
    assert_no_password(&refused);
}

/// An xDS header that is not `key:value` (a bare token) is refused without quoting it.
#[test]
fn a_malformed_xds_header_is_refused_without_quoting_it() {
    let mut cmd = tollgate::serve_from_env();
    cmd.env("CONFIG_TYPE", "GRPC_XDS_SOTW").env(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        format!("x-tenant:blue,Bearer {PASSWORD}"),
    );
    let refused = Serve::custom(cmd).refused("a malformed xDS header");
    assert!(
        refused.stderr.contains("entries not like key:value: 1"),
        "{refused:?}"
    );
    assert_no_password(&refused);
}

/// A Redis that does not answer: the logs name its address, and never its password.
#[test]
fn an_unreachable_store_is_named_by_its_address_without_the_password() {
    let port = free_port();
    let server = Serve::rules(RULES)
        .redis("single", &format!("redis://:{PASSWORD}@127.0.0.1:{port}"))
        .start_without_store();
    let address = format!("redis 127.0.0.1:{port} (single)");
    // Stopped, so that every line it wrote has been read.
    let finished = server.stop();
    for line in [" down: ", "not reachable after", "serving: store redis"] {
        assert!(
            finished
                .stderr
                .lines()
                .any(|l| l.contains(line) && l.contains(&address)),
            "no line with {line:?} naming {address}:\n{}",
            finished.stderr
        );
    }
    assert_no_password(&finished);
}

/// A request the unreachable store cannot answer (`--on-store-error error`) is told which
/// store failed, by its address, without its password.
#[tokio::test]
async fn a_store_error_answer_names_the_store_without_the_password() {
    let port = free_port();
    let server = Serve::rules(RULES)
        .redis("single", &format!("redis://:{PASSWORD}@127.0.0.1:{port}"))
        .args(["--on-store-error", "error"])
        .start_without_store();
    let mut rls = server.client().await;
    let request = tollgate_testkit::grpc::request("sec", &[&[("k", "ann")]]);
    let status = rls.call(request).await.expect_err("no store to answer");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let message = status.message();
    assert!(
        message.contains(&format!("redis 127.0.0.1:{port} (single)")),
        "{message}"
    );
    assert!(!message.contains(PASSWORD), "{message}");
}
