//! What a PostgreSQL error means for the link: a lost connection takes it down (one
//! closed before the call is replaced), a cancelled statement is a timeout, anything else
//! fails the one call.

use std::sync::Arc;

use tokio_postgres::error::SqlState;

use super::connect::PgConnector;
use super::describe::describe;
use crate::store::shared::backend::TripError;
use crate::store::shared::link::Link;

/// `e` as the error of a call on `link`, reporting the link down when the connection is
/// lost. A connection PostgreSQL closed earlier (idle timeout, `pg_terminate_backend`, a
/// proxy's cut) is replaced at once instead: the server may well answer, and a call of
/// any task (an overrides read, say) must not take the link down for every request.
pub(super) fn classify(link: &Link<PgConnector>, e: tokio_postgres::Error) -> TripError {
    if e.is_closed() {
        link.health.check_now();
        return TripError::Lost(Arc::new(e));
    }
    let lost = match e.code() {
        Some(code) if *code == SqlState::QUERY_CANCELED => return TripError::Timeout,
        // Connection exceptions, a server shutting down or starting, or a standby
        // (a former primary after a failover) that cannot write.
        Some(code) => {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::READ_ONLY_SQL_TRANSACTION,
                ]
                .contains(code)
        }
        None => true,
    };
    if lost {
        link.health.report_down(&describe(&e));
        TripError::Lost(Arc::new(e))
    } else {
        TripError::Failed(Arc::new(e))
    }
}
