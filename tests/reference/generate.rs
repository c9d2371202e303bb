//! Random cases for the differential test, from a seed: a rule set in the subset of the
//! rules format that the pinned reference accepts, the reference's settings that change
//! answers, and a sequence of requests that keep hitting the same counters.
//!
//! Rules: nested descriptors up to three deep; exact values, values ending in `*` (the
//! only wildcard this reference knows: a prefix), key-only defaults; limits per minute or
//! longer (a second window could roll over between the two servers' answers), 0 to 10
//! requests, `unlimited` (sometimes with `unit: unknown`), `name`, `replaces`,
//! `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`.
//! Keys and values have no `_` (the reference joins them with `_`, so `a`=`b_c` and
//! `a_b`=`c` are one counter there: a known difference, kept out of the way of the
//! others). The reference at this version has no `metadata` on rules.
//!
//! Requests: one to three descriptors drawn from a few shapes that follow the rules
//! (their wildcards filled in, sometimes a level short or an entry too many, sometimes
//! nothing the rules know, rarely no entries at all), `hits_addend` 0, 1 or more at
//! request and descriptor level, limit overrides, `is_negative_hits`, and now and then
//! an unknown domain.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate_testkit::rng::Rng;

/// The domain of requests meant for the case's rules; [`Case::domain`] replaces it.
pub const RULES_DOMAIN: &str = "@rules";
/// A domain no rule file has.
pub const UNKNOWN_DOMAIN: &str = "nodomain";

const KEYS: &[&str] = &["a", "b", "c"];
const VALUES: &[&str] = &["x", "y", "xy", "yx", "z"];
const WILDCARDS: &[&str] = &["x*", "y*", "*"];
/// What a wildcard's prefix is filled in with.
const SUFFIXES: &[&str] = &["", "a", "yz"];
const NAMES: &[&str] = &["n1", "n2", "n3"];
const UNITS: &[(&str, Unit)] = &[
    ("minute", Unit::Minute),
    ("minute", Unit::Minute),
    ("minute", Unit::Minute),
    ("hour", Unit::Hour),
    ("hour", Unit::Hour),
    ("day", Unit::Day),
    ("week", Unit::Week),
    ("month", Unit::Month),
    ("year", Unit::Year),
];
const PER_UNIT: &[u32] = &[0, 1, 1, 2, 2, 3, 3, 4, 5, 10];

/// One case: rules, the settings both servers get, requests.
#[derive(Clone, Debug)]
pub struct Case {
    pub seed: u64,
    /// Variables of the reference (and of Tollgate, which reads the same ones).
    pub settings: Vec<(String, String)>,
    pub rules: Vec<Node>,
    pub requests: Vec<RateLimitRequest>,
}

/// A descriptor of the rules.
#[derive(Clone, Debug)]
pub struct Node {
    pub key: &'static str,
    pub value: Option<&'static str>,
    pub limit: Option<Limit>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub children: Vec<Node>,
}

#[derive(Clone, Debug)]
pub struct Limit {
    /// `None`: `unlimited: true`, which takes no unit or `unit: unknown`.
    pub rate: Option<(&'static str, u32)>,
    /// `unit: unknown` beside `unlimited: true`.
    pub unknown_unit: bool,
    pub name: Option<&'static str>,
    pub replaces: Vec<&'static str>,
}

impl Case {
    /// The case of `seed`, without the features in `without` (see [`FEATURES`]).
    pub fn generate(seed: u64, without: &[&'static str]) -> Self {
        let mut g = Gen {
            rng: Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed),
            without,
        };
        let settings = g.settings();
        let rules = g.level(0);
        let shapes: Vec<Vec<Entry>> = (0..2 + g.rng.below(4)).map(|_| g.shape(&rules)).collect();
        let requests = (0..12 + g.rng.below(19))
            .map(|_| g.request(&shapes))
            .collect();
        Self {
            seed,
            settings,
            rules,
            requests,
        }
    }

    /// The rule file for `domain`.
    pub fn rules_yaml(&self, domain: &str) -> String {
        let mut yaml = format!("domain: {domain}\ndescriptors:\n");
        for node in &self.rules {
            node.write(&mut yaml, 1);
        }
        yaml
    }

