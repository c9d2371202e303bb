//! A test xDS management server: the Aggregated Discovery Service, State of the World,
//! over tonic and envoy-types, behaving like go-control-plane's snapshot cache as Envoy
//! Gateway runs it. It keeps one snapshot (version + resources) per node id, pushes a new
//! version to every open stream of that node, does not resend a version the client
//! already has, and records every request (ACKs, NACKs and their errors) for tests to
//! assert on.
//!
//! ```ignore
//! let xds = XdsServer::start().await;
//! xds.set("default", "1", vec![resource(config)]);
//! let ack = xds.wait_ack("default", "1").await;
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Name;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// How long the `wait_*` methods wait before failing the test.
pub const WAIT: Duration = Duration::from_secs(30);

/// A `RateLimitConfig` as a resource.
pub fn resource(config: RateLimitConfig) -> Any {
    envoy_types::util::pack_any(config)
}

/// TLS for the server: its certificate, and the CA client certificates must chain to
/// (client certificates are required, as Envoy Gateway requires them).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// One request a client sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Which stream (numbered from 1 in opening order, across restarts).
    pub stream: u64,
    pub node_id: String,
    /// The node metadata's string fields.
    pub node_metadata: HashMap<String, String>,
    pub type_url: String,
    pub version_info: String,
    pub response_nonce: String,
    pub resource_names: Vec<String>,
    /// The NACK's `error_detail.message`; `None` for a subscription or an ACK.
    pub error: Option<String>,
    /// The stream's request metadata (gRPC headers), names in lower case.
    pub headers: HashMap<String, String>,
}

impl Recorded {
    pub fn is_nack(&self) -> bool {
        self.error.is_some()
    }
}

/// One response the server sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub stream: u64,
    pub node_id: String,
    pub version: String,
    pub nonce: String,
}

/// What a node is served.
#[derive(Debug, Clone)]
struct Snapshot {
    version: String,
    resources: Vec<Any>,
}

/// State shared by the server's streams and the test; it outlives restarts.
#[derive(Default)]
struct Shared {
    snapshots: Mutex<HashMap<String, Snapshot>>,
    recorded: Mutex<Vec<Recorded>>,
    sent: Mutex<Vec<Sent>>,
    streams: AtomicU64,
    nonces: AtomicU64,
    /// Bumped on every snapshot change and every recorded request.
    changes: watch::Sender<u64>,
}

impl Shared {
    fn bump(&self) {
        self.changes.send_modify(|n| *n += 1);
    }
}

