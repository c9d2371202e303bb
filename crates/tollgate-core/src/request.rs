//! A rate-limit question on plain types: a domain and descriptors, each a list of entries
//! with what to count. Adapters (gRPC, `/json`, the tower middleware) build one per call.

use std::borrow::Cow;

use crate::algo::Hits;
use crate::limit::LimitError;
use crate::unit::Unit;

/// The most descriptors in one request.
pub(crate) const MAX_DESCRIPTORS: usize = 64;
/// The most entries in one descriptor.
pub(crate) const MAX_ENTRIES: usize = 32;
/// The longest domain, key or value, in bytes.
pub(crate) const MAX_TEXT_BYTES: usize = 4096;

/// What to decide: descriptors of one domain, answered together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The rules' domain.
    pub domain: Cow<'a, str>,
    /// The descriptors, answered in this order.
    pub descriptors: Vec<Descriptor<'a>>,
}

impl<'a> Request<'a> {
    /// A request for `descriptors` of `domain`.
    pub fn new(domain: impl Into<Cow<'a, str>>, descriptors: Vec<Descriptor<'a>>) -> Self {
        Self {
            domain: domain.into(),
            descriptors,
        }
    }
}

/// One descriptor: entries matched against the rules level by level, and what to count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// The entries, outermost first.
    pub entries: Vec<Entry<'a>>,
    /// What to count: one unit by default.
    pub hits: Hits,
    /// A limit to use instead of the rules' (in its own counter).
    pub limit: Option<LimitOverride>,
}

impl<'a> Descriptor<'a> {
    /// A descriptor of `entries` that consumes one unit.
    pub fn new<K, V>(entries: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<Cow<'a, str>>,
        V: Into<Cow<'a, str>>,
    {
        Self {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry {
                    key: key.into(),
                    value: value.into(),
                })
                .collect(),
            hits: Hits::Consume(1),
            limit: None,
        }
    }

    /// The same descriptor counting `hits`.
    pub fn with_hits(mut self, hits: Hits) -> Self {
        self.hits = hits;
        self
    }

    /// The entries as (key, value) pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries
            .iter()
            .map(|e| (e.key.as_ref(), e.value.as_ref()))
    }
}

impl<'a> From<Vec<Entry<'a>>> for Descriptor<'a> {
    /// A descriptor of `entries` that consumes one unit.
    fn from(entries: Vec<Entry<'a>>) -> Self {
        Self {
            entries,
            hits: Hits::Consume(1),
            limit: None,
        }
    }
}

/// One `key=value` of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Matched against rule keys.
    pub key: Cow<'a, str>,
    /// Matched against rule values (exact, wildcard, or any for a key-only rule).
    pub value: Cow<'a, str>,
}

/// A limit sent with the request instead of the configured one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Units per unit of time.
    pub requests_per_unit: u32,
    /// The window.
    pub unit: Unit,
}

/// Why a request cannot be decided; the text is meant for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// The domain is empty.
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// No descriptors.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// More than [`MAX_DESCRIPTORS`].
    #[error("too many descriptors: {0} (at most {MAX_DESCRIPTORS})")]
    TooManyDescriptors(usize),
    /// More than [`MAX_ENTRIES`] in a descriptor.
    #[error("descriptor {descriptor} has too many entries: {count} (at most {MAX_ENTRIES})")]
    TooManyEntries {
        /// Which descriptor.
        descriptor: usize,
        /// How many entries it has.
        count: usize,
    },
    /// An entry with an empty key.
    #[error("descriptor {descriptor} entry {entry} has an empty key")]
    EmptyKey {
        /// Which descriptor.
        descriptor: usize,
        /// Which entry.
        entry: usize,
    },
    /// A domain, key or value longer than [`MAX_TEXT_BYTES`].
    #[error("{what} is {len} bytes (at most {MAX_TEXT_BYTES})")]
    TooLong {
        /// What is too long, like `descriptor 0 entry 1 value`.
        what: String,
        /// Its length.
        len: usize,
    },
    /// A limit override whose unit the protocol's enum does not name (found by an
    /// adapter).
    #[error("descriptor {descriptor} limit override has an unknown unit ({unit})")]
    UnknownUnit {
        /// Which descriptor.
        descriptor: usize,
        /// The number the request gave as unit.
        unit: i32,
    },
    /// A limit override that makes no limit.
    #[error("descriptor {descriptor} limit override: {reason}")]
    BadOverride {
        /// Which descriptor.
        descriptor: usize,
        /// Why, as the limit's constructor says.
        reason: LimitError,
    },
}

