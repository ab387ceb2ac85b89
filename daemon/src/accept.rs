//! The accept loop of every daemon's trusted sockets (control, worker, run, operator): accept,
//! refuse a peer from another pid namespace or with the wrong credentials, hand the rest on.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use crate::peer::{PeerCred, peer_cred, peer_in_own_pidns};

/// Why the peer on `fd` is refused: one in another pid namespace always (its pid and uid mean
/// nothing here), one without credentials too; otherwise `vet` judges its credentials (None: it
/// may in).
pub fn refusal(
    fd: BorrowedFd<'_>,
    vet: impl FnOnce(&PeerCred) -> Option<String>,
) -> Option<String> {
    match peer_in_own_pidns(fd) {
        Ok(true) => {}
        Ok(false) => return Some("peer is in another pid namespace".into()),
        Err(e) => return Some(format!("cannot read the peer's pid namespace: {e}")),
    }
    match peer_cred(fd) {
        Ok(cred) => vet(&cred),
        Err(e) => Some(format!("no peer credentials: {e}")),
    }
}

/// The control sockets' rule for [`refusal`]: root only.
pub fn root_only(cred: &PeerCred) -> Option<String> {
    (cred.uid != 0).then(|| format!("uid {} is not root", cred.uid))
}

/// The next peer on `listener` that `refused` lets in (None). A refused peer is logged as
/// `<socket>: refused a peer: <why>` and dropped; a failed accept (a full fd table, …) is logged
/// and retried after a pause, so that it cannot spin.
pub async fn next_peer(
    listener: &UnixListener,
    socket: &str,
    refused: impl Fn(&UnixStream) -> Option<String>,
) -> UnixStream {
    loop {
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(e) => {
                tracing::warn!("{socket}: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match refused(&sock) {
            Some(why) => tracing::warn!("{socket}: refused a peer: {why}"),
            None => return sock,
        }
    }
}

/// An accepted stream made blocking, for a connection served on a thread of its own.
pub fn into_blocking(sock: UnixStream) -> io::Result<std::os::unix::net::UnixStream> {
    let sock = sock.into_std()?;
    sock.set_nonblocking(false)?;
    Ok(sock)
}

/// [`next_peer`], made blocking ([`into_blocking`]) for a connection served on a thread of its
/// own; a stream that cannot be is logged as `<socket>: <why>` and dropped.
pub async fn next_blocking_peer(
    listener: &UnixListener,
    socket: &str,
    refused: impl Fn(&UnixStream) -> Option<String>,
) -> std::os::unix::net::UnixStream {
    loop {
        match into_blocking(next_peer(listener, socket, &refused).await) {
            Ok(sock) => return sock,
            Err(e) => tracing::warn!("{socket}: {e}"),
        }
    }
}
