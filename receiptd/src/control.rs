//! The control socket, `<runtime>/receipts.ctl` (root peers in our pid namespace only): a trusted
//! peer (nsd) hands over one end of a connection with a record naming one scope, and receiptd
//! serves that connection a read-only view of that scope (`crate::tree`, "view"). This is how a
//! peer host reads its own session's receipts over exportfs and nothing else: the scope is
//! chosen by nsd from the key the peer proved, never by the peer.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use warren_daemon::accept::{next_peer, refusal, root_only};

use crate::tree::{ReceiptsTree, Shared};

pub const VIEW_VERSION: u32 = 1;

/// What a handed-over connection may read: one scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewRecord {
    pub version: u32,
    pub scope: String,
}

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
            let line = match &result {
                Ok(()) => "ok\n".to_owned(),
                Err(msg) => format!("error: {}\n", msg.replace('\n', " ")),
            };
            let _ = warren_daemon::handoff::send_async(&sock, line.as_bytes(), &[]).await;
        });
    }
}

fn accept(shared: Arc<Shared>, record: &[u8], fds: Vec<OwnedFd>) -> Result<(), String> {
    let mut fds = fds.into_iter();
    let conn = fds.next().ok_or("no connection fd came with the record")?;
    if fds.next().is_some() {
        return Err("one fd (the connection) per record".into());
    }
    let record: ViewRecord =
        serde_json::from_slice(record).map_err(|e| format!("bad record: {e}"))?;
    if record.version != VIEW_VERSION {
        return Err(format!("view record version {}", record.version));
    }
    crate::receipt::check_scope(&record.scope)?;
    let st = nix::sys::stat::fstat(&conn).map_err(|e| format!("connection fd: {e}"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err("the fd is not a socket".into());
    }
    let stream = UnixStream::from(conn);
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
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

/// The trusted side: hands `conn` to receiptd as a view of `scope`, and returns once receiptd
/// serves it (or with its refusal).
pub fn hand_over(ctl_path: &Path, scope: &str, conn: impl AsFd) -> io::Result<()> {
    let sock = UnixStream::connect(ctl_path)?;
    // Bounded: a receiptd that accepts and never answers must not hold its caller.
    sock.set_read_timeout(Some(warren_daemon::handoff::REPLY_TIMEOUT))?;
    sock.set_write_timeout(Some(warren_daemon::handoff::REPLY_TIMEOUT))?;
    let record = ViewRecord {
        version: VIEW_VERSION,
        scope: scope.to_owned(),
    };
    let bytes = serde_json::to_vec(&record).map_err(io::Error::other)?;
    warren_daemon::handoff::send(&sock, &bytes, &[conn.as_fd()])?;
    let (reply, _) = warren_daemon::handoff::recv(&sock)?;
    let line = String::from_utf8_lossy(&reply);
    let line = line.trim_end();
    match line.strip_prefix("error: ") {
        None if line == "ok" => Ok(()),
        None => Err(io::Error::other(format!("receiptd answered {line:?}"))),
        Some(msg) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("receiptd refused the view: {msg}"),
        )),
    }
}
