//! `POST /explain`: why a request would get its answer, as JSON, counting nothing. The
//! body is the `/json` request; the answer says per descriptor which rule matched (or why
//! none did), the counter's key and state in this process and in the shared store, the
//! lease this instance holds on it, and the decision it would get; before any rules are
//! loaded, the error calls get. Who set an override is shown only to the admin token.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tollgate_core::rules::Policy;
use tollgate_core::{Algorithm, CounterView, Explained, Limit, Matched, Outcome, Request, Rule};

use crate::api::json::{text, with_request};
use crate::app::RlsError;
use crate::ops::admin_state::Admin;
use crate::ops::loopback;
use crate::ops::token::{Credentials, authorize, credentials, refuse};
use crate::ops::unmatched::no_match_reason;

/// What explain shows of an override's source without the admin token: the source
/// names who set it (an admin's address), which is no business of a stranger's.
const HIDDEN_SOURCE: &str = "hidden: shown with Authorization: Bearer <ADMIN_TOKEN>";

/// `POST /explain`: 200 with the explanation, 400 for a body that is not a request.
/// Before the first rules arrive (xDS), the explanation is the error every call gets.
/// Anyone may ask; who set an override is shown only to the admin token, and a request
/// that carries a wrong one is refused as the admin calls refuse it.
pub(crate) async fn handler(
    State(admin): State<Admin>,
    extensions: Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let shows_sources = match credentials(&headers) {
        Credentials::Absent => false,
        _ => match authorize(admin.admin_token.as_deref(), &headers, "override sources") {
            Ok(()) => true,
            Err((status, why)) => {
                let peer = loopback::peer(&extensions);
                return refuse(&admin.refused_resets, &peer, status, why);
            }
        },
    };
    let app = &admin.app;
    with_request(&body, async |request| {
        if !app.status.readiness().loaded {
            return Json(json!({
                "domain": &*request.domain,
                "overallCode": "UNKNOWN",
                "error": RlsError::NoRules.to_string(),
                "descriptors": [],
            }))
            .into_response();
        }
        match app.limiter.explain(request).await {
            Ok(explained) => {
                let descriptors: Vec<Value> = explained
                    .descriptors
                    .iter()
                    .zip(&request.descriptors)
                    .zip(&explained.decision.descriptors)
                    .map(|((e, d), outcome)| {
                        descriptor(request, e, entries(d), outcome, shows_sources)
                    })
                    .collect();
                let overall = if explained.decision.over_limit {
                    "OVER_LIMIT"
                } else {
                    "OK"
                };
                Json(json!({
                    "domain": &*request.domain,
                    "overallCode": overall,
                    "descriptors": descriptors,
                }))
                .into_response()
            }
            Err(why) => text(StatusCode::BAD_REQUEST, why.to_string()),
        }
    })
    .await
}

fn entries(d: &tollgate_core::Descriptor<'_>) -> String {
    d.pairs()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn descriptor(
    req: &Request<'_>,
    e: &Explained,
    entries: String,
    outcome: &Outcome,
    shows_sources: bool,
) -> Value {
    let keys: Vec<&str> = entries
        .split(',')
        .filter_map(|p| p.split_once('=').map(|(k, _)| k))
        .collect();
    let mut out = json!({ "descriptor": entries });
    match &e.matched {
        Matched::Rule { rule, origins } => {
            out["rule"] = rule_json(rule);
            out["rule"]["origins"] = json!(origins);
        }
        Matched::Overridden { rule, by, source } => {
            out["rule"] = rule_json(rule);
            let source = if shows_sources { source } else { HIDDEN_SOURCE };
            out["override"] = json!({ "override": by, "source": source });
        }
        Matched::Replaced(rule) => {
            out["rule"] = rule_json(rule);
            out["replaced"] = json!(true);
        }
        Matched::Override => out["rule"] = json!({ "override": true }),
        Matched::Nothing(why) => {
            out["noRule"] = json!(no_match_reason(&req.domain, &keys.join(","), *why));
        }
    }
    if let (Some(counter), Some(peek)) = (&e.counter, &e.peek) {
        let limits = counter.limits();
        out["key"] = json!(peek.stored_key.as_deref().unwrap_or(counter.key()));
        if let Some(local) = &peek.local {
            out["local"] = view_json(local, limits);
        }
        match &peek.shared {
            Some(Ok(shared)) => out["store"] = view_json(shared, limits),
            Some(Err(why)) => out["storeError"] = json!(why.to_string()),
            None => {}
        }
        if let Some(lease) = &peek.lease {
            out["lease"] = json!({
                "left": lease.left,
                "spendable": lease.spendable,
                "ends": lease.ends.map(seconds),
            });
        }
    }
    out["decision"] = json!(match outcome {
        Outcome::NoLimit => "OK (not limited)",
        Outcome::Unlimited => "OK (unlimited)",
        Outcome::Limited(l) if l.admitted => "OK",
        Outcome::Limited(l) if l.shadow => "OVER_LIMIT (shadow mode: admitted)",
        Outcome::Limited(_) => "OVER_LIMIT",
    });
    out
}

fn rule_json(rule: &Rule) -> Value {
    let names: Vec<&str> = match rule.policy() {
        Policy::Limited { limits, .. } => limits.iter().filter_map(Limit::name).collect(),
        Policy::Unlimited { name } => name.iter().map(String::as_str).collect(),
    };
    json!({
        "domain": rule.domain(),
        "path": rule.path().join("."),
        "names": names,
        "shadowMode": rule.shadow_mode(),
    })
}

fn view_json(view: &CounterView, limits: &[Limit]) -> Value {
    let limits: Vec<Value> = view
        .limits
        .iter()
        .zip(limits)
        .map(|(v, limit)| {
            if limit.algorithm() == Algorithm::Slots {
                return json!({
                    "inFlight": limit.requests_per_unit(),
                    "expireAfter": seconds(limit.window()),
                    "slotsHeld": v.count,
                    "remaining": v.remaining,
                    "reset": seconds(v.reset),
                });
            }
            json!({
                "limit": format!("{}/{}", limit.requests_per_unit(), limit.unit().as_str()),
                "window": seconds(limit.window()),
                "count": v.count,
                "remaining": v.remaining,
                "reset": seconds(v.reset),
            })
        })
        .collect();
    json!({ "held": view.held, "limits": limits })
}

/// A duration as protojson writes it: seconds with a trailing `s`.
fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
