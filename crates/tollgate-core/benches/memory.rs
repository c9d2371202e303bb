//! Memory per counter: RSS of the process before and after filling a memory store with
//! distinct sliding-window counters (precision 10 by default).
//!
//! Run: `cargo bench -p tollgate-core --bench memory -- [COUNTERS [PRECISION]]` (default
//! 1,000,000 and 10).

use std::sync::Arc;

use tollgate_core::{
    Capacity, Descriptor, Limiter, ManualClock, MemoryStore, Request, Rules, Store, Timestamp,
};

fn rss_bytes() -> u64 {
    // The second field of /proc/self/statm is the resident set, in pages.
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let counters: usize = match args.next() {
        Some(n) => n.parse()?,
        None => 1_000_000,
    };
    let precision: u32 = match args.next() {
        Some(n) => n.parse()?,
        None => 10,
    };
    let rules = Rules::from_yaml(
        "memory.yaml",
        &format!(
            "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, \
             requests_per_unit: 100, algorithm: sliding_window, precision: {precision}}}\n"
        ),
    )?;
    let clock = ManualClock::new(Timestamp::from_nanos(1_700_000_000_000_000_000));
    // Room to spare, so that no shard evicts: every counter is measured.
    let capacity = Capacity {
        counters: counters + counters / 10,
        bytes: usize::MAX,
    };
    let store = Store::Memory(MemoryStore::new(capacity, Arc::new(clock)));
    let limiter = Limiter::new(rules, store);
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let before = rss_bytes();
    runtime.block_on(async {
        for i in 0..counters {
            let value = format!("u-{i}");
            let request = Request::new("bench", vec![Descriptor::new([("user", value.as_str())])]);
            limiter.decide(&request).await?;
        }
        Ok::<(), tollgate_core::DecideError>(())
    })?;
    let after = rss_bytes();
    let stats = limiter.store().stats();
    println!(
        "{} counters: RSS +{:.1} MiB, {:.1} bytes per counter (the store counts {:.1} bytes per counter)",
        stats.counters,
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / stats.counters as f64,
        stats.bytes as f64 / stats.counters as f64,
    );
    Ok(())
}
