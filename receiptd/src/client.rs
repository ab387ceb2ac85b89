//! A client of `/receipts/append` for trusted daemons (the gate, toolfs) and tools: one long-lived
//! connection, one open of `append`, write a request and read its reply, repeated.

use std::path::Path;

use serde_json::Value;
use warren_9p::{Client, Errno, Fid, oflags};

/// An acknowledged append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub seq: u64,
    pub hash: String,
}

/// Why an append was not acknowledged: the errno, and receiptd's reason when it gave one.
#[derive(Clone, Debug, thiserror::Error)]
#[error("append refused ({errno}): {message}")]
pub struct Refusal {
    pub errno: Errno,
    /// `{"error":{"code":..,"message":..}}` as receiptd wrote it, or the transport error.
    pub message: String,
}

pub struct Appender {
    _client: Client,
    fid: Fid,
}

impl Appender {
    /// Connects to receiptd's socket and opens `append`.
    pub async fn connect(socket: &Path) -> std::io::Result<Appender> {
        let client = Client::connect_unix(socket).await?;
        Self::on(client).await.map_err(std::io::Error::from)
    }

    /// Opens `append` on an attached connection.
    pub async fn on(client: Client) -> warren_9p::Result<Appender> {
        let root = client.attach("receipts", "").await?;
        let fid = root.walk(&["append"]).await?;
        fid.open(oflags::RDWR).await?;
        Ok(Appender {
            _client: client,
            fid,
        })
    }

    /// Appends one request (JSON bytes); returns its seq and hash once receiptd acknowledged it
    /// (after the WAL commit, or after the covering fdatasync under `--durable=fsync`).
    pub async fn append(&self, request: &[u8]) -> Result<Receipt, Refusal> {
        receipt(&self.call(request).await?)
    }

    /// Appends requests as one batch (`specs/receipts.md` §7): all of them or, refused, none.
    /// One receipt per request, in order.
    pub async fn append_batch(&self, requests: &[Vec<u8>]) -> Result<Vec<Receipt>, Refusal> {
        let mut batch = Vec::with_capacity(requests.iter().map(|r| r.len() + 1).sum::<usize>() + 1);
        batch.push(b'[');
        for (i, r) in requests.iter().enumerate() {
            if i > 0 {
                batch.push(b',');
            }
            batch.extend_from_slice(r);
        }
        batch.push(b']');
        let reply = self.call(&batch).await?;
        match reply {
            Value::Array(acks) if acks.len() == requests.len() => {
                acks.iter().map(receipt).collect()
            }
            other => Err(unexpected(&other)),
        }
    }

    /// One write and its reply, parsed; a refusal carries receiptd's reason.
    async fn call(&self, request: &[u8]) -> Result<Value, Refusal> {
        // One round trip: the write and the read are pipelined on the fid.
        let reply = self
            .fid
            .call(request)
            .await
            .map_err(|(errno, said)| Refusal {
                errno,
                message: if said.is_empty() {
                    errno.to_string()
                } else {
                    String::from_utf8_lossy(&said).into_owned()
                },
            })?;
        serde_json::from_slice(&reply).map_err(|e| Refusal {
            errno: Errno::EPROTO,
            message: format!("reply is not JSON: {e}"),
        })
    }
}

fn receipt(ack: &Value) -> Result<Receipt, Refusal> {
    match (ack["seq"].as_u64(), ack["hash"].as_str()) {
        (Some(seq), Some(hash)) => Ok(Receipt {
            seq,
            hash: hash.to_owned(),
        }),
        _ => Err(unexpected(ack)),
    }
}

fn unexpected(reply: &Value) -> Refusal {
    Refusal {
        errno: Errno::EPROTO,
        message: format!("unexpected reply {reply}"),
    }
}

async fn read_file(client: &Client, path: &str) -> warren_9p::Result<Vec<u8>> {
    let root = client.attach("receipts", "").await?;
    let fid = root.walk_path(path).await?;
    fid.open(oflags::RDONLY).await?;
    fid.read_to_end(0).await
}

/// Names in `/receipts` that are not scopes.
const NOT_SCOPES: &[&str] = &["append", "keys", "ctl"];

