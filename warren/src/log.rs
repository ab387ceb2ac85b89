//! `warren log [SCOPE] [-f] [--json]`: receipts in plain words, read through receiptd's tree.
//!
//! One line per receipt: time, scope (a session's first 8 hex digits), seq, kind, tool, what was
//! decided or done and why, and the arguments' digest prefix. `--json` prints one object per
//! receipt instead. This is a viewer: it decodes, it does not verify (`warren verify` does).
//!
//! `-f` follows: receiptd's tree has nothing a reader can block on (its files are snapshots taken
//! at open), so the wake-up comes from the kernel instead — an inotify watch on receiptd's data
//! directory fires when a commit writes its WAL — and each wake re-reads only the bytes past what
//! was printed, through the tree. Nothing polls (docs/decisions.md D5, "warren log -f").

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde_json::{Value, json};
use sha2::Digest;
use warren_9p::{Client, Fid, oflags};
use warren_daemon::Dirs;
use warren_daemon::escape::{escape, json_line};

/// One receipt, decoded from its DSSE envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub scope: String,
    pub seq: u64,
    pub kind: String,
    pub wall_ms: i64,
    pub counter: i64,
    pub body: Value,
    /// The entry hash (`specs/receipts.md` §1): lowercase hex SHA-256 of the entry bytes.
    pub hash: String,
}

impl Entry {
    /// Decodes one line of `<scope>/log`.
    pub fn parse(line: &[u8]) -> Result<Entry> {
        let envelope: Value = serde_json::from_slice(line).context("entry is not JSON")?;
        let payload = envelope["payload"]
            .as_str()
            .context("entry has no payload")?;
        let body_bytes = base64::engine::general_purpose::STANDARD
            .decode(payload)
            .context("payload is not base64")?;
        let body: Value = serde_json::from_slice(&body_bytes).context("body is not JSON")?;
        Ok(Entry {
            scope: body["scope"].as_str().unwrap_or_default().to_owned(),
            seq: body["seq"].as_u64().context("body has no seq")?,
            kind: body["kind"].as_str().unwrap_or_default().to_owned(),
            wall_ms: body["hlc"]["wall_ms"].as_i64().unwrap_or_default(),
            counter: body["hlc"]["counter"].as_i64().unwrap_or_default(),
            hash: hex::encode(sha2::Sha256::digest(line)),
            body,
        })
    }

    pub fn subject(&self) -> &Value {
        &self.body["subject"]
    }

    fn tool(&self) -> &str {
        self.subject()["tool"].as_str().unwrap_or("-")
    }

    /// What happened, in words: the verdict and its basis, the effect's status (a connection's
    /// outcome, address and bytes), why a call was withdrawn, receiptd's own event.
    fn what(&self) -> String {
        let s = self.subject();
        let text = |k: &str| s[k].as_str().unwrap_or("").to_owned();
        match self.kind.as_str() {
            "decision" => {
                let mut w = format!("{} ({})", text("verdict"), text("basis"));
                if let Some(by) = s["answered_by"].as_str() {
                    w.push_str(&format!(" answered by {by}"));
                }
                if let Some(p) = s["pending"].as_i64() {
                    w.push_str(&format!(" ask {p}"));
                }
                w
            }
            // netproxy's connection record: how it ended, where to, and the bytes each way.
            "effect" if s["outcome"].is_string() => {
                let mut w = format!(
                    "{} {}, {} bytes sent, {} received",
                    text("outcome"),
                    s["address"].as_str().unwrap_or("(nothing connected)"),
                    s["bytes_client_to_server"].as_u64().unwrap_or(0),
                    s["bytes_server_to_client"].as_u64().unwrap_or(0)
                );
                if let Some(reason) = s["reason"].as_str() {
                    w.push_str(&format!(": {reason}"));
                }
                w
            }
            "effect" | "query" => {
                let mut w = format!("ran: {}", text("status"));
                if let Some(seq) = s["decision"]["seq"].as_u64() {
                    w.push_str(&format!(" (decision #{seq})"));
                }
                w
            }
            "withdrawn" => format!("withdrawn: {}", text("why")),
            "accept" => format!(
                "accepted mcp:{}:{} {}",
                text("server"),
                text("tool"),
                text("digest")
            ),
            "remote" => {
                let mut w = format!(
                    "called {}:{} ({}): {}",
                    text("peer"),
                    text("tool"),
                    text("key"),
                    text("status")
                );
                if let Some(seq) = s["remote"]["decision"]["seq"].as_u64() {
                    w.push_str(&format!(" (the peer's decision #{seq})"));
                }
                w
            }
            "boot" => format!("receiptd {}", text("event")),
            _ => serde_json::to_string(s).unwrap_or_default(),
        }
    }

