//! Open files: OPEN/OPENDIR, READ, WRITE, READDIR, RELEASE/RELEASEDIR, FSYNC, and STATFS.

use std::sync::Arc;

use polyfuse_kernel as abi;
use rs9p::FCall;
use warren_9p::{Errno, oflags};

use crate::attr;
use crate::reply::{self, DirentBuf};
use crate::session::{OpenFile, Reply, Session, written};

impl Session {
    /// A fresh fid cloned from the node's and Tlopen'ed: one FUSE open is one 9P open, which is
    /// what makes each open of a transaction file its own call. `flags` is `None` for OPENDIR.
    pub(super) async fn open(&self, nodeid: u64, flags: Option<u32>) -> Result<Reply, Errno> {
        let att = self.conn.current();
        let node_fid = self.node_fid(nodeid, &att).await?;
        let size = self.nodes().get(nodeid).map_or(0, |n| n.size);
        let spare = self.nodes().take_spare(nodeid, att.generation);
        let fid = match spare {
            Some(fid) => fid,
            None => node_fid.walk(&[]).await?,
        };
        if flags.is_some() {
            self.walk_spare(nodeid, node_fid, att.generation);
        }
        // The kernel strips O_CREAT/O_EXCL/O_NOCTTY, and O_TRUNC (no atomic_o_trunc).
        let lflags = flags.map_or(oflags::RDONLY, |f| {
            f & (oflags::ACCMODE | libc::O_APPEND as u32)
        });
        fid.open(lflags).await?;
        // Only a reader-and-writer's write may wait for its read: a write-only open has no
        // read to carry its write, and must see its error at once.
        let defers_writes =
            self.settings.call_files && flags.is_some_and(|f| f & oflags::ACCMODE == oflags::RDWR);
        let open_flags = if flags.is_some() {
            self.open_flags(size)
        } else {
            0
        };
        let mut file = OpenFile::new(
            fid,
            att.client.clone(),
            att.generation,
            defers_writes,
            open_flags & abi::FOPEN_DIRECT_IO != 0,
        );
        if defers_writes
            && self.settings.calls.is_some()
            && let Some(path) = self.nodes().path(nodeid)
            && let [tool, call] = path.as_slice()
            && call == "call"
        {
            file = file.seeing(tool.clone());
        }
        let fh = self.add_file(file);
        let out = abi::fuse_open_out {
            fh,
            open_flags,
            padding: 0,
        };
        Ok(Reply {
            body: reply::body(&out),
            forget_if_lost: None,
            close_if_lost: Some(fh),
        })
    }

    /// Walks the next OPEN's fid for `nodeid` in the background (a walk has no effect on the
    /// server beyond the fid: a transaction starts at Tlopen, never at Twalk).
    fn walk_spare(&self, nodeid: u64, node_fid: Arc<warren_9p::Fid>, generation: u64) {
        let nodes = self.nodes.clone();
        tokio::spawn(async move {
            if let Ok(spare) = node_fid.walk(&[]).await {
                nodes
                    .lock()
                    .expect("node table lock")
                    .put_spare(nodeid, generation, spare);
            }
        });
    }

    /// One Tread, unless the kernel asked for more than one 9P message can carry (a small
    /// msize): a short read means end of file to the page cache, so then read on.
    /// A deferred write goes out with the read, pipelined on the fid (the server serves one
    /// fid's requests in order, so the read sees it): one round trip for both. If the server
    /// refused the write, the read fails with the write's errno and its own answer is dropped
    /// (toolfs runs nothing on a call whose write was refused: specs/tool-tree.md §4).
    /// A page-cache read (`direct` false: splice, sendfile, mmap) of a direct-I/O file is refused
    /// with EIO before anything reaches the server: it comes at a page-aligned offset, not the
    /// descriptor's, so on a call or rpc file it would run the call at the wrong o₀ (or make
    /// a namespace). sendfile then fails and busybox `cat` falls back to read(2).
    pub(super) async fn read(
        &self,
        fh: u64,
        offset: u64,
        size: u32,
        direct: bool,
    ) -> Result<Reply, Errno> {
        let file = self.file(fh)?;
        if file.direct_io && !direct {
            return Err(Errno::EIO);
        }
        let mut data = match file.take_deferred_for_read() {
            Some(w) => {
                let (sent, read) = tokio::join!(
                    file.fid.write(w.offset, &w.data),
                    file.fid.read(offset, size)
                );
                written(sent, w.data.len())?;
                read?
            }
            None => file.fid.read(offset, size).await?,
        };
        while data.len() < size as usize
            && data.len() % self.settings.rpc_max as usize == 0
            && !data.is_empty()
        {
            let more = file
                .fid
                .read(offset + data.len() as u64, size - data.len() as u32)
                .await?;
            if more.is_empty() {
                break;
            }
            data.extend_from_slice(&more);
        }
        file.saw_read(offset, &data);
        if data.is_empty() {
            // The end of the result: reported before the reader sees it.
            self.report_call(&file).await;
        }
        Ok(Reply::plain(data))
    }

