//! Tests in one binary run on parallel threads. Those that measure time (latency
//! percentiles, accuracy under load) take this lock first, so that they never measure
//! each other; a tokio mutex, because the guard is held across awaits and is not poisoned
//! by a failed test.

use tokio::sync::{Mutex, MutexGuard};

static TIMING: Mutex<()> = Mutex::const_new(());

/// Waits until no other timing-sensitive test runs; hold the guard for the whole test.
pub async fn timing() -> MutexGuard<'static, ()> {
    TIMING.lock().await
}