    /// The arguments' digest (`sha256:<hex>` or bare hex), shortened to 12 hex digits, as
    /// `  args <prefix>`; empty for a receipt with no digest.
    fn digest_prefix(&self) -> String {
        let d = &self.body["digests"];
        let full = d["args"]
            .as_str()
            .or_else(|| self.subject()["args_sha256"].as_str())
            .or_else(|| d["result"].as_str());
        match full {
            Some(v) => {
                let hex = v.strip_prefix("sha256:").unwrap_or(v);
                format!("  args {}", hex.chars().take(12).collect::<String>())
            }
            None => String::new(),
        }
    }

    /// The plain-words line, escaped whole (`warren_daemon::escape`): a tool name, basis or
    /// reason holds what a namespace wrote, and none of it may hide, reverse or forge a line.
    pub fn line(&self) -> String {
        let scope: String = self.scope.chars().take(8).collect();
        escape(&format!(
            "{}  {scope:<8}  #{:<5} {:<9} {:<12} {}{}",
            utc(self.wall_ms),
            self.seq,
            self.kind,
            self.tool(),
            self.what(),
            self.digest_prefix()
        ))
    }

    /// The `--json` object.
    pub fn json(&self) -> Value {
        let s = self.subject();
        json!({
            "time": utc(self.wall_ms),
            "wall_ms": self.wall_ms,
            "scope": self.scope,
            "seq": self.seq,
            "kind": self.kind,
            "tool": s["tool"],
            "verdict": s["verdict"],
            "basis": s["basis"],
            "status": s["status"],
            "appender": self.body["appender"],
            "digests": self.body["digests"],
            "subject": s,
            "hash": self.hash,
        })
    }
}

/// Unix ms as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A long-lived operator connection to receiptd.
struct Receipts {
    root: Fid,
    _client: Client,
}

impl Receipts {
    async fn connect(socket: &Path) -> Result<Receipts> {
        let client = Client::connect_unix(socket)
            .await
            .with_context(|| crate::none_answers("receiptd", socket))?;
        let root = client
            .attach("operator", "")
            .await
            .context("attach to receiptd")?;
        Ok(Receipts {
            root,
            _client: client,
        })
    }

    /// The scopes whose name starts with `filter` (every scope without one), sorted: the same
    /// rule `warren receipts export` takes a scope by.
    async fn scopes(&self, filter: Option<&str>) -> Result<Vec<String>> {
        Ok(warren_receiptd::client::scopes(&self.root, filter).await?)
    }

    /// The bytes of `<scope>/log` from `offset` (a fresh open is a fresh snapshot).
    async fn log_from(&self, scope: &str, offset: u64) -> Result<Vec<u8>> {
        let fid = self.root.walk(&[scope, "log"]).await?;
        fid.open(oflags::RDONLY).await?;
        Ok(fid.read_to_end(offset).await?)
    }
}

/// What has been printed: per scope, the bytes of its log consumed (whole lines only).
#[derive(Default)]
struct Cursor {
    consumed: BTreeMap<String, u64>,
}

