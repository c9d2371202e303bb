//! The HTTP adapter: `POST /json` takes a `RateLimitRequest` and answers a
//! `RateLimitResponse`, both in protojson (the proto3 JSON mapping), over [`App`].
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

mod invalid;
pub(crate) mod scalars;

pub(crate) use self::invalid::InvalidJson;
use self::scalars::{
    CodeNames, DurationJson, Enum, Object, RateLimitUnitNames, ResponseUnitNames, Uint32, Uint64,
};
use tollgate_core::DecideError;

use crate::app::{App, RlsError};

/// `POST /json`: decides a protojson request like the gRPC method does.
pub(crate) async fn handler(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(why) => return text(StatusCode::BAD_REQUEST, why.to_string()),
    };
    match app.should_rate_limit(&request).await {
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
            text(StatusCode::SERVICE_UNAVAILABLE, app.store_error(&e))
        }
    }
}

pub(crate) fn text(status: StatusCode, mut body: String) -> Response {
    body.push('\n');
    (status, [(CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// Parses a protojson `RateLimitRequest`; the error names the field and the problem.
pub(crate) fn parse_request(body: &[u8]) -> Result<RateLimitRequest, InvalidJson> {
    Json::<Object<RequestJson>>::from_bytes(body)
        .map(|Json(Object(request))| request.into_proto())
        .map_err(|e| InvalidJson::new("RateLimitRequest", &e))
}

/// Answers the core request of a protojson `body` with `answer`, or 400 saying why the
/// body is not one: `/explain` and `DELETE /counters`.
pub(crate) async fn with_request(
    body: &[u8],
    answer: impl AsyncFnOnce(&tollgate_core::Request<'_>) -> Response,
) -> Response {
    let request = match parse_request(body) {
        Ok(request) => request,
        Err(why) => return text(StatusCode::BAD_REQUEST, why.to_string()),
    };
    match crate::api::proto::request(&request) {
        Ok(request) => answer(&request).await,
        Err(why) => text(StatusCode::BAD_REQUEST, why.to_string()),
    }
}

/// A `RateLimitRequest` in protojson, as `/json` and `/explain` take it.
pub(crate) fn request_body(request: &RateLimitRequest) -> String {
    serde_json::to_string(&Object(RequestJson::from_proto(request))).unwrap_or_default()
}

/// [`InvalidJson`]'s text: the overrides' routes answer it.
pub(crate) fn reason(what: &'static str, rejection: &JsonRejection) -> String {
    InvalidJson::new(what, rejection).to_string()
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
}

fn headers_from_proto(headers: &[HeaderValue]) -> Option<Vec<Object<HeaderJson>>> {
    non_empty_vec(headers, |h| {
        Object(HeaderJson {
            key: non_empty(&h.key),
            value: non_empty(&h.value),
        })
    })
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
mod tests;
