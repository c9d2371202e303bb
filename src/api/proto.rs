//! Protobuf ↔ domain, in one place: Envoy's `RateLimitRequest` becomes a core [`Request`]
//! (borrowing its strings), and a core [`Decision`] becomes a `RateLimitResponse`. The gRPC
//! and `/json` adapters both go through here.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ResponseUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{
    Duration as ProtoDuration, ListValue, Struct, Value as ProtoValue,
};
use tollgate_core::headers::{HeaderStyle, headers};
use tollgate_core::rules::{MetaValue, Metadata, merge_metadata};
use tollgate_core::{
    Decision, Descriptor, Entry, Hits, InvalidRequest, LimitOverride, Limited, Outcome, Request,
    Unit,
};

/// The domain request for an Envoy request.
pub(crate) fn request(req: &RateLimitRequest) -> Result<Request<'_>, InvalidRequest> {
    let descriptors = req
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| descriptor(req, i, d))
        .collect::<Result<_, _>>()?;
    Ok(Request::new(req.domain.as_str(), descriptors))
}

fn descriptor<'a>(
    req: &RateLimitRequest,
    index: usize,
    d: &'a RateLimitDescriptor,
) -> Result<Descriptor<'a>, InvalidRequest> {
    let limit = match &d.limit {
        Some(o) => Some(LimitOverride {
            requests_per_unit: o.requests_per_unit,
            unit: request_unit(o.unit).ok_or(InvalidRequest::UnknownUnit {
                descriptor: index,
                unit: o.unit,
            })?,
        }),
        None => None,
    };
    Ok(Descriptor {
        entries: d
            .entries
            .iter()
            .map(|e| Entry {
                key: e.key.as_str().into(),
                value: e.value.as_str().into(),
            })
            .collect(),
        hits: hits(req, d),
        limit,
    })
}

/// The hits a descriptor asks for: its own `hits_addend` if set (0 = check only), else the
/// request's (0 = 1); `is_negative_hits` gives them back instead.
fn hits(req: &RateLimitRequest, d: &RateLimitDescriptor) -> Hits {
    let n = match &d.hits_addend {
        Some(own) => own.value,
        None => u64::from(req.hits_addend.max(1)),
    };
    match (n, d.is_negative_hits) {
        (0, _) => Hits::Check,
        (n, true) => Hits::Refund(n),
        (n, false) => Hits::Consume(n),
    }
}

/// Envoy's response for `decision`, with headers in `style` (the reference's under `names`).
pub(crate) fn response(
    decision: &Decision,
    style: HeaderStyle,
    names: &HeaderNames,
) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(decision.over_limit).into(),
        statuses: decision.descriptors.iter().map(status).collect(),
        response_headers_to_add: headers(style, decision)
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: names.name(key).to_owned(),
                value,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The names of the reference's three headers (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderNames {
    pub(crate) limit: String,
    pub(crate) remaining: String,
    pub(crate) reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

impl HeaderNames {
    /// The configured name of the core's header `name`.
    fn name<'a>(&'a self, name: &'a str) -> &'a str {
        match name {
            "RateLimit-Limit" => &self.limit,
            "RateLimit-Remaining" => &self.remaining,
            "RateLimit-Reset" => &self.reset,
            other => other,
        }
    }
}

/// A limit override in protobuf's text format, as the reference prints it: fields at
/// their default (0, UNKNOWN) left out.
fn limit_text(requests_per_unit: u32, unit: i32) -> String {
    let mut fields = Vec::new();
    if requests_per_unit != 0 {
        fields.push(format!("requests_per_unit:{requests_per_unit}"));
    }
    if unit != 0 {
        let name = RateLimitUnit::try_from(unit)
            .map_or_else(|_| unit.to_string(), |u| u.as_str_name().to_owned());
        fields.push(format!("unit:{name}"));
    }
    fields.join(" ")
}

