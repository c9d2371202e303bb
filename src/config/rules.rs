//! Compiled rules: an immutable value built once per load and swapped whole on reload.

use std::collections::HashMap;
use std::path::PathBuf;

use super::pattern::Pattern;
use crate::limiter::Limit;
use crate::metrics::DescriptorStats;

/// Every domain loaded from the rules path.
#[derive(Debug, Default)]
pub struct Rules {
    pub(super) domains: HashMap<String, Domain>,
}

impl Rules {
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Domains by name, in name order, for display.
    pub fn domains(&self) -> impl Iterator<Item = (&str, &Domain)> {
        let mut all: Vec<_> = self.domains.iter().map(|(k, v)| (k.as_str(), v)).collect();
        all.sort_by_key(|(name, _)| *name);
        all.into_iter()
    }
}

/// One domain: the file it came from and its descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub file: PathBuf,
    pub(super) root: Level,
}

impl Domain {
    /// The rule of a request's entries, walking one level per entry: it applies only if it
    /// sits at the level of the last entry. `None` when nothing matches or that level has
    /// no limit.
    pub fn find<'a>(&self, entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<&Rule> {
        let mut level = &self.root;
        let mut node = None;
        for (key, value) in entries {
            let next = level.get(key, value)?;
            level = &next.children;
            node = Some(next);
        }
        node?.rule.as_ref()
    }
}

/// The descriptors that share one parent, by key.
#[derive(Debug, Default)]
pub(super) struct Level {
    pub(super) keys: HashMap<String, KeyNodes>,
}

impl Level {
    fn get(&self, key: &str, value: &str) -> Option<&Node> {
        let nodes = self.keys.get(key)?;
        nodes
            .exact
            .get(value)
            .or_else(|| {
                nodes
                    .wildcards
                    .iter()
                    .find(|(pattern, _)| pattern.matches(value))
                    .map(|(_, node)| node)
            })
            .or(nodes.default.as_ref())
    }
}

/// The descriptors of one key at one level: exact values, wildcards in file order, default.
#[derive(Debug, Default)]
pub(super) struct KeyNodes {
    pub(super) exact: HashMap<String, Node>,
    pub(super) wildcards: Vec<(Pattern, Node)>,
    pub(super) default: Option<Node>,
}

/// One descriptor: its rule, if it has a limit, and the level below it.
#[derive(Debug, Default)]
pub(super) struct Node {
    pub(super) rule: Option<Rule>,
    pub(super) children: Level,
}

/// What a matched descriptor does.
#[derive(Debug, Clone)]
pub struct Rule {
    pub policy: Policy,
    /// Decisions are counted but never deny.
    pub shadow_mode: bool,
    /// Metrics keep the request's values for this descriptor.
    pub detailed_metric: bool,
    /// Names of limits this rule supersedes when both match one request.
    pub replaces: Vec<String>,
    /// The rule's metric handles (unused for detailed rules, whose labels carry values).
    pub stats: DescriptorStats,
}

impl Rule {
    /// Whether this rule has a limit called `name`.
    pub fn is_named(&self, name: &str) -> bool {
        match &self.policy {
            Policy::Unlimited { name: own } => own.as_deref() == Some(name),
            Policy::Limited { limits, .. } => {
                limits.iter().any(|l| l.name.as_deref() == Some(name))
            }
        }
    }
}

/// Unlimited, or one or more limits counted on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    Unlimited {
        name: Option<String>,
    },
    Limited {
        limits: Vec<Limit>,
        /// The limits' part of the counter key, computed once here.
        shape: String,
    },
}
