//! The heaviest keys of the rules now serving: [`Limiter::top`].

use std::collections::HashMap;
use std::sync::Arc;

use super::{Installed, Limiter, Recorder};
use crate::top::{RuleTop, TopBy, TopEntry, TopWindow};

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
}

impl<R: Recorder> Limiter<R> {
    /// The heaviest keys of the rules `query` names, heaviest first, across rules.
    pub fn top(&self, query: &TopQuery<'_>) -> Vec<TopEntry> {
        let mut entries = self.top_per_rule(query);
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
