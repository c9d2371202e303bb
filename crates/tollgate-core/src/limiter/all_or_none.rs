//! A request counted on all its descriptors or on none. The memory store decides them
//! together under their shards' locks; a shared store counts each, and what a refused
//! request counted is given back (a refund decided without the store is credited to it,
//! so the count is exact once faults heal). Reference mode keeps the reference's
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: the counts before the request decide.

use futures_util::future::join_all;

use super::groups;
use super::matched::{Count, Resolved};
use super::{DecideError, Decided, Limiter, Recorder, outcome};
use crate::algo::Hits;
use crate::decision::Outcome;
use crate::store::{DecidedBy, MemoryStore, StoreError};

impl<R: Recorder> Limiter<R> {
    /// Whether the memory store must decide `resolved` together: two counters or more, one
    /// of which would count units that a refusal must not leave counted.
    pub(super) fn together(resolved: &[Resolved<'_>]) -> bool {
        let limited = || {
            resolved.iter().filter_map(|r| match &r.count {
                Count::Limited { hits, .. } => Some(hits),
                Count::NoLimit | Count::Unlimited => None,
            })
        };
        limited().nth(1).is_some() && limited().any(|h| matches!(h, Hits::Consume(_)))
    }

    /// Decides every descriptor of `resolved` in `memory` at once: if the request is
    /// refused, none of its consumptions counts, and no other request saw them counted.
    pub(super) fn decide_together<'a, 'r>(
        &self,
        memory: &MemoryStore,
        resolved: &'a [Resolved<'r>],
    ) -> Vec<Decided<'a, 'r>> {
        let asks: Vec<_> = resolved
            .iter()
            .filter_map(|r| match &r.count {
                Count::Limited { counter, hits, .. } => {
                    Some((counter.key(), counter.limits(), hits.saturated()))
                }
                Count::NoLimit | Count::Unlimited => None,
            })
            .collect();
        let answered = memory.apply_together(&asks, |verdicts| {
            let mut verdicts = verdicts.iter();
            groups::refused(resolved.iter().map(|r| {
                let over = match &r.count {
                    Count::Limited { rule, .. } => verdicts.next().is_some_and(|v| {
                        !v.decision.admitted && !rule.is_some_and(|rule| rule.shadow_mode)
                    }),
                    Count::NoLimit | Count::Unlimited => false,
                };
                r.weight(over)
            }))
        });
        let mut answered = answered.into_iter();
        resolved
            .iter()
            .map(|r| {
                let (outcome, source) = match &r.count {
                    Count::Limited {
                        rule,
                        counter,
                        hits,
                    } => match answered.next() {
                        Some((verdict, given_back)) => {
                            let counted = if given_back { 0 } else { hits.counted() };
                            let limits = counter.limits();
                            let outcome = outcome(limits, *rule, verdict, counted, r.quota);
                            (outcome, Some(DecidedBy::Memory))
                        }
                        None => (Outcome::NoLimit, None),
                    },
                    Count::Unlimited => (Outcome::Unlimited, None),
                    Count::NoLimit => (Outcome::NoLimit, None),
                };
                Decided {
                    resolved: r,
                    outcome,
                    source,
                }
            })
            .collect()
    }

    /// Gives back what the descriptors of a refused request consumed. Charges stay (usage
    /// is recorded whatever the answer), and so do refunds.
    pub(super) async fn give_back(&self, decided: &mut [Decided<'_, '_>]) {
        let refunds = join_all(decided.iter().map(|d| {
            let undo = match (&d.resolved.count, &d.outcome) {
                (
                    Count::Limited {
                        counter,
                        hits: Hits::Consume(_),
                        ..
                    },
                    Outcome::Limited(l),
                ) if l.admitted && l.hits > 0 => Some((counter, l.hits)),
                _ => None,
            };
            async move {
                let (counter, n) = undo?;
                self.store.give_back(counter, n).await.ok()
            }
        }))
        .await;
        for (d, refund) in decided.iter_mut().zip(refunds) {
            if let (Outcome::Limited(l), Some(verdict)) = (&mut d.outcome, refund) {
                l.remaining = verdict.decision.remaining;
                l.hits = 0;
                // The slot taken is given back: held as after the refund, nothing released.
                if let (Some(seen), Some(back)) = (&mut l.in_flight, verdict.in_flight) {
                    seen.held = back.held;
                    seen.expired = seen.expired.saturating_add(back.expired);
                }
            }
        }
    }

    /// The reference's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, for its key layout: the
    /// counts before the request decide. If any descriptor would go over its limit, only
    /// the descriptors that would are counted; the others are checked instead.
    pub(super) async fn hold_back(&self, resolved: &mut [Resolved<'_>]) -> Result<(), DecideError> {
        let before = join_all(resolved.iter().map(|r| async move {
            match &r.count {
                Count::Limited { counter, hits, .. } => {
                    let verdict = self.store.apply(counter, Hits::Check).await?;
                    let over =
                        !verdict.decision.admitted || hits.counted() > verdict.decision.remaining;
                    Ok::<_, StoreError>(over)
                }
                Count::NoLimit | Count::Unlimited => Ok(false),
            }
        }))
        .await
        .into_iter()
        .collect::<Result<Vec<bool>, _>>()?;
        if before.contains(&true) {
            for (r, over) in resolved.iter_mut().zip(before) {
                if let (Count::Limited { hits, .. }, false) = (&mut r.count, over) {
                    *hits = Hits::Check;
                }
            }
        }
        Ok(())
    }
}
