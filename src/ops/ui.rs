//! `GET /ui`: one page to look at, served from the binary (`ui.html`, plain HTML and
//! JavaScript): the rules as a tree, the top keys refreshed every two seconds, the store's
//! health and counter calls, and an explain form. The page holds no data itself: it asks
//! `/top`, which answers loopback requests (peer and Host) or the admin token the page is
//! given.

use axum::http::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::IntoResponse;

/// The page.
const PAGE: &str = include_str!("ui.html");

/// Nothing but this server: no script, style or fetch from elsewhere.
const POLICY: &str = "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; \
                      style-src 'unsafe-inline'; form-action 'none'";

pub(crate) async fn handler() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CONTENT_SECURITY_POLICY, POLICY),
        ],
        PAGE,
    )
}
