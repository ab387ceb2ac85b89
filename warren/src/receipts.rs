//! `warren receipts export|keys` and `warren verify`: the receipt chain out of receiptd, and
//! checked by anyone with nothing but the export and the key registry.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use warren_daemon::Dirs;

/// Writes a scope's chain and its covering checkpoint to standard output, read through
/// receiptd's tree (so an operator who cannot read the database can export). `scope` is the
/// scope or a unique prefix of it (what `warren log` prints); the export is checkpointed now.
pub fn export(dirs: &Dirs, scope: &str) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = std::io::stdout().lock();
    let (scope, n) = rt
        .block_on(warren_receiptd::client::export(
            &dirs.socket("receipts"),
            scope,
            &mut out,
        ))
        .with_context(|| format!("export scope {scope}"))?;
    eprintln!("warren: exported {n} receipts of scope {scope}");
    Ok(ExitCode::SUCCESS)
}

/// Writes the public key registry (the file `warren verify --keys` takes).
pub fn keys(dirs: &Dirs) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let registry = rt
        .block_on(warren_receiptd::client::keys(&dirs.socket("receipts")))
        .context("read /receipts/keys")?;
    std::io::stdout().write_all(&registry)?;
    Ok(ExitCode::SUCCESS)
}

/// Exit 0 verified, 1 invalid, 2 usage, 5 unknown key, 6 key used after its retirement.
/// What `warren verify` requires beyond a valid export (files named on the command line).
pub struct Require<'a> {
    pub head: Option<&'a Path>,
    pub size: Option<u64>,
    pub proof: Option<&'a Path>,
    /// `SEQ:HASH`: the entry another host's `remote` receipt names must be under the checkpoint.
    pub entry: Option<&'a str>,
}

pub fn verify(dirs: &Dirs, file: &Path, keys: Option<&Path>, require: Require) -> Result<ExitCode> {
    use warren_receiptd::verify::EXIT_USAGE;
    let usage = |msg: String| {
        eprintln!("warren verify: {msg}");
        Ok(ExitCode::from(EXIT_USAGE as u8))
    };
    let export = match std::fs::read(file) {
        Ok(e) => e,
        Err(e) => return usage(format!("{}: {e}", file.display())),
    };
    let registry = match keys {
        Some(path) => match std::fs::read(path) {
            Ok(r) => r,
            Err(e) => return usage(format!("{}: {e}", path.display())),
        },
        // Without --keys: the registry of the receiptd that is up.
        None => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            match rt.block_on(warren_receiptd::client::keys(&dirs.socket("receipts"))) {
                Ok(r) => r,
                Err(e) => return usage(format!("no --keys given and no receiptd to ask: {e:#}")),
            }
        }
    };
    let read = |path: Option<&Path>, flag: &str| match path {
        None => Ok(None),
        Some(p) => std::fs::read_to_string(p)
            .map(Some)
            .map_err(|e| format!("{flag} {}: {e}", p.display())),
    };
    let (head, proof) = match (read(require.head, "--head"), read(require.proof, "--proof")) {
        (Ok(h), Ok(p)) => (h, p),
        (Err(e), _) | (_, Err(e)) => return usage(e),
    };
    let entry = match require.entry.map(warren_receiptd::verify::parse_entry) {
        None => None,
        Some(Ok(e)) => Some(e),
        Some(Err(e)) => return usage(format!("--entry: {e}")),
    };
    let require = warren_receiptd::Require {
        head: head.as_deref(),
        size: require.size,
        proof: proof.as_deref(),
        entry,
    };
    let outcome = warren_receiptd::verify_with(&export, &registry, require);
    eprintln!("{}", outcome.message);
    Ok(ExitCode::from(u8::try_from(outcome.code).unwrap_or(1)))
}
