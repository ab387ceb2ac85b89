//! The control socket, `<runtime>/receipts.ctl` (root peers in our pid namespace only): a trusted
//! peer (nsd) hands over one end of a connection with a record naming one scope, and receiptd
//! serves that connection a read-only view of that scope (`crate::tree`, "view"). This is how a
//! peer host reads its own session's receipts over exportfs and nothing else: the scope is
//! chosen by nsd from the key the peer proved, never by the peer.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tokio::net::UnixListener;
use warren_daemon::accept::{next_peer, refusal, root_only};
pub use warren_proto::receipts::{VIEW_VERSION, ViewRecord, hand_over};

use crate::tree::{ReceiptsTree, Shared};

/// Serves the control socket for ever.
pub async fn serve_control(shared: Arc<Shared>, listener: UnixListener) {
    loop {
        let sock = next_peer(&listener, "control socket", |s| {
            refusal(s.as_fd(), root_only)
        })
        .await;
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let result = match warren_daemon::handoff::recv_async(&sock).await {
                Ok((record, fds)) => accept(shared, &record, fds),
                Err(e) => Err(format!("control connection: {e}")),
            };
            if let Err(msg) = &result {
                tracing::warn!("view refused: {msg}");
            }
            let line = warren_proto::control::reply_line(&result);
            let _ = warren_daemon::handoff::send_async(&sock, line.as_bytes(), &[]).await;
        });
    }
}

fn accept(shared: Arc<Shared>, record: &[u8], fds: Vec<OwnedFd>) -> Result<(), String> {
    let (record, stream): (ViewRecord, UnixStream) =
        warren_proto::control::one_connection(record, fds)?;
    if record.version != VIEW_VERSION {
        return Err(format!("view record version {}", record.version));
    }
    crate::receipt::check_scope(&record.scope)?;
    let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| e.to_string())?;
    let scope = record.scope;
    tracing::info!(%scope, "serving a read-only view");
    let tree = Arc::new(ReceiptsTree::view(shared, scope.clone()));
    tokio::spawn(async move {
        if let Err(e) = warren_9p::serve(tree, stream, warren_9p::Limits::default()).await {
            tracing::debug!(error = %e, %scope, "view connection ended");
        }
    });
    Ok(())
}
