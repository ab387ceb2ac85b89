//! A multiplexed 9P2000.L client: many requests in flight on one connection.
//!
//! A reader task hands each reply to the request waiting on its tag. A request future dropped
//! before its reply sends Tflush; its tag stays reserved until Rflush arrives. Fid numbers are
//! reused only after the server answered their Tclunk. When the connection is lost, every
//! request waiting gets ECONNRESET and every later one ENOTCONN.
//!
//! Why one file: `Client` and `Fid` share the tag and fid tables and the flush-on-drop rule.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rs9p::{Data, DirEntry, FCall, GetAttrMask, Msg, NOFID, NONUNAME, QId, Stat};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::wire::{self, IOHDRSZ, MAXWELEM};
use crate::{Errno, Result};

/// The msize `connect_unix` offers.
const DEFAULT_MSIZE: u32 = 1 << 20;

/// A connection to a 9P2000.L server. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    msize: u32,
    out: mpsc::UnboundedSender<Vec<u8>>,
    state: Arc<Mutex<State>>,
}

enum Pending {
    /// A request waiting for its reply.
    Waiting(oneshot::Sender<Result<FCall>>),
    /// A request given up on: Tflush sent, tag reserved until Rflush.
    Flushing,
    /// A Tflush in flight for `oldtag`.
    Flush { oldtag: u16 },
}

struct State {
    pending: HashMap<u16, Pending>,
    next_tag: u16,
    next_fid: u32,
    free_fids: Vec<u32>,
    closed: bool,
}

impl State {
    fn alloc_tag(&mut self) -> Result<u16> {
        for _ in 0..=u16::MAX {
            let tag = self.next_tag;
            self.next_tag = self.next_tag.wrapping_add(1);
            if tag != rs9p::NOTAG && !self.pending.contains_key(&tag) {
                return Ok(tag);
            }
        }
        Err(Errno::EAGAIN)
    }

    fn alloc_fid(&mut self) -> u32 {
        if let Some(fid) = self.free_fids.pop() {
            return fid;
        }
        let fid = self.next_fid;
        self.next_fid += 1;
        if self.next_fid == NOFID {
            self.next_fid = 0;
        }
        fid
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a server may take to answer the version handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Client {
    /// Connects to a Unix socket and negotiates 9P2000.L with msize 1 MiB (or less, as the server says).
    pub async fn connect_unix(path: impl AsRef<Path>) -> std::io::Result<Client> {
        let stream = tokio::net::UnixStream::connect(path).await?;
        Client::new(stream, DEFAULT_MSIZE).await
    }

    /// Speaks 9P2000.L on an already-connected stream (a socketpair end, a TCP stream, …).
    pub async fn new<S>(stream: S, msize: u32) -> std::io::Result<Client>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, mut wr) = tokio::io::split(Box::pin(stream));
        let mut rd = wire::FrameReader::new(rd);
        let offer = msize.max(wire::MIN_MSIZE);
        let tversion = Msg {
            tag: rs9p::NOTAG,
            body: FCall::TVersion {
                msize: offer,
                version: rs9p::P92000L.into(),
            },
        };
        // Bounded: a server that accepts and never answers (a daemon down or wedged) must not
        // hold its client forever.
        let handshake = async {
            wr.write_all(&wire::encode(&tversion)).await?;
            Ok::<_, std::io::Error>(rd.next(offer).await?)
        };
        let frame = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no answer to Tversion within {} s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ),
                )
            })??
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "no Rversion"))?;
        let msize = match wire::decode_reply(&frame)?.body {
            FCall::RVersion { msize, version } if version == rs9p::P92000L => msize.min(offer),
            FCall::RVersion { version, .. } => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!("server speaks {version:?}, not 9P2000.L"),
                ));
            }
            FCall::RlError { ecode } => return Err(Errno(ecode).into()),
            other => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unexpected reply to Tversion: {other:?}"),
                ));
            }
        };
        if msize < wire::MIN_MSIZE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("server msize {msize} below {}", wire::MIN_MSIZE),
            ));
        }
        let state = Arc::new(Mutex::new(State {
            pending: HashMap::new(),
            next_tag: 0,
            next_fid: 0,
            free_fids: Vec::new(),
            closed: false,
        }));
        let (out, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(wr, rx));
        tokio::spawn(read_loop(rd, msize, state.clone()));
        Ok(Client {
            inner: Arc::new(Inner { msize, out, state }),
        })
    }

    /// The negotiated msize.
    pub fn msize(&self) -> u32 {
        self.inner.msize
    }

    /// Tattach (Tauth is not used). The fid is clunked when the returned `Fid` is dropped.
    pub async fn attach(&self, uname: &str, aname: &str) -> Result<Fid> {
        let fid = lock(&self.inner.state).alloc_fid();
        let reply = self
            .rpc(FCall::TAttach {
                fid,
                afid: NOFID,
                uname: uname.into(),
                aname: aname.into(),
                n_uname: NONUNAME,
            })
            .await;
        match reply {
            Ok(FCall::RAttach { qid }) => Ok(Fid::new(self.clone(), fid, qid)),
            Ok(other) => {
                self.free_fid(fid);
                Err(unexpected(&other))
            }
            Err(e) => {
                self.free_fid(fid);
                Err(e)
            }
        }
    }

    /// Sends one request and waits for its reply; Rlerror comes back as `Err`. Dropping the
    /// future before the reply sends Tflush for its tag (the tag is reused only after Rflush).
    pub async fn rpc(&self, body: FCall) -> Result<FCall> {
        let (tx, rx) = oneshot::channel();
        let tag = {
            let mut state = lock(&self.inner.state);
            if state.closed {
                return Err(Errno::ENOTCONN);
            }
            let tag = state.alloc_tag()?;
            state.pending.insert(tag, Pending::Waiting(tx));
            tag
        };
        let mut guard = FlushOnDrop {
            client: self,
            tag,
            armed: true,
        };
        if self
            .inner
            .out
            .send(wire::encode(&Msg { tag, body }))
            .is_err()
        {
            guard.armed = false;
            lock(&self.inner.state).pending.remove(&tag);
            return Err(Errno::ENOTCONN);
        }
        let reply = rx.await;
        guard.armed = false;
        match reply {
            Ok(reply) => reply,
            Err(_) => Err(Errno::ECONNRESET),
        }
    }

    /// A fid number whose server-side fid is known not to exist (never created, or clunked).
    fn free_fid(&self, fid: u32) {
        lock(&self.inner.state).free_fids.push(fid);
    }
}

