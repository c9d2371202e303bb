//! What an instance publishes of its heavy keys through a shared store, for the fleet's
//! view: a line `%top|INSTANCE`, then one line per entry, `by window domain rule
//! descriptor count error` separated by tabs, fields percent-escaped (`%`, tab, newline).
//! It starts with `%`, as no counter key does, so an instance that does not know it hears
//! a reset of a key no counter has, and does nothing.

use super::{TopBy, TopEntry, TopWindow};

/// The first line's start.
const HEAD: &str = "%top|";
/// The longest snapshot (PostgreSQL's NOTIFY takes under 8000 bytes): the lightest
/// entries are left out past it.
pub(crate) const MAX_BYTES: usize = 7_800;

/// One published entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    pub(crate) by: TopBy,
    pub(crate) window: TopWindow,
    pub(crate) entry: TopEntry,
}

fn by_name(by: TopBy) -> &'static str {
    match by {
        TopBy::Hits => "h",
        TopBy::Denied => "d",
        TopBy::Shadow => "s",
    }
}

fn window_name(window: TopWindow) -> &'static str {
    match window {
        TopWindow::Minute => "m",
        TopWindow::Hour => "h",
    }
}

fn escape(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\t', "%09")
        .replace('\n', "%0A")
}

fn unescape(text: &str) -> String {
    text.replace("%0A", "\n")
        .replace("%09", "\t")
        .replace("%25", "%")
}

/// The snapshot of `instance`, heaviest entries first, at most [`MAX_BYTES`] long.
pub(crate) fn encode(instance: u64, mut entries: Vec<Published>) -> String {
    entries.sort_by_key(|p| std::cmp::Reverse(p.entry.count));
    let mut out = format!("{HEAD}{instance:x}");
    for p in entries {
        let e = &p.entry;
        let line = format!(
            "\n{}\t{}\t{}\t{}\t{}\t{}\t{}",
            by_name(p.by),
            window_name(p.window),
            escape(&e.domain),
            escape(&e.rule),
            escape(&e.descriptor),
            e.count,
            e.error
        );
        if out.len() + line.len() > MAX_BYTES {
            break;
        }
        out.push_str(&line);
    }
    out
}

/// Whether an announcement is a snapshot.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn is_snapshot(announced: &str) -> bool {
    announced.starts_with(HEAD)
}

/// The instance and entries of a snapshot; lines that do not read are skipped.
pub(crate) fn decode(text: &str) -> Option<(u64, Vec<Published>)> {
    let mut lines = text.lines();
    let instance = lines.next()?.strip_prefix(HEAD)?;
    let instance = u64::from_str_radix(instance, 16).ok()?;
    let entries = lines.filter_map(line).collect();
    Some((instance, entries))
}

fn line(line: &str) -> Option<Published> {
    let mut fields = line.split('\t');
    let by = match fields.next()? {
        "h" => TopBy::Hits,
        "d" => TopBy::Denied,
        "s" => TopBy::Shadow,
        _ => return None,
    };
    let window = match fields.next()? {
        "m" => TopWindow::Minute,
        "h" => TopWindow::Hour,
        _ => return None,
    };
    let (domain, rule, descriptor) = (fields.next()?, fields.next()?, fields.next()?);
    let entry = TopEntry {
        domain: unescape(domain),
        rule: unescape(rule),
        descriptor: unescape(descriptor),
        count: fields.next()?.parse().ok()?,
        error: fields.next()?.parse().ok()?,
    };
    Some(Published { by, window, entry })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(descriptor: &str, count: u64) -> Published {
        Published {
            by: TopBy::Denied,
            window: TopWindow::Hour,
            entry: TopEntry {
                domain: "web".into(),
                rule: "ip".into(),
                descriptor: descriptor.into(),
                count,
                error: 2,
            },
        }
    }

    #[test]
    fn a_snapshot_reads_back_heaviest_first() {
        let entries = vec![published("ip=a\tb%", 3), published("ip=c\nd", 7)];
        let text = encode(0xbeef, entries.clone());
        assert_eq!(
            decode(&text),
            Some((0xbeef, vec![entries[1].clone(), entries[0].clone()]))
        );
    }

    #[test]
    fn a_snapshot_stays_under_its_size() {
        let entries = (0..1_000)
            .map(|i| published(&format!("ip={i:0100}"), i))
            .collect();
        let text = encode(1, entries);
        assert!(text.len() <= MAX_BYTES);
        let (_, read) = decode(&text).expect("reads");
        assert_eq!(read.first().map(|p| p.entry.count), Some(999));
    }
}
