//! A command started as pid 1 of a fresh pid namespace (inside a user namespace of its own,
//! which is what lets an unprivileged process make one), so that when it dies the kernel kills
//! every process of the namespace, `setsid` children included.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::resource::Resource;
use nix::unistd::Pid;

/// What [`spawn_pid1`] starts, and how.
pub struct Pid1Command<'a> {
    /// argv[0] is the program's path (execve: no PATH lookup).
    pub argv: &'a [CString],
    /// `NAME=value` entries, the whole environment.
    pub env: &'a [CString],
    /// Its stdin.
    pub stdin: BorrowedFd<'a>,
    /// Its stdout and stderr, both.
    pub output: BorrowedFd<'a>,
    /// Its working directory.
    pub cwd: BorrowedFd<'a>,
    /// Soft and hard limit of each resource, set before the exec (inherited by all it starts).
    pub rlimits: &'a [(Resource, u64)],
    /// False runs it in this process's pid namespace instead (a test's planted violation).
    pub new_pid_namespace: bool,
}

/// Forks (clone without CLONE_VM: fork, with namespace flags) a child that sets its limits, takes
/// `stdin`/`output` as fds 0-2 and `cwd` as its directory, starts a session of its own, asks for
/// SIGKILL when this thread dies, and execs `argv`. A child step that fails exits 126, a failed
/// exec 127. Returns the child's pid (reap it with waitpid). Call from a single-threaded process.
pub fn spawn_pid1(cmd: &Pid1Command<'_>) -> io::Result<Pid> {
    if cmd.argv.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty argv"));
    }
    // Everything the child uses is computed here, before the clone: it allocates nothing.
    let (argv, env) = (null_terminated(cmd.argv), null_terminated(cmd.env));
    let rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)> = cmd
        .rlimits
        .iter()
        .map(|&(r, n)| {
            (
                r as libc::__rlimit_resource_t,
                libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                },
            )
        })
        .collect();
    let (stdin, output, cwd) = (
        cmd.stdin.as_raw_fd(),
        cmd.output.as_raw_fd(),
        cmd.cwd.as_raw_fd(),
    );
    let namespaces = if cmd.new_pid_namespace {
        libc::CLONE_NEWUSER | libc::CLONE_NEWPID
    } else {
        0
    };
    let flags = (namespaces | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: clone without CLONE_VM and with a null stack is fork(): the child gets a copy of
    // this (single-threaded) process's memory. The child only makes async-signal-safe syscalls
    // (setrlimit, dup2, fchdir, setsid, prctl, execve, _exit) on values computed before the
    // clone — the argv and env pointer arrays stay alive in the parent's copy too — and
    // allocates nothing.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; every call here is a plain syscall wrapper on integers and on the
        // pointer arrays built before the clone, and the process ends in execve or _exit.
        unsafe {
            for (resource, value) in &rlimits {
                if libc::setrlimit(*resource, value) != 0 {
                    libc::_exit(126);
                }
            }
            if libc::dup2(stdin, 0) < 0
                || libc::dup2(output, 1) < 0
                || libc::dup2(output, 2) < 0
                || libc::fchdir(cwd) != 0
                || libc::setsid() < 0
                || libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
            {
                libc::_exit(126);
            }
            libc::execve(argv[0], argv.as_ptr(), env.as_ptr());
            libc::_exit(127);
        }
    }
    Ok(Pid::from_raw(pid as i32))
}

/// execve's form of a list of strings: their pointers, then a null one.
fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}
