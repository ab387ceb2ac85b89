//! Each FUSE operation as 9P2000.L requests.

mod entry;
mod file;

use std::sync::Arc;

use polyfuse_kernel as abi;
use warren_9p::{Errno, Fid};

use crate::conn::{Attachment, is_disconnect};
use crate::nodes::FUSE_ROOT_ID;
use crate::reply::{self, Body};
use crate::request::{Op, Request};
use crate::session::{Reply, Session};

impl Session {
    /// Runs one request. A request that finds the connection gone triggers a re-attach (when a
    /// reconnect hook was given); requests that only read or open are then run once more on
    /// the new connection. The others fail: EIO if their effect is unknown (it may have
    /// happened before the server went away) or the server is not back yet (the next request
    /// tries again), ENOTCONN when there is no server any more (no reconnect hook).
    pub(crate) async fn handle(&self, req: Request) -> Result<Reply, Errno> {
        let generation = self.conn.current().generation;
        match self.run_op(&req).await {
            Err(e) if is_disconnect(e) => {
                self.conn.recover(generation).await?;
                if !retryable(&req.op) {
                    return Err(Errno::EIO);
                }
                self.run_op(&req)
                    .await
                    .map_err(|e| if is_disconnect(e) { Errno::EIO } else { e })
            }
            other => other,
        }
    }

    async fn run_op(&self, req: &Request) -> Result<Reply, Errno> {
        let nodeid = req.nodeid;
        match &req.op {
            Op::Lookup { name } => self.lookup(nodeid, name).await,
            Op::Getattr => self.getattr(nodeid).await,
            Op::Setattr(input) => self.setattr(nodeid, input).await,
            Op::Create { name, flags, mode } => self.create(nodeid, name, *flags, *mode).await,
            Op::Mkdir { name, mode } => self.mkdir(nodeid, name, *mode).await,
            Op::Unlink { name } => self.unlink(nodeid, name, 0).await,
            Op::Rmdir { name } => self.unlink(nodeid, name, libc::AT_REMOVEDIR as u32).await,
            Op::Open { flags } => self.open(nodeid, Some(*flags)).await,
            Op::Opendir => self.open(nodeid, None).await,
            Op::Read {
                fh,
                offset,
                size,
                direct,
            } => self.read(*fh, *offset, *size, *direct).await,
            Op::Write { fh, offset, data } => self.write(*fh, *offset, data).await,
            Op::Readdir { fh, offset, size } => self.readdir(*fh, *offset, *size).await,
            Op::Release { fh } => self.release(*fh).await,
            Op::Fsync { fh } => self.fsync(*fh).await,
            Op::Statfs => self.statfs().await,
            // Answered by the reader without a task (see Session::dispatch).
            _ => Err(Errno::ENOSYS),
        }
    }

    /// The node's fid on attachment `att`, re-walked from the root if the node's fid belongs
    /// to an older (dead) attachment. ESTALE for a nodeid the table does not know.
    pub(crate) async fn node_fid(&self, nodeid: u64, att: &Attachment) -> Result<Arc<Fid>, Errno> {
        let node = self.nodes().get(nodeid).ok_or(Errno(libc::ESTALE as u32))?;
        if node.generation == att.generation {
            return Ok(node.fid);
        }
        let fid = if nodeid == FUSE_ROOT_ID {
            att.root.clone()
        } else {
            let path = self
                .nodes()
                .path(nodeid)
                .ok_or(Errno(libc::ESTALE as u32))?;
            let names: Vec<&str> = path.iter().map(String::as_str).collect();
            Arc::new(att.root.walk(&names).await?)
        };
        self.nodes().refresh(nodeid, fid.clone(), att.generation);
        Ok(fid)
    }
}

/// Requests safe to run twice: they change nothing on the server.
fn retryable(op: &Op) -> bool {
    matches!(
        op,
        Op::Lookup { .. } | Op::Getattr | Op::Open { .. } | Op::Opendir | Op::Statfs
    )
}

/// A name from the kernel as a 9P string (9P2000.L names are UTF-8 on this codec).
pub(crate) fn utf8_name(name: &[u8], otherwise: Errno) -> Result<&str, Errno> {
    let name = std::str::from_utf8(name).map_err(|_| otherwise)?;
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(otherwise);
    }
    Ok(name)
}

/// Extended attributes: none are served. Setting `security.*` or `trusted.*` is refused outright
/// (EPERM: a third-party server must never be able to carry a capability or an LSM label);
/// every other name is not supported.
pub(crate) fn xattr(op: &Op) -> Result<Body, i32> {
    match op {
        Op::Getxattr => Err(libc::ENODATA),
        Op::Listxattr { size: 0 } => Ok(reply::body(&abi::fuse_getxattr_out {
            size: 0,
            padding: 0,
        })),
        Op::Listxattr { .. } => Ok(Vec::new()),
        Op::Setxattr { name }
            if name.starts_with(b"security.") || name.starts_with(b"trusted.") =>
        {
            Err(libc::EPERM)
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileged_xattr_namespaces_are_refused_with_eperm() {
        for name in [
            &b"security.capability"[..],
            b"security.selinux",
            b"trusted.overlay.opaque",
        ] {
            assert_eq!(
                xattr(&Op::Setxattr {
                    name: name.to_vec()
                }),
                Err(libc::EPERM)
            );
        }
        assert_eq!(
            xattr(&Op::Setxattr {
                name: b"user.note".to_vec()
            }),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(xattr(&Op::Getxattr), Err(libc::ENODATA));
        assert_eq!(xattr(&Op::Listxattr { size: 64 }), Ok(Vec::new()));
    }

    #[test]
    fn names_that_are_not_one_component_are_refused() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"\xff"] {
            assert_eq!(utf8_name(bad, Errno::ENOENT), Err(Errno::ENOENT));
        }
        assert_eq!(utf8_name(b"call", Errno::ENOENT), Ok("call"));
    }
}
