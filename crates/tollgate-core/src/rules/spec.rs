//! The rules model: the YAML file format of envoyproxy/ratelimit, plus Tollgate's optional
//! extensions. Rules built in code or received over xDS are this model too, so that they
//! go through the same validation.
//!
//! Every struct denies unknown fields, so a typo such as `requestsperunit` is an error
//! rather than a silently missing setting.

use serde::Deserialize;

use super::meta::Metadata;

/// One domain and its descriptor tree: a rules file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainSpec {
    /// The domain requests name; must not be empty.
    #[serde(default)]
    pub domain: String,
    /// The top level of the descriptor tree.
    #[serde(default)]
    pub descriptors: Vec<DescriptorSpec>,
}

/// One level of the descriptor tree.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorSpec {
    /// The entry key this descriptor matches.
    #[serde(default)]
    pub key: String,
    /// The value it matches: exact, a pattern with `*`, or none for any value.
    pub value: Option<String>,
    /// The limit of requests whose last entry matches here.
    pub rate_limit: Option<RateLimitSpec>,
    /// Ours: several limits on one descriptor, all of which must admit.
    pub rate_limits: Option<Vec<RateLimitSpec>>,
    /// Ours: how many requests may be in flight at once, in place of a rate limit.
    pub in_flight: Option<InFlightSpec>,
    /// The next level.
    #[serde(default)]
    pub descriptors: Vec<DescriptorSpec>,
    /// Count and report, never deny.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Metrics labelled with the request's values.
    #[serde(default)]
    pub detailed_metric: bool,
    /// The reference's flag for metrics keyed by the request value (see `detailed_metric`).
    #[serde(default)]
    pub value_to_metric: bool,
    /// The reference's: every value this wildcard matches counts on one counter, the
    /// pattern's, instead of one counter per value.
    #[serde(default)]
    pub share_threshold: bool,
    /// A budget, in the reference's words: the request is denied only when every quota
    /// descriptor of it is over (or a non-quota one is), and charges are recorded even
    /// past the limit.
    #[serde(default)]
    pub quota_mode: bool,
    /// Ours: the quota group of a quota-mode rule. A group is over when any of its
    /// descriptors is; a request is denied when every group it touches is over (a rule
    /// without a group is a group of its own). Over xDS: the metadata key `quota_group`.
    pub quota_group: Option<String>,
    /// Ours: a budget without quota mode's overall answer: consumption is recorded even
    /// past the limit (usage reported after the fact, e.g. LLM tokens), and the debt
    /// denies until it has aged out of the window.
    #[serde(default)]
    pub budget: bool,
    /// Values returned to Envoy (as dynamic metadata) while this descriptor is not over.
    pub metadata: Option<Metadata>,
}

/// A limit as written in the file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    /// second, minute, hour, day, week, month or year (any case).
    pub unit: Option<String>,
    /// Missing means 0, which blocks every request, as in the reference.
    #[serde(default)]
    pub requests_per_unit: u32,
    /// Never limited (no unit may be given).
    #[serde(default)]
    pub unlimited: bool,
    /// The name responses carry and `replaces` refers to.
    pub name: Option<String>,
    /// Names of limits this one supersedes when both match one request.
    #[serde(default)]
    pub replaces: Vec<ReplaceSpec>,
    /// Ours: the window is `unit_multiplier` units long.
    pub unit_multiplier: Option<u32>,
    /// Ours: sliding_window (default), fixed_window, token_bucket or leaky_bucket.
    pub algorithm: Option<String>,
    /// Ours: bucket capacity for token/leaky buckets (default requests_per_unit).
    pub burst: Option<u32>,
    /// Ours: sub-windows of a sliding window (default from the settings).
    pub precision: Option<u32>,
    /// Ours: a day, week, month or year fixed window that starts at midnight on the
    /// calendar of `time_zone` (default from the settings: off, or the default zone's).
    pub calendar: Option<bool>,
    /// Ours: the IANA time zone of a calendar window (default UTC).
    pub time_zone: Option<String>,
}

/// An in-flight limit as written in the file: a hit takes a slot, a refund
/// (`is_negative_hits`) releases one.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InFlightSpec {
    /// Slots held at most at once.
    pub max: Option<u32>,
    /// How long a slot not released is held before it frees itself (`60s`, `500ms`, `2m`).
    pub expire_after: Option<String>,
    /// The name responses carry and `replaces` refers to.
    pub name: Option<String>,
}

/// A `replaces` entry: the name of a limit this descriptor's limit supersedes.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceSpec {
    /// The superseded limit's name.
    #[serde(default)]
    pub name: String,
}
