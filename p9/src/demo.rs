//! A tiny tree for interop tests and benchmarks: `/hello` (a greeting), `/zero` (reads zeros,
//! like /dev/zero) and `/null` (takes every write, reads nothing), under any aname. The files
//! diod's `diodload` copies (it attaches aname `ctl` and copies `zero` to `null`) are here, so it
//! can be run against this tree and against `diod -e ctl` side by side.

use rs9p::{DirEntry, GetAttrMask, QId, QIdType, Stat};

use crate::{Errno, FileTree, Result};

/// The greeting `/hello` holds.
pub const HELLO: &[u8] = b"hello from warren\n";

/// A node of the demo tree; also the per-fid state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Root,
    Hello,
    Zero,
    Null,
}

impl Node {
    const FILES: [(&'static str, Node); 3] = [
        ("hello", Node::Hello),
        ("zero", Node::Zero),
        ("null", Node::Null),
    ];

    fn qid(self) -> QId {
        let (typ, path) = match self {
            Node::Root => (QIdType::DIR, 1),
            Node::Hello => (QIdType::FILE, 2),
            Node::Zero => (QIdType::FILE, 3),
            Node::Null => (QIdType::FILE, 4),
        };
        QId {
            typ,
            version: 0,
            path,
        }
    }

    fn lookup(self, name: &str) -> Result<Node> {
        match (self, name) {
            (Node::Root, "." | "..") => Ok(Node::Root),
            (Node::Root, _) => Node::FILES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, node)| *node)
                .ok_or(Errno::ENOENT),
            _ => Err(Errno::ENOTDIR),
        }
    }
}

/// The demo tree. Stateless: one instance may serve any number of connections.
#[derive(Default)]
pub struct DemoTree;

fn stat(node: Node) -> Stat {
    let (mode, size) = match node {
        Node::Root => (0o040555, 0),
        Node::Hello => (0o100444, HELLO.len() as u64),
        Node::Zero => (0o100444, 0),
        Node::Null => (0o100666, 0),
    };
    crate::synthetic::stat(mode, size, crate::synthetic::EPOCH)
}

#[async_trait::async_trait]
impl FileTree for DemoTree {
    type Fid = Node;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, Node)> {
        Ok((Node::Root.qid(), Node::Root))
    }

    async fn walk(&self, from: &Node, names: &[String]) -> Result<(Vec<QId>, Option<Node>)> {
        crate::synthetic::walk(*from, names, |node, name| {
            let next = node.lookup(name)?;
            Ok((next, next.qid()))
        })
    }

    async fn getattr(&self, fid: &Node, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        Ok((fid.qid(), stat(*fid)))
    }

    async fn open(&self, fid: &mut Node, _flags: u32) -> Result<(QId, u32)> {
        Ok((fid.qid(), 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> Result<Vec<u8>> {
        match fid {
            Node::Root => Err(Errno::EISDIR),
            Node::Hello => {
                let start = (offset.min(HELLO.len() as u64)) as usize;
                let end = (start + count as usize).min(HELLO.len());
                Ok(HELLO[start..end].to_vec())
            }
            Node::Zero => Ok(vec![0; count as usize]),
            Node::Null => Ok(Vec::new()),
        }
    }

    async fn write(&self, fid: &mut Node, _offset: u64, data: &[u8]) -> Result<u32> {
        match fid {
            Node::Null => Ok(data.len() as u32),
            Node::Root => Err(Errno::EISDIR),
            _ => Err(Errno::EACCES),
        }
    }

    async fn readdir(&self, fid: &mut Node, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        if *fid != Node::Root {
            return Err(Errno::ENOTDIR);
        }
        Ok(crate::synthetic::dir_entries(
            Node::FILES
                .iter()
                .map(|(name, node)| (name.to_string(), node.qid())),
            offset,
        ))
    }
}
