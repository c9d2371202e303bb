//! The import graph between files, per crate of the workspace (the binary's `src/` and
//! every `crates/*/src`): no circle of three files or more in any, and the core's largest
//! knot (a strongly connected set: files each reaching every other through imports) no
//! larger than [`MAX_CORE_KNOT`] files.
//!
//! A file imports another when a path it writes leads into it, in any form: a `use`
//! (grouped `use a::{b::{C, D}, e}`, `self`, `as`, `*`), a path inline in code
//! (`crate::app::App::new()`), `super::`, `super::super::`, `self::`, a child module's
//! name (a parent's `child::Item`), an item of the parent (a child's `super::Item`), or a
//! name a `use` bound (`use crate::store; store::shared::X`). A path through a name a
//! module binds with `use` (a `pub use` re-export, or a parent's import that a child
//! names as `super::Item`) leads on to the file that defines the item. Paths into other
//! crates are not imports; `mod` declarations are not imports.
//!
//! A circle is files each importing the next, the last the first. Two files importing
//! each other (a parent and the child it re-exports, say) are allowed, as is a row of such
//! pairs that closes no ring (`a ⇄ b ⇄ c`): a circle needs three files or more.
//!
//! Test code counts for nothing, so a circle only tests close is no circle: an item under
//! `#[cfg(test)]` (or `cfg(all(test, …))`, `cfg(any(test, test))`) wherever it is in a
//! file, such as `mod tests { … }` at its end; the file of a module declared
//! `#[cfg(test)] mod tests;` and every file below it (`store/shared/fleet/`,
//! `differential.rs`); a file under `#![cfg(test)]`. Comments, strings (raw ones too) and
//! character literals are not code: a `crate::` in them is no path.
//!
//! To list every crate's knots and circles:
//!
//! ```sh
//! cargo test --test imports -- --nocapture
//! ```

mod knots;
mod lex;
mod modules;
mod source;

use std::collections::BTreeMap;
use std::path::Path;

use crate::knots::{circle, knots};
use crate::modules::{Graph, Modules};

/// The largest knot allowed in the core: issue 57's target for the shared store's rooms.
const MAX_CORE_KNOT: usize = 8;

#[test]
fn no_circle_of_three_files_or_more_in_any_crate() {
    let mut circles = Vec::new();
    for (name, graph) in workspace() {
        println!("{name}: {} files", graph.len());
        for knot in knots(&graph) {
            let found = circle(&graph, &knot);
            println!("  a knot of {} files: {}", knot.len(), knot.join(", "));
            if let Some(found) = found {
                let steps = steps(&graph, &found);
                println!("    a circle: {steps}");
                circles.push(format!("{name}: {steps}"));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "circles of three files or more: {circles:#?}"
    );
}

#[test]
fn the_cores_largest_knot_is_at_most_eight_files() {
    let (_, core) = workspace()
        .into_iter()
        .find(|(name, _)| name == "crates/tollgate-core/src/lib.rs")
        .expect("the core");
    let largest = knots(&core).into_iter().next().unwrap_or_default();
    assert!(
        largest.len() <= MAX_CORE_KNOT,
        "the core's largest knot holds {} files, more than {MAX_CORE_KNOT}: {largest:#?}",
        largest.len()
    );
}

/// The circle `files` with the path that makes each step: `a (super::X) → b … → a`.
fn steps(graph: &Graph, files: &[String]) -> String {
    let mut out = String::new();
    for (at, file) in files.iter().enumerate() {
        let next = &files[(at + 1) % files.len()];
        let path = graph.get(file).and_then(|imports| imports.get(next));
        out.push_str(&format!("{file} ({}) → ", path.map_or("?", String::as_str)));
    }
    out.push_str(&files[0]);
    out
}

/// Every crate of the workspace, by its root file, and its import graph.
fn workspace() -> Vec<(String, Graph)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec!["src".to_owned()];
    let mut members: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|entry| {
            entry
                .expect("a crates/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .map(|member| format!("crates/{member}/src"))
        .filter(|src| root.join(src).is_dir())
        .collect();
    members.sort();
    dirs.extend(members);
    let mut crates = Vec::new();
    for dir in dirs {
        let files = rust_files(&root.join(&dir));
        for crate_root in ["lib.rs", "main.rs"] {
            if files.contains_key(crate_root) {
                let graph = Modules::new(&files, crate_root).graph();
                crates.push((format!("{dir}/{crate_root}"), graph));
            }
        }
    }
    crates
}

/// Every `.rs` file under `dir` (relative to it, `/`-separated) and its text.
fn rust_files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(dir).expect("under the source directory");
                let text = std::fs::read_to_string(&path).expect("read a source file");
                out.insert(relative.to_string_lossy().replace('\\', "/"), text);
            }
        }
    }
    out
}
