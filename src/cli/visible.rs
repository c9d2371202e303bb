//! Text the commands print but did not write (keys and values clients chose, names from
//! rules, the server's words), made safe for a terminal: every character a terminal would
//! act on, or that reorders or hides what follows, is shown as an escape instead. C0
//! controls and DEL as `\x1b`; C1 controls, bidirectional embeddings, overrides, isolates
//! and marks, zero-width characters and Unicode's line separators as `\u{202e}`; and a
//! backslash as `\\`, so that an escape shown is never one the text spelt itself.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;

/// `text` with every such character escaped; `text` itself when it holds none.
pub(crate) fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            c if u32::from(c) < 0x20 || c == '\x7f' => {
                let _ = write!(out, r"\x{:02x}", u32::from(c));
            }
            c if hidden(c) => {
                let _ = write!(out, r"\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The string `value` holds, [`visible`]; empty when it holds none.
pub(crate) fn shown(value: &Value) -> Cow<'_, str> {
    visible(value.as_str().unwrap_or(""))
}

/// Whether `c` is shown as an escape.
fn hidden(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(
            c,
            '\u{61c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_characters_become_escapes_and_nothing_else_changes() {
        assert!(matches!(visible("ip=10.0.0.1 ünïcødé"), Cow::Borrowed(_)));
        assert_eq!(
            visible("\x1b[2J\x1b[31mFAKE\x00\x07\t\n\x7f"),
            r"\x1b[2J\x1b[31mFAKE\x00\x07\x09\x0a\x7f"
        );
        assert_eq!(visible("\u{85}\u{9b}31m"), r"\u{85}\u{9b}31m");
        assert_eq!(
            visible("a\u{202e}b\u{2066}c\u{2069}\u{200f}\u{61c}\u{202a}"),
            r"a\u{202e}b\u{2066}c\u{2069}\u{200f}\u{61c}\u{202a}"
        );
        assert_eq!(
            visible("zero\u{200b}width\u{feff}\u{2028}"),
            r"zero\u{200b}width\u{feff}\u{2028}"
        );
        assert_eq!(visible(r"C:\x1b"), r"C:\\x1b");
        assert_eq!(shown(&Value::from("\x1b")), r"\x1b");
        assert_eq!(shown(&Value::Null), "");
    }
}
