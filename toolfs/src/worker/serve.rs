//! The worker process's side: read Hello on the argv's socket fd, take the root fds, seal the fd
//! table, drop to
//! the tool's uid/gid, answer Ready, then serve calls one at a time until the socket closes.
//! A malformed frame or a failing (even panicking) tool gets an error answer; the worker goes on.

use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::sys::stat::{Mode, SFlag, fstat, umask};

use super::protocol::{
    FromWorker, Incoming, PROTOCOL_VERSION, ToWorker, WorkerArgs, read_frame_blocking,
    write_message_blocking,
};
use crate::tools::{self, CallScope, RootDir, ToolContext, WORKER_TOOLS};

/// The longest a single call may be given (a bound on a bogus `timeout_ms`).
const MAX_CALL: Duration = Duration::from_secs(3600);

/// The worker binary's whole main.
pub fn main() -> ExitCode {
    let args = match WorkerArgs::parse(std::env::args()) {
        Ok(args) => args,
        Err(e) => return not_for_people(&e),
    };
    if let Err(e) = check_kind(args.socket_fd, SFlag::S_IFSOCK, "a socket") {
        return not_for_people(&format!(
            "fd {} is not the toolfs socket ({e})",
            args.socket_fd
        ));
    }
    // The socket toolfs passed us (checked above).
    let mut socket = match warren_jail::inherited::take(args.socket_fd) {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => return not_for_people(&format!("fd {}: {e}", args.socket_fd)),
    };
    let (tool, ctx) = match start(&mut socket, &args) {
        Ok(started) => started,
        Err(e) => {
            let _ = write_message_blocking(
                &mut socket,
                &FromWorker::Fatal {
                    message: e.to_string(),
                },
            );
            eprintln!("warren-tool-worker: {e}");
            return ExitCode::FAILURE;
        }
    };
    match serve(&mut socket, &tool, &ctx) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren-tool-worker ({tool}): {e}");
            ExitCode::FAILURE
        }
    }
}

fn not_for_people(problem: &str) -> ExitCode {
    eprintln!(
        "warren-tool-worker: {problem}; this program is started by toolfs only (specs/worker-protocol.md)"
    );
    ExitCode::from(2)
}

/// Fails unless inherited `fd` is open and of file type `kind` (`what` names it in the error).
fn check_kind(fd: RawFd, kind: SFlag, what: &str) -> io::Result<()> {
    let st = warren_jail::inherited::inspect(fd, |fd| fstat(fd))??;
    if st.st_mode & SFlag::S_IFMT.bits() != kind.bits() {
        return Err(io::Error::other(format!("not {what}")));
    }
    Ok(())
}

