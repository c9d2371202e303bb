//! What an instance publishes of its heavy keys through a shared store, for the fleet's
//! view: a line `%top|INSTANCE`, then one line per entry, `by window domain rule
//! descriptor count error` separated by tabs, fields percent-escaped (`%`, tab, newline).
//! It starts with `%`, as no counter key does, so an instance that does not know it hears
//! a reset of a key no counter has, and does nothing.
//!
//! Anyone who can publish on the store can publish a snapshot, so one heard is believed
//! only within what an instance sends ([`receive`]): past [`MAX_BYTES`] or
//! [`MAX_ENTRIES`] it is dropped whole, and an entry whose count no instance could reach
//! in its window is left out.

use super::{TopBy, TopEntry, TopWindow};

/// The first line's start.
const HEAD: &str = "%top|";
/// The longest snapshot (PostgreSQL's NOTIFY takes under 8000 bytes): the lightest
/// entries are left out past it.
pub(crate) const MAX_BYTES: usize = 7_800;
/// The most entries of a snapshot: the lightest are left out past it.
pub(crate) const MAX_ENTRIES: usize = 400;
/// Descriptors one instance could decide in a second: ten thousand times what one
/// decides on two cores (docs/BENCHMARKS.md). A count past it over its window is no
/// instance's.
#[cfg(any(feature = "redis", feature = "postgres"))]
const PLAUSIBLE_PER_SECOND: u64 = 1_000_000_000;

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

/// The snapshot of `instance`, heaviest entries first, at most [`MAX_BYTES`] long and
/// [`MAX_ENTRIES`] entries.
pub(crate) fn encode(instance: u64, mut entries: Vec<Published>) -> String {
    entries.sort_by_key(|p| std::cmp::Reverse(p.entry.count));
    let mut out = format!("{HEAD}{instance:x}");
    for p in entries.into_iter().take(MAX_ENTRIES) {
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

/// A snapshot heard from the store, as far as it is believed.
#[cfg(any(feature = "redis", feature = "postgres"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Received {
    /// Its instance and plausible entries, and how many entries were left out as no
    /// instance's.
    Kept {
        instance: u64,
        entries: Vec<Published>,
        implausible: usize,
    },
    /// Longer than [`MAX_BYTES`] or with more than [`MAX_ENTRIES`] entries: no instance
    /// sends it.
    Oversized,
    /// No snapshot's first line.
    Unreadable,
}

/// What of a snapshot heard is believed (see the module's documentation).
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn receive(text: &str) -> Received {
    if text.len() > MAX_BYTES || text.lines().count() > MAX_ENTRIES + 1 {
        return Received::Oversized;
    }
    let Some((instance, entries)) = decode(text) else {
        return Received::Unreadable;
    };
    let read = entries.len();
    let entries: Vec<Published> = entries.into_iter().filter(plausible).collect();
    Received::Kept {
        instance,
        implausible: read - entries.len(),
        entries,
    }
}

/// Whether an entry's count is one an instance could reach in its window, and its
/// error within its count (as every sketch's is).
#[cfg(any(feature = "redis", feature = "postgres"))]
fn plausible(p: &Published) -> bool {
    let seconds = match p.window {
        TopWindow::Minute => 60,
        TopWindow::Hour => 3_600,
    };
    p.entry.count <= seconds * PLAUSIBLE_PER_SECOND && p.entry.error <= p.entry.count
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

    /// What no instance sends is not believed: a snapshot past the size or the entries an
    /// instance sends is dropped whole, and counts past what an instance could reach in
    /// their window, or errors past their counts, are left out.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    #[test]
    fn a_snapshot_heard_is_believed_within_what_instances_send() {
        let honest = encode(7, vec![published("ip=a", 3)]);
        assert_eq!(
            receive(&honest),
            Received::Kept {
                instance: 7,
                entries: vec![published("ip=a", 3)],
                implausible: 0
            }
        );
        let big = format!("{honest}\n{}", "x".repeat(MAX_BYTES));
        assert_eq!(receive(&big), Received::Oversized);
        let many = format!(
            "{HEAD}7{}",
            "\nd\th\tw\tr\tk=v\t1\t0".repeat(MAX_ENTRIES + 1)
        );
        assert!(many.len() < MAX_BYTES);
        assert_eq!(receive(&many), Received::Oversized);
        assert_eq!(receive("%top|zz"), Received::Unreadable);

        let hour = 3_600 * PLAUSIBLE_PER_SECOND;
        let mut most = published("ip=most", hour);
        most.entry.error = hour;
        let mut minute = published("ip=minute", hour);
        minute.window = TopWindow::Minute;
        let mut wrong_error = published("ip=error", 5);
        wrong_error.entry.error = 6;
        let text = encode(
            7,
            vec![
                most.clone(),
                published("ip=max", u64::MAX),
                minute,
                wrong_error,
            ],
        );
        assert_eq!(
            receive(&text),
            Received::Kept {
                instance: 7,
                entries: vec![most],
                implausible: 3
            }
        );
    }

    #[test]
    fn a_snapshot_keeps_its_heaviest_entries_up_to_their_number() {
        // Entries short enough that their number, not the size, is the bound.
        let short = |count| {
            let mut p = published("a", count);
            p.entry.domain = "w".into();
            p.entry.rule = "i".into();
            p
        };
        let entries = (0..1_000).map(short).collect();
        let (_, read) = decode(&encode(1, entries)).expect("reads");
        assert_eq!(read.len(), MAX_ENTRIES);
        assert_eq!(read.last().map(|p| p.entry.count), Some(600));
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