/// The scopes under `root` (an attach of `/receipts`) whose name starts with `prefix` (every
/// scope without one), sorted. The one rule by which `warren log` and `warren receipts export`
/// take a scope: its full name or any prefix of it (`warren log` prints the first 8 digits).
pub async fn scopes(root: &Fid, prefix: Option<&str>) -> warren_9p::Result<Vec<String>> {
    let dir = root.walk(&[]).await?;
    dir.open(oflags::RDONLY).await?;
    let mut names: Vec<String> = dir
        .readdir_all()
        .await?
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != "." && n != ".." && !NOT_SCOPES.contains(&n.as_str()))
        .filter(|n| prefix.is_none_or(|p| n.starts_with(p)))
        .collect();
    names.sort();
    Ok(names)
}

/// The one scope `prefix` names; an error that says why when it names none or several.
pub async fn resolve_scope(root: &Fid, prefix: &str) -> anyhow::Result<String> {
    anyhow::ensure!(!prefix.is_empty(), "an empty scope names nothing");
    let mut found = scopes(root, Some(prefix)).await?;
    match found.len() {
        0 => anyhow::bail!("no scope starting with {prefix:?} in /receipts"),
        1 => Ok(found.remove(0)),
        n => anyhow::bail!(
            "{n} scopes start with {prefix:?}: {}; give more of the scope",
            found.join(", ")
        ),
    }
}

/// Asks receiptd to checkpoint every scope with entries not yet covered, now (`ctl`
/// `checkpoint`, the operator's).
pub async fn request_checkpoint(root: &Fid) -> anyhow::Result<()> {
    let ctl = root.walk(&["ctl"]).await?;
    ctl.open(oflags::RDWR).await?;
    ctl.write_all(0, b"checkpoint").await?;
    Ok(())
}

/// Writes the export of the scope `prefix` names (its full name or a unique prefix; the format
/// of `specs/receipts.md` §6) read through receiptd's tree: the entries up to the scope's head,
/// then the head checkpoint, which covers them all. A checkpoint is requested first, so the
/// export covers every entry appended so far (an operator need not wait for the periodic one).
/// For an operator who cannot read the database file. Returns the scope and the entry count.
pub async fn export(
    socket: &Path,
    prefix: &str,
    out: &mut impl std::io::Write,
) -> anyhow::Result<(String, u64)> {
    let client = Client::connect_unix(socket).await?;
    let root = client.attach("receipts", "").await?;
    let scope = resolve_scope(&root, prefix).await?;
    request_checkpoint(&root)
        .await
        .map_err(|e| anyhow::anyhow!("requesting a checkpoint of {scope} (ctl): {e:#}"))?;
    let head = read_file(&client, &format!("{scope}/head"))
        .await
        .map_err(|e| anyhow::anyhow!("{scope}/head: {e}"))?;
    let head = String::from_utf8(head)?;
    if head.is_empty() {
        anyhow::bail!("scope {scope} has no checkpoint after one was requested");
    }
    let size = crate::note::SignedNote::parse(&head)
        .map_err(|e| anyhow::anyhow!("{scope}/head: {e}"))?
        .checkpoint
        .size;
    let log = read_file(&client, &format!("{scope}/log"))
        .await
        .map_err(|e| anyhow::anyhow!("{scope}/log: {e}"))?;
    let lines: Vec<&[u8]> = log
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .take(size as usize)
        .collect();
    anyhow::ensure!(
        lines.len() as u64 == size,
        "{scope}/log has {} entries, its head covers {size}",
        lines.len()
    );
    for line in lines {
        out.write_all(line)?;
        out.write_all(b"\n")?;
    }
    out.write_all(&warren_jcs::value_to_vec(
        &serde_json::json!({"checkpoint": head}),
    )?)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok((scope, size))
}

/// The key registry, read from `/receipts/keys`.
pub async fn keys(socket: &Path) -> anyhow::Result<Vec<u8>> {
    let client = Client::connect_unix(socket).await?;
    read_file(&client, "keys")
        .await
        .map_err(|e| anyhow::anyhow!("keys: {e}"))
}
