//! nsd's export socket, `<runtime>/nsd-export.ctl`: exportfs has an authenticated peer's tree
//! made here, never choosing what it holds (`warren_proto::export::control`).
//!
//! nsd reads the peers file itself and builds the `/tool` grant from the peer's entry exactly as
//! for a namespace's `mount tool` (a socketpair handed to toolfs's control socket with the
//! record and the roots' fds), with the session the peer's key names, so the gate decides and
//! receiptd keeps every remote call as it does a local namespace's.
//!
//! The tree `asks` (a peer whose entry says `asks:remote`) is a connection handed to the gate's
//! control socket as a capped channel: the peer's session's asks only, `allow once` up to the
//! write tier or `deny`, receipted as answered by `peer:<fingerprint>`.
//!
//! The tree `receipts` (a peer with a `tool` grant) is a connection handed to receiptd's control
//! socket as a read-only view of the peer's session alone (its `log`, `head`, proofs, and the
//! key registry): what the peer's host needs to check this host's signed checkpoint against the
//! `remote` receipts it keeps of its calls here.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use tokio::net::UnixListener;
use warren_daemon::Dirs;
use warren_daemon::accept::{next_blocking_peer, refusal};
use warren_daemon::identity::Role;
use warren_daemon::peer::PeerCred;
use warren_proto::export::keys::PublicKey;
use warren_proto::export::peers::{ASKS_TREE, Peer, Peers, RECEIPTS_TREE};
use warren_proto::export::{ExportRequest, Made, REQUEST_VERSION, answer};
use warren_proto::gate::{CHANNEL_CAP_MAX, ControlRecord, RECORD_VERSION, RecordKind};
use warren_proto::lineage::Lineage;
use warren_proto::toolfs::{GrantRecord, RootGrant, ToolGrant};

use crate::mount_server::{member, tool_connection};
use warren_ns::confine::guard::Guard;
use warren_ns::spec::Limits;

/// Who may ask: exportfs's uid or root.
fn exportfs_or_root(cred: &PeerCred) -> Option<String> {
    (cred.uid != 0 && cred.uid != Role::Exportfs.uid())
        .then(|| format!("uid {} is neither exportfs nor root", cred.uid))
}

/// Serves the export socket for ever, each request on a thread of its own.
pub async fn accept_loop(listener: UnixListener, dirs: Dirs, peers: PathBuf) {
    loop {
        let sock = next_blocking_peer(&listener, "export socket", |s| {
            refusal(s.as_fd(), exportfs_or_root)
        })
        .await;
        let (dirs, peers) = (dirs.clone(), peers.clone());
        std::thread::spawn(move || {
            let result = serve(&sock, &dirs, &peers);
            if let Err(why) = &result {
                tracing::warn!("export socket: refused: {why}");
            }
            let _ = answer(&sock, result);
        });
    }
}

fn serve(sock: &UnixStream, dirs: &Dirs, peers: &std::path::Path) -> Result<Made, String> {
    let (record, fds) = warren_daemon::handoff::recv(sock).map_err(|e| e.to_string())?;
    if !fds.is_empty() {
        return Err("an export request carries no fds".into());
    }
    let req: ExportRequest =
        serde_json::from_slice(&record).map_err(|e| format!("export request: {e}"))?;
    if req.version != REQUEST_VERSION {
        return Err(format!("export request version {}", req.version));
    }
    let peers = Peers::load(peers).map_err(|e| e.to_string())?;
    let peer = peers
        .by_name(&req.peer)
        .ok_or_else(|| format!("no peer {} in the peers file", req.peer))?;
    let key = PublicKey::parse(&req.key)?;
    if key != peer.key {
        return Err(format!(
            "peer {} authenticated with {}, but its entry names {}",
            peer.name,
            key.fingerprint(),
            peer.key.fingerprint()
        ));
    }
    peer.grants(&req.tree)?;
    if req.tree == ASKS_TREE {
        return asks_channel(dirs, peer).map(Made::Connection);
    }
    if req.tree == RECEIPTS_TREE {
        return receipts_view(dirs, peer).map(Made::Connection);
    }
    let guard = Guard::new(dirs).map_err(|e| e.to_string())?;
    if let Some(path) = peer.dir(&req.tree) {
        // A directory tree: its handle, opened and checked here; exportfs serves it read-only.
        let what = format!("peer {} tree {}", peer.name, req.tree);
        let dir = warren_ns::handles::open_dir(path).map_err(|e| format!("{what} {path}: {e}"))?;
        guard
            .check_as(&what, dir.as_fd(), path)
            .map_err(|e| e.to_string())?;
        tracing::info!(peer = %peer.name, tree = %req.tree, "a peer's directory");
        return Ok(Made::Directory(dir));
    }
    let mut tools = Vec::new();
    let mut roots = Vec::new();
    for name in &peer.tools {
        let mut granted = Vec::new();
        for (_, path) in peer.roots.iter().filter(|(t, _)| t == name) {
            let what = format!("peer {} tool {name} root", peer.name);
            let dir =
                warren_ns::handles::open_dir(path).map_err(|e| format!("{what} {path}: {e}"))?;
            guard
                .check_as(&what, dir.as_fd(), path)
                .map_err(|e| e.to_string())?;
            roots.push(dir);
            granted.push(RootGrant {
                path: path.clone(),
                writable: false,
            });
        }
        tools.push(ToolGrant {
            name: name.clone(),
            roots: granted,
            network: false,
        });
    }
    let session = peer.key.session();
    let namespace = format!("peer:{}", peer.name);
    let command = vec!["exportfs".to_owned(), peer.key.fingerprint()];
    let worker = Role::Worker.uid();
    let record = GrantRecord {
        version: 1,
        lineage: Some(Lineage(vec![member(
            &session,
            &namespace,
            &command,
            &Limits::default(),
        )])),
        session,
        namespace,
        tools,
        worker_uid: worker,
        worker_gid: worker,
        server: None,
    };
    tracing::info!(peer = %peer.name, key = %peer.key.fingerprint(), "a peer's /tool");
    tool_connection(dirs, &record, &roots)
        .map(Made::Connection)
        .map_err(|e| e.to_string())
}

