//! The connection record: one JSON line per proxied (or refused) connection, written when it
//! ends, to a file or stdout, so that a receipt can later be made of it.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Proxied, and ended by one side closing.
    Closed,
    /// Refused by the policy, the decision hook or the address rules; nothing was connected.
    Refused,
    /// The destination could not be resolved or connected.
    Unreachable,
    /// Every address of the destination refused the connection.
    ConnectionRefused,
    /// The client spoke no protocol the proxy knows, or broke off.
    BadRequest,
    /// Proxied, and ended by an I/O error on either side.
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// When the connection was accepted (Unix ms).
    pub start_ms: u64,
    pub duration_ms: u64,
    /// The session's name (the namespace, later).
    pub session: String,
    /// `http-connect`, `http` (a forwarded absolute-URI request) or `socks5`; null when the
    /// client's first bytes were neither.
    pub protocol: Option<String>,
    /// The destination as the client named it (lowercased name or IP literal).
    pub host: Option<String>,
    pub port: Option<u16>,
    /// The address connected to (`ip:port`), null when nothing was.
    pub address: Option<String>,
    /// Bytes written to the destination (request headers as forwarded included).
    pub bytes_client_to_server: u64,
    /// Bytes read from the destination.
    pub bytes_server_to_client: u64,
    pub outcome: Outcome,
    /// Why it was refused or failed; null when it closed normally.
    pub reason: Option<String>,
}

/// What a record's connection needs before it is served (the daemon's: a place in the receipt
/// queue), and what is then done with its record; `Err` refuses the connection.
pub type ReserveHook = Arc<dyn Fn() -> Result<FinishRecord, String> + Send + Sync>;
/// Given the record when its connection ends (the daemon's: queue its `effect` receipt).
pub type FinishRecord = Box<dyn FnOnce(&Record) + Send>;

/// Where records go. Each record is one `write` of one line, flushed, and, through the slot
/// [`Records::reserve`] took for its connection, is given to the reserve hook's finisher.
#[derive(Clone)]
pub struct Records {
    sink: Option<Arc<Mutex<Box<dyn Write + Send>>>>,
    reserve: Option<ReserveHook>,
}

/// What [`Records::reserve`] took for one connection; [`RecordSlot::write`] spends it.
pub struct RecordSlot {
    records: Records,
    finish: Option<FinishRecord>,
}

impl RecordSlot {
    pub fn write(self, record: &Record) {
        if let Some(finish) = self.finish {
            finish(record);
        }
        self.records.write(record);
    }
}

impl Records {
    /// Records are dropped (the library's default; the daemon always names a sink).
    pub fn none() -> Records {
        Records {
            sink: None,
            reserve: None,
        }
    }

    pub fn stdout() -> Records {
        Records::to_writer(Box::new(io::stdout()))
    }

    /// Appends to `path` (made 0600 if new).
    pub fn file(path: &Path) -> io::Result<Records> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Records::to_writer(Box::new(f)))
    }

    pub fn to_writer(w: Box<dyn Write + Send>) -> Records {
        Records {
            sink: Some(Arc::new(Mutex::new(w))),
            reserve: None,
        }
    }

    /// These records, each connection's reserved with `reserve` before it is served.
    pub fn with_reserve(mut self, reserve: ReserveHook) -> Records {
        self.reserve = Some(reserve);
        self
    }

    /// What a connection's record will need, taken before the connection is served; `Err`: the
    /// connection must not be served (fail closed: a connection nobody can account for).
    pub fn reserve(&self) -> Result<RecordSlot, String> {
        let finish = match &self.reserve {
            Some(reserve) => Some(reserve()?),
            None => None,
        };
        Ok(RecordSlot {
            records: self.clone(),
            finish,
        })
    }

    /// Writes `record` to the sink only (a connection's goes through its [`RecordSlot`]).
    pub fn write(&self, record: &Record) {
        let Some(sink) = &self.sink else { return };
        let mut line = serde_json::to_vec(record).expect("a record serialises");
        line.push(b'\n');
        let mut w = sink.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = w.write_all(&line).and_then(|()| w.flush()) {
            tracing::error!("cannot write a connection record: {e}");
        }
    }
}
