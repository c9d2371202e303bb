//! PostgreSQL's errors told in its own words where it gave some: what the connection,
//! the schema migration and the reset listener log and report.

/// The error's text: the server's severity and message, or the client's error and its
/// causes.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}
