//! Setting the counters a request names back to empty: an operator's "please unblock me".

use super::matched::Count;
use super::{DecideError, Limiter, Recorder};
use crate::request::Request;

impl<R: Recorder> Limiter<R> {
    /// Sets the counter of every descriptor of `req` that a rule (or the request's own
    /// limit) counts back to empty, in the store and, for a shared store, in every
    /// instance's local view; returns their keys, in request order. A rule another one
    /// `replaces` counts nothing for this request, so its counter is left alone.
    pub async fn reset(&self, req: &Request<'_>) -> Result<Vec<String>, DecideError> {
        let installed = self.installed.load_full();
        let mut keys = Vec::new();
        let overrides = self.overrides.load_full();
        for resolved in self.resolve(&installed.rules, &overrides, req)? {
            if let Count::Limited { counter, .. } = resolved.count {
                self.store.reset(&counter).await?;
                keys.push(counter.key().to_owned());
            }
        }
        Ok(keys)
    }
}
