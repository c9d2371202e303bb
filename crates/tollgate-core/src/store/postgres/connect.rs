//! Connections to PostgreSQL: the URL as libpq users write it, a small pool of pipelined
//! connections with the check statement prepared on each, and how the supervisor of
//! [`super::super::shared::link`] connects and probes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, NoTls, Socket, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::apply::ApplyArgs;
use super::describe::describe;
use super::override_statements::{CHANGE_OVERRIDE, OVERRIDE_LOG, OVERRIDE_OF};
use super::schema::{self, SchemaError};
use super::target_error::TargetError;
use super::tls::{PgTls, SslMode, TlsError, client_config};
use crate::clock::Timestamp;
use crate::store::shared::backend::probe_call;
use crate::store::shared::link::Connector;
use crate::store::shared::protocol::{PROBE_KEY, probe_limits};

/// Where PostgreSQL is: a `postgres://` URL, its TLS part (`sslmode`, `sslrootcert`,
/// `sslcert`, `sslkey`) taken out and read here, since libpq's checks are not all in the
/// driver.
#[derive(Clone)]
pub struct PgTarget {
    pub(super) config: tokio_postgres::Config,
    tls: PgTls,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("PgTarget")
            .field("hosts", &self.config.get_hosts())
            .field("ports", &self.config.get_ports())
            .field("user", &self.config.get_user())
            .field("dbname", &self.config.get_dbname())
            .field("tls", &self.tls)
            .finish()
    }
}

/// Where PostgreSQL is, as logs name it: `host:port[,host:port…]/database`, without
/// the login.
impl std::fmt::Display for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports = self.config.get_ports();
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let host = match host {
                    tokio_postgres::config::Host::Tcp(name) => name.clone(),
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                };
                // libpq's rule: one port for every host, or one per host.
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                format!("{host}:{port}")
            })
            .collect();
        let database = self
            .config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or("");
        write!(f, "{}/{database}", hosts.join(","))
    }
}

impl PgTarget {
    /// Reads a `postgres://` (or `postgresql://`) URL.
    pub fn parse(url: &str) -> Result<Self, TargetError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(TargetError::Scheme);
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut tls = PgTls {
            mode: SslMode::Prefer,
            root: None,
            client: None,
        };
        let (mut cert, mut key) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "sslmode" => tls.mode = SslMode::parse(value)?,
                "sslrootcert" => tls.root = Some(value.into()),
                "sslcert" => cert = Some(value.into()),
                "sslkey" => key = Some(value.into()),
                _ => kept.push(pair),
            }
        }
        tls.client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(TargetError::HalfClientCert),
        };
        let rest = match kept.is_empty() {
            true => base.to_owned(),
            false => format!("{base}?{}", kept.join("&")),
        };
        let mut config: tokio_postgres::Config = rest.parse().map_err(TargetError::Driver)?;
        config.ssl_mode(match tls.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        if config.get_application_name().is_none() {
            config.application_name("tollgate");
        }
        Ok(Self { config, tls })
    }

    /// Checks the TLS files now, so that a wrong path stops startup.
    pub(crate) fn tls_connector(&self) -> Result<Option<MakeRustlsConnect>, TlsError> {
        Ok(client_config(&self.tls)?.map(MakeRustlsConnect::new))
    }
}

/// One connection with the statements Tollgate runs prepared on it.
pub(super) struct PooledConn {
    pub(super) client: Client,
    /// The health probe's call.
    pub(super) check: Statement,
    /// Requests' calls, many at once.
    pub(super) check_many: Statement,
    /// An in-flight counter's call (`slots.sql`).
    pub(super) slots: Statement,
    /// A change of an override, and the reads of their log and of one (`overrides.sql`):
    /// prepared, so that each is one round trip.
    pub(super) override_change: Statement,
    pub(super) override_log: Statement,
    pub(super) override_of: Statement,
    now: Statement,
}

/// Connections used in turn; each pipelines the calls of many requests.
pub(crate) struct Pool {
    conns: Vec<PooledConn>,
    next: AtomicUsize,
}

impl Pool {
    /// The next open connection in turn; when every one is closed, the next (its call
    /// fails as lost, and the store is reported down).
    pub(super) fn pick(&self) -> &PooledConn {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let at = |i: usize| &self.conns[first.wrapping_add(i) % self.conns.len()];
        (0..self.conns.len())
            .map(at)
            .find(|conn| !conn.client.is_closed())
            .unwrap_or_else(|| at(0))
    }

    /// Whether PostgreSQL closed any of the connections.
    fn worn(&self) -> bool {
        self.conns.iter().any(|conn| conn.client.is_closed())
    }
}

