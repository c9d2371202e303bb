//! A crate's modules, found from its root file through `mod` declarations as the compiler
//! finds them, and the file each path written in them leads to: the graph of imports.

use std::collections::BTreeMap;

use crate::source::{self, Scope, Written};

/// Each file (relative to the crate's source directory), the files it imports and, for
/// each, the first path there as written (`super::Limiter`).
pub(crate) type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// How many `use` hops a name is followed through: a chain longer than any the compiler
/// accepts (it refuses loops).
const MAX_HOPS: usize = 32;

/// A crate's modules, test code left out.
#[derive(Debug, Default)]
pub(crate) struct Modules {
    /// Each module by its path from the crate root: its file and what it declares.
    modules: BTreeMap<Vec<String>, (String, Scope)>,
    /// Each file and the paths it writes, each with the module it is written in.
    paths: BTreeMap<String, Vec<Written>>,
}

impl Modules {
    /// The modules of the crate whose root is `root`, among `files` (path → text).
    pub(crate) fn new(files: &BTreeMap<String, String>, root: &str) -> Self {
        let mut modules = Modules::default();
        let mut pending = vec![(Vec::<String>::new(), root.to_owned())];
        while let Some((module, file)) = pending.pop() {
            let Some(text) = files.get(&file) else {
                continue;
            };
            let source = source::read(text);
            if source.test_only {
                continue;
            }
            for (inner, scope) in source.scopes {
                let path = [module.clone(), inner.clone()].concat();
                for child in &scope.files {
                    let base = format!(
                        "{}{}",
                        children_dir(&file),
                        [inner.clone(), vec![child.clone()]].concat().join("/")
                    );
                    let found = [format!("{base}.rs"), format!("{base}/mod.rs")]
                        .into_iter()
                        .find(|candidate| files.contains_key(candidate));
                    if let Some(child_file) = found {
                        pending.push(([path.clone(), vec![child.clone()]].concat(), child_file));
                    }
                }
                modules.modules.insert(path, (file.clone(), scope));
            }
            let paths = source
                .paths
                .into_iter()
                .map(|written| Written {
                    module: [module.clone(), written.module].concat(),
                    path: written.path,
                })
                .collect();
            modules.paths.insert(file, paths);
        }
        modules
    }

    /// Each file of the crate and the other files its paths lead to.
    pub(crate) fn graph(&self) -> Graph {
        self.paths
            .iter()
            .map(|(file, paths)| {
                let mut imports = BTreeMap::new();
                for Written { module, path } in paths {
                    if let Some(target) = self.target(module, path)
                        && target != *file
                    {
                        imports.entry(target).or_insert_with(|| path.join("::"));
                    }
                }
                (file.clone(), imports)
            })
            .collect()
    }

    /// The file holding what `path`, written in `module`, names; none outside the crate.
    pub(crate) fn target(&self, module: &[String], path: &[String]) -> Option<String> {
        let absolute = self.absolute(module, path, 0)?;
        self.file_of(&absolute, 0)
    }

