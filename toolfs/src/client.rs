//! For clients of a `/tool` tree (the `warren call` front door, tests, benchmarks): one whole
//! call the way every client should make it — one open, the arguments written, the result read
//! to its end from where the writes left off, the fid clunked.

use warren_9p::{Fid, Result, oflags};

/// Runs one call of `tool` with `args` (JSON text) on the tree attached at `root`; returns the
/// envelope's bytes (canonical JSON: parse them with [`crate::Envelope::parse`]).
pub async fn call_bytes(root: &Fid, tool: &str, args: &[u8]) -> Result<Vec<u8>> {
    let fid = root.walk(&[tool, "call"]).await?;
    fid.open(oflags::RDWR).await?;
    fid.write_all(0, args).await?;
    let result = fid.read_to_end(args.len() as u64).await?;
    fid.clunk().await?;
    Ok(result)
}
