//! The server loop: one connection, one `FileTree`.
//!
//! One reader (this function's task) reads and checks frames, answers Tversion and Tflush
//! itself and spawns a task per other request, queued behind earlier requests on the same fids
//! (`fids.rs`). One writer task writes replies in the order they are queued. A reply is queued
//! under the same lock that Tflush takes, so a flushed request's reply is either queued before
//! Rflush or never.

mod fids;
mod ops;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rs9p::{FCall, Msg};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::FileTree;
use crate::wire::{self, FrameError};
use fids::{FidTable, Places};

/// Per-connection limits. A peer that exceeds one gets an error for that request (or, for a
/// malformed frame, loses its connection); other connections are unaffected.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The largest msize the server agrees to (the client's offer is negotiated down to it).
    pub max_msize: u32,
    /// Live fids per connection; a request that would create one more gets EMFILE.
    pub max_fids: usize,
    /// Requests in flight per connection; past it the loop stops reading the connection until
    /// one finishes (backpressure, not an error).
    pub max_inflight: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_msize: 1 << 20,
            max_fids: 4096,
            max_inflight: 256,
        }
    }
}

/// Replies the reader writes itself (Rversion, Rflush, refusals) that may wait in the writer's
/// queue at once; past it the reader waits for the peer to read.
const CONTROL_REPLIES: usize = 64;
/// Requests read past the in-flight cap and held, in order, until a slot frees.
const MAX_PARKED: usize = 16;
/// How long a connection's last replies may take to drain once the peer stopped sending.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection until the peer closes it or sends garbage. Every fid still live at the
/// end is clunked through `tree.clunk`.
///
/// Returns `Ok` when the peer closed the connection, an `InvalidData` error when it was dropped
/// for a malformed frame (already logged with `warn!`), or the transport's error.
pub async fn serve<T, S>(tree: Arc<T>, stream: S, limits: Limits) -> std::io::Result<()>
where
    T: FileTree,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(Box::pin(stream));
    let mut rd = wire::FrameReader::new(rd);
    let (out, rx) = mpsc::unbounded_channel();
    let (gone_tx, mut gone_rx) = oneshot::channel();
    let writer = tokio::spawn(write_loop(wr, rx, gone_tx));
    let conn = Arc::new(Conn {
        tree,
        inflight: Arc::new(Semaphore::new(limits.max_inflight.max(1))),
        limits,
        msize: AtomicU32::new(0),
        out,
        shared: Mutex::new(Shared {
            fids: FidTable::new(),
            inflight: HashMap::new(),
            next_id: 0,
        }),
    });
    let mut abort_on_drop = AbortOnDrop {
        conn: conn.clone(),
        writer: Some(writer.abort_handle()),
    };
    let control = Arc::new(Semaphore::new(CONTROL_REPLIES));
    let result = conn.read_loop(&mut rd, &mut gone_rx, &control).await;
    if let Err(e) = &result {
        match e {
            FrameError::Io(e) => debug!("9p connection ended: {e}"),
            other => warn!("9p connection closed: {other}"),
        }
    }
    conn.reset().await;
    drop(conn);
    abort_on_drop.writer = None; // the writer may drain what is queued
    drop(abort_on_drop);
    let mut writer = writer;
    if tokio::time::timeout(DRAIN_TIMEOUT, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    result.map_err(Into::into)
}

/// Serves an already-connected stream socket given as a file descriptor (a socketpair end nsd
/// handed over with SCM_RIGHTS). The fd is made non-blocking; it must be a connected
/// `AF_UNIX` `SOCK_STREAM` socket (anything else fails here or on first use).
pub async fn serve_fd<T: FileTree>(
    tree: Arc<T>,
    fd: std::os::fd::OwnedFd,
    limits: Limits,
) -> std::io::Result<()> {
    let std_stream = std::os::unix::net::UnixStream::from(fd);
    std_stream.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(std_stream)?;
    serve(tree, stream, limits).await
}

struct Conn<T: FileTree> {
    tree: Arc<T>,
    limits: Limits,
    /// The negotiated msize; 0 until a Tversion succeeds.
    msize: AtomicU32,
    inflight: Arc<Semaphore>,
    out: mpsc::UnboundedSender<Outgoing>,
    shared: Mutex<Shared<T::Fid>>,
}

struct Shared<F> {
    fids: FidTable<F>,
    inflight: HashMap<u16, InFlight>,
    next_id: u64,
}

/// A request whose reply has not been queued yet.
struct InFlight {
    /// Distinguishes a request from a later one that reuses its tag.
    id: u64,
    task: JoinHandle<()>,
}

