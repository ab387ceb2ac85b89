//! `warren keys init|show` (this host's identity for exportfs) and `warren export` (serve this
//! host's trees to its peers): docs/distribution.md.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_daemon::identity::Role;
use warren_proto::export::keys::{HostKey, host_key_path};

/// Makes this host's Ed25519 key in the secrets dir (root's, 0600), never over one that exists.
pub fn init(dirs: &Dirs) -> Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!("warren keys init makes a root-owned key in the secrets dir: run it as root");
    }
    let path = host_key_path(&dirs.secrets);
    if let Ok(key) = HostKey::load(&path) {
        bail!(
            "{} already holds this host's key {} ({}): remove it first to make a new one \
             (docs/distribution.md, \"Rotation\")",
            path.display(),
            key.public(),
            key.public().fingerprint()
        );
    }
    let receiptd = Role::Receiptd.uid();
    warren_daemon::dirs::make_dir(&dirs.secrets, receiptd, receiptd, 0o700)
        .with_context(|| format!("prepare {}", dirs.secrets.display()))?;
    let key = HostKey::create(&path)?;
    println!("{}", key.public());
    println!("{}", key.public().fingerprint());
    Ok(ExitCode::SUCCESS)
}

/// Prints this host's public key and its fingerprint: what a peer writes in its peers file.
pub fn show(dirs: &Dirs) -> Result<ExitCode> {
    let key = HostKey::load(&host_key_path(&dirs.secrets))?;
    println!("{}", key.public());
    println!("{}", key.public().fingerprint());
    Ok(ExitCode::SUCCESS)
}

/// Runs `warren-exportfs` in the foreground (it drops to its own uid once it holds the key
/// and its listening socket).
pub fn export(dirs: &Dirs, listen: &str, auth_deadline: Option<&str>) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let binary = warren_supervisor::libexec_dir()?.join("warren-exportfs");
    let mut cmd = std::process::Command::new(&binary);
    // The directories this command was given (options or environment), as `up` passes them.
    cmd.env("WARREN_RUNTIME_DIR", &dirs.runtime)
        .env("WARREN_DATA_DIR", &dirs.data)
        .env("WARREN_SECRETS_DIR", &dirs.secrets)
        .arg("--listen")
        .arg(listen);
    if let Some(d) = auth_deadline {
        cmd.arg("--auth-deadline").arg(d);
    }
    let e = cmd.exec();
    bail!("run {}: {e}", binary.display())
}