/// The gate record of a peer's asks channel: that peer's own session only, capped at the write
/// tier, named by its key.
fn asks_record(peer: &Peer) -> ControlRecord {
    ControlRecord {
        version: RECORD_VERSION,
        kind: RecordKind::Channel,
        name: Some(peer.asks_channel()),
        sessions: vec![peer.key.session()],
        cap: Some(CHANNEL_CAP_MAX),
        ..Default::default()
    }
}

/// The peer's asks, as the gate serves them on a channel capped at the write tier.
fn asks_channel(dirs: &Dirs, peer: &Peer) -> Result<std::os::fd::OwnedFd, String> {
    let record = asks_record(peer);
    let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    warren_proto::gate::hand_over(&dirs.control("gate"), &record, &theirs)
        .map_err(|e| format!("hand the peer's asks to the gate: {e}"))?;
    tracing::info!(peer = %peer.name, key = %peer.key.fingerprint(), "a peer's asks");
    Ok(ours.into())
}

/// The peer's own session's receipts, as receiptd serves a read-only view of one scope.
fn receipts_view(dirs: &Dirs, peer: &Peer) -> Result<std::os::fd::OwnedFd, String> {
    let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    warren_proto::receipts::hand_over(&dirs.control("receipts"), &peer.key.session(), &theirs)
        .map_err(|e| format!("hand the peer's receipts to receiptd: {e}"))?;
    tracing::info!(peer = %peer.name, key = %peer.key.fingerprint(), "a peer's receipts");
    Ok(ours.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_gate::scope::Scope;

    /// Two peers' channels: each sees its own session's asks, never the other's or a local
    /// namespace's, and neither allows above the write tier.
    #[test]
    fn a_peers_asks_channel_sees_its_own_session_only() {
        let dir = tempfile::tempdir().unwrap();
        let key = |n: &str| {
            warren_proto::export::keys::HostKey::create(&dir.path().join(n))
                .unwrap()
                .public()
        };
        let peers = Peers::parse(&format!(
            "a {} asks:remote\nc {} asks:remote\n",
            key("a"),
            key("c")
        ))
        .unwrap();
        let (a, c) = (peers.by_name("a").unwrap(), peers.by_name("c").unwrap());
        let scope = |p| warren_gate::control::scope_of(&asks_record(p)).unwrap();
        let (sa, sc) = (scope(a), scope(c));
        assert!(sa.sees_session(&a.key.session()) && !sa.sees_session(&c.key.session()));
        assert!(sc.sees_session(&c.key.session()) && !sc.sees_session(&a.key.session()));
        assert!(!sa.sees_session(&"1".repeat(32)), "a local session");
        assert_eq!(sa.label(), format!("peer:{}", a.key.fingerprint()));
        assert!(matches!(sa, Scope::Channel { .. }));
        assert!(
            sa.may_allow("write", "default:write").is_ok()
                && sa.may_allow("exec", "default:exec").is_err()
        );
    }
}
