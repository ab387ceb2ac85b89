//! Receiving descriptors over a Unix socket (SCM_RIGHTS): the kernel installs them in this
//! process's table, and they become owned here.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

/// One recvmsg into `buf` with room for `MAX_FDS` descriptors, installed close-on-exec. Returns
/// the bytes read and the descriptors that came with them, owned. More than `MAX_FDS` is an
/// error (the ones that did arrive are closed).
pub fn recv_with_fds<const MAX_FDS: usize>(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg_buf),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: SCM_RIGHTS just installed these descriptors in this process's table;
            // nothing else knows their numbers, so each `OwnedFd` is the only owner.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {MAX_FDS} fds in one message"),
        ));
    }
    Ok((msg.bytes, fds))
}
