//! The adapter's tests, and the converters back from protojson they need: a response
//! as Envoy's JSON clients read it, compared with what gRPC answers.

use super::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ResponseUnit;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;

/// Serializes like the handler does.
async fn to_json<T: Serialize>(value: T) -> String {
    let body = Json(value).into_response().into_body();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .expect("collect the JSON body");
    String::from_utf8(bytes.to_vec()).expect("JSON is UTF-8")
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

#[test]
fn parses_the_minimal_request() {
    let req = parse_request(
        br#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"ann"}]}],"hitsAddend":1}"#,
    )
    .expect("valid request");
    assert_eq!(
        req,
        RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![entry("user", "ann")],
                ..Default::default()
            }],
            hits_addend: 1,
        }
    );
}

#[test]
fn accepts_camel_and_snake_case_names() {
    for body in [
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],
            "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":"7","isNegativeHits":true}],
            "hitsAddend":"2"}"#,
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],
            "limit":{"requests_per_unit":"5","unit":2},"hits_addend":7,"is_negative_hits":true}],
            "hits_addend":2}"#,
    ] {
        let req = parse_request(body.as_bytes()).expect(body);
        assert_eq!(req.hits_addend, 2);
        let d = &req.descriptors[0];
        assert_eq!(
            d.limit,
            Some(RateLimitOverride {
                requests_per_unit: 5,
                unit: RateLimitUnit::Minute.into(),
            })
        );
        assert_eq!(d.hits_addend, Some(UInt64Value { value: 7 }));
        assert!(d.is_negative_hits);
    }
}

#[test]
fn zero_hits_addend_on_a_descriptor_is_kept_and_null_means_unset() {
    let req = parse_request(
        br#"{"domain":"d","descriptors":[{"entries":[],"hitsAddend":0},{"hitsAddend":null}]}"#,
    )
    .expect("valid");
    assert_eq!(
        req.descriptors[0].hits_addend,
        Some(UInt64Value { value: 0 })
    );
    assert_eq!(req.descriptors[1].hits_addend, None);
}

