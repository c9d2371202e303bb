//! The value parsers of settings: durations in Go's forms, byte sizes, addresses, tags,
//! header names, ports, zones, ratios; each says in our words what is wrong.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Calendar, Unit};

/// Header names and values, in the order given, and how many entries were not
/// `key:value`: counted, not kept, since such an entry may be a credential that must not
/// appear in the error that refuses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HeaderMap {
    pub(crate) pairs: Vec<(String, String)>,
    pub(crate) malformed: usize,
}

/// `EXTRA_TAGS`: `key:value` pairs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tags(pub(crate) Vec<(String, String)>);

/// The debug port, if one is served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DebugPort(pub(crate) Option<u16>);

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExporterProtocol {
    Http,
    Grpc,
}

/// `key:value[,key:value…]`, the reference's (envconfig's) map form; empty is none.
/// Never fails here: the parser's error would quote the whole setting, headers and
/// credentials with it, so entries that are not `key:value` are only counted, and the
/// xDS settings' check refuses them.
pub(super) fn parse_header_map(text: &str) -> Result<HeaderMap, Infallible> {
    let mut headers = HeaderMap::default();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.split_once(':') {
            Some((key, value)) if !key.trim().is_empty() => headers
                .pairs
                .push((key.trim().to_ascii_lowercase(), value.trim().to_owned())),
            _ => headers.malformed += 1,
        }
    }
    Ok(headers)
}

pub(super) fn parse_tags(text: &str) -> Result<Tags, String> {
    let mut tags = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once(':')
            .ok_or_else(|| format!("'{pair}' is not key:value"))?;
        if key.trim().is_empty() {
            return Err(format!("'{pair}' has an empty key"));
        }
        tags.push((key.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(Tags(tags))
}

/// An HTTP header name.
pub(super) fn parse_header_name(text: &str) -> Result<String, String> {
    http::HeaderName::from_bytes(text.as_bytes())
        .map(|_| text.to_owned())
        .map_err(|_| format!("'{text}' is not an HTTP header name"))
}

/// A port number, or `off`.
pub(super) fn parse_debug_port(text: &str) -> Result<DebugPort, String> {
    match text.trim() {
        t if t.eq_ignore_ascii_case("off") => Ok(DebugPort(None)),
        t => t
            .parse::<u16>()
            .map(|port| DebugPort(Some(port)))
            .map_err(|_| format!("'{t}' is not a port number (0-65535) or off")),
    }
}

/// A value among `names`, parsed by the type's own `FromStr`: the core's types know
/// nothing of clap, and the help still lists the choices.
pub(super) fn one_of<T>(names: &'static [&'static str]) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr<Err = tollgate_core::UnknownName> + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(names).try_map(|s| s.parse::<T>())
}

/// Parses a duration the way Go's `time.ParseDuration` does (`10s`, `1m30s`, `1.5h`,
/// `250us`, `0`), which is how the reference's settings are written; a bare number is
/// milliseconds.
pub(super) fn parse_time_zone(text: &str) -> Result<Arc<str>, String> {
    Calendar::new(Unit::Day, 1, text)
        .map(|calendar| calendar.zone_name().into())
        .map_err(|e| e.to_string())
}

pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || format!("'{text}' is not a duration like 10ms, 250us, 3s, 1m or 1h30m");
    if text.is_empty() {
        return Err(invalid());
    }
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(Duration::from_millis(ms));
    }
    // Whole nanoseconds, so that `250us` is exactly 250 µs.
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("'{text}' lacks a unit (use ns, us, ms, s, m or h)")),
            _ => {
                return Err(format!(
                    "'{text}' has an unknown unit '{unit}' (use ns, us, ms, s, m or h)"
                ));
            }
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(invalid());
        }
        let digits = |s: &str| -> Result<u128, String> {
            if s.is_empty() {
                Ok(0)
            } else {
                s.parse().map_err(|_| invalid())
            }
        };
        // Digits past nanoseconds cannot matter; dropping them keeps the power in range.
        let fraction = &fraction[..fraction.len().min(18)];
        let scale = 10u128.pow(fraction.len() as u32);
        let part = digits(fraction)? * unit_ns / scale;
        total = digits(whole)?
            .checked_mul(unit_ns)
            .and_then(|ns| ns.checked_add(part))
            .and_then(|ns| total.checked_add(ns))
            .ok_or_else(invalid)?;
        rest = next;
    }
    u64::try_from(total)
        .map(Duration::from_nanos)
        .map_err(|_| invalid())
}

/// A size like `256MiB`, `1GiB`, `512KiB`, `100MB` or a bare number of bytes; at least 1 MiB.
pub(super) fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is not a size like 256MiB or 1GiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(format!(
                "'{text}' has an unknown unit (use KiB, MiB, GiB, KB, MB or GB)"
            ));
        }
    };
    match n.checked_mul(scale) {
        Some(bytes) if bytes >= 1 << 20 => Ok(bytes),
        Some(_) => Err(format!("'{text}' is less than 1MiB")),
        None => Err(format!("'{text}' is too large")),
    }
}

/// A duration that must be longer than zero.
pub(super) fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err("a timeout must be longer than zero".into()),
        d => Ok(d),
    }
}

/// An xDS response bound: 0 (gRPC's own 4 MiB), or 256 bytes to 1 GiB, since below that
/// no response with rules fits and every stream would break.
pub(super) fn parse_xds_message_size(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n == 0 || (256..=1 << 30).contains(&n) => Ok(n),
        Ok(_) => Err(format!(
            "'{text}' is outside 256..=1073741824 bytes (0 keeps gRPC's 4 MiB)"
        )),
        Err(_) => Err(format!("'{text}' is not a number of bytes")),
    }
}

/// A fraction from 0 to 1.
pub(super) fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{text}' is not a ratio between 0 and 1")),
    }
}

/// A lease's largest block: above 0 and at most half the limit, so that one instance
/// cannot hold most of a counter.
pub(super) fn parse_lease_fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 0.5 => Ok(f),
        _ => Err(format!(
            "'{text}' is not a lease fraction: above 0 and at most 0.5"
        )),
    }
}

/// `host:port`, or `:port` for every interface (the reference's form).
pub(super) fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    full.parse()
        .map_err(|_| format!("'{text}' is not an address like 0.0.0.0:9090 or :9090"))
}

pub(super) fn parse_protocol(text: &str) -> Result<ExporterProtocol, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "http" => Ok(ExporterProtocol::Http),
        "grpc" => Ok(ExporterProtocol::Grpc),
        _ => Err(format!(
            "'{text}' is not an exporter protocol: http or grpc"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_millis(15)));
        assert!(parse_timeout("0ms").is_err());
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_ratio("0.8"), Ok(0.8));
        assert!(parse_ratio("1.5").is_err());
        assert_eq!(
            parse_listen_addr(":9090").map(|a| a.to_string()),
            Ok("0.0.0.0:9090".into())
        );
        assert!(parse_duration("ten").is_err());
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert!(parse_bytes("10KiB").is_err(), "below the floor");
        assert!(parse_bytes("5 parsecs").is_err());
        assert_eq!(parse_duration("5h"), Ok(Duration::from_secs(5 * 3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "1.2.3s", "s", "10x", "1d", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn header_maps_need_a_name_and_a_colon() {
        let counted = |text| parse_header_map(text).map(|h| h.malformed);
        assert_eq!(counted("no-colon, :v, k:v"), Ok(2));
    }
}
