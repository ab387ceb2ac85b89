//! A small synthetic 9P tree for the bridge's tests and benchmark, shaped like /tool:
//!
//! - `static`: fixed text (a plain file with a real size);
//! - `call`: a transaction file (`specs/tool-tree.md`): one open is one call, writes append
//!   whatever their offset, the first read runs the call (after `call_delay`) and the result
//!   `result:<input>` is read from the offset of that first read on;
//! - `slow`: a read that never finishes on its own: it ends only when flushed;
//! - `scratch`: a file that takes mode changes and records them;
//! - creations (files and directories) in the root, recording the modes they were made with.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warren_9p::synthetic::stat;
use warren_9p::{
    DirEntry, Errno, FileTree, GetAttrMask, QId, QIdType, Result, SetAttr, SetAttrMask, Stat, Time,
};

pub const STATIC_TEXT: &[u8] = b"hello from a static file\n";
pub const RESULT_PREFIX: &[u8] = b"result:";

/// What the tree saw, shared with the test.
#[derive(Default)]
pub struct Stats {
    pub slow_reads_started: AtomicUsize,
    /// Reads of `slow` whose handler was dropped before finishing: the server's Tflush.
    pub slow_reads_flushed: AtomicUsize,
    pub calls_run: AtomicUsize,
    /// Writes a `call` took (its arguments).
    pub call_writes: AtomicUsize,
    /// The arguments of every `call` clunked before it ran.
    pub withdrawn: Mutex<Vec<Vec<u8>>>,
    /// (name, mode) of every chmod, create and mkdir, as the server received them.
    pub modes: Mutex<Vec<(String, u32)>>,
}

impl Stats {
    pub fn modes_of(&self, name: &str) -> Vec<u32> {
        self.modes
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, m)| *m)
            .collect()
    }
}

struct Created {
    path: u64,
    dir: bool,
    mode: u32,
    data: Vec<u8>,
}

/// State shared by every connection to the tree (the "server").
pub struct Shared {
    pub stats: Arc<Stats>,
    call_delay: Duration,
    scratch_mode: Mutex<u32>,
    created: Mutex<BTreeMap<String, Created>>,
    next_path: AtomicU64,
    /// Fixed names withdrawn (as a shrunk grant would): not found, not listed.
    hidden: Mutex<Vec<String>>,
}

impl Shared {
    pub fn new(call_delay: Duration) -> Arc<Shared> {
        Arc::new(Shared {
            stats: Arc::default(),
            call_delay,
            scratch_mode: Mutex::new(0o644),
            created: Mutex::new(BTreeMap::new()),
            next_path: AtomicU64::new(100),
            hidden: Mutex::new(Vec::new()),
        })
    }

    pub fn hide(&self, name: &str) {
        self.hidden.lock().unwrap().push(name.to_owned());
    }

    fn is_hidden(&self, name: &str) -> bool {
        self.hidden.lock().unwrap().iter().any(|h| h == name)
    }
}

/// One connection's tree.
pub struct TestTree(pub Arc<Shared>);

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Root,
    Static,
    Call,
    Slow,
    Scratch,
    Created(String),
}

const FIXED: [(&str, Node, u64); 4] = [
    ("static", Node::Static, 2),
    ("call", Node::Call, 3),
    ("slow", Node::Slow, 4),
    ("scratch", Node::Scratch, 5),
];

/// Per-fid state: the node, and for an open `call` its transaction.
pub struct TreeFid {
    node: Node,
    input: Vec<u8>,
    result: Option<Vec<u8>>,
    first_read_offset: u64,
}

impl TreeFid {
    fn at(node: Node) -> TreeFid {
        TreeFid {
            node,
            input: Vec::new(),
            result: None,
            first_read_offset: 0,
        }
    }
}

/// Counts a `slow` read's handler being dropped before it finished.
struct FlushWitness(Arc<Stats>);

impl Drop for FlushWitness {
    fn drop(&mut self) {
        self.0.slow_reads_flushed.fetch_add(1, Ordering::SeqCst);
    }
}

impl TestTree {
    fn qid(&self, node: &Node) -> Result<QId> {
        let (typ, path) = match node {
            Node::Root => (QIdType::DIR, 1),
            Node::Created(name) => {
                let created = self.0.created.lock().unwrap();
                let c = created.get(name).ok_or(Errno::ENOENT)?;
                (if c.dir { QIdType::DIR } else { QIdType::FILE }, c.path)
            }
            fixed => (
                QIdType::FILE,
                FIXED
                    .iter()
                    .find(|(_, n, _)| n == fixed)
                    .expect("fixed node")
                    .2,
            ),
        };
        Ok(QId {
            typ,
            version: 0,
            path,
        })
    }

