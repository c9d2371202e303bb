//! Request validation: what a request must look like before any rule or counter is touched.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 32;
pub const MAX_TEXT_BYTES: usize = 4096;

/// Checks the shape and sizes of a request; the error says what is wrong and where.
pub fn request(req: &RateLimitRequest) -> Result<(), String> {
    if req.domain.is_empty() {
        return Err("rate limit domain must not be empty".into());
    }
    if req.domain.len() > MAX_TEXT_BYTES {
        return Err(too_long("domain", req.domain.len()));
    }
    if req.descriptors.is_empty() {
        return Err("rate limit descriptor list must not be empty".into());
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(format!(
            "too many descriptors: {} (at most {MAX_DESCRIPTORS})",
            req.descriptors.len()
        ));
    }
    for (d, descriptor) in req.descriptors.iter().enumerate() {
        let entries = &descriptor.entries;
        if entries.is_empty() {
            return Err(format!("descriptor {d} has no entries"));
        }
        if entries.len() > MAX_ENTRIES {
            return Err(format!(
                "descriptor {d} has too many entries: {} (at most {MAX_ENTRIES})",
                entries.len()
            ));
        }
        for (e, entry) in entries.iter().enumerate() {
            if entry.key.is_empty() {
                return Err(format!("descriptor {d} entry {e} has an empty key"));
            }
            if entry.key.len() > MAX_TEXT_BYTES {
                return Err(too_long(
                    &format!("descriptor {d} entry {e} key"),
                    entry.key.len(),
                ));
            }
            if entry.value.len() > MAX_TEXT_BYTES {
                return Err(too_long(
                    &format!("descriptor {d} entry {e} value"),
                    entry.value.len(),
                ));
            }
        }
    }
    Ok(())
}

fn too_long(what: &str, len: usize) -> String {
    format!("{what} is {len} bytes (at most {MAX_TEXT_BYTES})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }

    fn req(domain: &str, descriptors: Vec<Vec<Entry>>) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .into_iter()
                .map(|entries| RateLimitDescriptor {
                    entries,
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    fn error(r: RateLimitRequest) -> String {
        request(&r).expect_err("should be rejected")
    }

    #[test]
    fn each_problem_has_its_message() {
        assert_eq!(
            error(req("", vec![vec![entry("k", "v")]])),
            "rate limit domain must not be empty"
        );
        assert_eq!(
            error(req("d", vec![])),
            "rate limit descriptor list must not be empty"
        );
        assert_eq!(error(req("d", vec![vec![]])), "descriptor 0 has no entries");
        assert_eq!(
            error(req("d", vec![vec![entry("k", "v"), entry("", "v")]])),
            "descriptor 0 entry 1 has an empty key"
        );
        assert_eq!(
            error(req("d", vec![vec![entry("k", "v")]; 65])),
            "too many descriptors: 65 (at most 64)"
        );
        assert_eq!(
            error(req(
                "d",
                vec![vec![entry("k", "v")], vec![entry("k", "v"); 33]]
            )),
            "descriptor 1 has too many entries: 33 (at most 32)"
        );
        assert_eq!(
            error(req("d", vec![vec![entry("k", &"x".repeat(4097))]])),
            "descriptor 0 entry 0 value is 4097 bytes (at most 4096)"
        );
    }

    #[test]
    fn limits_themselves_are_accepted() {
        let full = vec![vec![entry(&"k".repeat(4096), &"v".repeat(4096)); 32]; 64];
        assert_eq!(request(&req("d", full)), Ok(()));
        assert_eq!(request(&req("d", vec![vec![entry("k", "")]])), Ok(()));
    }
}
