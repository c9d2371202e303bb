//! Fuzzing of what comes from outside: rules files, requests over gRPC and `/json`, and
//! the counter keys made of request values. Each target checks invariants beyond "no
//! panic"; the engine that feeds them is the testkit's ([`tollgate_testkit::fuzz`]). The
//! targets live here because the request targets drive the server's own handlers
//! in-process. The test suite runs a short pass of each with a fixed seed. A long run,
//! with a fresh seed and a report of executions per target:
//!
//! ```sh
//! FUZZ_SECONDS=600 cargo test --release --lib fuzz:: -- --nocapture
//! ```

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message as _;
use tollgate_core::headers::HeaderStyle;
use tollgate_core::rules::RulesBuilder;
use tollgate_core::{
    Capacity, Counter, DecideError, Defaults, Limit, Limiter, MemoryStore, Options, Rules, Store,
    SystemClock, Unit,
};

use tollgate_testkit::fuzz::{run, signature};

use crate::api::json;
use crate::app::{App, RlsError};
use crate::config::rules_status::{RulesStatus, Source};
use crate::ops::metrics::Metrics;
use crate::ops::overrides::OverrideRegistry;

const CONFIG_TOKENS: &[&[u8]] = &[
    b"domain: ",
    b"descriptors:\n",
    b"\n  - key: ",
    b"\n    value: ",
    b"\n    rate_limit: {unit: minute, requests_per_unit: 1}",
    b"rate_limit:",
    b"unit: ",
    b"requests_per_unit: ",
    b"unit_multiplier: ",
    b"algorithm: token_bucket",
    b"algorithm: leaky_bucket",
    b"algorithm: fixed_window",
    b"burst: ",
    b"precision: ",
    b"rate_limits:",
    b"unlimited: true",
    b"shadow_mode: true",
    b"quota_mode: true",
    b"budget: true",
    b"detailed_metric: true",
    b"replaces: [{name: x}]",
    b"name: ",
    b"metadata: {a: {b: 1}}",
    b"value_to_metric: true",
    b"*",
    b"&a ",
    b"*a",
    b"<<: ",
    b"!!str ",
    b"!!binary ",
    b"---\n",
    b"...\n",
    b"? ",
    b"{",
    b"[",
    b"\"\\u0000\"",
    b"'",
    b"|\n",
    b">-\n",
    b"#",
    b"\t",
    b"second",
    b"hour",
    b"UNKNOWN",
    b"year",
];

const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"domain\":",
    b"\"descriptors\":",
    b"\"entries\":",
    b"\"key\":",
    b"\"value\":",
    b"\"hitsAddend\":",
    b"\"hits_addend\":",
    b"\"limit\":",
    b"\"requestsPerUnit\":",
    b"\"unit\":",
    b"\"MINUTE\"",
    b"\"UNKNOWN\"",
    b"null",
    b"true",
    b"-0",
    b"1e400",
    b"\"\\ud800\"",
    b"\"\\u0000\"",
    b"\"\\\"\"",
];

/// Protobuf field tags and lengths of `RateLimitRequest` and its messages.
const GRPC_TOKENS: &[&[u8]] = &[
    b"\x0a\x01d",
    b"\x12\x00",
    b"\x12\x0a\x0a\x08\x0a\x01k\x12\x03abc",
    b"\x18\x01",
    b"\x18\xff\xff\xff\xff\x0f",
    b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\x12\x04\x12\x02\x08\x01",
    b"\x1a\x02\x08\x05",
    b"\x22\x02\x08\x01",
    b"\xc3\x28",
    b"\x80\x80\x80\x80\x80",
];

const KEY_TOKENS: &[&[u8]] = &[
    b"\0", b"|", b"=", b"#", b"%", b"%7C", b"%3D", b"%25", b"{", b"}", b"_", b"*", b"\xff",
];

/// Loads the input as a rules file. An accepted file must dump; a rejected one must say
/// where and why, naming the file.
fn check_config(input: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(input);
    let mut builder = RulesBuilder::new(Defaults::default());
    builder.add_yaml("fuzz.yaml", &text);
    match builder.finish() {
        Ok(rules) => {
            let dump = rules.dump();
            Ok(format!(
                "ok: {} domains, {} limits",
                rules.domains().count(),
                dump.lines().count().min(20)
            ))
        }
        Err(problems) => {
            let first = problems.0.first().ok_or("rejected with no problem")?;
            if let Some(p) = problems
                .0
                .iter()
                .find(|p| p.origin != "fuzz.yaml" || p.message.trim().is_empty())
            {
                return Err(format!("problem without file or reason: {p:?}"));
            }
            Ok(signature(&first.path, &first.message))
        }
    }
}

/// The service on `fuzz/rules.yaml`, counters in memory, as the server builds it.
struct Service {
    runtime: tokio::runtime::Runtime,
    app: Arc<App>,
}

