//! Probes of the network and the files a namespace sees: TCP, abstract sockets, socket
//! families, setuid bits, root's uid, a fork bomb, and plain reads and writes.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;

use crate::Outcome::{self, *};
use crate::{SOCKET_FAMILIES, arg, cpath, errno, sys_outcome};

/// This family's probe `name`, if it has one.
pub(crate) fn probe(name: &str, args: &[String]) -> Result<Option<Outcome>, Outcome> {
    Ok(Some(match name {
        "tcp-connect" => {
            let port: u16 = arg(args, 0, "PORT")?
                .parse()
                .map_err(|_| Broken("PORT".into()))?;
            match TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)) {
                Ok(_) => Allowed(format!("connected to 127.0.0.1:{port}")),
                Err(e) => Blocked(format!("connect 127.0.0.1:{port}: {e}")),
            }
        }
        "tcp-bind" => match TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)) {
            Ok(l) => Allowed(format!("bound {:?}", l.local_addr())),
            Err(e) => Blocked(format!("bind 127.0.0.1:0: {e}")),
        },
        "abstract-connect" => {
            use std::os::linux::net::SocketAddrExt;
            let name = arg(args, 0, "NAME")?;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(|e| Broken(e.to_string()))?;
            match UnixStream::connect_addr(&addr) {
                Ok(_) => Allowed(format!("connected to @{name}")),
                Err(e) => Blocked(format!("connect @{name}: {e}")),
            }
        }
        "setuid-bit" => {
            // SAFETY: raw calls with pointers only to live locals and NUL-terminated
            // literals, sizes matching them; a forked child only calls _exit.
            unsafe {
                {
                    // Try both ways a set-id bit gets onto a file: chmod, and create with the mode.
                    let dir = arg(args, 0, "DIR")?;
                    let a = format!("{dir}/probe-chmod");
                    let b = format!("{dir}/probe-creat");
                    let _ = std::fs::write(&a, b"#!/bin/sh\n");
                    let ca = cpath(&a);
                    let r1 = libc::chmod(ca.as_ptr(), 0o4755);
                    let cb = cpath(&b);
                    let fd = libc::open(cb.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o4755);
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    let bits = |p: &str| {
                        std::fs::metadata(p)
                            .map(|m| m.permissions().mode() & 0o6000)
                            .unwrap_or(0)
                    };
                    let (sa, sb) = (bits(&a), bits(&b));
                    if sa != 0 || sb != 0 {
                        Allowed(format!("set-id bits: chmod {sa:o}, create {sb:o}"))
                    } else {
                        Blocked(format!(
                            "no set-id bit (chmod returned {r1}, create fd {fd})"
                        ))
                    }
                }
            }
        }
        "euid-root" => {
            // SAFETY: raw calls with pointers only to live locals and NUL-terminated
            // literals, sizes matching them; a forked child only calls _exit.
            unsafe {
                {
                    // Run from a setuid-root copy of this binary: did exec grant euid 0?
                    let e = libc::geteuid();
                    if e == 0 {
                        Allowed("euid 0".into())
                    } else {
                        Blocked(format!("euid {e}"))
                    }
                }
            }
        }
        "forkbomb" => {
            // SAFETY: raw calls with pointers only to live locals and NUL-terminated
            // literals, sizes matching them; a forked child only calls _exit.
            unsafe {
                {
                    let max: usize = arg(args, 0, "MAX")?
                        .parse()
                        .map_err(|_| Broken("MAX".into()))?;
                    let mut kids = Vec::new();
                    let mut failure = None;
                    while kids.len() < max {
                        let pid = libc::fork();
                        if pid == 0 {
                            libc::pause();
                            libc::_exit(0);
                        }
                        if pid < 0 {
                            failure = Some(errno());
                            break;
                        }
                        kids.push(pid);
                    }
                    for &k in &kids {
                        libc::kill(k, libc::SIGKILL);
                        libc::waitpid(k, std::ptr::null_mut(), 0);
                    }
                    match failure {
                        Some(e) => {
                            Blocked(format!("fork failed after {} children: {e}", kids.len()))
                        }
                        None => Allowed(format!("forked {max} children")),
                    }
                }
            }
        }
        "raw-socket" => {
            // SAFETY: raw calls with pointers only to live locals and NUL-terminated
            // literals, sizes matching them; a forked child only calls _exit.
            unsafe {
                sys_outcome(
                    "socket(AF_PACKET, SOCK_RAW)",
                    libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) as _,
                )
            }
        }
        "socket-family" | "socketpair-family" => {
            let family = arg(args, 0, "FAMILY")?;
            let Some(&(_, domain)) = SOCKET_FAMILIES.iter().find(|(n, _)| *n == family) else {
                return Err(Broken(format!("unknown socket family `{family}`")));
            };
            let pair = name == "socketpair-family";
            let mut errors = Vec::new();
            let mut made = None;
            for ty in [
                libc::SOCK_DGRAM,
                libc::SOCK_RAW,
                libc::SOCK_STREAM,
                libc::SOCK_SEQPACKET,
            ] {
                let mut fds = [-1; 2];
                // SAFETY: socket takes no pointers; socketpair writes two ints into `fds`.
                let r = unsafe {
                    if pair {
                        libc::socketpair(domain, ty | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
                    } else {
                        libc::socket(domain, ty | libc::SOCK_CLOEXEC, 0)
                    }
                };
                if r >= 0 {
                    made = Some(ty);
                    break;
                }
                errors.push(format!("type {ty}: {}", errno()));
            }
            let what = format!("{name} AF_{}", family.to_uppercase());
            match made {
                Some(ty) => Allowed(format!("{what}: created (type {ty})")),
                None => Blocked(format!("{what}: {}", errors.join("; "))),
            }
        }
        "open-write" => {
            {
                // Opening for write is the test; nothing is written or created.
                let p = arg(args, 0, "PATH")?;
                match std::fs::OpenOptions::new().write(true).open(&p) {
                    Ok(_) => Allowed(format!("{p} open for writing")),
                    Err(e) => Blocked(format!("{p}: {e}")),
                }
            }
        }
        "read-some" => {
            use std::io::Read;
            let p = arg(args, 0, "PATH")?;
            let mut buf = [0u8; 64];
            match std::fs::File::open(&p).and_then(|mut f| f.read(&mut buf)) {
                Ok(0) => Blocked(format!("{p}: empty (masked)")),
                Ok(n) => Allowed(format!("read {n} bytes of {p}")),
                Err(e) => Blocked(format!("{p}: {e}")),
            }
        }
        "read" => {
            let p = arg(args, 0, "PATH")?;
            match std::fs::read(&p) {
                Ok(b) => Allowed(format!("read {} bytes of {p}", b.len())),
                Err(e) => Blocked(format!("{p}: {e}")),
            }
        }
        "write" => {
            let p = arg(args, 0, "PATH")?;
            match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
            {
                Ok(_) => Allowed(format!("opened {p} for writing")),
                Err(e) => Blocked(format!("{p}: {e}")),
            }
        }
        _ => return Ok(None),
    }))
}
