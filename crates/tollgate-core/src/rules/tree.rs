//! Compiled rules: an immutable value built once per load and swapped whole on reload.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use super::config_error::ConfigError;
use super::meta::Metadata;
use super::pattern::Pattern;
use crate::limit::Limit;

/// Every domain loaded, with its descriptor tree.
#[derive(Debug, Default)]
pub struct Rules {
    pub(super) domains: HashMap<String, Domain>,
    /// Rules compiled so far; each rule's id is below this.
    pub(super) rule_count: usize,
}

impl Rules {
    /// The domain called `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Domains by name, in name order, for display.
    pub fn domains(&self) -> impl Iterator<Item = (&str, &Domain)> {
        let mut all: Vec<_> = self.domains.iter().map(|(k, v)| (k.as_str(), v)).collect();
        all.sort_by_key(|(name, _)| *name);
        all.into_iter()
    }

    /// How many rules there are; [`Rule::id`] is below this.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// Every rule, in no particular order.
    pub fn rules(&self) -> Vec<&Rule> {
        let mut out = Vec::with_capacity(self.rule_count);
        for domain in self.domains.values() {
            domain.root.collect(&mut out);
        }
        out
    }
}

/// One domain: where its rules came from and its descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub(super) origins: Vec<String>,
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

    /// The rule for entries that come in no order (an RLQS bucket id, a map): they are
    /// put in the order the rules nest — at each level an entry whose key the level names,
    /// matched as [`Domain::find`] matches (exact, wildcard, key-only default) — and every
    /// entry must find its level. Returns the entries in that order, which is the
    /// descriptor `ShouldRateLimit` would send for the same rule, and the rule.
    ///
    /// Keys are tried in sorted order and the walk backtracks when a choice leaves an entry
    /// without a level; each node of the tree is entered at most once, so the cost is bounded
    /// by the size of the tree.
    pub(crate) fn find_unordered<'e>(
        &self,
        entries: &[(&'e str, &'e str)],
    ) -> Option<(Vec<(&'e str, &'e str)>, &Rule)> {
        let mut left = entries.to_vec();
        left.sort_unstable();
        let mut placed = Vec::with_capacity(left.len());
        let rule = place(&self.root, &mut left, &mut placed)?;
        Some((placed, rule))
    }

    /// The files or resources the domain's rules came from.
    pub fn origins(&self) -> &[String] {
        &self.origins
    }

    /// Adds `other`'s top-level descriptors (the reference's `MERGE_DOMAIN_CONFIG`); a
    /// descriptor both define is an error.
    pub(super) fn merge(&mut self, other: Domain, origin: &str, errors: &mut Vec<ConfigError>) {
        self.origins.extend(other.origins);
        for (key, theirs) in other.root.keys {
            let ours = self.root.keys.entry(key.clone()).or_default();
            let mut duplicate = |what: String| {
                errors.push(ConfigError {
                    origin: origin.to_owned(),
                    path: "descriptors".into(),
                    message: format!("duplicate descriptor {what} (also in {})", self.origins[0]),
                });
            };
            for (value, node) in theirs.exact {
                match ours.exact.entry(value) {
                    Entry::Occupied(e) => duplicate(format!("key '{key}' value '{}'", e.key())),
                    Entry::Vacant(e) => {
                        e.insert(node);
                    }
                }
            }
            for (pattern, node) in theirs.wildcards {
                if ours.wildcards.iter().any(|(p, _)| *p == pattern) {
                    duplicate(format!("key '{key}' value '{pattern}'"));
                } else {
                    ours.wildcards.push((pattern, node));
                }
            }
            if let Some(node) = theirs.default {
                if ours.default.is_some() {
                    duplicate(format!("key '{key}' with no value"));
                } else {
                    ours.default = Some(node);
                }
            }
        }
    }
}

