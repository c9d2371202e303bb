//! Reading rules from a file or a directory and parsing them.

use std::fs;
use std::path::{Path, PathBuf};

use super::ConfigError;
use super::spec::FileSpec;

/// The rules files at `path`: the file itself, or every `*.yaml`/`*.yml` below the
/// directory in name order. Dot-files and dot-directories are skipped, which also skips the
/// `..data` and `..2024_…` entries of a Kubernetes ConfigMap mount (their files are reached
/// through the top-level symlinks instead, once each).
pub fn rule_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let meta =
        fs::metadata(path).map_err(|e| ConfigError::file(path, format!("cannot read: {e}")))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    collect(path, &mut files)?;
    files.sort();
    Ok(files)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), ConfigError> {
    let entries = fs::read_dir(dir)
        .map_err(|e| ConfigError::file(dir, format!("cannot read directory: {e}")))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| ConfigError::file(dir, format!("cannot read directory: {e}")))?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        // Follow symlinks: ConfigMap files are links into the current data directory.
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            collect(&path, files)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            files.push(path);
        }
    }
    Ok(())
}

/// Parses one rules file; the error names the place in the file and the problem.
pub fn parse(file: &Path, text: &str) -> Result<FileSpec, ConfigError> {
    let mut place = String::new();
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            place = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let location = e
            .location()
            .map(|l| format!(" (line {} column {})", l.line(), l.column()))
            .unwrap_or_default();
        let path = if place == "." { String::new() } else { place };
        ConfigError {
            file: file.to_owned(),
            path,
            message: format!("{}{location}", message_of(&e.to_string())),
        }
    })
}

/// The bare message of a YAML error: its first line without the "error: line L column C: "
/// lead, since the location is appended in a fixed form.
fn message_of(rendered: &str) -> &str {
    let line = rendered.lines().next().unwrap_or(rendered).trim();
    let line = line.strip_prefix("error: ").unwrap_or(line);
    match line
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
    {
        Some((_, message)) => message,
        None => line,
    }
}
