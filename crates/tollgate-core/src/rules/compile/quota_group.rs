//! A quota-mode rule's group: `quota_group:` in a rule file, or the metadata key
//! `quota_group` (xDS has no field for it), checked.

use std::sync::Arc;

use super::Context;
use crate::rules::meta::MetaValue;
use crate::rules::spec::DescriptorSpec;

/// The metadata key that names a rule's group.
const KEY: &str = "quota_group";
/// The longest group name, in bytes.
const MAX_NAME: usize = 128;

impl Context<'_> {
    /// Takes the quota group out of `spec` (its field, or its metadata, which then no
    /// longer carries it), or none; a problem is reported at `path`. Reference mode
    /// refuses the field and leaves the metadata key as the reference does: metadata.
    pub(super) fn quota_group(
        &mut self,
        spec: &mut DescriptorSpec,
        path: &str,
    ) -> Option<Arc<str>> {
        let field = spec.quota_group.take();
        if self.defaults.reference {
            if field.is_some() {
                let message = "REFERENCE_MODE answers as the reference does; `quota_group` is \
                               Tollgate's";
                self.error(&format!("{path}.{KEY}"), message.into());
            }
            return None;
        }
        let in_metadata = spec.metadata.as_mut().and_then(|m| m.remove(KEY));
        if spec.metadata.as_ref().is_some_and(|m| m.is_empty()) {
            spec.metadata = None;
        }
        let (name, place) = match (field, in_metadata) {
            (None, None) => return None,
            (Some(_), Some(_)) => {
                let message = "the quota group is named twice, as `quota_group` and in \
                               `metadata`; name it once";
                self.error(&format!("{path}.{KEY}"), message.into());
                return None;
            }
            (Some(name), None) => (name, format!("{path}.{KEY}")),
            (None, Some(MetaValue::String(name))) => (name, format!("{path}.metadata.{KEY}")),
            (None, Some(_)) => {
                let message = "the quota group must be a string: the group's name";
                self.error(&format!("{path}.metadata.{KEY}"), message.into());
                return None;
            }
        };
        if let Err(message) = check_name(&name) {
            self.error(&place, message);
            return None;
        }
        if !spec.quota_mode {
            let message = format!(
                "quota group '{name}' groups quota-mode rules: set quota_mode: true on this rule"
            );
            self.error(&place, message);
            return None;
        }
        Some(name.into())
    }
}

/// Whether `name` can name a group: 1 to [`MAX_NAME`] bytes of letters, digits and
/// `- _ . : / @`, so that it reads the same in a log line, a metric and a YAML file.
fn check_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.:/@".contains(c);
    if name.is_empty() {
        Err("the quota group's name is empty".into())
    } else if name.len() > MAX_NAME {
        Err(format!(
            "the quota group's name is {} bytes (at most {MAX_NAME})",
            name.len()
        ))
    } else if let Some(c) = name.chars().find(|&c| !allowed(c)) {
        Err(format!(
            "the quota group '{}' holds {:?}: a name may hold letters, digits and - _ . : / @",
            name.escape_debug(),
            c
        ))
    } else {
        Ok(())
    }
}
