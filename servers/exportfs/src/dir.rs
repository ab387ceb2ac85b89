//! A host directory served read-only as a 9P tree: what a peers entry's `dir:NAME:/PATH` grants.
//!
//! Every lookup is an `openat2` from the directory's handle (which nsd opened and checked) with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`: nothing outside it, no symlink
//! followed (one shows as a symlink and cannot be opened), no mount below it crossed. Files are
//! read with exportfs's own credentials (uid +8), so only what others may read on the host is
//! served. Nothing is ever written: writes, creation, removal and setattr are EROFS.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use nix::fcntl::{OFlag, ResolveFlag};
use warren_9p::synthetic::walk;
use warren_9p::{DirEntry, Errno, FileTree, QId, QIdType, Result, SetAttr, SetAttrMask, Stat};

pub struct ReadOnlyDir {
    root: Arc<OwnedFd>,
}

impl ReadOnlyDir {
    /// `root`: a handle of the directory (`O_PATH` is enough).
    pub fn new(root: OwnedFd) -> ReadOnlyDir {
        ReadOnlyDir {
            root: Arc::new(root),
        }
    }

    fn resolve(&self, rel: &[String], flags: OFlag) -> Result<OwnedFd> {
        let path = if rel.is_empty() {
            ".".to_owned()
        } else {
            rel.join("/")
        };
        let resolve = ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_XDEV;
        warren_jail::openat2(
            warren_jail::Dir::Fd(self.root.as_fd()),
            path.as_str(),
            (flags | OFlag::O_NOFOLLOW).bits(),
            0,
            resolve.bits(),
        )
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(nix::libc::EIO) as u32))
    }

    fn stat_of(&self, rel: &[String]) -> Result<(QId, Stat)> {
        let fd = self.resolve(rel, OFlag::O_PATH)?;
        let meta = File::from(fd).metadata()?;
        let stat = Stat::from(&meta);
        Ok((qid_of(stat.mode, meta_ino(&meta)), stat))
    }
}

fn meta_ino(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.ino() ^ meta.dev().rotate_left(40)
}

fn qid_of(mode: u32, path: u64) -> QId {
    let typ = match mode & libc::S_IFMT {
        libc::S_IFDIR => QIdType::DIR,
        libc::S_IFLNK => QIdType::SYMLINK,
        _ => QIdType::FILE,
    };
    QId {
        typ,
        version: 0,
        path,
    }
}

/// One fid: its path below the root, and what an open gave it.
pub struct Node {
    rel: Vec<String>,
    file: Option<File>,
    entries: Option<Vec<DirEntry>>,
}

#[async_trait::async_trait]
impl FileTree for ReadOnlyDir {
    type Fid = Node;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, Node)> {
        let (qid, _) = self.stat_of(&[])?;
        Ok((
            qid,
            Node {
                rel: Vec::new(),
                file: None,
                entries: None,
            },
        ))
    }

    async fn walk(&self, from: &Node, names: &[String]) -> Result<(Vec<QId>, Option<Node>)> {
        let (qids, rel) = walk(from.rel.clone(), names, |rel, name| {
            let mut next = rel.clone();
            if name == ".." {
                next.pop();
            } else if name != "." {
                next.push(name.to_string());
            }
            let (qid, _) = self.stat_of(&next)?;
            Ok((next, qid))
        })?;
        let fid = rel.map(|rel| Node {
            rel,
            file: None,
            entries: None,
        });
        Ok((qids, fid))
    }

    async fn getattr(&self, fid: &Node, _mask: warren_9p::GetAttrMask) -> Result<(QId, Stat)> {
        self.stat_of(&fid.rel)
    }

    async fn open(&self, fid: &mut Node, flags: u32) -> Result<(QId, u32)> {
        if flags & warren_9p::oflags::ACCMODE != warren_9p::oflags::RDONLY
            || flags & warren_9p::oflags::TRUNC != 0
        {
            return Err(Errno::EROFS);
        }
        let (qid, _) = self.stat_of(&fid.rel)?;
        if qid.typ.contains(QIdType::SYMLINK) {
            return Err(Errno::ELOOP);
        }
        if qid.typ.contains(QIdType::DIR) {
            let fd = self.resolve(&fid.rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
            fid.entries = Some(list(fd)?);
        } else {
            // Non-blocking, and checked on the handle opened: a FIFO or device put under the
            // directory (or swapped in after the stat above) is refused, never waited on.
            let file = File::from(self.resolve(&fid.rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK)?);
            if !file.metadata()?.is_file() {
                return Err(Errno::EACCES);
            }
            fid.file = Some(file);
        }
        Ok((qid, 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> Result<Vec<u8>> {
        let file = fid.file.as_ref().ok_or(Errno::EISDIR)?;
        let mut buf = vec![0u8; count.min(1 << 20) as usize];
        let n = file.read_at(&mut buf, offset)?;
        buf.truncate(n);
        Ok(buf)
    }

    async fn readdir(&self, fid: &mut Node, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        let entries = fid.entries.as_ref().ok_or(Errno::ENOTDIR)?;
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        Ok(entries.iter().skip(from).cloned().collect())
    }

    async fn setattr(&self, _fid: &mut Node, _valid: SetAttrMask, _attr: &SetAttr) -> Result<()> {
        Err(Errno::EROFS)
    }
}

/// A directory's entries, sorted by name, each with the offset of the next. Names that are not
/// UTF-8 are left out (9P strings here are UTF-8: docs/9p.md).
fn list(fd: OwnedFd) -> Result<Vec<DirEntry>> {
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| Errno(e as u32))?;
    let mut named: Vec<(String, u64, u8)> = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|e| Errno(e as u32))?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        use nix::dir::Type;
        let typ = match entry.file_type() {
            Some(Type::Directory) => libc::DT_DIR,
            Some(Type::Symlink) => libc::DT_LNK,
            Some(Type::File) => libc::DT_REG,
            _ => libc::DT_UNKNOWN,
        };
        named.push((name.to_owned(), entry.ino(), typ));
    }
    named.sort();
    Ok(named
        .into_iter()
        .enumerate()
        .map(|(i, (name, ino, typ))| DirEntry {
            qid: qid_of(
                match typ {
                    libc::DT_DIR => libc::S_IFDIR,
                    libc::DT_LNK => libc::S_IFLNK,
                    _ => libc::S_IFREG,
                },
                ino,
            ),
            offset: i as u64 + 1,
            typ,
            name,
        })
        .collect())
}
