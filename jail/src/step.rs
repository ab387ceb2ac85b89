//! The steps of the confinement sequence by name, and how a failed one is reported: a
//! [`SetupError`] naming its [`Step`], written to the launcher's error pipe before `_exit`.

use std::fmt;
use std::os::fd::OwnedFd;

use crate::process;

/// Exit code of a process that failed before its command's exec (the message is on the pipe).
pub const SETUP_FAILED: i32 = 125;
/// Exit code of a payload that failed in its last steps (signals, tty, rlimits, cwd, exec).
pub const EXEC_FAILED: i32 = 127;

/// One step of the sequence, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Non-dumpable before anything of the namespace can see the process (attach).
    Dumpable,
    Stdio,
    CloseFds,
    Cgroup,
    Namespaces,
    /// Joining a live namespace through its holder's pidfd (attach).
    Join,
    PrivateRoot,
    BlockSignals,
    ForkPid1,
    RootTmpfs,
    TmpAndHome,
    Etc,
    Binds,
    Dev,
    Proc,
    FuseMounts,
    Pivot,
    Pty,
    Loopback,
    Hostname,
    /// Handles opened in the new root for the command (a worker's roots).
    OpenHandles,
    DropPrivileges,
    NoNewPrivs,
    Landlock,
    Seccomp,
    ForkPayload,
    UnblockSignals,
    ControllingTty,
    Rlimits,
    Chdir,
    Command,
    KeepFds,
    Exec,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Dumpable => "non-dumpable",
            Step::Stdio => "stdio",
            Step::CloseFds => "closing inherited fds",
            Step::Cgroup => "cgroup",
            Step::Namespaces => "namespaces",
            Step::Join => "joining the namespace",
            Step::PrivateRoot => "private /",
            Step::BlockSignals => "blocking signals",
            Step::ForkPid1 => "fork pid 1",
            Step::RootTmpfs => "root tmpfs",
            Step::TmpAndHome => "/tmp and home",
            Step::Etc => "/etc",
            Step::Binds => "binds",
            Step::Dev => "/dev",
            Step::Proc => "/proc",
            Step::FuseMounts => "9P mounts",
            Step::Pivot => "into the new root",
            Step::Pty => "pty",
            Step::Loopback => "bringing lo up",
            Step::Hostname => "sethostname",
            Step::OpenHandles => "opening handles",
            Step::DropPrivileges => "dropping privileges",
            Step::NoNewPrivs => "no_new_privs",
            Step::Landlock => "landlock",
            Step::Seccomp => "seccomp",
            Step::ForkPayload => "fork payload",
            Step::UnblockSignals => "unblocking signals",
            Step::ControllingTty => "controlling tty",
            Step::Rlimits => "rlimits",
            Step::Chdir => "chdir",
            Step::Command => "command",
            Step::KeepFds => "passing fds",
            Step::Exec => "exec",
        })
    }
}

/// A setup step that failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct SetupError {
    pub step: Step,
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// `.at(step)`: a step's own error, named.
pub trait AtStep<T> {
    fn at(self, step: Step) -> Result<T, SetupError>;
}

impl<T, E: Into<Box<dyn std::error::Error + Send + Sync>>> AtStep<T> for Result<T, E> {
    fn at(self, step: Step) -> Result<T, SetupError> {
        self.map_err(|e| SetupError {
            step,
            source: e.into(),
        })
    }
}

/// Writes `e` to the error pipe and `_exit`s with `code`.
pub fn report(err_pipe: &Option<OwnedFd>, e: &SetupError, code: i32) -> ! {
    if let Some(pipe) = err_pipe {
        let _ = nix::unistd::write(pipe, e.to_string().as_bytes());
    }
    process::exit_now(code)
}
