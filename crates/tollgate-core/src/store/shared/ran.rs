//! What a call to the shared store did, as far as this instance can know: it ran and
//! counted so many units, it did not run, or it is in doubt; and what is owed after a
//! decision made without it.

use crate::algo::Hits;

/// What a call did in the store, as far as this instance can know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// It ran, counting these units of its own hits (negative: given back).
    Counted(i64),
    /// It changed nothing, its debt included: never sent, refused before it ran, run
    /// after its deadline, or cancelled by the store.
    Not,
    /// It may have run: its connection broke after it was sent, it failed midway, or it
    /// was never heard of.
    InDoubt,
}

impl Ran {
    /// Units owed to the store (negative: to be given back) after a decision without it
    /// counted `decided` for the call's request. In doubt, whichever leaves the store's
    /// count higher: an admission is owed, a refund taken as made. So no unit is ever
    /// given back twice; the count may be over by the call's units, which only denies
    /// more, and those windows pass.
    pub(crate) fn owed(self, decided: i64) -> i64 {
        match self {
            Self::Counted(stored) => decided.saturating_sub(stored),
            Self::Not => decided,
            Self::InDoubt => decided.max(0),
        }
    }
}

/// The units a decision on `hits` counted (negative: gave back).
pub(crate) fn counted(hits: Hits, admitted: bool) -> i64 {
    let units = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    match hits {
        Hits::Consume(n) if admitted => units(n),
        Hits::Charge(n) => units(n),
        Hits::Refund(n) => -units(n),
        Hits::Consume(_) | Hits::Check => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_doubt_the_store_is_left_the_higher_count() {
        assert_eq!(Ran::Counted(5).owed(5), 0, "counted as decided");
        assert_eq!(
            Ran::Counted(5).owed(0),
            -5,
            "counted past a refusal: given back"
        );
        assert_eq!(Ran::Counted(-5).owed(-5), 0, "a refund that ran");
        assert_eq!(
            Ran::Not.owed(-5),
            -5,
            "a refund that did not run is credited"
        );
        assert_eq!(Ran::Not.owed(3), 3, "an admission that did not run is owed");
        assert_eq!(Ran::InDoubt.owed(3), 3, "an admission in doubt is owed");
        assert_eq!(
            Ran::InDoubt.owed(-5),
            0,
            "a refund in doubt is taken as made"
        );
    }
}
