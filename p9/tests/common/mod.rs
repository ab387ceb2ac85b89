//! Shared by the integration tests: a test tree with knobs (a read that blocks forever, a write
//! that sleeps, records of what the loop handed the tree) and a raw-frame peer.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rs9p::{DirEntry, FCall, GetAttrMask, Msg, QId, QIdType, Stat};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use warren_9p::wire::{self, FrameReader};
use warren_9p::{Errno, FileTree, Limits, Result};

/// How long a test waits for something that must happen before it declares a hang.
pub const HANG: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Root,
    Dir,
    /// `hello`: fixed content.
    Hello,
    /// `block`: every read blocks until flushed.
    Block,
    /// `log`: writes are recorded in order; a write of "slow" sleeps first.
    Log,
    /// `dir/leaf`.
    Leaf,
}

impl Node {
    fn qid(self) -> QId {
        let (typ, path) = match self {
            Node::Root => (QIdType::DIR, 1),
            Node::Dir => (QIdType::DIR, 2),
            Node::Hello => (QIdType::FILE, 3),
            Node::Block => (QIdType::FILE, 4),
            Node::Log => (QIdType::FILE, 5),
            Node::Leaf => (QIdType::FILE, 6),
        };
        QId {
            typ,
            version: 0,
            path,
        }
    }

    fn lookup(self, name: &str) -> Result<Node> {
        match (self, name) {
            // `..` at the attach root stays there; `.` is the node itself.
            (Node::Root, ".." | ".") => Ok(Node::Root),
            (Node::Root, "hello" | "sleepy") => Ok(Node::Hello),
            (Node::Root, "block") => Ok(Node::Block),
            (Node::Root, "log") => Ok(Node::Log),
            (Node::Root, "dir") => Ok(Node::Dir),
            (Node::Dir, "..") => Ok(Node::Root),
            (Node::Dir, ".") => Ok(Node::Dir),
            (Node::Dir, "leaf") => Ok(Node::Leaf),
            (Node::Root | Node::Dir, _) => Err(Errno::ENOENT),
            _ => Err(Errno::ENOTDIR),
        }
    }
}

pub const HELLO: &[u8] = b"hello, test\n";

#[derive(Default)]
pub struct TestTree {
    /// Every name the loop passed to `walk`, in order.
    pub walked: Mutex<Vec<String>>,
    /// Blocking reads that started, and those whose future was dropped.
    pub block_started: AtomicUsize,
    pub block_dropped: AtomicUsize,
    /// Writes to `log`, in the order they completed.
    pub log: Mutex<Vec<String>>,
    pub clunks: AtomicUsize,
    pub getattrs: AtomicUsize,
}

/// Counts its own drop: proof that the loop dropped a handler's future.
struct DropGuard<'a>(&'a AtomicUsize);
impl Drop for DropGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn stat(node: Node) -> Stat {
    let mode = if node.qid().typ.contains(QIdType::DIR) {
        0o040755
    } else {
        0o100644
    };
    warren_9p::synthetic::stat(mode, 0, warren_9p::synthetic::EPOCH)
}

