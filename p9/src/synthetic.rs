//! Pieces every synthetic tree (toolfs, gate, receiptd, nsd, the servers) needs alike: the
//! attributes of a file that has no inode behind it, a walk one name at a time, a directory
//! listing from names, and the reply of an rpc file.

use rs9p::{DirEntry, QId, QIdType, Stat, Time};

use crate::Result;

/// The attributes of a synthetic file or directory: owned by root, `nlink` 2 for a directory and
/// 1 otherwise, every time stamp `time`.
pub fn stat(mode: u32, size: u64, time: Time) -> Stat {
    let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
    Stat {
        mode,
        uid: 0,
        gid: 0,
        nlink,
        rdev: 0,
        size,
        blksize: 4096,
        blocks: 0,
        atime: time,
        mtime: time,
        ctime: time,
    }
}

/// The qid of a synthetic directory (`dir`) or file, at `path` (the tree's own stable number for
/// it) and `version`.
pub fn qid(dir: bool, version: u32, path: u64) -> QId {
    QId {
        typ: if dir { QIdType::DIR } else { QIdType::FILE },
        version,
        path,
    }
}

/// Up to `count` bytes of a file's whole contents at `offset` (none past the end): a read of a
/// file a tree holds in memory.
pub fn slice(bytes: &[u8], offset: u64, count: u32) -> Vec<u8> {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = start.saturating_add(count as usize).min(bytes.len());
    bytes[start..end].to_vec()
}

/// The epoch, for trees whose files have no meaningful time.
pub const EPOCH: Time = Time { sec: 0, nsec: 0 };

/// Twalk over a tree of nodes: `step` goes from a node through one name to the next node and its
/// qid. The first name's error is the walk's; a later one ends it with the qids walked so far
/// and no node, as 9P's partial walk answers. Zero names return `start` (a clone).
pub fn walk<N>(
    start: N,
    names: &[String],
    mut step: impl FnMut(&N, &str) -> Result<(N, QId)>,
) -> Result<(Vec<QId>, Option<N>)> {
    let mut node = start;
    let mut qids = Vec::with_capacity(names.len());
    for name in names {
        match step(&node, name) {
            Ok((next, qid)) => {
                qids.push(qid);
                node = next;
            }
            Err(e) if qids.is_empty() => return Err(e),
            Err(_) => return Ok((qids, None)),
        }
    }
    Ok((qids, Some(node)))
}

/// A directory's entries from `offset` on (entry `i` has cookie `i + 1`), typed by each qid.
pub fn dir_entries(entries: impl IntoIterator<Item = (String, QId)>, offset: u64) -> Vec<DirEntry> {
    entries
        .into_iter()
        .enumerate()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .map(|(i, (name, qid))| DirEntry {
            typ: if qid.typ.contains(QIdType::DIR) {
                libc::DT_DIR
            } else {
                libc::DT_REG
            },
            qid,
            offset: i as u64 + 1,
            name,
        })
        .collect()
}

/// The reply of an rpc file (write a request, read its answer on the same fid).
///
/// The answer is read relative to o₀, the offset of the first read after the request (toolfs's
/// call files follow the same rule, specs/tool-tree.md): a client that reads from 0 gets the whole
/// answer, and so does a shell that wrote through an fd and reads on at the write's end
/// (`exec 3<>ctl; echo … >&3; cat <&3`), which is where a FUSE mount reads after a write.
#[derive(Debug, Default)]
pub struct RpcReply {
    bytes: Vec<u8>,
    origin: Option<u64>,
}

impl RpcReply {
    /// Replaces the answer with the one to a new request.
    pub fn set(&mut self, bytes: Vec<u8>) {
        self.bytes = bytes;
        self.origin = None;
    }

    /// Up to `count` bytes of the answer, at `offset − o₀`. Before any request there is nothing
    /// to read, and no read fixes o₀.
    pub fn read(&mut self, offset: u64, count: u32) -> Vec<u8> {
        if self.bytes.is_empty() {
            return Vec::new();
        }
        let origin = *self.origin.get_or_insert(offset);
        let Some(relative) = offset.checked_sub(origin) else {
            return Vec::new();
        };
        let start = usize::try_from(relative)
            .unwrap_or(usize::MAX)
            .min(self.bytes.len());
        let end = start.saturating_add(count as usize).min(self.bytes.len());
        self.bytes[start..end].to_vec()
    }

    /// The answer's length (a stat of the fid shows it).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether there is no answer yet.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_reads_from_zero_and_from_the_writes_end() {
        let mut r = RpcReply::default();
        assert!(r.read(0, 10).is_empty(), "nothing before a request");
        r.set(b"answer\n".to_vec());
        assert_eq!(r.read(0, 3), b"ans");
        assert_eq!(r.read(3, 100), b"wer\n");
        assert!(r.read(7, 100).is_empty());

        // A shell wrote 12 bytes through the fd, then reads on at 12.
        r.set(b"second\n".to_vec());
        assert_eq!(r.read(12, 100), b"second\n");
        assert!(r.read(19, 100).is_empty());
        assert!(r.read(5, 100).is_empty(), "before o₀ there is nothing");
    }

    #[test]
    fn entries_are_typed_and_resume_at_the_cookie() {
        let file = QId {
            typ: QIdType::FILE,
            version: 0,
            path: 2,
        };
        let dir = QId {
            typ: QIdType::DIR,
            version: 0,
            path: 3,
        };
        let all = dir_entries([("f".to_string(), file), ("d".to_string(), dir)], 0);
        assert_eq!(all[0].typ, libc::DT_REG);
        assert_eq!(all[1].typ, libc::DT_DIR);
        assert_eq!(all[1].offset, 2);
        let rest = dir_entries([("f".to_string(), file), ("d".to_string(), dir)], 1);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].name, "d");
    }

    #[test]
    fn directories_have_two_links() {
        assert_eq!(stat(0o040555, 0, EPOCH).nlink, 2);
        assert_eq!(stat(0o100444, 5, EPOCH).nlink, 1);
    }
}
