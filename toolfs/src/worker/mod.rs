//! Tool workers, toolfs's side: one process per (connection, tool), built by nsd in namespaces
//! of its own from that tool's authority alone (`nsd`), running as an unprivileged uid/gid,
//! serving calls one at a time over a socketpair. The wire format is in `protocol`
//! (specs/worker-protocol.md); the worker's own side is `serve`, run by the `warren-tool-worker`
//! binary; `unconfined` starts that binary as a plain child, for its own tests.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod nsd;
pub mod privilege;
pub use warren_proto::worker::protocol;
pub mod serve;
mod unconfined;

use protocol::{FromWorker, Incoming, PROTOCOL_VERSION, RootConfig, ToWorker};

/// How long a new worker may take to answer Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long toolfs waits past a call's timeout for the worker's own timeout answer before it
/// kills the worker.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long ending an nsd-built worker waits for nsd's holder to report it dead.
const TEARDOWN_WAIT: Duration = Duration::from_secs(10);

/// One host directory a tool may use.
pub struct Root {
    /// The path as the tool sees it: absolute, e.g. "/home/me/repo".
    pub path: String,
    /// An O_PATH|O_DIRECTORY fd of the host directory.
    pub dir: OwnedFd,
    pub writable: bool,
}

/// A tool's authority: its roots and whether it may use the network.
pub struct ToolAuthority {
    pub roots: Vec<Root>,
    pub network: bool,
}

/// One call's answer from the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOutput {
    pub ok: bool,
    /// The text result, or an error message naming the problem.
    pub content: String,
}

/// A running worker process.
pub struct Worker {
    tool: String,
    pid: i32,
    uid: u32,
    teardown: Mutex<Option<Teardown>>,
    channel: tokio::sync::Mutex<Channel>,
    /// The call whose command's process group is running, from the worker's last `started`
    /// (cleared by its `done`); killed with the worker.
    running: Mutex<Option<(u64, i32)>>,
    dead: AtomicBool,
    next_id: AtomicU64,
}

/// The socket and what has been read from it but not yet consumed (so a call future dropped
/// mid-read loses nothing: the next call skips the stale answer by id).
struct Channel {
    std: Option<UnixStream>,
    stream: Option<tokio::net::UnixStream>,
    buffer: Vec<u8>,
    /// A write was cut short (its future dropped): the stream is out of step for good.
    torn_write: bool,
}

impl Channel {
    fn new() -> Channel {
        Channel {
            std: None,
            stream: None,
            buffer: Vec::new(),
            torn_write: false,
        }
    }
}

/// A worker process that has been started but not yet greeted: its channel, how to end it, and
/// who it must say it runs as.
pub struct Launched {
    pub channel: UnixStream,
    pub teardown: Teardown,
    pub uid: u32,
    pub gid: u32,
    /// The pid the worker must report in `ready` (in its own pid namespace).
    pub pid: i32,
}

/// How a worker is ended.
pub enum Teardown {
    /// Built by nsd: closing `lifeline` makes nsd's holder SIGKILL the worker, the pid 1 of its
    /// own pid namespace, and with it every process of that namespace; `holder` (a pidfd) turns
    /// readable once the holder has seen it die. toolfs holds no right to signal the worker.
    Nsd {
        lifeline: OwnedFd,
        holder: OwnedFd,
        holder_pid: i32,
    },
    /// A child of this process, started unconfined by [`Worker::spawn_unconfined`] (the worker
    /// binary's own tests; the daemon never does this).
    Child(Child),
}

impl ToolAuthority {
    /// The roots as `hello` and nsd's build request name them.
    pub fn root_configs(&self) -> Vec<RootConfig> {
        self.roots
            .iter()
            .map(|r| RootConfig {
                path: r.path.clone(),
                writable: r.writable,
            })
            .collect()
    }
}

