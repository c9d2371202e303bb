//! The import graph between files: every circle of files that import each other, per
//! crate; none at all in the core, and none in the binary (src/) spanning more than two
//! files. A file imports
//! another when it names a path into it (`use crate::ops::metrics::Metrics`,
//! `super::types::PlainCounter`, `crate::app::App` inline); `mod` declarations and unit
//! tests at a file's end are not imports. To list the circles of every crate:
//!
//! ```sh
//! cargo test --test imports -- --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest circle allowed in src/: two files that import each other.
const MAX_CIRCLE: usize = 2;

#[test]
fn no_import_circle_in_the_core_and_none_in_the_binary_past_two_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates = vec![root.join("src")];
    let mut members: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|entry| entry.expect("a crates/ entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    members.sort();
    crates.extend(members);
    let (mut too_long, mut in_core) = (Vec::new(), Vec::new());
    for src in &crates {
        let circles = circles(&graph(src));
        println!("{}: {} circle(s)", src.display(), circles.len());
        for circle in &circles {
            println!("  {}", circle.join(", "));
        }
        if src == &root.join("src") {
            too_long.extend(circles.iter().filter(|c| c.len() > MAX_CIRCLE).cloned());
        }
        if src == &root.join("crates/tollgate-core/src") {
            in_core.extend(circles);
        }
    }
    assert!(
        too_long.is_empty(),
        "import circles in src/ spanning more than {MAX_CIRCLE} files: {too_long:?}"
    );
    assert!(
        in_core.is_empty(),
        "import circles in the core: {in_core:?}"
    );
}

/// Each file under `src` (relative path) and the files it imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(src);
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|file| (module_path(file), file.clone()))
        .collect();
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(src.join(file)).expect("read a source file");
            let here = module_path(file);
            let imports = referenced_paths(without_tests(&text))
                .into_iter()
                .filter_map(|path| absolute(&here, &path))
                .filter_map(|path| resolve(&modules, &path))
                .filter(|target| target != file)
                .collect();
            (file.clone(), imports)
        })
        .collect()
}

/// Every `.rs` file under `dir`, relative to it, with `/` separators.
fn rust_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(dir).expect("under the source directory");
                out.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

/// `ops/metrics/mod.rs` → `[ops, metrics]`; `lib.rs` and `main.rs` → the crate root.
fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The text before a trailing `#[cfg(test)] mod … {`: its `super` means the file itself.
fn without_tests(text: &str) -> &str {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let rest = &text[offset + line.len()..];
        let next = rest.lines().next().unwrap_or("").trim_start();
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") && next.ends_with('{') {
            return &text[..offset];
        }
        offset += line.len();
    }
    text
}

/// Every path starting with `crate`, `super` or `self`, `use` groups expanded.
fn referenced_paths(text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .any(|head| code[i..].starts_with(head));
        let boundary = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        if starts && boundary {
            let end = path_end(&code[i..]);
            expand(&code[i..i + end], &mut Vec::new(), &mut paths);
            i += end.max(1);
        } else {
            i += code[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    paths
}

/// Where the path at the start of `text` ends: its braces closed, at the first character
/// that is no part of it.
fn path_end(text: &str) -> usize {
    let mut depth = 0usize;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return at,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return at + 1;
                }
            }
            c if depth > 0 || c.is_alphanumeric() || c == '_' || c == ':' => {}
            _ => return at,
        }
    }
    text.len()
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e` (as segments, `as` renames dropped).
fn expand(text: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let text = text.trim();
    let Some(open) = text.find('{') else {
        let mut path = prefix.clone();
        let head = text.split_whitespace().next().unwrap_or("");
        path.extend(head.split("::").filter(|s| !s.is_empty()).map(String::from));
        out.push(path);
        return;
    };
    let base: Vec<String> = text[..open]
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let inner = &text[open + 1..text.rfind('}').unwrap_or(text.len())];
    let depth = prefix.len();
    prefix.extend(base);
    for item in split_top(inner) {
        expand(item, prefix, out);
    }
    prefix.truncate(depth);
}

/// `inner` split at its commas outside braces.
fn split_top(inner: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (at, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// `path` from the crate root, as seen from the module `here`.
fn absolute(here: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => here.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop()?;
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// The file of the longest prefix of `path` that is a module of the crate.
fn resolve(modules: &BTreeMap<Vec<String>, String>, path: &[String]) -> Option<String> {
    (0..=path.len())
        .rev()
        .find_map(|len| modules.get(&path[..len]).cloned())
}

/// The strongly connected groups of more than one file, each sorted, in order (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let at = self.index.len();
            self.index.insert(node, at);
            self.low.insert(node, at);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut group = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    group.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found.sort();
    walk.found
}
