//! The reference's statsd output (`USE_STATSD`, or `USE_DOG_STATSD`): every flush interval,
//! what each of its stats gained since the last flush, under its stat names
//! (`reference_stats.rs`), from the same registry as `/metrics`. Plain statsd goes over
//! TCP, with `EXTRA_TAGS` in the names (`name.__k=v`), as the reference's statsd sink
//! sends; DogStatsD over UDP with the tags as `|#k:v`. A statsd that is down loses those
//! flushes and nothing else.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpStream, UdpSocket};

use crate::ops::metrics::Metrics;
use crate::ops::reference_stats::{self, Stat};

/// Where stats go and how.
#[derive(Debug, Clone)]
pub(crate) struct StatsdConfig {
    /// `STATSD_HOST:STATSD_PORT`.
    pub(crate) target: String,
    /// DogStatsD (UDP, tags after `|#`) rather than plain statsd (TCP, tags in the name).
    pub(crate) dog: bool,
    /// `EXTRA_TAGS`, on every stat, sorted by key (the order gostats writes them in).
    pub(crate) tags: Vec<(String, String)>,
    /// `STATS_FLUSH_INTERVAL`.
    pub(crate) interval: Duration,
}

/// Flushes every interval until the process ends.
pub(crate) fn spawn(config: StatsdConfig, metrics: Arc<Metrics>) {
    tokio::spawn(async move {
        let mut sink = Sink::new(config.clone());
        let mut last = BTreeMap::new();
        let mut ticks = tokio::time::interval(config.interval);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let Ok(text) = metrics.encode() else {
                continue;
            };
            let now = reference_stats::read(&text);
            let lines = lines(&last, &now, &config);
            if !lines.is_empty() {
                sink.send(&lines).await;
            }
            last = now;
        }
    });
}

/// The statsd lines of what each stat gained from `last` to `now`.
fn lines(last: &BTreeMap<String, Stat>, now: &BTreeMap<String, Stat>, c: &StatsdConfig) -> String {
    let mut out = String::new();
    for (raw, stat) in now {
        let name = tagged(&sanitized(raw), c);
        match (stat, last.get(raw)) {
            (Stat::Counter(n), before) => {
                let before = match before {
                    Some(Stat::Counter(b)) => *b,
                    _ => 0,
                };
                if *n > before {
                    let _ = writeln!(out, "{}:{}|c{}", name.0, n - before, name.1);
                }
            }
            (Stat::Timer { count, sum_ms }, before) => {
                let (c0, s0) = match before {
                    Some(Stat::Timer { count, sum_ms }) => (*count, *sum_ms),
                    _ => (0, 0.0),
                };
                if *count > c0 {
                    // One line for the interval's observations: their mean, sampled at
                    // 1/n, which statsd counts as n observations with the right sum.
                    let n = count - c0;
                    let mean = (sum_ms - s0) / n as f64;
                    let rate = 1.0 / n as f64;
                    let _ = writeln!(out, "{}:{mean:.6}|ms|@{rate}{}", name.0, name.1);
                }
            }
        }
    }
    out
}

/// A stat's name with the characters statsd's line format reserves replaced.
fn sanitized(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ':' | '|' | '@' | '#' | '\n' | '\r' => '_',
            c => c,
        })
        .collect()
}

/// The name to send and what follows the type: tags in the name for plain statsd
/// (`name.__k=v`, by key), after `|#` for DogStatsD.
fn tagged(name: &str, c: &StatsdConfig) -> (String, String) {
    let tags = &c.tags;
    if tags.is_empty() {
        return (name.to_owned(), String::new());
    }
    if c.dog {
        let list: Vec<String> = tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        return (name.to_owned(), format!("|#{}", list.join(",")));
    }
    let mut full = name.to_owned();
    for (k, v) in tags {
        let _ = write!(full, ".__{k}={v}");
    }
    (full, String::new())
}

/// A statsd connection, opened again when it fails.
struct Sink {
    config: StatsdConfig,
    tcp: Option<TcpStream>,
    udp: Option<UdpSocket>,
    /// Failures are logged once until a flush succeeds again.
    failing: bool,
}

