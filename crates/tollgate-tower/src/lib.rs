//! Tollgate's rate limits inside a Rust service: a [`tower`](https://docs.rs/tower) layer
//! for axum, tonic and hyper services, with the same rules (YAML or built in code), the
//! same algorithms and the same stores as the Tollgate server. Several replicas of a
//! service share limits through Redis exactly as Tollgate sidecars do.
//!
//! Each request is turned into descriptors by a function you give (the [`extract`]
//! module has the usual entries: client IP, path, a header); a request over its limit is
//! answered `429 Too Many Requests` with `Retry-After` and the RateLimit headers, or, for a
//! gRPC request, `RESOURCE_EXHAUSTED`, without reaching the service.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_tower::core::{Limiter, MemoryStore, Rules, Store};
//! use tollgate_tower::{RateLimitLayer, extract};
//!
//! let rules = Rules::from_yaml("rules.yaml", r#"
//! domain: api
//! descriptors:
//!   - key: remote_address
//!     descriptors:
//!       - key: path
//!         rate_limit: {unit: second, requests_per_unit: 5}
//! "#)?;
//! let limiter = Arc::new(Limiter::new(rules, Store::Memory(MemoryStore::default())));
//! let layer = RateLimitLayer::new(limiter, "api", extract::client_ip_and_path);
//! let app: axum::Router = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "hello" }))
//!     .layer(layer);
//! # let _ = app;
//! # Ok::<(), tollgate_tower::core::ConfigErrors>(())
//! ```
//!
//! Outside HTTP, ask the limiter directly:
//! [`Limiter::check`](tollgate_core::Limiter::check).

#![warn(unreachable_pub, missing_docs)]

pub mod extract;
mod layer;
mod reply;

pub use layer::{Describe, LimitedBody, RateLimit, RateLimitLayer};
/// The decision core: rules, limiter, stores.
pub use tollgate_core as core;
