//! warren-probe: performs ONE named escape attempt and prints one word on stdout:
//! `allowed` (the attempt worked), `blocked` (it was refused), or `broken` (the probe could not
//! even be attempted, e.g. a missing argument). The detail goes to stderr. The same binary runs
//! inside a namespace (expect `blocked`) and outside as a control (expect `allowed`), so a probe
//! that cannot detect the thing it tests shows up as a failing control.
//!
//! Probes reach the kernel with raw syscalls where libc would hide or emulate the call. The suite
//! that runs them is `docs/confinement.md`'s "The escape suite".
//!
//! It lives under `tests/`, outside the shipped crates and outside `warren-jail`: it is the
//! attacker, and its job is the raw syscalls and `unsafe` a jailed process would try, each with
//! a `// SAFETY:` line. Its probes are grouped by what they reach: [`namespaces`], [`kernel`],
//! [`files_net`].

mod files_net;
mod kernel;
mod namespaces;

use std::ffi::CString;
use std::io::{self, Write};
use std::process::ExitCode;

use nix::sys::wait::WaitStatus;
use nix::unistd::ForkResult;

enum Outcome {
    Allowed(String),
    Blocked(String),
    Broken(String),
}
use Outcome::*;

fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// A raw syscall's result as an outcome: success is "allowed", any error "blocked".
fn sys_outcome(what: &str, r: libc::c_long) -> Outcome {
    if r < 0 {
        Blocked(format!("{what}: {}", errno()))
    } else {
        Allowed(format!("{what}: returned {r}"))
    }
}

/// For privileged syscalls given an invalid argument: EINVAL/EBADF means the permission checks
/// passed and the kernel looked at the arguments.
fn reached_einval(what: &str, r: libc::c_long) -> Outcome {
    let e = errno();
    match (r, e.raw_os_error()) {
        (0.., _) => Allowed(format!("{what}: returned {r}")),
        (_, Some(libc::EINVAL | libc::EBADF | libc::ENOEXEC)) => {
            Allowed(format!("{what}: reached argument checks ({e})"))
        }
        _ => Blocked(format!("{what}: {e}")),
    }
}

const MISSING: &str = "/nonexistent-warren-probe";

fn arg(args: &[String], i: usize, what: &str) -> Result<String, Outcome> {
    args.get(i)
        .cloned()
        .ok_or_else(|| Broken(format!("missing argument: {what}")))
}

fn cpath(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// Forks; the child runs `f` and exits with its code; returns how the child ended.
fn in_child(f: impl FnOnce() -> i32) -> nix::Result<WaitStatus> {
    // SAFETY: the probe is single-threaded, so the child may run anything; it only runs `f`
    // and _exits.
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Child => {
            let code = f();
            // SAFETY: _exit ends the child at once, running no handler of the parent's.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => nix::sys::wait::waitpid(child, None),
    }
}

/// A nix call's result as an outcome: success is "allowed", any error "blocked".
fn nix_outcome<T>(what: &str, r: nix::Result<T>) -> Outcome {
    match r {
        Ok(_) => Allowed(format!("{what}: succeeded")),
        Err(e) => Blocked(format!("{what}: {}", io::Error::from(e))),
    }
}

/// For privileged syscalls aimed at a path that does not exist: reaching the path lookup
/// (ENOENT) means the permission checks passed, i.e. the call is available.
fn reached_lookup(what: &str, r: nix::Result<()>) -> Outcome {
    match r {
        Ok(()) => Allowed(format!("{what}: succeeded")),
        Err(nix::errno::Errno::ENOENT) => Allowed(format!(
            "{what}: reached path lookup ({})",
            io::Error::from(nix::errno::Errno::ENOENT)
        )),
        Err(e) => Blocked(format!("{what}: {}", io::Error::from(e))),
    }
}

/// The families `socket-family`/`socketpair-family` know, by name.
const SOCKET_FAMILIES: &[(&str, libc::c_int)] = &[
    ("unix", libc::AF_UNIX),
    ("inet", libc::AF_INET),
    ("inet6", libc::AF_INET6),
    ("netlink", libc::AF_NETLINK),
    ("packet", libc::AF_PACKET),
    ("vsock", libc::AF_VSOCK),
    ("xdp", libc::AF_XDP),
    ("alg", libc::AF_ALG),
    ("key", libc::AF_KEY),
    ("tipc", libc::AF_TIPC),
    ("bluetooth", libc::AF_BLUETOOTH),
    ("can", libc::AF_CAN),
];

fn probe(name: &str, args: &[String]) -> Result<Outcome, Outcome> {
    for family in [namespaces::probe, kernel::probe, files_net::probe] {
        if let Some(outcome) = family(name, args)? {
            return Ok(outcome);
        }
    }
    Err(Broken(format!("unknown probe `{name}`")))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((name, rest)) = args.split_first() else {
        eprintln!("usage: warren-probe NAME [ARGS…]");
        return ExitCode::from(2);
    };
    let outcome = probe(name, rest).unwrap_or_else(|o| o);
    let (word, detail) = match outcome {
        Allowed(d) => ("allowed", d),
        Blocked(d) => ("blocked", d),
        Broken(d) => ("broken", d),
    };
    let _ = writeln!(io::stderr(), "{name}: {detail}");
    println!("{word}");
    ExitCode::SUCCESS
}
