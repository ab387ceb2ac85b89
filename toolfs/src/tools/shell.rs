//! `shell {command, timeout_s?, cwd?}`: `/bin/sh -c command` as the worker's uid, as pid 1 of a
//! fresh pid namespace of its own (in a fresh user namespace, which is what lets the
//! unprivileged worker make one), in a new session, with the environment reduced to
//! [`ENV_KEPT`], stdin from /dev/null, and stdout and stderr interleaved on one pipe. Output
//! beyond [`OUTPUT_CAP`] keeps its head and tail with a marker between. The call ends when the
//! pipe closes and the shell has exited, or at the deadline; either way the shell is then killed
//! (SIGKILL), and with its pid 1 the kernel kills every process of the namespace: background
//! jobs, `setsid` children and their children never outlive their call.
//!
//! Each command is limited ([`CommandLimits`]): processes (RLIMIT_NPROC, counted per uid: the
//! worker runs as its namespace subtree's own uid, so this counts every command of the subtree),
//! address space (RLIMIT_AS, per process) and CPU time (RLIMIT_CPU, per process) — the tool's
//! defaults, or less where the calling namespace's `limit` line says less — and output: past
//! [`OUTPUT_LIMIT`] bytes the command is killed.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, pipe2};
use serde::Deserialize;

use super::resolve::{Target, describe, open_in_root};
use super::{CallScope, ToolContext, ToolOutput};

pub const DEFAULT_TIMEOUT_S: u64 = 120;
pub const MAX_TIMEOUT_S: u64 = 600;
/// The most output a call returns: the first and last half of it when there is more.
pub const OUTPUT_CAP: usize = 1 << 20;
/// The only environment variables a command sees (each only if the worker has it).
pub const ENV_KEPT: [&str; 7] = ["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER"];
/// And these too when the tool has the network (nsd puts its proxy listener's address there).
pub const PROXY_ENV_KEPT: [&str; 8] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// How often the worker looks for the shell's exit once its output has closed.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// The most output a command may write (stdout and stderr together); past it, it is killed.
pub const OUTPUT_LIMIT: u64 = 64 << 20;
/// The most processes a command may have at once (its subtree's commands together: per uid).
pub const DEFAULT_PROCESSES: u64 = 256;
/// The most address space each process of a command may map (RLIMIT_AS: virtual, not RSS).
pub const DEFAULT_MEMORY: u64 = 8 << 30;
/// The most CPU time each process of a command may use.
pub const DEFAULT_CPU_S: u64 = MAX_TIMEOUT_S;
/// Where nsd puts the calling namespace's limits in the worker's environment.
pub use warren_proto::worker::NAMESPACE_LIMITS_ENV;

/// What one command may use: the tool's defaults, lowered to the namespace's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandLimits {
    pub processes: u64,
    pub memory: u64,
    pub cpu_s: u64,
}

impl CommandLimits {
    /// The defaults lowered by `namespace` (the [`NAMESPACE_LIMITS_ENV`] value). A word that
    /// does not parse is an error: a command never runs with less confinement than asked for.
    pub fn lowered_by(namespace: Option<&str>) -> Result<CommandLimits, String> {
        let mut limits = CommandLimits {
            processes: DEFAULT_PROCESSES,
            memory: DEFAULT_MEMORY,
            cpu_s: DEFAULT_CPU_S,
        };
        for word in namespace.unwrap_or_default().split_whitespace() {
            let parsed = word
                .split_once('=')
                .and_then(|(k, v)| Some((k, v.parse::<u64>().ok()?)));
            let slot = match parsed {
                Some(("pids", v)) => (&mut limits.processes, v),
                Some(("mem", v)) => (&mut limits.memory, v),
                Some(("cpu", v)) => (&mut limits.cpu_s, v),
                _ => return Err(format!("bad namespace limit `{word}`")),
            };
            *slot.0 = (*slot.0).min(slot.1);
        }
        Ok(limits)
    }

