//! The HTTP admin port: `POST /json` (protojson decisions, sharing counters with gRPC)
//! and `GET /rlconfig` (the loaded rules).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::service::json::parse_response;

const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: shared
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: shared
  - key: api_key
    value: gold-key
    rate_limit:
      unit: minute
      requests_per_unit: 600
      name: gold
  - key: api_key
    rate_limit:
      unit: minute
      requests_per_unit: 60
  - key: path
    value: "/api/*"
    shadow_mode: true
    rate_limits:
      - unit: second
        requests_per_unit: 10
        algorithm: token_bucket
        burst: 20
      - unit: hour
        requests_per_unit: 100
        name: hourly
        replaces:
          - name: gold
  - key: open
    rate_limit:
      unlimited: true
  - key: override
"#;

/// A parsed HTTP/1.1 response.
struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

/// One HTTP/1.1 request over a fresh connection, read until the server closes it.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Reply {
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut stream = TcpStream::connect(addr).await.expect("connect HTTP");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("send HTTP request");
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .expect("read HTTP response until the server closes");
        parse_reply(&String::from_utf8(raw).expect("HTTP response is UTF-8"))
    })
    .await
    .unwrap_or_else(|_| panic!("{method} {path} took longer than {REQUEST_TIMEOUT:?}"))
}

fn parse_reply(raw: &str) -> Reply {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("HTTP response without header end: {raw:?}"));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP status line: {head:?}"));
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Reply {
        status,
        content_type: header("content-type").unwrap_or_default(),
        body,
    }
}

async fn post_json(server: &Server, body: &str) -> Reply {
    http(server.http_addr(), "POST", "/json", body).await
}

/// POSTs `body` and expects `status` with a protojson response, which it decodes.
async fn decide(server: &Server, body: &str, status: u16) -> RateLimitResponse {
    let reply = post_json(server, body).await;
    assert_eq!(reply.status, status, "{body} -> {}", reply.body);
    assert_eq!(reply.content_type, "application/json", "{body}");
    parse_response(reply.body.as_bytes())
        .unwrap_or_else(|e| panic!("{body} -> undecodable {:?}: {e}", reply.body))
}

fn one_user(value: &str, hits: u32) -> String {
    format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}],"hitsAddend":{hits}}}"#
    )
}

#[tokio::test]
async fn json_answers_200_with_protojson() {
    let server = Server::start(RULES);
    let reply = post_json(&server, &one_user("ann", 1)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.content_type, "application/json");
    // Field names, enum names and omitted defaults as protojson writes them.
    let prefix = r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},"limitRemaining":2,"durationUntilReset":""#;
    assert!(reply.body.starts_with(prefix), "{}", reply.body);
    assert!(reply.body.ends_with(r#"s"}]}"#), "{}", reply.body);

    let resp = parse_response(reply.body.as_bytes()).expect("protojson response");
    assert_eq!(overall(&resp), Code::Ok);
    let status = &resp.statuses[0];
    assert_limited(status, Code::Ok, &limit(3, Unit::Minute, ""), 2);
    let reset = until_reset(status);
    assert!(
        reset > Duration::ZERO && reset <= Duration::from_secs(60),
        "{reset:?}"
    );
}

#[tokio::test]
async fn json_answers_429_when_over_limit() {
    let server = Server::start(RULES);
    let resp = decide(&server, &one_user("bob", 3), 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(3, Unit::Minute, ""), 0);

    let reply = post_json(&server, &one_user("bob", 1)).await;
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert!(
        reply
            .body
            .starts_with(r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","#),
        "{}",
        reply.body
    );
    // limitRemaining is 0, so protojson leaves it out.
    assert!(!reply.body.contains("limitRemaining"), "{}", reply.body);
    let resp = parse_response(reply.body.as_bytes()).expect("protojson response");
    assert_eq!(overall(&resp), Code::OverLimit);
    assert_limited(
        &resp.statuses[0],
        Code::OverLimit,
        &limit(3, Unit::Minute, ""),
        0,
    );
}

#[tokio::test]
async fn json_statuses_follow_request_order_with_names_and_no_match() {
    let server = Server::start(RULES);
    let body = r#"{"domain":"d","descriptors":[
        {"entries":[{"key":"api_key","value":"gold-key"}]},
        {"entries":[{"key":"nothing","value":"here"}]},
        {"entries":[{"key":"open","value":"x"}]}]}"#;
    let resp = decide(&server, body, 200).await;
    assert_eq!(resp.statuses.len(), 3, "{resp:?}");
    assert_limited(
        &resp.statuses[0],
        Code::Ok,
        &limit(600, Unit::Minute, "gold"),
        599,
    );
    assert_unlimited(&resp.statuses[1]);
    assert_unlimited(&resp.statuses[2]);
    assert_eq!(resp.statuses[2].limit_remaining, u32::MAX);
}

