//! warren's 9P2000.L server loop and client, on rs9p's message codec.
//!
//! rs9p's own `srv` is not used (it cannot serve a connected fd, never clamps msize, has no real
//! Tflush and races its fid table: see `specs/9p.md`). This crate owns the loop:
//!
//! - [`serve`] serves one connection (any `AsyncRead + AsyncWrite`, e.g. a socketpair end nsd
//!   handed over) with one [`FileTree`] instance — so everything the tree knows about its caller
//!   came with the connection, never from the attach's aname. [`serve_fd`] does the same for a
//!   connected socket passed as a file descriptor.
//! - [`Client`] is a multiplexed client: many requests in flight on one connection, fids managed
//!   for you, and a dropped request future sends Tflush.
//! - [`demo::DemoTree`] is a tiny tree (`hello`, `zero`, `null`) for interop checks and the
//!   `diodload` benchmark (`examples/demo_server.rs`, `scripts/bench-9p`).
//!
//! The contract (normative in `specs/9p.md`): msize negotiated down to [`Limits::max_msize`] and
//! never exceeded; every length checked against the frame before anything is allocated; Tflush
//! answered with Rflush after the flushed request is cancelled, its reply never sent; no live-fid
//! reuse; requests on one fid handled in arrival order, requests on different fids concurrently;
//! walks over 16 names refused; `..` at the attach root stays there; reads and readdirs capped at
//! the requested count; fids and in-flight requests capped per connection; a garbage frame closes
//! that connection only. Why it is so: `docs/9p.md`; how it fares against other 9P peers:
//! `docs/interop.md`.

mod client;
pub mod demo;
mod errno;
mod server;
pub mod synthetic;
pub mod wire;

pub use client::{Client, Fid};
pub use errno::{Errno, Result};
pub use rs9p::{DirEntry, GetAttrMask, QId, QIdType, SetAttr, SetAttrMask, Stat, StatFs, Time};
pub use server::{Limits, serve, serve_fd};

/// The open flags of Tlopen (Linux `O_*` values as 9P2000.L carries them).
pub mod oflags {
    pub const RDONLY: u32 = 0;
    pub const WRONLY: u32 = 1;
    pub const RDWR: u32 = 2;
    pub const ACCMODE: u32 = 3;
    pub const TRUNC: u32 = 0o1000;
}

/// A file tree served on one connection.
///
/// One instance per connection: whoever accepted the connection built the tree from what it knows
/// about the peer (the grant record nsd handed over, or the operator's credentials). The server
/// loop owns each fid's state and guarantees that requests naming the same fid run one at a time,
/// in arrival order, so handlers get `&mut` access without locks of their own.
///
/// Handlers must be cancel-safe: Tflush drops the handler's future. Work that must outlive a
/// flush (a tool call that has started) is spawned by the tree and tracked in the fid's state.
#[async_trait::async_trait]
pub trait FileTree: Send + Sync + 'static {
    /// Per-fid state: created by `attach` and `walk`, dropped (after `clunk`) when the fid is
    /// clunked or removed, or the connection ends.
    type Fid: Send + Sync + 'static;

    /// Tattach. `aname` and `uname` are whatever the peer sent: a tree must not grant anything
    /// on their strength.
    async fn attach(&self, uname: &str, aname: &str, n_uname: u32) -> Result<(QId, Self::Fid)>;

    /// Twalk from `from` through `names` (0 to 16 of them; the loop refuses more). Returns the
    /// qids of the names walked — fewer than `names.len()` when one was not found (then the new
    /// fid is `None`, and the walk of the first name failing is an error, ENOENT) — and, when every
    /// name was walked, the new fid's state. Zero names clones `from`. `..` at the root stays at
    /// the root.
    async fn walk(
        &self,
        from: &Self::Fid,
        names: &[String],
    ) -> Result<(Vec<QId>, Option<Self::Fid>)>;

    /// Tgetattr.
    async fn getattr(&self, fid: &Self::Fid, mask: GetAttrMask) -> Result<(QId, Stat)>;

    /// Tlopen. Returns the qid and the iounit (0: let the client use msize).
    async fn open(&self, fid: &mut Self::Fid, flags: u32) -> Result<(QId, u32)>;

    /// Tread. The loop truncates the answer to `count` (and to what msize allows) whatever the
    /// handler returns, so a handler may return more.
    async fn read(&self, fid: &mut Self::Fid, offset: u64, count: u32) -> Result<Vec<u8>>;

    /// Twrite. Returns the number of bytes taken.
    async fn write(&self, fid: &mut Self::Fid, offset: u64, data: &[u8]) -> Result<u32> {
        let _ = (fid, offset, data);
        Err(Errno::EACCES)
    }

    /// Treaddir. `offset` is 0 or the `offset` field of an entry returned earlier. The loop packs
    /// as many entries as fit in `count` and drops the rest, so a handler may return more.
    async fn readdir(&self, fid: &mut Self::Fid, offset: u64, count: u32) -> Result<Vec<DirEntry>>;

    /// Tclunk, and every fid still open when the connection ends (then in no particular order).
    async fn clunk(&self, fid: Self::Fid) {
        drop(fid);
    }

    /// Tsetattr. Synthetic trees accept a truncate to 0 (`echo x > file` sends one) and nothing
    /// else by default.
    async fn setattr(&self, fid: &mut Self::Fid, valid: SetAttrMask, attr: &SetAttr) -> Result<()> {
        let _ = fid;
        if valid
            .difference(
                SetAttrMask::SIZE | SetAttrMask::ATIME | SetAttrMask::MTIME | SetAttrMask::CTIME,
            )
            .is_empty()
            && (!valid.contains(SetAttrMask::SIZE) || attr.size == 0)
        {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }

    /// Tstatfs.
    async fn statfs(&self, fid: &Self::Fid) -> Result<StatFs> {
        let _ = fid;
        Ok(StatFs {
            typ: 0x01021997,
            bsize: 4096,
            blocks: 0,
            bfree: 0,
            bavail: 0,
            files: 0,
            ffree: 0,
            fsid: 0,
            namelen: 255,
        })
    }

    /// Tlcreate: create `name` in the directory `dir` and open it; on success `dir`'s state
    /// becomes the new file's (9P's rule), so the handler replaces `*dir`.
    async fn create(
        &self,
        dir: &mut Self::Fid,
        name: &str,
        flags: u32,
        mode: u32,
        gid: u32,
    ) -> Result<(QId, u32)> {
        let _ = (dir, name, flags, mode, gid);
        Err(Errno::EACCES)
    }

    /// Tmkdir.
    async fn mkdir(&self, dir: &Self::Fid, name: &str, mode: u32, gid: u32) -> Result<QId> {
        let _ = (dir, name, mode, gid);
        Err(Errno::EACCES)
    }

    /// Tunlinkat.
    async fn unlinkat(&self, dir: &Self::Fid, name: &str, flags: u32) -> Result<()> {
        let _ = (dir, name, flags);
        Err(Errno::EACCES)
    }

    /// Tfsync. Synthetic files have nothing to sync.
    async fn fsync(&self, fid: &Self::Fid) -> Result<()> {
        let _ = fid;
        Ok(())
    }
}
