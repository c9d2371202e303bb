//! Tollgate's decision core: rate-limit rules and their compilation, counter keys, the
//! algorithms, the counter stores, and the decision itself — on plain Rust types, with no
//! gRPC, HTTP or metrics crate in sight. The server and the tower middleware are adapters
//! over [`Limiter`].
//!
//! ```
//! use tollgate_core::{Descriptor, Hits, Limiter, MemoryStore, Request, Rules, Store};
//!
//! # let runtime = tokio::runtime::Builder::new_current_thread().build()?;
//! # runtime.block_on(async {
//! let rules = Rules::from_yaml("rules.yaml", r#"
//! domain: api
//! descriptors:
//!   - key: user
//!     rate_limit: {unit: minute, requests_per_unit: 2}
//! "#)?;
//! let limiter = Limiter::new(rules, Store::Memory(MemoryStore::default()));
//! let request = Request::new("api", vec![Descriptor::new([("user", "ann")])]);
//! assert!(!limiter.decide(&request).await?.over_limit);
//! assert!(!limiter.decide(&request).await?.over_limit);
//! assert!(limiter.decide(&request).await?.over_limit);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(unreachable_pub, missing_docs)]

mod algo;
mod calendar;
mod clock;
mod counter;
mod decision;
pub mod headers;
mod key;
mod limit;
mod limiter;
mod lock;
mod log_limit;
pub mod overrides;
pub mod redact;
mod request;
pub mod rules;
mod stats;
pub mod store;
pub mod top;
mod unit;

pub use algo::{Hits, MAX_UNITS};
pub use calendar::{Calendar, CalendarError, MAX_CALENDAR_YEARS};
pub use clock::{
    Clock, ManualClock, NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SECOND, SystemClock, Timestamp,
    nanos_of,
};
pub use counter::Counter;
pub use decision::{Decision, InFlight, Limited, Outcome};
pub use limit::{
    Algorithm, AlgorithmKind, DEFAULT_PRECISION, Limit, LimitError, MAX_PRECISION, UnknownName,
};
pub use limiter::{
    DecideError, Explained, Explanation, Found, Limiter, Matched, NoMatch, Options, Recorder,
    TopQuery,
};
pub use lock::lock;
pub use log_limit::LogLimit;
pub use request::{Descriptor, Entry, InvalidRequest, LimitOverride, Request};
pub use rules::{ConfigError, ConfigErrors, Defaults, Rule, Rules};
pub use stats::{Histogram, HistogramSnapshot};
pub use store::{
    Capacity, CounterView, DecidedBy, IgnoredAnnouncements, KeyLayout, LeaseView, LimitView,
    MemoryStore, OnStoreError, Peek, Reading, Store, StoreError, StoreStats,
};
pub use unit::Unit;
