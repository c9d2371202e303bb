//! The admin token: as a setting, checked at start (never empty, no white space at its
//! ends, no control character: each would be a token some client can send or none can),
//! and as requests carry it, `Authorization: Bearer <ADMIN_TOKEN>`, read the same way
//! over HTTP/1 and HTTP/2 and compared in constant time. `DELETE /counters` and
//! `/overrides` need it; `/top` needs it from beyond loopback; explain needs it to show
//! who set an override.

use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tollgate_core::{Clock as _, LogLimit, SystemClock};

/// What a request's `Authorization` header holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Credentials<'a> {
    /// No such header.
    Absent,
    /// A bearer token, not empty, without the white space around it.
    Bearer(&'a [u8]),
    /// A header that holds no bearer token: why.
    Unreadable(&'static str),
}

/// The `Authorization` header of `headers`. The scheme is matched in any case and the
/// white space around the token is dropped, since HTTP/1 drops it at the value's end and
/// HTTP/2 keeps it; the token is bytes, so that one that is not UTF-8 is simply wrong.
/// Two such headers are unreadable: a proxy may have read the other one.
pub(crate) fn credentials(headers: &HeaderMap) -> Credentials<'_> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Credentials::Absent;
    };
    if values.next().is_some() {
        return Credentials::Unreadable("more than one Authorization header");
    }
    let value = value.as_bytes().trim_ascii();
    let split = value
        .iter()
        .position(|b| matches!(b, b' ' | b'\t'))
        .unwrap_or(value.len());
    let (scheme, token) = value.split_at(split);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Credentials::Unreadable("Authorization is not a Bearer token");
    }
    match token.trim_ascii_start() {
        [] => Credentials::Unreadable("the Bearer token is empty"),
        token => Credentials::Bearer(token),
    }
}

/// Whether `headers` carry `token`; false when the server has none.
pub(crate) fn holds(token: Option<&str>, headers: &HeaderMap) -> bool {
    match (token, credentials(headers)) {
        (Some(token), Credentials::Bearer(given)) => same(given, token.as_bytes()),
        _ => false,
    }
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
/// otherwise: 403 when the server has no token or the token is wrong, 401 when the
/// request carries none.
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
    match credentials(headers) {
        Credentials::Absent => Err((
            StatusCode::UNAUTHORIZED,
            format!("{what} need Authorization: Bearer <ADMIN_TOKEN>\n"),
        )),
        Credentials::Unreadable(why) => Err((
            StatusCode::UNAUTHORIZED,
            format!("{why}: {what} need Authorization: Bearer <ADMIN_TOKEN>\n"),
        )),
        Credentials::Bearer(given) if same(given, token.as_bytes()) => Ok(()),
        Credentials::Bearer(_) => Err((StatusCode::FORBIDDEN, "wrong admin token\n".to_owned())),
    }
}

/// The answer to a refused admin call, logged at warn at most once per `log`'s period
/// (a client may send refused calls by the thousand), with the peer and the reason, never
/// the token given. A 401 carries the `WWW-Authenticate: Bearer` challenge.
pub(crate) fn refuse(log: &LogLimit, peer: &str, status: StatusCode, why: String) -> Response {
    if let Some(held) = log.admit(SystemClock.now()) {
        tracing::warn!(
            %peer,
            "admin call refused: {} ({held} more refused since the last such line)",
            why.trim_end()
        );
    }
    match status {
        StatusCode::UNAUTHORIZED => (status, [(WWW_AUTHENTICATE, "Bearer")], why).into_response(),
        _ => (status, why).into_response(),
    }
}

/// Why the value of a token setting (named inside: `ADMIN_TOKEN`) can be no token, in
/// words that never quote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadToken {
    #[error("{0} is set but empty: give it a token, or unset it")]
    Empty(&'static str),
    #[error(
        "{0} begins or ends with white space (a newline from a file?), which HTTP/1 drops from \
         a header: no client could send it; remove it"
    )]
    WhiteSpace(&'static str),
    #[error("{0} holds a control character, which no HTTP header can carry")]
    Control(&'static str),
}

/// `value` of the token setting `setting` (`ADMIN_TOKEN`), checked.
pub(crate) fn check(setting: &'static str, value: &str) -> Result<(), BadToken> {
    if value.trim().is_empty() {
        return Err(BadToken::Empty(setting));
    }
    if value.trim() != value {
        return Err(BadToken::WhiteSpace(setting));
    }
    if value.chars().any(char::is_control) {
        return Err(BadToken::Control(setting));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn only_the_exact_token_is_the_same() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cret", b"s3creT"));
        assert!(!same(b"s3cret", b"s3cret!"));
        assert!(!same(b"", b"x"));
    }

    fn read(values: &[&[u8]]) -> Credentials<'static> {
        let mut headers = HeaderMap::new();
        for value in values {
            let value = HeaderValue::from_bytes(value).expect("a header value");
            headers.append(AUTHORIZATION, value);
        }
        match credentials(&headers) {
            Credentials::Bearer(token) => Credentials::Bearer(token.to_vec().leak()),
            Credentials::Absent => Credentials::Absent,
            Credentials::Unreadable(why) => Credentials::Unreadable(why),
        }
    }

    #[test]
    fn the_header_is_read_whatever_the_spacing_and_case_of_its_scheme() {
        for value in [
            &b"Bearer s3cret"[..],
            b"bearer s3cret",
            b"BEARER s3cret",
            b"Bearer  s3cret",
            b"Bearer\ts3cret",
            b"Bearer s3cret ",
            b" Bearer s3cret\t",
        ] {
            assert_eq!(read(&[value]), Credentials::Bearer(b"s3cret"), "{value:?}");
        }
        assert_eq!(read(&[b"Bearer \xff"]), Credentials::Bearer(b"\xff"));
        assert_eq!(read(&[]), Credentials::Absent);
        for (value, why) in [
            (&b"Bearer "[..], "the Bearer token is empty"),
            (b"Bearer", "the Bearer token is empty"),
            (b"Bearer \t ", "the Bearer token is empty"),
            (b"", "Authorization is not a Bearer token"),
            (b"Basic czNjcmV0", "Authorization is not a Bearer token"),
            (b"Bearers3cret", "Authorization is not a Bearer token"),
        ] {
            assert_eq!(read(&[value]), Credentials::Unreadable(why), "{value:?}");
        }
        assert_eq!(
            read(&[b"Bearer s3cret", b"Bearer s3cret"]),
            Credentials::Unreadable("more than one Authorization header")
        );
    }

    #[test]
    fn a_token_setting_that_no_client_could_send_is_refused_without_quoting_it() {
        assert_eq!(check("ADMIN_TOKEN", "s3cret"), Ok(()));
        assert_eq!(check("ADMIN_TOKEN", "s3 cr3t"), Ok(()));
        for (bad, why) in [
            ("", "is set but empty"),
            ("  \t", "is set but empty"),
            ("s3cret\n", "begins or ends with white space"),
            (" s3cret", "begins or ends with white space"),
            ("s3\x1bcret", "holds a control character"),
        ] {
            let refused = check("ADMIN_TOKEN", bad).expect_err(bad).to_string();
            assert!(
                refused.starts_with(&format!("ADMIN_TOKEN {why}")),
                "{refused}"
            );
            assert!(
                bad.trim().is_empty() || !refused.contains(bad.trim()),
                "{refused}"
            );
        }
    }
}
