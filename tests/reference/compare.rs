//! Two answers to one request compared field by field, as Envoy and a client see them:
//! the overall code; per descriptor the code, `current_limit`, `limit_remaining` and
//! `duration_until_reset` (equal within a second: the two servers answer a moment apart
//! and round differently); headers (a reset header within a second too); dynamic
//! metadata; the body. Two errors are equal whatever they say: Envoy treats every error
//! alike. And the compact one-line forms of requests and answers that the report prints.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

/// What a server answered.
pub type Answer = Result<RateLimitResponse, tonic::Status>;

/// One field that differs.
#[derive(Clone, Debug)]
pub struct Difference {
    /// Where, e.g. `statuses[1].limit_remaining`.
    pub field: String,
    pub reference: String,
    pub tollgate: String,
}

impl Difference {
    /// The field without indices, with the two values when they are codes: what makes two
    /// differences the same kind.
    pub fn class(&self) -> String {
        let field: String = self
            .field
            .split('[')
            .map(|part| part.split_once(']').map_or(part, |(_, rest)| rest))
            .collect::<Vec<_>>()
            .join("[]");
        if field.ends_with("code") || field == "answer" {
            format!(
                "{field} {}/{}",
                short(&self.reference),
                short(&self.tollgate)
            )
        } else {
            field
        }
    }
}

impl Difference {
    /// How much the difference matters to a client, most first: an error, the overall
    /// code, a descriptor's code, its limit, remaining, reset, then headers, metadata.
    pub fn rank(&self) -> usize {
        const ORDER: &[&str] = &[
            "answer",
            "overall_code",
            "statuses.len",
            "code",
            "current_limit",
            "limit_remaining",
            "duration_until_reset",
            "quota",
            "response_headers_to_add",
            "request_headers_to_add",
            "dynamic_metadata",
        ];
        let last = self.field.rsplit('.').next().unwrap_or(&self.field);
        ORDER
            .iter()
            .position(|f| *f == self.field || *f == last)
            .unwrap_or(ORDER.len())
    }

    /// The index of the descriptor whose status differs, if it is one.
    pub fn status(&self) -> Option<usize> {
        self.field
            .strip_prefix("statuses[")?
            .split_once(']')?
            .0
            .parse()
            .ok()
    }
}

/// The first word of a value: `OVER_LIMIT` of `OVER_LIMIT (…)`, `error` of an error.
fn short(value: &str) -> &str {
    value.split([' ', ':']).next().unwrap_or(value)
}

/// Every field of `tollgate` that differs from `reference`.
pub fn differences(reference: &Answer, tollgate: &Answer) -> Vec<Difference> {
    let mut out = Vec::new();
    match (reference, tollgate) {
        (Err(_), Err(_)) => {}
        (Ok(_), Err(_)) | (Err(_), Ok(_)) => {
            push(&mut out, "answer", answer(reference), answer(tollgate));
        }
        (Ok(r), Ok(t)) => responses(&mut out, r, t),
    }
    out
}

fn push(out: &mut Vec<Difference>, field: &str, reference: String, tollgate: String) {
    if reference != tollgate {
        out.push(Difference {
            field: field.to_owned(),
            reference,
            tollgate,
        });
    }
}

fn responses(out: &mut Vec<Difference>, r: &RateLimitResponse, t: &RateLimitResponse) {
    push(
        out,
        "overall_code",
        code(r.overall_code),
        code(t.overall_code),
    );
    push(
        out,
        "statuses.len",
        r.statuses.len().to_string(),
        t.statuses.len().to_string(),
    );
    for (i, (rs, ts)) in r.statuses.iter().zip(&t.statuses).enumerate() {
        let at = |field: &str| format!("statuses[{i}].{field}");
        push(out, &at("code"), code(rs.code), code(ts.code));
        push(
            out,
            &at("current_limit"),
            limit(rs.current_limit.as_ref()),
            limit(ts.current_limit.as_ref()),
        );
        push(
            out,
            &at("limit_remaining"),
            rs.limit_remaining.to_string(),
            ts.limit_remaining.to_string(),
        );
        let (r_reset, t_reset) = (reset(rs), reset(ts));
        let close = matches!((r_reset, t_reset), (Some(a), Some(b)) if a.abs_diff(b) <= 1);
        if !close {
            push(
                out,
                &at("duration_until_reset"),
                seconds(r_reset),
                seconds(t_reset),
            );
        }
        push(
            out,
            &at("quota"),
            format!("{:?}", rs.quota),
            format!("{:?}", ts.quota),
        );
    }
    headers(
        out,
        "response_headers_to_add",
        &r.response_headers_to_add,
        &t.response_headers_to_add,
    );
    headers(
        out,
        "request_headers_to_add",
        &r.request_headers_to_add,
        &t.request_headers_to_add,
    );
    push(
        out,
        "dynamic_metadata",
        metadata(r.dynamic_metadata.as_ref()),
        metadata(t.dynamic_metadata.as_ref()),
    );
    push(
        out,
        "raw_body",
        String::from_utf8_lossy(&r.raw_body).into_owned(),
        String::from_utf8_lossy(&t.raw_body).into_owned(),
    );
}

