//! The HTTP adapter: `POST /json` takes a `RateLimitRequest` and answers a
//! `RateLimitResponse`, both in protojson (the proto3 JSON mapping), over [`Rls`].
//!
//! As in protojson, input accepts lowerCamelCase and the original snake_case field names,
//! enums as names or numbers, integers as numbers or decimal strings, and `null` for "not
//! set"; unknown fields are rejected. Output uses lowerCamelCase and enum names and leaves
//! out fields holding their default value. Status codes follow the reference: 200 for
//! `OK`, 429 for `OVER_LIMIT`, 400 for a body that is not a valid request; when the counter
//! store fails, 503 (the reference says 500), as gRPC answers UNAVAILABLE then.
//!
//! Not rendered, because Tollgate never sets them: the response's `rawBody` and `quota`,
//! and headers' `rawValue`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::{Deserialize, Serialize};

pub(crate) mod scalars;

use self::scalars::{
    CodeNames, DurationJson, Enum, Object, RateLimitUnitNames, ResponseUnitNames, Uint32, Uint64,
};
use tollgate_core::DecideError;

use crate::rls::{Rls, RlsError};

/// `POST /json`: decides a protojson request like the gRPC method does.
pub(crate) async fn handler(State(rls): State<Arc<Rls>>, body: Bytes) -> Response {
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    match rls.should_rate_limit(&request).await {
        Ok(response) => {
            let status = match Code::try_from(response.overall_code) {
                Ok(Code::Ok) => StatusCode::OK,
                Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
                Ok(Code::Unknown) | Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, Json(ResponseJson::from_proto(&response))).into_response()
        }
        Err(RlsError::NoRules) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            RlsError::NoRules.to_string(),
        ),
        Err(RlsError::Decide(DecideError::InvalidArgument(why))) => {
            text(StatusCode::BAD_REQUEST, why.to_string())
        }
        Err(RlsError::Decide(DecideError::Store(e))) => {
            text(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

pub(crate) fn text(status: StatusCode, mut body: String) -> Response {
    body.push('\n');
    (status, [(CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// Parses a protojson `RateLimitRequest`; the error names the field and the problem.
pub(crate) fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    Json::<Object<RequestJson>>::from_bytes(body)
        .map(|Json(Object(request))| request.into_proto())
        .map_err(|e| reason("RateLimitRequest", &e))
}

/// Answers the core request of a protojson `body` with `answer`, or 400 saying why the
/// body is not one: `/explain` and `DELETE /counters`.
pub(crate) async fn with_request(
    body: &[u8],
    answer: impl AsyncFnOnce(&tollgate_core::Request<'_>) -> Response,
) -> Response {
    let request = match parse_request(body) {
        Ok(request) => request,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    match crate::proto::request(&request) {
        Ok(request) => answer(&request).await,
        Err(why) => text(StatusCode::BAD_REQUEST, why.to_string()),
    }
}

/// A `RateLimitRequest` in protojson, as `/json` and `/explain` take it.
pub(crate) fn request_body(request: &RateLimitRequest) -> String {
    serde_json::to_string(&Object(RequestJson::from_proto(request))).unwrap_or_default()
}

/// Parses a protojson `RateLimitResponse`: the tests' round trips.
#[cfg(test)]
fn parse_response(body: &[u8]) -> Result<RateLimitResponse, String> {
    Json::<Object<ResponseJson>>::from_bytes(body)
        .map(|Json(Object(response))| response.into_proto())
        .map_err(|e| reason("RateLimitResponse", &e))
}

/// `invalid WHAT: PATH: PROBLEM at line L column C`, without axum's generic preamble.
fn reason(what: &str, rejection: &JsonRejection) -> String {
    let text = rejection.body_text();
    let detail = match text.split_once(": ") {
        Some((preamble, detail)) if preamble.starts_with("Failed to") => detail,
        _ => text.as_str(),
    };
    format!("invalid {what}: {}", in_our_words(detail))
}

/// serde_json names a lone UTF-16 surrogate (`"\ud800"` without its pair) by what it
/// looked for next; a client needs to hear what is wrong with its string.
fn in_our_words(detail: &str) -> String {
    const SURROGATE: &str = "a \\u escape that is half of a UTF-16 surrogate pair, not a character";
    [
        "unexpected end of hex escape",
        "lone leading surrogate in hex escape",
    ]
    .iter()
    .fold(detail.to_owned(), |text, phrase| {
        text.replace(phrase, SURROGATE)
    })
}

// ---------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------

/// `envoy.service.ratelimit.v3.RateLimitRequest` in protojson.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RequestJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    descriptors: Option<Vec<Object<DescriptorJson>>>,
    #[serde(
        default,
        alias = "hits_addend",
        skip_serializing_if = "Option::is_none"
    )]
    hits_addend: Option<Uint32>,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor` in protojson.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DescriptorJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    entries: Option<Vec<Object<EntryJson>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limit: Option<Object<OverrideJson>>,
    /// A `google.protobuf.UInt64Value`: present with 0 is not the same as absent.
    #[serde(
        default,
        alias = "hits_addend",
        skip_serializing_if = "Option::is_none"
    )]
    hits_addend: Option<Uint64>,
    #[serde(
        default,
        alias = "is_negative_hits",
        skip_serializing_if = "Option::is_none"
    )]
    is_negative_hits: Option<bool>,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OverrideJson {
    #[serde(
        default,
        alias = "requests_per_unit",
        skip_serializing_if = "Option::is_none"
    )]
    requests_per_unit: Option<Uint32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unit: Option<Enum<RateLimitUnitNames>>,
}

impl RequestJson {
    fn from_proto(req: &RateLimitRequest) -> Self {
        Self {
            domain: non_empty(&req.domain),
            descriptors: non_empty_vec(&req.descriptors, |d| Object(DescriptorJson::from_proto(d))),
            hits_addend: non_zero(req.hits_addend).map(Uint32),
        }
    }

    fn into_proto(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.unwrap_or_default(),
            descriptors: self
                .descriptors
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.0.into_proto())
                .collect(),
            hits_addend: self.hits_addend.map_or(0, |n| n.0),
        }
    }
}

impl DescriptorJson {
    fn from_proto(d: &RateLimitDescriptor) -> Self {
        Self {
            entries: non_empty_vec(&d.entries, |e| {
                Object(EntryJson {
                    key: non_empty(&e.key),
                    value: non_empty(&e.value),
                })
            }),
            limit: d.limit.map(|l| {
                Object(OverrideJson {
                    requests_per_unit: non_zero(l.requests_per_unit).map(Uint32),
                    unit: non_zero(l.unit).map(Enum::new),
                })
            }),
            hits_addend: d.hits_addend.map(|h| Uint64(h.value)),
            is_negative_hits: d.is_negative_hits.then_some(true),
        }
    }

    fn into_proto(self) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: self
                .entries
                .unwrap_or_default()
                .into_iter()
                .map(|Object(e)| Entry {
                    key: e.key.unwrap_or_default(),
                    value: e.value.unwrap_or_default(),
                })
                .collect(),
            limit: self.limit.map(|Object(l)| RateLimitOverride {
                requests_per_unit: l.requests_per_unit.map_or(0, |n| n.0),
                unit: l.unit.map_or(0, |u| u.0),
            }),
            hits_addend: self.hits_addend.map(|n| UInt64Value { value: n.0 }),
            is_negative_hits: self.is_negative_hits.unwrap_or(false),
        }
    }
}

// ---------------------------------------------------------------------------
// Response
// ---------------------------------------------------------------------------

/// `envoy.service.ratelimit.v3.RateLimitResponse` in protojson.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ResponseJson {
    #[serde(
        default,
        alias = "overall_code",
        skip_serializing_if = "Option::is_none"
    )]
    overall_code: Option<Enum<CodeNames>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    statuses: Option<Vec<Object<StatusJson>>>,
    #[serde(
        default,
        alias = "response_headers_to_add",
        skip_serializing_if = "Option::is_none"
    )]
    response_headers_to_add: Option<Vec<Object<HeaderJson>>>,
    #[serde(
        default,
        alias = "request_headers_to_add",
        skip_serializing_if = "Option::is_none"
    )]
    request_headers_to_add: Option<Vec<Object<HeaderJson>>>,
    /// A `google.protobuf.Struct`: plain JSON in protojson.
    #[serde(
        default,
        alias = "dynamic_metadata",
        skip_serializing_if = "Option::is_none"
    )]
    dynamic_metadata: Option<serde_json::Value>,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StatusJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<Enum<CodeNames>>,
    #[serde(
        default,
        alias = "current_limit",
        skip_serializing_if = "Option::is_none"
    )]
    current_limit: Option<Object<LimitJson>>,
    #[serde(
        default,
        alias = "limit_remaining",
        skip_serializing_if = "Option::is_none"
    )]
    limit_remaining: Option<Uint32>,
    #[serde(
        default,
        alias = "duration_until_reset",
        skip_serializing_if = "Option::is_none"
    )]
    duration_until_reset: Option<DurationJson>,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LimitJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(
        default,
        alias = "requests_per_unit",
        skip_serializing_if = "Option::is_none"
    )]
    requests_per_unit: Option<Uint32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unit: Option<Enum<ResponseUnitNames>>,
}

/// `envoy.config.core.v3.HeaderValue` (key and value only).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

impl ResponseJson {
    fn from_proto(resp: &RateLimitResponse) -> Self {
        Self {
            overall_code: non_zero(resp.overall_code).map(Enum::new),
            statuses: non_empty_vec(&resp.statuses, |s| Object(StatusJson::from_proto(s))),
            response_headers_to_add: headers_from_proto(&resp.response_headers_to_add),
            request_headers_to_add: headers_from_proto(&resp.request_headers_to_add),
            dynamic_metadata: resp.dynamic_metadata.as_ref().map(scalars::struct_json),
        }
    }

    #[cfg(test)]
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
    fn from_proto(s: &DescriptorStatus) -> Self {
        Self {
            code: non_zero(s.code).map(Enum::new),
            current_limit: s.current_limit.as_ref().map(|l| {
                Object(LimitJson {
                    name: non_empty(&l.name),
                    requests_per_unit: non_zero(l.requests_per_unit).map(Uint32),
                    unit: non_zero(l.unit).map(Enum::new),
                })
            }),
            limit_remaining: non_zero(s.limit_remaining).map(Uint32),
            duration_until_reset: s.duration_until_reset.map(DurationJson),
        }
    }

    #[cfg(test)]
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

fn headers_from_proto(headers: &[HeaderValue]) -> Option<Vec<Object<HeaderJson>>> {
    non_empty_vec(headers, |h| {
        Object(HeaderJson {
            key: non_empty(&h.key),
            value: non_empty(&h.value),
        })
    })
}

#[cfg(test)]
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

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn non_zero<T: Default + PartialEq>(n: T) -> Option<T> {
    (n != T::default()).then_some(n)
}

fn non_empty_vec<T, U>(items: &[T], f: impl FnMut(&T) -> U) -> Option<Vec<U>> {
    (!items.is_empty()).then(|| items.iter().map(f).collect())
}

#[cfg(test)]
mod tests {
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
        let req = parse_request(br#"{"descriptors":[{"hitsAddend":"18446744073709551615"}]}"#)
            .expect("max");
        assert_eq!(
            req.descriptors[0].hits_addend.map(|h| h.value),
            Some(u64::MAX)
        );
        assert!(
            parse_request(br#"{"descriptors":[{"hitsAddend":"18446744073709551616"}]}"#).is_err()
        );
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
            let err = parse_request(body.as_bytes()).expect_err(body);
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
}
