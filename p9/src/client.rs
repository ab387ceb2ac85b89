//! A multiplexed 9P2000.L client: many requests in flight on one connection.

use std::path::Path;

use rs9p::{DirEntry, FCall, QId, Stat};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::Result;

/// A connection to a 9P2000.L server. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {}

impl Client {
    /// Connects to a Unix socket and negotiates 9P2000.L with msize 1 MiB (or less, as the server says).
    pub async fn connect_unix(path: impl AsRef<Path>) -> std::io::Result<Client> {
        let _ = path;
        unimplemented!()
    }

    /// Speaks 9P2000.L on an already-connected stream (a socketpair end, a TCP stream, …).
    pub async fn new<S>(stream: S, msize: u32) -> std::io::Result<Client>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let _ = (stream, msize);
        unimplemented!()
    }

    /// The negotiated msize.
    pub fn msize(&self) -> u32 {
        unimplemented!()
    }

    /// Tattach (Tauth is not used). The fid is clunked when the returned `Fid` is dropped.
    pub async fn attach(&self, uname: &str, aname: &str) -> Result<Fid> {
        let _ = (uname, aname);
        unimplemented!()
    }

    /// Sends one request and waits for its reply; Rlerror comes back as `Err`. Dropping the
    /// future before the reply sends Tflush for its tag (the tag is reused only after Rflush).
    pub async fn rpc(&self, body: FCall) -> Result<FCall> {
        let _ = body;
        unimplemented!()
    }
}

/// A fid on a [`Client`]. Dropping it clunks it in the background.
pub struct Fid {}

impl Fid {
    pub fn qid(&self) -> QId {
        unimplemented!()
    }
    /// The fid number on the wire.
    pub fn id(&self) -> u32 {
        unimplemented!()
    }
    /// Walks to a new fid; more than 16 names are sent as several Twalks.
    pub async fn walk(&self, names: &[&str]) -> Result<Fid> {
        let _ = names;
        unimplemented!()
    }
    /// Walks a slash-separated path (empty components ignored).
    pub async fn walk_path(&self, path: &str) -> Result<Fid> {
        let _ = path;
        unimplemented!()
    }
    pub async fn getattr(&self) -> Result<(QId, Stat)> {
        unimplemented!()
    }
    /// Tlopen with Linux open flags (see [`crate::oflags`]). Returns (qid, iounit).
    pub async fn open(&self, flags: u32) -> Result<(QId, u32)> {
        let _ = flags;
        unimplemented!()
    }
    /// One Tread of at most `count` bytes (clamped to what msize allows).
    pub async fn read(&self, offset: u64, count: u32) -> Result<Vec<u8>> {
        let _ = (offset, count);
        unimplemented!()
    }
    /// Reads from `offset` until a read returns 0 bytes.
    pub async fn read_to_end(&self, offset: u64) -> Result<Vec<u8>> {
        let _ = offset;
        unimplemented!()
    }
    /// One Twrite (the data must fit the msize).
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<u32> {
        let _ = (offset, data);
        unimplemented!()
    }
    /// Writes all of `data` from `offset`, in msize-sized pieces.
    pub async fn write_all(&self, offset: u64, data: &[u8]) -> Result<()> {
        let _ = (offset, data);
        unimplemented!()
    }
    /// Every entry of an opened directory.
    pub async fn readdir_all(&self) -> Result<Vec<DirEntry>> {
        unimplemented!()
    }
    /// Tclunk now (instead of in the background at drop).
    pub async fn clunk(self) -> Result<()> {
        unimplemented!()
    }
}
