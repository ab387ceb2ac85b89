//! Asking nsd for a confined worker (specs/worker-protocol.md §1): toolfs sends, on nsd's worker
//! control socket `<runtime>/nsd-workers.ctl`, one [`BuildRequest`] naming a tool's authority
//! with that authority's root fds; nsd builds the worker's namespaces from exactly that and
//! answers one [`BuildReply`] with three fds: toolfs's end of the worker's channel, a lifeline
//! (closing it makes nsd kill the worker's whole pid namespace) and a pidfd of the process that
//! holds the worker (readable once the worker is gone). toolfs never starts a worker itself.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::protocol::RootConfig;
use super::{Launched, Teardown, ToolAuthority};

/// `Dirs::control(NSD_WORKER_CONTROL)` is nsd's worker socket.
pub const NSD_WORKER_CONTROL: &str = "nsd-workers";
pub const BUILD_VERSION: u32 = 1;
/// How long a build may take before toolfs gives up (and the call is answered as an error).
const BUILD_TIMEOUT: Duration = Duration::from_secs(20);

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

/// Where nsd's worker socket is.
#[derive(Clone, Debug)]
pub struct WorkerBuilder {
    pub control: PathBuf,
}

impl WorkerBuilder {
    pub fn new(control: impl Into<PathBuf>) -> WorkerBuilder {
        WorkerBuilder {
            control: control.into(),
        }
    }

    /// Asks nsd for a worker (blocking). Any failure is an error: the caller denies the call.
    pub fn build(
        &self,
        session: &str,
        namespace: &str,
        tool: &str,
        authority: &ToolAuthority,
    ) -> io::Result<Launched> {
        request(&self.control, session, namespace, tool, authority).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "nsd could not build the {tool} worker ({}): {e}",
                    self.control.display()
                ),
            )
        })
    }
}

fn request(
    control: &Path,
    session: &str,
    namespace: &str,
    tool: &str,
    authority: &ToolAuthority,
) -> io::Result<Launched> {
    let sock = UnixStream::connect(control)?;
    sock.set_read_timeout(Some(BUILD_TIMEOUT))?;
    sock.set_write_timeout(Some(BUILD_TIMEOUT))?;
    let record = BuildRequest {
        version: BUILD_VERSION,
        session: session.to_string(),
        namespace: namespace.to_string(),
        tool: tool.to_string(),
        roots: authority.root_configs(),
        network: authority.network,
    };
    let bytes = serde_json::to_vec(&record).map_err(io::Error::other)?;
    let fds: Vec<BorrowedFd<'_>> = authority.roots.iter().map(|r| r.dir.as_fd()).collect();
    warren_daemon::handoff::send(&sock, &bytes, &fds)?;
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
    Ok(Launched {
        channel: UnixStream::from(channel),
        teardown: Teardown::Nsd {
            lifeline,
            holder,
            holder_pid: reply.holder_pid,
        },
        uid: reply.uid,
        gid: reply.gid,
        pid: reply.pid,
    })
}
