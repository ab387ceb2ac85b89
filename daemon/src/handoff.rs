//! Handing a record and file descriptors to a daemon over a Unix control socket.
//!
//! This is how a connection becomes a capability: nsd (or, before nsd, the trusted test or front
//! door) makes a socketpair, keeps one end for the namespace and hands the other, with the grant
//! record and any root directory fds, to the server. Frame: a 4-byte little-endian length, then the
//! record; the fds ride as SCM_RIGHTS on the first byte.

use std::io::{self, IoSlice, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

/// The largest record accepted.
pub const MAX_RECORD: usize = 1 << 20;
/// The most fds accepted with one record.
pub const MAX_FDS: usize = 64;
/// How long a client of a control socket waits for its one-record answer (a daemon's
/// `toolfs.ctl`, `gate.ctl`): a daemon that accepts and never answers must not hold it.
pub const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Sends one record with `fds`.
pub fn send(sock: &UnixStream, record: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if record.len() > MAX_RECORD || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a handoff record of {} bytes with {} fds is over the limit ({MAX_RECORD} bytes, \
                 {MAX_FDS} fds)",
                record.len(),
                fds.len()
            ),
        ));
    }
    let len = (record.len() as u32).to_le_bytes();
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs = if raw.is_empty() {
        vec![]
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    let iov = [IoSlice::new(&len), IoSlice::new(record)];
    let mut sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    // The fds went with the first byte; any rest of the frame is plain bytes.
    let frame: Vec<u8> = len.iter().chain(record).copied().collect();
    while sent < frame.len() {
        let n = nix::unistd::write(sock, &frame[sent..])?;
        sent += n;
    }
    Ok(())
}

/// Receives one record and its fds (close-on-exec). Fails cleanly on a short or oversized frame;
/// fds that arrived with a bad frame are closed.
pub fn recv(sock: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut head = [0u8; 4];
    let (got, fds) = warren_jail::fd_passing::recv_with_fds::<MAX_FDS>(sock.as_fd(), &mut head)?;
    if got == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "control peer closed",
        ));
    }
    let mut reader = sock;
    reader.read_exact(&mut head[got..])?;
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_RECORD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "handoff record too large",
        ));
    }
    let mut record = vec![0u8; len];
    reader.read_exact(&mut record)?;
    Ok((record, fds))
}

/// [`recv`] on a tokio socket: waits for readability, then receives on a blocking clone.
pub async fn recv_async(sock: &tokio::net::UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    sock.readable().await?;
    let std_sock = dup_blocking(sock)?;
    tokio::task::spawn_blocking(move || recv(&std_sock))
        .await
        .map_err(io::Error::other)?
}

/// [`send`] on a tokio socket.
pub async fn send_async(
    sock: &tokio::net::UnixStream,
    record: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let std_sock = dup_blocking(sock)?;
    send(&std_sock, record, fds)
}

fn dup_blocking(sock: &tokio::net::UnixStream) -> io::Result<UnixStream> {
    let fd = nix::unistd::dup(sock)?;
    let std_sock = UnixStream::from(fd);
    // A dup shares the file status flags, so this makes the tokio side blocking too; every use of
    // the control socket after a handoff is a single blocking reply, which is what we want.
    std_sock.set_nonblocking(false)?;
    Ok(std_sock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn record_and_fds_arrive_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let big = vec![7u8; 300_000];
        let t = std::thread::spawn(move || recv(&b).unwrap());
        send(&a, &big, &[file.as_fd()]).unwrap();
        let (rec, fds) = t.join().unwrap();
        assert_eq!(rec, big);
        assert_eq!(fds.len(), 1);
        let a_ino = nix::sys::stat::fstat(file.as_fd()).unwrap().st_ino;
        assert_eq!(nix::sys::stat::fstat(fds[0].as_fd()).unwrap().st_ino, a_ino);
    }

    #[test]
    fn oversized_record_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut head = ((MAX_RECORD + 1) as u32).to_le_bytes().to_vec();
        head.extend_from_slice(b"x");
        nix::unistd::write(&a, &head).unwrap();
        let err = recv(&b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn closed_peer_is_eof() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert_eq!(recv(&b).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
