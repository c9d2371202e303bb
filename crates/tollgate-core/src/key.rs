//! Counter keys: one string per (domain, request entries, limit shapes), never shared by two
//! different descriptors.
//!
//! Components are joined with `|`, `=` and `#`, and every byte that could be read as a
//! separator (or as a Redis hash-tag brace) is percent-escaped inside them, so the key can
//! be split back into its components in exactly one way: the encoding is injective.

/// Writes the key of a counter into `out` (cleared first); `shape` is the limits' shape.
pub(crate) fn write_counter_key<'a>(
    out: &mut String,
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    shape: &str,
) {
    out.clear();
    escape_into(out, domain);
    for (key, value) in entries {
        out.push('|');
        escape_into(out, key);
        out.push('=');
        escape_into(out, value);
    }
    out.push('#');
    out.push_str(shape);
}

/// Writes the reference service's key of a descriptor into `out` (cleared first), up to
/// the window: `domain_key1_value1_key2_value2_`. The reference mode's store appends the
/// window's start, as the reference does, so that both count in the same Redis keys. Not
/// injective (the reference's `a` + `b_c` is its `a_b` + `c`): kept only for that mode.
pub(crate) fn write_reference_key<'a>(
    out: &mut String,
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    out.clear();
    out.push_str(domain);
    out.push('_');
    for (key, value) in entries {
        out.push_str(key);
        out.push('_');
        out.push_str(value);
        out.push('_');
    }
}

fn escape_into(out: &mut String, text: &str) {
    // Most values need no escaping: copy runs of plain characters whole.
    let mut plain_from = 0;
    for (i, byte) in text.bytes().enumerate() {
        let code = match byte {
            b'%' => "%25",
            b'|' => "%7C",
            b'=' => "%3D",
            b'#' => "%23",
            b'{' => "%7B",
            b'}' => "%7D",
            _ => continue,
        };
        out.push_str(&text[plain_from..i]);
        out.push_str(code);
        plain_from = i + 1;
    }
    out.push_str(&text[plain_from..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(domain: &str, entries: &[(&str, &str)]) -> String {
        let mut out = String::new();
        write_counter_key(&mut out, domain, entries.iter().copied(), "s60.10");
        out
    }

    #[test]
    fn the_reference_layout_is_the_references() {
        let mut out = String::new();
        write_reference_key(&mut out, "edge", [("foo", "pelle"), ("baz", "shady")]);
        assert_eq!(out, "edge_foo_pelle_baz_shady_");
    }

    #[test]
    fn the_reference_collision_is_two_counters() {
        assert_ne!(key("d", &[("a", "b_c")]), key("d", &[("a_b", "c")]));
    }

    #[test]
    fn separators_inside_values_cannot_forge_another_descriptor() {
        assert_ne!(
            key("d", &[("a", "b|c=d")]),
            key("d", &[("a", "b"), ("c", "d")])
        );
        assert_ne!(key("d|a=b", &[]), key("d", &[("a", "b")]));
        assert_ne!(key("d", &[("a", "b#s60.10")]), key("d", &[("a", "b")]));
        assert_ne!(key("d", &[("a=b", "")]), key("d", &[("a", "=b")]));
    }

    #[test]
    fn keys_are_readable_and_free_of_braces() {
        assert_eq!(key("web", &[("user", "ann")]), "web|user=ann#s60.10");
        let k = key("d", &[("k", "{x}%")]);
        assert_eq!(k, "d|k=%7Bx%7D%25#s60.10");
        assert!(!k.contains('{') && !k.contains('}'));
    }

    #[test]
    fn unicode_and_long_values_are_kept_whole() {
        let long_a = format!("{}a", "x".repeat(4095));
        let long_b = format!("{}b", "x".repeat(4095));
        assert_ne!(key("d", &[("k", &long_a)]), key("d", &[("k", &long_b)]));
        assert_ne!(key("d", &[("k", "é")]), key("d", &[("k", "e\u{301}")]));
    }

    fn descriptor() -> impl Strategy<Value = (String, Vec<(String, String)>)> {
        let text = "[a-c_|=#%{}é]{0,4}";
        (text, prop::collection::vec((text, text), 0..4))
    }

    proptest! {
        #[test]
        fn different_descriptors_never_share_a_key(a in descriptor(), b in descriptor()) {
            let as_refs = |(d, e): &(String, Vec<(String, String)>)| {
                let mut out = String::new();
                write_counter_key(&mut out, d, e.iter().map(|(k, v)| (k.as_str(), v.as_str())), "f1");
                out
            };
            prop_assert_eq!(as_refs(&a) == as_refs(&b), a == b);
        }
    }
}
