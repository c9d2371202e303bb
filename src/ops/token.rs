//! The admin token as requests carry it: `Authorization: Bearer <ADMIN_TOKEN>`, compared
//! in constant time. `DELETE /counters` and changes to `/overrides` need it; `/top` needs
//! it from beyond loopback.

use std::sync::Arc;

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};

/// The server's admin token, for handlers to take as state; none: nothing needs one.
#[derive(Debug, Clone)]
pub(crate) struct AdminToken(pub(crate) Option<Arc<str>>);

/// The token of an `Authorization: Bearer` header.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Equality that takes the same time wherever the first difference is, so that a
/// client cannot learn the token a byte at a time from how fast it is refused.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let differ = a
        .iter()
        .zip(b)
        .fold(u8::from(a.len() != b.len()), |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(differ) == 0
}

/// Whether the request carries the admin token; the refusal of `what` (`counter resets`)
/// otherwise.
pub(crate) fn authorize(
    token: Option<&str>,
    headers: &HeaderMap,
    what: &str,
) -> Result<(), (StatusCode, String)> {
    let Some(token) = token else {
        return Err((
            StatusCode::FORBIDDEN,
            format!("{what} are off: the server has no ADMIN_TOKEN\n"),
        ));
    };
    match bearer(headers) {
        None => Err((
            StatusCode::UNAUTHORIZED,
            format!("{what} need Authorization: Bearer <ADMIN_TOKEN>\n"),
        )),
        Some(given) if same(given.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err((StatusCode::FORBIDDEN, "wrong admin token\n".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_is_the_same() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cret", b"s3creT"));
        assert!(!same(b"s3cret", b"s3cret!"));
        assert!(!same(b"", b"x"));
    }
}