impl Cursor {
    /// Reads every matching scope past what was consumed; returns the new entries in clock order.
    /// All or nothing: if any scope cannot be read (receiptd went away mid-way), nothing is
    /// consumed and the next call reads it all again — advancing the scopes already read would
    /// drop their entries with the failed batch (it did: `warren log -f` skipped receipts that
    /// landed just before a receiptd restart).
    async fn advance(&mut self, receipts: &Receipts, filter: Option<&str>) -> Result<Vec<Entry>> {
        let mut entries = Vec::new();
        let mut staged = Vec::new();
        for scope in receipts.scopes(filter).await? {
            let offset = self.consumed.get(&scope).copied().unwrap_or(0);
            let bytes = receipts
                .log_from(&scope, offset)
                .await
                .with_context(|| format!("{scope}/log"))?;
            // Only whole lines: a partial last line is read again next time.
            let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            for line in bytes[..whole]
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
            {
                entries.push(Entry::parse(line).with_context(|| format!("{scope}/log: an entry"))?);
            }
            staged.push((scope, offset + whole as u64));
        }
        self.consumed.extend(staged);
        entries.sort_by(|a, b| {
            (a.wall_ms, a.counter, &a.scope, a.seq).cmp(&(b.wall_ms, b.counter, &b.scope, b.seq))
        });
        Ok(entries)
    }
}

/// How many allowing decisions in `scope` no effect receipt names yet. toolfs queues effect
/// receipts off the call's path, so a caller that needs a session's record whole (the demo's
/// export) waits for this to reach 0 first. Only the decisions that answered a call count: an
/// operator's answer to an ask (`answered_by`) is receipted apart from the allow-once it lets the
/// waiting call spend, and the effect names the spend. (An allowed call that never ran, such as
/// one whose worker could not be built, never gets an effect: such a wait must be bounded.)
pub async fn effects_pending(socket: &Path, scope: &str) -> Result<usize> {
    let mut allowed = std::collections::BTreeSet::new();
    let mut effected = std::collections::BTreeSet::new();
    for e in entries(socket, scope).await? {
        match e.kind.as_str() {
            "decision"
                if e.subject()["verdict"] == "allow" && e.subject()["answered_by"].is_null() =>
            {
                allowed.insert(e.seq);
            }
            "effect" | "query" => {
                if let Some(seq) = e.subject()["decision"]["seq"].as_u64() {
                    effected.insert(seq);
                }
            }
            _ => {}
        }
    }
    Ok(allowed.difference(&effected).count())
}

/// Every receipt of `scope` so far, in its log's order (decoded, not verified).
pub async fn entries(socket: &Path, scope: &str) -> Result<Vec<Entry>> {
    let receipts = Receipts::connect(socket).await?;
    let bytes = receipts.log_from(scope, 0).await?;
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(Entry::parse)
        .collect()
}

fn print(entries: &[Entry], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for e in entries {
        if json {
            writeln!(out, "{}", json_line(&e.json()))?;
        } else {
            writeln!(out, "{}", e.line())?;
        }
    }
    out.flush()?;
    Ok(())
}

pub fn log(dirs: &Dirs, scope: Option<&str>, follow: bool, json: bool) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let socket = dirs.socket("receipts");
    if follow {
        return follow_log(dirs, &rt, &socket, scope, json);
    }
    let entries = rt.block_on(async {
        let receipts = Receipts::connect(&socket).await?;
        if let Some(f) = scope
            && receipts.scopes(Some(f)).await?.is_empty()
        {
            bail!("no scope starting with {f:?} in /receipts");
        }
        Cursor::default().advance(&receipts, scope).await
    })?;
    print(&entries, json)?;
    Ok(ExitCode::SUCCESS)
}

/// receiptd's data directory, as the supervisor lays it out.
fn receiptd_data(dirs: &Dirs) -> PathBuf {
    dirs.data.join("receiptd")
}