    fn from_env() -> Result<CommandLimits, String> {
        CommandLimits::lowered_by(std::env::var(NAMESPACE_LIMITS_ENV).ok().as_deref())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    command: String,
    timeout_s: Option<u64>,
    cwd: Option<String>,
}

/// Runs one command; the scope hears its process group id as soon as it exists.
pub fn run(ctx: &ToolContext, args: &str, scope: &mut CallScope<'_>) -> ToolOutput {
    let args: Args = match serde_json::from_str(args) {
        Ok(args) => args,
        Err(e) => return ToolOutput::error(format!("shell: bad arguments: {e}")),
    };
    let timeout_s = args.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
        return ToolOutput::error(format!(
            "shell: timeout_s must be 1..={MAX_TIMEOUT_S}, not {timeout_s}"
        ));
    }
    let cwd = match working_dir(ctx, args.cwd.as_deref()) {
        Ok(fd) => fd,
        Err(e) => return ToolOutput::error(e),
    };
    let deadline = scope
        .deadline
        .min(Instant::now() + Duration::from_secs(timeout_s));
    let limits = match CommandLimits::from_env() {
        Ok(l) => l,
        Err(e) => return ToolOutput::error(format!("shell: {e}")),
    };
    let kept: Vec<&str> = if ctx.network {
        ENV_KEPT.iter().chain(&PROXY_ENV_KEPT).copied().collect()
    } else {
        ENV_KEPT.to_vec()
    };
    match execute(&args.command, &cwd, deadline, limits, &kept, scope) {
        Ok(out) => out,
        Err(e) => ToolOutput::error(format!("shell: {e}")),
    }
}

/// The command's working directory as a dir fd inside a root (default: the first root).
fn working_dir(ctx: &ToolContext, cwd: Option<&str>) -> Result<OwnedFd, String> {
    match (cwd, ctx.roots.first()) {
        (Some(path), _) => Target::new(ctx, path)?.open_directory(),
        (None, Some(root)) => open_in_root(root, ".", OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| describe(e, &root.path)),
        (None, None) => Err("shell: this tool has no roots to run in".into()),
    }
}

fn execute(
    command: &str,
    cwd: &OwnedFd,
    deadline: Instant,
    limits: CommandLimits,
    kept: &[&str],
    scope: &mut CallScope<'_>,
) -> std::io::Result<ToolOutput> {
    let started = Instant::now();
    let (group, reader) = spawn_shell(command, cwd, limits, kept)?;
    (scope.on_started)(group.as_raw());
    let caller = scope.caller;

    let mut output = OutputCap::default();
    let mut pipe = std::fs::File::from(reader);
    let mut buf = vec![0u8; 64 * 1024];
    let mut end = End::Finished;
    'read: loop {
        let Some(left) = remaining(deadline) else {
            end = End::TimedOut;
            break 'read;
        };
        let mut fds = [
            PollFd::new(pipe.as_fd(), PollFlags::POLLIN),
            PollFd::new(caller, PollFlags::empty()),
        ];
        match poll(&mut fds, poll_timeout(left)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        if hung_up(&fds[1]) {
            end = End::CallerGone;
            break 'read;
        }
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break 'read,
                Ok(n) => {
                    output.push(&buf[..n]);
                    if output.total > OUTPUT_LIMIT {
                        end = End::OutputLimit;
                        break 'read;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    while matches!(end, End::Finished) && !has_exited(group)? {
        let Some(left) = remaining(deadline) else {
            end = End::TimedOut;
            break;
        };
        let mut fds = [PollFd::new(caller, PollFlags::empty())];
        match poll(&mut fds, poll_timeout(left.min(EXIT_POLL))) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        if hung_up(&fds[0]) {
            end = End::CallerGone;
        }
    }
    // Whatever happened, nothing of this call outlives it: killing the shell, pid 1 of the
    // command's pid namespace, kills the whole namespace; the group kill covers a planted run
    // without one. The shell is not reaped yet, so its pid cannot have been reused.
    match nix::sys::signal::kill(group, Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => return Err(e.into()),
    }
    match killpg(group, Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) | Err(Errno::EPERM) => {}
        Err(e) => return Err(e.into()),
    }
    let status = reap(group)?;
    let mut content = output.finish();
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    match end {
        End::Finished => {}
        End::TimedOut => {
            let limit = deadline.saturating_duration_since(started).as_secs_f64();
            content.push_str(&format!(
                "[shell: timed out after {limit:.1} s; its process group was killed]"
            ));
            return Ok(ToolOutput { ok: false, content });
        }
        End::CallerGone => {
            content.push_str("[shell: toolfs went away; its process group was killed]");
            return Ok(ToolOutput { ok: false, content });
        }
        End::OutputLimit => {
            content.push_str(&format!(
                "[shell: more than {OUTPUT_LIMIT} bytes of output; its process group was killed]"
            ));
            return Ok(ToolOutput { ok: false, content });
        }
    }
    match status {
        WaitStatus::Exited(_, code) => {
            content.push_str(&format!("[exit status {code}]"));
            Ok(ToolOutput {
                ok: code == 0,
                content,
            })
        }
        WaitStatus::Signaled(_, signal, _) => {
            content.push_str(&format!("[killed by signal {}]", signal as i32));
            Ok(ToolOutput { ok: false, content })
        }
        _ => {
            content.push_str("[ended without a status]");
            Ok(ToolOutput { ok: false, content })
        }
    }
}

/// Whether the shell has exited, without reaping it (WNOWAIT).
fn has_exited(pid: Pid) -> std::io::Result<bool> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(pid), flags) {
        Ok(WaitStatus::StillAlive) => Ok(false),
        Ok(_) => Ok(true),
        Err(Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Debug builds only: with this set in the worker's environment, commands get no pid namespace
/// (a planted violation, so a test can show that `setsid` then escapes the kill). nsd starts
/// workers with a fixed environment, so no confined worker ever sees it.
pub const PLANT_NO_PID_NAMESPACE: &str = "WARREN_PLANT_SHELL_WITHOUT_PIDNS";

fn pid_namespace_flags() -> libc::c_int {
    if cfg!(debug_assertions) && std::env::var_os(PLANT_NO_PID_NAMESPACE).is_some() {
        0
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWPID
    }
}

fn cstring(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the command or its environment holds a NUL byte",
        )
    })
}

