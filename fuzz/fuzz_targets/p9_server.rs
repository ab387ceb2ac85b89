//! warren-9p's server loop (`warren_9p::serve`), on any byte stream a 9P client may send once
//! it has a connection: an in-memory duplex to the demo tree (`hello`, `zero`, `null`) or, by
//! mode bit 2, a small writable tree (create, write, mkdir, unlink) in memory.
//!
//! Input: a mode byte, then frames. Mode bit 0 clear: each frame is a u16 length and that many
//! bytes (type, tag, body), sent behind a size field that matches; set: the rest is sent as is,
//! size fields and all. Mode bit 1 clear: a Tversion (msize 64 KiB) and a Tattach of fid 0 go
//! first, so the fuzzer starts at the requests that reach the tree.
//! Checks: no panic; the server ends when the client hangs up; every reply is a well-formed
//! R-message no larger than the largest msize on offer; in framed mode, no tag is answered
//! more often than it was sent, no Rread or Rreaddir carries more than the count asked, and no
//! Rwalk more qids than the names asked (at most 16).
#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use rs9p::{FCall, Msg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_9p::demo::DemoTree;
use warren_9p::wire::{self, HEADER_LEN, RREAD_HEADER_LEN};
use warren_9p::{DirEntry, Errno, FileTree, GetAttrMask, QId, QIdType, Result, Stat, synthetic};

const MAX_MSIZE: u32 = 64 * 1024;
/// The most bytes one file of the writable tree holds.
const MAX_FILE: usize = 64 * 1024;

/// A writable tree, so the loop's paths after a tree says yes (a create that turns the directory
/// fid into the new file's, a write, a mkdir, an unlink) are reached too: one directory of files
/// and empty subdirectories, in memory.
#[derive(Default)]
struct MemTree {
    entries: Mutex<BTreeMap<String, Entry>>,
    next_path: AtomicU64,
}

#[derive(Clone)]
enum Entry {
    File { path: u64, data: Vec<u8> },
    Dir { path: u64 },
}

/// Per-fid state: the root, or a name in it.
#[derive(Clone, Debug)]
enum Node {
    Root,
    Name(String),
}

impl MemTree {
    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().expect("entries")
    }

    fn qid(&self, node: &Node) -> Result<QId> {
        let (typ, path) = match node {
            Node::Root => (QIdType::DIR, 1),
            Node::Name(name) => match self.entries().get(name).ok_or(Errno::ENOENT)? {
                Entry::File { path, .. } => (QIdType::FILE, *path),
                Entry::Dir { path } => (QIdType::DIR, *path),
            },
        };
        Ok(QId {
            typ,
            version: 0,
            path,
        })
    }

    fn new_path(&self) -> u64 {
        self.next_path.fetch_add(1, Ordering::Relaxed) + 2
    }
}

