//! The worker binary as a plain child process of this one, in no namespace of its own: for the
//! worker binary's and the tools' own tests. toolfs's dispatch never uses it.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::{
    Launched, Teardown, ToolAuthority, Worker, check_root_path, check_tool, worker_program,
};

impl Worker {
    /// Starts the worker binary as a plain child process of this one, under uid/gid (never 0),
    /// in no namespace of its own. For the worker binary's and the tools' own tests only:
    /// toolfs's dispatch never calls it — its workers are built by nsd ([`nsd::WorkerBuilder`]),
    /// and a call whose worker nsd cannot build is refused.
    pub fn spawn_unconfined(
        tool: &str,
        authority: &ToolAuthority,
        uid: u32,
        gid: u32,
    ) -> io::Result<Worker> {
        Worker::spawn_unconfined_with_env(tool, authority, uid, gid, &[])
    }

    /// [`Worker::spawn_unconfined`] with `extra_env` set for the worker (a test's planted knob,
    /// such as [`crate::tools::shell::PLANT_NO_PID_NAMESPACE`]).
    pub fn spawn_unconfined_with_env(
        tool: &str,
        authority: &ToolAuthority,
        uid: u32,
        gid: u32,
        extra_env: &[(&str, &str)],
    ) -> io::Result<Worker> {
        if uid == 0 || gid == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "refusing to run the {tool} worker as uid {uid} gid {gid}: tool workers never run as 0"
                ),
            ));
        }
        check_tool(tool)?;
        for root in &authority.roots {
            check_root_path(&root.path)?;
        }
        let program = worker_program()?;
        let (ours, theirs) = UnixStream::pair()?;
        let mut sources: Vec<RawFd> = vec![theirs.as_raw_fd()];
        // The worker finds them by the numbers on its argv: socket first, then root i.
        sources.extend(authority.roots.iter().map(|r| r.dir.as_raw_fd()));
        let mut command = Command::new(&program);
        command.arg(tool);
        for fd in &sources {
            command.arg(fd.to_string());
        }
        command
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Its own process group: a terminal's ^C to our group does not reach it.
            .process_group(0);
        for name in crate::tools::shell::ENV_KEPT {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command.envs(extra_env.iter().copied());
        // Exactly these fds (open in the parent for the whole spawn) reach the worker, at the
        // numbers argv names; no fd is moved, so nothing std holds in the child is clobbered.
        warren_jail::child::BeforeExec::new()
            .keep_fds(sources)
            .install(&mut command);
        let child = command.spawn().map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start {}: {e}", program.display()))
        })?;
        drop(theirs);
        let pid = child.id() as i32;
        Worker::start(
            tool,
            authority,
            Launched {
                channel: ours,
                teardown: Teardown::Child(child),
                uid,
                gid,
                pid,
            },
        )
    }
}