/// Starts `/bin/sh -c command` as pid 1 of a fresh pid namespace (inside a user namespace of its
/// own: the unprivileged worker may make one, and nothing else), in its own session, with the
/// reduced environment (the worker's variables named in `kept`), `cwd` as its working directory and one pipe for stdout and stderr.
/// When that pid 1 dies — it exits, or the worker kills it — the kernel kills every process of
/// the namespace, `setsid` children included. Every process of it inherits `limits`. Returns its
/// pid and the pipe's read end.
fn spawn_shell(
    command: &str,
    cwd: &OwnedFd,
    limits: CommandLimits,
    kept: &[&str],
) -> std::io::Result<(Pid, OwnedFd)> {
    let (reader, writer) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    // The write end must block for the command (a non-blocking stdout surprises programs).
    nix::fcntl::fcntl(&writer, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))?;
    let null = nix::fcntl::open(
        "/dev/null",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let argv = [cstring("/bin/sh")?, cstring("-c")?, cstring(command)?];
    let mut env = Vec::new();
    for &name in kept {
        if let Some(value) = std::env::var(name).ok().filter(|v| !v.contains('\0')) {
            env.push(cstring(&format!("{name}={value}"))?);
        }
    }
    if std::env::var_os("PATH").is_none() {
        env.push(cstring(&format!("PATH={DEFAULT_PATH}"))?);
    }
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let env_ptrs: Vec<*const libc::c_char> = env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let (null_fd, out_fd, cwd_fd) = (null.as_raw_fd(), writer.as_raw_fd(), cwd.as_raw_fd());
    let rlimit = |n: u64| libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    let rlimits = [
        (libc::RLIMIT_NPROC, rlimit(limits.processes)),
        (libc::RLIMIT_AS, rlimit(limits.memory)),
        (libc::RLIMIT_CPU, rlimit(limits.cpu_s)),
    ];
    let flags = (pid_namespace_flags() | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: clone without CLONE_VM and with a null stack is fork(): the child gets a copy of
    // this (single-threaded) worker's memory. The child only makes async-signal-safe syscalls
    // (setrlimit, dup2, fchdir, setsid, prctl, execve, _exit) on values computed before the clone — the
    // argv and env pointer arrays stay alive in the parent's copy too — and allocates nothing.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; every call here is a plain syscall wrapper, and the process ends
        // in execve or _exit.
        unsafe {
            for (resource, value) in &rlimits {
                if libc::setrlimit(*resource, value) != 0 {
                    libc::_exit(126);
                }
            }
            if libc::dup2(null_fd, 0) < 0
                || libc::dup2(out_fd, 1) < 0
                || libc::dup2(out_fd, 2) < 0
                || libc::fchdir(cwd_fd) != 0
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
            libc::execve(argv_ptrs[0], argv_ptrs.as_ptr(), env_ptrs.as_ptr());
            libc::_exit(127);
        }
    }
    // Our copy of the pipe's write end goes now, so EOF means every writer is gone.
    drop(writer);
    Ok((Pid::from_raw(pid as i32), reader))
}

