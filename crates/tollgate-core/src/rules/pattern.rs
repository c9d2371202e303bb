//! Descriptor values with `*` wildcards: `*` matches any run of characters, even none.

/// A compiled wildcard value, such as `/api/*/users/*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pattern {
    /// The literal pieces between the stars; at least two, since there is a star.
    pieces: Vec<String>,
}

impl Pattern {
    /// Compiles `text` if it holds a `*`; plain values are not patterns.
    pub(super) fn new(text: &str) -> Option<Self> {
        text.contains('*').then(|| Self {
            pieces: text.split('*').map(str::to_owned).collect(),
        })
    }

    pub(super) fn matches(&self, text: &str) -> bool {
        let (Some(first), Some(last)) = (self.pieces.first(), self.pieces.last()) else {
            return false;
        };
        let Some(rest) = text.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some(mut middle) = rest.strip_suffix(last.as_str()) else {
            return false;
        };
        // Matching each inner piece at its leftmost place leaves the most room for the rest,
        // so no backtracking is needed.
        for piece in &self.pieces[1..self.pieces.len() - 1] {
            match middle.find(piece.as_str()) {
                Some(at) => middle = &middle[at + piece.len()..],
                None => return false,
            }
        }
        true
    }
}

/// The pattern as written, stars included.
impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, piece) in self.pieces.iter().enumerate() {
            if i > 0 {
                f.write_str("*")?;
            }
            f.write_str(piece)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Pattern;

    fn matches(pattern: &str, text: &str) -> bool {
        Pattern::new(pattern).is_some_and(|p| p.matches(text))
    }

    #[test]
    fn plain_values_are_not_patterns() {
        assert!(Pattern::new("/api/users").is_none());
    }

    #[test]
    fn star_matches_any_run_anywhere() {
        assert!(matches("*", ""));
        assert!(matches("*", "anything"));
        assert!(matches("/api/*", "/api/"));
        assert!(matches("/api/*", "/api/v1/users"));
        assert!(!matches("/api/*", "/apx/v1"));
        assert!(matches("*.example.com", "a.b.example.com"));
        assert!(matches("a*b*c", "abc"));
        assert!(matches("a*b*c", "a-x-b-y-c"));
        assert!(!matches("a*b*c", "a-x-c-y-b"));
        assert!(matches("a**c", "ac"));
    }

    #[test]
    fn prefix_and_suffix_may_not_overlap() {
        assert!(!matches("ab*b", "ab"));
        assert!(matches("ab*b", "abb"));
        assert!(!matches("a*a", "a"));
    }

    #[test]
    fn multibyte_text_is_matched_on_characters() {
        assert!(matches("é*ü", "éxü"));
        assert!(!matches("é*ü", "eü"));
    }
}
