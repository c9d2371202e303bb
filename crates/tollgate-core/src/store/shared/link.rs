//! The supervised connection to a shared store, kept alive by a task of its own, so that
//! requests never wait for a connect and learn at once when the store is down. What a
//! connection is and how it is made belong to the store ([`Connector`]).
//!
//! Up means counter calls work, not only that the store answers: a store that comes up,
//! or whose counter calls a request saw fail, is probed with one counter call before it
//! is (again) taken as up, so a dropped table or a read-only replica is reported down
//! once, with its cause, instead of flapping between up and down with every request.
//! Attempts while it is down are backed off.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;

use crate::clock::Timestamp;
use crate::lock::lock;

/// How long one health probe may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Probe period while the store answers; a request error wakes the supervisor sooner.
const HEALTHY_PROBE: Duration = Duration::from_secs(1);
/// First retry period while the store is down; it doubles with each failed attempt.
pub(crate) const DOWN_RETRY: Duration = Duration::from_millis(100);
/// Longest retry period while the store is down: recovery is noticed within this.
const MAX_DOWN_RETRY: Duration = Duration::from_millis(500);
/// How long the counter-call probe may take; past it, the probe is tried again at the
/// next period without taking the store down (a slow store is not a broken one).
const CALL_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How a store's connections are made and probed.
pub(crate) trait Connector: Send + Sync + 'static {
    /// A live connection (or pool of them), shared by concurrent requests.
    type Conn: Send + Sync + 'static;

    /// The store's name in logs.
    const NAME: &'static str;

    /// Where the store is, its passwords hidden: logs name it with every failure.
    fn address(&self) -> String;

    /// Longest one connect may take.
    const CONNECT_TIMEOUT: Duration;

    /// Why a connect or a probe failed; its text is what the operator reads.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Longest the next connect may take: [`Self::CONNECT_TIMEOUT`] unless the connect
    /// has more to do (PostgreSQL's migration).
    fn connect_timeout(&self) -> Duration {
        Self::CONNECT_TIMEOUT
    }

    /// Connects.
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, Self::Error>> + Send;

    /// The store's clock: the health probe, which also tells the local view the store's
    /// time before any request has run.
    fn time(
        &self,
        conn: &Self::Conn,
    ) -> impl Future<Output = Result<Timestamp, Self::Error>> + Send;

    /// Whether a store that stops answering is connected afresh (its address may have
    /// moved, or its connections died with it), rather than left to recover on its own.
    fn reconnect_when_down(&self) -> bool;

    /// One counter call that writes, on a counter no request uses
    /// ([`super::protocol::PROBE_KEY`]): whether counter calls work.
    fn probe_calls(
        &self,
        conn: &Self::Conn,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Whether the store closed some of `conn`'s connections (ended by an operator, an
    /// idle timeout, a proxy) while it still answers: a fresh one is made, the worn one
    /// serving on its open connections meanwhile.
    fn worn(&self, _conn: &Self::Conn) -> bool {
        false
    }

    /// Resolves when one of the connections this connector made has closed, so that the
    /// supervisor replaces it at once rather than at its next probe.
    fn closed(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Told the store's time whenever a probe reads it.
pub(crate) type TimeSink = Box<dyn Fn(Timestamp) + Send + Sync>;

/// Whether the store answers, and a way for requests to report trouble; the same for
/// every store.
pub(crate) struct Health {
    /// The store's name and address in logs (`redis 127.0.0.1:6379 (single)`).
    name: String,
    up: AtomicBool,
    wake: Notify,
    /// Notified whenever the link comes up.
    connected: Notify,
    reconnects: AtomicU64,
    /// A request's counter call failed: the supervisor probes one before trusting the
    /// store again.
    calls_suspect: AtomicBool,
    /// How long the last successful probe took, in nanoseconds (0: none yet).
    probe_ns: AtomicU64,
    /// Why the link last went down or failed to connect, for the operator.
    last_error: std::sync::Mutex<Option<String>>,
}

impl Health {
    fn new(name: String) -> Self {
        Self {
            name,
            up: AtomicBool::new(false),
            wake: Notify::new(),
            connected: Notify::new(),
            reconnects: AtomicU64::new(0),
            calls_suspect: AtomicBool::new(false),
            probe_ns: AtomicU64::new(0),
            last_error: std::sync::Mutex::new(None),
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// The store's name and address in logs.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// How long the last successful health probe took, once one has.
    pub(crate) fn probe_time(&self) -> Option<Duration> {
        match self.probe_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Why the store last failed, if it has.
    pub(crate) fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Waits until the store answers, at most `limit`; whether it does.
    pub(crate) async fn wait_up(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let connected = self.connected.notified();
            if self.is_up() {
                return true;
            }
            if tokio::time::timeout_at(deadline, connected).await.is_err() {
                return self.is_up();
            }
        }
    }

    /// A request saw the store fail: stop sending until the supervisor reconnects.
    pub(crate) fn report_down(&self, why: &dyn std::fmt::Display) {
        self.set_up(false, Some(why.to_string()));
        self.wake.notify_one();
    }

    /// A request's counter call failed in a way that may be the store's, not the
    /// counter's: have the supervisor probe a counter call now.
    pub(crate) fn report_call_failed(&self) {
        self.calls_suspect.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// A request was slow, or found its connection closed by the store: have the
    /// supervisor replace closed connections and probe now (whether the store answers,
    /// the probe tells).
    pub(crate) fn check_now(&self) {
        self.wake.notify_one();
    }

    fn set_up(&self, up: bool, why: Option<String>) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if up && !was {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
            self.connected.notify_waiters();
            tracing::info!("{} connected", self.name);
        }
        let Some(why) = why else { return };
        let mut last = lock(&self.last_error);
        // Each new reason once at warn level; the same failure repeating only at debug.
        if was || last.as_deref() != Some(why.as_str()) {
            tracing::warn!(
                "{} down: {why}; deciding per --on-store-error until it is back",
                self.name
            );
        } else {
            tracing::debug!("{} still down: {why}", self.name);
        }
        *last = Some(why);
    }
}

/// The current connection and the store's [`Health`].
pub(crate) struct Link<C: Connector> {
    pub(crate) health: Health,
    current: ArcSwapOption<C::Conn>,
}

impl<C: Connector> Link<C> {
    /// Starts the supervisor, which reports the store's time to `time`; the link is down
    /// until it first connects.
    pub(crate) fn start(connector: C, time: TimeSink) -> Arc<Self> {
        let link = Arc::new(Self {
            health: Health::new(format!("{} {}", C::NAME, connector.address())),
            current: ArcSwapOption::empty(),
        });
        tokio::spawn(supervise(Arc::downgrade(&link), connector, time));
        link
    }

    /// The connection to use, if the store is believed to answer.
    pub(crate) fn conn(&self) -> Option<Arc<C::Conn>> {
        if !self.health.is_up() {
            return None;
        }
        self.current.load_full()
    }
}

async fn supervise<C: Connector>(link: std::sync::Weak<Link<C>>, connector: C, time: TimeSink) {
    let mut retry = DOWN_RETRY;
    loop {
        let Some(strong) = link.upgrade() else { return };
        let mut failure = None;
        let stale = !strong.health.is_up() && connector.reconnect_when_down();
        let (missing, worn) = match strong.current.load().as_deref() {
            Some(conn) => (false, connector.worn(conn)),
            None => (true, false),
        };
        // Connections the store closed while it answers: the worn one serves meanwhile.
        let replacing = worn && !stale;
        if missing || stale || replacing {
            let timeout = connector.connect_timeout();
            let made = match tokio::time::timeout(timeout, connector.connect()).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(format!("cannot connect: {e}")),
                Err(_) => Err(format!("no connection within {timeout:?}")),
            };
            match made {
                Ok(conn) => {
                    strong.current.store(Some(Arc::new(conn)));
                    if replacing {
                        tracing::info!("{}: closed connections replaced", strong.health.name);
                    }
                }
                // The probe below says whether the worn connection still serves.
                Err(why) if replacing => {
                    tracing::debug!("{}: closed connections not replaced: {why}", C::NAME)
                }
                Err(why) => failure = Some(why),
            }
        }
        let probed = std::time::Instant::now();
        let healthy = match strong.current.load_full() {
            Some(conn) => match tokio::time::timeout(PROBE_TIMEOUT, connector.time(&conn)).await {
                Ok(Ok(now)) => {
                    time(now);
                    let took = crate::clock::nanos_of(probed.elapsed());
                    strong.health.probe_ns.store(took.max(1), Ordering::Relaxed);
                    true
                }
                Ok(Err(e)) => {
                    failure.get_or_insert(format!("clock probe failed: {e}"));
                    false
                }
                Err(_) => {
                    failure.get_or_insert(format!("no answer to a probe within {PROBE_TIMEOUT:?}"));
                    false
                }
            },
            None => false,
        };
        let suspect = strong.health.calls_suspect.swap(false, Ordering::Relaxed);
        let healthy = match (healthy, strong.current.load_full()) {
            (true, Some(conn)) if suspect || !strong.health.is_up() => {
                match tokio::time::timeout(CALL_PROBE_TIMEOUT, connector.probe_calls(&conn)).await {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        failure = Some(format!("counter calls fail: {e}"));
                        false
                    }
                    Err(_) => {
                        strong.health.calls_suspect.store(true, Ordering::Relaxed);
                        strong.health.is_up()
                    }
                }
            }
            (healthy, _) => healthy,
        };
        strong.health.set_up(healthy, failure);
        if healthy {
            retry = DOWN_RETRY;
            // Holding `strong` here delays dropping the link by at most one probe period.
            tokio::select! {
                _ = strong.health.wake.notified() => {}
                _ = connector.closed() => {}
                _ = tokio::time::sleep(HEALTHY_PROBE) => {}
            }
        } else {
            drop(strong);
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(MAX_DOWN_RETRY);
        }
    }
}
