//! Every override in force, by descriptor id. Immutable once installed: a change builds a
//! new set (a copy of the ids' pointers, not of the overrides), so a request in flight
//! sees one set whole. Listed a page at a time in the order of the ids, which are sorted
//! once per set, when it is first listed.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use super::{CompiledOverride, OverrideError, descriptor_id};
use crate::clock::Timestamp;

/// Every override in force, by descriptor.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    by_id: HashMap<Arc<str>, Arc<CompiledOverride>>,
    /// The ids in order, once listed; dropped by every change.
    sorted: OnceLock<Arc<[Arc<str>]>>,
}

/// One page of a listing: the overrides on it, and where the next begins, if one does.
#[derive(Debug)]
pub struct Page<'a> {
    /// In the order of their ids.
    pub overrides: Vec<&'a CompiledOverride>,
    /// The id after which the next page begins (the last on this one).
    pub next: Option<String>,
}

impl Overrides {
    /// How many there are, expired ones not purged yet included.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// How many apply at `now`.
    pub fn live(&self, now: Timestamp) -> usize {
        self.by_id.values().filter(|o| !o.spec.expired(now)).count()
    }

    /// Every override, of `domain` only when one is named, in the order of their ids.
    pub fn list(&self, domain: Option<&str>) -> Vec<&CompiledOverride> {
        self.page(domain, None, usize::MAX, Timestamp::default())
            .overrides
    }

    /// At most `limit` overrides in force at `now` (of `domain` only, when named), in the
    /// order of their ids, from the first id after `after` (a page's `next`).
    pub fn page(
        &self,
        domain: Option<&str>,
        after: Option<&str>,
        limit: usize,
        now: Timestamp,
    ) -> Page<'_> {
        let sorted = self.sorted.get_or_init(|| {
            let mut ids: Vec<Arc<str>> = self.by_id.keys().cloned().collect();
            ids.sort_unstable();
            ids.into()
        });
        // A domain's ids all begin with it, escaped, and the entries' separator.
        let prefix = domain.map(|d| {
            let mut prefix = descriptor_id(d, std::iter::empty::<(&str, &str)>());
            prefix.pop();
            prefix.push('|');
            prefix
        });
        let from = match (after, &prefix) {
            (Some(after), _) => sorted.partition_point(|id| **id <= *after),
            (None, Some(prefix)) => sorted.partition_point(|id| **id < **prefix),
            (None, None) => 0,
        };
        let mut overrides = Vec::new();
        let mut next = None;
        for id in &sorted[from..] {
            if prefix.as_ref().is_some_and(|p| !id.starts_with(p.as_str())) {
                break;
            }
            let Some(o) = self.by_id.get(id) else {
                continue;
            };
            if o.spec.expired(now) {
                continue;
            }
            if overrides.len() == limit {
                next = overrides.last().map(|o: &&CompiledOverride| o.spec.id());
                break;
            }
            overrides.push(o.as_ref());
        }
        Page { overrides, next }
    }

    /// Sets `o`, replacing the override of the same descriptor; refused when that would
    /// make more than `max`. Returns the one replaced.
    pub fn insert(
        &mut self,
        o: CompiledOverride,
        max: usize,
    ) -> Result<Option<Arc<CompiledOverride>>, OverrideError> {
        let id: Arc<str> = o.spec.id().into();
        if !self.by_id.contains_key(&id) && self.by_id.len() >= max {
            let message = format!("too many: at most {max} (OVERRIDES_MAX)");
            return Err(OverrideError::new("overrides", message));
        }
        self.sorted = OnceLock::new();
        Ok(self.by_id.insert(id, Arc::new(o)))
    }

    /// Removes the override of `domain`'s descriptor of `entries`; returns it.
    pub fn remove<'a>(
        &mut self,
        domain: &str,
        entries: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Option<Arc<CompiledOverride>> {
        self.remove_id(&descriptor_id(domain, entries))
    }

    /// Removes the override of descriptor `id` ([`super::Override::id`]); returns it.
    pub fn remove_id(&mut self, id: &str) -> Option<Arc<CompiledOverride>> {
        let removed = self.by_id.remove(id);
        if removed.is_some() {
            self.sorted = OnceLock::new();
        }
        removed
    }

    /// The override of descriptor `id`, expired or not.
    pub fn get(&self, id: &str) -> Option<&CompiledOverride> {
        self.by_id.get(id).map(Arc::as_ref)
    }

    /// The ids of the overrides expired at `now`.
    pub fn expired(&self, now: Timestamp) -> Vec<String> {
        self.by_id
            .iter()
            .filter(|(_, o)| o.spec.expired(now))
            .map(|(id, _)| id.to_string())
            .collect()
    }

    /// The override in force at `now` for `domain`'s descriptor of `entries`.
    pub(crate) fn find<'a>(
        &self,
        domain: &str,
        entries: impl Iterator<Item = (&'a str, &'a str)>,
        now: Timestamp,
    ) -> Option<&CompiledOverride> {
        if self.by_id.is_empty() {
            return None;
        }
        self.by_id
            .get(descriptor_id(domain, entries).as_str())
            .map(Arc::as_ref)
            .filter(|o| !o.spec.expired(now))
    }
}
