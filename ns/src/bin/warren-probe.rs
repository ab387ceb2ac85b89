//! warren-probe: performs ONE named escape attempt and prints one word on stdout:
//! `allowed` (the attempt worked), `blocked` (it was refused), or `broken` (the probe could not
//! even be attempted, e.g. a missing argument). The detail goes to stderr. The same binary runs
//! inside a namespace (expect `blocked`) and outside as a control (expect `allowed`), so a probe
//! that cannot detect the thing it tests shows up as a failing control.
//!
//! Probes reach the kernel with raw syscalls where libc would hide or emulate the call. The suite
//! that runs them is `docs/confinement.md`'s "The escape suite".
//!
//! Why one file: one binary, one small function per probe; the list is the escape suite's
//! vocabulary.

use std::ffi::CString;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

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

/// For privileged syscalls aimed at a path that does not exist: reaching the path lookup
/// (ENOENT) means the permission checks passed, i.e. the call is available.
fn reached_lookup(what: &str, r: libc::c_long) -> Outcome {
    if r == 0 {
        return Allowed(format!("{what}: succeeded"));
    }
    let e = errno();
    match e.raw_os_error() {
        Some(libc::ENOENT) => Allowed(format!("{what}: reached path lookup ({e})")),
        _ => Blocked(format!("{what}: {e}")),
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

const MISSING: &std::ffi::CStr = c"/nonexistent-warren-probe";

fn arg(args: &[String], i: usize, what: &str) -> Result<String, Outcome> {
    args.get(i)
        .cloned()
        .ok_or_else(|| Broken(format!("missing argument: {what}")))
}

fn cpath(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// Forks; the child runs `f` and exits with its code; returns the child's wait status.
fn in_child(f: impl FnOnce() -> i32) -> libc::c_int {
    // SAFETY: the probe is single-threaded; the child only runs `f` and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = f();
        // SAFETY: _exit never returns and is always safe.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
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
    let out = {
        match name {
            "mount" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        // A real tmpfs on an existing directory (run the control in `unshare -m`).
                        let dir = cpath(&arg(args, 0, "DIR")?);
                        let r = libc::syscall(
                            libc::SYS_mount,
                            c"none".as_ptr(),
                            dir.as_ptr(),
                            c"tmpfs".as_ptr(),
                            0,
                            0,
                        );
                        let out = sys_outcome("mount tmpfs", r);
                        if r == 0 {
                            libc::umount2(dir.as_ptr(), libc::MNT_DETACH);
                        }
                        out
                    }
                }
            }
            "umount" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let dir = cpath(&arg(args, 0, "MOUNTPOINT")?);
                        sys_outcome(
                            "umount2",
                            libc::syscall(libc::SYS_umount2, dir.as_ptr(), libc::MNT_DETACH),
                        )
                    }
                }
            }
            "chroot" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe { sys_outcome("chroot /", libc::syscall(libc::SYS_chroot, c"/".as_ptr())) }
            }
            "pivot_root" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    reached_lookup(
                        "pivot_root",
                        libc::syscall(libc::SYS_pivot_root, MISSING.as_ptr(), MISSING.as_ptr()),
                    )
                }
            }
            "unshare" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        // In a child, so a successful unshare changes nothing that matters.
                        let st = in_child(|| {
                            if libc::unshare(libc::CLONE_NEWNS) == 0 {
                                0
                            } else {
                                1
                            }
                        });
                        if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 {
                            Allowed("unshare(CLONE_NEWNS) worked".into())
                        } else {
                            Blocked("unshare(CLONE_NEWNS) refused".into())
                        }
                    }
                }
            }
            "userns" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let st = in_child(|| {
                            if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                                0
                            } else {
                                1
                            }
                        });
                        if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 {
                            Allowed("unshare(CLONE_NEWUSER) worked".into())
                        } else {
                            Blocked("unshare(CLONE_NEWUSER) refused".into())
                        }
                    }
                }
            }
            "clone-newns" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let r = libc::syscall(
                            libc::SYS_clone,
                            (libc::CLONE_NEWNS | libc::SIGCHLD) as libc::c_ulong,
                            0,
                            0,
                            0,
                            0,
                        );
                        if r == 0 {
                            libc::_exit(0);
                        }
                        if r > 0 {
                            libc::waitpid(r as i32, std::ptr::null_mut(), 0);
                        }
                        sys_outcome("clone(CLONE_NEWNS)", r)
                    }
                }
            }
            "clone3" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let mut args = [0u64; 11]; // struct clone_args, v2 size
                        args[4] = libc::SIGCHLD as u64; // exit_signal
                        let r = libc::syscall(
                            libc::SYS_clone3,
                            args.as_mut_ptr(),
                            std::mem::size_of_val(&args),
                        );
                        if r == 0 {
                            libc::_exit(0);
                        }
                        if r > 0 {
                            libc::waitpid(r as i32, std::ptr::null_mut(), 0);
                        }
                        sys_outcome("clone3", r)
                    }
                }
            }
            "setns" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let fd = libc::open(
                            c"/proc/self/ns/uts".as_ptr(),
                            libc::O_RDONLY | libc::O_CLOEXEC,
                        );
                        if fd < 0 {
                            return Err(Broken(format!("open /proc/self/ns/uts: {}", errno())));
                        }
                        sys_outcome(
                            "setns(own uts)",
                            libc::syscall(libc::SYS_setns, fd, libc::CLONE_NEWUTS),
                        )
                    }
                }
            }
            "ptrace" | "signal" | "proc-root" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let pid: i32 = arg(args, 0, "PID")?
                            .parse()
                            .map_err(|_| Broken("PID must be a number".into()))?;
                        match name {
                            "ptrace" => {
                                let r =
                                    libc::syscall(libc::SYS_ptrace, libc::PTRACE_ATTACH, pid, 0, 0);
                                if r == 0 {
                                    libc::waitpid(pid, std::ptr::null_mut(), libc::__WALL);
                                    libc::syscall(libc::SYS_ptrace, libc::PTRACE_DETACH, pid, 0, 0);
                                }
                                sys_outcome(&format!("ptrace attach {pid}"), r)
                            }
                            "signal" => {
                                sys_outcome(&format!("kill({pid}, 0)"), libc::kill(pid, 0) as _)
                            }
                            _ => match std::fs::read_dir(format!("/proc/{pid}/root")) {
                                Ok(_) => Allowed(format!("/proc/{pid}/root listed")),
                                Err(e) => Blocked(format!("/proc/{pid}/root: {e}")),
                            },
                        }
                    }
                }
            }
            "mknod" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let dir = arg(args, 0, "DIR")?;
                        let p = cpath(&format!("{dir}/probe-null"));
                        let r = libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3));
                        let out = sys_outcome("mknod char 1:3", r as _);
                        libc::unlink(p.as_ptr());
                        out
                    }
                }
            }
            "open_by_handle_at" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let mut buf = [0u8; 8 + 128];
                        buf[0..4].copy_from_slice(&128u32.to_ne_bytes());
                        let mut mount_id = 0i32;
                        let r = libc::syscall(
                            libc::SYS_name_to_handle_at,
                            libc::AT_FDCWD,
                            c"/".as_ptr(),
                            buf.as_mut_ptr(),
                            &mut mount_id as *mut i32,
                            0,
                        );
                        if r < 0 {
                            Blocked(format!("name_to_handle_at: {}", errno()))
                        } else {
                            let root =
                                libc::open(c"/".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
                            let r = libc::syscall(
                                libc::SYS_open_by_handle_at,
                                root,
                                buf.as_mut_ptr(),
                                libc::O_RDONLY,
                            );
                            sys_outcome("open_by_handle_at", r)
                        }
                    }
                }
            }
            "io_uring_setup" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let mut params = [0u8; 120];
                        let r = libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr());
                        sys_outcome("io_uring_setup", r)
                    }
                }
            }
            "bpf" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        // BPF_MAP_CREATE of a 1-entry array map.
                        let mut attr = [0u32; 32];
                        attr[0] = 2; // BPF_MAP_TYPE_ARRAY
                        attr[1] = 4; // key size
                        attr[2] = 4; // value size
                        attr[3] = 1; // max entries
                        let r = libc::syscall(
                            libc::SYS_bpf,
                            0,
                            attr.as_mut_ptr(),
                            std::mem::size_of_val(&attr),
                        );
                        sys_outcome("bpf(BPF_MAP_CREATE)", r)
                    }
                }
            }
            "keyctl" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        // KEYCTL_GET_KEYRING_ID(KEY_SPEC_USER_KEYRING, create=1)
                        sys_outcome("keyctl", libc::syscall(libc::SYS_keyctl, 0, -4, 1))
                    }
                }
            }
            "add_key" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    sys_outcome(
                        "add_key(user, process keyring)",
                        // KEY_SPEC_PROCESS_KEYRING = -2
                        libc::syscall(
                            libc::SYS_add_key,
                            c"user".as_ptr(),
                            c"warren-probe".as_ptr(),
                            c"v".as_ptr(),
                            1,
                            -2,
                        ),
                    )
                }
            }
            "perf_event_open" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let mut attr = [0u8; 128];
                        attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
                        attr[4..8].copy_from_slice(&128u32.to_ne_bytes()); // size
                        // config = PERF_COUNT_SW_CPU_CLOCK (0); flags: disabled | exclude_kernel | exclude_hv
                        let flags: u64 = 1 | (1 << 5) | (1 << 6);
                        attr[40..48].copy_from_slice(&flags.to_ne_bytes());
                        let r = libc::syscall(
                            libc::SYS_perf_event_open,
                            attr.as_mut_ptr(),
                            0,
                            -1,
                            -1,
                            0,
                        );
                        sys_outcome("perf_event_open", r)
                    }
                }
            }
            "tiocsti" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
                        if m < 0 || libc::grantpt(m) < 0 || libc::unlockpt(m) < 0 {
                            return Err(Broken(format!("pty: {}", errno())));
                        }
                        let name = libc::ptsname(m);
                        if name.is_null() {
                            return Err(Broken("ptsname".into()));
                        }
                        let s = libc::open(name, libc::O_RDWR | libc::O_NOCTTY);
                        if s < 0 {
                            return Err(Broken(format!("open pts: {}", errno())));
                        }
                        let c: u8 = b'x';
                        sys_outcome("ioctl(TIOCSTI)", libc::ioctl(s, libc::TIOCSTI, &c) as _)
                    }
                }
            }
            "core_pattern" => {
                {
                    // Opening for write is the test; nothing is written.
                    match std::fs::OpenOptions::new()
                        .write(true)
                        .open("/proc/sys/kernel/core_pattern")
                    {
                        Ok(_) => Allowed("core_pattern open for writing".into()),
                        Err(e) => Blocked(format!("core_pattern: {e}")),
                    }
                }
            }
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
            "x32" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let st = in_child(|| {
                            libc::syscall(0x4000_0000 | libc::SYS_getpid);
                            0
                        });
                        if libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGSYS {
                            Blocked("x32 syscall killed the process (SIGSYS)".into())
                        } else {
                            Allowed(format!("x32 syscall returned (status {st:#x})"))
                        }
                    }
                }
            }
            "reboot" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        // A bad magic: root reaches the magic check (EINVAL); nothing reboots.
                        let r = libc::syscall(libc::SYS_reboot, 0, 0, 0, 0);
                        reached_einval("reboot(bad magic)", r)
                    }
                }
            }
            "finit_module" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    reached_einval(
                        "finit_module(-1)",
                        libc::syscall(libc::SYS_finit_module, -1, c"".as_ptr(), 0),
                    )
                }
            }
            "kexec_load" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    reached_einval(
                        "kexec_load(bad flags)",
                        libc::syscall(libc::SYS_kexec_load, 0, 0, 0, 0xffff_0000u64),
                    )
                }
            }
            "sethostname" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        // Sets the hostname to what it already is: proves the right, changes nothing.
                        let mut buf = [0u8; 256];
                        libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len());
                        let len = buf.iter().position(|&b| b == 0).unwrap_or(0);
                        sys_outcome(
                            "sethostname(same)",
                            libc::sethostname(buf.as_ptr() as *const libc::c_char, len) as _,
                        )
                    }
                }
            }
            "setuid0" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe { sys_outcome("setuid(0)", libc::syscall(libc::SYS_setuid, 0)) }
            }
            "capset" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        // Raise CAP_SYS_ADMIN in effective+permitted.
                        let mut hdr = [0x2008_0522u32, 0]; // _LINUX_CAPABILITY_VERSION_3, pid 0
                        let bit = 1u32 << 21; // CAP_SYS_ADMIN
                        let mut data = [bit, bit, 0, 0, 0, 0];
                        sys_outcome(
                            "capset(CAP_SYS_ADMIN)",
                            libc::syscall(libc::SYS_capset, hdr.as_mut_ptr(), data.as_mut_ptr()),
                        )
                    }
                }
            }
            "fsopen" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    sys_outcome(
                        "fsopen(tmpfs)",
                        libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0),
                    )
                }
            }
            "open_tree" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    sys_outcome(
                        "open_tree(/, CLONE)",
                        libc::syscall(
                            libc::SYS_open_tree,
                            libc::AT_FDCWD,
                            c"/".as_ptr(),
                            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
                        ),
                    )
                }
            }
            "process_vm_readv" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    {
                        let pid: i32 = arg(args, 0, "PID")?
                            .parse()
                            .map_err(|_| Broken("PID must be a number".into()))?;
                        // Read one byte of the target's stack area via its /proc maps would need more;
                        // reading address 0 gives EFAULT once permitted, EPERM/ESRCH when not.
                        let mut b = [0u8; 1];
                        let local = libc::iovec {
                            iov_base: b.as_mut_ptr() as *mut libc::c_void,
                            iov_len: 1,
                        };
                        let remote = libc::iovec {
                            iov_base: std::ptr::null_mut(),
                            iov_len: 1,
                        };
                        let r = libc::syscall(
                            libc::SYS_process_vm_readv,
                            pid,
                            &local,
                            1,
                            &remote,
                            1,
                            0,
                        );
                        if r < 0 && errno().raw_os_error() == Some(libc::EFAULT) {
                            Allowed(format!(
                                "process_vm_readv {pid}: permitted (EFAULT at address 0)"
                            ))
                        } else {
                            sys_outcome(&format!("process_vm_readv {pid}"), r)
                        }
                    }
                }
            }
            "userfaultfd" => {
                // SAFETY: raw calls with pointers only to live locals and NUL-terminated
                // literals, sizes matching them; a forked child only calls _exit.
                unsafe {
                    sys_outcome(
                        "userfaultfd(USER_MODE_ONLY)",
                        libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | 1),
                    )
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
            other => return Err(Broken(format!("unknown probe `{other}`"))),
        }
    };
    Ok(out)
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
