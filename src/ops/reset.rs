//! `DELETE /counters`: the counters a request names set back to empty, in the store and
//! in every instance's local view. Allowed only with `Authorization: Bearer <ADMIN_TOKEN>`
//! (compared in constant time); with no ADMIN_TOKEN set, resets are off. Every reset is
//! logged at info with what and from where; refusals at most once a period, since a
//! client may send them by the thousand.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tollgate_core::DecideError;

use crate::api::json::{text, with_request};
use crate::ops::admin_state::Admin;
use crate::ops::loopback;
use crate::ops::token::{authorize, refuse};

/// At most one log line of refused resets per this period.
pub(crate) const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// `DELETE /counters`: 200 with the keys reset; 401 without a token, 403 with a wrong
/// one or with resets off; 400 for a bad body; 503 when the store failed.
pub(crate) async fn handler(
    State(admin): State<Admin>,
    extensions: Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let peer = loopback::peer(&extensions);
    if let Err((status, why)) = authorize(admin.admin_token.as_deref(), &headers, "counter resets")
    {
        return refuse(&admin.refused_resets, &peer, status, why);
    }
    with_request(&body, async |request| {
        match admin.app.limiter.reset(request).await {
            Ok(keys) => {
                let descriptors: Vec<String> = request
                    .descriptors
                    .iter()
                    .map(|d| {
                        let pairs: Vec<String> =
                            d.pairs().map(|(k, v)| format!("{k}={v}")).collect();
                        pairs.join(",")
                    })
                    .collect();
                tracing::info!(
                    %peer,
                    domain = %request.domain,
                    descriptors = ?descriptors,
                    keys = ?keys,
                    "counters reset"
                );
                Json(json!({ "reset": keys })).into_response()
            }
            Err(DecideError::InvalidArgument(why)) => {
                text(StatusCode::BAD_REQUEST, why.to_string())
            }
            Err(DecideError::Store(e)) => {
                text(StatusCode::SERVICE_UNAVAILABLE, admin.app.store_error(&e))
            }
        }
    })
    .await
}