/// A reply frame and the permit it holds until written (bounds queued replies).
struct Outgoing {
    frame: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

async fn write_loop<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    _gone: oneshot::Sender<()>,
) {
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        // Twice: once for what is queued now, and once more after letting the tasks that are
        // ready run. A pipelined pair (an rpc file's Twrite and Tread, a walk and its open)
        // finishes its two requests back to back; without the yield the first reply goes out
        // alone and the client wakes twice for one round trip — a cross-CPU wakeup each, the
        // dearest thing on the path (measured on the gate's decide: two sends per call before,
        // one after).
        for pass in 0..2 {
            while let Some(msg) = next {
                if let Err(e) = wr.write_all(&msg.frame).await {
                    debug!("9p write failed: {e}");
                    return;
                }
                next = rx.try_recv().ok();
            }
            if pass == 0 {
                tokio::task::yield_now().await;
                next = rx.try_recv().ok();
            }
        }
        if let Err(e) = wr.flush().await {
            debug!("9p write failed: {e}");
            return;
        }
    }
    let _ = wr.shutdown().await;
}

impl<T: FileTree> Conn<T> {
    fn shared(&self) -> std::sync::MutexGuard<'_, Shared<T::Fid>> {
        // A panic while holding this lock cannot leave it half-updated in a way that matters
        // more than losing the connection; keep serving.
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn msize(&self) -> u32 {
        self.msize.load(Ordering::Acquire)
    }

    /// Reads requests until the peer closes or breaks framing. At the in-flight cap, requests
    /// are parked (in order) instead of dispatched, and reading goes on until `MAX_PARKED` wait:
    /// so a Tflush sent while every slot is taken by a blocked request still gets through.
    async fn read_loop<R: AsyncRead + Unpin>(
        self: &Arc<Self>,
        rd: &mut wire::FrameReader<R>,
        writer_gone: &mut oneshot::Receiver<()>,
        control: &Arc<Semaphore>,
    ) -> Result<(), FrameError> {
        let mut parked: VecDeque<(u16, FCall)> = VecDeque::new();
        loop {
            while !parked.is_empty() {
                let Ok(permit) = self.inflight.clone().try_acquire_owned() else {
                    break;
                };
                let (tag, body) = parked.pop_front().expect("not empty");
                self.dispatch(tag, body, permit)?;
            }
            let max = match self.msize() {
                0 => self.limits.max_msize.max(wire::MIN_MSIZE),
                m => m,
            };
            let frame = tokio::select! {
                frame = rd.next(max), if parked.len() < MAX_PARKED => frame?,
                permit = self.inflight.clone().acquire_owned(), if !parked.is_empty() => {
                    let (tag, body) = parked.pop_front().expect("not empty");
                    self.dispatch(tag, body, permit.expect("never closed"))?;
                    continue;
                }
                _ = &mut *writer_gone => return Ok(()),
            };
            let Some(frame) = frame else { return Ok(()) };
            let Msg { tag, body } = wire::decode_request(&frame)?;
            drop(frame);
            match body {
                FCall::TVersion { msize, version } => {
                    let permit = control.clone().acquire_owned().await.expect("never closed");
                    parked.clear();
                    self.reset().await;
                    let reply = self.version(msize, &version);
                    self.queue(tag, reply, permit);
                }
                FCall::TFlush { oldtag } => {
                    let permit = control.clone().acquire_owned().await.expect("never closed");
                    if let Some(at) = parked.iter().position(|(t, _)| *t == oldtag) {
                        // Never started: dropping it is the whole cancellation.
                        parked.remove(at);
                    }
                    self.flush(tag, oldtag, permit);
                }
                body if self.msize() == 0 => {
                    let permit = control.clone().acquire_owned().await.expect("never closed");
                    debug!("9p request before Tversion: {body:?}");
                    self.queue(
                        tag,
                        FCall::RlError {
                            ecode: crate::Errno::EPROTO.0,
                        },
                        permit,
                    );
                }
                body => parked.push_back((tag, body)),
            }
        }
    }

    /// Tversion: only 9P2000.L; msize negotiated down to our limit and at least `MIN_MSIZE`.
    fn version(&self, client_msize: u32, version: &str) -> FCall {
        let msize = client_msize.min(self.limits.max_msize);
        if version != rs9p::P92000L {
            return FCall::RVersion {
                msize,
                version: rs9p::VERSION_UNKNOWN.into(),
            };
        }
        if msize < wire::MIN_MSIZE {
            return FCall::RlError {
                ecode: crate::Errno::EINVAL.0,
            };
        }
        self.msize.store(msize, Ordering::Release);
        FCall::RVersion {
            msize,
            version: rs9p::P92000L.into(),
        }
    }