#[test]
fn uint64_takes_its_full_range() {
    let req =
        parse_request(br#"{"descriptors":[{"hitsAddend":"18446744073709551615"}]}"#).expect("max");
    assert_eq!(
        req.descriptors[0].hits_addend.map(|h| h.value),
        Some(u64::MAX)
    );
    assert!(parse_request(br#"{"descriptors":[{"hitsAddend":"18446744073709551616"}]}"#).is_err());
}

#[test]
fn rejects_bad_bodies_naming_the_problem() {
    let cases: &[(&str, &str)] = &[
        (r#"{"domain":"d","hitsAdend":1}"#, "hitsAdend"),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","valu":"v"}]}]}"#,
            "valu",
        ),
        (r#"{"domain":"d","hitsAddend":-1}"#, "hitsAddend"),
        (r#"{"domain":"d","hitsAddend":4294967296}"#, "out of range"),
        (r#"{"domain":"d","hitsAddend":"1x"}"#, "1x"),
        (r#"{"domain":"d","hitsAddend":1.5}"#, "1.5"),
        (
            r#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#,
            "FORTNIGHT",
        ),
        (
            r#"{"descriptors":[{"isNegativeHits":"yes"}]}"#,
            "isNegativeHits",
        ),
        (r#"{"domain":5}"#, "domain"),
        (r#"["domain"]"#, "expected"),
        (r#"{"domain":"d""#, "EOF"),
        (r#"{"domain":"d"} x"#, "trailing"),
        (r#"{"domain":"\ud800"}"#, "half of a UTF-16 surrogate pair"),
        (r#"{"domain":"\udc00x"}"#, "half of a UTF-16 surrogate pair"),
        ("", "EOF"),
    ];
    for (body, needle) in cases {
        let err = parse_request(body.as_bytes()).expect_err(body).to_string();
        assert!(err.contains(needle), "{body}: {err}");
    }
}

#[test]
fn integral_floats_are_integers() {
    let req = parse_request(br#"{"hitsAddend":3.0}"#).expect("3.0 is 3");
    assert_eq!(req.hits_addend, 3);
}

#[test]
fn durations_use_protojson_text() {
    let cases = [
        ((60, 0), "60s"),
        ((59, 500_000_000), "59.500s"),
        ((0, 1_000), "0.000001s"),
        ((1, 1), "1.000000001s"),
        ((-1, -500_000_000), "-1.500s"),
        ((0, 0), "0s"),
    ];
    for ((seconds, nanos), text) in cases {
        let d = DurationJson(ProtoDuration { seconds, nanos });
        assert_eq!(d.to_string(), text);
        assert_eq!(DurationJson::parse(text), Some(d), "{text}");
    }
    assert_eq!(
        DurationJson::parse("59.5s"),
        Some(DurationJson(ProtoDuration {
            seconds: 59,
            nanos: 500_000_000
        }))
    );
    for bad in [
        "60",
        "s",
        ".5s",
        "1.s",
        "1.0000000001s",
        "1e3s",
        "+1s",
        "1.-5s",
    ] {
        assert_eq!(DurationJson::parse(bad), None, "{bad}");
    }
}

fn limited_response() -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok.into(),
        statuses: vec![DescriptorStatus {
            code: Code::Ok.into(),
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: 3,
                unit: ResponseUnit::Minute.into(),
            }),
            limit_remaining: 2,
            duration_until_reset: Some(ProtoDuration {
                seconds: 60,
                nanos: 0,
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn renders_responses_like_protojson() {
    let json = to_json(ResponseJson::from_proto(&limited_response())).await;
    assert_eq!(
        json,
        r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},"limitRemaining":2,"durationUntilReset":"60s"}]}"#
    );
}

#[tokio::test]
async fn renders_over_limit_names_and_headers() {
    let resp = RateLimitResponse {
        overall_code: Code::OverLimit.into(),
        statuses: vec![
            DescriptorStatus {
                code: Code::OverLimit.into(),
                current_limit: Some(RateLimit {
                    name: "gold".into(),
                    requests_per_unit: 1,
                    unit: ResponseUnit::Week.into(),
                }),
                limit_remaining: 0,
                duration_until_reset: Some(ProtoDuration {
                    seconds: 59,
                    nanos: 500_000_000,
                }),
                ..Default::default()
            },
            DescriptorStatus {
                code: Code::Ok.into(),
                ..Default::default()
            },
        ],
        response_headers_to_add: vec![HeaderValue {
            key: "RateLimit-Limit".into(),
            value: "1".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let json = to_json(ResponseJson::from_proto(&resp)).await;
    assert_eq!(
        json,
        concat!(
            r#"{"overallCode":"OVER_LIMIT","statuses":["#,
            r#"{"code":"OVER_LIMIT","currentLimit":{"name":"gold","requestsPerUnit":1,"unit":"WEEK"},"durationUntilReset":"59.500s"},"#,
            r#"{"code":"OK"}],"#,
            r#""responseHeadersToAdd":[{"key":"RateLimit-Limit","value":"1"}]}"#
        )
    );
    assert_eq!(parse_response(json.as_bytes()), Ok(resp));
}

#[tokio::test]
async fn unknown_enum_numbers_are_written_as_numbers() {
    let resp = RateLimitResponse {
        overall_code: 9,
        ..Default::default()
    };
    let json = to_json(ResponseJson::from_proto(&resp)).await;
    assert_eq!(json, r#"{"overallCode":9}"#);
    assert_eq!(parse_response(json.as_bytes()), Ok(resp));
}

#[tokio::test]
async fn requests_round_trip() {
    let req = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![
            RateLimitDescriptor {
                entries: vec![entry("user", "ann"), entry("path", "")],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: RateLimitUnit::Minute.into(),
                }),
                hits_addend: Some(UInt64Value { value: u64::MAX }),
                is_negative_hits: true,
            },
            RateLimitDescriptor {
                hits_addend: Some(UInt64Value { value: 0 }),
                ..Default::default()
            },
        ],
        hits_addend: 3,
    };
    let json = to_json(RequestJson::from_proto(&req)).await;
    assert_eq!(
        json,
        concat!(
            r#"{"domain":"d","descriptors":["#,
            r#"{"entries":[{"key":"user","value":"ann"},{"key":"path"}],"limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":"18446744073709551615","isNegativeHits":true},"#,
            r#"{"hitsAddend":"0"}],"hitsAddend":3}"#
        )
    );
    assert_eq!(parse_request(json.as_bytes()), Ok(req));
}

#[tokio::test]
async fn responses_round_trip() {
    let resp = limited_response();
    let json = to_json(ResponseJson::from_proto(&resp)).await;
    assert_eq!(parse_response(json.as_bytes()), Ok(resp));
}

/// Parses a protojson `RateLimitResponse`: the tests' round trips.
fn parse_response(body: &[u8]) -> Result<RateLimitResponse, InvalidJson> {
    Json::<Object<ResponseJson>>::from_bytes(body)
        .map(|Json(Object(response))| response.into_proto())
        .map_err(|e| InvalidJson::new("RateLimitResponse", &e))
}

/// Test-only: the protojson response back as protobuf.
impl ResponseJson {
    fn into_proto(self) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: self.overall_code.map_or(0, |c| c.0),
            statuses: self
                .statuses
                .unwrap_or_default()
                .into_iter()
                .map(|s| s.0.into_proto())
                .collect(),
            response_headers_to_add: headers_into_proto(self.response_headers_to_add),
            request_headers_to_add: headers_into_proto(self.request_headers_to_add),
            dynamic_metadata: self
                .dynamic_metadata
                .as_ref()
                .and_then(scalars::json_struct),
            ..Default::default()
        }
    }
}

impl StatusJson {
    fn into_proto(self) -> DescriptorStatus {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
        DescriptorStatus {
            code: self.code.map_or(0, |c| c.0),
            current_limit: self.current_limit.map(|Object(l)| RateLimit {
                name: l.name.unwrap_or_default(),
                requests_per_unit: l.requests_per_unit.map_or(0, |n| n.0),
                unit: l.unit.map_or(0, |u| u.0),
            }),
            limit_remaining: self.limit_remaining.map_or(0, |n| n.0),
            duration_until_reset: self.duration_until_reset.map(|d| d.0),
            ..Default::default()
        }
    }
}

fn headers_into_proto(headers: Option<Vec<Object<HeaderJson>>>) -> Vec<HeaderValue> {
    headers
        .unwrap_or_default()
        .into_iter()
        .map(|Object(h)| HeaderValue {
            key: h.key.unwrap_or_default(),
            value: h.value.unwrap_or_default(),
            ..Default::default()
        })
        .collect()
}
