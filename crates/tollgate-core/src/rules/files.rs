//! Finding and reading rules files. Everything a directory can hold is expected here: a
//! symlink loop, a FIFO or a device named `x.yaml`, a file that never ends. Each is an error
//! naming its path, and nothing is read without a size bound, so a load always finishes.

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::config_error::ConfigError;

/// The largest rules file read.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// The most bytes of rules read in one load, over all files.
pub const MAX_TOTAL_BYTES: u64 = 256 << 20;
/// The deepest directory level searched for rules files.
const MAX_DEPTH: usize = 32;
/// "Too many levels of symbolic links" (`io::ErrorKind::FilesystemLoop` is not stable).
#[cfg(target_os = "linux")]
const ELOOP: i32 = 40;
#[cfg(not(target_os = "linux"))]
const ELOOP: i32 = 62;

/// One rules file: where it is and its text, or why it could not be read.
pub(super) struct RuleFile {
    pub(super) origin: String,
    pub(super) text: Result<String, ConfigError>,
}

/// The rules files at `path`: the file itself, or every `*.yaml`/`*.yml` below the
/// directory in name order. Dot-files and dot-directories are skipped, which also skips the
/// `..data` and `..2024_…` entries of a Kubernetes ConfigMap mount (their files are reached
/// through the top-level symlinks instead, once each).
pub(super) fn read_rule_files(path: &Path) -> Result<Vec<RuleFile>, ConfigError> {
    let meta = fs::metadata(path).map_err(|e| cannot_read(path, &e))?;
    let mut paths = Vec::new();
    if meta.is_dir() {
        let mut walk = Walk {
            visited: HashSet::new(),
            found: &mut paths,
        };
        walk.directory(path, 0)?;
        paths.sort();
    } else {
        paths.push(path.to_owned());
    }
    let mut budget = MAX_TOTAL_BYTES;
    Ok(paths
        .into_iter()
        .map(|file| RuleFile {
            origin: file.display().to_string(),
            text: read_bounded(&file, &mut budget),
        })
        .collect())
}

/// A directory walk that refuses to enter one directory twice (a symlink loop would
/// otherwise recurse forever, and a second path to a directory loads its files twice).
struct Walk<'a> {
    visited: HashSet<PathBuf>,
    found: &'a mut Vec<PathBuf>,
}