    fn lookup(&self, from: &Node, name: &str) -> Result<Node> {
        match (from, name) {
            (Node::Root, "." | "..") => Ok(Node::Root),
            (Node::Root, _) => {
                if self.0.is_hidden(name) {
                    return Err(Errno::ENOENT);
                }
                if let Some((_, node, _)) = FIXED.iter().find(|(n, _, _)| *n == name) {
                    return Ok(node.clone());
                }
                if self.0.created.lock().unwrap().contains_key(name) {
                    return Ok(Node::Created(name.to_owned()));
                }
                Err(Errno::ENOENT)
            }
            (Node::Created(_), "..") => Ok(Node::Root),
            _ => Err(Errno::ENOENT),
        }
    }

    fn record_mode(&self, name: &str, mode: u32) {
        self.0
            .stats
            .modes
            .lock()
            .unwrap()
            .push((name.to_owned(), mode));
    }
}

#[async_trait::async_trait]
impl FileTree for TestTree {
    type Fid = TreeFid;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, TreeFid)> {
        Ok((self.qid(&Node::Root)?, TreeFid::at(Node::Root)))
    }

    async fn walk(&self, from: &TreeFid, names: &[String]) -> Result<(Vec<QId>, Option<TreeFid>)> {
        let mut node = from.node.clone();
        let mut qids = Vec::new();
        for name in names {
            match self.lookup(&node, name) {
                Ok(next) => {
                    qids.push(self.qid(&next)?);
                    node = next;
                }
                Err(e) if qids.is_empty() => return Err(e),
                Err(_) => return Ok((qids, None)),
            }
        }
        Ok((qids, Some(TreeFid::at(node))))
    }

    async fn getattr(&self, fid: &TreeFid, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        let (mode, size) = match &fid.node {
            Node::Root => (libc::S_IFDIR | 0o755, 0),
            Node::Static => (libc::S_IFREG | 0o444, STATIC_TEXT.len() as u64),
            Node::Call => (libc::S_IFREG | 0o666, 0),
            Node::Slow => (libc::S_IFREG | 0o444, 0),
            Node::Scratch => (libc::S_IFREG | *self.0.scratch_mode.lock().unwrap(), 0),
            Node::Created(name) => {
                let created = self.0.created.lock().unwrap();
                let c = created.get(name).ok_or(Errno::ENOENT)?;
                (
                    if c.dir { libc::S_IFDIR } else { libc::S_IFREG } | c.mode,
                    c.data.len() as u64,
                )
            }
        };
        let t = Time {
            sec: 1_700_000_000,
            nsec: 0,
        };
        Ok((self.qid(&fid.node)?, stat(mode, size, t)))
    }

    async fn open(&self, fid: &mut TreeFid, _flags: u32) -> Result<(QId, u32)> {
        Ok((self.qid(&fid.node)?, 0))
    }

    async fn read(&self, fid: &mut TreeFid, offset: u64, count: u32) -> Result<Vec<u8>> {
        match &fid.node {
            Node::Root => Err(Errno::EISDIR),
            Node::Static => Ok(warren_9p::synthetic::slice(STATIC_TEXT, offset, count)),
            Node::Call => {
                if fid.result.is_none() {
                    // Cancel-safe: flushed before this point, the call is withdrawn (no result).
                    if !self.0.call_delay.is_zero() {
                        tokio::time::sleep(self.0.call_delay).await;
                    }
                    let mut result = RESULT_PREFIX.to_vec();
                    result.extend_from_slice(&fid.input);
                    fid.result = Some(result);
                    fid.first_read_offset = offset;
                    self.0.stats.calls_run.fetch_add(1, Ordering::SeqCst);
                }
                let result = fid.result.as_deref().unwrap_or_default();
                Ok(warren_9p::synthetic::slice(
                    result,
                    offset.saturating_sub(fid.first_read_offset),
                    count,
                ))
            }
            Node::Slow => {
                self.0
                    .stats
                    .slow_reads_started
                    .fetch_add(1, Ordering::SeqCst);
                let _witness = FlushWitness(self.0.stats.clone());
                std::future::pending::<()>().await;
                unreachable!("a pending future never completes")
            }
            Node::Scratch => Ok(Vec::new()),
            Node::Created(name) => {
                let created = self.0.created.lock().unwrap();
                Ok(warren_9p::synthetic::slice(
                    &created.get(name).ok_or(Errno::ENOENT)?.data,
                    offset,
                    count,
                ))
            }
        }
    }

    async fn write(&self, fid: &mut TreeFid, offset: u64, data: &[u8]) -> Result<u32> {
        match &fid.node {
            // A call refuses arguments that start `REFUSE` (as toolfs refuses them over its cap).
            Node::Call if data.starts_with(b"REFUSE") => return Err(Errno::EFBIG),
            Node::Call if fid.result.is_none() => {
                fid.input.extend_from_slice(data);
                self.0.stats.call_writes.fetch_add(1, Ordering::SeqCst);
            }
            Node::Call => return Err(Errno::EBUSY),
            Node::Created(name) => {
                let mut created = self.0.created.lock().unwrap();
                let c = created.get_mut(name).ok_or(Errno::ENOENT)?;
                let end = offset as usize + data.len();
                if c.data.len() < end {
                    c.data.resize(end, 0);
                }
                c.data[offset as usize..end].copy_from_slice(data);
            }
            _ => return Err(Errno::EACCES),
        }
        Ok(data.len() as u32)
    }

    async fn clunk(&self, fid: TreeFid) {
        if fid.node == Node::Call && fid.result.is_none() && !fid.input.is_empty() {
            self.0.stats.withdrawn.lock().unwrap().push(fid.input);
        }
    }

    async fn readdir(&self, fid: &mut TreeFid, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        if fid.node != Node::Root {
            return Ok(Vec::new());
        }
        let mut entries: Vec<(String, QId, u8)> = FIXED
            .iter()
            .map(|(n, node, _)| (n.to_string(), self.qid(node).unwrap(), libc::DT_REG))
            .collect();
        for (name, c) in self.0.created.lock().unwrap().iter() {
            let typ = if c.dir { QIdType::DIR } else { QIdType::FILE };
            entries.push((
                name.clone(),
                QId {
                    typ,
                    version: 0,
                    path: c.path,
                },
                if c.dir { libc::DT_DIR } else { libc::DT_REG },
            ));
        }
        Ok(entries
            .into_iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, (name, qid, typ))| DirEntry {
                qid,
                offset: i as u64 + 1,
                typ,
                name,
            })
            .collect())
    }

    async fn setattr(&self, fid: &mut TreeFid, valid: SetAttrMask, attr: &SetAttr) -> Result<()> {
        let name = match &fid.node {
            Node::Scratch => "scratch".to_owned(),
            Node::Created(name) => name.clone(),
            Node::Call if valid == SetAttrMask::SIZE && attr.size == 0 => return Ok(()),
            _ => return Err(Errno::EPERM),
        };
        if valid.contains(SetAttrMask::MODE) {
            self.record_mode(&name, attr.mode);
            match &fid.node {
                Node::Scratch => *self.0.scratch_mode.lock().unwrap() = attr.mode & 0o7777,
                _ => {
                    if let Some(c) = self.0.created.lock().unwrap().get_mut(&name) {
                        c.mode = attr.mode & 0o7777;
                    }
                }
            }
        }
        if valid.contains(SetAttrMask::SIZE)
            && let Some(c) = self.0.created.lock().unwrap().get_mut(&name)
        {
            c.data.resize(attr.size as usize, 0);
        }
        Ok(())
    }

    async fn create(
        &self,
        dir: &mut TreeFid,
        name: &str,
        _flags: u32,
        mode: u32,
        _gid: u32,
    ) -> Result<(QId, u32)> {
        self.make(dir, name, mode, false)?;
        *dir = TreeFid::at(Node::Created(name.to_owned()));
        Ok((self.qid(&dir.node)?, 0))
    }

    async fn mkdir(&self, dir: &TreeFid, name: &str, mode: u32, _gid: u32) -> Result<QId> {
        self.make(dir, name, mode, true)?;
        self.qid(&Node::Created(name.to_owned()))
    }

    async fn unlinkat(&self, dir: &TreeFid, name: &str, _flags: u32) -> Result<()> {
        if dir.node != Node::Root {
            return Err(Errno::ENOENT);
        }
        self.0
            .created
            .lock()
            .unwrap()
            .remove(name)
            .map(drop)
            .ok_or(Errno::ENOENT)
    }
}

impl TestTree {
    fn make(&self, dir: &TreeFid, name: &str, mode: u32, is_dir: bool) -> Result<()> {
        if dir.node != Node::Root {
            return Err(Errno::EACCES);
        }
        if self.lookup(&Node::Root, name).is_ok() {
            return Err(Errno::EEXIST);
        }
        self.record_mode(name, mode);
        let path = self.0.next_path.fetch_add(1, Ordering::SeqCst);
        self.0.created.lock().unwrap().insert(
            name.to_owned(),
            Created {
                path,
                dir: is_dir,
                mode: mode & 0o7777,
                data: Vec::new(),
            },
        );
        Ok(())
    }
}