#[async_trait::async_trait]
impl FileTree for MemTree {
    type Fid = Node;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, Node)> {
        Ok((self.qid(&Node::Root)?, Node::Root))
    }

    async fn walk(&self, from: &Node, names: &[String]) -> Result<(Vec<QId>, Option<Node>)> {
        let mut node = from.clone();
        let mut qids = Vec::new();
        for name in names {
            let next = match (&node, name.as_str()) {
                (_, "..") | (Node::Root, ".") => Node::Root,
                (Node::Root, name) => Node::Name(name.to_owned()),
                (Node::Name(_), _) => Node::Name(String::new()), // nothing below a name
            };
            match self.qid(&next) {
                Ok(qid) => {
                    qids.push(qid);
                    node = next;
                }
                Err(e) if qids.is_empty() => return Err(e),
                Err(_) => return Ok((qids, None)),
            }
        }
        Ok((qids, Some(node)))
    }

    async fn getattr(&self, fid: &Node, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        let qid = self.qid(fid)?;
        let size = match fid {
            Node::Name(name) => match self.entries().get(name) {
                Some(Entry::File { data, .. }) => data.len() as u64,
                _ => 0,
            },
            Node::Root => 0,
        };
        let mode = if qid.typ.contains(QIdType::DIR) {
            0o040755
        } else {
            0o100644
        };
        Ok((qid, synthetic::stat(mode, size, synthetic::EPOCH)))
    }

    async fn open(&self, fid: &mut Node, _flags: u32) -> Result<(QId, u32)> {
        Ok((self.qid(fid)?, 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> Result<Vec<u8>> {
        let Node::Name(name) = fid else {
            return Err(Errno::EISDIR);
        };
        match self.entries().get(name).ok_or(Errno::ENOENT)? {
            Entry::File { data, .. } => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                let end = start.saturating_add(count as usize).min(data.len());
                Ok(data[start..end].to_vec())
            }
            Entry::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    async fn write(&self, fid: &mut Node, offset: u64, bytes: &[u8]) -> Result<u32> {
        let Node::Name(name) = fid else {
            return Err(Errno::EISDIR);
        };
        match self.entries().get_mut(name).ok_or(Errno::ENOENT)? {
            Entry::File { data, .. } => {
                let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
                let end = start.checked_add(bytes.len()).ok_or(Errno::EFBIG)?;
                if end > MAX_FILE {
                    return Err(Errno::EFBIG);
                }
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[start..end].copy_from_slice(bytes);
                Ok(bytes.len() as u32)
            }
            Entry::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    async fn readdir(&self, fid: &mut Node, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        if !matches!(fid, Node::Root) {
            return Err(Errno::ENOTDIR);
        }
        let listing: Vec<(String, QId)> = self
            .entries()
            .iter()
            .map(|(name, e)| {
                let (typ, path) = match e {
                    Entry::File { path, .. } => (QIdType::FILE, *path),
                    Entry::Dir { path } => (QIdType::DIR, *path),
                };
                let qid = QId {
                    typ,
                    version: 0,
                    path,
                };
                (name.clone(), qid)
            })
            .collect();
        Ok(synthetic::dir_entries(listing, offset))
    }

    async fn create(
        &self,
        dir: &mut Node,
        name: &str,
        _flags: u32,
        _mode: u32,
        _gid: u32,
    ) -> Result<(QId, u32)> {
        if !matches!(dir, Node::Root) {
            return Err(Errno::ENOTDIR);
        }
        let path = self.new_path();
        {
            let mut entries = self.entries();
            if entries.contains_key(name) {
                return Err(Errno::EEXIST);
            }
            entries.insert(
                name.to_owned(),
                Entry::File {
                    path,
                    data: Vec::new(),
                },
            );
        }
        *dir = Node::Name(name.to_owned());
        Ok((self.qid(dir)?, 0))
    }

    async fn mkdir(&self, dir: &Node, name: &str, _mode: u32, _gid: u32) -> Result<QId> {
        if !matches!(dir, Node::Root) {
            return Err(Errno::ENOTDIR);
        }
        let path = self.new_path();
        let mut entries = self.entries();
        if entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        entries.insert(name.to_owned(), Entry::Dir { path });
        Ok(QId {
            typ: QIdType::DIR,
            version: 0,
            path,
        })
    }

    async fn unlinkat(&self, dir: &Node, name: &str, _flags: u32) -> Result<()> {
        if !matches!(dir, Node::Root) {
            return Err(Errno::ENOTDIR);
        }
        self.entries().remove(name).map(drop).ok_or(Errno::ENOENT)
    }
}

fn handshake() -> Vec<u8> {
    let mut out = wire::encode(&Msg {
        tag: rs9p::NOTAG,
        body: FCall::TVersion {
            msize: MAX_MSIZE,
            version: rs9p::P92000L.into(),
        },
    });
    out.extend(wire::encode(&Msg {
        tag: 0,
        body: FCall::TAttach {
            fid: 0,
            afid: rs9p::NOFID,
            uname: "fuzz".into(),
            aname: String::new(),
            n_uname: 0,
        },
    }));
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let raw = mode & 1 != 0;
    let mut stream = Vec::new();
    // Per tag (framed mode only): requests sent with it, the largest Tread/Treaddir count
    // and the most walk names among them.
    let mut sent: HashMap<u16, usize> = HashMap::new();
    let mut read_count: HashMap<u16, u32> = HashMap::new();
    let mut walk_names: HashMap<u16, usize> = HashMap::new();
    if mode & 2 == 0 {
        stream = handshake();
        *sent.entry(rs9p::NOTAG).or_default() += 1;
        *sent.entry(0).or_default() += 1;
    }
    if raw {
        stream.extend_from_slice(rest);
    } else {
        let mut rest = rest;
        while let [a, b, tail @ ..] = rest {
            let len = (u16::from_le_bytes([*a, *b]) as usize).min(tail.len());
            let (body, next) = tail.split_at(len);
            let at = stream.len();
            stream.extend_from_slice(&(len as u32 + 4).to_le_bytes());
            stream.extend_from_slice(body);
            if let [_, t0, t1, ..] = body {
                let tag = u16::from_le_bytes([*t0, *t1]);
                *sent.entry(tag).or_default() += 1;
                match wire::decode_request(&stream[at..]).map(|m| m.body) {
                    Ok(FCall::TRead { count, .. } | FCall::TReadDir { count, .. }) => {
                        let max = read_count.entry(tag).or_default();
                        *max = (*max).max(count);
                    }
                    Ok(FCall::TWalk { wnames, .. }) => {
                        let max = walk_names.entry(tag).or_default();
                        *max = (*max).max(wnames.len());
                    }
                    _ => {}
                }
            }
            rest = next;
        }
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let replies = rt.block_on(async move {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let limits = warren_9p::Limits {
            max_msize: MAX_MSIZE,
            max_fids: 64,
            max_inflight: 8,
        };
        let server = if mode & 4 == 0 {
            tokio::spawn(warren_9p::serve(Arc::new(DemoTree), theirs, limits))
        } else {
            tokio::spawn(warren_9p::serve(
                Arc::new(MemTree::default()),
                theirs,
                limits,
            ))
        };
        let (mut rd, mut wr) = tokio::io::split(ours);
        let writer = async move {
            // The server may hang up first (a malformed frame): then the write fails.
            let _ = wr.write_all(&stream).await;
            let _ = wr.shutdown().await;
        };
        let reader = async move {
            let mut replies = Vec::new();
            rd.read_to_end(&mut replies).await.expect("read replies");
            replies
        };
        let ((), replies) = tokio::join!(writer, reader);
        // Ok or InvalidData (dropped for garbage): either way it ended.
        let _ = server
            .await
            .expect("the server task ends without panicking");
        replies
    });

    let mut answered: HashMap<u16, usize> = HashMap::new();
    let mut at = 0;
    while at < replies.len() {
        let size = u32::from_le_bytes(replies[at..at + 4].try_into().expect("size field")) as usize;
        assert!(
            (HEADER_LEN as usize..=MAX_MSIZE as usize).contains(&size),
            "reply of {size} bytes"
        );
        let frame = &replies[at..at + size];
        let msg = wire::decode_reply(frame).expect("a well-formed reply");
        *answered.entry(msg.tag).or_default() += 1;
        if !raw {
            match &msg.body {
                // Reads and readdirs are capped at the requested count.
                FCall::RRead { .. } | FCall::RReadDir { .. } => {
                    let payload = size - RREAD_HEADER_LEN as usize;
                    let asked = read_count.get(&msg.tag).copied().unwrap_or(0) as usize;
                    assert!(payload <= asked, "{payload} bytes read, {asked} asked");
                }
                // A walk answers at most one qid per name, and never more than 16 names.
                FCall::RWalk { wqids } => {
                    let asked = walk_names.get(&msg.tag).copied().unwrap_or(0);
                    assert!(
                        wqids.len() <= asked.min(wire::MAXWELEM),
                        "{} qids for a walk of {asked} names",
                        wqids.len()
                    );
                }
                _ => {}
            }
        }
        at += size;
    }
    if !raw {
        for (tag, n) in answered {
            let asked = sent.get(&tag).copied().unwrap_or(0);
            assert!(n <= asked, "tag {tag} answered {n} times, sent {asked}");
        }
    }
});
