//! What an instance hears of the overrides kept in a shared store, and what a change of
//! them can end as (`store/shared/overrides.rs` makes both).

use crate::store::StoreError;

/// Where an instance stands in a shared store's change log of overrides: none before it
/// has read them.
#[derive(Debug, Clone, Default)]
pub struct OverrideFeed {
    /// The log's epoch and the version read up to (read by the shared stores alone).
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), expect(dead_code))]
    pub(crate) at: Option<(String, u64)>,
}

/// What changed in the stored overrides since an instance last read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverrideUpdate {
    /// These descriptors' overrides as stored now, by id (none: deleted), oldest change
    /// first.
    Changed(Vec<(String, Option<String>)>),
    /// The whole set, read again: (id, JSON).
    All(Vec<(String, String)>),
    /// The log cannot tell what changed (never read, the store emptied, or trimmed past
    /// the version held): the whole set must be read.
    Behind,
}

/// A change of a stored override the store answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    /// Made; the live override it replaced or deleted (JSON), if any.
    Made(Option<String>),
    /// Made, as the store showed once the change's deadline had passed (its answer was
    /// lost); what it replaced or deleted is not known.
    Settled,
    /// Refused: a new override would make more than the maximum of live ones (the count).
    Full(u64),
}

/// Why a change of a stored override failed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// It was not made, and will not be.
    #[error(transparent)]
    NotMade(StoreError),
    /// The store did not answer, nor could it be asked after the change's deadline: it
    /// may have been made before then, and can no longer be.
    #[error(
        "{0}; whether the change was made before its deadline is not known (it cannot be \
         made after): GET /overrides shows it"
    )]
    Unknown(StoreError),
}