impl Walk<'_> {
    fn directory(&mut self, dir: &Path, depth: usize) -> Result<(), ConfigError> {
        if depth > MAX_DEPTH {
            return Err(problem(
                dir,
                format!("directories nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        let real = fs::canonicalize(dir).map_err(|e| cannot_read(dir, &e))?;
        if !self.visited.insert(real.clone()) {
            return Err(problem(
                dir,
                format!(
                    "is {} again (a symlink loop or a second link to a rules directory)",
                    real.display()
                ),
            ));
        }
        let entries = fs::read_dir(dir).map_err(|e| cannot_read_dir(dir, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| cannot_read_dir(dir, &e))?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            // Follow symlinks: ConfigMap files are links into the current data directory.
            let meta = match fs::metadata(&path) {
                Ok(meta) => meta,
                // A dangling link is not a rules file; a link loop is reported.
                Err(e) if e.raw_os_error() == Some(ELOOP) => {
                    return Err(problem(&path, "is a symlink loop".into()));
                }
                Err(_) => continue,
            };
            if meta.is_dir() {
                self.directory(&path, depth + 1)?;
            } else if is_rules_name(&path) {
                if !meta.is_file() {
                    return Err(problem(
                        &path,
                        "is not a regular file (a FIFO, socket or device cannot hold rules)".into(),
                    ));
                }
                self.found.push(path);
            }
        }
        Ok(())
    }
}

fn is_rules_name(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// Reads a regular file of at most `MAX_FILE_BYTES`, charging `budget`.
fn read_bounded(path: &Path, budget: &mut u64) -> Result<String, ConfigError> {
    // Checked before opening: opening a FIFO blocks until a writer comes.
    let meta = fs::metadata(path).map_err(|e| cannot_read(path, &e))?;
    if !meta.is_file() {
        return Err(problem(
            path,
            "is not a regular file (a FIFO, socket or device cannot hold rules)".into(),
        ));
    }
    let file = fs::File::open(path).map_err(|e| cannot_read(path, &e))?;
    let limit = MAX_FILE_BYTES.min(*budget);
    let mut bytes = Vec::new();
    // One byte past the limit tells a file that is too large (or still growing) apart.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| cannot_read(path, &e))?;
    if bytes.len() as u64 > limit {
        return Err(problem(
            path,
            if limit < MAX_FILE_BYTES {
                format!("rules files together exceed {MAX_TOTAL_BYTES} bytes")
            } else {
                format!("is larger than {MAX_FILE_BYTES} bytes, the most a rules file may hold")
            },
        ));
    }
    *budget -= bytes.len() as u64;
    String::from_utf8(bytes).map_err(|e| problem(path, format!("is not UTF-8 text: {e}")))
}

fn problem(path: &Path, message: String) -> ConfigError {
    ConfigError::whole(&path.display().to_string(), message)
}

fn cannot_read(path: &Path, e: &std::io::Error) -> ConfigError {
    problem(path, format!("cannot read: {e}"))
}

fn cannot_read_dir(path: &Path, e: &std::io::Error) -> ConfigError {
    problem(path, format!("cannot read directory: {e}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::process::Command;

    use super::*;
    use crate::rules::{Defaults, Rules};

    /// Every problem of loading `dir`, one per line.
    fn problems(dir: &Path) -> Vec<String> {
        match Rules::load(dir, Defaults::default()) {
            Ok(_) => Vec::new(),
            Err(e) => e.to_string().lines().map(str::to_owned).collect(),
        }
    }

    fn rules_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::write(dir.path().join("a.yaml"), "domain: one\n").expect("write");
        dir
    }

    #[test]
    fn self_symlinks_stop_the_walk_with_one_error() {
        let dir = rules_dir();
        symlink(".", dir.path().join("loop")).expect("link");
        let got = problems(dir.path());
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].contains("loop: is ") && got[0].contains(" again ("),
            "{got:?}"
        );

        symlink(".", dir.path().join("loop2")).expect("link");
        let got = problems(dir.path());
        assert_eq!(got.len(), 1, "{got:?}");
    }

    #[test]
    fn a_symlink_cycle_between_files_is_named() {
        let dir = rules_dir();
        symlink("y.yaml", dir.path().join("x.yaml")).expect("link");
        symlink("x.yaml", dir.path().join("y.yaml")).expect("link");
        let got = problems(dir.path());
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].ends_with("x.yaml: is a symlink loop"), "{got:?}");
    }

    #[test]
    fn a_fifo_is_refused_without_being_opened() {
        let dir = rules_dir();
        let fifo = dir.path().join("x.yaml");
        let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(made.success());
        let expected = format!(
            "{}: is not a regular file (a FIFO, socket or device cannot hold rules)",
            fifo.display()
        );
        assert_eq!(problems(dir.path()), std::slice::from_ref(&expected));
        // Named directly, too: opening it would wait for a writer forever.
        assert_eq!(problems(&fifo), [expected]);
    }

    #[test]
    fn a_link_to_a_device_is_refused_without_reading() {
        let dir = rules_dir();
        let zero = dir.path().join("z.yaml");
        symlink("/dev/zero", &zero).expect("link");
        assert_eq!(
            problems(dir.path()),
            [format!(
                "{}: is not a regular file (a FIFO, socket or device cannot hold rules)",
                zero.display()
            )]
        );
    }

    #[test]
    fn a_file_past_the_size_limit_names_the_limit() {
        let dir = rules_dir();
        let big = dir.path().join("big.yaml");
        let file = fs::File::create(&big).expect("create");
        file.set_len(MAX_FILE_BYTES + 1).expect("grow");
        assert_eq!(
            problems(dir.path()),
            [format!(
                "{}: is larger than 16777216 bytes, the most a rules file may hold",
                big.display()
            )]
        );
        file.set_len(MAX_FILE_BYTES).expect("shrink");
        let got = problems(dir.path());
        assert!(
            got.iter().all(|p| !p.contains("larger than")),
            "a file of exactly the limit is read: {got:?}"
        );
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_an_error() {
        let dir = rules_dir();
        let mut deep = dir.path().to_owned();
        for _ in 0..=MAX_DEPTH {
            deep.push("d");
        }
        fs::create_dir_all(&deep).expect("nest");
        let got = problems(dir.path());
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].ends_with(": directories nested deeper than 32 levels"),
            "{got:?}"
        );
    }
}
