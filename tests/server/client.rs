//! `tollgate client` as a person runs it: against a Tollgate serving gRPC over mutual TLS
//! (its CA, a client certificate, the server's name), refused without a client
//! certificate or over plaintext with a hint, and per-descriptor hits counted as given.

use tollgate_testkit::pki::Pki;
use tollgate_testkit::process::{self, Finished};
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, Serve, Server};

const RULES: &str =
    "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 10}}\n";

/// `tollgate client --addr ADDR --domain d` with `args`.
fn client(server: &Server, args: &[&str]) -> Finished {
    let mut cmd = tollgate::command();
    cmd.args(["client", "--addr", &server.grpc_addr().to_string()])
        .args(["--domain", "d"])
        .args(args);
    process::run("tollgate client", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

fn path(file: &std::path::Path) -> &str {
    file.to_str().expect("a UTF-8 path")
}

#[test]
fn the_client_speaks_mutual_tls_with_a_ca_a_certificate_and_a_server_name() {
    let pki = Pki::new();
    let server_pair = pki.issue("server", "DNS:tollgate.internal,IP:127.0.0.1");
    let envoy = pki.issue("envoy", "URI:spiffe://example.org/envoy");
    let server = Serve::rules(RULES)
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", &server_pair.cert)
        .env("GRPC_SERVER_TLS_KEY", &server_pair.key)
        .env("GRPC_CLIENT_TLS_CACERT", pki.ca())
        .env("GRPC_CLIENT_TLS_SAN", "spiffe://example.org/envoy")
        .start();
    let other_pki = Pki::new();
    let (ca, stranger) = (pki.ca(), other_pki.ca());
    let mutual = [
        "--tls-ca",
        path(&ca),
        "--tls-cert",
        path(&envoy.cert),
        "--tls-key",
        path(&envoy.key),
        "--descriptor",
        "k=v",
    ];
    // The server's name from --addr (its IP is in the certificate), then given.
    for extra in [&[][..], &["--tls-server-name", "tollgate.internal"][..]] {
        let out = client(&server, &[&mutual[..], extra].concat());
        assert!(out.status.success(), "{out:?}");
        assert!(out.stdout.starts_with("overall: OK\n"), "{out:?}");
    }
    let remaining = client(&server, &mutual);
    assert!(remaining.stdout.contains("remaining=7"), "{remaining:?}");

    for (what, args, says) in [
        (
            "a name the certificate does not carry",
            [&mutual[..], &["--tls-server-name", "other.internal"][..]].concat(),
            "certificate not valid for name \"other.internal\"",
        ),
        (
            "no client certificate",
            vec!["--tls-ca", path(&ca), "--descriptor", "k=v"],
            "add --tls-cert and --tls-key",
        ),
        (
            "another CA",
            {
                let mut args = mutual.to_vec();
                args[1] = path(&stranger);
                args
            },
            "invalid peer certificate",
        ),
    ] {
        let out = client(&server, &args);
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        assert!(out.stderr.contains(says), "{what}: {out:?}");
    }
    let plaintext = client(&server, &["--descriptor", "k=v"]);
    assert_eq!(plaintext.status.code(), Some(1), "{plaintext:?}");
    assert!(
        plaintext
            .stderr
            .contains("if the server serves TLS, add --tls or --tls-ca"),
        "{plaintext:?}"
    );
}

#[test]
fn each_descriptor_counts_its_own_hits() {
    let server = Serve::rules(RULES).start();
    let out = client(
        &server,
        &[
            "--hits",
            "2",
            "--descriptor",
            "k=a;hits=4",
            "--descriptor",
            "k=b;hits=0",
            "--descriptor",
            "k=c",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let remaining: Vec<&str> = out
        .stdout
        .lines()
        .skip(1)
        .map(|line| {
            line.split(' ')
                .find(|word| word.starts_with("remaining="))
                .unwrap_or_else(|| panic!("no remaining in {line:?}"))
        })
        .collect();
    // A check (hits 0) says what is left, as the reference does, and counts nothing.
    assert_eq!(
        remaining,
        ["remaining=6", "remaining=10", "remaining=8"],
        "{out:?}"
    );
    let counted = client(&server, &["--descriptor", "k=b"]);
    assert!(counted.stdout.contains(" remaining=9 "), "{counted:?}");
    // Over the limit: exit 2.
    let over = client(&server, &["--descriptor", "k=a;hits=7"]);
    assert_eq!(over.status.code(), Some(2), "{over:?}");
    assert!(over.stdout.starts_with("overall: OVER_LIMIT\n"), "{over:?}");
    let bad = client(&server, &["--descriptor", "k=a;hits=-1"]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(
        bad.stderr.contains("hits '-1' is not a whole number"),
        "{bad:?}"
    );
}

#[test]
fn a_descriptor_no_rule_matches_is_said_to_be_unlimited() {
    let server = Serve::rules(RULES).start();
    let out = client(&server, &["--descriptor", "k=a", "--descriptor", "nokey=x"]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[1].starts_with("descriptor 0: OK limit=10/HOUR"),
        "{out:?}"
    );
    assert!(
        lines[2].starts_with("descriptor 1: OK no rule matched (not limited;"),
        "{out:?}"
    );
}