    /// The case made simpler in one way each, in a fixed order: without one setting,
    /// then for each descriptor of the rules in pre-order, without it (and what it nests),
    /// and with one of its options dropped (a flag, the name, the replaces).
    pub fn simplifications(&self) -> Vec<Case> {
        let mut out = Vec::new();
        for i in 0..self.settings.len() {
            let mut case = self.clone();
            case.settings.remove(i);
            out.push(case);
        }
        let mut paths = Vec::new();
        node_paths(&self.rules, &mut Vec::new(), &mut paths);
        for path in paths {
            let Some((&last, parent)) = path.split_last() else {
                continue;
            };
            if !(parent.is_empty() && self.rules.len() == 1) {
                let mut case = self.clone();
                siblings(&mut case.rules, parent).remove(last);
                out.push(case);
            }
            for option in 0..OPTIONS {
                let mut case = self.clone();
                if siblings(&mut case.rules, parent)[last].drop_option(option) {
                    out.push(case);
                }
            }
        }
        out
    }

    /// `req` for the rules of `domain`.
    pub fn domain(req: &RateLimitRequest, domain: &str) -> RateLimitRequest {
        let mut req = req.clone();
        if req.domain == RULES_DOMAIN {
            req.domain = domain.to_owned();
        }
        req
    }
}

/// The options [`Node::drop_option`] can drop.
const OPTIONS: usize = 7;

/// The index paths of every node of `nodes`, in pre-order.
fn node_paths(nodes: &[Node], prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    for (i, node) in nodes.iter().enumerate() {
        prefix.push(i);
        out.push(prefix.clone());
        node_paths(&node.children, prefix, out);
        prefix.pop();
    }
}

/// The list of nodes that the node at `parent` (empty: the top) nests.
fn siblings<'a>(nodes: &'a mut Vec<Node>, parent: &[usize]) -> &'a mut Vec<Node> {
    match parent.split_first() {
        None => nodes,
        Some((first, rest)) => siblings(&mut nodes[*first].children, rest),
    }
}

impl Node {
    /// Drops option `option` (see [`OPTIONS`]); false if it was not set.
    fn drop_option(&mut self, option: usize) -> bool {
        let flag = match option {
            0 => &mut self.shadow_mode,
            1 => &mut self.quota_mode,
            2 => &mut self.detailed_metric,
            3 => &mut self.value_to_metric,
            4 => &mut self.share_threshold,
            5 => return self.limit.as_mut().and_then(|l| l.name.take()).is_some(),
            _ => {
                return self
                    .limit
                    .as_mut()
                    .is_some_and(|l| !std::mem::take(&mut l.replaces).is_empty());
            }
        };
        std::mem::replace(flag, false)
    }

    fn write(&self, yaml: &mut String, depth: usize) {
        let pad = "  ".repeat(depth);
        yaml.push_str(&format!("{pad}- key: {}\n", self.key));
        let pad = format!("{pad}  ");
        if let Some(value) = self.value {
            yaml.push_str(&format!("{pad}value: \"{value}\"\n"));
        }
        for (flag, on) in [
            ("shadow_mode", self.shadow_mode),
            ("quota_mode", self.quota_mode),
            ("detailed_metric", self.detailed_metric),
            ("value_to_metric", self.value_to_metric),
            ("share_threshold", self.share_threshold),
        ] {
            if on {
                yaml.push_str(&format!("{pad}{flag}: true\n"));
            }
        }
        if let Some(limit) = &self.limit {
            yaml.push_str(&format!("{pad}rate_limit:\n"));
            match limit.rate {
                Some((unit, per_unit)) => {
                    yaml.push_str(&format!("{pad}  unit: {unit}\n"));
                    yaml.push_str(&format!("{pad}  requests_per_unit: {per_unit}\n"));
                }
                None => {
                    yaml.push_str(&format!("{pad}  unlimited: true\n"));
                    if limit.unknown_unit {
                        yaml.push_str(&format!("{pad}  unit: unknown\n"));
                    }
                }
            }
            if let Some(name) = limit.name {
                yaml.push_str(&format!("{pad}  name: {name}\n"));
            }
            if !limit.replaces.is_empty() {
                yaml.push_str(&format!("{pad}  replaces:\n"));
                for name in &limit.replaces {
                    yaml.push_str(&format!("{pad}    - name: {name}\n"));
                }
            }
        }
        if !self.children.is_empty() {
            yaml.push_str(&format!("{pad}descriptors:\n"));
            for child in &self.children {
                child.write(yaml, depth + 2);
            }
        }
    }
}

