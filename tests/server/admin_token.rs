//! The admin token as the HTTP port reads it: a token setting no client could send stops
//! startup; `Authorization` reads the same over HTTP/1 and HTTP/2 (prior knowledge),
//! however odd its spacing, case or bytes; refusals are logged without the token given.

use std::net::SocketAddr;

use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::http::{self, Method};
use tollgate_testkit::http2;
use tollgate_testkit::tollgate::Serve;

use crate::in_process::InProcess;

const RULES: &str =
    "domain: at\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

/// An empty ADMIN_TOKEN counted as set, and HTTP/2 (which keeps the space after `Bearer`)
/// matched it: `curl --http2-prior-knowledge -H "Authorization: Bearer "` set overrides
/// and reset counters. Every token no client could send stops startup, never quoted.
#[test]
fn a_token_setting_that_no_client_could_send_stops_startup() {
    for (what, value, reason) in [
        ("empty", "", "ADMIN_TOKEN (--admin-token) is set but empty"),
        (
            "blank",
            " \t ",
            "ADMIN_TOKEN (--admin-token) is set but empty",
        ),
        (
            "a newline at its end",
            "tok3n-from-a-file\n",
            "ADMIN_TOKEN (--admin-token) begins or ends with white space",
        ),
        (
            "an escape",
            "tok3n\x1b[0m",
            "ADMIN_TOKEN (--admin-token) holds a control character",
        ),
    ] {
        let refused = Serve::rules(RULES).env("ADMIN_TOKEN", value).refused(what);
        assert_eq!(refused.status.code(), Some(1), "{what}: {refused:?}");
        assert!(
            refused.stderr.contains(reason),
            "{what}: want {reason:?} in {refused:?}"
        );
        assert!(!refused.stderr.contains("tok3n"), "{what}: {refused:?}");
    }
}

/// Over HTTP/1 as bytes on the wire (what hyper's client would not send: two headers,
/// bytes that are not UTF-8), and over HTTP/2 with prior knowledge as curl sends it.
async fn both_protocols(
    addr: SocketAddr,
    method: &str,
    path: &str,
    authorization: &[&[u8]],
    body: &str,
) -> [(u16, String); 2] {
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    )
    .into_bytes();
    for value in authorization {
        raw.extend_from_slice(b"Authorization: ");
        raw.extend_from_slice(value);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(body.as_bytes());
    let one = http::send_raw(addr, &raw)
        .await
        .unwrap_or_else(|e| panic!("HTTP/1 {method} {path}: {e}"));
    let mut headers = vec![("content-type", &b"application/json"[..])];
    headers.extend(authorization.iter().map(|v| ("authorization", *v)));
    let method_h2 = Method::from_bytes(method.as_bytes()).expect("a method");
    let two = http2::send(addr, &addr.to_string(), method_h2, path, &headers, body)
        .await
        .unwrap_or_else(|e| panic!("HTTP/2 {method} {path}: {e}"));
    [(one.status, one.body), (two.status, two.body)]
}

#[tokio::test]
async fn the_authorization_header_reads_the_same_over_http1_and_http2() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let addr = server.http_addr();
    let right = |form: &str| form.replace("T", TOKEN).into_bytes();
    let cases: Vec<(&str, Vec<Vec<u8>>, u16, &str)> = vec![
        ("the token", vec![right("Bearer T")], 200, ""),
        ("a space after it", vec![right("Bearer T ")], 200, ""),
        ("two spaces before it", vec![right("Bearer  T")], 200, ""),
        ("a tab before it", vec![right("Bearer\tT")], 200, ""),
        ("the scheme in lower case", vec![right("bearer T")], 200, ""),
        ("no header", vec![], 401, "need Authorization: Bearer"),
        (
            "an empty token",
            vec![b"Bearer ".to_vec()],
            401,
            "the Bearer token is empty",
        ),
        (
            "only white space",
            vec![b"Bearer \t ".to_vec()],
            401,
            "the Bearer token is empty",
        ),
        (
            "another scheme",
            vec![right("Basic T")],
            401,
            "Authorization is not a Bearer token",
        ),
        (
            "two headers, the right one first",
            vec![right("Bearer T"), b"Bearer other".to_vec()],
            401,
            "more than one Authorization header",
        ),
        (
            "two right headers",
            vec![right("Bearer T"), right("Bearer T")],
            401,
            "more than one Authorization header",
        ),
        (
            "a wrong token",
            vec![b"Bearer not-the-token".to_vec()],
            403,
            "wrong admin token",
        ),
        (
            "the token and a byte that is not UTF-8",
            vec![[right("Bearer T"), vec![0xff]].concat()],
            403,
            "wrong admin token",
        ),
    ];
    let reset = admin::body("at", "user", "ann");
    let set = override_body("at", ("user", "ann"), "5", "hour");
    for (what, authorization, status, reason) in &cases {
        let authorization: Vec<&[u8]> = authorization.iter().map(Vec::as_slice).collect();
        for (method, path, body) in [
            ("DELETE", "/counters", reset.as_str()),
            ("PUT", "/overrides", set.as_str()),
        ] {
            let answers = both_protocols(addr, method, path, &authorization, body).await;
            for ((got, text), protocol) in answers.iter().zip(["HTTP/1", "HTTP/2"]) {
                assert_eq!(
                    got, status,
                    "{what}: {method} {path} over {protocol} answered {got}: {text}"
                );
                assert!(
                    text.contains(reason),
                    "{what}: {method} {path} over {protocol}: want {reason:?} in {text:?}"
                );
            }
        }
    }
}

/// Refused admin calls of every kind are logged, at most one line per period (a client
/// may send them by the thousand) with the peer and the reason, never the token sent.
#[tokio::test]
async fn refusals_are_logged_without_the_token_sent() {
    const SENT: &str = "guessed-t0ken-4711";
    let server = Serve::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let foreign = http::get_with(server.http_addr(), "/top", &[("host", "rebound.example")]).await;
    assert_eq!(foreign.status, 403, "{foreign:?}");
    let wrong = admin::overrides(&server, Method::GET, "/overrides", "", Some(SENT)).await;
    assert_eq!(wrong.status, 403, "{wrong:?}");
    let stderr = server.stop().stderr;
    let logged: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("admin call refused"))
        .collect();
    assert_eq!(logged.len(), 1, "{stderr}");
    for part in ["top keys name clients", "Host", "peer=127.0.0.1:"] {
        assert!(logged[0].contains(part), "{part} not in {}", logged[0]);
    }
    assert!(!stderr.contains(SENT), "{stderr}");
}
