//! Names and attributes: LOOKUP, GETATTR, SETATTR, CREATE, MKDIR, UNLINK, RMDIR.

use polyfuse_kernel as abi;
use rs9p::FCall;
use warren_9p::{Errno, Fid, QIdType, oflags};

use super::utf8_name;
use crate::attr;
use crate::reply;
use crate::session::{FOPEN_NOFLUSH, OpenFile, Reply, Session};

impl Session {
    pub(super) async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Reply, Errno> {
        // A name 9P cannot carry cannot exist on the server.
        let name = utf8_name(name, Errno::ENOENT)?;
        let att = self.conn.current();
        let dir = self.node_fid(parent, &att).await?;
        let fid = dir.walk(&[name]).await?;
        self.entry_reply(parent, name, fid, att.generation).await
    }

    /// Attributes of a freshly walked `fid` for `name` in `parent`, recorded as one more
    /// kernel reference (undone if the reply is lost).
    async fn entry_reply(
        &self,
        parent: u64,
        name: &str,
        fid: Fid,
        generation: u64,
    ) -> Result<Reply, Errno> {
        let (qid, stat) = fid.getattr().await?;
        let attr = attr::fuse_attr(
            &qid,
            &stat,
            self.settings.owner,
            self.settings.direct_io_all,
        );
        let nodeid = self
            .nodes()
            .add_lookup(parent, name, fid, generation, stat.size);
        let entry = attr::entry_out(nodeid, attr, self.settings.ttl);
        Ok(Reply {
            body: reply::body(&entry),
            forget_if_lost: Some(nodeid),
            close_if_lost: None,
        })
    }

    pub(super) async fn getattr(&self, nodeid: u64) -> Result<Reply, Errno> {
        let att = self.conn.current();
        let fid = self.node_fid(nodeid, &att).await?;
        self.attr_reply(nodeid, &fid).await
    }

    async fn attr_reply(&self, nodeid: u64, fid: &Fid) -> Result<Reply, Errno> {
        let (qid, stat) = fid.getattr().await?;
        self.nodes().set_size(nodeid, stat.size);
        let attr = attr::fuse_attr(
            &qid,
            &stat,
            self.settings.owner,
            self.settings.direct_io_all,
        );
        Ok(Reply::plain(reply::body(&attr::attr_out(
            attr,
            self.settings.ttl,
        ))))
    }

    /// chown refused, setid bits stripped (see `attr::setattr`). A truncate through an open
    /// file goes to that open's fid, so a transaction file sees it on its own open.
    pub(super) async fn setattr(
        &self,
        nodeid: u64,
        input: &abi::fuse_setattr_in,
    ) -> Result<Reply, Errno> {
        let change = attr::setattr(input)?;
        let att = self.conn.current();
        let node_fid = self.node_fid(nodeid, &att).await?;
        if let Some((valid, stat)) = change {
            let open = (input.valid & abi::FATTR_FH != 0)
                .then(|| self.file(input.fh).ok())
                .flatten();
            let (client, fid) = match &open {
                Some(file) => (&file.client, file.fid.id()),
                None => (&att.client, node_fid.id()),
            };
            client.rpc(FCall::TSetAttr { fid, valid, stat }).await?;
        }
        self.attr_reply(nodeid, &node_fid).await
    }

    /// Tlcreate on a clone of the directory's fid (which becomes the open file), then a walk
    /// for the new node. Setid bits never reach the server.
    pub(super) async fn create(
        &self,
        parent: u64,
        name: &[u8],
        flags: u32,
        mode: u32,
    ) -> Result<Reply, Errno> {
        let name = utf8_name(name, Errno::EINVAL)?;
        let att = self.conn.current();
        let dir = self.node_fid(parent, &att).await?;
        if flags & libc::O_EXCL as u32 == 0
            && let Ok(node) = dir.walk(&[name]).await
        {
            // open(2)'s rule: O_CREAT without O_EXCL on an existing name opens it. The kernel
            // sends CREATE for a name it has not looked up yet (dash's `3<>call` does this).
            return self.open_existing(parent, name, node, flags, &att).await;
        }
        let opened = dir.walk(&[]).await?;
        let lflags =
            flags & (oflags::ACCMODE | libc::O_APPEND as u32 | libc::O_EXCL as u32 | oflags::TRUNC);
        let created = FCall::TlCreate {
            fid: opened.id(),
            name: name.to_owned(),
            flags: lflags,
            mode: attr::create_mode(mode),
            gid: self.settings.owner.gid,
        };
        att.client.rpc(created).await?;
        let node = dir.walk(&[name]).await?;
        let mut entry = self.entry_reply(parent, name, node, att.generation).await?;
        let open_flags = self.open_flags(0);
        let fh = self.add_file(OpenFile::new(
            opened,
            att.client.clone(),
            att.generation,
            false,
            open_flags & abi::FOPEN_DIRECT_IO != 0,
        ));
        let open = abi::fuse_open_out {
            fh,
            open_flags,
            padding: 0,
        };
        entry.body.extend_from_slice(&reply::body(&open));
        entry.close_if_lost = Some(fh);
        Ok(entry)
    }