    /// Queues a reply the reader produced itself.
    fn queue(&self, tag: u16, body: FCall, permit: OwnedSemaphorePermit) {
        let frame = wire::encode(&Msg { tag, body });
        let _ = self.out.send(Outgoing {
            frame,
            _permit: permit,
        });
    }

    /// Tflush: a request still in flight is cancelled (its task aborted and awaited, its reply
    /// never queued) and then Rflush is sent; otherwise Rflush is queued at once, behind the
    /// flushed request's reply if that was queued already.
    fn flush(&self, tag: u16, oldtag: u16, permit: OwnedSemaphorePermit) {
        let mut shared = self.shared();
        match shared.inflight.remove(&oldtag) {
            Some(victim) => {
                drop(shared);
                victim.task.abort();
                let out = self.out.clone();
                tokio::spawn(async move {
                    // The handler's future is dropped before the peer learns the tag is free.
                    let _ = victim.task.await;
                    let frame = wire::encode(&Msg {
                        tag,
                        body: FCall::RFlush,
                    });
                    let _ = out.send(Outgoing {
                        frame,
                        _permit: permit,
                    });
                });
            }
            None => {
                let frame = wire::encode(&Msg {
                    tag,
                    body: FCall::RFlush,
                });
                let _ = self.out.send(Outgoing {
                    frame,
                    _permit: permit,
                });
            }
        }
    }

    /// Queues a request behind earlier ones on its fids and spawns its handler.
    fn dispatch(
        self: &Arc<Self>,
        tag: u16,
        body: FCall,
        permit: OwnedSemaphorePermit,
    ) -> Result<(), FrameError> {
        let fids = ops::fids_named(&body);
        let mut shared = self.shared();
        if shared.inflight.contains_key(&tag) {
            return Err(FrameError::Garbage(format!(
                "tag {tag} reused while in flight"
            )));
        }
        let id = shared.next_id;
        shared.next_id += 1;
        let places = shared.fids.enqueue(fids);
        let conn = self.clone();
        // The task needs `shared` to queue its reply, so it cannot finish before it is recorded.
        let task = tokio::spawn(async move { conn.run(tag, id, body, places, permit).await });
        shared.inflight.insert(tag, InFlight { id, task });
        Ok(())
    }

    async fn run(
        self: Arc<Self>,
        tag: u16,
        id: u64,
        body: FCall,
        places: Places,
        permit: OwnedSemaphorePermit,
    ) {
        let Places {
            wait_for,
            done,
            fids,
        } = places;
        // Dropped last (also when the task is aborted): leaves the fids' queues, letting the
        // next request on each fid run.
        let _turn = Turn {
            conn: self.clone(),
            fids,
            _done: done,
        };
        for earlier in wait_for {
            let _ = earlier.await;
        }
        let reply = match self.handle(body).await {
            Ok(reply) => reply,
            Err(e) => {
                debug!("9p request tag {tag}: {e}");
                FCall::RlError { ecode: e.0 }
            }
        };
        let frame = wire::encode(&Msg { tag, body: reply });
        let mut shared = self.shared();
        if shared.inflight.get(&tag).is_some_and(|f| f.id == id) {
            shared.inflight.remove(&tag);
            let _ = self.out.send(Outgoing {
                frame,
                _permit: permit,
            });
        }
    }

    /// Cancels every request in flight and clunks every fid (Tversion, end of connection).
    async fn reset(&self) {
        let tasks: Vec<JoinHandle<()>> = self
            .shared()
            .inflight
            .drain()
            .map(|(_, f)| f.task)
            .collect();
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        let lives = self.shared().fids.drain();
        for live in lives {
            let state = live.lock().await.take();
            if let Some(state) = state {
                self.tree.clunk(state).await;
            }
        }
    }
}

/// If `serve`'s future is dropped (its caller gave up on the connection), the request tasks
/// and the writer it spawned go too, closing the connection; fids are then dropped without
/// `tree.clunk` (clunk is async and there is no one left to await it).
struct AbortOnDrop<T: FileTree> {
    conn: Arc<Conn<T>>,
    writer: Option<tokio::task::AbortHandle>,
}

impl<T: FileTree> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        for (_, req) in self.conn.shared().inflight.drain() {
            req.task.abort();
        }
        if let Some(writer) = &self.writer {
            writer.abort();
        }
    }
}

/// A request's places in its fids' queues; dropping it frees them.
struct Turn<T: FileTree> {
    conn: Arc<Conn<T>>,
    fids: Vec<u32>,
    _done: Vec<oneshot::Sender<()>>,
}

impl<T: FileTree> Drop for Turn<T> {
    fn drop(&mut self) {
        self.conn.shared().fids.release(&self.fids);
    }
}
