//! The counters of one request decided together in the memory store: their shards locked
//! at once, every ask applied to copies of their states, and the copies kept only as the
//! request's answer says. No other request ever sees units counted and then given back.

use super::MemoryStore;
use crate::algo::{Hits, Verdict, apply};
use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::store::shards::{CounterState, LockedAll};

/// One counter a request asks of: its key, its limits, its hits.
pub(crate) type Ask<'a> = (&'a str, &'a [Limit], Hits);

/// What one ask got: its verdict, and whether the units it consumed were given back
/// (counted nothing, the request being refused).
pub(crate) type Answered = (Verdict, bool);

impl MemoryStore {
    /// Applies `asks` as [`MemoryStore::apply`] would, refunds first, each seeing what
    /// the ones before it counted, and asks `refused` of their verdicts (in the order of
    /// `asks`) whether the request is refused. If it is, none of its consumptions counts
    /// (its charges and refunds do), and a consumption that fitted answers as a check.
    pub(crate) fn apply_together(
        &self,
        asks: &[Ask<'_>],
        refused: impl FnOnce(&[Verdict]) -> bool,
    ) -> Vec<Answered> {
        let now = self.clock.now();
        let mut locked = self.counters.lock_all(asks.iter().map(|&(key, ..)| key));
        let counted = Pass::run(&mut locked, asks, now, false);
        if !refused(&counted.verdicts) {
            let answered = counted.verdicts.iter().map(|&v| (v, false)).collect();
            counted.keep(&mut locked, asks, now);
            return answered;
        }
        let checked = Pass::run(&mut locked, asks, now, true);
        let answered = asks
            .iter()
            .zip(&counted.verdicts)
            .zip(&checked.verdicts)
            .map(|((&(_, _, hits), counted), checked)| match hits {
                Hits::Consume(_) if counted.decision.admitted => (*checked, true),
                _ => (*counted, false),
            })
            .collect();
        checked.keep(&mut locked, asks, now);
        answered
    }
}

/// The asks applied once to copies of their counters' states.
struct Pass {
    /// In the order of the asks.
    verdicts: Vec<Verdict>,
    copies: Vec<Copy>,
}

/// One counter's state through a pass.
struct Copy {
    /// The first ask naming the counter.
    first: usize,
    /// The last: its limits and verdict say when the counter expires.
    last: usize,
    state: CounterState,
    /// The counter exists in the store.
    held: bool,
    /// The pass counted units on it.
    counted: bool,
}

impl Pass {
    /// Applies `asks` to copies of the states `locked` holds, refunds first; with
    /// `consume_as_check`, a consumption only checks.
    fn run(
        locked: &mut LockedAll<'_, CounterState>,
        asks: &[Ask<'_>],
        now: Timestamp,
        consume_as_check: bool,
    ) -> Self {
        let refund = |&(_, &(_, _, hits)): &(usize, &Ask<'_>)| matches!(hits, Hits::Refund(_));
        let refunds = asks.iter().enumerate().filter(refund);
        let others = asks.iter().enumerate().filter(|a| !refund(a));
        let mut verdicts = vec![None; asks.len()];
        let mut copies: Vec<Copy> = Vec::new();
        for (i, &(_, limits, hits)) in refunds.chain(others) {
            let hits = match hits {
                Hits::Consume(_) if consume_as_check => Hits::Check,
                other => other,
            };
            let at = match copies.iter().position(|c| locked.same(c.first, i)) {
                Some(at) => at,
                None => {
                    let held = locked.entry(i).and_then(|e| e.get().cloned());
                    copies.push(Copy {
                        first: i,
                        last: i,
                        held: held.is_some(),
                        state: held.unwrap_or_else(|| CounterState::new(limits)),
                        counted: false,
                    });
                    copies.len() - 1
                }
            };
            let Some(copy) = copies.get_mut(at) else {
                continue;
            };
            let verdict = apply(copy.state.states.as_mut_slice(), limits, now, hits);
            copy.counted |= match hits {
                Hits::Consume(n) => verdict.decision.admitted && n > 0,
                Hits::Charge(n) => n > 0,
                Hits::Check | Hits::Refund(_) => false,
            };
            copy.last = i;
            if let Some(slot) = verdicts.get_mut(i) {
                *slot = Some(verdict);
            }
        }
        Self {
            verdicts: verdicts.into_iter().flatten().collect(),
            copies,
        }
    }

    /// Puts the copies in the store: a counter held before, or one the pass counted on
    /// (as [`MemoryStore::apply`] creates only counters that count something).
    fn keep(self, locked: &mut LockedAll<'_, CounterState>, asks: &[Ask<'_>], now: Timestamp) {
        for mut copy in self.copies {
            let (Some(&(_, limits, _)), Some(verdict)) =
                (asks.get(copy.last), self.verdicts.get(copy.last))
            else {
                continue;
            };
            if !(copy.held || copy.counted) {
                continue;
            }
            copy.state.touch(limits, verdict);
            if let Some(mut entry) = locked.entry(copy.first) {
                entry.insert(copy.state, now);
            }
        }
    }
}
