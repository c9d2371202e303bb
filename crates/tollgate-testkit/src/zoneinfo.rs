//! Calendar windows computed by Python's `zoneinfo`, an implementation independent of
//! Tollgate's (jiff), for tests that check the windows and resets Tollgate answers with.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::process::run;

/// The window of one calendar `unit` (day, week, month or year) holding `at` in the IANA
/// `zone`: `[start, end)`, each the first instant of its local date.
const WINDOW: &str = r#"
import sys
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo
at, zone, unit = float(sys.argv[1]), ZoneInfo(sys.argv[2]), sys.argv[3]
d = datetime.fromtimestamp(at, zone).date()
if unit == "day":
    start, end = d, d + timedelta(days=1)
elif unit == "week":
    start = d - timedelta(days=d.weekday())
    end = start + timedelta(days=7)
elif unit == "month":
    start = d.replace(day=1)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
else:
    start = d.replace(month=1, day=1)
    end = start.replace(year=start.year + 1)
# fold=0 at a midnight that a gap skips: the instant the gap ends, the day's first.
first = lambda day: int(datetime(day.year, day.month, day.day, tzinfo=zone).timestamp())
print(first(start), first(end))
"#;

/// The calendar window of `unit` in `zone` holding `at`, per Python's `zoneinfo`.
pub fn window(zone: &str, unit: &str, at: SystemTime) -> (SystemTime, SystemTime) {
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let mut python = Command::new("python3");
    python.args(["-c", WINDOW, &seconds.to_string(), zone, unit]);
    let done = run("python3 zoneinfo", python, Duration::from_secs(30)).expect("python3 runs");
    assert!(done.status.success(), "python3 zoneinfo: {}", done.stderr);
    let text = done.stdout;
    let mut bounds = text.split_whitespace().map(|n| {
        let n: u64 = n.parse().expect("whole seconds");
        UNIX_EPOCH + Duration::from_secs(n)
    });
    let (Some(start), Some(end)) = (bounds.next(), bounds.next()) else {
        panic!("python3 zoneinfo printed {text:?}");
    };
    (start, end)
}
