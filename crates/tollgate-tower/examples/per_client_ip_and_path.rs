//! An axum service limited per client IP and path, the token-bucket scenario the product
//! grew from: each client gets a bucket of 10 requests per path refilling at 10 a second,
//! and a stricter one on `/login`.
//!
//! Run it (`cargo run -p tollgate-tower --example per_client_ip_and_path --features axum`)
//! and try `curl -i localhost:3000/hello` a dozen times quickly. It prints the address it
//! listens on; `LISTEN=127.0.0.1:0` picks a free port.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use tollgate_tower::core::{ConfigErrors, Limiter, MemoryStore, Rules, Store};
use tollgate_tower::{RateLimitLayer, extract};

/// The rules, in the YAML of envoyproxy/ratelimit.
const RULES: &str = r#"
domain: example
descriptors:
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}
"#;

/// The service with its rate limit: what `main` serves and what the tests drive.
pub fn app() -> Result<Router, ConfigErrors> {
    let rules = Rules::from_yaml("example rules", RULES)?;
    let limiter = Arc::new(Limiter::new(rules, Store::Memory(MemoryStore::default())));
    Ok(Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .layer(RateLimitLayer::new(
            limiter,
            "example",
            extract::client_ip_and_path,
        )))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    // ConnectInfo puts each connection's peer address where `extract::client_ip` finds it;
    // served as `axum::serve(listener, app)`, every request would be answered 500.
    let service = app()?.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service).await?;
    Ok(())
}
