//! The counter, the core's currency: a key in the store and the limits counted on it. The
//! limiter resolves each descriptor of a request to one, the counter API finds them for
//! other protocols ([`crate::Limiter::find_descriptor`], [`crate::Limiter::find_bucket`]),
//! and every store takes one; its operations on a store are in `store/counting.rs`.

use std::sync::Arc;

use crate::key::write_counter_key;
use crate::limit::Limit;

/// Keys of a counter's companions start with this; counter keys start with an escaped
/// domain (or, in the reference's layout, a domain), which never begins with a bare `%`.
const COMPANION_PREFIX: char = '%';

/// One counter: its key in the store and the limits counted on it. Found through
/// [`crate::Limiter::find_descriptor`] or [`crate::Limiter::find_bucket`], or built for a
/// request's own limit ([`Counter::for_limits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    key: String,
    limits: Arc<[Limit]>,
}

impl Counter {
    /// The counter `key`, on which `limits` are counted.
    pub(crate) fn new(key: String, limits: Arc<[Limit]>) -> Self {
        Self { key, limits }
    }

    /// The counter of a descriptor that carries its own `limits` (a request's limit
    /// override), in Tollgate's key layout.
    pub fn for_limits<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
        limits: &[Limit],
    ) -> Self {
        let mut key = String::new();
        write_counter_key(&mut key, domain, entries, &Limit::shape_of(limits));
        Self::new(key, limits.into())
    }

    /// A counter of its own beside this one, named by `tag` and this counter's key, with
    /// other `limits`: for figures kept per counter (RLQS counts demand on one). Never the
    /// key of a descriptor's counter.
    pub fn companion(&self, tag: &str, limits: &[Limit]) -> Self {
        Self::new(
            format!("{COMPANION_PREFIX}{tag}|{}", self.key),
            limits.into(),
        )
    }

    /// The key in the store.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The limits, in the rule's order.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }
}
