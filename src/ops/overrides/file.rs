//! `OVERRIDES_FILE`: the overrides of a memory store kept across restarts, as a JSON list,
//! replaced atomically (a temporary file beside it, synced, then renamed over it) so that
//! a crash leaves the old list or the new one, never half of one.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use tollgate_core::overrides::Override;

/// The largest file read: 100,000 overrides of a few hundred bytes each.
const MAX_FILE_BYTES: u64 = 256 << 20;

/// The overrides in `path`; none when it does not exist yet.
pub(super) fn read(path: &Path) -> anyhow::Result<Vec<Override>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_FILE_BYTES), &mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a list of overrides", path.display()))
}

/// Replaces the overrides in `path` with `overrides`.
pub(super) fn write(path: &Path, overrides: &[Override]) -> anyhow::Result<()> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp_name);
    let text = serde_json::to_vec_pretty(overrides)?;
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&text)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot replace {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::overrides::tests::acme;

    #[test]
    fn a_written_list_reads_back_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("overrides.json");
        assert!(read(&path).expect("missing is empty").is_empty());
        let o = acme();
        write(&path, std::slice::from_ref(&o)).expect("writes");
        assert_eq!(read(&path).expect("reads"), vec![o]);
        std::fs::write(&path, "{").expect("overwrite");
        let e = read(&path).expect_err("not a list");
        assert!(
            format!("{e:#}").contains("is not a list of overrides"),
            "{e:#}"
        );
    }
}
