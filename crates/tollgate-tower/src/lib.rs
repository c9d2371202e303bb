#![doc = include_str!("../README.md")]
#![warn(unreachable_pub, missing_docs)]

mod denial;
mod describe;
pub mod extract;
mod layer;
mod policy_names;
mod redis;
mod reply;

pub use denial::{Denial, DenialBody};
pub use describe::{Describe, DescribeError};
pub use layer::{LimitedBody, RateLimit, RateLimitLayer};
pub use redis::RedisStore;
/// The decision core: rules, limiter, stores.
pub use tollgate_core as core;
