//! Serving a namespace's 9P mounts: nsd makes each connection, hands one end with the grant to
//! the server, and gives the other end with the FUSE fd to a bridge process.
//!
//! This is "the connection is the capability": toolfs learns what a namespace may call from the
//! grant record that arrives with the connection on its root-only control socket, never from
//! anything the namespace sends. The bridge is its own process, dropped to the bridge uid once
//! it holds its fds, so a bug in it holds no root.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::Mutex;

use warren_daemon::Dirs;
use warren_daemon::identity::Role;
use warren_toolfs::{GrantRecord, RootGrant, ToolGrant};

use crate::confine::fuse::MountServer;
use crate::spec::{Access, LocalServer, Mount, Server, Spec};

/// Serves `mount tool …` lines through the running toolfs and a `warren-bridge` per mount.
pub struct ServedMounts {
    dirs: Dirs,
    spec: Spec,
    session: String,
    namespace: String,
    bridge_binary: PathBuf,
    bridges: Mutex<Vec<std::process::Child>>,
}

/// A fresh 128-bit session id: 32 lowercase hex digits, from the kernel's CSPRNG.
pub fn new_session_id() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl ServedMounts {
    /// `bridge_binary`: the `warren-bridge` executable.
    pub fn new(
        dirs: Dirs,
        spec: &Spec,
        namespace: &str,
        bridge_binary: PathBuf,
    ) -> io::Result<ServedMounts> {
        Ok(ServedMounts {
            dirs,
            spec: spec.clone(),
            session: new_session_id()?,
            namespace: namespace.to_string(),
            bridge_binary,
            bridges: Mutex::new(Vec::new()),
        })
    }

    /// The namespace's session id, as every grant record carries it.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The grant for `mount tool PATH NAMES…`: each named tool with its own authority from the
    /// spec's `tool` lines, and an O_PATH fd per host directory.
    fn tool_grant(&self, mount: &Mount) -> io::Result<(GrantRecord, Vec<OwnedFd>)> {
        let mut tools = Vec::new();
        let mut fds = Vec::new();
        for name in &mount.spec {
            let mut roots = Vec::new();
            for authority in self.spec.tools.iter().filter(|t| &t.name == name) {
                for host in &authority.host_paths {
                    let dir = nix::fcntl::open(
                        host.as_str(),
                        nix::fcntl::OFlag::O_PATH
                            | nix::fcntl::OFlag::O_DIRECTORY
                            | nix::fcntl::OFlag::O_CLOEXEC,
                        nix::sys::stat::Mode::empty(),
                    )
                    .map_err(|e| {
                        io::Error::new(
                            io::Error::from(e).kind(),
                            format!("tool {name}: {host}: {e}"),
                        )
                    })?;
                    fds.push(dir);
                    roots.push(RootGrant {
                        path: host.clone(),
                        writable: authority.access == Access::Write,
                    });
                }
            }
            tools.push(ToolGrant {
                name: name.clone(),
                roots,
                network: false,
            });
        }
        let worker = Role::Worker.uid();
        let record = GrantRecord {
            version: 1,
            session: self.session.clone(),
            namespace: self.namespace.clone(),
            tools,
            worker_uid: worker,
            worker_gid: worker,
        };
        Ok((record, fds))
    }

    fn spawn_bridge(&self, fuse: OwnedFd, conn: OwnedFd) -> io::Result<()> {
        let bridge_uid = Role::Bridge.uid();
        let mut cmd = std::process::Command::new(&self.bridge_binary);
        cmd.arg("--fuse-fd")
            .arg(fuse.as_raw_fd().to_string())
            .arg("--9p-fd")
            .arg(conn.as_raw_fd().to_string())
            .arg("--runas")
            .arg(format!("{bridge_uid}:{bridge_uid}"))
            .stdin(std::process::Stdio::null());
        let keep = [fuse.as_raw_fd(), conn.as_raw_fd()];
        // SAFETY: between fork and exec the closure only clears FD_CLOEXEC with fcntl.
        unsafe {
            cmd.pre_exec(move || {
                for fd in keep {
                    nix::fcntl::fcntl(
                        BorrowedFd::borrow_raw(fd),
                        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                    )?;
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("start {}: {e}", self.bridge_binary.display()),
            )
        })?;
        self.bridges
            .lock()
            .map_err(|_| io::Error::other("bridge list poisoned"))?
            .push(child);
        Ok(())
    }
}

impl MountServer for ServedMounts {
    fn serve(&self, mount: &Mount, fuse: OwnedFd) -> io::Result<()> {
        match &mount.server {
            Server::Local(LocalServer::Tool) => {
                let (ours, theirs) = UnixStream::pair()?;
                let (record, roots) = self.tool_grant(mount)?;
                let root_fds: Vec<BorrowedFd<'_>> = roots.iter().map(|f| f.as_fd()).collect();
                warren_toolfs::hand_over(
                    &self.dirs.control("toolfs"),
                    &record,
                    theirs.as_fd(),
                    &root_fds,
                )
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("hand the /tool connection to toolfs: {e}"),
                    )
                })?;
                drop(theirs);
                self.spawn_bridge(fuse, OwnedFd::from(ours))
            }
            other => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "mount of {other:?} at {} is not served yet (only `tool`)",
                    mount.path
                ),
            )),
        }
    }
}

impl Drop for ServedMounts {
    fn drop(&mut self) {
        // A bridge ends by itself when its mount goes away; reap it (or end it, if the namespace
        // never came up).
        if let Ok(mut bridges) = self.bridges.lock() {
            for child in bridges.iter_mut() {
                if child.try_wait().ok().flatten().is_none() {
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
        }
    }
}