impl Sink {
    fn new(config: StatsdConfig) -> Self {
        Self {
            config,
            tcp: None,
            udp: None,
            failing: false,
        }
    }

    async fn send(&mut self, lines: &str) {
        let sent = match self.config.dog {
            true => self.send_udp(lines).await,
            false => self.send_tcp(lines).await,
        };
        match sent {
            Ok(()) => self.failing = false,
            Err(e) => {
                if !self.failing {
                    tracing::warn!(target = %self.config.target, "cannot send stats to statsd: {e}");
                }
                self.failing = true;
                self.tcp = None;
                self.udp = None;
            }
        }
    }

    async fn send_tcp(&mut self, lines: &str) -> std::io::Result<()> {
        if self.tcp.is_none() {
            self.tcp = Some(TcpStream::connect(&self.config.target).await?);
        }
        match &mut self.tcp {
            Some(stream) => stream.write_all(lines.as_bytes()).await,
            None => Ok(()),
        }
    }

    async fn send_udp(&mut self, lines: &str) -> std::io::Result<()> {
        if self.udp.is_none() {
            let socket = UdpSocket::bind(("0.0.0.0", 0)).await?;
            socket.connect(&self.config.target).await?;
            self.udp = Some(socket);
        }
        let Some(socket) = &self.udp else {
            return Ok(());
        };
        // A datagram per packet of whole lines, below a safe UDP payload.
        let mut packet = String::new();
        for line in lines.lines() {
            if !packet.is_empty() && packet.len() + line.len() + 1 > UDP_PAYLOAD {
                socket.send(packet.as_bytes()).await?;
                packet.clear();
            }
            packet.push_str(line);
            packet.push('\n');
        }
        if !packet.is_empty() {
            socket.send(packet.as_bytes()).await?;
        }
        Ok(())
    }
}

/// Bytes of statsd lines per datagram: below any path's MTU.
const UDP_PAYLOAD: usize = 1_400;

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dog: bool, tags: &[(&str, &str)]) -> StatsdConfig {
        StatsdConfig {
            target: "127.0.0.1:1".into(),
            dog,
            tags: {
                let mut tags: Vec<(String, String)> = tags
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
                tags.sort();
                tags
            },
            interval: Duration::from_secs(10),
        }
    }

    fn stats(pairs: &[(&str, Stat)]) -> BTreeMap<String, Stat> {
        pairs
            .iter()
            .map(|(n, s)| ((*n).to_owned(), s.clone()))
            .collect()
    }

    #[test]
    fn counters_send_what_they_gained_and_nothing_when_unchanged() {
        let last = stats(&[("a.b", Stat::Counter(3)), ("same", Stat::Counter(1))]);
        let now = stats(&[
            ("a.b", Stat::Counter(5)),
            ("same", Stat::Counter(1)),
            ("new:x|y", Stat::Counter(2)),
        ]);
        let text = lines(&last, &now, &config(false, &[]));
        assert_eq!(text, "a.b:2|c\nnew_x_y:2|c\n");
    }

    #[test]
    fn timers_send_the_intervals_mean_at_its_sample_rate() {
        let last = stats(&[(
            "t",
            Stat::Timer {
                count: 2,
                sum_ms: 10.0,
            },
        )]);
        let now = stats(&[(
            "t",
            Stat::Timer {
                count: 6,
                sum_ms: 30.0,
            },
        )]);
        assert_eq!(
            lines(&last, &now, &config(false, &[])),
            "t:5.000000|ms|@0.25\n"
        );
    }

    #[test]
    fn extra_tags_go_in_the_name_for_statsd_and_after_the_type_for_dogstatsd() {
        let now = stats(&[("a", Stat::Counter(1))]);
        let tags = [("zone", "eu"), ("app", "x")];
        assert_eq!(
            lines(&BTreeMap::new(), &now, &config(false, &tags)),
            "a.__app=x.__zone=eu:1|c\n"
        );
        assert_eq!(
            lines(&BTreeMap::new(), &now, &config(true, &tags)),
            "a:1|c|#app:x,zone:eu\n"
        );
    }
}
