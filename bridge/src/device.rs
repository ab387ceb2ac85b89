//! `/dev/fuse`: opening it, mounting a connection, and reading requests / writing replies on it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno as NixErrno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::mount::{MsFlags, mount};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Opens `/dev/fuse` read-write, close-on-exec. The fd is one FUSE connection once it is mounted.
pub fn open_dev_fuse() -> io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    Ok(file.into())
}

/// Mounts the FUSE connection `fd` at `target` (mount(2), so it needs CAP_SYS_ADMIN in the mount
/// namespace that owns `target`): `fd=N,rootmode=40000,user_id=0,group_id=0[,allow_other]`,
/// `MS_NOSUID | MS_NODEV`. Without `allow_other` only uid 0 may use the mount. Mount first, then
/// call [`crate::serve`]: the kernel refuses reads on an unmounted connection.
pub fn mount_fuse(target: &Path, fd: BorrowedFd<'_>, allow_other: bool) -> io::Result<()> {
    let mut data = format!("fd={},rootmode=40000,user_id=0,group_id=0", fd.as_raw_fd());
    if allow_other {
        data.push_str(",allow_other");
    }
    mount(
        Some("warren"),
        target,
        Some("fuse.warren"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )?;
    Ok(())
}

/// What one read of the device gave.
pub(crate) enum Read {
    /// One whole request of this many bytes.
    Request(usize),
    /// The connection is gone (unmounted or aborted): `ENODEV`.
    Gone,
}

/// A mounted FUSE connection, non-blocking, driven by the tokio reactor.
///
/// Each read(2) returns exactly one request; each write(2) must carry exactly one reply. Writes
/// never block on /dev/fuse (the kernel copies the reply and wakes the caller), so replies are
/// written straight from whichever task produced them.
pub(crate) struct Device {
    fd: AsyncFd<OwnedFd>,
}

impl Device {
    pub(crate) fn new(fd: OwnedFd) -> io::Result<Device> {
        let flags = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
        fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        // ERROR interest too: a dead connection polls as EPOLLERR only, never readable.
        let fd = warren_jail::reactor::register(fd, Interest::READABLE | Interest::ERROR)?;
        Ok(Device { fd })
    }

    /// Reads the next request into `buf`, which must hold the largest request (max_write plus
    /// headers, and at least 8 KiB, or the kernel answers EINVAL).
    pub(crate) async fn read(&self, buf: &mut [u8]) -> io::Result<Read> {
        loop {
            let mut guard = self.fd.ready(Interest::READABLE | Interest::ERROR).await?;
            match nix::unistd::read(self.fd.get_ref().as_fd(), buf) {
                // /dev/fuse never reads 0 bytes; a SOCK_SEQPACKET stand-in (tests) does at EOF.
                Ok(0) => return Ok(Read::Gone),
                Ok(n) => return Ok(Read::Request(n)),
                Err(NixErrno::EAGAIN) => guard.clear_ready(),
                // ENOENT: the request was interrupted between poll and read; EINTR: a signal.
                Err(NixErrno::ENOENT | NixErrno::EINTR) => {}
                Err(NixErrno::ENODEV) => return Ok(Read::Gone),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Writes one reply (header and body in one buffer).
    pub(crate) fn write(&self, reply: &[u8]) -> io::Result<()> {
        let n = nix::unistd::write(self.fd.get_ref().as_fd(), reply)?;
        if n != reply.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write to /dev/fuse",
            ));
        }
        Ok(())
    }
}