/// Reaps the command's pid 1; its wait status.
fn reap(pid: Pid) -> std::io::Result<WaitStatus> {
    loop {
        match waitpid(pid, None) {
            Err(Errno::EINTR) => continue,
            other => return other.map_err(Into::into),
        }
    }
}

/// How a command's call ended.
enum End {
    /// Its output closed and the shell exited.
    Finished,
    TimedOut,
    /// toolfs closed the worker's socket: nobody waits for the answer any more.
    CallerGone,
    /// It wrote more than [`OUTPUT_LIMIT`] bytes.
    OutputLimit,
}

/// Whether toolfs's end of the socket is gone. Polled for no events: POLLHUP and POLLERR are
/// always reported, and a closed (or fully shut down) peer of a Unix stream socket sets POLLHUP,
/// while a queued next call (POLLIN, not asked for) does not wake us.
fn hung_up(fd: &PollFd<'_>) -> bool {
    fd.revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
}

fn remaining(deadline: Instant) -> Option<Duration> {
    let now = Instant::now();
    (now < deadline).then(|| deadline - now)
}

fn poll_timeout(left: Duration) -> PollTimeout {
    let ms = (left.as_millis() + 1).min(i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

/// Keeps the first and the last `OUTPUT_CAP / 2` bytes and counts the rest.
#[derive(Default)]
struct OutputCap {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl OutputCap {
    const HALF: usize = OUTPUT_CAP / 2;

    fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = Self::HALF - self.head.len();
        let into_head = room.min(data.len());
        self.head.extend_from_slice(&data[..into_head]);
        data = &data[into_head..];
        self.tail.extend(data);
        let excess = self.tail.len().saturating_sub(Self::HALF);
        self.tail.drain(..excess);
    }

    fn finish(self) -> String {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let mut bytes = self.head;
        if self.total > kept {
            bytes.extend_from_slice(
                format!(
                    "\n[shell: {} bytes of output elided; the first and last {} bytes are shown]\n",
                    self.total - kept,
                    Self::HALF
                )
                .as_bytes(),
            );
        }
        bytes.extend(self.tail);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_only_lowers_the_defaults() {
        let defaults = CommandLimits::lowered_by(None).unwrap();
        assert_eq!(defaults.processes, DEFAULT_PROCESSES);
        let lowered = CommandLimits::lowered_by(Some("pids=16 mem=67108864")).unwrap();
        assert_eq!(lowered.processes, 16);
        assert_eq!(lowered.memory, 64 << 20);
        assert_eq!(lowered.cpu_s, DEFAULT_CPU_S);
        let higher = CommandLimits::lowered_by(Some("pids=100000 cpu=100000")).unwrap();
        assert_eq!(higher, defaults);
        for bad in ["pids", "pids=x", "disk=1"] {
            assert!(CommandLimits::lowered_by(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn cap_keeps_head_and_tail() {
        let mut cap = OutputCap::default();
        cap.push(&vec![b'h'; OutputCap::HALF]);
        cap.push(&vec![b'm'; 3 * OutputCap::HALF]);
        cap.push(b"TAIL");
        let text = cap.finish();
        assert!(text.starts_with('h'));
        assert!(text.ends_with("mTAIL"));
        assert!(text.contains(&format!(
            "{} bytes of output elided",
            2 * OutputCap::HALF + 4
        )));
        assert!(text.len() < OUTPUT_CAP + 200);
        let mut small = OutputCap::default();
        small.push(b"abc");
        assert_eq!(small.finish(), "abc");
    }
}
