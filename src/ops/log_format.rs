//! `LOG_FORMAT=json` in the reference's shape: one object a line with `@timestamp` (RFC 3339,
//! nanoseconds, UTC), `level` and `@message`, and the event's other fields beside them, as
//! the reference's logrus formatter writes, so that log pipelines keyed on those names keep
//! working after a switch.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats each event as the reference's JSON log line.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReferenceJson;

impl<S, N> FormatEvent<S, N> for ReferenceJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let line = line(SystemTime::now(), event.metadata().level(), |v| {
            event.record(v)
        });
        writeln!(writer, "{line}")
    }
}

/// The line of an event at `now`; `record` hands the event's fields to a visitor.
fn line(now: SystemTime, level: &Level, record: impl FnOnce(&mut Fields)) -> String {
    let mut fields = Fields(Map::new());
    record(&mut fields);
    let mut object = Map::new();
    object.insert("@timestamp".into(), rfc3339(now).into());
    object.insert("level".into(), logrus_level(level).into());
    let message = fields.0.remove("message").unwrap_or(Value::from(""));
    object.insert("@message".into(), message);
    for (name, value) in fields.0 {
        // A field may not hide the three the pipelines key on.
        let name = match name.as_str() {
            "@timestamp" | "level" | "@message" => format!("fields.{name}"),
            _ => name,
        };
        object.insert(name, value);
    }
    Value::Object(object).to_string()
}

/// logrus's name of a level (`warning`, not `warn`).
fn logrus_level(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}

/// `2026-11-26T06:15:52.123456789Z`: Go's `time.RFC3339Nano` in UTC (trailing zeros of
/// the fraction dropped, as Go does).
fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil(secs / 86_400);
    let of_day = secs % 86_400;
    let (h, m, s) = (of_day / 3_600, of_day / 60 % 60, of_day % 60);
    let mut text = format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}");
    let nanos = since.subsec_nanos();
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

/// The proleptic Gregorian date of a count of days since 1970-01-01 (H. Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn timestamps_are_go_rfc3339_nano() {
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00Z");
        // 2024-02-29 (a leap day) 23:59:59.5
        assert_eq!(
            rfc3339(at(1_709_251_199, 500_000_000)),
            "2024-02-29T23:59:59.5Z"
        );
        assert_eq!(
            rfc3339(at(1_798_761_600, 123_456_789)),
            "2027-01-01T00:00:00.123456789Z"
        );
        assert_eq!(rfc3339(at(951_782_400, 0)), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn a_line_has_the_references_field_names() {
        let text = line(at(1_764_137_752, 0), &Level::WARN, |fields| {
            fields.0.insert("message".into(), "redis down".into());
            fields.0.insert("domain".into(), "edge".into());
            fields.0.insert("level".into(), "sneaky".into());
        });
        let parsed: Value = serde_json::from_str(&text).expect("one JSON object");
        assert_eq!(parsed["@timestamp"], "2025-11-26T06:15:52Z");
        assert_eq!(parsed["level"], "warning");
        assert_eq!(parsed["@message"], "redis down");
        assert_eq!(parsed["domain"], "edge");
        assert_eq!(parsed["fields.level"], "sneaky");
        assert!(parsed.get("fields").is_none() && parsed.get("timestamp").is_none());
    }
}
