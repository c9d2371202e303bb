//! What a Redis error means: for the link (down, or unable to write) and for the call.

use std::sync::Arc;

use super::connect::RedisConnector;
use crate::store::shared::backend::TripError;
use crate::store::shared::link::Link;

/// The call's error for `e`, reported to `link`'s health when it says the connection
/// failed or the server can no longer write.
pub(super) fn classify(link: &Link<RedisConnector>, e: redis::RedisError) -> TripError {
    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly) {
        // A replica, or a former master after a failover: the supervisor's counter-call
        // probe confirms it and takes the store down (reconnecting a Sentinel set) until
        // counter calls work again.
        link.health.report_call_failed();
        return TripError::Lost(Arc::new(e));
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        link.health.report_down(&e);
        TripError::Lost(Arc::new(e))
    } else {
        TripError::Failed(Arc::new(e))
    }
}
