//! The deciding daemons' (toolfs's, mcpfs's, netproxy's, llmfs's) intake of the one long-lived
//! gate connection the supervisor handed over (`WARREN_GATE_FD`); the client that speaks on it,
//! failing closed, is `warren_proto::gate::GateClient`.

use std::os::fd::OwnedFd;

use warren_proto::gate::client::GATE_FD_ENV;

/// Takes the fd named by `WARREN_GATE_FD`, if the variable is set: it must be an open socket.
/// It is made close-on-exec so no worker inherits it. Call before any other fd is opened.
pub fn take_inherited_fd() -> std::io::Result<Option<OwnedFd>> {
    let Some(value) = std::env::var_os(GATE_FD_ENV) else {
        return Ok(None);
    };
    let fd: i32 = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| std::io::Error::other(format!("{GATE_FD_ENV}={value:?} is not an fd")))?;
    let st = warren_jail::inherited::inspect(fd, |fd| nix::sys::stat::fstat(fd))
        .and_then(|st| st.map_err(std::io::Error::from))
        .map_err(|e| std::io::Error::other(format!("{GATE_FD_ENV}={fd}: {e}")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(std::io::Error::other(format!(
            "{GATE_FD_ENV}={fd} is not a socket"
        )));
    }
    // The supervisor handed this fd to us alone (close-on-exec once taken).
    Ok(Some(warren_jail::inherited::take(fd)?))
}
