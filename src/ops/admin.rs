//! The HTTP port: health for load balancers and orchestrators, `/json` decisions and the
//! `/rlconfig` dump of the loaded rules and where they came from.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};

use crate::api::json;
use crate::app::App;
use crate::ops::admin_state::Admin;
use crate::ops::metrics::top as top_keys;
use crate::ops::{explain, overrides, reset, top, ui};

/// The largest `/json` body: a request at every limit on descriptors, entries and text
/// (64 × 32 × 2 × 4 KiB) would be larger, but such a request is refused anyway, and this
/// bounds what one HTTP/1 connection makes Tollgate buffer.
const JSON_MAX_BODY_BYTES: usize = 256 << 10;

/// The admin routes.
pub(crate) fn router(admin: Admin) -> Router {
    Router::new()
        .route("/healthcheck", get(health))
        .route("/healthcheck/store", get(store_health))
        .route("/metrics", get(metrics))
        .route("/json", post(json::handler))
        .route("/explain", post(explain::handler))
        .route("/counters", delete(reset::handler))
        .route(
            "/overrides",
            put(overrides::http::put)
                .get(overrides::http::get)
                .delete(overrides::http::delete),
        )
        .route("/rlconfig", get(rlconfig))
        .route("/top", get(top::handler))
        .route("/ui", get(ui::handler))
        .layer(DefaultBodyLimit::max(JSON_MAX_BODY_BYTES))
        .with_state(admin)
}

/// 200 "OK"; 500 while draining for shutdown, while the store is down and its failures
/// are errors (`--on-store-error error`), so that traffic goes elsewhere, or while the
/// rules have no domain under HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED.
async fn health(State(admin): State<Admin>) -> (StatusCode, &'static str) {
    if *admin.draining.borrow() {
        (StatusCode::INTERNAL_SERVER_ERROR, "draining")
    } else if !admin.app.status.readiness().healthy {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "no rate limit configuration with a domain loaded",
        )
    } else if !admin.app.limiter.store().can_answer() {
        (StatusCode::INTERNAL_SERVER_ERROR, "store unavailable")
    } else {
        (StatusCode::OK, "OK")
    }
}

/// Prometheus metrics in the Prometheus text format; with the rules' heaviest keys when
/// the operator asked for them (`METRICS_TOP_KEYS`), since the page needs no token and
/// keys name clients.
pub(crate) async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = app.metrics.encode().and_then(|mut text| {
        if app.top_keys_in_metrics {
            top_keys::encode(&app.limiter, &mut text)?;
        }
        Ok(text)
    });
    match text {
        Ok(text) => ([(CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics").into_response(),
    }
}

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// 200 while the counter store answers, 503 while it does not.
async fn store_health(State(app): State<Arc<App>>) -> (StatusCode, &'static str) {
    if app.limiter.store().is_up() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
    }
}

/// Where the rules came from (`#` lines), then the rules, one line per limit.
pub(crate) async fn rlconfig(State(app): State<Arc<App>>) -> String {
    let rules = app.limiter.rules();
    app.status.describe(&rules) + &rules.dump()
}