/// Hello → hardened worker with its tool context, or the reason it cannot start.
fn start(socket: &mut UnixStream, args: &WorkerArgs) -> io::Result<(String, ToolContext)> {
    let hello = match read_frame_blocking(socket)? {
        Incoming::Frame(body) => serde_json::from_slice::<ToWorker>(&body)
            .map_err(|e| io::Error::other(format!("bad hello: {e}")))?,
        Incoming::Oversized(n) => {
            return Err(io::Error::other(format!("hello of {n} bytes is too large")));
        }
        Incoming::Eof => return Err(io::Error::other("toolfs closed the socket before hello")),
    };
    let ToWorker::Hello {
        version,
        tool,
        uid,
        gid,
        network,
        roots,
    } = hello
    else {
        return Err(io::Error::other("the first frame must be hello"));
    };
    if version != PROTOCOL_VERSION {
        return Err(io::Error::other(format!(
            "protocol version {version}; this worker speaks {PROTOCOL_VERSION}"
        )));
    }
    if tool != args.tool {
        return Err(io::Error::other(format!(
            "hello names {tool:?}, argv {:?}",
            args.tool
        )));
    }
    if roots.len() != args.root_fds.len() {
        return Err(io::Error::other(format!(
            "hello names {} roots, argv {} root fds",
            roots.len(),
            args.root_fds.len()
        )));
    }
    if !WORKER_TOOLS.contains(&tool.as_str()) {
        return Err(io::Error::other(format!(
            "no tool named {tool:?} runs in a worker"
        )));
    }
    let root_fds = args.root_fds.clone();
    for &fd in &root_fds {
        check_kind(fd, SFlag::S_IFDIR, "a directory")
            .map_err(|e| io::Error::other(format!("root fd {fd}: {e}")))?;
    }
    let mut keep = vec![args.socket_fd];
    keep.extend(&root_fds);
    if keep.len() != keep.iter().collect::<std::collections::HashSet<_>>().len() {
        return Err(io::Error::other("argv names an fd twice"));
    }
    let root_owned = root_fds
        .iter()
        .map(|&fd| warren_jail::inherited::take(fd))
        .collect::<io::Result<Vec<OwnedFd>>>()?;
    // Only stdio, the socket and the roots stay (each close-on-exec once taken, so a shell
    // command inherits none of them).
    keep.extend([0, 1, 2]);
    warren_jail::fds::close_all_but(&keep)?;
    umask(Mode::from_bits_truncate(0o022));
    std::env::set_current_dir("/")?;
    // No parent-death signal: it fires when the *thread* that spawned us exits, and toolfs
    // spawns from a blocking pool whose threads come and go. The worker ends on socket EOF.
    warren_jail::privilege::drop_to(&warren_jail::privilege::Identity::new(uid, gid))?;
    let roots = roots
        .into_iter()
        .zip(root_owned)
        .map(|(config, fd)| RootDir {
            path: config.path,
            fd,
            writable: config.writable,
        })
        .collect();
    let ready = FromWorker::Ready {
        pid: std::process::id() as i32,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    write_message_blocking(socket, &ready)?;
    Ok((tool, ToolContext { roots, network }))
}

fn serve(socket: &mut UnixStream, tool: &str, ctx: &ToolContext) -> io::Result<()> {
    loop {
        let body = match read_frame_blocking(socket)? {
            Incoming::Eof => return Ok(()),
            Incoming::Oversized(n) => {
                write_message_blocking(
                    socket,
                    &FromWorker::Done {
                        id: 0,
                        ok: false,
                        content: format!("request frame of {n} bytes is too large"),
                    },
                )?;
                continue;
            }
            Incoming::Frame(body) => body,
        };
        let (id, args, timeout_ms) = match serde_json::from_slice::<ToWorker>(&body) {
            Ok(ToWorker::Call {
                id,
                args,
                timeout_ms,
            }) => (id, args, timeout_ms),
            Ok(ToWorker::Hello { .. }) => {
                write_message_blocking(
                    socket,
                    &FromWorker::Done {
                        id: 0,
                        ok: false,
                        content: "hello after start is refused".into(),
                    },
                )?;
                continue;
            }
            Err(e) => {
                write_message_blocking(
                    socket,
                    &FromWorker::Done {
                        id: 0,
                        ok: false,
                        content: format!("malformed request: {e}"),
                    },
                )?;
                continue;
            }
        };
        let deadline = Instant::now() + Duration::from_millis(timeout_ms).min(MAX_CALL);
        // Shared borrows of the socket: the call polls it for toolfs's hangup while its
        // Started message is written on it (`&UnixStream` writes).
        let shared: &UnixStream = socket;
        let caller = shared.as_fd();
        let mut started_error = None;
        let outcome = {
            let mut on_started = |pgid: i32| {
                let mut writer = shared;
                if let Err(e) =
                    write_message_blocking(&mut writer, &FromWorker::Started { id, pgid })
                {
                    started_error = Some(e);
                }
            };
            let mut scope = CallScope {
                deadline,
                caller,
                on_started: &mut on_started,
            };
            catch_unwind(AssertUnwindSafe(|| {
                tools::run(tool, ctx, &args, &mut scope)
            }))
        };
        if let Some(e) = started_error {
            return Err(e);
        }
        let output = outcome.unwrap_or_else(|_| {
            tools::ToolOutput::error(format!(
                "{tool}: internal error (the tool panicked); the worker goes on"
            ))
        });
        write_message_blocking(
            socket,
            &FromWorker::Done {
                id,
                ok: output.ok,
                content: output.content,
            },
        )?;
    }
}
