//! Why a response's rules are refused: each problem a NACK lists and the log names.

use tollgate_core::ConfigError;

/// One reason a response is refused (NACKed), naming the resource at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Problem {
    #[error("unexpected resource type '{found}'; subscribed to '{subscribed}' only")]
    ResponseType { found: String, subscribed: String },
    #[error("resources[{index}]: resource of type '{found}', expected '{expected}'")]
    ResourceType {
        index: usize,
        found: String,
        expected: String,
    },
    #[error("resources[{index}]: cannot decode a RateLimitConfig: {error}")]
    Undecodable {
        index: usize,
        error: prost::DecodeError,
    },
    /// Named by the resource: `name: descriptors[0].rate_limit.unit: …`.
    #[error(transparent)]
    Rule(ConfigError),
    #[error("compiling the rules failed: {0}")]
    Compiling(tokio::task::JoinError),
}
