//! The sizes an override may have: a descriptor no longer than a request may send (a
//! longer one could never match), a short name, and no NUL, which PostgreSQL cannot keep.
//! Checked when an override is set and when one is read back from a store or a file, so
//! that what a client or a forged entry can make an instance hold stays bounded.

use super::{Override, OverrideError};
use crate::request::{MAX_ENTRIES, MAX_TEXT_BYTES};

/// The longest limit name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// The most bytes of a descriptor in all: its domain, keys and values.
pub const MAX_DESCRIPTOR_BYTES: usize = 8_192;
/// The longest unit or algorithm, in bytes (the longest valid one is 14).
const MAX_WORD_BYTES: usize = 32;

/// Refuses `spec` when a text of it is past its bound or holds NUL, naming the field.
pub(super) fn check(spec: &Override) -> Result<(), OverrideError> {
    text("domain", &spec.domain, MAX_TEXT_BYTES)?;
    if spec.entries.len() > MAX_ENTRIES {
        let message = format!(
            "{} entries, at most {MAX_ENTRIES} (as in a request)",
            spec.entries.len()
        );
        return Err(OverrideError::new("entries", message));
    }
    let mut total = spec.domain.len();
    for (i, e) in spec.entries.iter().enumerate() {
        text(&format!("entries[{i}].key"), &e.key, MAX_TEXT_BYTES)?;
        text(&format!("entries[{i}].value"), &e.value, MAX_TEXT_BYTES)?;
        total += e.key.len() + e.value.len();
    }
    if total > MAX_DESCRIPTOR_BYTES {
        let message =
            format!("{total} bytes in all (domain, keys, values), at most {MAX_DESCRIPTOR_BYTES}");
        return Err(OverrideError::new("entries", message));
    }
    text("limit.unit", &spec.limit.unit, MAX_WORD_BYTES)?;
    if let Some(algorithm) = &spec.limit.algorithm {
        text("limit.algorithm", algorithm, MAX_WORD_BYTES)?;
    }
    if let Some(name) = &spec.limit.name {
        text("limit.name", name, MAX_NAME_BYTES)?;
    }
    Ok(())
}

fn text(field: &str, text: &str, most: usize) -> Result<(), OverrideError> {
    if text.len() > most {
        let message = format!("{} bytes, at most {most}", text.len());
        return Err(OverrideError::new(field, message));
    }
    if text.contains('\0') {
        return Err(OverrideError::new(
            field,
            "must not hold NUL (U+0000), which PostgreSQL cannot keep",
        ));
    }
    Ok(())
}
