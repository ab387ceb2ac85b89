//! Asking nsd for a confined worker (specs/worker-protocol.md §1): toolfs sends, on nsd's worker
//! control socket `<runtime>/nsd-workers.ctl`, one [`BuildRequest`] naming a tool's authority
//! with that authority's root fds; nsd builds the worker's namespaces from exactly that and
//! answers one [`BuildReply`] with three fds: toolfs's end of the worker's channel, a lifeline
//! (closing it makes nsd kill the worker's whole pid namespace) and a pidfd of the process that
//! holds the worker (readable once the worker is gone). toolfs never starts a worker itself.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

pub use warren_proto::worker::{
    BUILD_VERSION, BuildReply, BuildRequest, NSD_WORKER_CONTROL, request_worker,
};

use super::{Launched, Teardown, ToolAuthority};

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
    let record = BuildRequest {
        version: BUILD_VERSION,
        session: session.to_string(),
        namespace: namespace.to_string(),
        tool: tool.to_string(),
        roots: authority.root_configs(),
        network: authority.network,
    };
    let fds: Vec<BorrowedFd<'_>> = authority.roots.iter().map(|r| r.dir.as_fd()).collect();
    let built = request_worker(control, &record, &fds)?;
    Ok(Launched {
        channel: built.channel,
        teardown: Teardown::Nsd {
            lifeline: built.lifeline,
            holder: built.holder,
            holder_pid: built.reply.holder_pid,
        },
        uid: built.reply.uid,
        gid: built.reply.gid,
        pid: built.reply.pid,
    })
}
