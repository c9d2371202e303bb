//! Descriptor metadata: arbitrary structured values a rule carries back to Envoy (the
//! reference's `metadata:`, a `google.protobuf.Struct` over xDS).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A map of metadata values.
pub type Metadata = BTreeMap<String, MetaValue>;

/// One metadata value, as JSON (and `google.protobuf.Value`) knows them.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// No value.
    Null,
    /// true or false.
    Bool(bool),
    /// A number (protobuf's Value holds doubles).
    Number(f64),
    /// Text.
    String(String),
    /// A list.
    List(Vec<MetaValue>),
    /// A nested map.
    Map(Metadata),
}

impl Eq for MetaValue {}

/// Merges `from` into `into` the way the reference does: nested maps merge, and where
/// both hold a value that is not a map, the one already there wins.
pub fn merge(into: &mut Metadata, from: &Metadata) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(MetaValue::Map(ours)), MetaValue::Map(theirs)) => merge(ours, theirs),
            (Some(_), _) => {}
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

impl<'de> Deserialize<'de> for MetaValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = MetaValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a metadata value")
    }

    fn visit_unit<E>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }

    fn visit_none<E>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<MetaValue, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E>(self, v: bool) -> Result<MetaValue, E> {
        Ok(MetaValue::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<MetaValue, E> {
        Ok(MetaValue::Number(v as f64))
    }

    fn visit_u64<E>(self, v: u64) -> Result<MetaValue, E> {
        Ok(MetaValue::Number(v as f64))
    }

    fn visit_f64<E>(self, v: f64) -> Result<MetaValue, E> {
        Ok(MetaValue::Number(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<MetaValue, E> {
        Ok(MetaValue::String(v.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MetaValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(MetaValue::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetaValue, A::Error> {
        let mut out = Metadata::new();
        while let Some((key, value)) = map.next_entry::<String, MetaValue>()? {
            out.insert(key, value);
        }
        Ok(MetaValue::Map(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, MetaValue)]) -> Metadata {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn text(s: &str) -> MetaValue {
        MetaValue::String(s.into())
    }

    #[test]
    fn nested_maps_merge_and_the_first_scalar_wins() {
        let mut into = map(&[
            ("a", text("first")),
            ("m", MetaValue::Map(map(&[("x", text("1"))]))),
        ]);
        let from = map(&[
            ("a", text("second")),
            ("b", MetaValue::Bool(true)),
            (
                "m",
                MetaValue::Map(map(&[("x", text("2")), ("y", text("3"))])),
            ),
        ]);
        merge(&mut into, &from);
        assert_eq!(
            into,
            map(&[
                ("a", text("first")),
                ("b", MetaValue::Bool(true)),
                (
                    "m",
                    MetaValue::Map(map(&[("x", text("1")), ("y", text("3"))]))
                ),
            ])
        );
    }

    #[test]
    fn yaml_values_of_every_kind() {
        let parsed: Metadata = serde_saphyr::from_str(
            "s: text\nn: 4\nf: 0.5\nb: false\nz: null\nl: [1, two]\nm: {k: v}\n",
        )
        .expect("valid metadata");
        assert_eq!(parsed["n"], MetaValue::Number(4.0));
        assert_eq!(parsed["f"], MetaValue::Number(0.5));
        assert_eq!(parsed["b"], MetaValue::Bool(false));
        assert_eq!(parsed["z"], MetaValue::Null);
        assert_eq!(
            parsed["l"],
            MetaValue::List(vec![MetaValue::Number(1.0), text("two")])
        );
        assert_eq!(parsed["m"], MetaValue::Map(map(&[("k", text("v"))])));
    }
}
