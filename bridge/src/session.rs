//! The session loop: INIT, then one reader decoding requests and one tokio task per request;
//! FUSE_INTERRUPT cancels the task (its 9P request is flushed) and answers EINTR.
//!
//! Every replyable request is registered in `inflight` (unique → cancel sender) before its task
//! starts. Whoever removes the entry owns the reply: the task when it finishes, or the INTERRUPT
//! handler, which answers EINTR at once. So each request gets exactly one reply, and a reply
//! the kernel never saw (interrupted, or the caller gone: ENOENT) can be undone.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use polyfuse_kernel as abi;
use tokio::sync::oneshot;
use warren_9p::{Client, Errno, Fid};

use crate::attr::Owner;
use crate::conn::Conn;
use crate::device::{Device, Read};
use crate::nodes::Nodes;
use crate::reply::{self, Body};
use crate::request::{self, DecodeError, Op, Request};

/// FOPEN_NOFLUSH (linux/fuse.h 7.35; newer than the 7.31 ABI crate): close(2) sends no FLUSH.
pub(crate) const FOPEN_NOFLUSH: u32 = 1 << 5;
/// The largest WRITE the kernel will send (also bounded by the 9P msize).
const MAX_WRITE: u32 = 128 * 1024;
/// The INIT flags the bridge asks for (and only those the kernel offers): parallel reads and
/// directory operations. No writeback cache, no splice, no READDIRPLUS, no atomic O_TRUNC
/// (truncation arrives as SETATTR and goes to the server as Tsetattr).
const INIT_FLAGS: u32 = abi::FUSE_ASYNC_READ | abi::FUSE_BIG_WRITES | abi::FUSE_PARALLEL_DIROPS;

/// How the session presents the server's files.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub direct_io_all: bool,
    pub call_files: bool,
    pub ttl: Duration,
    pub owner: Owner,
    /// Data bytes one Tread/Twrite can carry on this connection.
    pub rpc_max: u32,
    pub max_write: u32,
    /// Where finished calls are reported (`BridgeOptions::calls`).
    pub calls: Option<crate::CallSink>,
}

impl Settings {
    pub(crate) fn new(
        direct_io_all: bool,
        call_files: bool,
        ttl: Duration,
        owner: Owner,
        msize: u32,
    ) -> Settings {
        let rpc_max = msize.saturating_sub(warren_9p::wire::IOHDRSZ).max(1);
        Settings {
            direct_io_all,
            call_files,
            ttl,
            owner,
            rpc_max,
            max_write: MAX_WRITE.min(rpc_max).max(4096),
            calls: None,
        }
    }
}

/// An open file or directory: a fid that has been Tlopen'ed, and the connection it lives on.
pub(crate) struct OpenFile {
    pub fid: Fid,
    pub client: Client,
    pub generation: u64,
    /// A call file opened for reading and writing: a write may wait to go out with the next
    /// read (`Session::write`).
    defers_writes: bool,
    /// The write answered but not yet sent.
    deferred: std::sync::Mutex<Option<DeferredWrite>>,
    /// A read has been sent: the call has run (or is running), so a write now is refused by the
    /// server (EBUSY) and must go out at once for the writer to see that refusal.
    read_sent: std::sync::atomic::AtomicBool,
    /// Opened with FOPEN_DIRECT_IO: its reads must be read(2)s at the descriptor's offset.
    pub direct_io: bool,
    /// A call file whose call is reported (`Settings::calls`): what it saw so far.
    seen: Option<std::sync::Mutex<SeenCall>>,
}

/// What a reported call file saw: the writes in order (digested) and the reads from offset 0.
pub(crate) struct SeenCall {
    tool: String,
    args: sha2::Sha256,
    args_len: u64,
    result: Vec<u8>,
    result_len: u64,
    /// The offset of the first read (o₀).
    result_from: Option<u64>,
    reported: bool,
}

/// A write the kernel was told succeeded, to be sent before (pipelined with) the next request
/// on the handle.
pub(crate) struct DeferredWrite {
    pub offset: u64,
    pub data: Vec<u8>,
}

impl OpenFile {
    pub(crate) fn new(
        fid: Fid,
        client: Client,
        generation: u64,
        defers_writes: bool,
        direct_io: bool,
    ) -> OpenFile {
        OpenFile {
            fid,
            client,
            generation,
            defers_writes,
            deferred: std::sync::Mutex::new(None),
            read_sent: std::sync::atomic::AtomicBool::new(false),
            direct_io,
            seen: None,
        }
    }

