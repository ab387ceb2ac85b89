//! Step 7: the namespace's pid 1. It forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT to the payload,
//! reaps every orphan, kills what is left when the payload ends (or at the wall-clock limit),
//! and exits with the payload's status (128+N for a signal). The launcher-side process that
//! holds the namespaces uses the same loop to wait for pid 1.

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.add(Signal::SIGCHLD);
    set.add(Signal::SIGALRM);
    set
}

/// Blocks the signals `supervise` waits for; call before forking the child it will supervise.
pub fn block_signals() -> Result<(), String> {
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None)
        .map_err(|e| format!("blocking signals: {e}"))
}

/// In a freshly forked child: unblock everything before exec.
pub fn unblock_all() -> Result<(), String> {
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(|e| format!("unblocking signals: {e}"))
}

/// Waits for `child` (this process's own) and returns its exit status, 128+N for signal N.
pub fn wait_exit_code(child: Pid) -> std::io::Result<i32> {
    let status = waitpid(child, None)?;
    status_code(status)
        .ok_or_else(|| std::io::Error::other(format!("unexpected wait status {status:?}")))
}

fn status_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

/// Waits for `child`, forwarding signals; returns its exit code. As pid 1 (`reap_all`), also
/// reaps orphans and kills every remaining process of the namespace once `child` is gone.
pub fn supervise(child: Pid, wall_seconds: Option<u64>, reap_all: bool) -> i32 {
    if let Some(secs) = wall_seconds {
        nix::unistd::alarm::set(u32::try_from(secs).unwrap_or(u32::MAX));
    }
    let set = handled();
    loop {
        let sig = match set.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        match sig {
            Signal::SIGCHLD => {
                if let Some(code) = reap(child, reap_all) {
                    if reap_all {
                        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
                        while !matches!(waitpid(None, None), Err(Errno::ECHILD)) {}
                    }
                    return code;
                }
            }
            Signal::SIGALRM => {
                // Wall-clock limit: everything in the namespace goes.
                let target = if reap_all { Pid::from_raw(-1) } else { child };
                let _ = kill(target, Signal::SIGKILL);
            }
            other => {
                let _ = kill(child, other);
            }
        }
    }
}

/// Reaps what has exited; Some(code) once `child` has.
fn reap(child: Pid, reap_all: bool) -> Option<i32> {
    let mut result = None;
    loop {
        let who = if reap_all { None } else { Some(child) };
        match waitpid(who, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return result,
            Ok(st) => {
                if st.pid() == Some(child)
                    && let Some(code) = status_code(st)
                {
                    result = Some(code);
                }
            }
        }
    }
}
