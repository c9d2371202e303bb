//! A descriptor's entries read back from its counter key, for people to read.

/// The entries of counter `key` as `k=v,k2=v2`. Tollgate's keys are `domain|k=v|k2=v2#shape`
/// with separators percent-escaped inside components, so the first `|` and the first `#`
/// are separators. A key in the reference's layout has no such structure and is returned
/// whole.
pub(crate) fn descriptor_of(key: &str) -> String {
    let (Some(start), Some(end)) = (key.find('|'), key.find('#')) else {
        return key.to_owned();
    };
    let Some(entries) = key.get(start + 1..end) else {
        return key.to_owned();
    };
    let mut out = String::with_capacity(entries.len());
    for (i, entry) in entries.split('|').enumerate() {
        if i > 0 {
            out.push(',');
        }
        unescape_into(&mut out, entry);
    }
    out
}

/// Undoes the key's percent-escapes (`%25 %7C %3D %23 %7B %7D`) and no others.
fn unescape_into(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3).unwrap_or("");
        let plain = match code {
            "%25" => "%",
            "%7C" => "|",
            "%3D" => "=",
            "%23" => "#",
            "%7B" => "{",
            "%7D" => "}",
            _ => {
                out.push('%');
                rest = &rest[at + 1..];
                continue;
            }
        };
        out.push_str(plain);
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::write_counter_key;

    #[test]
    fn entries_come_back_from_the_key() {
        let mut key = String::new();
        write_counter_key(&mut key, "web", [("ip", "a|b=%"), ("path", "/x")], "s60.10");
        assert_eq!(descriptor_of(&key), "ip=a|b=%,path=/x");
    }

    #[test]
    fn a_reference_key_is_shown_whole() {
        assert_eq!(descriptor_of("web_ip_a_"), "web_ip_a_");
    }
}
