//! Every override in force, by descriptor id. Immutable once installed: a change builds a
//! new set, so a request in flight sees one set whole. The set is [`SHARDS`] maps shared
//! between sets: a copy shares them all, and a change copies only the one it touches
//! (1/256 of the pointers), so that a change costs the same at 100,000 overrides as at 10.
//! Listed a page at a time in the order of the ids, sorted once per set, when it is first
//! listed.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use super::{CompiledOverride, OverrideError, descriptor_id};
use crate::clock::Timestamp;

/// Maps the overrides are spread over, by a hash of their ids.
const SHARDS: usize = 256;

/// One map of a set, shared by the sets that have not changed it.
type Shard = Arc<HashMap<Arc<str>, Arc<CompiledOverride>>>;

/// Every override in force, by descriptor.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// [`SHARDS`] maps once the first is set; none before.
    shards: Arc<Vec<Shard>>,
    len: usize,
    /// The ids in order, once listed; dropped by every change.
    sorted: OnceLock<Arc<[Arc<str>]>>,
}

/// The shard of `id`: FNV-1a of its bytes.
fn shard_of(id: &str) -> usize {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % SHARDS as u64) as usize
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
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every override, with its id, in no order.
    fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<CompiledOverride>)> {
        self.shards.iter().flat_map(|shard| shard.iter())
    }

    /// The map `id` is in, made this set's own to change.
    fn shard_mut(&mut self, id: &str) -> &mut HashMap<Arc<str>, Arc<CompiledOverride>> {
        self.sorted = OnceLock::new();
        let shards = Arc::make_mut(&mut self.shards);
        if shards.is_empty() {
            shards.resize_with(SHARDS, Shard::default);
        }
        Arc::make_mut(&mut shards[shard_of(id)])
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
            let mut ids: Vec<Arc<str>> = self.iter().map(|(id, _)| id.clone()).collect();
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
            let Some(o) = self.get(id) else {
                continue;
            };
            if o.spec.expired(now) {
                continue;
            }
            if overrides.len() == limit {
                next = overrides.last().map(|o: &&CompiledOverride| o.spec.id());
                break;
            }
            overrides.push(o);
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
        if self.get(&id).is_none() && self.len >= max {
            let message = format!("too many: at most {max} (OVERRIDES_MAX)");
            return Err(OverrideError::new("overrides", message));
        }
        let replaced = self.shard_mut(&id).insert(id, Arc::new(o));
        if replaced.is_none() {
            self.len += 1;
        }
        Ok(replaced)
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
        self.get(id)?;
        let removed = self.shard_mut(id).remove(id);
        self.len -= 1;
        removed
    }

    /// The override of descriptor `id`, expired or not.
    pub fn get(&self, id: &str) -> Option<&CompiledOverride> {
        self.shards
            .get(shard_of(id))
            .and_then(|shard| shard.get(id))
            .map(Arc::as_ref)
    }

    /// The ids of the overrides expired at `now`.
    pub fn expired(&self, now: Timestamp) -> Vec<String> {
        self.iter()
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
        if self.len == 0 {
            return None;
        }
        self.get(&descriptor_id(domain, entries))
            .filter(|o| !o.spec.expired(now))
    }
}
