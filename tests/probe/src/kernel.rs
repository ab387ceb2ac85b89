//! Probes of the kernel's wider surface: device nodes, file handles, io_uring, bpf, keys, perf,
//! the terminal, core_pattern, x32, reboot, modules, kexec, the hostname, uids and
//! capabilities, the new mount API, other processes' memory and userfaultfd.

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;

use crate::Outcome::{self, *};
use crate::{arg, errno, in_child, nix_outcome, reached_einval, sys_outcome};

/// This family's probe `name`, if it has one.
pub(crate) fn probe(name: &str, args: &[String]) -> Result<Option<Outcome>, Outcome> {
    Ok(Some(match name {
        "mknod" => {
            let dir = arg(args, 0, "DIR")?;
            let p = format!("{dir}/probe-null");
            let kind = nix::sys::stat::SFlag::S_IFCHR;
            let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
            let r = nix::sys::stat::mknod(p.as_str(), kind, mode, nix::sys::stat::makedev(1, 3));
            let out = nix_outcome("mknod char 1:3", r);
            let _ = nix::unistd::unlink(p.as_str());
            out
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
                        let root = libc::open(c"/".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
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
                    let r =
                        libc::syscall(libc::SYS_perf_event_open, attr.as_mut_ptr(), 0, -1, -1, 0);
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
        "x32" => {
            let st = in_child(|| {
                // SAFETY: getpid by its x32 number takes no argument and touches no memory.
                unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
                0
            });
            match st {
                Ok(WaitStatus::Signaled(_, Signal::SIGSYS, _)) => {
                    Blocked("x32 syscall killed the process (SIGSYS)".into())
                }
                other => Allowed(format!("x32 syscall returned ({other:?})")),
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
            // Sets the hostname to what it already is: proves the right, changes nothing.
            let same =
                nix::unistd::gethostname().map_err(|e| Broken(format!("gethostname: {e}")))?;
            nix_outcome("sethostname(same)", nix::unistd::sethostname(same))
        }
        "setuid0" => nix_outcome("setuid(0)", nix::unistd::setuid(0.into())),
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
            let pid: i32 = arg(args, 0, "PID")?
                .parse()
                .map_err(|_| Broken("PID must be a number".into()))?;
            // Reading address 0 gives EFAULT once permitted, EPERM/ESRCH when not.
            let mut b = [0u8; 1];
            let r = nix::sys::uio::process_vm_readv(
                nix::unistd::Pid::from_raw(pid),
                &mut [std::io::IoSliceMut::new(&mut b)],
                &[nix::sys::uio::RemoteIoVec { base: 0, len: 1 }],
            );
            match r {
                Err(nix::errno::Errno::EFAULT) => Allowed(format!(
                    "process_vm_readv {pid}: permitted (EFAULT at address 0)"
                )),
                r => nix_outcome(&format!("process_vm_readv {pid}"), r),
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
        _ => return Ok(None),
    }))
}
