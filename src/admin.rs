//! The HTTP port: health for load balancers and orchestrators.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::service::Service;

/// The admin routes.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/healthcheck", get(|| async { "OK" }))
        .route("/healthcheck/store", get(store_health))
        .with_state(service)
}

/// 200 while the counter store answers, 503 while it does not.
async fn store_health(State(service): State<Arc<Service>>) -> (StatusCode, &'static str) {
    if service.store().is_up() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
    }
}