    /// Reports this handle's call as a call of `tool` (see [`OpenFile::report`]).
    pub(crate) fn seeing(mut self, tool: String) -> OpenFile {
        self.seen = Some(std::sync::Mutex::new(SeenCall {
            tool,
            args: sha2::Digest::new(),
            args_len: 0,
            result: Vec::new(),
            result_len: 0,
            result_from: None,
            reported: false,
        }));
        self
    }

    fn seen(&self) -> Option<std::sync::MutexGuard<'_, SeenCall>> {
        self.seen
            .as_ref()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A write the caller was told succeeded. Calls append: a write elsewhere than at the end
    /// of what was written is left out of the digest (and the length says so).
    pub(crate) fn saw_write(&self, offset: u64, data: &[u8]) {
        if let Some(mut seen) = self.seen()
            && offset == seen.args_len
        {
            sha2::Digest::update(&mut seen.args, data);
            seen.args_len += data.len() as u64;
        }
    }

    /// A read's answer: the result, read on from the first read's offset (a call's reads
    /// start where its writes ended: specs/tool-tree.md, o₀).
    pub(crate) fn saw_read(&self, offset: u64, data: &[u8]) {
        if let Some(mut seen) = self.seen()
            && offset == *seen.result_from.get_or_insert(offset) + seen.result_len
        {
            let room = crate::CallReport::RESULT_KEPT.saturating_sub(seen.result.len());
            seen.result.extend_from_slice(&data[..data.len().min(room)]);
            seen.result_len += data.len() as u64;
        }
    }

    /// The report of this handle's call, once: if it is reported and something was read (a
    /// call never read never ran).
    pub(crate) fn report(&self) -> Option<crate::CallReport> {
        let mut seen = self.seen()?;
        if seen.result_len == 0 || seen.reported {
            return None;
        }
        seen.reported = true;
        let digest = sha2::Digest::finalize(seen.args.clone());
        Some(crate::CallReport {
            tool: seen.tool.clone(),
            args_sha256: hex::encode(digest),
            args_len: seen.args_len,
            result: seen.result.clone(),
            result_len: seen.result_len,
        })
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, Option<DeferredWrite>> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `data` to send later, if this handle defers writes, holds none yet and has not
    /// been read (only a call's first write, before its first read, is deferred).
    pub(crate) fn defer(&self, offset: u64, data: &[u8]) -> bool {
        let mut deferred = self.deferred();
        if !self.defers_writes
            || deferred.is_some()
            || self.read_sent.load(std::sync::atomic::Ordering::Acquire)
        {
            return false;
        }
        *deferred = Some(DeferredWrite {
            offset,
            data: data.to_vec(),
        });
        true
    }

    pub(crate) fn take_deferred(&self) -> Option<DeferredWrite> {
        self.deferred().take()
    }

    /// Takes the deferred write for a read, and marks the handle read: no write is deferred
    /// after this.
    pub(crate) fn take_deferred_for_read(&self) -> Option<DeferredWrite> {
        let mut deferred = self.deferred();
        self.read_sent
            .store(true, std::sync::atomic::Ordering::Release);
        deferred.take()
    }

    /// Sends the deferred write, if there is one, and waits for it: its error is the caller's
    /// (the next request on the handle is where a deferred write's refusal surfaces).
    pub(crate) async fn send_deferred(&self) -> Result<(), Errno> {
        match self.take_deferred() {
            Some(w) => written(self.fid.write(w.offset, &w.data).await, w.data.len()),
            None => Ok(()),
        }
    }
}

/// A deferred write's outcome: all of it taken, or the error it surfaces as (a short write
/// cannot be told to a caller who was told it all went: EIO).
pub(crate) fn written(result: Result<u32, Errno>, len: usize) -> Result<(), Errno> {
    match result {
        Ok(n) if n as usize == len => Ok(()),
        Ok(_) => Err(Errno::EIO),
        Err(e) => Err(e),
    }
}

/// A successful answer, and what to undo if the kernel never receives it.
pub(crate) struct Reply {
    pub body: Body,
    /// A node reference the reply hands the kernel (LOOKUP, CREATE, MKDIR).
    pub forget_if_lost: Option<u64>,
    /// A file handle the reply hands the kernel (OPEN, OPENDIR, CREATE).
    pub close_if_lost: Option<u64>,
}

impl Reply {
    pub(crate) fn plain(body: Body) -> Reply {
        Reply {
            body,
            forget_if_lost: None,
            close_if_lost: None,
        }
    }
}

pub(crate) struct Session {
    dev: Device,
    pub(crate) conn: Conn,
    pub(crate) settings: Settings,
    pub(crate) nodes: Arc<Mutex<Nodes>>,
    pub(crate) files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    next_fh: AtomicU64,
    inflight: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

impl Session {
    pub(crate) fn new(dev: Device, conn: Conn, settings: Settings) -> Session {
        let root = conn.current();
        Session {
            dev,
            settings,
            nodes: Arc::new(Mutex::new(Nodes::new(root.root.clone(), root.generation))),
            conn,
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            inflight: Mutex::new(HashMap::new()),
        }
    }

