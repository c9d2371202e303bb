//! The reference's debug port (`DEBUG_PORT`, 6070): `/rlconfig` (the loaded rules),
//! `/stats` (its stats as `name: value` lines, from the same counters as `/metrics`) and an
//! index of both at `/`. The reference's Go profiler endpoints have no equivalent here;
//! `/debug/pprof/` says so rather than answering 404 without a word.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::app::App;
use crate::ops::admin;
use crate::ops::reference_stats;

/// The debug port's routes.
pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(admin::rlconfig))
        .route("/stats", get(stats))
        .route("/debug/pprof/", get(no_profiler))
        .with_state(app)
}

/// What the port serves, one `path: what` line each, as the reference's index.
async fn index() -> &'static str {
    "/debug/pprof/: not available: Tollgate is not a Go program; use perf or the /metrics series\n\
     /rlconfig: print out the currently loaded configuration for debugging\n\
     /stats: print out stats\n"
}

async fn stats(State(app): State<Arc<App>>) -> (StatusCode, String) {
    match app.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            reference_stats::text(&reference_stats::read(&text)),
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot read the metrics\n".into(),
        ),
    }
}

async fn no_profiler() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "no Go profiler here: Tollgate is a Rust program (profile it with perf)\n",
    )
}