type Header = envoy_types::pb::envoy::config::core::v3::HeaderValue;

/// Headers in order; a header named like a reset may differ by a second.
fn headers(out: &mut Vec<Difference>, field: &str, r: &[Header], t: &[Header]) {
    let same = r.len() == t.len()
        && r.iter().zip(t).all(|(a, b)| {
            a.key == b.key
                && (a.value == b.value
                    || a.key.to_ascii_lowercase().contains("reset")
                        && matches!(
                            (a.value.parse::<u64>(), b.value.parse::<u64>()),
                            (Ok(x), Ok(y)) if x.abs_diff(y) <= 1
                        ))
        });
    if !same {
        push(out, field, header_list(r), header_list(t));
    }
}

fn header_list(headers: &[Header]) -> String {
    let items: Vec<String> = headers
        .iter()
        .map(|h| format!("{}: {}", h.key, h.value))
        .collect();
    format!("[{}]", items.join(", "))
}

fn code(code: i32) -> String {
    Code::try_from(code).map_or_else(|_| format!("code {code}"), |c| c.as_str_name().to_owned())
}

fn limit(limit: Option<&RateLimit>) -> String {
    match limit {
        None => "none".to_owned(),
        Some(l) => {
            let unit = Unit::try_from(l.unit).map_or("?", |u| u.as_str_name());
            let name = if l.name.is_empty() {
                String::new()
            } else {
                format!(" \"{}\"", l.name)
            };
            format!("{}/{unit}{name}", l.requests_per_unit)
        }
    }
}

/// Whole seconds until reset, if given (the reference gives whole seconds).
fn reset(status: &DescriptorStatus) -> Option<i64> {
    status
        .duration_until_reset
        .as_ref()
        .map(|d| d.seconds + i64::from(d.nanos > 0))
}

fn seconds(reset: Option<i64>) -> String {
    reset.map_or_else(|| "none".to_owned(), |s| format!("{s}s"))
}

/// Dynamic metadata as JSON, with the reference's `limit` texts (Go's protobuf text
/// format, which inserts spaces at random) reduced to single spaces, and without
/// `quotaModeEnabled`/`quotaModeViolations`: the pinned reference predates their removal
/// (its #1112), which Tollgate follows.
fn metadata(metadata: Option<&Struct>) -> String {
    metadata.map_or_else(
        || "none".to_owned(),
        |m| {
            let mut value = json(m);
            if let Some(fields) = value.as_object_mut() {
                fields.remove("quotaModeEnabled");
                fields.remove("quotaModeViolations");
            }
            value.to_string()
        },
    )
}

fn json(s: &Struct) -> serde_json::Value {
    let fields = s
        .fields
        .iter()
        .map(|(k, v)| (k.clone(), json_value(k, v)))
        .collect();
    serde_json::Value::Object(fields)
}

fn json_value(key: &str, v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::StringValue(s)) if key == "limit" => {
            serde_json::Value::String(s.split_whitespace().collect::<Vec<_>>().join(" "))
        }
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(|v| json_value(key, v)).collect())
        }
        Some(Kind::StructValue(s)) => json(s),
    }
}

/// An answer on one line: the overall code, each status, headers and metadata if any.
pub fn answer(answer: &Answer) -> String {
    let resp = match answer {
        Err(status) => return format!("error: {:?} {}", status.code(), status.message()),
        Ok(resp) => resp,
    };
    let statuses: Vec<String> = resp.statuses.iter().map(status).collect();
    let mut line = format!("{} [{}]", code(resp.overall_code), statuses.join(" | "));
    if !resp.response_headers_to_add.is_empty() {
        line.push_str(&format!(
            " headers {}",
            header_list(&resp.response_headers_to_add)
        ));
    }
    if resp.dynamic_metadata.is_some() {
        line.push_str(&format!(
            " metadata {}",
            metadata(resp.dynamic_metadata.as_ref())
        ));
    }
    line
}

fn status(s: &DescriptorStatus) -> String {
    let mut line = format!(
        "{} {} remaining {}",
        code(s.code),
        limit(s.current_limit.as_ref()),
        s.limit_remaining
    );
    if let Some(reset) = reset(s) {
        line.push_str(&format!(" reset {reset}s"));
    }
    line
}

/// A request on one line: domain, request-level hits, then each descriptor's entries
/// with its hits, override and sign.
pub fn request(req: &RateLimitRequest) -> String {
    let descriptors: Vec<String> = req
        .descriptors
        .iter()
        .map(|d| {
            let entries: Vec<String> = d
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            let mut line = format!("({})", entries.join(", "));
            if let Some(hits) = &d.hits_addend {
                line.push_str(&format!(" hits {}", hits.value));
            }
            if let Some(l) = &d.limit {
                let unit = Unit::try_from(l.unit).map_or("?", |u| u.as_str_name());
                line.push_str(&format!(" limit {}/{unit}", l.requests_per_unit));
            }
            if d.is_negative_hits {
                line.push_str(" negative");
            }
            line
        })
        .collect();
    format!(
        "domain {} hits_addend {}: {}",
        req.domain,
        req.hits_addend,
        descriptors.join(" ")
    )
}
