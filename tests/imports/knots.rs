//! Knots (strongly connected sets of files: each reaches every other through imports)
//! and the circles in them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::modules::Graph;

/// The knots of more than one file, each sorted; largest first.
pub(crate) fn knots(graph: &Graph) -> Vec<Vec<String>> {
    let mut walk = Tarjan {
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
    let mut found = walk.found;
    found.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    found
}

/// A circle of three files or more in `knot`, if it holds one: each file imports the
/// next, the last the first. A knot holds none when its files only import each other in
/// pairs that form no ring (`a ⇄ b ⇄ c`).
pub(crate) fn circle(graph: &Graph, knot: &[String]) -> Option<Vec<String>> {
    let inside: BTreeSet<&str> = knot.iter().map(String::as_str).collect();
    let next = |file: &str| -> Vec<&str> {
        graph
            .get(file)
            .into_iter()
            .flat_map(BTreeMap::keys)
            .map(String::as_str)
            .filter(|f| inside.contains(f))
            .collect()
    };
    let imports = |from: &str, to: &str| graph.get(from).is_some_and(|i| i.contains_key(to));
    // A one-way import a → b closes a circle through b's shortest way back to a, which
    // has two steps at least.
    for &a in &inside {
        for b in next(a) {
            if !imports(b, a)
                && let Some(back) = shortest(&next, b, a)
            {
                return Some([vec![a.to_owned()], back[..back.len() - 1].to_vec()].concat());
            }
        }
    }
    // Pairs only: a circle is a ring among them, found by a walk's edge back to a file
    // on its way.
    let start = *inside.first()?;
    ring(&next, &mut vec![start], None)
}

/// The files of the shortest way from `from` to `to`, both included.
fn shortest<'a>(
    next: &impl Fn(&str) -> Vec<&'a str>,
    from: &'a str,
    to: &str,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(at) = queue.pop_front() {
        if at == to {
            let mut way = vec![to.to_owned()];
            let mut step = at;
            while let Some(&before) = came_from.get(step) {
                way.push(before.to_owned());
                step = before;
            }
            way.reverse();
            return Some(way);
        }
        for file in next(at) {
            if file != from && !came_from.contains_key(file) {
                came_from.insert(file, at);
                queue.push_back(file);
            }
        }
    }
    None
}

/// A ring through the files of `way` (a walk over pairs, its last file the one at hand,
/// `parent` the one before it), if the walk finds one.
fn ring<'a>(
    next: &impl Fn(&str) -> Vec<&'a str>,
    way: &mut Vec<&'a str>,
    parent: Option<&'a str>,
) -> Option<Vec<String>> {
    let at = *way.last()?;
    for file in next(at) {
        if Some(file) == parent {
            continue;
        }
        if let Some(pos) = way.iter().position(|&f| f == file) {
            return Some(way[pos..].iter().map(|f| (*f).to_owned()).collect());
        }
        way.push(file);
        if let Some(found) = ring(next, way, Some(at)) {
            return Some(found);
        }
        way.pop();
    }
    None
}

/// Tarjan's walk: each file's index and lowest reachable index, the files of the knot
/// being built, and the knots found.
struct Tarjan<'a> {
    graph: &'a Graph,
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    on_stack: BTreeSet<&'a str>,
    found: Vec<Vec<String>>,
}

impl<'a> Tarjan<'a> {
    fn visit(&mut self, node: &'a str) {
        let at = self.index.len();
        self.index.insert(node, at);
        self.low.insert(node, at);
        self.stack.push(node);
        self.on_stack.insert(node);
        for next in self.graph.get(node).into_iter().flat_map(BTreeMap::keys) {
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

#[cfg(test)]
mod tests {
    use super::{circle, knots};
    use crate::modules::Graph;

    /// A graph of `from → to` imports.
    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut graph = Graph::new();
        for (from, to) in edges {
            graph
                .entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned(), String::new());
            graph.entry((*to).to_owned()).or_default();
        }
        graph
    }

    #[test]
    fn pairs_are_knots_but_no_circles() {
        let pairs = graph(&[("a", "b"), ("b", "a"), ("b", "c"), ("c", "b"), ("d", "a")]);
        assert_eq!(knots(&pairs), [["a", "b", "c"]]);
        assert_eq!(circle(&pairs, &knots(&pairs)[0]), None);
    }

    #[test]
    fn three_files_or_more_in_a_ring_are_a_circle() {
        let ring = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("x", "y"), ("y", "x")]);
        assert_eq!(knots(&ring), [vec!["a", "b", "c"], vec!["x", "y"]]);
        assert_eq!(circle(&ring, &knots(&ring)[0]).map(|c| c.len()), Some(3));
        assert_eq!(circle(&ring, &knots(&ring)[1]), None);
        let pairs_in_a_ring = graph(&[
            ("a", "b"),
            ("b", "a"),
            ("b", "c"),
            ("c", "b"),
            ("c", "d"),
            ("d", "c"),
            ("d", "a"),
            ("a", "d"),
        ]);
        let knot = &knots(&pairs_in_a_ring)[0];
        assert_eq!(circle(&pairs_in_a_ring, knot).map(|c| c.len()), Some(4));
    }
}
