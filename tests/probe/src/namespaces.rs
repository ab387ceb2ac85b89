//! Probes of the mount table, the namespaces and other processes: mount, umount, chroot,
//! pivot_root, unshare, clone, setns, ptrace and signals.

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::ptrace;
use nix::sys::signal::kill;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::Outcome::{self, *};
use crate::{MISSING, arg, in_child, nix_outcome, reached_lookup, sys_outcome};

/// This family's probe `name`, if it has one.
pub(crate) fn probe(name: &str, args: &[String]) -> Result<Option<Outcome>, Outcome> {
    Ok(Some(match name {
        "mount" => {
            // A real tmpfs on an existing directory (run the control in `unshare -m`).
            let dir = arg(args, 0, "DIR")?;
            let r = mount(
                Some("none"),
                dir.as_str(),
                Some("tmpfs"),
                MsFlags::empty(),
                None::<&str>,
            );
            let worked = r.is_ok();
            let out = nix_outcome("mount tmpfs", r);
            if worked {
                let _ = umount2(dir.as_str(), MntFlags::MNT_DETACH);
            }
            out
        }
        "umount" => {
            let dir = arg(args, 0, "MOUNTPOINT")?;
            nix_outcome("umount2", umount2(dir.as_str(), MntFlags::MNT_DETACH))
        }
        "chroot" => nix_outcome("chroot /", nix::unistd::chroot("/")),
        "pivot_root" => reached_lookup("pivot_root", nix::unistd::pivot_root(MISSING, MISSING)),
        // In a child, so a successful unshare changes nothing that matters.
        "unshare" => match in_child(|| i32::from(unshare(CloneFlags::CLONE_NEWNS).is_err())) {
            Ok(WaitStatus::Exited(_, 0)) => Allowed("unshare(CLONE_NEWNS) worked".into()),
            _ => Blocked("unshare(CLONE_NEWNS) refused".into()),
        },
        "userns" => match in_child(|| i32::from(unshare(CloneFlags::CLONE_NEWUSER).is_err())) {
            Ok(WaitStatus::Exited(_, 0)) => Allowed("unshare(CLONE_NEWUSER) worked".into()),
            _ => Blocked("unshare(CLONE_NEWUSER) refused".into()),
        },
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
            let own = std::fs::File::open("/proc/self/ns/uts")
                .map_err(|e| Broken(format!("open /proc/self/ns/uts: {e}")))?;
            nix_outcome("setns(own uts)", setns(&own, CloneFlags::CLONE_NEWUTS))
        }
        "ptrace" | "signal" | "proc-root" => {
            let pid: i32 = arg(args, 0, "PID")?
                .parse()
                .map_err(|_| Broken("PID must be a number".into()))?;
            let pid = Pid::from_raw(pid);
            match name {
                "ptrace" => {
                    let r = ptrace::attach(pid);
                    if r.is_ok() {
                        let _ = waitpid(pid, Some(WaitPidFlag::__WALL));
                        let _ = ptrace::detach(pid, None);
                    }
                    nix_outcome(&format!("ptrace attach {pid}"), r)
                }
                "signal" => nix_outcome(&format!("kill({pid}, 0)"), kill(pid, None)),
                _ => match std::fs::read_dir(format!("/proc/{pid}/root")) {
                    Ok(_) => Allowed(format!("/proc/{pid}/root listed")),
                    Err(e) => Blocked(format!("/proc/{pid}/root: {e}")),
                },
            }
        }
        _ => return Ok(None),
    }))
}
