//! `OVERRIDES_FILE`: the overrides of a memory store kept across restarts, as a log of
//! changes, one JSON object a line: `{"set": override}` or `{"deleted": descriptor}`. A
//! change appends its lines and syncs them, never rewriting the rest; the log is written
//! whole (the live set, to a file beside it, synced, then renamed over it, so that a
//! crash leaves the old file or the new one) once it holds more than twice as many lines
//! as overrides, plus [`SLACK`].
//!
//! A file holding one JSON list (earlier versions' form, or written by hand) is read as
//! that list, which must not name a descriptor twice, and becomes a log at the first
//! change. The last line, unended, is one a crash cut short: dropped with a warning (its
//! change was never answered). Expired overrides are dropped as the file is read; more
//! than `OVERRIDES_MAX` left refuse the start.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tollgate_core::Timestamp;
use tollgate_core::overrides::{Override, OverrideEntry};

/// The largest file read: 100,000 overrides of a few hundred bytes each, with room.
const MAX_FILE_BYTES: u64 = 256 << 20;
/// Lines a log may hold past twice its overrides before it is written whole.
const SLACK: usize = 1_000;

/// One line of the log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum Record {
    /// The override of a descriptor set (or replaced).
    Set(Override),
    /// The override of a descriptor deleted.
    Deleted(Descriptor),
}

/// A descriptor whose override was deleted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Descriptor {
    domain: String,
    entries: Vec<OverrideEntry>,
}

impl Record {
    /// The delete of `o`'s override.
    pub(super) fn deleted(o: &Override) -> Self {
        Self::Deleted(Descriptor {
            domain: o.domain.clone(),
            entries: o.entries.clone(),
        })
    }
}

/// The log as this process keeps appending to it.
#[derive(Debug)]
pub(super) struct Log {
    path: PathBuf,
    /// Open for appending once a change has been appended.
    file: Option<std::fs::File>,
    /// Lines in the file.
    lines: usize,
    /// Whether the next change writes the file whole: it is a list, it ends in a torn
    /// line, or an append failed half-way.
    whole: bool,
}

