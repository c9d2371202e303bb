//! Runtime overrides kept in the shared store, which is their truth: a change is written
//! there first and announced; every instance reads the whole set again when it hears the
//! announcement, and on a timer, so that a missed announcement heals.

use super::backend::TripError;
use super::{RESET_TIMEOUT, SharedStore, operator_error};
use crate::store::StoreError;

impl SharedStore {
    /// The stored overrides' JSON, at most `most` of them, in the order of their ids.
    pub async fn read_overrides(&self, most: usize) -> Result<Vec<String>, StoreError> {
        self.overrides_call(self.backend.overrides(most)).await
    }

    /// Stores `spec` (an override's JSON) for descriptor `id` and announces the change.
    pub async fn write_override(&self, id: &str, spec: String) -> Result<(), StoreError> {
        let sending = self.backend.set_override(id, spec);
        self.overrides_call(sending).await
    }

    /// Deletes the override of descriptor `id` and announces the change.
    pub async fn delete_override(&self, id: &str) -> Result<(), StoreError> {
        self.overrides_call(self.backend.delete_override(id)).await
    }

    /// Waits until an announcement says the stored overrides may have changed (one heard
    /// while nobody waited counts for the next wait).
    pub async fn overrides_changed(&self) {
        self.overrides_changed.notified().await;
    }

    /// An operator's call on the store, waited for as long as a reset.
    async fn overrides_call<T>(
        &self,
        call: impl Future<Output = Result<T, TripError>>,
    ) -> Result<T, StoreError> {
        let wait = self.behaviour.timeout.max(RESET_TIMEOUT);
        match tokio::time::timeout(wait, call).await {
            Err(_) => Err(StoreError::Timeout),
            Ok(result) => result.map_err(operator_error),
        }
    }
}