    /// On a call file opened for reading and writing, a write that fits one Twrite is answered
    /// at once and sent with the next read; a later write first sends (and waits for) the one
    /// before it, so the writes reach the server in order and a refused one fails the next.
    pub(super) async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<Reply, Errno> {
        let file = self.file(fh)?;
        if data.len() <= self.settings.rpc_max as usize && file.defer(offset, data) {
            file.saw_write(offset, data);
            return Ok(write_out(data.len() as u32));
        }
        file.send_deferred().await?;
        let written = if data.len() <= self.settings.rpc_max as usize {
            file.fid.write(offset, data).await?
        } else {
            file.fid.write_all(offset, data).await?;
            data.len() as u32
        };
        file.saw_write(offset, &data[..(written as usize).min(data.len())]);
        Ok(write_out(written))
    }

    /// Treaddir from the kernel's cookie; entries packed as `fuse_dirent`s until `size` is
    /// full. Each entry's 9P offset is its cookie, so the kernel resumes right after the last
    /// entry that fitted.
    pub(super) async fn readdir(&self, fh: u64, offset: u64, size: u32) -> Result<Reply, Errno> {
        let file = self.file(fh)?;
        let count = size.min(self.settings.rpc_max);
        let answer = file
            .client
            .rpc(FCall::TReadDir {
                fid: file.fid.id(),
                offset,
                count,
            })
            .await?;
        let FCall::RReadDir { data } = answer else {
            return Err(Errno::EIO);
        };
        let mut dirents = DirentBuf::new(size as usize);
        for entry in &data.data {
            // A cookie equal to the one we resumed from would make the kernel ask again
            // forever (a broken or hostile server): end the listing there.
            if entry.offset == offset {
                break;
            }
            let typ = attr::dirent_type(entry.typ, &entry.qid);
            if !dirents.push(
                attr::ino(&entry.qid),
                entry.offset,
                typ,
                entry.name.as_bytes(),
            ) {
                break;
            }
        }
        Ok(Reply::plain(dirents.into_body()))
    }

    /// Clunks the open fid before answering, so whatever the server does at clunk (a transaction
    /// file withdrawing an unstarted call) has happened when RELEASE returns. A read still
    /// running on the handle keeps the fid alive; it is clunked when that read ends.
    /// A write still deferred is sent first (what a server does with written-then-closed bytes,
    /// such as toolfs's withdrawn receipt, sees them); its error has nowhere to go (close(2)
    /// sends no FLUSH here), and its call never runs.
    pub(super) async fn release(&self, fh: u64) -> Result<Reply, Errno> {
        let file = self.files().remove(&fh).ok_or(Errno::EBADF)?;
        let _ = file.send_deferred().await;
        // A call whose reader stopped before the end of its result.
        self.report_call(&file).await;
        if let Ok(file) = Arc::try_unwrap(file) {
            // The fid is gone on our side either way; a clunk error changes nothing for the caller.
            let _ = file.fid.clunk().await;
        }
        Ok(Reply::plain(Vec::new()))
    }

    /// Sends the handle's call report (once; see `BridgeOptions::calls`) and waits for its
    /// acknowledgement.
    async fn report_call(&self, file: &OpenFile) {
        let (Some(calls), Some(report)) = (&self.settings.calls, file.report()) else {
            return;
        };
        let (ack, acked) = tokio::sync::oneshot::channel();
        if calls.send((report, ack)).await.is_err() || acked.await.is_err() {
            tracing::warn!("bridge: a call was not reported: the report channel is closed");
        }
    }

    pub(super) async fn fsync(&self, fh: u64) -> Result<Reply, Errno> {
        let file = self.file(fh)?;
        file.send_deferred().await?;
        file.client
            .rpc(FCall::TFSync { fid: file.fid.id() })
            .await?;
        Ok(Reply::plain(Vec::new()))
    }

    pub(super) async fn statfs(&self) -> Result<Reply, Errno> {
        let att = self.conn.current();
        let answer = att
            .client
            .rpc(FCall::TStatFs { fid: att.root.id() })
            .await?;
        let FCall::RStatFs { statfs } = answer else {
            return Err(Errno::EIO);
        };
        Ok(Reply::plain(reply::body(&attr::statfs_out(&statfs))))
    }
}

fn write_out(size: u32) -> Reply {
    Reply::plain(reply::body(&abi::fuse_write_out { size, padding: 0 }))
}
