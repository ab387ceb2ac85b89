//! The daemon: opens the log, writes the boot receipt, serves `/receipts` on the operator socket
//! (peers' roles from SO_PEERCRED) and one-scope views handed over on the control socket
//! (`crate::control`), checkpoints on a timer, and checkpoints again at shutdown.

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};

use crate::access::Role;
use crate::log::{Log, LogConfig};
use crate::tree::{ReceiptsTree, Shared};

pub struct DaemonConfig {
    pub log: LogConfig,
    pub socket: PathBuf,
    /// The control socket (`receipts.ctl`), where root hands over read-only views of one scope;
    /// None: not served.
    pub control: Option<PathBuf>,
    /// The gate's, toolfs's and mcpfs's uids.
    pub daemons: crate::access::DaemonUids,
}

/// How often the checkpoint timer looks for scopes that are due.
const CHECKPOINT_TICK: Duration = Duration::from_millis(100);

/// Runs until SIGTERM or SIGINT on a current-thread runtime (plus the fsync thread).
pub fn run(cfg: DaemonConfig) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(serve(cfg))
}

async fn serve(cfg: DaemonConfig) -> anyhow::Result<()> {
    let mut log = Log::open(cfg.log)?;
    match log.signer_status() {
        Ok(keyid) => tracing::info!(keyid, "signing key in force"),
        Err(e) => tracing::error!(reason = e, "no usable signer: every append will be refused"),
    }
    if log.signer_status().is_ok() {
        log.append_boot()
            .map_err(|e| anyhow::anyhow!("boot receipt: {e}"))?;
    }
    let shared = Arc::new(Shared::new(log));

    let listener = warren_daemon::operator::listen(&cfg.socket)?;
    let policy = warren_daemon::operator::OperatorPolicy::from_host();
    tracing::info!(socket = %cfg.socket.display(), "serving /receipts");

    let ticker = tokio::spawn(checkpoint_timer(Arc::clone(&shared)));
    let control = match &cfg.control {
        Some(path) => {
            let listener = warren_daemon::operator::listen(path)?;
            // A socket the supervisor bound is already 0600 and root's; one we bound ourselves
            // is made 0600 here (root peers only reach it anyway: `crate::control`).
            if std::fs::metadata(path)?.permissions().mode() & 0o777 != 0o600 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            }
            Some(tokio::spawn(crate::control::serve_control(
                Arc::clone(&shared),
                listener,
            )))
        }
        None => None,
    };
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let daemons = cfg.daemons;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
                };
                let role = match peer_role(&stream, &policy, &daemons) {
                    Ok(role) => role,
                    Err(why) => { tracing::warn!(reason = %why, "refused a peer"); continue; }
                };
                let tree = Arc::new(ReceiptsTree::new(Arc::clone(&shared), role));
                tokio::spawn(async move {
                    if let Err(e) = warren_9p::serve(tree, stream, warren_9p::Limits::default()).await {
                        tracing::debug!(error = %e, ?role, "connection ended");
                    }
                });
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    ticker.abort();
    if let Some(control) = control {
        control.abort();
    }
    shared.log().shutdown();
    tracing::info!("stopped after the final checkpoint");
    Ok(())
}

/// Every tick: the scopes due a checkpoint (100 uncovered rows or 5 s) are computed, their
/// entries fdatasynced by the fsync thread, then the checkpoints signed.
async fn checkpoint_timer(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(CHECKPOINT_TICK);
    loop {
        tick.tick().await;
        let (pending, syncer) = {
            let mut log = shared.log();
            (log.due_checkpoints(false), Arc::clone(log.syncer()))
        };
        let Some(generation) = pending.first().map(|p| p.generation) else {
            continue;
        };
        if let Err(e) = syncer.wait(generation).await {
            tracing::error!(error = %e, "checkpoint not signed: its entries are not on disk");
            continue;
        }
        if let Err(e) = shared.log().sign_checkpoints(pending) {
            tracing::error!(error = %e, "checkpoint failed");
        }
    }
}

/// The role of a connection's peer, from its credentials: the gate's or toolfs's uid (in our pid
/// namespace), else an operator as `warren_daemon::operator` defines one; anyone else is refused.
fn peer_role(
    stream: &UnixStream,
    policy: &warren_daemon::operator::OperatorPolicy,
    daemons: &crate::access::DaemonUids,
) -> Result<Role, String> {
    let cred = warren_daemon::peer::peer_cred(stream.as_fd())
        .map_err(|e| format!("no peer credentials: {e}"))?;
    match Role::from_uid(cred.uid, daemons) {
        role @ (Role::Gate | Role::Toolfs | Role::Mcpfs | Role::Llmfs | Role::Netproxy) => {
            match warren_daemon::peer::peer_in_own_pidns(stream.as_fd()) {
                Ok(true) => Ok(role),
                Ok(false) => Err(format!("uid {} is in another pid namespace", cred.uid)),
                Err(e) => Err(format!("cannot read the peer's pid namespace: {e}")),
            }
        }
        role => policy.refusal(stream).map_or(Ok(role), Err),
    }
}
