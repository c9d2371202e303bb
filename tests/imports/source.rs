//! What one file says about modules: the paths it writes and, for each module it holds
//! (itself and any inline `mod x { … }`), the modules it declares, the names its `use`
//! declarations bind and the items it defines. Test code is left out (see the crate docs).

use std::collections::{BTreeMap, BTreeSet};

use crate::lex::{Token, tokens};

/// What one module declares: enough to tell where a name written in it leads.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    /// `mod x;` outside test code: modules with files of their own.
    pub(crate) files: BTreeSet<String>,
    /// `mod x { … }` outside test code: modules in the same file.
    pub(crate) inline: BTreeSet<String>,
    /// Each name a `use` binds, to its path as written (`use a::b as c`: `c` to `a::b`).
    pub(crate) bindings: BTreeMap<String, Vec<String>>,
    /// The paths of `use a::*`, as written.
    pub(crate) globs: Vec<Vec<String>>,
    /// The names of the items defined here: types, functions, constants, macros.
    pub(crate) items: BTreeSet<String>,
}

/// A path as written (`super::Limiter`), with the module it is written in.
#[derive(Debug, PartialEq)]
pub(crate) struct Written {
    /// The module: from the file's own in a [`Source`], from the crate root after.
    pub(crate) module: Vec<String>,
    /// The path's segments.
    pub(crate) path: Vec<String>,
}

/// One file, read.
#[derive(Debug, Default)]
pub(crate) struct Source {
    /// Whether the whole file is test code (`#![cfg(test)]`).
    pub(crate) test_only: bool,
    /// Each module of the file by its path within it (`[]`: the file's own module).
    pub(crate) scopes: BTreeMap<Vec<String>, Scope>,
    /// Each path of two segments or more written outside test code, in a `use` or inline,
    /// with the module (within the file) it is written in.
    pub(crate) paths: Vec<Written>,
}

/// What one leaf of a `use` tree binds.
#[derive(Debug, PartialEq)]
enum Binds {
    /// A name: the last segment, `self`'s module or an `as` rename.
    Name(String),
    /// Everything the module holds: `*`.
    Glob,
    /// Nothing: `as _`.
    Nothing,
}

/// Keywords an item's name follows.
const ITEM_KEYWORDS: [&str; 8] = [
    "struct", "enum", "union", "trait", "fn", "type", "const", "static",
];

