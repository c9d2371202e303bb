//! Prometheus's statsd_exporter, where the reference's own integration suite reads the
//! metrics a rate-limit service sends over statsd: it takes statsd lines on a TCP and a
//! UDP port, maps them to Prometheus series with a mapping file, and serves `/metrics`.
//! Installed beside the reference (see [`crate::reference::installed`]).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::process::Process;
use crate::reference::Installed;
use crate::{Error, free_ports, http, loopback};

/// How long the exporter may take to answer on its ports.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running statsd_exporter on loopback; killed when dropped.
pub struct StatsdExporter {
    _process: Process,
    /// Where statsd lines go, over TCP or UDP.
    pub statsd: SocketAddr,
    /// `/metrics`.
    pub web: SocketAddr,
}

impl StatsdExporter {
    /// Starts the exporter with `mapping` (its `--statsd.mapping-config`) on free loopback
    /// ports; ready once `/metrics` answers and the statsd TCP port accepts.
    pub async fn start(installed: &Installed, mapping: &Path) -> Self {
        Self::try_start(installed, mapping)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn try_start(installed: &Installed, mapping: &Path) -> Result<Self, Error> {
        let [statsd, web] = free_ports().map(loopback);
        let mut cmd = Command::new(&installed.statsd_exporter);
        cmd.env_clear()
            .arg(format!("--statsd.mapping-config={}", mapping.display()))
            .arg(format!("--statsd.listen-udp={statsd}"))
            .arg(format!("--statsd.listen-tcp={statsd}"))
            .arg(format!("--web.listen-address={web}"));
        let mut process = Process::start("statsd_exporter", cmd)?;
        process
            .await_answering(STARTUP_TIMEOUT, async || answering(statsd, web).await)
            .await?;
        Ok(Self {
            _process: process,
            statsd,
            web,
        })
    }

    /// Its `/metrics` page.
    pub async fn metrics(&self) -> String {
        let page = http::get(self.web, "/metrics").await;
        assert_eq!(
            page.status, 200,
            "GET /metrics of statsd_exporter: {page:?}"
        );
        page.body
    }
}

async fn answering(statsd: SocketAddr, web: SocketAddr) -> Result<(), String> {
    let page = http::send(web, http::Method::GET, "/metrics", &[], "").await?;
    if page.status != 200 {
        return Err(format!("/metrics answers {}", page.status));
    }
    tokio::net::TcpStream::connect(statsd)
        .await
        .map_err(|e| format!("statsd port {statsd}: {e}"))?;
    Ok(())
}