    /// CREATE of a name that exists: its entry, and an open of it with the caller's flags.
    async fn open_existing(
        &self,
        parent: u64,
        name: &str,
        node: warren_9p::Fid,
        flags: u32,
        att: &crate::conn::Attachment,
    ) -> Result<Reply, Errno> {
        let opened = node.walk(&[]).await?;
        let (_, stat) = node.getattr().await?;
        opened
            .open(flags & (oflags::ACCMODE | libc::O_APPEND as u32 | oflags::TRUNC))
            .await?;
        let mut entry = self.entry_reply(parent, name, node, att.generation).await?;
        let open_flags = self.open_flags(stat.size);
        let fh = self.add_file(OpenFile::new(
            opened,
            att.client.clone(),
            att.generation,
            false,
            open_flags & abi::FOPEN_DIRECT_IO != 0,
        ));
        let open = abi::fuse_open_out {
            fh,
            open_flags,
            padding: 0,
        };
        entry.body.extend_from_slice(&reply::body(&open));
        entry.close_if_lost = Some(fh);
        Ok(entry)
    }

    pub(super) async fn mkdir(&self, parent: u64, name: &[u8], mode: u32) -> Result<Reply, Errno> {
        let name = utf8_name(name, Errno::EINVAL)?;
        let att = self.conn.current();
        let dir = self.node_fid(parent, &att).await?;
        let made = FCall::TMkDir {
            dfid: dir.id(),
            name: name.to_owned(),
            mode: attr::create_mode(mode),
            gid: self.settings.owner.gid,
        };
        att.client.rpc(made).await?;
        let node = dir.walk(&[name]).await?;
        self.entry_reply(parent, name, node, att.generation).await
    }

    pub(super) async fn unlink(
        &self,
        parent: u64,
        name: &[u8],
        flags: u32,
    ) -> Result<Reply, Errno> {
        let name = utf8_name(name, Errno::ENOENT)?;
        let att = self.conn.current();
        let dir = self.node_fid(parent, &att).await?;
        let unlinked = att
            .client
            .rpc(FCall::TUnlinkAt {
                dirfd: dir.id(),
                name: name.to_owned(),
                flags,
            })
            .await;
        match unlinked {
            // Servers without Tunlinkat (diod among them): walk to the name and Tremove it,
            // as the kernel's own v9fs client does, checking the kind first since Tremove
            // removes files and directories alike.
            Err(e) if e == Errno::EOPNOTSUPP || e == Errno::ENOSYS => {
                let target = dir.walk(&[name]).await?;
                let is_dir = target.qid().typ.contains(QIdType::DIR);
                let rmdir = flags & libc::AT_REMOVEDIR as u32 != 0;
                if is_dir != rmdir {
                    return Err(if is_dir {
                        Errno::EISDIR
                    } else {
                        Errno::ENOTDIR
                    });
                }
                // Tremove clunks the fid on the server whatever its outcome; the Fid's own
                // clunk at drop is then answered with an error and only frees the number.
                att.client.rpc(FCall::TRemove { fid: target.id() }).await?;
            }
            other => {
                other?;
            }
        }
        self.nodes().unlink_name(parent, name);
        Ok(Reply::plain(Vec::new()))
    }

    /// FOPEN flags for a file whose last known 9P size is `size`: DIRECT_IO for every file of
    /// a synthetic tree (or any file reporting size 0, which is how synthetic files look), so
    /// reads reach the server instead of ending at the kernel's idea of the size; NOFLUSH on
    /// every file, since FLUSH is a no-op here (9P has no close-time flush; RELEASE clunks).
    /// Never NONSEEKABLE, STREAM or KEEP_CACHE.
    pub(super) fn open_flags(&self, size: u64) -> u32 {
        let direct = if self.settings.direct_io_all || size == 0 {
            abi::FOPEN_DIRECT_IO
        } else {
            0
        };
        direct | FOPEN_NOFLUSH
    }
}