impl Service {
    fn new() -> Self {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/rules.yaml");
        let rules = Rules::load(path.as_ref(), Defaults::default()).expect("fuzz/rules.yaml");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        // A small table, so that a long run exercises eviction too.
        let capacity = Capacity {
            counters: 4_096,
            bytes: 1 << 20,
        };
        let store = Store::Memory(MemoryStore::new(capacity, Arc::new(SystemClock)));
        let (metrics, rule_metrics) = Metrics::new(0.8, 16);
        let app = Arc::new(App {
            limiter: Limiter::with_recorder(
                Rules::default(),
                store,
                Options::default(),
                rule_metrics,
            ),
            metrics: Arc::new(metrics),
            headers: HeaderStyle::Reference,
            header_names: Default::default(),
            dynamic_metadata: true,
            status: RulesStatus::new(false),
            overrides: OverrideRegistry::new(0, None, None, false, Default::default()),
            top_keys_in_metrics: false,
        });
        app.install(rules, Source::Files { path: path.into() });
        Self { runtime, app }
    }

    /// The input as a gRPC request body: undecodable, invalid (INVALID_ARGUMENT), or
    /// answered with one status per descriptor.
    fn grpc(&self, input: &[u8]) -> Result<String, String> {
        let Ok(request) = RateLimitRequest::decode(input) else {
            return Ok("undecodable".into());
        };
        match self.runtime.block_on(self.app.should_rate_limit(&request)) {
            Ok(response) if response.statuses.len() == request.descriptors.len() => {
                let codes: Vec<i32> = response.statuses.iter().map(|s| s.code).collect();
                Ok(format!("{}: {codes:?}", response.overall_code))
            }
            Ok(response) => Err(format!(
                "{} statuses for {} descriptors",
                response.statuses.len(),
                request.descriptors.len()
            )),
            Err(RlsError::Decide(DecideError::InvalidArgument(why))) => {
                Ok(signature("invalid", &why.to_string()))
            }
            Err(other) => Err(format!("not a client error: {other}")),
        }
    }

    /// The input as a `/json` body: 400 with a reason, or 200/429 with a JSON answer.
    fn json(&self, input: &[u8]) -> Result<String, String> {
        let response = self.runtime.block_on(json::handler(
            State(self.app.clone()),
            Bytes::copy_from_slice(input),
        ));
        let status = response.status();
        let body = self
            .runtime
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .map_err(|e| format!("unreadable body: {e}"))?;
        match status {
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
                let answer: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| format!("{status} with a body that is not JSON: {e}"))?;
                let overall = answer.get("overallCode").ok_or("no overallCode")?;
                Ok(format!("{status}: {overall}"))
            }
            StatusCode::BAD_REQUEST if !body.is_empty() => {
                Ok(signature("400", &String::from_utf8_lossy(&body)))
            }
            other => Err(format!("{other}: {}", String::from_utf8_lossy(&body))),
        }
    }
}

/// The input as a domain and entries (NUL-separated): the counter key must decode back
/// to exactly them — the encoding is injective — and hold no Redis hash-tag brace.
fn check_counter_keys(input: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(input);
    let mut parts = text.split('\0');
    let domain = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    let entries: Vec<(&str, &str)> = rest
        .chunks(2)
        .map(|pair| (pair[0], pair.get(1).copied().unwrap_or_default()))
        .collect();
    let limit = Limit::new(1, Unit::Minute);
    let counter = Counter::for_limits(domain, entries.iter().copied(), &[limit]);
    let key = counter.key();
    if key.contains(['{', '}']) {
        return Err(format!("a brace in the key {key:?}"));
    }
    let decoded = decode_key(key).ok_or_else(|| format!("undecodable key {key:?}"))?;
    let original = (
        domain.to_owned(),
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<Vec<_>>(),
    );
    if decoded != original {
        return Err(format!("{key:?} decodes to {decoded:?}, not {original:?}"));
    }
    let specials: String = "|=#%{}".chars().filter(|c| text.contains(*c)).collect();
    Ok(format!("{} entries, {specials}", entries.len().min(4)))
}

type Decoded = (String, Vec<(String, String)>);

/// Splits a counter key back into its domain and entries (the inverse of the encoding).
fn decode_key(key: &str) -> Option<Decoded> {
    let (body, _shape) = key.rsplit_once('#')?;
    let mut parts = body.split('|');
    let domain = unescape(parts.next()?)?;
    let entries = parts
        .map(|entry| {
            let (k, v) = entry.split_once('=')?;
            Some((unescape(k)?, unescape(v)?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((domain, entries))
}

fn unescape(text: &str) -> Option<String> {
    if text.contains(['|', '=', '#', '{', '}']) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

#[test]
fn config() {
    run("config", CONFIG_TOKENS, check_config);
}

#[test]
fn grpc() {
    let service = Service::new();
    run("grpc", GRPC_TOKENS, |input| service.grpc(input));
}

#[test]
fn json() {
    let service = Service::new();
    run("json", JSON_TOKENS, |input| service.json(input));
}

#[test]
fn counter_keys() {
    run("keys", KEY_TOKENS, check_counter_keys);
}