/// Makes and probes the pool.
pub(super) struct PgConnector {
    pub(super) target: PgTarget,
    pub(super) tls: Option<MakeRustlsConnect>,
    pub(super) pool_size: usize,
    pub(super) statement_timeout: Duration,
    pub(super) unlogged: bool,
    /// The schema is brought up to date on the first connect of each process, and again
    /// after the probe found it gone (a table dropped).
    pub(super) migrated: AtomicBool,
    /// Prefix of every key, the probe's too.
    pub(super) key_prefix: String,
    /// Told when a connection closes.
    pub(super) closed: Arc<Notify>,
}

/// Why a connection to PostgreSQL, or a probe on it, failed.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The TLS files cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The server or the connection failed.
    #[error("{}", describe(.0))]
    Db(#[source] tokio_postgres::Error),
    /// Tollgate's statements cannot be prepared: most likely no schema.
    #[error("{} (is the schema there? `tollgate migrate` creates it)", describe(.0))]
    Unprepared(#[source] tokio_postgres::Error),
    /// The schema could not be brought up to date.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// No connection within the connect timeout.
    #[error("no connection within {0:?}")]
    Timeout(Duration),
    /// The clock's row is not a number.
    #[error("{0}")]
    Clock(#[source] tokio_postgres::Error),
}

/// Longest one statement of a migration may run on connect (instead of the requests'
/// `statement_timeout`), and about the longest the migration may take: enough to wait
/// out another instance's migration, or to rewrite a large counter table when
/// `POSTGRES_UNLOGGED` changes. Past it the migration is rolled back and tried again;
/// `tollgate migrate` has no limit.
pub(super) const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

const CHECK: &str = "SELECT tollgate_apply($1, $2, $3, $4, $5, 0, $6, $7, $8, $9, $10, $11)";
/// Many calls at once (see [`super::apply::ManyArgs`]).
pub(super) const CHECK_MANY: &str = "SELECT call_no, reply FROM \
     tollgate_apply_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
const NOW: &str = "SELECT tollgate_now_us()";
const SLOTS: &str = "SELECT tollgate_slots($1, $2, $3, $4, $5, $6, $7)";

impl PgConnector {
    /// One connection, with its statement timeout set.
    pub(super) async fn open(&self) -> Result<Client, PgError> {
        let client = match &self.tls {
            Some(tls) => open_with(&self.target.config, tls.clone(), &self.closed).await?,
            None => open_with(&self.target.config, NoTls, &self.closed).await?,
        };
        let timeout_ms = self.statement_timeout.as_millis();
        client
            .batch_execute(&format!("SET statement_timeout = {timeout_ms}"))
            .await
            .map_err(PgError::Db)?;
        Ok(client)
    }

    /// `conn`, or its error; a statement that could not be prepared because part of the
    /// schema is gone (the clock function dropped, say) has the next connect migrate,
    /// which repairs it, instead of failing the same way for ever.
    fn schema_checked(&self, conn: Result<PooledConn, PgError>) -> Result<PooledConn, PgError> {
        if let Err(PgError::Unprepared(e)) = &conn
            && schema_gone(e)
        {
            self.migrated.store(false, Ordering::Relaxed);
        }
        conn
    }

    async fn prepared(client: Client) -> Result<PooledConn, PgError> {
        let prepare = |sql| client.prepare(sql);
        let (check, check_many, slots, now) = tokio::try_join!(
            prepare(CHECK),
            prepare(CHECK_MANY),
            prepare(SLOTS),
            prepare(NOW)
        )
        .map_err(PgError::Unprepared)?;
        let (override_change, override_log, override_of) = tokio::try_join!(
            prepare(CHANGE_OVERRIDE),
            prepare(OVERRIDE_LOG),
            prepare(OVERRIDE_OF)
        )
        .map_err(PgError::Unprepared)?;
        Ok(PooledConn {
            client,
            check,
            check_many,
            slots,
            override_change,
            override_log,
            override_of,
            now,
        })
    }
}

/// `connecting`, or [`PgError::Timeout`] past `timeout`.
async fn within<T>(
    timeout: Duration,
    connecting: impl Future<Output = Result<T, PgError>>,
) -> Result<T, PgError> {
    tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| PgError::Timeout(timeout))?
}

/// Whether `e` says a table or function of the schema is not there.
fn schema_gone(e: &tokio_postgres::Error) -> bool {
    let gone = [SqlState::UNDEFINED_TABLE, SqlState::UNDEFINED_FUNCTION];
    e.code().is_some_and(|code| gone.contains(code))
}

/// A connection of `config` over `tls`, `closed` told when it ends.
async fn open_with<T>(
    config: &tokio_postgres::Config,
    tls: T,
    closed: &Arc<Notify>,
) -> Result<Client, PgError>
where
    T: MakeTlsConnect<Socket> + Send,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, connection) = config.connect(tls).await.map_err(PgError::Db)?;
    let closed = closed.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("postgres connection ended: {}", describe(&e));
        }
        closed.notify_one();
    });
    Ok(client)
}

