//! Loopback ports for the servers tests start, taken below the kernel's ephemeral range.
//! A port a test chose and released while its server starts must not be handed to anyone
//! binding port 0 meanwhile (an Envoy's admin address took the port chosen for its own
//! listener on a busy host); the kernel hands out port 0 only from the ephemeral range.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How many ports below the ephemeral range are tried.
const SPAN: u32 = 12_000;

/// Candidates tried so far by this process, so that successive calls move on.
static TRIED: AtomicU32 = AtomicU32::new(0);

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// `N` different loopback ports nothing listens on right now: all bound at once, then
/// closed. Below the ephemeral range, from a start that differs per process (test
/// binaries run side by side); in it only when none is left below.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let low = ephemeral_low();
    let base = u32::from(low).saturating_sub(SPAN).max(1024);
    let span = u32::from(low).saturating_sub(base);
    let start = std::process::id().wrapping_mul(7_919).wrapping_add(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos()),
    );
    let mut held: Vec<TcpListener> = Vec::with_capacity(N);
    for _ in 0..span {
        if held.len() == N {
            break;
        }
        let at = TRIED.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(base + start.wrapping_add(at) % span) else {
            continue;
        };
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    while held.len() < N {
        held.push(TcpListener::bind("127.0.0.1:0").expect("bind a free port on 127.0.0.1"));
    }
    std::array::from_fn(|i| {
        held[i]
            .local_addr()
            .map(|addr| addr.port())
            .expect("the port of a bound listener")
    })
}

/// The lowest port of the kernel's ephemeral range (Linux's default when unreadable).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}
