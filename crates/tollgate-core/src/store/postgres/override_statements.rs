//! The statements that change and read the stored overrides (`overrides.sql`), prepared
//! on each pooled connection (`connect.rs`) and run by the backend (`mod.rs`).

/// Sets or deletes an override of the key prefix (`overrides.sql`).
pub(super) const CHANGE_OVERRIDE: &str = "SELECT tollgate_override_change($1, $2, $3, $4, $5, $6)";

/// An override of the key prefix once no change of it is under way.
pub(super) const OVERRIDE_OF: &str = "SELECT tollgate_override_of($1, $2)";

/// The change log of the key prefix's overrides.
pub(super) const OVERRIDE_LOG: &str = "SELECT * FROM tollgate_override_log($1, $2, $3)";

/// The overrides of the key prefix, at most a number of them.
pub(super) const ALL_OVERRIDES: &str =
    "SELECT id, spec FROM tollgate_overrides WHERE prefix = $1 ORDER BY id LIMIT $2";
