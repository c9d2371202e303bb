//! Tollgate: an Envoy-compatible external rate-limit service.
//!
//! The request path is [`service::Service::decide`]: validate, match rules, apply limits
//! through a [`store::Store`], answer. gRPC and HTTP are thin adapters over it.

pub mod admin;
pub mod client;
pub mod config;
pub mod key;
pub mod limiter;
pub mod metrics;
pub mod server;
pub mod service;
pub mod settings;
pub mod store;