/// What the reference returns as dynamic metadata: the domain, the request's descriptors
/// (entries, limit override, hits_addend), the request's hits_addend, and the metadata of
/// the matched rules whose descriptors are not over, merged in request order (nested maps
/// merge, the first scalar wins). Envoy stores it under `envoy.filters.http.ratelimit`.
pub(crate) fn dynamic_metadata(req: &RateLimitRequest, decision: &Decision) -> Struct {
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut fields = Fields::default();
            let entries = d
                .entries
                .iter()
                .map(|e| text(format!("{}={}", e.key, e.value)))
                .collect();
            fields.put("entries", list(entries));
            if let Some(limit) = &d.limit {
                fields.put(
                    "limit",
                    text(limit_text(limit.requests_per_unit, limit.unit)),
                );
            }
            if let Some(hits) = &d.hits_addend {
                fields.put("hitsAddend", number(hits.value as f64));
            }
            value(Kind::StructValue(fields.0))
        })
        .collect();
    let mut out = Fields::default();
    out.put("domain", text(req.domain.clone()));
    out.put("descriptors", list(descriptors));
    if req.hits_addend != 0 {
        out.put("hitsAddend", number(f64::from(req.hits_addend)));
    }
    let mut merged = Metadata::new();
    for limited in decision.descriptors.iter().filter_map(Outcome::limited) {
        if let Some(meta) = limited.answered_metadata() {
            merge_metadata(&mut merged, meta);
        }
    }
    if !merged.is_empty() {
        out.put("metadata", value(Kind::StructValue(structure(&merged))));
    }
    out.0
}

/// A protobuf Struct being filled.
#[derive(Default)]
struct Fields(Struct);

impl Fields {
    fn put(&mut self, key: &str, value: ProtoValue) {
        self.0.fields.insert(key.to_owned(), value);
    }
}

fn structure(map: &Metadata) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), meta_value(v)))
            .collect(),
    }
}

fn meta_value(v: &MetaValue) -> ProtoValue {
    match v {
        MetaValue::Null => value(Kind::NullValue(0)),
        MetaValue::Bool(b) => value(Kind::BoolValue(*b)),
        MetaValue::Number(n) => number(*n),
        MetaValue::String(s) => text(s.clone()),
        MetaValue::List(items) => list(items.iter().map(meta_value).collect()),
        MetaValue::Map(map) => value(Kind::StructValue(structure(map))),
    }
}

fn value(kind: Kind) -> ProtoValue {
    ProtoValue { kind: Some(kind) }
}

fn text(s: String) -> ProtoValue {
    value(Kind::StringValue(s))
}

fn number(n: f64) -> ProtoValue {
    value(Kind::NumberValue(n))
}

fn list(values: Vec<ProtoValue>) -> ProtoValue {
    value(Kind::ListValue(ListValue { values }))
}

fn code(over: bool) -> Code {
    if over { Code::OverLimit } else { Code::Ok }
}

fn status(outcome: &Outcome) -> DescriptorStatus {
    match outcome {
        Outcome::NoLimit => DescriptorStatus {
            code: Code::Ok.into(),
            ..Default::default()
        },
        // The reference reports the largest remaining count.
        Outcome::Unlimited => DescriptorStatus {
            code: Code::Ok.into(),
            limit_remaining: u32::MAX,
            ..Default::default()
        },
        Outcome::Limited(limited) => limited_status(limited),
    }
}

