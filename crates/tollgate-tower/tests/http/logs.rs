//! What the layer logs, captured: one subscriber for the whole test binary (tracing has
//! one global default), writing into memory; tests look for lines of their own domain.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::fmt::MakeWriter;

/// The captured log.
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// The capture, installed as the global subscriber (debug level and up) on first use.
    pub(crate) fn get() -> &'static Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            // Plain text whatever features the workspace turns on (ANSI colours would
            // split `domain=example` apart).
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer(logs.clone())
                .init();
            logs
        })
    }

    /// Lines containing every one of `parts`.
    pub(crate) fn lines_with(&self, parts: &[&str]) -> Vec<String> {
        let text = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|line| parts.iter().all(|part| line.contains(part)))
            .map(str::to_owned)
            .collect()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut text = self.0.lock().unwrap_or_else(|p| p.into_inner());
        text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}
