//! The control sockets' exchange (the gate's, toolfs's, mcpfs's, llmfs's, receiptd's,
//! netproxy's): a trusted peer sends one JSON record with the fds it concerns (the connection
//! first), and the daemon answers with one line, `ok` or `error: <why>`. The records themselves
//! are in each daemon's module.

use std::io::{self, BufRead, BufReader};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The one-line answer to a handed-over record, as every control socket writes it: `ok`, or
/// `error: <why>` on one line.
/// A record that hands over one connection: the record parsed, and its one fd as a
/// non-blocking Unix stream (none, more than one, or an fd that is not a socket is refused).
pub fn one_connection<R: DeserializeOwned>(
    record: &[u8],
    fds: Vec<OwnedFd>,
) -> Result<(R, UnixStream), String> {
    let mut fds = fds.into_iter();
    let conn = fds.next().ok_or("no connection fd came with the record")?;
    if fds.next().is_some() {
        return Err("one fd (the connection) per record".into());
    }
    let record = serde_json::from_slice(record).map_err(|e| format!("bad record: {e}"))?;
    let st = nix::sys::stat::fstat(&conn).map_err(|e| format!("connection fd: {e}"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err("the fd is not a socket".into());
    }
    let stream = UnixStream::from(conn);
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok((record, stream))
}

pub fn reply_line(result: &Result<(), String>) -> String {
    match result {
        Ok(()) => "ok\n".to_owned(),
        Err(msg) => format!("error: {}\n", msg.replace('\n', " ")),
    }
}

/// Reads a [`reply_line`]: `daemon` names the server in errors, `refused` what it refused.
pub fn read_reply(line: &str, daemon: &str, refused: &str) -> io::Result<()> {
    let line = line.trim_end();
    match line.strip_prefix("error: ") {
        None if line == "ok" => Ok(()),
        None => Err(io::Error::other(format!("{daemon} answered {line:?}"))),
        Some(msg) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{daemon} refused {refused}: {msg}"),
        )),
    }
}

/// How a daemon sends its [`reply_line`] back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyForm {
    /// As one `warren_daemon::handoff` frame (the gate, receiptd).
    Framed,
    /// As the bare line (toolfs, mcpfs, netproxy, llmfs).
    Line,
}

/// Reads one bare [`reply_line`] from `replies`; a closed connection is an error of its own.
pub fn read_line_reply(replies: &mut impl BufRead, daemon: &str, refused: &str) -> io::Result<()> {
    let mut line = String::new();
    if replies.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{daemon} closed the control connection"),
        ));
    }
    read_reply(&line, daemon, refused)
}

/// Connects to a control socket, sends one record with `fds` (the connection first) and reads
/// the answer; returns the control connection once the daemon said `ok`. Bounded, so a daemon
/// that accepts and never answers does not hold its caller. `daemon` names the server in errors,
/// `refused` what it refused.
pub fn hand_over(
    ctl_path: &Path,
    record: &impl Serialize,
    fds: &[BorrowedFd<'_>],
    form: ReplyForm,
    daemon: &str,
    refused: &str,
) -> io::Result<UnixStream> {
    let sock = UnixStream::connect(ctl_path)?;
    sock.set_read_timeout(Some(warren_daemon::handoff::REPLY_TIMEOUT))?;
    sock.set_write_timeout(Some(warren_daemon::handoff::REPLY_TIMEOUT))?;
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    warren_daemon::handoff::send(&sock, &bytes, fds)?;
    match form {
        ReplyForm::Framed => {
            let (reply, _) = warren_daemon::handoff::recv(&sock)?;
            read_reply(&String::from_utf8_lossy(&reply), daemon, refused)?;
        }
        ReplyForm::Line => read_line_reply(&mut BufReader::new(&sock), daemon, refused)?,
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_line_reads_back() {
        assert!(read_reply(&reply_line(&Ok(())), "gate", "it").is_ok());
        let err = read_reply(&reply_line(&Err("no\nway".into())), "gate", "it").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(err.to_string(), "gate refused it: no way");
        assert!(read_reply("maybe", "gate", "it").is_err());
    }
}
