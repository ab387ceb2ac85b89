//! `echo`: the one tool that runs inside toolfs. It returns its arguments' canonical JSON, so
//! tests and benchmarks measure toolfs itself (parse, validate, canonicalise, envelope, 9P)
//! without a worker process.
//!
//! `delay_ms` (0..=10000) makes it sleep first: a test and benchmark knob for a call that is
//! still running (flush, concurrency), nothing more.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::envelope::content_digest;

pub const NAME: &str = "echo";
pub const TIER: &str = "read";
pub const DESCRIPTION: &str =
    "returns its arguments as canonical JSON (runs inside toolfs; for tests and benchmarks)";
pub const DOC: &str = "\
echo — returns its arguments, canonicalised (RFC 8785), as the result content.

It runs inside toolfs (no worker process): a call measures toolfs's own path.
Any JSON object is accepted. One argument has a meaning:
  delay_ms  integer 0..=10000: sleep this long before answering. A knob for tests and
            benchmarks that need a call which is still running; nothing else uses it.
";

/// The largest `delay_ms` echo honours.
pub const MAX_DELAY_MS: u64 = 10_000;

pub fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "delay_ms": {"type": "integer", "minimum": 0, "maximum": MAX_DELAY_MS}
        }
    })
}

/// An optional append-only record of every echo run (`start <digest>` / `done <digest>` lines,
/// the digest being that of the canonical arguments). It lets tests observe from outside
/// whether a call ran, e.g. that a withdrawn call never did. Enabled by `--echo-journal`.
#[derive(Default)]
pub struct EchoJournal {
    file: Option<Mutex<std::fs::File>>,
}

impl EchoJournal {
    pub fn open(path: &Path) -> std::io::Result<EchoJournal> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(EchoJournal {
            file: Some(Mutex::new(file)),
        })
    }

    fn note(&self, event: &str, canonical: &[u8]) {
        if let Some(file) = &self.file {
            let line = format!("{event} {}\n", content_digest(canonical));
            let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = file.write_all(line.as_bytes()) {
                tracing::warn!("echo journal: {e}");
            }
        }
    }
}

/// Runs one echo call on already-validated arguments.
pub async fn run(args: &Value, canonical: &[u8], journal: &EchoJournal) -> String {
    journal.note("start", canonical);
    if let Some(ms) = args.get("delay_ms").and_then(Value::as_u64) {
        tokio::time::sleep(Duration::from_millis(ms.min(MAX_DELAY_MS))).await;
    }
    journal.note("done", canonical);
    // Canonical JSON is UTF-8 by construction.
    String::from_utf8_lossy(canonical).into_owned()
}