impl Log {
    /// The log at `path` and the overrides it holds at `now` (none when it does not exist
    /// yet); refused when they are more than `max`, or a list names a descriptor twice.
    pub(super) fn open(
        path: &Path,
        max: usize,
        now: Timestamp,
    ) -> anyhow::Result<(Self, Vec<Override>)> {
        let text = match std::fs::File::open(path) {
            Ok(file) => {
                let mut text = String::new();
                std::io::Read::read_to_string(
                    &mut std::io::Read::take(file, MAX_FILE_BYTES),
                    &mut text,
                )
                .with_context(|| format!("cannot read {}", path.display()))?;
                text
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let (overrides, lines, whole) = if text.trim_start().starts_with('[') {
            (read_list(path, &text)?, 0, true)
        } else {
            read_log(path, &text)?
        };
        let live: Vec<Override> = overrides
            .into_values()
            .filter(|o| !o.expired(now))
            .collect();
        if live.len() > max {
            anyhow::bail!(
                "{}: holds more than {max} overrides (OVERRIDES_MAX): {}",
                path.display(),
                live.len()
            );
        }
        let log = Self {
            path: path.to_owned(),
            file: None,
            lines,
            whole,
        };
        Ok((log, live))
    }

    /// The log behind `shared`, whatever a panic while it was held left.
    pub(super) fn lock(shared: &std::sync::Mutex<Self>) -> std::sync::MutexGuard<'_, Self> {
        shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether appending `records` more writes the file whole (and needs the live set).
    pub(super) fn wants_whole(&self, records: usize, count: usize) -> bool {
        self.whole || self.lines.saturating_add(records) > count.saturating_mul(2) + SLACK
    }

    /// Appends `records`, synced; or, when [`Log::wants_whole`], writes `live` (the
    /// `count` overrides they make) whole instead. On failure the file is as before, or
    /// written whole by the next change.
    pub(super) fn append(
        &mut self,
        records: &[Record],
        live: &[Override],
        count: usize,
    ) -> anyhow::Result<()> {
        if self.wants_whole(records.len(), count) {
            return self.write_whole(live);
        }
        let mut text = Vec::new();
        for record in records {
            serde_json::to_writer(&mut text, record)?;
            text.push(b'\n');
        }
        let appended = (|| {
            if self.file.is_none() {
                self.file = Some(
                    std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(&self.path)?,
                );
            }
            let file = self.file.as_mut().ok_or(std::io::ErrorKind::NotFound)?;
            let before = file.metadata()?.len();
            let written = file.write_all(&text).and_then(|()| file.sync_data());
            if written.is_err() {
                // Nothing of a change refused may stay.
                let _ = file.set_len(before).and_then(|()| file.sync_data());
            }
            written
        })();
        match appended {
            Ok(()) => {
                self.lines += records.len();
                Ok(())
            }
            Err(e) => {
                self.whole = true;
                self.file = None;
                Err(e).with_context(|| format!("cannot append to {}", self.path.display()))
            }
        }
    }

    /// Replaces the file with `live` as a log of sets.
    fn write_whole(&mut self, live: &[Override]) -> anyhow::Result<()> {
        let mut tmp_name = self.path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        let mut text = Vec::new();
        for o in live {
            serde_json::to_writer(&mut text, &Record::Set(o.clone()))?;
            text.push(b'\n');
        }
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&text)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.with_context(|| format!("cannot replace {}", self.path.display()))?;
        self.file = None;
        self.lines = live.len();
        self.whole = false;
        Ok(())
    }
}

/// The overrides of a list, by id; a descriptor twice is refused.
fn read_list(path: &Path, text: &str) -> anyhow::Result<BTreeMap<String, Override>> {
    let list: Vec<Override> = serde_json::from_str(text)
        .with_context(|| format!("{} is not a list of overrides", path.display()))?;
    let mut overrides = BTreeMap::new();
    for (i, o) in list.into_iter().enumerate() {
        let described = format!("{} {}", o.domain, super::entries(&o.entries));
        if overrides.insert(o.id(), o).is_some() {
            anyhow::bail!(
                "{}: override {i}: {described} is overridden twice",
                path.display()
            );
        }
    }
    Ok(overrides)
}

/// The overrides a log leaves, by id; its complete lines; whether it ends torn.
type Replayed = (BTreeMap<String, Override>, usize, bool);

/// Replays a log.
fn read_log(path: &Path, text: &str) -> anyhow::Result<Replayed> {
    let mut overrides = BTreeMap::new();
    let mut lines = 0;
    let mut torn = false;
    let mut rest = text;
    let mut number = 0;
    while !rest.is_empty() {
        number += 1;
        let (line, ended) = match rest.split_once('\n') {
            Some((line, after)) => {
                rest = after;
                (line, true)
            }
            None => (std::mem::take(&mut rest), false),
        };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(line) {
            Ok(Record::Set(o)) => {
                overrides.insert(o.id(), o);
            }
            Ok(Record::Deleted(d)) => {
                let pairs = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
                overrides.remove(&tollgate_core::overrides::descriptor_id(&d.domain, pairs));
            }
            Err(_) if !ended => {
                tracing::warn!(
                    "{}: line {number} cut short (a crash while it was written): dropped",
                    path.display()
                );
                torn = true;
                continue;
            }
            Err(e) => anyhow::bail!(
                "{}: line {number}: not an override's change: {e}",
                path.display()
            ),
        }
        lines += 1;
    }
    Ok((overrides, lines, torn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::overrides::tests::acme;

    #[test]
    fn changes_append_and_read_back_and_a_torn_line_is_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("overrides.json");
        let (mut log, none) = Log::open(&path, 10, Timestamp::default()).expect("missing");
        assert!(none.is_empty());
        let o = acme();
        log.append(&[Record::Set(o.clone())], &[], 1)
            .expect("appends");
        let mut other = acme();
        other.entries[0].value = "zeta".into();
        log.append(&[Record::Set(other.clone())], &[], 2)
            .expect("appends");
        log.append(&[Record::deleted(&o)], &[], 1).expect("appends");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 3, "appended, not rewritten: {text}");
        std::fs::write(&path, format!("{text}{{\"set\":{{\"dom")).expect("tear");
        let (log, read) = Log::open(&path, 10, Timestamp::default()).expect("reads");
        assert_eq!(read, vec![other]);
        assert!(log.whole, "the torn line is gone at the next change");
    }

    #[test]
    fn a_list_is_read_and_a_bad_line_refused_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("overrides.json");
        let list = serde_json::to_string(&vec![acme()]).expect("JSON");
        std::fs::write(&path, list).expect("write");
        let (log, read) = Log::open(&path, 10, Timestamp::default()).expect("reads");
        assert_eq!(read, vec![acme()]);
        assert!(log.whole, "a list becomes a log at the first change");
        std::fs::write(&path, "{\"set\":{}}\n{}\n").expect("write");
        let e = Log::open(&path, 10, Timestamp::default()).expect_err("refused");
        assert!(format!("{e:#}").contains("line 1"), "{e:#}");
    }
}
