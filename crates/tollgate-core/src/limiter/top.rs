//! The heaviest keys of the rules now serving: [`Limiter::top`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Installed, Limiter, Recorder};
use crate::top::snapshot::{self, Published};
use crate::top::{RuleTop, TopBy, TopEntry, TopWindow};

/// Keys per rule, ranking and window an instance publishes for the fleet's view.
const PUBLISHED_PER_RULE: usize = 10;

/// Which heavy keys [`Limiter::top`] answers.
#[derive(Debug, Clone, Copy)]
pub struct TopQuery<'a> {
    /// Only this domain's rules, if set.
    pub domain: Option<&'a str>,
    /// Only the rule at this place (its levels joined with dots), if set.
    pub rule: Option<&'a str>,
    /// Ranked by hits, denials or would-be denials.
    pub by: TopBy,
    /// Over the last minute or hour.
    pub window: TopWindow,
    /// At most this many entries.
    pub n: usize,
    /// Summed over every instance sharing the store, from what each published lately
    /// ([`Limiter::publish_top`]); this instance alone otherwise.
    pub fleet: bool,
}

impl<R: Recorder> Limiter<R> {
    /// The heaviest keys of the rules `query` names, heaviest first, across rules.
    pub fn top(&self, query: &TopQuery<'_>) -> Vec<TopEntry> {
        let mut entries = match query.fleet {
            true => self.fleet_top(query),
            false => self.top_per_rule(query),
        };
        entries.sort_by_key(|e| std::cmp::Reverse(e.count));
        entries.truncate(query.n);
        entries
    }

    /// The heaviest keys of each rule `query` names, at most `query.n` per rule, rule by
    /// rule: for series that must stay few per rule.
    pub fn top_per_rule(&self, query: &TopQuery<'_>) -> Vec<TopEntry> {
        let installed = self.installed.load();
        let now = self.store.now();
        let mut entries = Vec::new();
        for rule in installed.rules.rules() {
            let place = rule.path().join(".");
            if query.domain.is_some_and(|d| d != rule.domain())
                || query.rule.is_some_and(|r| r != place)
            {
                continue;
            }
            let Some(Some(top)) = installed.top.get(rule.id()) else {
                continue;
            };
            let estimates = top.estimates(now, query.by, query.window);
            entries.extend(estimates.into_iter().take(query.n).map(|e| TopEntry {
                domain: rule.domain().to_owned(),
                rule: place.clone(),
                descriptor: crate::top::descriptor_of(&e.key),
                count: e.count,
                error: e.error,
            }));
        }
        entries
    }

    /// Publishes this instance's heaviest keys through a shared store, for every
    /// instance's `fleet` view; nothing on a store of this process alone. Call it every
    /// few seconds.
    pub async fn publish_top(&self) {
        let mut published = Vec::new();
        for by in [TopBy::Hits, TopBy::Denied, TopBy::Shadow] {
            for window in [TopWindow::Minute, TopWindow::Hour] {
                let query = TopQuery {
                    domain: None,
                    rule: None,
                    by,
                    window,
                    n: PUBLISHED_PER_RULE,
                    fleet: false,
                };
                let entries = self.top_per_rule(&query).into_iter();
                published.extend(entries.map(|entry| Published { by, window, entry }));
            }
        }
        let snapshot = snapshot::encode(self.instance, published);
        self.store.publish_top(snapshot).await;
    }

    /// This instance's keys (all it holds) plus what the others published: counts and
    /// errors summed per key. A key another instance did not publish adds nothing of its.
    /// Entries of a domain and rule this instance does not serve are left out: anyone who
    /// can publish on the store could have published them.
    fn fleet_top(&self, query: &TopQuery<'_>) -> Vec<TopEntry> {
        let installed = self.installed.load();
        let served: HashSet<(&str, String)> = installed
            .rules
            .rules()
            .into_iter()
            .map(|rule| (rule.domain(), rule.path().join(".")))
            .collect();
        let mut sums: HashMap<(String, String, String), (u64, u64)> = HashMap::new();
        let mut add = |e: TopEntry| {
            let sum = sums.entry((e.domain, e.rule, e.descriptor)).or_default();
            *sum = (sum.0.saturating_add(e.count), sum.1.saturating_add(e.error));
        };
        let all = TopQuery {
            n: usize::MAX,
            ..*query
        };
        self.top_per_rule(&all).into_iter().for_each(&mut add);
        for text in self.store.peer_tops() {
            let Some((instance, entries)) = snapshot::decode(&text) else {
                continue;
            };
            if instance == self.instance {
                continue;
            }
            let matching = entries.into_iter().filter(|p| {
                p.by == query.by
                    && p.window == query.window
                    && query.domain.is_none_or(|d| d == p.entry.domain)
                    && query.rule.is_none_or(|r| r == p.entry.rule)
                    && served.contains(&(p.entry.domain.as_str(), p.entry.rule.clone()))
            });
            matching.for_each(|p| add(p.entry));
        }
        sums.into_iter()
            .map(|((domain, rule, descriptor), (count, error))| TopEntry {
                domain,
                rule,
                descriptor,
                count,
                error,
            })
            .collect()
    }
}

/// The heavy keys of installed rules by their place, to carry over a reload.
pub(super) fn by_place<P>(installed: &Installed<P>) -> HashMap<(&str, &[String]), Arc<RuleTop>> {
    installed
        .rules
        .rules()
        .into_iter()
        .filter_map(|rule| {
            let top = installed.top.get(rule.id())?.clone()?;
            Some(((rule.domain(), rule.path()), top))
        })
        .collect()
}

#[cfg(test)]
mod tests;
