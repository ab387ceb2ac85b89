//! warren's FUSE bridge: serves one kernel FUSE connection from a 9P2000.L server.
//!
//! A confined process never speaks 9P: it sees kernel FUSE mounts, and the bridge (outside the
//! sandbox) turns each FUSE request into 9P requests on the connection nsd made for it. The
//! session loop is our own, over the kernel ABI (`linux/fuse.h`), because the bridge must turn
//! FUSE_INTERRUPT into Tflush, and fuser answers INTERRUPT itself with ENOSYS (which turns
//! interrupts off for the whole connection and leaves a killed caller in D state). See
//! `docs/bridge.md` for the decisions and `specs/bridge.md` for the wire behaviour.
//!
//! Use: open `/dev/fuse` ([`open_dev_fuse`]), mount it ([`mount_fuse`], in whatever mount
//! namespace the mount belongs to), then [`serve`] the fd with a [`warren_9p::Client`].

mod attr;
mod conn;
mod device;
mod nodes;
mod ops;
mod reply;
mod request;
mod session;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

pub use conn::Reconnect;
pub use device::{mount_fuse, open_dev_fuse};

/// How the bridge presents a 9P tree.
pub struct BridgeOptions {
    /// FOPEN_DIRECT_IO on every open file (right for synthetic trees such as /tool, whose sizes
    /// mean nothing). Files reporting size 0 get it regardless.
    pub direct_io_all: bool,
    /// Every file opened for reading and writing is a call file (toolfs's `/tool`): its first
    /// write is answered at once and sent with the first read, one round trip for both (see
    /// `docs/bridge.md`). Never for a tree whose writes must fail where they are made (`/gate`'s
    /// ctl files, a file server).
    pub call_files: bool,
    /// How long the kernel may cache names and attributes (LOOKUP and GETATTR answers).
    pub entry_timeout: Duration,
    /// The owner shown for every file (the server's uids mean nothing in the namespace).
    pub uid: u32,
    pub gid: u32,
    /// Tattach's uname and aname. On an nsd-made connection they mean nothing (the connection is
    /// the capability); a third-party server such as diod needs its export as the aname.
    pub uname: String,
    pub aname: String,
    /// Makes a new client when the server went away (see [`Reconnect`]); the bridge re-attaches
    /// and re-walks its nodes. `None`: requests fail with ENOTCONN once the server is gone.
    pub reconnect: Option<Reconnect>,
    /// With `call_files`: each call made on a `NAME/call` file is reported here when a read
    /// finds the end of its result (or its handle is closed first), and the read is answered
    /// once the report is acknowledged (nsd receipts a namespace's calls to a peer from these).
    pub calls: Option<CallSink>,
}

/// Where call reports go: each with the sender the bridge waits on for the acknowledgement.
pub type CallSink = tokio::sync::mpsc::Sender<(CallReport, tokio::sync::oneshot::Sender<()>)>;

/// One call seen on a call file: the tool, the digest of what was written, and the first
/// [`CallReport::RESULT_KEPT`] bytes of what was read (the result envelope).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallReport {
    pub tool: String,
    /// SHA-256 of the bytes written, in order, as lowercase hex.
    pub args_sha256: String,
    pub args_len: u64,
    pub result: Vec<u8>,
    pub result_len: u64,
}

impl CallReport {
    /// The most of a result a report carries: an envelope is parsed from it, so a larger one is
    /// reported cut (its length says so).
    pub const RESULT_KEPT: usize = 64 * 1024;
}

impl Default for BridgeOptions {
    fn default() -> BridgeOptions {
        BridgeOptions {
            direct_io_all: true,
            call_files: false,
            entry_timeout: Duration::from_secs(60),
            uid: 0,
            gid: 0,
            uname: "warren".to_owned(),
            aname: String::new(),
            reconnect: None,
            calls: None,
        }
    }
}

/// Serves the mounted FUSE connection `fuse` from `client`'s server until the mount goes away
/// (unmounted or aborted: the device says ENODEV), then returns `Ok(())`. The mount must already
/// exist (see [`mount_fuse`]). Runs on the caller's tokio runtime: one task reads the device,
/// and each request runs in its own task, so a request blocked in the server blocks nothing
/// else. Errors: the attach failed, or the device failed in a way other than going away.
/// The same as `Bridge::new(..).await?.run().await`; use [`Bridge`] to keep an [`Invalidator`].
pub async fn serve(
    fuse: OwnedFd,
    client: warren_9p::Client,
    opts: BridgeOptions,
) -> io::Result<()> {
    Bridge::new(fuse, client, opts).await?.run().await
}

/// An attached bridge, not yet serving.
pub struct Bridge {
    session: Arc<session::Session>,
}

impl Bridge {
    /// Attaches to the server and takes the FUSE fd (already mounted) over.
    pub async fn new(
        fuse: OwnedFd,
        client: warren_9p::Client,
        opts: BridgeOptions,
    ) -> io::Result<Bridge> {
        let owner = attr::Owner {
            uid: opts.uid,
            gid: opts.gid,
        };
        let mut settings = session::Settings::new(
            opts.direct_io_all,
            opts.call_files,
            opts.entry_timeout,
            owner,
            client.msize(),
        );
        settings.calls = opts.calls.filter(|_| opts.call_files);
        let conn = conn::Conn::attach(client, opts.uname, opts.aname, opts.reconnect).await?;
        let device = device::Device::new(fuse)?;
        Ok(Bridge {
            session: Arc::new(session::Session::new(device, conn, settings)),
        })
    }

    /// A handle for telling the kernel that names changed (see [`Invalidator::invalidate`]).
    pub fn invalidator(&self) -> Invalidator {
        Invalidator {
            session: Arc::downgrade(&self.session),
        }
    }

    /// Serves until the mount goes away (see [`serve`]).
    pub async fn run(self) -> io::Result<()> {
        self.session.run().await
    }
}

/// Drops names from the kernel's cache. Names and attributes are cached for
/// [`BridgeOptions::entry_timeout`]; when a grant shrinks, the namespace's owner invalidates the
/// names that went away so they are absent at once, not after the timeout. (Names that appear
/// need nothing: the bridge never caches a negative lookup.)
#[derive(Clone)]
pub struct Invalidator {
    session: std::sync::Weak<session::Session>,
}

impl Invalidator {
    /// Invalidates `path` (slash-separated, from the mount's root, e.g. `"/fs_read"`). A path the
    /// kernel has not cached is no error. Fails with ENOTCONN once the bridge has stopped.
    pub async fn invalidate(&self, path: &str) -> io::Result<()> {
        let session = self
            .session
            .upgrade()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTCONN))?;
        let names: Vec<&str> = path.split('/').filter(|n| !n.is_empty()).collect();
        let Some((last, dirs)) = names.split_last() else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        let mut parent = nodes::FUSE_ROOT_ID;
        for dir in dirs {
            match session.nodes().child(parent, dir) {
                Some(id) => parent = id,
                None => return Ok(()),
            }
        }
        let last = last.to_string();
        // The notify write waits for the directory's lock in the kernel, which a LOOKUP being
        // served may hold: never on a worker thread that LOOKUP may need.
        tokio::task::spawn_blocking(move || session.invalidate_entry(parent, &last))
            .await
            .map_err(io::Error::other)?
    }
}