impl Request<'_> {
    /// Checks the shape and sizes of a request before any rule or counter is touched.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        if self.domain.is_empty() {
            return Err(InvalidRequest::EmptyDomain);
        }
        check_len("domain", &self.domain)?;
        if self.descriptors.is_empty() {
            return Err(InvalidRequest::NoDescriptors);
        }
        if self.descriptors.len() > MAX_DESCRIPTORS {
            return Err(InvalidRequest::TooManyDescriptors(self.descriptors.len()));
        }
        for (d, descriptor) in self.descriptors.iter().enumerate() {
            // A descriptor without entries matches no rule: OK with no limit, as the
            // reference answers it.
            let entries = &descriptor.entries;
            if entries.len() > MAX_ENTRIES {
                return Err(InvalidRequest::TooManyEntries {
                    descriptor: d,
                    count: entries.len(),
                });
            }
            for (e, entry) in entries.iter().enumerate() {
                if entry.key.is_empty() {
                    return Err(InvalidRequest::EmptyKey {
                        descriptor: d,
                        entry: e,
                    });
                }
                if entry.key.len() > MAX_TEXT_BYTES {
                    check_len(&format!("descriptor {d} entry {e} key"), &entry.key)?;
                }
                if entry.value.len() > MAX_TEXT_BYTES {
                    check_len(&format!("descriptor {d} entry {e} value"), &entry.value)?;
                }
            }
        }
        Ok(())
    }
}

fn check_len(what: &str, text: &str) -> Result<(), InvalidRequest> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(InvalidRequest::TooLong {
            what: what.to_owned(),
            len: text.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(domain: &'a str, descriptors: Vec<Vec<(&'a str, &'a str)>>) -> Request<'a> {
        Request::new(
            domain,
            descriptors.into_iter().map(Descriptor::new).collect(),
        )
    }

    fn error(r: Request<'_>) -> String {
        r.validate().expect_err("should be rejected").to_string()
    }

    #[test]
    fn each_problem_has_its_message() {
        assert_eq!(
            error(req("", vec![vec![("k", "v")]])),
            "rate limit domain must not be empty"
        );
        assert_eq!(
            error(req("d", vec![])),
            "rate limit descriptor list must not be empty"
        );
        assert!(
            req("d", vec![vec![]]).validate().is_ok(),
            "no entries: no rule"
        );
        assert_eq!(
            error(req("d", vec![vec![("k", "v"), ("", "v")]])),
            "descriptor 0 entry 1 has an empty key"
        );
        assert_eq!(
            error(req("d", vec![vec![("k", "v")]; 65])),
            "too many descriptors: 65 (at most 64)"
        );
        assert_eq!(
            error(req("d", vec![vec![("k", "v")], vec![("k", "v"); 33]])),
            "descriptor 1 has too many entries: 33 (at most 32)"
        );
        let long = "x".repeat(4097);
        assert_eq!(
            error(req("d", vec![vec![("k", &long)]])),
            "descriptor 0 entry 0 value is 4097 bytes (at most 4096)"
        );
    }

    #[test]
    fn limits_themselves_are_accepted() {
        let (k, v) = ("k".repeat(4096), "v".repeat(4096));
        let full = vec![vec![(k.as_str(), v.as_str()); 32]; 64];
        assert_eq!(req("d", full).validate(), Ok(()));
        assert_eq!(req("d", vec![vec![("k", "")]]).validate(), Ok(()));
    }
}