    /// Reads and dispatches requests until the connection goes away (unmount or abort).
    pub(crate) async fn run(self: Arc<Self>) -> io::Result<()> {
        // The kernel refuses a read into a buffer smaller than its largest WRITE.
        let mut buf = vec![
            0u8;
            (self.settings.max_write as usize + 4096)
                .max(abi::FUSE_MIN_READ_BUFFER as usize)
        ];
        let result = loop {
            match self.dev.read(&mut buf).await {
                Ok(Read::Gone) => break Ok(()),
                Ok(Read::Request(n)) => self.dispatch(&buf[..n]),
                Err(e) => break Err(e),
            }
        };
        self.stop();
        result
    }

    /// The connection is over: cancel every request still running (their 9P requests are
    /// flushed) and let go of the open fids, so nothing waits on a server for a dead mount.
    fn stop(&self) {
        let cancels: Vec<_> = self
            .inflight
            .lock()
            .expect("inflight lock")
            .drain()
            .collect();
        for (_, cancel) in cancels {
            let _ = cancel.send(());
        }
        self.files().clear();
    }

    fn dispatch(self: &Arc<Self>, bytes: &[u8]) {
        let req = match request::decode(bytes) {
            Ok(req) => req,
            Err(DecodeError::Header) => {
                tracing::warn!(len = bytes.len(), "bridge: unreadable FUSE request header");
                return;
            }
            Err(DecodeError::Args { unique }) => {
                self.send(unique, Err(libc::EINVAL));
                return;
            }
        };
        tracing::trace!(
            unique = req.unique,
            nodeid = req.nodeid,
            opcode = req.opcode,
            "fuse request"
        );
        match req.op {
            Op::Init(init) => self.init(req.unique, &init),
            Op::Forget { nlookup } => self.nodes().forget(req.nodeid, nlookup),
            Op::BatchForget(ref forgets) => {
                let mut nodes = self.nodes();
                for &(nodeid, nlookup) in forgets {
                    nodes.forget(nodeid, nlookup);
                }
            }
            Op::Interrupt { target } => self.interrupt(req.unique, target),
            // Answered here: no 9P involved.
            Op::Destroy | Op::Flush => {
                self.send(req.unique, Ok(&[]));
            }
            Op::Getxattr | Op::Listxattr { .. } | Op::Setxattr { .. } | Op::Removexattr => {
                let answer = crate::ops::xattr(&req.op);
                self.send(req.unique, answer.as_deref().map_err(|e| *e));
            }
            Op::Unsupported => {
                self.send(req.unique, Err(libc::ENOSYS));
            }
            _ => self.spawn(req),
        }
    }

    fn init(&self, unique: u64, init: &abi::fuse_init_in) {
        if init.major != abi::FUSE_KERNEL_VERSION {
            tracing::warn!(major = init.major, "bridge: unsupported FUSE major version");
            self.send(unique, Err(libc::EPROTO));
            return;
        }
        let out = abi::fuse_init_out {
            major: abi::FUSE_KERNEL_VERSION,
            minor: init.minor.min(abi::FUSE_KERNEL_MINOR_VERSION),
            max_readahead: init.max_readahead,
            flags: init.flags & INIT_FLAGS,
            // Background requests (RELEASE, async reads) in flight before the kernel queues.
            max_background: 64,
            congestion_threshold: 48,
            max_write: self.settings.max_write,
            time_gran: 1,
            ..Default::default()
        };
        tracing::debug!(
            minor = out.minor,
            flags = out.flags,
            max_write = out.max_write,
            "fuse init"
        );
        self.send(unique, Ok(&reply::body(&out)));
    }

