//! The HTTP port: health for load balancers and orchestrators.

use axum::Router;
use axum::routing::get;

/// The admin routes.
pub fn router() -> Router {
    Router::new().route("/healthcheck", get(|| async { "OK" }))
}