    /// `path`, written in `module`, from the crate root; none if it starts outside the
    /// crate (std, another crate, a generic parameter).
    fn absolute(&self, module: &[String], path: &[String], hops: usize) -> Option<Vec<String>> {
        let (first, mut rest) = path.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => module.split_last()?.1.to_vec(),
            _ => {
                let mut found = self.name_in(module, first, hops)?;
                found.extend(rest.iter().cloned());
                return Some(found);
            }
        };
        while let Some((next, after)) = rest.split_first()
            && next == "super"
        {
            base.pop()?;
            rest = after;
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// Where the name `name`, seen from `module`, is: a child module, a name a `use`
    /// binds, an item defined there, or one a glob brings in.
    fn name_in(&self, module: &[String], name: &str, hops: usize) -> Option<Vec<String>> {
        if hops > MAX_HOPS {
            return None;
        }
        let (_, scope) = self.modules.get(module)?;
        if let Some(bound) = scope.bindings.get(name) {
            return self.absolute(module, bound, hops + 1);
        }
        if scope.files.contains(name) || scope.inline.contains(name) || scope.items.contains(name) {
            return Some([module, &[name.to_owned()]].concat());
        }
        scope.globs.iter().find_map(|glob| {
            let from = self.absolute(module, glob, hops + 1)?;
            self.name_in(&from, name, hops + 1)
        })
    }

    /// The file of what the crate-rooted `path` names. A name a module binds with `use`
    /// (a re-export, or an import a child names through `super::`) is followed to where it
    /// is defined; none if that is outside the crate.
    fn file_of(&self, path: &[String], hops: usize) -> Option<String> {
        let mut module: Vec<String> = Vec::new();
        for (at, segment) in path.iter().enumerate() {
            let (file, scope) = self.modules.get(&module)?;
            if scope.files.contains(segment) || scope.inline.contains(segment) {
                module.push(segment.clone());
                continue;
            }
            if hops > MAX_HOPS
                || scope.items.contains(segment) && !scope.bindings.contains_key(segment)
            {
                return Some(file.clone());
            }
            let Some(mut found) = self.name_in(&module, segment, hops + 1) else {
                // Bound to something outside the crate, or unknown here: an unknown name
                // is taken as this module's own.
                return (!scope.bindings.contains_key(segment)).then(|| file.clone());
            };
            found.extend(path[at + 1..].iter().cloned());
            return self.file_of(&found, hops + 1);
        }
        self.modules.get(&module).map(|(file, _)| file.clone())
    }
}

/// Where the files of `file`'s `mod x;` children are: `a/b.rs` → `a/b/`, `a/mod.rs` → `a/`.
fn children_dir(file: &str) -> String {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    let dir = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    match name {
        "mod.rs" | "lib.rs" | "main.rs" => dir,
        _ => format!("{dir}{}/", name.trim_end_matches(".rs")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::Modules;

    /// The import graph of a crate of `files`, as `from → to` lines.
    fn imports(files: &[(&str, &str)]) -> Vec<String> {
        let files: BTreeMap<String, String> = files
            .iter()
            .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
            .collect();
        Modules::new(&files, "lib.rs")
            .graph()
            .into_iter()
            .flat_map(|(from, to)| to.into_keys().map(move |to| format!("{from} → {to}")))
            .collect()
    }

    #[test]
    fn parents_children_and_re_exports() {
        let graph = imports(&[
            (
                "lib.rs",
                "mod a; mod b; mod c; pub use b::Shared; pub use std::fmt;",
            ),
            // Through the root's re-export to where `Shared` is defined; `fmt` is std's.
            (
                "a.rs",
                "use crate::Shared; use crate::fmt::Debug; pub struct A;",
            ),
            (
                "b.rs",
                "mod child; pub struct Shared; pub(crate) use child::Leaf;",
            ),
            // A child naming its parent's item, its grandparent's child inline.
            (
                "b/child.rs",
                "use super::Shared; pub struct Leaf; fn f() { super::super::a::A; }",
            ),
            // A bound module's child, and a name a glob brings.
            (
                "c.rs",
                "use crate::b; use crate::b::*; fn f() { b::child::Leaf; child::Leaf; }",
            ),
        ]);
        assert_eq!(
            graph,
            [
                "a.rs → b.rs",
                "b.rs → b/child.rs",
                "b/child.rs → a.rs",
                "b/child.rs → b.rs",
                "c.rs → b.rs",
                "c.rs → b/child.rs",
                "lib.rs → b.rs",
            ]
        );
    }

    #[test]
    fn a_parents_import_named_through_super_leads_to_its_file() {
        let graph = imports(&[
            ("lib.rs", "mod a; mod b;"),
            ("a.rs", "mod child; use crate::b::B;"),
            ("a/child.rs", "fn f() -> super::B { todo!() }"),
            ("b.rs", "pub struct B;"),
        ]);
        assert_eq!(graph, ["a.rs → b.rs", "a/child.rs → b.rs"]);
    }

    #[test]
    fn test_modules_and_their_files_are_left_out() {
        let graph = imports(&[
            (
                "lib.rs",
                "mod a; #[cfg(test)] mod tests; #[cfg(all(test, feature = \"x\"))] mod fleet;",
            ),
            ("a.rs", "mod inner; pub struct A;"),
            ("a/inner.rs", "#![cfg(test)]\nuse crate::a::A;"),
            ("tests.rs", "use crate::a::A;"),
            ("fleet.rs", "mod model;"),
            ("fleet/model.rs", "use crate::a::A;"),
        ]);
        assert!(graph.is_empty(), "{graph:?}");
    }

    #[test]
    fn a_childs_file_sits_beside_or_below_its_parent() {
        let graph = imports(&[
            ("lib.rs", "mod a; mod b;"),
            ("a.rs", "mod x; mod inner { mod y; }"),
            ("a/x.rs", "use crate::b::B;"),
            ("a/inner/y/mod.rs", "use crate::b::B;"),
            ("b/mod.rs", "pub struct B;"),
        ]);
        assert_eq!(graph, ["a/inner/y/mod.rs → b/mod.rs", "a/x.rs → b/mod.rs"]);
    }
}