    fn spawn(self: &Arc<Self>, req: Request) {
        let (cancel, cancelled) = oneshot::channel();
        self.inflight
            .lock()
            .expect("inflight lock")
            .insert(req.unique, cancel);
        let session = self.clone();
        tokio::spawn(async move {
            let unique = req.unique;
            let outcome = tokio::select! {
                biased;
                // Interrupted: the handler's future (and any 9P request in it, which sends
                // Tflush as it drops) goes away; the INTERRUPT handler already answered.
                _ = cancelled => return,
                outcome = session.handle(req) => outcome,
            };
            session.finish(unique, outcome);
        });
    }

    fn finish(&self, unique: u64, outcome: Result<Reply, Errno>) {
        let claimed = self
            .inflight
            .lock()
            .expect("inflight lock")
            .remove(&unique)
            .is_some();
        let delivered = claimed
            && match &outcome {
                Ok(r) => self.send(unique, Ok(&r.body)),
                Err(e) => self.send(unique, Err(reply::wire_errno(*e))),
            };
        if let (false, Ok(reply)) = (delivered, outcome) {
            if let Some(nodeid) = reply.forget_if_lost {
                self.nodes().forget(nodeid, 1);
            }
            if let Some(fh) = reply.close_if_lost {
                self.files().remove(&fh);
            }
        }
    }

    /// FUSE_INTERRUPT for `target`. Known: cancel its task (flushing its 9P request) and answer
    /// it EINTR now. Unknown: it already finished, or (with several readers) the INTERRUPT
    /// overtook it; answer EAGAIN so the kernel re-queues the INTERRUPT (libfuse does the same).
    fn interrupt(&self, unique: u64, target: u64) {
        let cancel = self.inflight.lock().expect("inflight lock").remove(&target);
        match cancel {
            Some(cancel) => {
                let _ = cancel.send(());
                self.send(target, Err(libc::EINTR));
            }
            None => {
                self.send(unique, Err(libc::EAGAIN));
            }
        }
    }

    /// Writes one reply. False when the kernel did not take it: ENOENT means the request is
    /// gone (interrupted and answered, or its caller was killed before a reply was possible).
    fn send(&self, unique: u64, result: Result<&[u8], i32>) -> bool {
        match self.dev.write(&reply::frame(unique, result)) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
            Err(e) => {
                tracing::warn!(unique, error = %e, "bridge: reply refused by the kernel");
                // A request never answered would hang its caller (and turn each INTERRUPT
                // for it into an EAGAIN loop): answer it with a bare EIO instead.
                if result.is_ok() {
                    let _ = self.dev.write(&reply::frame(unique, Err(libc::EIO)));
                }
                false
            }
        }
    }

    /// FUSE_NOTIFY_INVAL_ENTRY: the kernel drops its cached `name` in `parent` (and the
    /// attributes under it), so the next use looks it up again. A name it does not have cached
    /// is not an error. Blocks while the kernel holds the directory's lock (e.g. during a
    /// LOOKUP in it), so call it off the runtime's worker threads.
    pub(crate) fn invalidate_entry(&self, parent: u64, name: &str) -> io::Result<()> {
        let head = abi::fuse_notify_inval_entry_out {
            parent,
            namelen: name.len() as u32,
            padding: 0,
        };
        let mut body = reply::body(&head);
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        match self
            .dev
            .write(&reply::notification(abi::FUSE_NOTIFY_INVAL_ENTRY, &body))
        {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    pub(crate) fn nodes(&self) -> std::sync::MutexGuard<'_, Nodes> {
        self.nodes.lock().expect("node table lock")
    }

    pub(crate) fn files(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<OpenFile>>> {
        self.files.lock().expect("open file table lock")
    }

    pub(crate) fn add_file(&self, file: OpenFile) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files().insert(fh, Arc::new(file));
        fh
    }

    /// An open handle. EIO for a handle opened on a connection that has since been replaced:
    /// a transaction cannot be carried over to the new one.
    pub(crate) fn file(&self, fh: u64) -> Result<Arc<OpenFile>, Errno> {
        let file = self.files().get(&fh).cloned().ok_or(Errno::EBADF)?;
        if file.generation != self.conn.current().generation {
            return Err(Errno::EIO);
        }
        Ok(file)
    }
}
