//! Setting the counters a request names back to empty: an operator's "please unblock me".

use super::{DecideError, Limiter, Plan, Recorder};
use crate::request::Request;

impl<R: Recorder> Limiter<R> {
    /// Sets the counter of every descriptor of `req` that a rule (or the request's own
    /// limit) counts back to empty, in the store and, for a shared store, in every
    /// instance's local view; returns their keys, in request order.
    pub async fn reset(&self, req: &Request<'_>) -> Result<Vec<String>, DecideError> {
        req.validate()?;
        let installed = self.installed.load_full();
        let domain = installed.rules.domain(&req.domain);
        let mut keys = Vec::new();
        for descriptor in &req.descriptors {
            let rule = domain.and_then(|d| d.find(descriptor.pairs()));
            let plan = self.plan(&req.domain, descriptor, rule, domain.is_some())?;
            if let Plan::Limited { key, .. } = plan {
                self.store.reset(&key).await?;
                keys.push(key);
            }
        }
        Ok(keys)
    }
}
