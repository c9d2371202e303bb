//! `PUT`, `GET` and `DELETE /overrides` on the HTTP port, guarded by `ADMIN_TOKEN` as
//! counter resets are: 401 without it, 403 with a wrong one or with no token set.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tollgate_core::Clock as _;
use tollgate_core::SystemClock;
use tollgate_core::overrides::{Override, OverrideEntry};

use super::Refused;
use crate::api::json::{InvalidJson, reason, text};
use crate::ops::admin_state::Admin;
use crate::ops::loopback;
use crate::ops::token::{authorize, refuse};

/// What `DELETE /overrides` names: one overridden descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Descriptor {
    domain: String,
    entries: Vec<OverrideEntry>,
}

/// `PUT /overrides`: 200 with the override set and the one it replaced.
pub(crate) async fn put(
    State(admin): State<Admin>,
    extensions: Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let who = match guard(&admin, &extensions, &headers) {
        Ok(who) => who,
        Err(refusal) => return *refusal,
    };
    let spec = match parse_override(&body) {
        Ok(spec) => spec,
        Err(why) => return text(StatusCode::BAD_REQUEST, why.to_string()),
    };
    let now_seconds = SystemClock.now().as_nanos() / tollgate_core::NANOS_PER_SECOND;
    if spec.expires_at.is_some_and(|at| at <= now_seconds) {
        let why = format!(
            "expires_at: {} is not in the future (now {now_seconds})",
            spec.expires_at.unwrap_or_default()
        );
        return text(StatusCode::BAD_REQUEST, why);
    }
    let registry = &admin.app.overrides;
    match registry.set(&admin.app.limiter, spec.clone(), &who).await {
        Ok(replaced) => Json(json!({ "set": spec, "replaced": replaced })).into_response(),
        Err(refused) => refusal(refused),
    }
}

/// `GET /overrides?domain=&cursor=&limit=`: a page of the overrides (of one domain when
/// named), with their source, and the cursor of the next page when there is one.
pub(crate) async fn get(
    State(admin): State<Admin>,
    extensions: Extensions,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(refusal) = guard(&admin, &extensions, &headers) {
        return *refusal;
    }
    let query: HashMap<String, String> =
        form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    if let Some(unknown) = query
        .keys()
        .find(|k| !["domain", "cursor", "limit"].contains(&k.as_str()))
    {
        return text(
            StatusCode::BAD_REQUEST,
            format!("{unknown}: unknown parameter (only domain, cursor and limit)"),
        );
    }
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => PAGE,
        Some(Ok(limit)) if (1..=MAX_PAGE).contains(&limit) => limit,
        Some(_) => {
            let why = format!("limit: a whole number from 1 to {MAX_PAGE}");
            return text(StatusCode::BAD_REQUEST, why);
        }
    };
    let all = match admin.app.overrides.all(&admin.app.limiter) {
        Ok(all) => all,
        Err(refused) => return refusal(refused),
    };
    let page = all.page(
        query.get("domain").map(String::as_str),
        query.get("cursor").map(String::as_str),
        limit,
        SystemClock.now(),
    );
    let mut next = page.next;
    let mut listed = Vec::new();
    let mut bytes = 0;
    for (i, o) in page.overrides.iter().enumerate() {
        let item = json!({ "override": o.spec(), "source": o.source() });
        bytes += item.to_string().len();
        listed.push(item);
        // A page of huge overrides ends early, so that every answer stays small.
        if bytes > PAGE_BYTES && i + 1 < page.overrides.len() {
            next = Some(o.spec().id());
            break;
        }
    }
    let kept_in = admin.app.overrides.kept_in();
    let mut answer = json!({ "overrides": listed, "keptIn": kept_in });
    if let Some(next) = next {
        answer["next"] = Value::String(next);
    }
    Json(answer).into_response()
}

/// `DELETE /overrides`: 200 with the override removed, 404 when there was none.
pub(crate) async fn delete(
    State(admin): State<Admin>,
    extensions: Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let who = match guard(&admin, &extensions, &headers) {
        Ok(who) => who,
        Err(refusal) => return *refusal,
    };
    let named = match Json::<Descriptor>::from_bytes(&body) {
        Ok(Json(named)) => named,
        Err(e) => return text(StatusCode::BAD_REQUEST, reason("descriptor", &e)),
    };
    let registry = &admin.app.overrides;
    match registry
        .delete(&admin.app.limiter, &named.domain, &named.entries, &who)
        .await
    {
        Ok(removed) => Json(json!({ "deleted": removed })).into_response(),
        Err(refused) => refusal(refused),
    }
}

/// Overrides on a page unless the query says otherwise.
const PAGE: usize = 1_000;
/// The most a query may ask for.
const MAX_PAGE: usize = 10_000;
/// About the most JSON on one page: past it, the page ends.
const PAGE_BYTES: usize = 1 << 20;

/// The caller's address when the token is right; the refusal otherwise (logged at most
/// once a period, as refused resets are).
fn guard(
    admin: &Admin,
    extensions: &Extensions,
    headers: &HeaderMap,
) -> Result<String, Box<Response>> {
    let peer = loopback::peer(extensions);
    let Err((status, why)) = authorize(admin.admin_token.as_deref(), headers, "overrides") else {
        return Ok(peer);
    };
    Err(Box::new(refuse(&admin.refused_resets, &peer, status, why)))
}

/// The override in `body`; a refusal naming the field and the problem. A limit is read
/// as any JSON number first, so that a negative or absurd one is told as such.
fn parse_override(body: &[u8]) -> Result<Override, BadOverride> {
    let value: Value = match Json::<Value>::from_bytes(body) {
        Ok(Json(value)) => value,
        Err(e) => return Err(InvalidJson::new("override", &e).into()),
    };
    if let Some(n) = value
        .pointer("/limit/requests_per_unit")
        .filter(|n| n.is_number())
    {
        let whole = n.as_u64().and_then(|n| u32::try_from(n).ok());
        match (whole, n.as_f64()) {
            (Some(_), _) => {}
            (None, Some(f)) if f < 0.0 => return Err(BadOverride::Negative(n.to_string())),
            (None, _) => return Err(BadOverride::NotWhole(n.to_string())),
        }
    }
    Ok(Json::<Override>::from_bytes(body)
        .map(|Json(spec)| spec)
        .map_err(|e| InvalidJson::new("override", &e))?)
}

/// Why a PUT's body is no override.
#[derive(Debug, thiserror::Error)]
enum BadOverride {
    /// Not the JSON of an override.
    #[error(transparent)]
    Json(#[from] InvalidJson),
    /// A limit below zero.
    #[error("limit.requests_per_unit: must not be negative (got {0})")]
    Negative(String),
    /// A limit that is no whole number of 32 bits.
    #[error("limit.requests_per_unit: must be a whole number up to {max} (got {0})", max = u32::MAX)]
    NotWhole(String),
}

fn refusal(refused: Refused) -> Response {
    let status = match &refused {
        Refused::Invalid(_) => StatusCode::BAD_REQUEST,
        Refused::Off(_) => StatusCode::FORBIDDEN,
        Refused::Missing => StatusCode::NOT_FOUND,
        Refused::Keep(_) => StatusCode::SERVICE_UNAVAILABLE,
        Refused::Unknown(_) => StatusCode::GATEWAY_TIMEOUT,
    };
    text(status, refused.to_string())
}