/// Sends Tflush for a request whose future was dropped before its reply arrived.
struct FlushOnDrop<'a> {
    client: &'a Client,
    tag: u16,
    armed: bool,
}

impl Drop for FlushOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = lock(&self.client.inner.state);
        if !matches!(state.pending.get(&self.tag), Some(Pending::Waiting(_))) {
            return; // the reply arrived (and was dropped with the receiver), or the connection is gone
        }
        let Ok(flush_tag) = state.alloc_tag() else {
            return; // no tag to flush with: the reply, when it comes, frees the tag
        };
        state.pending.insert(self.tag, Pending::Flushing);
        state
            .pending
            .insert(flush_tag, Pending::Flush { oldtag: self.tag });
        let frame = wire::encode(&Msg {
            tag: flush_tag,
            body: FCall::TFlush { oldtag: self.tag },
        });
        let _ = self.client.inner.out.send(frame);
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(wr: W, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(frame) = next {
            if wr.write_all(&frame).await.is_err() {
                return;
            }
            next = rx.try_recv().ok();
        }
        if wr.flush().await.is_err() {
            return;
        }
    }
    // Every `Client` clone is gone: tell the server we are done.
    let _ = wr.shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: wire::FrameReader<R>,
    msize: u32,
    state: Arc<Mutex<State>>,
) {
    loop {
        let frame = match rd.next(msize).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(wire::FrameError::Io(e)) => {
                debug!("9p client connection ended: {e}");
                break;
            }
            Err(e) => {
                warn!("9p client dropping connection: {e}");
                break;
            }
        };
        let msg = match wire::decode_reply(&frame) {
            Ok(msg) => msg,
            Err(e) => {
                warn!("9p client dropping connection: {e}");
                break;
            }
        };
        deliver(&state, msg);
    }
    let mut state = lock(&state);
    state.closed = true;
    for (_, pending) in state.pending.drain() {
        if let Pending::Waiting(tx) = pending {
            let _ = tx.send(Err(Errno::ECONNRESET));
        }
    }
}

