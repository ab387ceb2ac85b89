//! The 9P side: the attached client, and re-attaching after the server went away.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use warren_9p::{Client, Errno, Fid};

/// Makes a new connection to the same server after the old one died (e.g. asks nsd for a fresh
/// socketpair to the restarted daemon). It should give up in bounded time: requests that hit the
/// dead connection wait for it.
pub type Reconnect =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = io::Result<Client>> + Send>> + Send + Sync>;

/// One attached connection. Every fid the bridge holds belongs to exactly one attachment (a
/// `Fid` carries its own client), so a fid of a dead connection can only fail, never name a
/// file on the next one.
pub(crate) struct Attachment {
    pub client: Client,
    pub root: Arc<Fid>,
    pub generation: u64,
}

pub(crate) struct Conn {
    current: Mutex<Arc<Attachment>>,
    reconnect: Option<Reconnect>,
    /// One re-attach at a time; the others wait and then use its result.
    reattaching: tokio::sync::Mutex<()>,
    uname: String,
    aname: String,
}

/// Errors that mean the connection itself is gone, not that one request failed.
pub(crate) fn is_disconnect(e: Errno) -> bool {
    [
        Errno::ECONNRESET,
        Errno::ENOTCONN,
        Errno::ECONNABORTED,
        Errno(libc::EPIPE as u32),
        Errno(libc::ESHUTDOWN as u32),
    ]
    .contains(&e)
}

impl Conn {
    pub(crate) async fn attach(
        client: Client,
        uname: String,
        aname: String,
        reconnect: Option<Reconnect>,
    ) -> io::Result<Conn> {
        let root = client.attach(&uname, &aname).await?;
        Ok(Conn {
            current: Mutex::new(Arc::new(Attachment {
                client,
                root: Arc::new(root),
                generation: 0,
            })),
            reconnect,
            reattaching: tokio::sync::Mutex::new(()),
            uname,
            aname,
        })
    }

    pub(crate) fn current(&self) -> Arc<Attachment> {
        self.current.lock().expect("attachment lock").clone()
    }

    /// Called after a request on attachment `failed` found the connection gone: re-attaches
    /// through the reconnect hook (once per dead attachment). Without a hook the mount is gone
    /// for good: ENOTCONN. With one, a failed reconnect is EIO for this request only: the
    /// server (a daemon restarting, a peer's link) may be back for the next, which tries again.
    pub(crate) async fn recover(&self, failed: u64) -> Result<Arc<Attachment>, Errno> {
        let Some(reconnect) = &self.reconnect else {
            return Err(Errno::ENOTCONN);
        };
        let _one_at_a_time = self.reattaching.lock().await;
        let current = self.current();
        if current.generation != failed {
            return Ok(current);
        }
        let client = reconnect().await.map_err(|e| {
            tracing::warn!(error = %e, "bridge: reconnect failed");
            Errno::EIO
        })?;
        let root = client.attach(&self.uname, &self.aname).await.map_err(|e| {
            tracing::warn!(error = %e, "bridge: re-attach failed");
            Errno::EIO
        })?;
        let next = Arc::new(Attachment {
            client,
            root: Arc::new(root),
            generation: failed + 1,
        });
        *self.current.lock().expect("attachment lock") = next.clone();
        tracing::info!(generation = next.generation, "bridge: re-attached");
        Ok(next)
    }
}