/// Places the `left` entries below `level` (see [`Domain::find_unordered`]).
fn place<'r, 'e>(
    level: &'r Level,
    left: &mut Vec<(&'e str, &'e str)>,
    placed: &mut Vec<(&'e str, &'e str)>,
) -> Option<&'r Rule> {
    for i in 0..left.len() {
        let (key, value) = left[i];
        let Some(node) = level.get(key, value) else {
            continue;
        };
        left.remove(i);
        placed.push((key, value));
        let found = match left.is_empty() {
            true => node.rule.as_ref(),
            false => place(&node.children, left, placed),
        };
        if found.is_some() {
            return found;
        }
        placed.pop();
        left.insert(i, (key, value));
    }
    None
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

    fn collect<'a>(&'a self, out: &mut Vec<&'a Rule>) {
        for nodes in self.keys.values() {
            let all = nodes
                .exact
                .values()
                .chain(nodes.wildcards.iter().map(|(_, n)| n))
                .chain(&nodes.default);
            for node in all {
                out.extend(&node.rule);
                node.children.collect(out);
            }
        }
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
    pub(super) id: usize,
    pub(super) domain: Arc<str>,
    /// The descriptor's place in the tree: `key_value` (or `key` for a key-only default,
    /// `key_pattern*` for a wildcard) per level.
    pub(super) path: Box<[String]>,
    pub(crate) policy: Policy,
    pub(crate) shadow_mode: bool,
    pub(super) detailed_metric: bool,
    /// Names of limits this rule supersedes when both match one request.
    pub(crate) replaces: Box<[String]>,
    pub(crate) quota_mode: bool,
    /// The quota group of a quota-mode rule, if it names one.
    pub(crate) quota_group: Option<Arc<str>>,
    /// Consumption is charged, past the limit if need be (quota mode, `budget: true`, or
    /// a budget domain).
    pub(crate) charged: bool,
    pub(crate) metadata: Option<Arc<Metadata>>,
    /// The levels on the rule's path matched by a `share_threshold` wildcard, with its
    /// pattern: the value its counter and metrics use instead of the request's.
    pub(super) shared: Box<[(usize, Box<str>)]>,
}

impl Rule {
    /// Dense among the rules of one [`Rules`]: an index for per-rule state kept elsewhere.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The domain the rule belongs to.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The descriptor's place in the tree, one name per level (`key_value` or `key`).
    pub fn path(&self) -> &[String] {
        &self.path
    }

    /// What the rule does.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decisions are counted but never deny.
    pub fn shadow_mode(&self) -> bool {
        self.shadow_mode
    }

    /// Observers should keep the request's values apart for this rule.
    pub fn detailed_metric(&self) -> bool {
        self.detailed_metric
    }

    /// Over its limit, the descriptor denies its request only when every quota-mode
    /// descriptor of the request is over (the reference's `quota_mode`).
    pub fn quota_mode(&self) -> bool {
        self.quota_mode
    }

    /// The quota group of a quota-mode rule: its descriptors are over together, and the
    /// request is denied only when every group it touches is over.
    pub fn quota_group(&self) -> Option<&str> {
        self.quota_group.as_deref()
    }

    /// Consumption under this rule is charged: recorded even past the limit.
    pub fn charged(&self) -> bool {
        self.charged
    }

    /// Values returned to Envoy while this rule's descriptor is not over.
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_deref()
    }

    /// The value entry `index` of a request counts under: the request's own `value`, or
    /// for a level matched by a `share_threshold` wildcard, the pattern all its values
    /// share.
    pub fn key_value<'a>(&'a self, index: usize, value: &'a str) -> &'a str {
        self.shared
            .iter()
            .find(|(level, _)| *level == index)
            .map_or(value, |(_, pattern)| pattern)
    }

    /// Whether the rule counts slots in flight (`in_flight`) rather than a rate.
    pub fn in_flight(&self) -> bool {
        self.policy.in_flight()
    }

    /// The first level of the rule's path a `share_threshold` wildcard matches, with its
    /// pattern: the values it matches count on one counter.
    pub(crate) fn shared_level(&self) -> Option<(usize, &str)> {
        self.shared
            .first()
            .map(|(level, pattern)| (*level, pattern.as_ref()))
    }

    /// Whether this rule has a limit called `name`.
    pub(crate) fn is_named(&self, name: &str) -> bool {
        match &self.policy {
            Policy::Unlimited { name: own } => own.as_deref() == Some(name),
            Policy::Limited { limits, .. } => limits.iter().any(|l| l.name() == Some(name)),
        }
    }
}

impl Policy {
    /// Whether it counts slots in flight (`in_flight`) rather than a rate.
    pub fn in_flight(&self) -> bool {
        matches!(self, Self::Limited { limits, .. }
            if limits.iter().any(|l| l.algorithm == crate::limit::Algorithm::Slots))
    }
}

/// Unlimited, or one or more limits counted on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Always admitted, never counted.
    Unlimited {
        /// The name `replaces` may refer to.
        name: Option<String>,
    },
    /// Counted against every limit; admitted only if all admit.
    Limited {
        /// The limits, in file order (shared by the counters they are counted on).
        limits: Arc<[Limit]>,
        /// The limits' part of the counter key, computed once here.
        shape: Box<str>,
    },
}
