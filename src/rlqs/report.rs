//! Usage reports checked and turned into plain values: a bucket is its domain and its
//! entries sorted by key (a `BucketId` is a map, so its order means nothing).

use std::sync::Arc;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use tollgate_core::{Descriptor, Request};

/// One bucket of one domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BucketKey {
    pub(crate) domain: Arc<str>,
    /// Sorted by key; keys are unique.
    pub(crate) entries: Box<[(String, String)]>,
}

impl BucketKey {
    /// The entries as pairs, in key order.
    pub(crate) fn pairs(&self) -> Vec<(&str, &str)> {
        self.entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// The `BucketId` Envoy sent.
    pub(crate) fn to_proto(&self) -> BucketId {
        BucketId {
            bucket: self.entries.iter().cloned().collect(),
        }
    }
}

/// One bucket's usage in one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) bucket: BucketKey,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
}

/// Why a report cannot be served; the stream ends INVALID_ARGUMENT with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidReport {
    #[error("the first usage report of a stream must name a domain")]
    NoDomain,
    #[error("the domain changed from '{0}' to '{1}' within one stream; open a new stream")]
    DomainChanged(String, String),
    #[error("a usage report must carry at least one bucket usage")]
    NoUsages,
    #[error("bucket usage {0} has no bucket id")]
    NoBucketId(usize),
    #[error("bucket usage {0} has an empty bucket id")]
    EmptyBucketId(usize),
    #[error("bucket usage {0} has an empty key")]
    EmptyKey(usize),
    #[error("bucket usage {index} has an empty value for key '{key}'")]
    EmptyValue { index: usize, key: String },
    #[error("bucket usage {index}: {why}")]
    TooLarge { index: usize, why: String },
}

/// Checks `report`, whose stream's domain is `domain` once known (reports after the first
/// may repeat it or leave it out), and returns its domain and usages.
pub(crate) fn parse(
    report: RateLimitQuotaUsageReports,
    domain: Option<&Arc<str>>,
) -> Result<(Arc<str>, Vec<Usage>), InvalidReport> {
    let domain = match (domain, report.domain.as_str()) {
        (None, "") => return Err(InvalidReport::NoDomain),
        (None, given) => Arc::from(given),
        (Some(known), "") => known.clone(),
        (Some(known), given) if **known == *given => known.clone(),
        (Some(known), given) => {
            return Err(InvalidReport::DomainChanged(
                known.to_string(),
                given.into(),
            ));
        }
    };
    if report.bucket_quota_usages.is_empty() {
        return Err(InvalidReport::NoUsages);
    }
    let mut usages = Vec::with_capacity(report.bucket_quota_usages.len());
    for (index, usage) in report.bucket_quota_usages.into_iter().enumerate() {
        let id = usage.bucket_id.ok_or(InvalidReport::NoBucketId(index))?;
        if id.bucket.is_empty() {
            return Err(InvalidReport::EmptyBucketId(index));
        }
        let mut entries: Vec<(String, String)> = id.bucket.into_iter().collect();
        entries.sort_unstable();
        for (key, value) in &entries {
            if key.is_empty() {
                return Err(InvalidReport::EmptyKey(index));
            }
            if value.is_empty() {
                return Err(InvalidReport::EmptyValue {
                    index,
                    key: key.clone(),
                });
            }
        }
        // The same size bounds as a ShouldRateLimit descriptor.
        let descriptor = Descriptor::new(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Request::new(&*domain, vec![descriptor])
            .validate()
            .map_err(|e| InvalidReport::TooLarge {
                index,
                why: e.to_string(),
            })?;
        usages.push(Usage {
            bucket: BucketKey {
                domain: domain.clone(),
                entries: entries.into(),
            },
            allowed: usage.num_requests_allowed,
            denied: usage.num_requests_denied,
        });
    }
    Ok((domain, usages))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

    use super::*;

    fn report(domain: &str, buckets: &[&[(&str, &str)]]) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: domain.into(),
            bucket_quota_usages: buckets
                .iter()
                .map(|pairs| BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: pairs
                            .iter()
                            .map(|(k, v)| ((*k).into(), (*v).into()))
                            .collect(),
                    }),
                    time_elapsed: None,
                    num_requests_allowed: 3,
                    num_requests_denied: 1,
                })
                .collect(),
        }
    }

    fn problem(r: RateLimitQuotaUsageReports, domain: Option<&str>) -> String {
        let known = domain.map(Arc::from);
        parse(r, known.as_ref())
            .expect_err("should be refused")
            .to_string()
    }

    #[test]
    fn buckets_are_sorted_and_the_domain_is_kept() {
        let (domain, usages) =
            parse(report("d", &[&[("b", "2"), ("a", "1")]]), None).expect("valid");
        assert_eq!(&*domain, "d");
        assert_eq!(usages[0].bucket.pairs(), vec![("a", "1"), ("b", "2")]);
        assert_eq!((usages[0].allowed, usages[0].denied), (3, 1));
        let known = Arc::from("d");
        let (again, _) = parse(report("", &[&[("a", "1")]]), Some(&known)).expect("valid");
        assert_eq!(&*again, "d");
    }

    #[test]
    fn each_problem_has_its_reason() {
        assert_eq!(
            problem(report("", &[&[("a", "1")]]), None),
            "the first usage report of a stream must name a domain"
        );
        assert_eq!(
            problem(report("e", &[&[("a", "1")]]), Some("d")),
            "the domain changed from 'd' to 'e' within one stream; open a new stream"
        );
        assert_eq!(
            problem(report("d", &[]), None),
            "a usage report must carry at least one bucket usage"
        );
        assert_eq!(
            problem(report("d", &[&[("a", "1")], &[]]), None),
            "bucket usage 1 has an empty bucket id"
        );
        assert_eq!(
            problem(report("d", &[&[("", "1")]]), None),
            "bucket usage 0 has an empty key"
        );
        assert_eq!(
            problem(report("d", &[&[("a", "")]]), None),
            "bucket usage 0 has an empty value for key 'a'"
        );
        let mut no_id = report("d", &[&[("a", "1")]]);
        no_id.bucket_quota_usages[0].bucket_id = None;
        assert_eq!(problem(no_id, None), "bucket usage 0 has no bucket id");
        let long = "v".repeat(5000);
        assert_eq!(
            problem(report("d", &[&[("a", &long)]]), None),
            "bucket usage 0: descriptor 0 entry 0 value is 5000 bytes (at most 4096)"
        );
    }
}
