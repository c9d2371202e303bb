//! The HTTP admin port: `POST /json` (protojson decisions, sharing counters with gRPC)
//! and `GET /rlconfig` (the loaded rules).

use std::time::Duration;

use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use serde_json::{Map, Value};
use tollgate_testkit::grpc::{
    Code, DescriptorStatus, RateLimit, RateLimitResponse, Unit, assert_limited, assert_unlimited,
    limit, overall, request, until_reset,
};
use tollgate_testkit::http;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{Listening, Serve};

use crate::in_process::InProcess;

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

/// Decodes a protojson `RateLimitResponse` with serde_json, independently of the
/// server's own codec, and checks its shape on the way: camelCase field names, enums by
/// name, zero values left out, durations as strings of seconds.
fn decode(body: &str) -> RateLimitResponse {
    let doc: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    let fields = object(&doc, &["overallCode", "statuses"]);
    RateLimitResponse {
        overall_code: enum_value(fields.get("overallCode"), Code::from_str_name),
        statuses: fields
            .get("statuses")
            .and_then(Value::as_array)
            .map(|statuses| statuses.iter().map(decode_status).collect())
            .unwrap_or_default(),
        ..Default::default()
    }
}

fn decode_status(doc: &Value) -> DescriptorStatus {
    let fields = object(
        doc,
        &[
            "code",
            "currentLimit",
            "limitRemaining",
            "durationUntilReset",
        ],
    );
    DescriptorStatus {
        code: enum_value(fields.get("code"), Code::from_str_name),
        current_limit: fields.get("currentLimit").map(|limit| {
            let limit_fields = object(limit, &["name", "requestsPerUnit", "unit"]);
            RateLimit {
                name: limit_fields
                    .get("name")
                    .map(|n| n.as_str().expect("name is a string").to_owned())
                    .unwrap_or_default(),
                requests_per_unit: number(limit_fields.get("requestsPerUnit")),
                unit: enum_value(limit_fields.get("unit"), Unit::from_str_name),
            }
        }),
        limit_remaining: number(fields.get("limitRemaining")),
        duration_until_reset: fields.get("durationUntilReset").map(|d| {
            let text = d.as_str().expect("a duration is a string");
            let seconds = text
                .strip_suffix('s')
                .unwrap_or_else(|| panic!("duration {text:?} ends with s"));
            let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
            ProtoDuration {
                seconds: whole.parse().expect("whole seconds"),
                nanos: format!("{fraction:0<9}").parse().expect("nanoseconds"),
            }
        }),
        ..Default::default()
    }
}

/// The fields of a JSON object, which may hold only `allowed` ones.
fn object<'a>(doc: &'a Value, allowed: &[&str]) -> &'a Map<String, Value> {
    let fields = doc
        .as_object()
        .unwrap_or_else(|| panic!("a JSON object: {doc}"));
    for name in fields.keys() {
        assert!(
            allowed.contains(&name.as_str()),
            "unexpected field {name:?} in {doc}"
        );
    }
    fields
}

/// An enum written by name; absent means its zero value, which protojson leaves out.
fn enum_value<E: Into<i32>>(value: Option<&Value>, by_name: fn(&str) -> Option<E>) -> i32 {
    value.map_or(0, |v| {
        let name = v.as_str().unwrap_or_else(|| panic!("an enum by name: {v}"));
        by_name(name)
            .unwrap_or_else(|| panic!("unknown enum name {name:?}"))
            .into()
    })
}

/// A uint32 written as a JSON number; absent means 0.
fn number(value: Option<&Value>) -> u32 {
    value.map_or(0, |v| {
        let n = v.as_u64().unwrap_or_else(|| panic!("a number: {v}"));
        u32::try_from(n).expect("a uint32")
    })
}

async fn post_json(server: &Listening, body: &str) -> http::Response {
    http::post_json(server.http_addr(), "/json", body).await
}

/// POSTs `body` and expects `status` with a protojson response, which it decodes.
async fn decide(server: &Listening, body: &str, status: u16) -> RateLimitResponse {
    let reply = post_json(server, body).await;
    assert_eq!(reply.status, status, "{body} -> {}", reply.body);
    assert_eq!(
        reply.header("content-type"),
        Some("application/json"),
        "{body}"
    );
    decode(&reply.body)
}