/// Reads `text`.
pub(crate) fn read(text: &str) -> Source {
    let tokens = tokens(text);
    let mut source = Source::default();
    source.scopes.insert(Vec::new(), Scope::default());
    // The inline modules around the token at hand: name, brace depth of the body, and
    // where the body opens.
    let mut inline: Vec<(String, usize, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let here: Vec<String> = inline.iter().map(|(name, ..)| name.clone()).collect();
        let previous = i.checked_sub(1).map(|p| &tokens[p]);
        match &tokens[i] {
            Token::Punct('#') => {
                let inner = tokens.get(i + 1) == Some(&Token::Punct('!'));
                let open = i + 1 + usize::from(inner);
                if tokens.get(open) != Some(&Token::Punct('[')) {
                    i += 1;
                    continue;
                }
                let close = closing(&tokens, open);
                if !test_only_cfg(&tokens[open + 1..close]) {
                    i = open + 1;
                } else if !inner {
                    i = item_end(&tokens, close + 1);
                } else if let Some((name, _, open)) = inline.pop() {
                    // An inline module of test code: its body, then the module, go.
                    source.scopes.remove(&here);
                    source.scope(&here[..here.len() - 1]).inline.remove(&name);
                    i = closing(&tokens, open) + 1;
                    depth -= 1;
                } else {
                    return Source {
                        test_only: true,
                        ..Source::default()
                    };
                }
            }
            Token::Word(w) if w == "mod" => match (tokens.get(i + 1), tokens.get(i + 2)) {
                (Some(Token::Word(name)), Some(Token::Punct(';'))) => {
                    source.scope(&here).files.insert(name.clone());
                    i += 3;
                }
                (Some(Token::Word(name)), Some(Token::Punct('{'))) => {
                    source.scope(&here).inline.insert(name.clone());
                    depth += 1;
                    inline.push((name.clone(), depth, i + 2));
                    source.scope(&[here, vec![name.clone()]].concat());
                    i += 3;
                }
                _ => i += 1,
            },
            Token::Word(w) if w == "use" && tokens.get(i + 1) != Some(&Token::Punct('<')) => {
                let end = statement_end(&tokens, i + 1);
                let mut leaves = Vec::new();
                use_tree(&tokens[i + 1..end], &[], &mut leaves);
                for (path, binds) in leaves {
                    let scope = source.scope(&here);
                    match binds {
                        Binds::Name(name) => {
                            scope.bindings.insert(name, path.clone());
                        }
                        Binds::Glob => scope.globs.push(path.clone()),
                        Binds::Nothing => {}
                    }
                    source.paths.push(Written {
                        module: here.clone(),
                        path,
                    });
                }
                i = end + 1;
            }
            Token::Word(w) if w == "macro_rules" => {
                if let (Some(Token::Punct('!')), Some(Token::Word(name))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    source.scope(&here).items.insert(name.clone());
                }
                i += 1;
            }
            // `'static` is a lifetime, not an item.
            Token::Word(w)
                if ITEM_KEYWORDS.contains(&w.as_str()) && previous != Some(&Token::Punct('\'')) =>
            {
                if let Some(Token::Word(name)) = tokens.get(i + 1)
                    && name != "_"
                {
                    source.scope(&here).items.insert(name.clone());
                }
                i += 1;
            }
            Token::Word(first)
                if tokens.get(i + 1) == Some(&Token::PathSep)
                    && previous != Some(&Token::PathSep)
                    && previous != Some(&Token::Punct('\'')) =>
            {
                let mut path = vec![first.clone()];
                let mut next = i + 1;
                while tokens.get(next) == Some(&Token::PathSep) {
                    let Some(segment) = tokens.get(next + 1).and_then(Token::word) else {
                        break;
                    };
                    path.push(segment.to_owned());
                    next += 2;
                }
                // `pub(in crate::a)` limits who sees an item: no import.
                let visibility = previous.is_some_and(|t| t.is("in"))
                    && i >= 2
                    && tokens[i - 2] == Token::Punct('(');
                if path.len() > 1 && !visibility {
                    source.paths.push(Written { module: here, path });
                }
                i = next;
            }
            Token::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Token::Punct('}') => {
                if inline.last().is_some_and(|&(_, body, _)| body == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    source
}

impl Source {
    /// The scope of the module `inner` within the file, made if new.
    fn scope(&mut self, inner: &[String]) -> &mut Scope {
        self.scopes.entry(inner.to_vec()).or_default()
    }
}

/// The leaves of the `use` tree `tokens` (after `use`, before `;`), below `prefix`.
fn use_tree(tokens: &[Token], prefix: &[String], out: &mut Vec<(Vec<String>, Binds)>) {
    let mut path = prefix.to_vec();
    let mut k = 0;
    loop {
        match tokens.get(k) {
            Some(Token::Word(w)) if w != "as" => path.push(w.clone()),
            // `$crate` in a macro is `crate`; a leading `::` names another crate.
            Some(Token::PathSep | Token::Punct('$')) => {}
            Some(Token::Punct('{')) => {
                let close = closing(tokens, k);
                for part in split_commas(&tokens[k + 1..close]) {
                    use_tree(part, &path, out);
                }
                return;
            }
            Some(Token::Punct('*')) => {
                out.push((path, Binds::Glob));
                return;
            }
            _ => break,
        }
        k += 1;
    }
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    let binds = match &tokens[k..] {
        [Token::Word(r#as), Token::Word(name), ..] if r#as == "as" && name == "_" => Binds::Nothing,
        [Token::Word(r#as), Token::Word(name), ..] if r#as == "as" => Binds::Name(name.clone()),
        _ => path
            .last()
            .map_or(Binds::Nothing, |name| Binds::Name(name.clone())),
    };
    if !path.is_empty() {
        out.push((path, binds));
    }
}

/// Whether the attribute `tokens` (inside `#[…]`) is `cfg(P)` with `P` true only in tests:
/// `test`, `all(…, test, …)`, `any(…)` of such.
fn test_only_cfg(tokens: &[Token]) -> bool {
    match tokens {
        [cfg, Token::Punct('('), predicate @ .., Token::Punct(')')] if cfg.is("cfg") => {
            test_only(predicate)
        }
        _ => false,
    }
}

/// Whether the cfg predicate `tokens` holds only in tests.
fn test_only(tokens: &[Token]) -> bool {
    match tokens {
        [word] => word.is("test"),
        [
            Token::Word(op),
            Token::Punct('('),
            args @ ..,
            Token::Punct(')'),
        ] => {
            let args = split_commas(args);
            match op.as_str() {
                "all" => args.iter().any(|arg| test_only(arg)),
                "any" => !args.is_empty() && args.iter().all(|arg| test_only(arg)),
                _ => false,
            }
        }
        _ => false,
    }
}

/// What an item's end looks like, told by its first keyword.
enum Shape {
    /// `fn`, `struct`, `impl`, `mod` and the like: a `;` or its closing brace.
    Braced,
    /// `use`, `let`, `const`, `static`, `type`: a `;`.
    Statement,
    /// A field, variant, match arm or expression: a `,` or `;`.
    Element,
}

/// Where the item starting at `start` ends (one past its last token); never past the
/// brace closing what holds it.
fn item_end(tokens: &[Token], start: usize) -> usize {
    let shape = match first_keyword(&tokens[start..]) {
        Some(
            "fn" | "struct" | "enum" | "union" | "trait" | "impl" | "mod" | "macro_rules"
            | "extern",
        ) => Shape::Braced,
        Some("use" | "let" | "const" | "static" | "type") => Shape::Statement,
        _ => Shape::Element,
    };
    let mut depth = 0usize;
    for (k, token) in tokens.iter().enumerate().skip(start) {
        match token {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') if depth == 0 => return k,
            Token::Punct(c @ (')' | ']' | '}')) => {
                depth -= 1;
                if depth == 0 && *c == '}' && matches!(shape, Shape::Braced) {
                    return k + 1;
                }
            }
            Token::Punct(';') if depth == 0 => return k + 1,
            Token::Punct(',') if depth == 0 && matches!(shape, Shape::Element) => return k + 1,
            _ => {}
        }
    }
    tokens.len()
}

/// The first word of an item that says what it is: past its attributes and visibility.
fn first_keyword(tokens: &[Token]) -> Option<&str> {
    let mut k = 0;
    while k < tokens.len() {
        match &tokens[k] {
            Token::Punct('#') if tokens.get(k + 1) == Some(&Token::Punct('[')) => {
                k = closing(tokens, k + 1) + 1;
            }
            Token::Punct('(') => k = closing(tokens, k) + 1,
            Token::Word(w) if matches!(w.as_str(), "pub" | "unsafe" | "async" | "default") => {
                k += 1
            }
            Token::Word(w) => return Some(w),
            _ => return None,
        }
    }
    None
}

/// The index of the bracket closing the one at `open` (or the end).
fn closing(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, token) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// The index of the `;` ending the statement that starts at `start` (or the end).
fn statement_end(tokens: &[Token], start: usize) -> usize {
    let mut depth = 0usize;
    for (k, token) in tokens.iter().enumerate().skip(start) {
        match token {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') if depth == 0 => return k,
            Token::Punct(')' | ']' | '}') => depth -= 1,
            Token::Punct(';') if depth == 0 => return k,
            _ => {}
        }
    }
    tokens.len()
}

/// `tokens` split at the commas outside brackets, empty parts dropped.
fn split_commas(tokens: &[Token]) -> Vec<&[Token]> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (k, token) in tokens.iter().enumerate() {
        match token {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') => depth = depth.saturating_sub(1),
            Token::Punct(',') if depth == 0 => {
                parts.push(&tokens[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tokens[start..]);
    parts.into_iter().filter(|part| !part.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::read;

    /// The paths `text` writes, as written.
    fn paths(text: &str) -> Vec<String> {
        read(text)
            .paths
            .into_iter()
            .map(|written| written.path.join("::"))
            .collect()
    }

    #[test]
    fn a_grouped_use_gives_every_leaf() {
        assert_eq!(
            paths("pub(crate) use crate::a::{b::{C, D}, e as f, self, g::*, h as _};"),
            [
                "crate::a::b::C",
                "crate::a::b::D",
                "crate::a::e",
                "crate::a",
                "crate::a::g",
                "crate::a::h"
            ]
        );
        let source = read("use crate::a::{b::{self as c}, D as E, f::*};");
        let scope = &source.scopes[&Vec::new()];
        assert_eq!(scope.bindings["c"], ["crate", "a", "b"]);
        assert_eq!(scope.bindings["E"], ["crate", "a", "D"]);
        assert_eq!(scope.globs, [["crate", "a", "f"]]);
    }

    #[test]
    fn paths_count_anywhere_in_code() {
        let text = "fn f(x: crate::a::B) -> Vec<crate::c::D> {
            let y = <crate::e::F as super::T>::g(crate::h::I::new::<u8>());
            child::J::K; Self::new(); x.into::<crate::l::M>()
        }";
        assert_eq!(
            paths(text),
            [
                "crate::a::B",
                "crate::c::D",
                "crate::e::F",
                "super::T",
                "crate::h::I::new",
                "child::J::K",
                "Self::new",
                "crate::l::M"
            ]
        );
    }

    #[test]
    fn super_and_self_chains_are_kept_whole() {
        let text = "use super::super::a::B; fn f() { self::c::D::e(); super::super::super::F }";
        assert_eq!(
            paths(text),
            [
                "super::super::a::B",
                "self::c::D::e",
                "super::super::super::F"
            ]
        );
    }

    #[test]
    fn comments_strings_and_characters_hold_no_paths() {
        let text = r###"
            // crate::a::B
            /// crate::c::D
            /* crate::e /* nested crate::f */ crate::g */
            const S: &str = "crate::h \" crate::i";
            const R: &str = r#"crate::j "quoted" crate::k"#;
            const T: &[u8] = br"crate::l";
            const C: [char; 3] = ['"', '\'', '\u{22}'];
            fn f<'a>(x: &'a str) -> crate::m::N { 'outer: loop { break 'outer crate::o::P } }
            const U: &str = "\\"; fn g() -> crate::q::R { todo!() }
        "###;
        assert_eq!(paths(text), ["crate::m::N", "crate::o::P", "crate::q::R"]);
    }

    #[test]
    fn test_code_is_left_out() {
        let text = r#"
            #[cfg(test)] use crate::a::B;
            #[cfg(all(test, feature = "x"))] fn f() { crate::c::D }
            #[cfg(any(test, feature = "x"))] fn g() { crate::e::F }
            #[cfg(not(test))] fn h() { crate::g::H }
            #[cfg(test)]
            #[derive(Debug)]
            pub(crate) struct Only { field: crate::i::J }
            struct Fields { #[cfg(test)] seen: crate::k::L, kept: crate::m::N }
            #[cfg(test)] mod tests;
            mod real;
            #[cfg(test)] mod testing { use super::*; fn t() -> crate::o::P {} }
            fn k() -> crate::q::R {}
        "#;
        assert_eq!(
            paths(text),
            ["crate::e::F", "crate::g::H", "crate::m::N", "crate::q::R"]
        );
        let source = read(text);
        assert_eq!(source.scopes.len(), 1, "{source:?}");
        assert_eq!(
            source.scopes[&Vec::new()].files.iter().collect::<Vec<_>>(),
            ["real"]
        );
        assert!(read("//! Docs.\n#![cfg(test)]\nuse crate::a::B;").test_only);
    }

    #[test]
    fn an_inline_module_is_a_scope_of_its_own() {
        let source = read(
            "use crate::a::B; mod inner { use super::B; pub struct S; fn f() { crate::c::D } } fn g() {}",
        );
        let written: Vec<(String, String)> = source
            .paths
            .iter()
            .map(|w| (w.module.join("::"), w.path.join("::")))
            .collect();
        assert_eq!(
            written,
            [
                (String::new(), "crate::a::B".to_owned()),
                ("inner".to_owned(), "super::B".to_owned()),
                ("inner".to_owned(), "crate::c::D".to_owned()),
            ]
        );
        let inner = &source.scopes[&vec!["inner".to_owned()]];
        assert_eq!(inner.bindings["B"], ["super", "B"]);
        assert!(inner.items.contains("S"));
        assert!(source.scopes[&Vec::new()].items.contains("g"));
        let tested =
            read("mod inner { #![cfg(test)] fn f() { crate::c::D } } fn g() { crate::e::F }");
        assert_eq!(tested.scopes.len(), 1);
        assert_eq!(tested.paths.len(), 1);
    }

    #[test]
    fn visibility_is_no_import() {
        assert!(paths("pub(in crate::a::b) fn f() {}").is_empty());
    }
}
