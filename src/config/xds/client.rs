//! The stream loop: connect, subscribe, answer every response with an ACK (after its rules
//! are live) or a NACK (the previous rules keep serving), and when the stream ends wait
//! per the backoff and start over. Rules in force are never dropped for a lost stream.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::XdsConfig;
use super::ack::Subscription;
use super::backoff::{Backoff, spread};
use super::convert;
use super::problem::Problem;
use crate::app::App;
use crate::config::rules_status::Source;
use crate::ops::metrics::XdsStats;

/// How the reference spreads its connect retries (`BackoffLinearWithJitter(interval, 0.5)`).
const CONNECT_JITTER: f64 = 0.5;

/// Keeps rules flowing from the management server into `app`, forever.
pub(crate) async fn run(config: XdsConfig, app: Arc<App>, stats: Arc<XdsStats>) {
    let mut random = fastrand::f64;
    let mut subscription = Subscription::new(config.node.clone());
    let mut backoff = Backoff::new(config.backoff);
    let mut streams = 0u64;
    loop {
        let channel = connect(&config, &mut random).await;
        let ended = stream(
            &config,
            channel,
            &mut subscription,
            &app,
            &stats,
            streams > 0,
        )
        .await;
        streams += 1;
        stats.connected(false, false);
        if ended.delivered {
            backoff.reset();
        }
        let wait = backoff.next(&mut random);
        tracing::warn!(
            server = %config.server,
            "xDS stream ended ({}); the rules in force keep serving; reconnecting in {wait:?}",
            ended.reason
        );
        tokio::time::sleep(wait).await;
    }
}

/// A channel to the management server, retrying every `connect_retry` until one opens.
async fn connect(config: &XdsConfig, random: &mut impl FnMut() -> f64) -> Channel {
    loop {
        match config.endpoint.connect().await {
            Ok(channel) => return channel,
            Err(e) => {
                let wait = spread(config.connect_retry, CONNECT_JITTER, random);
                // tonic's transport error says little; its source says what failed.
                let cause = std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_else(|| e.to_string());
                tracing::warn!(
                    server = %config.server,
                    "cannot reach the xDS server ({cause}); trying again in {wait:?}"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// How a stream ended.
struct Ended {
    /// It carried at least one response: the server works, so back off from the start.
    delivered: bool,
    reason: String,
}

/// One ADS stream, until it fails or the server closes it.
async fn stream(
    config: &XdsConfig,
    channel: Channel,
    subscription: &mut Subscription,
    app: &App,
    stats: &XdsStats,
    again: bool,
) -> Ended {
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    if let Some(limit) = config.max_message_bytes {
        client = client.max_decoding_message_size(limit);
    }
    // The stream only ever holds the next answer; a second is never queued.
    let (requests, outgoing) = mpsc::channel::<DiscoveryRequest>(1);
    let ended = |delivered: bool, reason: String| Ended { delivered, reason };
    if requests.send(subscription.initial()).await.is_err() {
        return ended(false, "the request stream closed".into());
    }
    let mut request = tonic::Request::new(ReceiverStream::new(outgoing));
    *request.metadata_mut() = config.headers.clone();
    let mut responses = match client.stream_aggregated_resources(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return ended(false, describe(&status)),
    };
    stats.connected(true, again);
    tracing::info!(server = %config.server, node = %config.node.id, "xDS stream open");
    let mut delivered = false;
    loop {
        let response = match responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return ended(delivered, "the server closed the stream".into()),
            Err(status) => return ended(delivered, describe(&status)),
        };
        delivered = true;
        let answer = apply(config, response, subscription, app, stats).await;
        if requests.send(answer).await.is_err() {
            return ended(delivered, "the request stream closed".into());
        }
    }
}

/// Installs the rules of `response` and returns the ACK, or returns the NACK.
async fn apply(
    config: &XdsConfig,
    mut response: DiscoveryResponse,
    subscription: &mut Subscription,
    app: &App,
    stats: &XdsStats,
) -> DiscoveryRequest {
    let version = response.version_info.clone();
    let compiled = if response.type_url == subscription.type_url() {
        // Compiling a large configuration is CPU work: keep it off the async workers.
        let resources = std::mem::take(&mut response.resources);
        let builder = config.rules.builder();
        tokio::task::spawn_blocking(move || convert::compile(&resources, builder))
            .await
            .unwrap_or_else(|e| Err(vec![Problem::Compiling(e)]))
    } else {
        Err(vec![Problem::ResponseType {
            found: response.type_url.clone(),
            subscribed: subscription.type_url().to_owned(),
        }])
    };
    match compiled {
        Ok(compiled) => {
            let domains = compiled.rules.domains().count();
            let source = Source::Xds {
                server: config.server.clone(),
                version: version.clone(),
            };
            app.install(compiled.rules, source);
            stats.acked(&version, Instant::now());
            tracing::info!(
                version = %version,
                domains,
                resources = ?compiled.resources,
                "xDS rules in force"
            );
            subscription.ack(&response)
        }
        Err(problems) => {
            app.metrics.config_load_error.inc_by(1);
            stats.nacked();
            for problem in &problems {
                tracing::error!(version = %version, "{problem}");
            }
            tracing::error!(
                version = %version,
                "xDS rules rejected (NACK); the previous rules keep serving"
            );
            subscription.nack(&response, &problems)
        }
    }
}

/// A gRPC status in a log line: its code and message.
fn describe(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}