fn deliver(state: &Mutex<State>, msg: Msg) {
    let mut state = lock(state);
    match state.pending.remove(&msg.tag) {
        Some(Pending::Waiting(tx)) => {
            let reply = match msg.body {
                FCall::RlError { ecode } => Err(Errno(ecode)),
                body => Ok(body),
            };
            let _ = tx.send(reply);
        }
        Some(Pending::Flushing) => {
            // The flushed request's reply won the race; its tag stays reserved until Rflush.
            state.pending.insert(msg.tag, Pending::Flushing);
        }
        Some(Pending::Flush { oldtag }) => {
            state.pending.remove(&oldtag);
        }
        None => debug!("9p client: reply for unknown tag {}", msg.tag),
    }
}

fn unexpected(reply: &FCall) -> Errno {
    warn!(
        "9p client: unexpected reply {:?}",
        rs9p::MsgType::from(reply)
    );
    Errno::EPROTO
}

/// A fid on a [`Client`]. Dropping it clunks it in the background.
pub struct Fid {
    client: Client,
    id: u32,
    qid: QId,
    /// False once clunked (or handed to a background clunk).
    live: bool,
}

impl Fid {
    fn new(client: Client, id: u32, qid: QId) -> Fid {
        Fid {
            client,
            id,
            qid,
            live: true,
        }
    }

    pub fn qid(&self) -> QId {
        self.qid
    }
    /// The fid number on the wire.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// One Twalk of at most 16 names from `from` to `to`. Returns the qids walked.
    async fn walk_once(&self, from: u32, to: u32, names: &[&str]) -> Result<Vec<QId>> {
        let wnames = names.iter().map(|n| n.to_string()).collect();
        match self
            .client
            .rpc(FCall::TWalk {
                fid: from,
                newfid: to,
                wnames,
            })
            .await?
        {
            FCall::RWalk { wqids } if wqids.len() == names.len() => Ok(wqids),
            FCall::RWalk { .. } => Err(Errno::ENOENT),
            other => Err(unexpected(&other)),
        }
    }

    /// Walks to a new fid; more than 16 names are sent as several Twalks.
    pub async fn walk(&self, names: &[&str]) -> Result<Fid> {
        let newfid = lock(&self.client.inner.state).alloc_fid();
        let mut chunks = names.chunks(MAXWELEM);
        let first = chunks.next().unwrap_or(&[]);
        let qids = match self.walk_once(self.id, newfid, first).await {
            Ok(qids) => qids,
            Err(e) => {
                // A failed or partial walk creates no fid.
                self.client.free_fid(newfid);
                return Err(e);
            }
        };
        let mut fid = Fid::new(
            self.client.clone(),
            newfid,
            qids.last().copied().unwrap_or(self.qid),
        );
        for chunk in chunks {
            // On failure `fid` is dropped, which clunks it where the last walk left it.
            let qids = fid.walk_once(newfid, newfid, chunk).await?;
            fid.qid = qids.last().copied().unwrap_or(fid.qid);
        }
        Ok(fid)
    }

    /// Walks a slash-separated path (empty components ignored).
    pub async fn walk_path(&self, path: &str) -> Result<Fid> {
        let names: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        self.walk(&names).await
    }

    pub async fn getattr(&self) -> Result<(QId, Stat)> {
        match self
            .client
            .rpc(FCall::TGetAttr {
                fid: self.id,
                req_mask: GetAttrMask::BASIC,
            })
            .await?
        {
            FCall::RGetAttr { qid, stat, .. } => Ok((qid, stat)),
            other => Err(unexpected(&other)),
        }
    }

    /// Tlopen with Linux open flags (see [`crate::oflags`]). Returns (qid, iounit).
    pub async fn open(&self, flags: u32) -> Result<(QId, u32)> {
        match self
            .client
            .rpc(FCall::TlOpen {
                fid: self.id,
                flags,
            })
            .await?
        {
            FCall::RlOpen { qid, iounit } => Ok((qid, iounit)),
            other => Err(unexpected(&other)),
        }
    }

    /// The most data one Tread or Twrite carries at this msize.
    fn io_room(&self) -> u32 {
        self.client.msize() - IOHDRSZ
    }

    /// One Tread of at most `count` bytes (clamped to what msize allows).
    pub async fn read(&self, offset: u64, count: u32) -> Result<Vec<u8>> {
        let count = count.min(self.io_room());
        match self
            .client
            .rpc(FCall::TRead {
                fid: self.id,
                offset,
                count,
            })
            .await?
        {
            FCall::RRead { data } if data.0.len() <= count as usize => Ok(data.0),
            FCall::RRead { .. } => Err(Errno::EPROTO),
            other => Err(unexpected(&other)),
        }
    }

