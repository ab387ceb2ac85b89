//! `net proxy`: the namespace's way out, through the egress proxy outside every namespace
//! (docs/network.md).
//!
//! nsd makes the namespace's network namespace itself, before the holder exists: a thread of
//! its own unshares one, opens it, and creates there the TCP listener at
//! `127.0.0.1:`[`PROXY_PORT`] (IP_FREEBIND: `lo` is brought up later, by the namespace's pid 1).
//! The listener goes to `warren-netproxy` on `netproxy.ctl` with the namespace's patterns; the
//! holder joins that network namespace instead of unsharing a fresh one. So the payload finds
//! the proxy at a loopback address of its own network namespace, and nothing in the namespace
//! names or reaches any of warren's sockets: the proxy accepts on the listener from outside.
//! The control connection is held with the namespace's [`crate::Running`]; when it closes the
//! proxy ends the session.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, sockopt};
use warren_netproxy::grant::{CONTROL, GrantRecord};

use crate::confine::guard::ProtectedDirs;
use crate::spec::{PROXY_PORT, Spec};

/// Which session and namespace a `net proxy` grant is for (nsd sets it on `RunOptions`).
#[derive(Clone, Debug)]
pub struct NetProxyTarget {
    /// The receipts' scope and the gate's session.
    pub session: String,
    /// The namespace's id in `/ns`.
    pub namespace: String,
}

/// A granted `net proxy` namespace: its network namespace (for the holder to join) and the
/// control connection that keeps the proxy's session alive.
#[derive(Debug)]
pub(crate) struct NetGrant {
    pub netns: OwnedFd,
    _control: UnixStream,
}

/// The payload's proxy variables: curl, pip, git, npm and Node (through `HTTPS_PROXY`) speak
/// HTTP to a proxy; `ALL_PROXY` is SOCKS5 with the proxy resolving (`socks5h`), for clients that
/// take only it. The same listener serves both (the proxy tells them by their first byte).
pub fn proxy_env() -> Vec<String> {
    let http = format!("http://127.0.0.1:{PROXY_PORT}");
    let socks = format!("socks5h://127.0.0.1:{PROXY_PORT}");
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &"localhost,127.0.0.1".to_string()),
    ] {
        env.push(format!("{name}={value}"));
        env.push(format!("{}={value}", name.to_ascii_lowercase()));
    }
    env
}

/// Makes the namespace's network namespace and its listener, and hands the listener with the
/// spec's patterns to the proxy.
pub(crate) fn grant(
    spec: &Spec,
    target: &NetProxyTarget,
    dirs: &ProtectedDirs,
) -> io::Result<NetGrant> {
    // unshare(CLONE_NEWNET) moves only the calling thread: this one ends here, and nsd's other
    // threads stay in the host's network namespace.
    let (netns, listener) = std::thread::spawn(|| -> io::Result<(OwnedFd, OwnedFd)> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
        let netns: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net")?.into();
        let sock = socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        socket::setsockopt(&sock, sockopt::IpFreebind, &true)?;
        socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            &SockaddrIn::new(127, 0, 0, 1, PROXY_PORT),
        )?;
        socket::listen(&sock, Backlog::new(128)?)?;
        Ok((netns, sock))
    })
    .join()
    .map_err(|_| io::Error::other("the network namespace's thread panicked"))??;
    let record = GrantRecord {
        version: 1,
        session: target.session.clone(),
        namespace: target.namespace.clone(),
        patterns: spec.proxy.iter().map(ToString::to_string).collect(),
    };
    let control =
        warren_netproxy::grant::hand_over(&dirs.control(CONTROL), &record, listener.as_fd())
            .map_err(|e| io::Error::new(e.kind(), format!("net proxy: {e}")))?;
    Ok(NetGrant {
        netns,
        _control: control,
    })
}
