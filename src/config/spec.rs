//! The YAML file format of envoyproxy/ratelimit, plus Tollgate's optional extensions.
//!
//! Every struct denies unknown fields, so a typo such as `requestsperunit` is an error
//! rather than a silently missing setting.

use serde::Deserialize;

/// One rules file: a domain and its descriptor tree.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    #[serde(default)]
    pub domain: String,
    #[serde(default)]
    pub descriptors: Vec<DescriptorSpec>,
}

/// One level of the descriptor tree.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorSpec {
    #[serde(default)]
    pub key: String,
    pub value: Option<String>,
    pub rate_limit: Option<RateLimitSpec>,
    /// Ours: several limits on one descriptor, all of which must admit.
    pub rate_limits: Option<Vec<RateLimitSpec>>,
    #[serde(default)]
    pub descriptors: Vec<DescriptorSpec>,
    #[serde(default)]
    pub shadow_mode: bool,
    #[serde(default)]
    pub detailed_metric: bool,
    /// The reference's flag for metrics keyed by the request value (see `detailed_metric`).
    #[serde(default)]
    pub value_to_metric: bool,
}

/// A limit as written in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    pub unit: Option<String>,
    /// Missing means 0, which blocks every request, as in the reference.
    #[serde(default)]
    pub requests_per_unit: u32,
    #[serde(default)]
    pub unlimited: bool,
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
}

/// A `replaces` entry: the name of a limit this descriptor's limit supersedes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceSpec {
    #[serde(default)]
    pub name: String,
}