/// A running management server; stopped on drop.
pub struct XdsServer {
    addr: SocketAddr,
    tls: Option<ServerTls>,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl XdsServer {
    /// Plaintext, on a free loopback port.
    pub async fn start() -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), None).await
    }

    /// TLS with required client certificates, on a free loopback port.
    pub async fn start_tls(tls: ServerTls) -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), Some(tls)).await
    }

    async fn start_on(addr: SocketAddr, tls: Option<ServerTls>) -> Self {
        Self::serve(addr, tls, Arc::default()).await
    }

    async fn serve(addr: SocketAddr, tls: Option<ServerTls>, shared: Arc<Shared>) -> Self {
        let listener = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind the xDS server on {addr}: {e}"));
        let addr = listener.local_addr().expect("xDS server address");
        let (shutdown, stop) = watch::channel(false);
        let mut builder = Server::builder();
        if let Some(tls) = &tls {
            let read = |p: &PathBuf| {
                std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
            };
            let config = ServerTlsConfig::new()
                .identity(Identity::from_pem(read(&tls.cert), read(&tls.key)))
                .client_ca_root(Certificate::from_pem(read(&tls.client_ca)));
            builder = builder.tls_config(config).expect("xDS server TLS config");
        }
        let service = Ads {
            shared: shared.clone(),
            stop: stop.clone(),
        };
        let mut stopped = stop;
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(service));
        let task = tokio::spawn(async move {
            let incoming = TcpListenerStream::new(listener);
            let until = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, until).await {
                eprintln!("xDS test server failed: {e}");
            }
        });
        Self {
            addr,
            tls,
            shared,
            shutdown,
            task: Some(task),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The environment of a Tollgate that takes its rules from this server as `node`,
    /// reconnecting within 100 ms so that restarts are quick to test.
    pub fn client_env(&self, node: &str) -> Vec<(&'static str, String)> {
        vec![
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
            ("CONFIG_GRPC_XDS_SERVER_URL", self.addr.to_string()),
            ("CONFIG_GRPC_XDS_NODE_ID", node.into()),
            (
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
                "100ms".into(),
            ),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms".into()),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s".into()),
        ]
    }

    /// Serves `resources` as `version` to `node`, pushing them to its open streams.
    pub fn set(&self, node: &str, version: &str, resources: Vec<Any>) {
        let snapshot = Snapshot {
            version: version.to_owned(),
            resources,
        };
        lock(&self.shared.snapshots).insert(node.to_owned(), snapshot);
        self.shared.bump();
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.recorded).clone()
    }

    /// Every response sent so far, in order.
    pub fn sent(&self) -> Vec<Sent> {
        lock(&self.shared.sent).clone()
    }

    /// Waits until `found` picks something out of the requests and responses so far.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        mut found: impl FnMut(&[Recorded], &[Sent]) -> Option<T>,
    ) -> T {
        let mut changes = self.shared.changes.subscribe();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            changes.borrow_and_update();
            let hit = found(&lock(&self.shared.recorded), &lock(&self.shared.sent));
            if let Some(hit) = hit {
                return hit;
            }
            let waited = tokio::time::timeout_at(deadline, changes.changed()).await;
            if waited.is_err() {
                panic!(
                    "xDS server: no {what} within {WAIT:?}; requests: {:#?}",
                    self.requests()
                );
            }
        }
    }

    /// Waits for `node` to ACK `version` (on any stream) and returns the ACK.
    pub async fn wait_ack(&self, node: &str, version: &str) -> Recorded {
        self.wait_for(
            &format!("ACK of version {version} from {node}"),
            |requests, sent| {
                requests
                    .iter()
                    .find(|r| {
                        r.node_id == node
                            && !r.is_nack()
                            && r.version_info == version
                            && sent
                                .iter()
                                .any(|s| s.nonce == r.response_nonce && s.version == version)
                    })
                    .cloned()
            },
        )
        .await
    }

    /// Waits for `node` to NACK the response that carried `version`; returns the NACK.
    pub async fn wait_nack(&self, node: &str, version: &str) -> Recorded {
        self.wait_for(
            &format!("NACK of version {version} from {node}"),
            |requests, sent| {
                requests
                    .iter()
                    .find(|r| {
                        r.node_id == node
                            && r.is_nack()
                            && sent
                                .iter()
                                .any(|s| s.nonce == r.response_nonce && s.version == version)
                    })
                    .cloned()
            },
        )
        .await
    }

    /// Waits for a stream of `node` numbered above `after` to subscribe; returns its
    /// first request.
    pub async fn wait_subscription(&self, node: &str, after: u64) -> Recorded {
        self.wait_for(&format!("subscription from {node}"), |requests, _| {
            requests
                .iter()
                .find(|r| r.node_id == node && r.stream > after && r.response_nonce.is_empty())
                .cloned()
        })
        .await
    }

    /// Stops serving: open streams end with UNAVAILABLE, the port closes. The snapshots
    /// and the record are kept for [`XdsServer::restart`].
    pub async fn stop(&mut self) {
        self.shutdown.send_replace(true);
        if let Some(task) = self.task.take() {
            // Clients drop their connection once the stream ends; do not wait for ever.
            let abort = task.abort_handle();
            if tokio::time::timeout(WAIT, task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// Serves again on the same address, with the same snapshots and record.
    pub async fn restart(mut self) -> Self {
        self.stop().await;
        let (addr, tls, shared) = (self.addr, self.tls.clone(), self.shared.clone());
        Self::serve(addr, tls, shared).await
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The ADS service.
struct Ads {
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let headers = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let stream = self.shared.streams.fetch_add(1, Ordering::SeqCst) + 1;
        let (tx, rx) = mpsc::channel(16);
        let session = Session {
            shared: self.shared.clone(),
            stream,
            headers,
            tx,
        };
        tokio::spawn(session.run(request.into_inner(), self.stop.clone()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented(
            "this test server speaks State of the World only",
        ))
    }
}

/// One client stream.
struct Session {
    shared: Arc<Shared>,
    stream: u64,
    headers: HashMap<String, String>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
}

impl Session {
    async fn run(self, mut incoming: Streaming<DiscoveryRequest>, mut stop: watch::Receiver<bool>) {
        let mut changes = self.shared.changes.subscribe();
        let mut node: Option<String> = None;
        // The version the client has: what it said on subscribing, then what was sent.
        let mut client_has: Option<String> = None;
        loop {
            tokio::select! {
                message = incoming.message() => match message {
                    Ok(Some(request)) => {
                        let id = request.node.as_ref().map(|n| n.id.clone()).unwrap_or_default();
                        let first = node.is_none();
                        if first {
                            node = Some(id);
                            client_has = Some(request.version_info.clone());
                        }
                        self.record(request);
                    }
                    // The client went away.
                    _ => return,
                },
                changed = changes.changed() => if changed.is_err() { return },
                () = async { let _ = stop.wait_for(|s| *s).await; } => {
                    let _ = self.tx.send(Err(Status::unavailable("management server stopping"))).await;
                    return;
                }
            }
            let Some(node) = &node else { continue };
            let snapshot = lock(&self.shared.snapshots).get(node).cloned();
            let Some(snapshot) = snapshot else { continue };
            if client_has.as_deref() == Some(snapshot.version.as_str()) {
                continue;
            }
            client_has = Some(snapshot.version.clone());
            let nonce = self.shared.nonces.fetch_add(1, Ordering::SeqCst) + 1;
            let response = DiscoveryResponse {
                version_info: snapshot.version.clone(),
                resources: snapshot.resources,
                type_url: RateLimitConfig::type_url(),
                nonce: nonce.to_string(),
                ..Default::default()
            };
            lock(&self.shared.sent).push(Sent {
                stream: self.stream,
                node_id: node.clone(),
                version: snapshot.version,
                nonce: nonce.to_string(),
            });
            if self.tx.send(Ok(response)).await.is_err() {
                return;
            }
            self.shared.bump();
        }
    }

    fn record(&self, request: DiscoveryRequest) {
        let node = request.node.unwrap_or_default();
        let node_metadata = node
            .metadata
            .map(|m| m.fields)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| match v.kind {
                Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => {
                    Some((k, s))
                }
                _ => None,
            })
            .collect();
        lock(&self.shared.recorded).push(Recorded {
            stream: self.stream,
            node_id: node.id,
            node_metadata,
            type_url: request.type_url,
            version_info: request.version_info,
            response_nonce: request.response_nonce,
            resource_names: request.resource_names,
            error: request.error_detail.map(|e| e.message),
            headers: self.headers.clone(),
        });
        self.shared.bump();
    }
}