impl Connector for PgConnector {
    type Conn = Pool;
    const NAME: &'static str = "postgres";

    fn address(&self) -> String {
        self.target.to_string()
    }
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    type Error = PgError;

    /// A connect that migrates may take [`MIGRATION_TIMEOUT`] more: its connections are
    /// still due within [`Self::CONNECT_TIMEOUT`] before the migration, and again after.
    fn connect_timeout(&self) -> Duration {
        match self.migrated.load(Ordering::Relaxed) {
            true => Self::CONNECT_TIMEOUT,
            false => Self::CONNECT_TIMEOUT * 2 + MIGRATION_TIMEOUT,
        }
    }

    async fn connect(&self) -> Result<Pool, PgError> {
        // The connect timeout is stretched for a migration, not for a server that does
        // not answer: the connections keep their own.
        let mut first = within(Self::CONNECT_TIMEOUT, self.open()).await?;
        if !self.migrated.load(Ordering::Relaxed) {
            // The server cancels a statement past the limit itself (dropping the client
            // would leave it running, holding its locks); this bounds the whole.
            let limit = MIGRATION_TIMEOUT;
            tokio::time::timeout(
                limit,
                schema::migrate(&mut first, self.unlogged, Some(limit)),
            )
            .await
            .map_err(|_| SchemaError::TimedOut(limit))??;
            self.migrated.store(true, Ordering::Relaxed);
        }
        within(Self::CONNECT_TIMEOUT, async {
            let mut conns = vec![self.schema_checked(Self::prepared(first).await)?];
            let rest =
                (1..self.pool_size).map(|_| async { Self::prepared(self.open().await?).await });
            for conn in futures_util::future::join_all(rest).await {
                conns.push(self.schema_checked(conn)?);
            }
            Ok(Pool {
                conns,
                next: AtomicUsize::new(0),
            })
        })
        .await
    }

    async fn time(&self, pool: &Pool) -> Result<Timestamp, PgError> {
        let conn = pool.pick();
        let row = conn
            .client
            .query_one(&conn.now, &[])
            .await
            .map_err(PgError::Db)?;
        let micros: i64 = row.try_get(0).map_err(PgError::Clock)?;
        Ok(Timestamp::from_micros(u64::try_from(micros).unwrap_or(0)))
    }

    /// A pool whose server restarted or failed over holds dead connections.
    fn reconnect_when_down(&self) -> bool {
        true
    }

    fn worn(&self, pool: &Pool) -> bool {
        pool.worn()
    }

    fn closed(&self) -> impl Future<Output = ()> + Send {
        self.closed.notified()
    }

    async fn probe_calls(&self, pool: &Pool) -> Result<(), PgError> {
        let limits = probe_limits();
        let args = ApplyArgs::new(&self.key_prefix, &probe_call(&limits));
        let conn = pool.pick();
        let probed = match args.run(&conn.client, &conn.check).await {
            // The probe leaves no row behind: one row per counter, and none that is not.
            Ok(_) => conn
                .client
                .execute(
                    "DELETE FROM tollgate_counters WHERE key = $1",
                    &[&format!("{}{PROBE_KEY}", self.key_prefix)],
                )
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        match probed {
            Ok(()) => Ok(()),
            Err(e) => {
                if schema_gone(&e) {
                    self.migrated.store(false, Ordering::Relaxed);
                }
                Err(PgError::Db(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_their_tls_settings_apart() {
        let t = PgTarget::parse(
            "postgres://u:p@db.example:5433/limits?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(t.tls.mode, SslMode::VerifyFull);
        assert_eq!(t.tls.root.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(t.config.get_dbname(), Some("limits"));
        assert_eq!(t.config.get_ports(), &[5433]);
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        assert_eq!(t.config.get_application_name(), Some("tollgate"));
        assert!(!format!("{t:?}").contains(":p@"), "{t:?}");
        assert_eq!(t.to_string(), "db.example:5433/limits");

        let plain = PgTarget::parse("postgresql://localhost/x?sslmode=disable").unwrap();
        assert_eq!(plain.tls.mode, SslMode::Disable);
        assert_eq!(
            PgTarget::parse("postgres://localhost/x").unwrap().tls.mode,
            SslMode::Prefer
        );
    }

    #[test]
    fn bad_urls_are_clear_errors() {
        let err = |url| PgTarget::parse(url).unwrap_err().to_string();
        assert!(err("localhost:5432").contains("postgres://"));
        assert!(err("postgres://h/x?sslmode=maybe").contains("sslmode=maybe"));
        assert!(err("postgres://h/x?sslcert=/c.pem").contains("sslkey"));
        assert!(err("postgres://h/x?nonsense=1").starts_with("POSTGRES_URL"));
    }
}