fn follow_log(
    dirs: &Dirs,
    rt: &tokio::runtime::Runtime,
    socket: &Path,
    scope: Option<&str>,
    json: bool,
) -> Result<ExitCode> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let data = receiptd_data(dirs);
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)?;
    // Watched before the first read, so a receipt landing in between still wakes us.
    inotify
        .add_watch(
            &data,
            AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
        )
        .with_context(|| {
            format!(
                "watch {} for new receipts (following needs read access to receiptd's data \
                 directory, which in this version only root has)",
                data.display()
            )
        })?;
    let mut cursor = Cursor::default();
    let mut receipts = None;
    loop {
        // (Re)connect when needed: a restarted receiptd is a new connection on the same socket.
        let fresh = receipts.is_none();
        let batch = rt.block_on(async {
            if receipts.is_none() {
                receipts = Some(Receipts::connect(socket).await?);
            }
            let r = receipts.as_ref().expect("connected above");
            cursor.advance(r, scope).await
        });
        match batch {
            Ok(entries) => print(&entries, json)?,
            // The connection died (receiptd restarted): try a fresh one at once.
            Err(_) if !fresh => {
                receipts = None;
                continue;
            }
            Err(e) => {
                // receiptd is not back yet (its restart writes a boot receipt, which wakes us),
                // or it answers with an error: either way, wait for its next commit.
                receipts = None;
                eprintln!("warren log: {e:#}; waiting for receiptd");
            }
        }
        // Block until receiptd's database changes; only its files' changes count.
        loop {
            let events = inotify.read_events()?;
            if events.iter().any(|ev| {
                ev.name
                    .as_ref()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(warren_receiptd::store::DB_FILE))
            }) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(body: Value) -> Vec<u8> {
        let payload =
            base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&body).unwrap());
        serde_json::to_vec(&json!({"payload": payload, "payloadType": "x", "signatures": []}))
            .unwrap()
    }

    #[test]
    fn a_decision_reads_as_words() {
        let line = envelope(json!({
            "scope": "0123456789abcdef0123456789abcdef", "seq": 4, "kind": "decision",
            "hlc": {"wall_ms": 1_764_796_800_123_i64, "counter": 0, "node": "n"},
            "subject": {"tool": "shell", "verdict": "deny", "basis": "rule:3"},
            "digests": {"args": "sha256:9f86d081884c7d659a2feaa0c55ad015"},
        }));
        let e = Entry::parse(&line).unwrap();
        let text = e.line();
        assert!(
            text.starts_with("2025-12-03T21:20:00.123Z  01234567  #4 "),
            "{text}"
        );
        for part in ["decision", "shell", "deny (rule:3)", "args 9f86d081884c"] {
            assert!(text.contains(part), "{part} missing: {text}");
        }
        assert_eq!(e.json()["verdict"], "deny");
        assert_eq!(e.hash.len(), 64);
    }

    /// A receipt's words came from a namespace: ESC sequences, a newline and tab, a bidi
    /// override in the tool name and the reason. The line is one printable line, and `--json`
    /// holds the same values with nothing hidden.
    #[test]
    fn hostile_words_in_a_receipt_cannot_forge_or_hide_a_line() {
        let line = envelope(json!({
            "scope": "0123456789abcdef0123456789abcdef", "seq": 5, "kind": "withdrawn",
            "hlc": {"wall_ms": 1_764_796_800_123_i64, "counter": 0, "node": "n"},
            "subject": {"tool": "sh\u{202E}ll", "why": "gone\x1b[2K\r\n2025-12-03T21:20:00.123Z  01234567  #6 decision  shell  allow (rule:1)\tx"},
        }));
        let e = Entry::parse(&line).unwrap();
        let text = e.line();
        assert!(
            !text.chars().any(warren_daemon::escape::misleads),
            "{text:?}"
        );
        assert!(text.contains("sh\\u{202E}ll"), "{text}");
        let j = json_line(&e.json());
        assert!(!j.chars().any(warren_daemon::escape::misleads), "{j}");
        assert_eq!(serde_json::from_str::<Value>(&j).unwrap(), e.json());
    }

    #[test]
    fn a_line_that_is_not_a_receipt_is_an_error() {
        assert!(Entry::parse(b"not json").is_err());
        assert!(Entry::parse(br#"{"payload":"!!"}"#).is_err());
    }
}
