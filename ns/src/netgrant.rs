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
//! The control connection is held, by a keeper thread, for as long as the namespace's
//! [`crate::Running`] is: when it closes the proxy ends the session. When the proxy goes away
//! first (a crash, or the supervisor restarting it with the gate), the keeper hands the same
//! listener and record over again to the restarted proxy.

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, sockopt};
use warren_proto::net::Pattern;
use warren_proto::net::{CONTROL, GrantRecord};

use crate::confine::guard::ProtectedDirs;
use crate::spec::PROXY_PORT;

/// Which session and namespace a `net proxy` grant is for (nsd sets it on `RunOptions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetProxyTarget {
    /// The receipts' scope and the gate's session.
    pub session: String,
    /// The namespace's id in `/ns`.
    pub namespace: String,
    /// Itself and the namespaces that cloned it, for the gate (`mount_server::member`).
    pub lineage: warren_proto::lineage::Lineage,
}

/// A granted `net proxy` namespace: its network namespace (for the holder to join), and the
/// write end of the pipe its keeper watches: dropped with the grant, it ends the keeper, which
/// closes the control connection and so the proxy's session.
#[derive(Debug)]
pub struct NetGrant {
    pub netns: OwnedFd,
    /// Whom the grant is for: a tool worker's grant of the same namespace is made in its name.
    pub target: NetProxyTarget,
    _keeper: OwnedFd,
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

/// Makes a network namespace with a listener of its own and hands the listener with `patterns`
/// to the proxy, in `target`'s session: the namespace's own, or one of its tool workers' (its
/// `tool NAME net proxy` list; the same session, so the same gate decisions and receipts).
pub fn grant(
    patterns: &[Pattern],
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
        patterns: patterns.iter().map(ToString::to_string).collect(),
        lineage: Some(target.lineage.clone()),
    };
    let ctl = dirs.control(CONTROL);
    let control = warren_proto::net::hand_over(&ctl, &record, listener.as_fd())
        .map_err(|e| io::Error::new(e.kind(), format!("net proxy: {e}")))?;
    let (ended, keeper) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    std::thread::Builder::new()
        .name("netgrant".into())
        .spawn(move || keep(control, &listener, &record, &ctl, &ended))?;
    Ok(NetGrant {
        netns,
        target: target.clone(),
        _keeper: keeper,
    })
}

/// The longest pause between two tries to hand the listener to a proxy that is not back yet.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Holds the proxy's session for the namespace's life (until `ended` reports its write end
/// closed); whenever the proxy closes the control connection first, hands the listener over
/// again, retrying with a doubling pause until a proxy takes it or the namespace ends.
fn keep(
    mut control: UnixStream,
    listener: &OwnedFd,
    record: &GrantRecord,
    ctl: &Path,
    ended: &OwnedFd,
) {
    loop {
        if !wait_for_the_proxys_end(&mut control, ended) {
            return;
        }
        tracing::warn!(
            namespace = record.namespace,
            "the egress proxy closed the namespace's grant; handing it over again"
        );
        let mut pause = Duration::from_millis(20);
        control = loop {
            if readable_within(ended, pause) {
                return;
            }
            match warren_proto::net::hand_over(ctl, record, listener.as_fd()) {
                Ok(c) => break c,
                Err(e) => tracing::debug!(namespace = record.namespace, "net proxy: {e}"),
            }
            pause = (pause * 2).min(RETRY_MAX);
        };
        tracing::info!(
            namespace = record.namespace,
            "the egress proxy has the grant again"
        );
    }
}

/// Blocks until the proxy closes `control` (true) or the namespace's grant is dropped (false).
fn wait_for_the_proxys_end(control: &mut UnixStream, ended: &OwnedFd) -> bool {
    loop {
        let mut fds = [
            PollFd::new(control.as_fd(), PollFlags::POLLIN),
            PollFd::new(ended.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return false;
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            // The proxy sends nothing after its `ok`: anything readable is its end.
            let mut buf = [0u8; 64];
            match control.read(&mut buf) {
                Ok(n) if n > 0 => continue,
                _ => return true,
            }
        }
    }
}

/// Whether `fd` becomes readable (for the pipe: its write end closed) within `pause`.
fn readable_within(fd: &OwnedFd, pause: Duration) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(pause).unwrap_or(PollTimeout::MAX);
    !matches!(
        poll(&mut fds, timeout),
        Ok(0) | Err(nix::errno::Errno::EINTR)
    )
}
