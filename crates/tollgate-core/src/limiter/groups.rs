//! The overall answer with quota groups: a request is refused when a descriptor outside
//! quota mode is over, or when every quota group it touches is over. A group is over when
//! any of its descriptors is; a quota-mode descriptor without a group is a group of its
//! own, so that the reference's rule (refused when every budget is over) is the case of
//! no groups at all.

use super::matched::{Count, Resolved};
use crate::decision::Outcome;

/// How one descriptor weighs in the overall answer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Weight<'r> {
    /// It denies on its own account: over its limit, and not in shadow mode.
    pub(super) over: bool,
    /// It is a budget (quota mode).
    pub(super) quota: bool,
    /// Its rule's quota group, if it names one.
    pub(super) group: Option<&'r str>,
}

/// Whether a request whose descriptors weigh `weights` is refused.
pub(super) fn refused<'r>(weights: impl IntoIterator<Item = Weight<'r>>) -> bool {
    let (mut alone, mut alone_over) = (0_usize, 0_usize);
    let mut groups = Groups::default();
    for w in weights {
        match (w.quota, w.group) {
            (false, _) if w.over => return true,
            (false, _) => {}
            (true, None) => {
                alone += 1;
                alone_over += usize::from(w.over);
            }
            (true, Some(name)) => groups.add(name, w.over),
        }
    }
    alone + groups.0.len() > 0 && alone_over == alone && groups.0.iter().all(|&(_, over)| over)
}

/// The quota groups of `weights` that are over.
pub(super) fn over<'r>(weights: impl IntoIterator<Item = Weight<'r>>) -> Vec<&'r str> {
    let mut groups = Groups::default();
    for w in weights {
        if let (true, Some(name)) = (w.quota, w.group) {
            groups.add(name, w.over);
        }
    }
    groups
        .0
        .into_iter()
        .filter_map(|(name, over)| over.then_some(name))
        .collect()
}

/// Marks `outcome` of `resolved` if its quota group is among those `over`: its metadata
/// is then not answered.
pub(super) fn mark(over: &[&str], resolved: &Resolved<'_>, outcome: &mut Outcome) {
    if let (Some(group), Outcome::Limited(l)) = (resolved.weight(false).group, outcome) {
        l.group_over = over.contains(&group);
    }
}

/// The named groups of one request, each once, and whether each is over. A request has
/// at most 64 descriptors: a list searched in turn beats a map. Empty, it allocates nothing.
#[derive(Default)]
struct Groups<'r>(Vec<(&'r str, bool)>);

impl<'r> Groups<'r> {
    fn add(&mut self, name: &'r str, over: bool) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, was)) => *was |= over,
            None => self.0.push((name, over)),
        }
    }
}

impl<'r> Resolved<'r> {
    /// How this descriptor weighs in the overall answer, `over` or not.
    pub(super) fn weight(&self, over: bool) -> Weight<'r> {
        let group = match self.count {
            Count::Limited {
                rule: Some(rule), ..
            } => rule.quota_group(),
            Count::Limited { rule: None, .. } | Count::NoLimit | Count::Unlimited => None,
        };
        Weight {
            over,
            quota: self.quota,
            group,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(over: bool, quota: bool, group: Option<&str>) -> Weight<'_> {
        Weight { over, quota, group }
    }

    #[test]
    fn a_limit_over_refuses_whatever_the_budgets() {
        assert!(refused([w(true, false, None), w(false, true, Some("a"))]));
        assert!(!refused([
            w(false, false, None),
            w(true, true, Some("a")),
            w(false, true, None)
        ]));
    }

    #[test]
    fn ungrouped_budgets_are_groups_of_their_own() {
        assert!(!refused([w(true, true, None), w(false, true, None)]));
        assert!(refused([w(true, true, None), w(true, true, None)]));
        assert!(!refused(std::iter::empty()), "no budget: nothing refuses");
    }

    #[test]
    fn a_group_is_over_when_any_of_its_descriptors_is() {
        // ai-gateway#2460: model b's default bucket has room, its tenant bucket not.
        let b = [w(false, true, Some("b")), w(true, true, Some("b"))];
        assert!(refused(b));
        assert_eq!(over(b), ["b"]);
        // Model a still has quota: the request goes on, to a.
        let both = [w(false, true, Some("a")), b[0], b[1]];
        assert!(!refused(both));
        assert_eq!(over(both), ["b"]);
        // A group of one is an ungrouped budget.
        assert!(refused([w(true, true, Some("solo"))]));
    }
}