/// What the generator can leave out, by name (`DIFFERENTIAL_WITHOUT=name,…`): so that a
/// known difference stops hiding the ones behind it (a seed stops at its first).
pub const FEATURES: &[(&str, &str)] = &[
    ("shadow", "shadow_mode rules and SHADOW_MODE"),
    ("quota", "quota_mode rules and QUOTA_MODE"),
    ("share_threshold", "share_threshold on wildcards"),
    ("unknown_unit", "`unit: unknown` with `unlimited`"),
    ("unlimited", "`unlimited` limits"),
    ("replaces", "`replaces`"),
    ("override", "limit overrides in requests"),
    ("negative", "is_negative_hits"),
    ("empty", "descriptors without entries"),
    ("check", "hits_addend 0 on a descriptor"),
    ("multi_hits", "hits_addend above 1"),
    ("unknown_domain", "requests for a domain without rules"),
    ("headers", "LIMIT_RESPONSE_HEADERS_ENABLED"),
    ("metadata", "RESPONSE_DYNAMIC_METADATA"),
    ("stop_increment", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
];

/// The features left out: `DIFFERENTIAL_WITHOUT`, checked against [`FEATURES`].
pub fn without_from_env() -> Vec<&'static str> {
    let Ok(list) = std::env::var("DIFFERENTIAL_WITHOUT") else {
        return Vec::new();
    };
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            FEATURES
                .iter()
                .find(|(feature, _)| *feature == name)
                .map(|(feature, _)| *feature)
                .unwrap_or_else(|| {
                    panic!("DIFFERENTIAL_WITHOUT names {name:?}; the features are {FEATURES:#?}")
                })
        })
        .collect()
}

/// A seeded generator with features left out.
struct Gen<'a> {
    rng: Rng,
    without: &'a [&'static str],
}

