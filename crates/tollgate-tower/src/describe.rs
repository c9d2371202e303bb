//! How a request becomes descriptors: a function of the request, written as a plain
//! closure, that may fail when the request lacks what it needs (no client address).

use std::borrow::Cow;

use http::Request;
use tollgate_core::Descriptor;

/// Turns a request into the descriptors to limit it by (none: not limited), or says why
/// it cannot. Any `Fn(&Request<B>) -> Result<Vec<Descriptor<'static>>, DescribeError>`
/// that is `Clone + Send + Sync + 'static` is one; a closure given to
/// [`RateLimitLayer::new`](crate::RateLimitLayer::new) needs no type on its argument.
///
/// ```
/// use tollgate_tower::{Describe, extract};
/// use tollgate_tower::core::Descriptor;
///
/// fn limited_by<B>(describe: impl Describe<B>) -> impl Describe<B> {
///     describe
/// }
/// let per_key = limited_by(|req| {
///     Ok(extract::header(req, "x-api-key")
///         .map(|key| vec![Descriptor::from(vec![key])])
///         .unwrap_or_default())
/// });
/// let req = http::Request::get("/").header("x-api-key", "k1").body(()).expect("a request");
/// assert_eq!(per_key(&req).map(|d| d.len()), Ok(1));
/// ```
pub trait Describe<B>:
    Fn(&Request<B>) -> Result<Vec<Descriptor<'static>>, DescribeError> + Clone + Send + Sync + 'static
{
}

impl<B, F> Describe<B> for F where
    F: Fn(&Request<B>) -> Result<Vec<Descriptor<'static>>, DescribeError>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// A request that cannot be described because the service is set up so that the
/// describe function can never see what it needs (a client address the server does not
/// record). The layer answers 500 and logs the message once: such a request must not
/// pass unlimited without a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeError(Cow<'static, str>);

impl DescribeError {
    /// An error saying `why`, for the log.
    pub fn new(why: impl Into<Cow<'static, str>>) -> Self {
        Self(why.into())
    }
}

impl std::fmt::Display for DescribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DescribeError {}