#[async_trait::async_trait]
impl FileTree for TestTree {
    type Fid = Node;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, Node)> {
        Ok((Node::Root.qid(), Node::Root))
    }

    async fn walk(&self, from: &Node, names: &[String]) -> Result<(Vec<QId>, Option<Node>)> {
        self.walked.lock().unwrap().extend(names.iter().cloned());
        if names.iter().any(|n| n == "sleepy") {
            // Gives a request that wrongly overtakes this walk time to do so.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let mut node = *from;
        let mut qids = Vec::new();
        for name in names {
            match node.lookup(name) {
                Ok(next) => {
                    node = next;
                    qids.push(node.qid());
                }
                Err(e) if qids.is_empty() => return Err(e),
                Err(_) => return Ok((qids, None)),
            }
        }
        Ok((qids, Some(node)))
    }

    async fn getattr(&self, fid: &Node, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        self.getattrs.fetch_add(1, Ordering::SeqCst);
        Ok((fid.qid(), stat(*fid)))
    }

    async fn open(&self, fid: &mut Node, _flags: u32) -> Result<(QId, u32)> {
        Ok((fid.qid(), 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> Result<Vec<u8>> {
        match fid {
            Node::Hello => {
                let start = offset.min(HELLO.len() as u64) as usize;
                Ok(HELLO[start..(start + count as usize).min(HELLO.len())].to_vec())
            }
            Node::Block => {
                let _guard = DropGuard(&self.block_dropped);
                self.block_started.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                unreachable!()
            }
            // Hands back far more than asked: the loop must cut it to count and msize.
            Node::Leaf => Ok(vec![b'x'; 64 << 20]),
            _ => Ok(Vec::new()),
        }
    }

    async fn write(&self, fid: &mut Node, _offset: u64, data: &[u8]) -> Result<u32> {
        if *fid != Node::Log {
            return Err(Errno::EACCES);
        }
        if data == b"slow" {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        self.log
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(data).into_owned());
        Ok(data.len() as u32)
    }

    async fn readdir(&self, fid: &mut Node, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        let names: &[(&str, Node)] = match fid {
            Node::Root => &[
                ("hello", Node::Hello),
                ("block", Node::Block),
                ("log", Node::Log),
                ("dir", Node::Dir),
            ],
            Node::Dir => &[("leaf", Node::Leaf)],
            _ => return Err(Errno::ENOTDIR),
        };
        Ok(warren_9p::synthetic::dir_entries(
            names.iter().map(|(n, node)| (n.to_string(), node.qid())),
            offset,
        ))
    }

    async fn clunk(&self, _fid: Node) {
        self.clunks.fetch_add(1, Ordering::SeqCst);
    }
}

/// A peer that speaks raw frames, for the rules a well-behaved client never tests.
pub struct Raw {
    r: FrameReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
}

/// Serves `tree` on one end of a socketpair and returns the other end as a raw peer, plus the
/// server task (which ends when the connection does).
pub fn serve_pair<T: FileTree>(
    tree: Arc<T>,
    limits: Limits,
) -> (Raw, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    let server = tokio::spawn(warren_9p::serve(tree, b, limits));
    (Raw::new(a), server)
}

impl Raw {
    pub fn new(s: UnixStream) -> Raw {
        let (r, w) = s.into_split();
        Raw {
            r: FrameReader::new(r),
            w,
        }
    }

    pub async fn send(&mut self, tag: u16, body: FCall) {
        self.send_bytes(&wire::encode(&Msg { tag, body })).await;
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).await.expect("write");
    }

    /// The next frame, raw (size field included).
    pub async fn recv_frame(&mut self) -> Vec<u8> {
        tokio::time::timeout(HANG, self.r.next(u32::MAX))
            .await
            .expect("server hung")
            .expect("frame")
            .expect("server closed the connection")
            .to_vec()
    }

    pub async fn recv(&mut self) -> Msg {
        wire::decode_reply(&self.recv_frame().await).expect("reply decodes")
    }

    pub async fn rpc(&mut self, tag: u16, body: FCall) -> FCall {
        self.send(tag, body).await;
        let reply = self.recv().await;
        assert_eq!(reply.tag, tag, "reply tag");
        reply.body
    }

    /// Tversion; returns the Rversion's (msize, version).
    pub async fn version(&mut self, msize: u32) -> (u32, String) {
        match self
            .rpc(
                rs9p::NOTAG,
                FCall::TVersion {
                    msize,
                    version: "9P2000.L".into(),
                },
            )
            .await
        {
            FCall::RVersion { msize, version } => (msize, version),
            other => panic!("Tversion answered {other:?}"),
        }
    }

    /// Tversion + Tattach of fid 0.
    pub async fn attach(&mut self) {
        self.version(65536).await;
        let r = self
            .rpc(
                1,
                FCall::TAttach {
                    fid: 0,
                    afid: rs9p::NOFID,
                    uname: "u".into(),
                    aname: "".into(),
                    n_uname: rs9p::NONUNAME,
                },
            )
            .await;
        assert!(matches!(r, FCall::RAttach { .. }), "{r:?}");
    }

    pub async fn walk(&mut self, tag: u16, fid: u32, newfid: u32, names: &[&str]) -> FCall {
        self.rpc(
            tag,
            FCall::TWalk {
                fid,
                newfid,
                wnames: names.iter().map(|s| s.to_string()).collect(),
            },
        )
        .await
    }

    /// Walks fid 0 to `name` as `newfid` and opens it.
    pub async fn open(&mut self, newfid: u32, name: &str) {
        let r = self.walk(2, 0, newfid, &[name]).await;
        assert!(matches!(r, FCall::RWalk { .. }), "{r:?}");
        let r = self
            .rpc(
                3,
                FCall::TlOpen {
                    fid: newfid,
                    flags: 2,
                },
            )
            .await;
        assert!(matches!(r, FCall::RlOpen { .. }), "{r:?}");
    }

    /// True when the server closed the connection (end of stream or reset), without other frames first.
    pub async fn closed(&mut self) -> bool {
        match tokio::time::timeout(HANG, self.r.next(u32::MAX))
            .await
            .expect("server hung")
        {
            Ok(None) | Err(_) => true,
            Ok(Some(frame)) => panic!(
                "expected the connection to close, got {:?}",
                wire::decode_reply(&frame)
            ),
        }
    }
}

/// Waits (yielding, no clock) until `cond` holds; a hang past `HANG` fails the test.
pub async fn wait_until(cond: impl Fn() -> bool) {
    tokio::time::timeout(HANG, async {
        while !cond() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("condition never became true");
}

pub fn lerror(errno: Errno) -> FCall {
    FCall::RlError { ecode: errno.0 }
}

/// A per-test directory under /tmp, short enough for sockaddr_un.
pub fn short_tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("w9p")
        .tempdir_in("/tmp")
        .expect("tempdir")
}