    /// Reads from `offset` until a read returns 0 bytes.
    pub async fn read_to_end(&self, offset: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let chunk = self.read(offset + out.len() as u64, self.io_room()).await?;
            if chunk.is_empty() {
                return Ok(out);
            }
            out.extend_from_slice(&chunk);
        }
    }

    /// One Twrite (the data must fit the msize; what does not fit is not sent, and the count
    /// returned says how much was taken).
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<u32> {
        let data = &data[..data.len().min(self.io_room() as usize)];
        let sent = data.len() as u32;
        match self
            .client
            .rpc(FCall::TWrite {
                fid: self.id,
                offset,
                data: Data(data.to_vec()),
            })
            .await?
        {
            FCall::RWrite { count } if count <= sent => Ok(count),
            FCall::RWrite { .. } => Err(Errno::EPROTO),
            other => Err(unexpected(&other)),
        }
    }

    /// One request/reply on an rpc file (the gate's `decide`, receiptd's `append`): the write and
    /// the first read are sent back to back without waiting for the write's reply. The server
    /// handles requests on one fid in arrival order, so the read sees the write's reply; this
    /// saves a round trip per call. A refused write comes back with the errno and whatever the
    /// file says about it (the rpc files put their error message in the reply).
    pub async fn call(&self, request: &[u8]) -> std::result::Result<Vec<u8>, (Errno, Vec<u8>)> {
        /// Replies larger than this take a second read.
        const FIRST_READ: u32 = 64 * 1024;
        let (written, first) = tokio::join!(self.write(0, request), self.read(0, FIRST_READ));
        match (written, first) {
            (Ok(n), _) if n as usize != request.len() => Err((Errno::EMSGSIZE, Vec::new())),
            (Ok(_), Ok(mut reply)) => {
                if reply.len() == FIRST_READ as usize {
                    let rest = self
                        .read_to_end(reply.len() as u64)
                        .await
                        .map_err(|e| (e, Vec::new()))?;
                    reply.extend_from_slice(&rest);
                }
                Ok(reply)
            }
            (Ok(_), Err(e)) => Err((e, Vec::new())),
            (Err(e), said) => Err((e, said.unwrap_or_default())),
        }
    }

    /// Writes all of `data` from `offset`, in msize-sized pieces.
    pub async fn write_all(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let n = self.write(offset + done as u64, &data[done..]).await?;
            if n == 0 {
                return Err(Errno::EIO);
            }
            done += n as usize;
        }
        Ok(())
    }

    /// The names in an opened directory, in the server's order.
    pub async fn read_dir_names(&self) -> Result<Vec<String>> {
        Ok(self
            .readdir_all()
            .await?
            .into_iter()
            .map(|e| e.name)
            .collect())
    }

    /// Every entry of an opened directory.
    pub async fn readdir_all(&self) -> Result<Vec<DirEntry>> {
        let mut out: Vec<DirEntry> = Vec::new();
        let mut offset = 0;
        loop {
            let count = self.io_room();
            let entries = match self
                .client
                .rpc(FCall::TReadDir {
                    fid: self.id,
                    offset,
                    count,
                })
                .await?
            {
                FCall::RReadDir { data } => data.data,
                other => return Err(unexpected(&other)),
            };
            let Some(last) = entries.last() else {
                return Ok(out);
            };
            if last.offset == offset {
                return Err(Errno::EPROTO); // a server that would make us loop forever
            }
            offset = last.offset;
            out.extend(entries);
        }
    }

    /// Tclunk now (instead of in the background at drop).
    pub async fn clunk(mut self) -> Result<()> {
        self.live = false;
        clunk(&self.client, self.id).await
    }
}

/// Clunks `fid`; its number is reused once the server answered (9P: the fid is gone even when
/// the answer is an error). A clunk that never got an answer leaves the number unused.
async fn clunk(client: &Client, fid: u32) -> Result<()> {
    let reply = client.rpc(FCall::TClunk { fid }).await;
    if !matches!(reply, Err(Errno::ECONNRESET | Errno::ENOTCONN)) {
        client.free_fid(fid);
    }
    reply.map(drop)
}

impl Drop for Fid {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let id = self.id;
            rt.spawn(async move {
                let _ = clunk(&client, id).await;
            });
        }
    }
}
