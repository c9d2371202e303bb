//! A body that is not the JSON a route takes, told in our words.

use axum::extract::rejection::JsonRejection;

/// A body that does not parse as `what` (`RateLimitRequest`): `invalid WHAT: PATH:
/// PROBLEM at line L column C`, without axum's generic preamble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {detail}")]
pub(crate) struct InvalidJson {
    what: &'static str,
    detail: String,
}

impl InvalidJson {
    /// Why axum refused the body as `what`.
    pub(crate) fn new(what: &'static str, rejection: &JsonRejection) -> Self {
        let text = rejection.body_text();
        let detail = match text.split_once(": ") {
            Some((preamble, detail)) if preamble.starts_with("Failed to") => detail,
            _ => text.as_str(),
        };
        InvalidJson {
            what,
            detail: in_our_words(detail),
        }
    }
}

/// serde_json names a lone UTF-16 surrogate (`"\ud800"` without its pair) by what it
/// looked for next; a client needs to hear what is wrong with its string.
fn in_our_words(detail: &str) -> String {
    const SURROGATE: &str = "a \\u escape that is half of a UTF-16 surrogate pair, not a character";
    [
        "unexpected end of hex escape",
        "lone leading surrogate in hex escape",
    ]
    .iter()
    .fold(detail.to_owned(), |text, phrase| {
        text.replace(phrase, SURROGATE)
    })
}