impl Worker {
    /// Greets a started worker (`hello` → `ready`) and checks it runs as `launched` says.
    /// On any failure the worker is ended (dropping the half-made `Worker` does it).
    pub fn start(tool: &str, authority: &ToolAuthority, launched: Launched) -> io::Result<Worker> {
        check_tool(tool)?;
        let Launched {
            channel: mut ours,
            teardown,
            uid,
            gid,
            pid,
        } = launched;
        let host_pid = match &teardown {
            Teardown::Child(child) => child.id() as i32,
            Teardown::Nsd { holder_pid, .. } => *holder_pid,
        };
        let mut worker = Worker {
            tool: tool.to_string(),
            pid: host_pid,
            uid,
            teardown: Mutex::new(Some(teardown)),
            channel: tokio::sync::Mutex::new(Channel::new()),
            running: Mutex::new(None),
            dead: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        };
        let hello = ToWorker::Hello {
            version: PROTOCOL_VERSION,
            tool: tool.to_string(),
            uid,
            gid,
            network: authority.network,
            roots: authority.root_configs(),
        };
        ours.set_read_timeout(Some(HELLO_TIMEOUT))?;
        protocol::write_message_blocking(&mut ours, &hello)?;
        let answer = match protocol::read_frame_blocking(&mut ours)? {
            Incoming::Frame(body) => serde_json::from_slice::<FromWorker>(&body).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("worker answered hello with garbage: {e}"),
                )
            })?,
            Incoming::Oversized(n) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("worker answered hello with {n} bytes"),
                ));
            }
            Incoming::Eof => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the worker exited before answering hello",
                ));
            }
        };
        match answer {
            FromWorker::Ready {
                pid: ready_pid,
                uid: got_uid,
                gid: got_gid,
            } if ready_pid == pid && got_uid == uid && got_gid == gid => {}
            FromWorker::Ready {
                pid: got_pid,
                uid: got_uid,
                gid: got_gid,
            } => {
                return Err(io::Error::other(format!(
                    "the worker reports pid {got_pid} uid {got_uid} gid {got_gid}, not {pid} {uid} {gid}"
                )));
            }
            FromWorker::Fatal { message } => {
                return Err(io::Error::other(format!(
                    "the {tool} worker cannot start: {message}"
                )));
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("worker answered hello with {other:?}"),
                ));
            }
        }
        ours.set_read_timeout(None)?;
        ours.set_nonblocking(true)?;
        worker.channel.get_mut().std = Some(ours);
        Ok(worker)
    }

    /// Runs one call on the canonical (RFC 8785) JSON argument bytes; answers when the worker
    /// does, or at the timeout (the worker bounds the call itself; if it has not answered
    /// [`KILL_GRACE`] later it is killed with its call's process group, and this returns a
    /// `TimedOut` error). Any other error also leaves the worker dead: spawn a new one.
    pub async fn call(&self, canonical_args: &[u8], timeout: Duration) -> io::Result<WorkerOutput> {
        let args = std::str::from_utf8(canonical_args).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("arguments are not UTF-8: {e}"),
            )
        })?;
        let mut channel = self.channel.lock().await;
        if self.dead.load(Ordering::SeqCst) || channel.torn_write {
            self.kill(&mut channel);
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("the {} worker is gone", self.tool),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        let frame = protocol::encode(&ToWorker::Call {
            id,
            args: args.to_string(),
            timeout_ms,
        })?;
        let result = tokio::time::timeout(
            timeout.saturating_add(KILL_GRACE),
            self.exchange(&mut channel, id, &frame),
        )
        .await;
        match result {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(e)) => {
                self.kill(&mut channel);
                Err(e)
            }
            Err(_) => {
                self.kill(&mut channel);
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the {} call did not answer within {:?}; the worker and its call were killed",
                        self.tool, timeout
                    ),
                ))
            }
        }
    }

    async fn exchange(
        &self,
        channel: &mut Channel,
        id: u64,
        frame: &[u8],
    ) -> io::Result<WorkerOutput> {
        if channel.stream.is_none() {
            let std = channel
                .std
                .take()
                .ok_or_else(|| io::Error::other("worker socket missing"))?;
            channel.stream = Some(tokio::net::UnixStream::from_std(std)?);
        }
        channel.torn_write = true;
        channel
            .stream
            .as_mut()
            .expect("set above")
            .write_all(frame)
            .await?;
        channel.torn_write = false;
        loop {
            while let Some(body) = protocol::take_frame(&mut channel.buffer)? {
                let message = serde_json::from_slice::<FromWorker>(&body).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("garbage from the worker: {e}"),
                    )
                })?;
                self.track(&message);
                match message {
                    FromWorker::Done {
                        id: got,
                        ok,
                        content,
                    } if got == id => return Ok(WorkerOutput { ok, content }),
                    FromWorker::Done { id: 0, content, .. } => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("the worker refused the request: {content}"),
                        ));
                    }
                    // Progress of this call, or an answer to a call whose caller went away.
                    FromWorker::Done { .. } | FromWorker::Started { .. } => {}
                    other => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("unexpected frame from the worker: {other:?}"),
                        ));
                    }
                }
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = channel
                .stream
                .as_mut()
                .expect("set above")
                .read(&mut chunk)
                .await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the {} worker exited", self.tool),
                ));
            }
            channel.buffer.extend_from_slice(&chunk[..n]);
        }
    }

    /// The host pid of the worker (a child of ours) or of its holder (built by nsd).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The uid the worker runs as.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// False once the worker has been killed or has failed; such a worker answers every call
    /// with an error.
    pub fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
    }

    /// Notes which call's process group is running (any call's: a withdrawn call runs on).
    fn track(&self, message: &FromWorker) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match *message {
            FromWorker::Started { id, pgid } => *running = Some((id, pgid)),
            FromWorker::Done { id, .. } if running.is_some_and(|(r, _)| r == id) => *running = None,
            _ => {}
        }
    }

    /// Reads whatever the worker has already sent without waiting, so a `started` nobody has
    /// read yet is known before the kill.
    fn absorb_pending(&self, channel: &mut Channel) {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            // A raw read: the socket is non-blocking, and tokio's readiness cache may not know
            // yet that data arrived.
            let read = match (&channel.stream, &channel.std) {
                (Some(stream), _) => nix::unistd::read(stream, &mut chunk),
                (None, Some(std)) => nix::unistd::read(std, &mut chunk),
                (None, None) => return,
            };
            match read {
                Ok(n) if n > 0 => channel.buffer.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
        while let Ok(Some(body)) = protocol::take_frame(&mut channel.buffer) {
            if let Ok(message) = serde_json::from_slice::<FromWorker>(&body) {
                self.track(&message);
            }
        }
    }

    /// Ends the worker: an nsd-built one by closing its lifeline (nsd kills its whole pid
    /// namespace, the running command's included) and waiting for its holder to see it die; a
    /// child of ours by killing the running call's process group and the child, and reaping it.
    fn kill(&self, channel: &mut Channel) {
        self.dead.store(true, Ordering::SeqCst);
        self.absorb_pending(channel);
        let running = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let teardown = self
            .teardown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match teardown {
            None => {}
            Some(Teardown::Nsd {
                lifeline, holder, ..
            }) => {
                drop(lifeline);
                // The holder kills and reaps the worker as soon as it sees the lifeline close.
                let mut fds = [PollFd::new(holder.as_fd(), PollFlags::POLLIN)];
                let deadline = std::time::Instant::now() + TEARDOWN_WAIT;
                while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
                    let ms = left.as_millis().min(i32::MAX as u128) as i32;
                    match poll(
                        &mut fds,
                        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
                    ) {
                        Ok(0) => {}
                        Ok(_) => break,
                        Err(Errno::EINTR) => continue,
                        Err(e) => {
                            tracing::warn!(tool = %self.tool, "waiting for the worker's end: {e}");
                            break;
                        }
                    }
                }
            }
            Some(Teardown::Child(mut child)) => {
                // The group the worker named, never 0 or 1 (ours, or every process we may
                // signal): a worker's word is not trusted that far.
                if let Some((_, group)) = running.filter(|&(_, g)| g > 1) {
                    match killpg(Pid::from_raw(group), Signal::SIGKILL) {
                        Ok(()) | Err(Errno::ESRCH) => {}
                        Err(e) => tracing::warn!(tool = %self.tool, "killpg({group}): {e}"),
                    }
                }
                // kill then wait: SIGKILL cannot be caught, so the wait is short.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // No call can be running: each borrows the worker.
        let mut channel = std::mem::replace(self.channel.get_mut(), Channel::new());
        self.kill(&mut channel);
    }
}

fn check_tool(tool: &str) -> io::Result<()> {
    if crate::tools::WORKER_TOOLS.contains(&tool) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no tool named {tool:?} runs in a worker"),
        ))
    }
}

pub use warren_proto::worker::{WORKER_BINARY, WORKER_ENV, check_root_path, worker_program};