#[tokio::test]
async fn json_accepts_overrides_descriptor_hits_and_snake_case() {
    let server = Server::start(RULES);
    // A request-supplied limit, with the unit as a name.
    let camel = r#"{"domain":"d","descriptors":[{"entries":[{"key":"override","value":"a"}],
        "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":"4"}]}"#;
    let resp = decide(&server, camel, 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(5, Unit::Minute, ""), 1);

    // The same counter, in snake_case with the unit as a number (MINUTE = 2).
    let snake = r#"{"domain":"d","descriptors":[{"entries":[{"key":"override","value":"a"}],
        "limit":{"requests_per_unit":5,"unit":2},"hits_addend":2}]}"#;
    let resp = decide(&server, snake, 429).await;
    assert_limited(
        &resp.statuses[0],
        Code::OverLimit,
        &limit(5, Unit::Minute, ""),
        1,
    );

    // hitsAddend 0 only checks (remaining as if one more were counted); isNegativeHits
    // gives units back.
    let check = r#"{"domain":"d","descriptors":[{"entries":[{"key":"override","value":"a"}],
        "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":0}]}"#;
    let resp = decide(&server, check, 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(5, Unit::Minute, ""), 0);
    let resp = decide(&server, check, 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(5, Unit::Minute, ""), 0);
    let refund = r#"{"domain":"d","descriptors":[{"entries":[{"key":"override","value":"a"}],
        "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":2,"isNegativeHits":true}]}"#;
    decide(&server, refund, 200).await;
    let resp = decide(&server, check, 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(5, Unit::Minute, ""), 2);
}

#[tokio::test]
async fn json_and_grpc_count_on_the_same_counters() {
    let server = Server::start(RULES);
    let mut rls = server.client().await;
    let entries: &[(&str, &str)] = &[("shared", "k")];
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"shared","value":"k"}]}]}"#;

    let via_json = decide(&server, body, 200).await;
    let via_grpc = rls.ok(request("d", &[entries])).await;
    let shared = limit(3, Unit::Minute, "shared");
    assert_limited(&via_json.statuses[0], Code::Ok, &shared, 2);
    assert_limited(&via_grpc.statuses[0], Code::Ok, &shared, 1);
    // Apart from the time left, both adapters answer the same.
    let without_reset = |mut r: RateLimitResponse| {
        for s in &mut r.statuses {
            s.duration_until_reset = None;
            s.limit_remaining = 0;
        }
        r
    };
    assert_eq!(without_reset(via_json), without_reset(via_grpc));

    decide(&server, body, 200).await;
    let status = rls.check("d", entries).await;
    assert_limited(&status, Code::OverLimit, &shared, 0);
    decide(&server, body, 429).await;
}

#[tokio::test]
async fn json_rejects_bad_bodies_with_400_naming_the_problem() {
    let server = Server::start(RULES);
    let cases: &[(&str, &str)] = &[
        ("not json", "expected"),
        ("", "EOF"),
        (r#"["d"]"#, "JSON object"),
        (r#"{"domain":"d","hitsAdend":1}"#, "hitsAdend"),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","valeu":"a"}]}]}"#,
            "descriptors[0].entries[0].valeu",
        ),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}],"hitsAddend":-1}]}"#,
            "descriptors[0].hitsAddend",
        ),
        (r#"{"domain":"d","hitsAddend":"many"}"#, "many"),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":{"unit":"FORTNIGHT"}}]}"#,
            "FORTNIGHT",
        ),
        // Valid JSON that fails the service's own validation.
        (
            r#"{"descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#,
            "rate limit domain must not be empty",
        ),
        (
            r#"{"domain":"d","descriptors":[]}"#,
            "rate limit descriptor list must not be empty",
        ),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"override","value":"a"}],"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}"#,
            "unknown unit",
        ),
    ];
    for (body, needle) in cases {
        let reply = post_json(&server, body).await;
        assert_eq!(reply.status, 400, "{body} -> {}", reply.body);
        assert!(
            reply.body.contains(needle),
            "{body} -> {:?} should mention {needle:?}",
            reply.body
        );
    }
    // The server is still answering.
    decide(&server, &one_user("after", 1), 200).await;
}

#[tokio::test]
async fn json_takes_only_post() {
    let server = Server::start(RULES);
    let reply = http(server.http_addr(), "GET", "/json", "").await;
    assert_eq!(reply.status, 405, "{}", reply.body);
}

#[tokio::test]
async fn json_answers_503_when_the_store_fails() {
    // A loopback port nobody listens on: Redis connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let server = Server::start_with_args(
        RULES,
        &[
            "--backend",
            "redis",
            "--redis-url",
            &url,
            "--on-store-error",
            "error",
        ],
    );
    let reply = post_json(&server, &one_user("ann", 1)).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("store"), "{}", reply.body);
    // Descriptors without a limit never reach the store.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"nothing","value":"x"}]}]}"#;
    decide(&server, body, 200).await;
}

#[tokio::test]
async fn rlconfig_dumps_the_loaded_rules() {
    let server = Server::start(RULES);
    let reply = http(server.http_addr(), "GET", "/rlconfig", "").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply.content_type.starts_with("text/plain"),
        "{}",
        reply.content_type
    );
    assert_eq!(
        reply.body,
        "\
d.api_key_gold-key: unit=MINUTE requests_per_unit=600, name=gold, shadow_mode=false
d.api_key: unit=MINUTE requests_per_unit=60, shadow_mode=false
d.open: unlimited, shadow_mode=false
d.path_/api/*: unit=SECOND requests_per_unit=10 algorithm=token_bucket burst=20, shadow_mode=true, replaces=[gold]
d.path_/api/*: unit=HOUR requests_per_unit=100, name=hourly, shadow_mode=true, replaces=[gold]
d.shared: unit=MINUTE requests_per_unit=3, name=shared, shadow_mode=false
d.user: unit=MINUTE requests_per_unit=3, shadow_mode=false
"
    );
}
