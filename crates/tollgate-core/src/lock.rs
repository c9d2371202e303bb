//! The one way Tollgate takes a `std::sync::Mutex`.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, poisoned or not. Every state behind these locks is updated by plain
/// field writes that cannot be left half-done, so a lock poisoned by a panic on another
/// thread still guards a consistent value; failing every later caller would turn one
/// panic into an outage.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