fn limited_status(l: &Limited) -> DescriptorStatus {
    DescriptorStatus {
        code: code(l.is_over()).into(),
        current_limit: Some(RateLimit {
            name: l.limit.name().unwrap_or_default().to_owned(),
            requests_per_unit: l.limit.requests_per_unit(),
            unit: response_unit(l.limit.unit()).into(),
        }),
        limit_remaining: u32::try_from(l.remaining).unwrap_or(u32::MAX),
        // Whole seconds, rounded up: Envoy's `x-ratelimit-reset` keeps only the seconds.
        duration_until_reset: Some(ProtoDuration {
            seconds: i64::try_from(l.reset_seconds()).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        ..Default::default()
    }
}

fn request_unit(unit: i32) -> Option<Unit> {
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
        RateLimitUnit::Unknown => None,
    }
}

fn response_unit(unit: Unit) -> ResponseUnit {
    match unit {
        Unit::Second => ResponseUnit::Second,
        Unit::Minute => ResponseUnit::Minute,
        Unit::Hour => ResponseUnit::Hour,
        Unit::Day => ResponseUnit::Day,
        Unit::Week => ResponseUnit::Week,
        Unit::Month => ResponseUnit::Month,
        Unit::Year => ResponseUnit::Year,
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as ProtoEntry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    fn proto(hits_addend: u32, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend,
        }
    }

    fn one(key: &str, value: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![ProtoEntry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn hits_come_from_the_descriptor_else_the_request() {
        let mut own = one("k", "v");
        own.hits_addend = Some(UInt64Value { value: 0 });
        let mut refund = one("k", "v");
        refund.hits_addend = Some(UInt64Value { value: 4 });
        refund.is_negative_hits = true;
        let req = proto(0, vec![one("k", "v"), own, refund]);
        let got: Vec<Hits> = request(&req)
            .expect("valid")
            .descriptors
            .iter()
            .map(|d| d.hits)
            .collect();
        assert_eq!(got, [Hits::Consume(1), Hits::Check, Hits::Refund(4)]);
        let req = proto(3, vec![one("k", "v")]);
        assert_eq!(
            request(&req).expect("valid").descriptors[0].hits,
            Hits::Consume(3)
        );
    }

    #[test]
    fn an_override_with_an_unknown_unit_is_an_invalid_argument() {
        let mut d = one("k", "v");
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: RateLimitUnit::Unknown.into(),
        });
        let err = request(&proto(0, vec![d])).expect_err("unknown unit");
        assert!(err.to_string().contains("unknown unit"), "{err}");
        let mut d = one("k", "v");
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 7,
            unit: RateLimitUnit::Month.into(),
        });
        let req = proto(0, vec![d]);
        let limit = request(&req).expect("valid").descriptors[0].limit;
        assert_eq!(
            limit.map(|l| (l.requests_per_unit, l.unit)),
            Some((7, Unit::Month))
        );
    }

    fn over_or_not(over: bool, meta: Option<tollgate_core::rules::Metadata>) -> Outcome {
        Outcome::Limited(Limited {
            limit: tollgate_core::Limit::new(1, Unit::Minute),
            admitted: !over,
            shadow: false,
            quota: false,
            remaining: 0,
            reset: std::time::Duration::ZERO,
            hits: 1,
            metadata: meta.map(std::sync::Arc::new),
            group_over: false,
            in_flight: None,
        })
    }

    #[test]
    fn dynamic_metadata_merges_the_metadata_of_descriptors_not_over() {
        let meta = |yaml: &str| -> tollgate_core::rules::Metadata {
            serde_json::from_str(yaml).expect("valid JSON")
        };
        let mut with_limit = one("service", "service_2");
        with_limit.limit = Some(RateLimitOverride {
            requests_per_unit: 3,
            unit: RateLimitUnit::Hour.into(),
        });
        with_limit.hits_addend = Some(UInt64Value { value: 0 });
        let req = proto(
            2,
            vec![one("service", "service_1"), with_limit, one("x", "y")],
        );
        let decision = Decision {
            over_limit: false,
            descriptors: vec![
                over_or_not(
                    true,
                    Some(meta(r#"{"service_with_quota": {"name": "service_1"}}"#)),
                ),
                over_or_not(
                    false,
                    Some(meta(
                        r#"{"service_with_quota": {"name": "service_2", "tier": 2}}"#,
                    )),
                ),
                Outcome::NoLimit,
            ],
        };
        let got = crate::api::json::scalars::struct_json(&dynamic_metadata(&req, &decision));
        let expected: serde_json::Value = serde_json::from_str(
            r#"{
                "domain": "d",
                "hitsAddend": 2.0,
                "descriptors": [
                    {"entries": ["service=service_1"]},
                    {"entries": ["service=service_2"],
                     "limit": "requests_per_unit:3 unit:HOUR", "hitsAddend": 0.0},
                    {"entries": ["x=y"]}
                ],
                "metadata": {"service_with_quota": {"name": "service_2", "tier": 2.0}}
            }"#,
        )
        .expect("valid JSON");
        assert_eq!(got, expected);
    }

    #[test]
    fn only_an_in_flight_slot_held_returns_the_metadata_to_release_it_by() {
        let held: tollgate_core::rules::Metadata =
            serde_json::from_str(r#"{"slot": "held"}"#).expect("valid JSON");
        let slot = |hits: u64, confirmed: bool| {
            Outcome::Limited(Limited {
                limit: tollgate_core::Limit::in_flight(2, std::time::Duration::from_secs(60))
                    .expect("a valid in-flight limit"),
                admitted: true,
                shadow: false,
                quota: false,
                remaining: 1,
                reset: std::time::Duration::ZERO,
                hits,
                metadata: Some(std::sync::Arc::new(held.clone())),
                group_over: false,
                in_flight: confirmed.then(tollgate_core::InFlight::default),
            })
        };
        let req = proto(0, vec![one("user", "ann")]);
        // Taken and confirmed by the store; given back (another descriptor over); taken
        // without the store's answer, so holding no slot there.
        for (hits, confirmed, returned) in [(1, true, true), (0, true, false), (1, false, false)] {
            let decision = Decision {
                over_limit: hits == 0,
                descriptors: vec![slot(hits, confirmed)],
            };
            let got = crate::api::json::scalars::struct_json(&dynamic_metadata(&req, &decision));
            assert_eq!(
                got.get("metadata").is_some(),
                returned,
                "{hits} {confirmed}: {got}"
            );
        }
    }

    #[test]
    fn statuses_say_what_the_decision_says() {
        let limit = tollgate_core::Limit::new(10, Unit::Minute).with_name("n");
        let decision = Decision {
            over_limit: true,
            descriptors: vec![
                Outcome::NoLimit,
                Outcome::Unlimited,
                Outcome::Limited(Limited {
                    limit,
                    admitted: false,
                    shadow: false,
                    quota: false,
                    remaining: 0,
                    reset: std::time::Duration::from_millis(1_200),
                    hits: 1,
                    metadata: None,
                    group_over: false,
                    in_flight: None,
                }),
            ],
        };
        let r = response(&decision, HeaderStyle::Reference, &HeaderNames::default());
        assert_eq!(r.overall_code, i32::from(Code::OverLimit));
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[1].limit_remaining, u32::MAX);
        let s = &r.statuses[2];
        assert_eq!(s.code, i32::from(Code::OverLimit));
        assert_eq!(
            s.current_limit,
            Some(RateLimit {
                name: "n".into(),
                requests_per_unit: 10,
                unit: ResponseUnit::Minute.into()
            })
        );
        assert_eq!(s.duration_until_reset.map(|d| d.seconds), Some(2));
        assert_eq!(r.response_headers_to_add.len(), 3);
    }

    #[test]
    fn limit_texts_leave_out_defaults_as_protobuf_text_does() {
        assert_eq!(
            super::limit_text(5, RateLimitUnit::Hour as i32),
            "requests_per_unit:5 unit:HOUR"
        );
        assert_eq!(
            super::limit_text(0, RateLimitUnit::Hour as i32),
            "unit:HOUR"
        );
        assert_eq!(super::limit_text(3, 0), "requests_per_unit:3");
        assert_eq!(super::limit_text(0, 0), "");
    }
}
