//! Reading `/receipts` through receiptd (the operator's `warren log` and `warren receipts`). The
//! append client is `warren_proto::receipts::Appender`.

use std::path::Path;

use warren_9p::{Client, Fid, oflags};

async fn read_file(client: &Client, path: &str) -> warren_9p::Result<Vec<u8>> {
    let root = client.attach("receipts", "").await?;
    let fid = root.walk_path(path).await?;
    fid.open(oflags::RDONLY).await?;
    fid.read_to_end(0).await
}

/// Names in `/receipts` that are not scopes.
const NOT_SCOPES: &[&str] = &crate::receipt::RESERVED_NAMES;

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