impl Gen<'_> {
    /// `percent` % of the time, never for a feature left out.
    fn chance(&mut self, feature: &str, percent: usize) -> bool {
        !self.without.contains(&feature) && self.rng.below(100) < percent
    }

    /// `percent` % of the time.
    fn sometimes(&mut self, percent: usize) -> bool {
        self.rng.below(100) < percent
    }

    fn settings(&mut self) -> Vec<(String, String)> {
        let mut settings = Vec::new();
        for (feature, name, percent) in [
            ("headers", "LIMIT_RESPONSE_HEADERS_ENABLED", 25),
            ("metadata", "RESPONSE_DYNAMIC_METADATA", 25),
            (
                "stop_increment",
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
                15,
            ),
            ("shadow", "SHADOW_MODE", 5),
            ("quota", "QUOTA_MODE", 5),
        ] {
            if self.chance(feature, percent) {
                settings.push((name.to_owned(), "true".to_owned()));
            }
        }
        settings
    }

    /// The descriptors of one level, unique by key and value as the reference requires.
    fn level(&mut self, depth: usize) -> Vec<Node> {
        let mut nodes: Vec<Node> = Vec::new();
        for _ in 0..1 + self.rng.below(4) {
            let key = *self.rng.pick(KEYS);
            let value = match self.rng.below(10) {
                0..=2 => None,
                3..=6 => Some(*self.rng.pick(VALUES)),
                _ => Some(*self.rng.pick(WILDCARDS)),
            };
            if nodes.iter().any(|n| n.key == key && n.value == value) {
                continue;
            }
            let children = if depth < 2 && self.sometimes(45 - 20 * depth) {
                self.level(depth + 1)
            } else {
                Vec::new()
            };
            let wildcard = value.is_some_and(|v| v.ends_with('*'));
            let limit = (children.is_empty() || self.sometimes(50)).then(|| self.limit());
            nodes.push(Node {
                key,
                value,
                limit,
                shadow_mode: self.chance("shadow", 12),
                quota_mode: self.chance("quota", 8),
                detailed_metric: self.sometimes(10),
                value_to_metric: self.sometimes(3),
                share_threshold: wildcard && self.chance("share_threshold", 2),
                children,
            });
        }
        nodes
    }

    fn limit(&mut self) -> Limit {
        let rate = if self.chance("unlimited", 10) {
            None
        } else {
            Some((self.rng.pick(UNITS).0, *self.rng.pick(PER_UNIT)))
        };
        let name = self.sometimes(35).then(|| *self.rng.pick(NAMES));
        let mut replaces = Vec::new();
        if self.chance("replaces", 20) {
            for _ in 0..1 + self.rng.below(2) {
                let other = *self.rng.pick(NAMES);
                if Some(other) != name && !replaces.contains(&other) {
                    replaces.push(other);
                }
            }
        }
        Limit {
            unknown_unit: rate.is_none() && self.chance("unknown_unit", 10),
            rate,
            name,
            replaces,
        }
    }

    /// The entries of a descriptor: a walk down the rules, stopping at a random level, now
    /// and then leaving them or going one entry past them.
    fn shape(&mut self, rules: &[Node]) -> Vec<Entry> {
        let mut entries = Vec::new();
        let mut level = rules;
        loop {
            let entry = if level.is_empty() || self.sometimes(10) {
                Entry {
                    key: (*self.rng.pick(KEYS)).to_owned(),
                    value: (*self.rng.pick(VALUES)).to_owned(),
                }
            } else {
                let node = self.rng.pick(level);
                let value = match node.value {
                    None => (*self.rng.pick(VALUES)).to_owned(),
                    Some(wildcard) if wildcard.ends_with('*') => {
                        let suffix = self.rng.pick(SUFFIXES);
                        format!("{}{suffix}", wildcard.trim_end_matches('*'))
                    }
                    Some(value) => value.to_owned(),
                };
                let value = if value.is_empty() {
                    "x".to_owned()
                } else {
                    value
                };
                level = &node.children;
                Entry {
                    key: node.key.to_owned(),
                    value,
                }
            };
            entries.push(entry);
            if entries.len() == 3 || self.sometimes(45) {
                return entries;
            }
        }
    }

    /// How many hits: often the default, sometimes 0 (a check) or 1, now and then more.
    fn hits(&mut self) -> Option<u64> {
        match self.rng.below(20) {
            0..=11 => None,
            12..=14 if self.chance("check", 100) => Some(0),
            12..=16 => Some(1),
            _ if self.chance("multi_hits", 100) => Some(2 + self.rng.below(3) as u64),
            _ => Some(1),
        }
    }

    fn request(&mut self, shapes: &[Vec<Entry>]) -> RateLimitRequest {
        let descriptors = (0..1 + self.rng.below(3))
            .map(|_| {
                let hits_addend = self.hits();
                let limit = self.chance("override", 6).then(|| RateLimitOverride {
                    requests_per_unit: self.rng.below(6) as u32,
                    unit: *self.rng.pick(&[Unit::Minute, Unit::Hour, Unit::Day]) as i32,
                });
                let entries = if self.chance("empty", 1) {
                    Vec::new()
                } else {
                    self.rng.pick(shapes).clone()
                };
                RateLimitDescriptor {
                    entries,
                    limit,
                    hits_addend: hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: self.chance("negative", 3),
                }
            })
            .collect();
        // The request's hits_addend: 0 means 1; never a check.
        let hits_addend = match self.hits() {
            None | Some(0) => 0,
            Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
        };
        let domain = if self.chance("unknown_domain", 4) {
            UNKNOWN_DOMAIN
        } else {
            RULES_DOMAIN
        };
        RateLimitRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend,
        }
    }
}
