//! protojson scalars: objects that must be objects, 32/64-bit integers as numbers or
//! strings, durations as `"1.5s"`, enums as names or numbers.

use std::fmt;
use std::marker::PhantomData;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, rate_limit::Unit as ResponseUnit,
};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, Struct, Value};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A protojson message: only a JSON object, where serde would also take an array of the
/// fields in order.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Object<T>(pub(super) T);

impl<T: Serialize> Serialize for Object<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        d.deserialize_map(ObjectVisitor(PhantomData))
    }
}

/// A protojson `uint32`: written as a number; read from a number or a decimal string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Uint32(pub(super) u32);

/// A protojson `uint64`: written as a decimal string; read from a number or a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Uint64(pub(super) u64);

impl Serialize for Uint32 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

impl Serialize for Uint64 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Uint32 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = d.deserialize_any(UnsignedVisitor {
            what: "a uint32 (a number or a decimal string)",
        })?;
        u32::try_from(n)
            .map(Self)
            .map_err(|_| de::Error::custom(format!("{n} is out of range for a uint32")))
    }
}

impl<'de> Deserialize<'de> for Uint64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UnsignedVisitor {
            what: "a uint64 (a number or a decimal string)",
        })
        .map(Self)
    }
}

/// Reads a non-negative integer from a JSON number (integral, as protojson allows `1.0`)
/// or a string holding one.
pub(super) struct UnsignedVisitor {
    what: &'static str,
}

impl Visitor<'_> for UnsignedVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
        Ok(n)
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
        u64::try_from(n).map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<u64, E> {
        // 2^64 as f64 is exact; anything at or above it does not fit.
        if n.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&n) {
            Ok(n as u64)
        } else {
            Err(E::invalid_value(de::Unexpected::Float(n), &self))
        }
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse()
                .map_err(|_| E::custom(format!("\"{s}\" is out of range for {}", self.what)))
        } else {
            Err(E::invalid_value(de::Unexpected::Str(s), &self))
        }
    }
}

/// A protojson `google.protobuf.Duration`: a string of seconds with up to nine
/// fractional digits and an `s` suffix, such as `"60s"` or `"59.500s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DurationJson(pub(super) ProtoDuration);

impl fmt::Display for DurationJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ProtoDuration { seconds, nanos } = self.0;
        let negative = seconds < 0 || nanos < 0;
        let (seconds, nanos) = (seconds.unsigned_abs(), nanos.unsigned_abs());
        let sign = if negative { "-" } else { "" };
        // Like protojson: 0, 3, 6 or 9 fractional digits.
        if nanos == 0 {
            write!(f, "{sign}{seconds}s")
        } else if nanos % 1_000_000 == 0 {
            write!(f, "{sign}{seconds}.{:03}s", nanos / 1_000_000)
        } else if nanos % 1_000 == 0 {
            write!(f, "{sign}{seconds}.{:06}s", nanos / 1_000)
        } else {
            write!(f, "{sign}{seconds}.{nanos:09}s")
        }
    }
}

impl DurationJson {
    pub(super) fn parse(text: &str) -> Option<Self> {
        let body = text.strip_suffix('s')?;
        let (negative, body) = match body.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        let (whole, fraction) = match body.split_once('.') {
            Some((whole, fraction)) => (whole, fraction),
            None => (body, ""),
        };
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || fraction.len() > 9 || !digits(fraction) {
            return None;
        }
        if body.ends_with('.') {
            return None;
        }
        let seconds: i64 = whole.parse().ok()?;
        // Right-padded to nine digits, so "5" means 500 ms.
        let nanos: i32 = if fraction.is_empty() {
            0
        } else {
            format!("{fraction:0<9}").parse().ok()?
        };
        // protojson's range: about ±10,000 years.
        if seconds > 315_576_000_000 {
            return None;
        }
        Some(Self(if negative {
            ProtoDuration {
                seconds: -seconds,
                nanos: -nanos,
            }
        } else {
            ProtoDuration { seconds, nanos }
        }))
    }
}

impl Serialize for DurationJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = DurationJson;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"60s\" or \"1.5s\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DurationJson, E> {
                DurationJson::parse(s)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Str(s), &self))
            }
        }
        d.deserialize_str(DurationVisitor)
    }
}