fn one_user(value: &str, hits: u32) -> String {
    format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}],"hitsAddend":{hits}}}"#
    )
}

#[tokio::test]
async fn json_answers_200_with_protojson() {
    let server = InProcess::rules(RULES).start();
    let reply = post_json(&server, &one_user("ann", 1)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    // Field names, enum names and omitted defaults as protojson writes them.
    let prefix = r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},"limitRemaining":2,"durationUntilReset":""#;
    assert!(reply.body.starts_with(prefix), "{}", reply.body);
    assert!(reply.body.ends_with(r#"s"}]}"#), "{}", reply.body);

    let resp = decode(&reply.body);
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
    let server = InProcess::rules(RULES).start();
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
    let resp = decode(&reply.body);
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
    let server = InProcess::rules(RULES).start();
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
    let server = InProcess::rules(RULES).start();
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

    // hitsAddend 0 only checks (remaining: what is left); isNegativeHits gives units back.
    let check = r#"{"domain":"d","descriptors":[{"entries":[{"key":"override","value":"a"}],
        "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":0}]}"#;
    let resp = decide(&server, check, 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(5, Unit::Minute, ""), 1);
    let resp = decide(&server, check, 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(5, Unit::Minute, ""), 1);
    let refund = r#"{"domain":"d","descriptors":[{"entries":[{"key":"override","value":"a"}],
        "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":2,"isNegativeHits":true}]}"#;
    decide(&server, refund, 200).await;
    let resp = decide(&server, check, 200).await;
    assert_limited(&resp.statuses[0], Code::Ok, &limit(5, Unit::Minute, ""), 3);
}

#[tokio::test]
async fn json_and_grpc_count_on_the_same_counters() {
    let server = InProcess::rules(RULES).start();
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
    let server = InProcess::rules(RULES).start();
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
        // A lone UTF-16 surrogate is named as such, not by what the parser looked for next.
        (
            r#"{"domain":"\ud800","descriptors":[]}"#,
            "half of a UTF-16 surrogate pair",
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
        assert!(!reply.body.contains("hex escape"), "{}", reply.body);
    }
    // The server is still answering.
    decide(&server, &one_user("after", 1), 200).await;
}

#[tokio::test]
async fn json_refuses_a_body_over_256_kib_with_413() {
    let server = InProcess::rules(RULES).start();
    let value = "v".repeat(256 << 10);
    let reply = post_json(&server, &one_user(&value, 1)).await;
    assert_eq!(reply.status, 413, "{}", reply.body);
    // A body within the limit is read and judged on its merits.
    let value = "v".repeat(4096);
    let reply = post_json(&server, &one_user(&value, 1)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test]
async fn json_takes_only_post() {
    let server = InProcess::rules(RULES).start();
    let reply = server.get("/json").await;
    assert_eq!(reply.status, 405, "{}", reply.body);
}

#[tokio::test]
async fn json_answers_503_when_the_store_fails() {
    // A redis-server that is not running: connections are refused.
    let redis = RedisServer::unstarted();
    let server = Serve::rules(RULES)
        .redis("single", &redis.url())
        .args(["--on-store-error", "error"])
        .start_without_store();
    let reply = post_json(&server, &one_user("ann", 1)).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("store"), "{}", reply.body);
    // Descriptors without a limit never reach the store.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"nothing","value":"x"}]}]}"#;
    decide(&server, body, 200).await;
}

#[tokio::test]
async fn rlconfig_dumps_the_loaded_rules() {
    let server = InProcess::rules(RULES).start();
    let reply = server.get("/rlconfig").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let content_type = reply.header("content-type").unwrap_or_default();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    // Where the rules came from first, then one line per limit.
    let (source, dump) = reply
        .body
        .split_at(reply.body.find("\nd.").map_or(0, |i| i + 1));
    let source: Vec<&str> = source.lines().collect();
    assert_eq!(source.len(), 2, "{source:?}");
    assert!(source[0].starts_with("# source: files at /") && source[0].ends_with("/rules.yaml"));
    assert!(source[1].starts_with("# domain d: file /") && source[1].ends_with("/rules.yaml"));
    assert_eq!(
        dump,
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
