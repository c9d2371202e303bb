//! Waiting for a condition: poll it at a short interval until it holds or a deadline
//! passes, then fail naming what was awaited and the last state seen. Nothing in the
//! testkit sleeps in the hope that something has happened.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Interval between two polls of a condition.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it returns `Ok`, or panics after `timeout` with `what` and the
/// description of the last state that `check` returned as `Err`.
pub fn until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(state) if Instant::now() >= deadline => {
                panic!("{what}: not reached within {timeout:?}; last: {state}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// [`until`] for a condition that is awaited, without blocking the runtime between polls;
/// returns the value and how long it took.
pub async fn until_async<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> (T, Duration) {
    let start = Instant::now();
    loop {
        match check().await {
            Ok(value) => return (value, start.elapsed()),
            Err(state) if start.elapsed() >= timeout => {
                panic!("{what}: not reached within {timeout:?}; last: {state}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Waits, if need be, until the current epoch-aligned window of length `window` has at
/// least `needed` left, so that a sequence that takes less than `needed` stays inside one
/// window wherever the wall clock is; returns that window's end. (Tollgate aligns fixed
/// windows to the epoch.)
pub async fn room_in_window(window: Duration, needed: Duration) -> SystemTime {
    assert!(
        needed < window,
        "{needed:?} never fits in a window of {window:?}"
    );
    let now = SystemTime::now();
    let into = now
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos()
        % window.as_nanos();
    let left = window - Duration::from_nanos(u64::try_from(into).expect("within the window"));
    if left >= needed {
        return now + left;
    }
    // Too close to the end: the next window is wholly ahead.
    tokio::time::sleep(left).await;
    now + left + window
}