// ---------------------------------------------------------------------------
// Enums
// ---------------------------------------------------------------------------

/// The names of one proto enum's values.
pub(super) trait EnumNames {
    /// The enum's proto name, for error messages.
    const NAME: &'static str;
    fn name(value: i32) -> Option<&'static str>;
    fn value(name: &str) -> Option<i32>;
}

/// A protojson enum: written as its name (or its number if it has none); read from
/// either. Unknown numbers are kept, as proto3 enums are open.
pub(super) struct Enum<N>(pub(super) i32, PhantomData<N>);

impl<N> Enum<N> {
    pub(super) fn new(value: i32) -> Self {
        Self(value, PhantomData)
    }
}

impl<N> Clone for Enum<N> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<N> Copy for Enum<N> {}

impl<N> PartialEq for Enum<N> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<N: EnumNames> fmt::Debug for Enum<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match N::name(self.0) {
            Some(name) => f.write_str(name),
            None => write!(f, "{}", self.0),
        }
    }
}

impl<N: EnumNames> Serialize for Enum<N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match N::name(self.0) {
            Some(name) => s.serialize_str(name),
            None => s.serialize_i32(self.0),
        }
    }
}

impl<'de, N: EnumNames> Deserialize<'de> for Enum<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EnumVisitor<N>(PhantomData<N>);
        impl<N: EnumNames> Visitor<'_> for EnumVisitor<N> {
            type Value = Enum<N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a {} name or number", N::NAME)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Enum<N>, E> {
                N::value(s)
                    .map(Enum::new)
                    .ok_or_else(|| E::custom(format!("unknown {} value \"{s}\"", N::NAME)))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Enum<N>, E> {
                i32::try_from(n)
                    .map(Enum::new)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Enum<N>, E> {
                i32::try_from(n)
                    .map(Enum::new)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
            }
        }
        d.deserialize_any(EnumVisitor(PhantomData))
    }
}

/// `envoy.type.v3.RateLimitUnit`, the unit of a request's limit override.
pub(super) struct RateLimitUnitNames;

impl EnumNames for RateLimitUnitNames {
    const NAME: &'static str = "RateLimitUnit";
    fn name(value: i32) -> Option<&'static str> {
        RateLimitUnit::try_from(value).ok().map(|u| u.as_str_name())
    }
    fn value(name: &str) -> Option<i32> {
        RateLimitUnit::from_str_name(name).map(i32::from)
    }
}

/// `RateLimitResponse.RateLimit.Unit`, the unit of a reported limit.
pub(super) struct ResponseUnitNames;

impl EnumNames for ResponseUnitNames {
    const NAME: &'static str = "RateLimitResponse.RateLimit.Unit";
    fn name(value: i32) -> Option<&'static str> {
        ResponseUnit::try_from(value).ok().map(|u| u.as_str_name())
    }
    fn value(name: &str) -> Option<i32> {
        ResponseUnit::from_str_name(name).map(i32::from)
    }
}

/// `RateLimitResponse.Code`.
pub(super) struct CodeNames;

impl EnumNames for CodeNames {
    const NAME: &'static str = "RateLimitResponse.Code";
    fn name(value: i32) -> Option<&'static str> {
        Code::try_from(value).ok().map(|c| c.as_str_name())
    }
    fn value(name: &str) -> Option<i32> {
        Code::from_str_name(name).map(i32::from)
    }
}

/// A `google.protobuf.Struct` in protojson: the JSON object it describes.
pub(crate) fn struct_json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, Into::into)
        }
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value_json).collect(),
    }
}

/// The `google.protobuf.Struct` a JSON object describes: the tests' round trips.
#[cfg(test)]
pub(super) fn json_struct(json: &serde_json::Value) -> Option<Struct> {
    let serde_json::Value::Object(map) = json else {
        return None;
    };
    Some(Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_value(v)))
            .collect(),
    })
}

#[cfg(test)]
fn json_value(json: &serde_json::Value) -> Value {
    use envoy_types::pb::google::protobuf::ListValue;
    let kind = match json {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(_) => Kind::StructValue(json_struct(json).unwrap_or_default()),
    };
    Value { kind: Some(kind) }
}
