//! The tool workers' records: how toolfs asks nsd for a confined worker (`specs/worker-protocol.md`
//! §1: one [`BuildRequest`] with the tool's root fds on nsd's worker socket, one [`BuildReply`]
//! with three fds back), and the toolfs ↔ worker frames ([`protocol`], §2). Which tools run in a
//! worker, where the worker binary is, and what a root path may be are here too: nsd checks a
//! request against them before it builds anything.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod protocol;

use protocol::RootConfig;

/// The names the worker binary runs.
pub const WORKER_TOOLS: [&str; 5] = ["fs_read", "fs_list", "fs_write", "fs_edit", "shell"];

/// nsd puts the calling namespace's limits here (`pids=N mem=BYTES cpu=SECONDS`, each word
/// only when the namespace sets it) in the worker's environment; commands never see it.
pub const NAMESPACE_LIMITS_ENV: &str = "WARREN_NS_LIMITS";

/// Environment variable naming the worker binary (default: `warren-tool-worker` beside the
/// current executable).
pub const WORKER_ENV: &str = "WARREN_TOOL_WORKER";
pub const WORKER_BINARY: &str = "warren-tool-worker";

/// `Dirs::control(NSD_WORKER_CONTROL)` is nsd's worker socket.
pub const NSD_WORKER_CONTROL: &str = "nsd-workers";
pub const BUILD_VERSION: u32 = 1;
/// How long a build may take before toolfs gives up (and the call is answered as an error).
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(20);

/// toolfs → nsd: build a worker for one tool of one namespace. Followed by one O_PATH directory
/// fd per root, in order (the fds toolfs received with the namespace's grant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildRequest {
    pub version: u32,
    pub session: String,
    pub namespace: String,
    pub tool: String,
    pub roots: Vec<RootConfig>,
    pub network: bool,
}

/// nsd → toolfs. `ok`: three fds follow (channel, lifeline, holder pidfd); else none, and
/// `error` says why the worker cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildReply {
    pub ok: bool,
    #[serde(default)]
    pub error: String,
    /// The uid and gid the worker runs as (nsd's choice, never 0).
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    /// The worker's pid in its own pid namespace (1) and the holder's host pid.
    #[serde(default)]
    pub pid: i32,
    #[serde(default)]
    pub holder_pid: i32,
}

/// What nsd handed back for a built worker: its reply and toolfs's three fds.
pub struct Built {
    pub reply: BuildReply,
    /// toolfs's end of the worker's channel.
    pub channel: UnixStream,
    /// Closing it makes nsd kill the worker's whole pid namespace.
    pub lifeline: OwnedFd,
    /// A pidfd of the process that holds the worker, readable once the worker is gone.
    pub holder: OwnedFd,
}

/// Asks nsd (on its worker socket `control`) for a worker, with one O_PATH directory fd per
/// root of `request`, in order (blocking, bounded by [`BUILD_TIMEOUT`]). Any failure is an
/// error, a refusal by nsd included; a reply naming uid or gid 0 is refused here.
pub fn request_worker(
    control: &Path,
    request: &BuildRequest,
    root_fds: &[BorrowedFd<'_>],
) -> io::Result<Built> {
    let sock = UnixStream::connect(control)?;
    sock.set_read_timeout(Some(BUILD_TIMEOUT))?;
    sock.set_write_timeout(Some(BUILD_TIMEOUT))?;
    let bytes = serde_json::to_vec(request).map_err(io::Error::other)?;
    warren_daemon::handoff::send(&sock, &bytes, root_fds)?;
    let (reply, fds) = warren_daemon::handoff::recv(&sock)?;
    let reply: BuildReply = serde_json::from_slice(&reply).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad reply from nsd: {e}"),
        )
    })?;
    if !reply.ok {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("nsd refused: {}", reply.error),
        ));
    }
    let [channel, lifeline, holder]: [OwnedFd; 3] =
        fds.try_into().map_err(|got: Vec<OwnedFd>| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("nsd sent {} fds, not 3", got.len()),
            )
        })?;
    if reply.uid == 0 || reply.gid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "nsd named uid or gid 0 for a worker",
        ));
    }
    Ok(Built {
        reply,
        channel: UnixStream::from(channel),
        lifeline,
        holder,
    })
}

/// A root path must be absolute and plain (no `.`/`..`/empty components), or the longest-prefix
/// match in the worker would be ambiguous.
pub fn check_root_path(path: &str) -> io::Result<()> {
    let plain = path.starts_with('/')
        && !path.contains('\0')
        && (path == "/"
            || path[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."));
    if plain {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("root path {path:?} must be absolute and normalised"),
        ))
    }
}

/// `$WARREN_TOOL_WORKER`, else `warren-tool-worker` beside the current executable (or one
/// directory up, where cargo puts binaries when the current executable is a test in `deps/` or an
/// example in `examples/`).
pub fn worker_program() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(WORKER_ENV) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| io::Error::other("the current executable has no directory"))?;
    let mut tried = vec![dir.join(WORKER_BINARY)];
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
        && let Some(up) = dir.parent()
    {
        tried.push(up.join(WORKER_BINARY));
    }
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        let names: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no {WORKER_BINARY} at {} (set {WORKER_ENV})",
                names.join(" or ")
            ),
        )
    })
}
