//! Setting the counters a request names back to empty: an operator's "please unblock me".

use super::{DecideError, Limiter, Recorder, Resolved, drop_replaced, find_rules};
use crate::request::Request;

impl<R: Recorder> Limiter<R> {
    /// Sets the counter of every descriptor of `req` that a rule (or the request's own
    /// limit) counts back to empty, in the store and, for a shared store, in every
    /// instance's local view; returns their keys, in request order. A rule another one
    /// `replaces` counts nothing for this request, so its counter is left alone.
    pub async fn reset(&self, req: &Request<'_>) -> Result<Vec<String>, DecideError> {
        req.validate()?;
        let installed = self.installed.load_full();
        let domain = installed.rules.domain(&req.domain);
        let mut keys = Vec::new();
        let matched = drop_replaced(find_rules(domain, req));
        for (i, (descriptor, rule)) in req.descriptors.iter().zip(matched).enumerate() {
            let plan = self.plan(&req.domain, (i, descriptor), rule, domain.is_some())?;
            if let Resolved::Limited { key, limits, .. } = plan {
                self.store.reset(&key, &limits).await?;
                keys.push(key);
            }
        }
        Ok(keys)
    }
}
