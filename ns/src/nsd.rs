//! nsd's `/ns` tree, served to the operator over 9P (design.md, "File trees"):
//!
//! - `clone` — one open is one namespace: write a spec (any number of writes, appended), then
//!   read: the spec is parsed and the new id is returned as `<id>\n`. A spec that does not parse
//!   fails the read with EINVAL (the message is logged by nsd).
//! - `<id>/spec` — the spec as text (env names only: a spec never holds a value).
//! - `<id>/status` — `created`, `running holder=<pid>`, `exited <code>` or `failed <message>`.
//! - `<id>/ctl` — write `run ARG…` (rc-quoted words, as in specs) to build the namespace and
//!   start its command (once; the write returns when it has exec'd, or fails and `status` says
//!   why), `kill` to SIGKILL it (ESRCH when nothing runs).
//! - `<id>/wait` — a read blocks until the command has ended and returns its final status line.
//!
//! The command's stdio is /dev/null: a daemon-started namespace has no terminal (`warren run`
//! with a terminal builds its namespace in the launcher; see docs/confinement.md).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rs9p::{DirEntry, GetAttrMask, QId, QIdType, Stat, Time};
use tokio::sync::watch;
use warren_9p::{Errno, FileTree, Result};

use crate::run::{PayloadStdio, RunOptions, Running, spawn};
use crate::spec::{self, Spec};

/// The state of one namespace's command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running { holder: u32 },
    Exited(i32),
    Failed(String),
}

impl Status {
    fn line(&self) -> String {
        match self {
            Status::Created => "created\n".into(),
            Status::Running { holder } => format!("running holder={holder}\n"),
            Status::Exited(code) => format!("exited {code}\n"),
            Status::Failed(m) => format!("failed {}\n", m.replace('\n', " ")),
        }
    }
    fn is_final(&self) -> bool {
        matches!(self, Status::Exited(_) | Status::Failed(_))
    }
}

struct Space {
    spec: Spec,
    status: watch::Sender<Status>,
    running: Mutex<Option<Arc<Running>>>,
}

/// The namespaces nsd owns, shared by every operator connection.
struct Shared {
    opts: RunOptions,
    next_id: Mutex<u64>,
    spaces: Mutex<BTreeMap<u64, Arc<Space>>>,
}

/// The `/ns` tree as one operator sees it: the namespaces they start run under their own uid
/// (root's under a per-namespace uid).
pub struct Nsd {
    shared: Arc<Shared>,
    operator_uid: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Root,
    Clone,
    Dir(u64),
    File(u64, FileKind),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    Spec,
    Status,
    Ctl,
    Wait,
}

const FILES: [(&str, FileKind); 4] = [
    ("spec", FileKind::Spec),
    ("status", FileKind::Status),
    ("ctl", FileKind::Ctl),
    ("wait", FileKind::Wait),
];

impl Node {
    fn qid(self) -> QId {
        let (typ, path) = match self {
            Node::Root => (QIdType::DIR, 1),
            Node::Clone => (QIdType::FILE, 2),
            Node::Dir(id) => (QIdType::DIR, (id << 8) | 0x10),
            Node::File(id, k) => (QIdType::FILE, (id << 8) | (0x11 + k as u64)),
        };
        QId {
            typ,
            version: 0,
            path,
        }
    }

    fn stat(self) -> Stat {
        let (mode, nlink) = match self {
            Node::Root | Node::Dir(_) => (0o040555, 2),
            Node::Clone | Node::File(_, FileKind::Ctl) => (0o100660, 1),
            Node::File(..) => (0o100440, 1),
        };
        let t = Time { sec: 0, nsec: 0 };
        Stat {
            mode,
            uid: 0,
            gid: 0,
            nlink,
            rdev: 0,
            size: 0,
            blksize: 4096,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }
}

/// Per-fid state: the node, and for `clone` the spec written so far and the answer.
pub struct NsFid {
    node: Node,
    written: Vec<u8>,
    answer: Option<Vec<u8>>,
}

fn slice(bytes: &[u8], offset: u64, count: u32) -> Vec<u8> {
    let start = (offset.min(bytes.len() as u64)) as usize;
    let end = (start + count as usize).min(bytes.len());
    bytes[start..end].to_vec()
}

impl Nsd {
    /// nsd's tree for root. Namespaces started by nsd get /dev/null stdio unless `opts.stdio`
    /// says otherwise.
    pub fn new(mut opts: RunOptions) -> std::io::Result<Nsd> {
        if opts.stdio.is_none() {
            opts.stdio = Some(Arc::new(PayloadStdio::null()?));
        }
        Ok(Nsd {
            shared: Arc::new(Shared {
                opts,
                next_id: Mutex::new(1),
                spaces: Mutex::new(BTreeMap::new()),
            }),
            operator_uid: 0,
        })
    }

    /// The same namespaces, for an operator connection from `uid`.
    pub fn for_operator(&self, uid: u32) -> Nsd {
        Nsd {
            shared: self.shared.clone(),
            operator_uid: uid,
        }
    }

    /// The run options for a namespace this operator starts: never uid 0; a non-root operator's
    /// own uid, else the per-namespace default.
    fn run_options(&self) -> RunOptions {
        let mut opts = self.shared.opts.clone();
        if self.operator_uid != 0 {
            opts.uid = Some(self.operator_uid);
        }
        opts
    }

    fn space(&self, id: u64) -> Result<Arc<Space>> {
        self.shared
            .spaces
            .lock()
            .unwrap()
            .get(&id)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn lookup(&self, node: Node, name: &str) -> Result<Node> {
        match (node, name) {
            (Node::Root, "." | "..") | (Node::Dir(_), "..") => Ok(Node::Root),
            (Node::Root, "clone") => Ok(Node::Clone),
            (Node::Root, _) => {
                let id: u64 = name.parse().map_err(|_| Errno::ENOENT)?;
                self.space(id)?;
                Ok(Node::Dir(id))
            }
            (Node::Dir(id), ".") => Ok(Node::Dir(id)),
            (Node::Dir(id), _) => FILES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, k)| Node::File(id, *k))
                .ok_or(Errno::ENOENT),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn create_space(&self, text: &[u8]) -> Result<u64> {
        let text = std::str::from_utf8(text).map_err(|_| Errno::EINVAL)?;
        let spec = spec::parse("<clone>", text).map_err(|e| {
            tracing::warn!("/ns/clone: refused spec:\n{e}");
            Errno::EINVAL
        })?;
        let id = {
            let mut next = self.shared.next_id.lock().unwrap();
            let id = *next;
            *next += 1;
            id
        };
        let (status, _) = watch::channel(Status::Created);
        self.shared.spaces.lock().unwrap().insert(
            id,
            Arc::new(Space {
                spec,
                status,
                running: Mutex::new(None),
            }),
        );
        Ok(id)
    }

    async fn ctl(&self, id: u64, line: &str) -> Result<()> {
        let space = self.space(id)?;
        let words = spec::split_command(line.trim_end_matches('\n')).map_err(|e| {
            tracing::warn!("/ns/{id}/ctl: {e}");
            Errno::EINVAL
        })?;
        match words.split_first() {
            Some((cmd, argv)) if cmd == "run" && !argv.is_empty() => {
                if *space.status.borrow() != Status::Created {
                    return Err(Errno::EBUSY);
                }
                // Mark it before the (blocking) build, so a second `run` is refused.
                space.status.send_replace(Status::Running { holder: 0 });
                let opts = self.run_options();
                let argv = argv.to_vec();
                let building = space.clone();
                let running =
                    tokio::task::spawn_blocking(move || spawn(&building.spec, &argv, &opts))
                        .await
                        .map_err(|_| Errno::EIO)?;
                // The write returns once the command has exec'd, or fails (status says why).
                let running = match running {
                    Ok(r) => Arc::new(r),
                    Err(e) => {
                        space.status.send_replace(Status::Failed(e.to_string()));
                        return Err(Errno::from_io(&e));
                    }
                };
                *space.running.lock().unwrap() = Some(running.clone());
                space.status.send_replace(Status::Running {
                    holder: running.holder_pid(),
                });
                tokio::task::spawn_blocking(move || wait_space(&space, &running));
                Ok(())
            }
            Some((cmd, rest)) if cmd == "kill" && rest.is_empty() => {
                let running = space.running.lock().unwrap().clone();
                match running {
                    Some(r) => r.kill().map_err(|e| Errno::from_io(&e)),
                    None => Err(Errno(libc::ESRCH as u32)),
                }
            }
            _ => Err(Errno::EINVAL),
        }
    }
}

/// On a blocking thread: wait for the command and record its end.
fn wait_space(space: &Space, running: &Running) {
    let end = match running.wait() {
        Ok(code) => Status::Exited(code),
        Err(e) => Status::Failed(e.to_string()),
    };
    *space.running.lock().unwrap() = None;
    space.status.send_replace(end);
}

#[async_trait::async_trait]
impl FileTree for Nsd {
    type Fid = NsFid;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, NsFid)> {
        Ok((
            Node::Root.qid(),
            NsFid {
                node: Node::Root,
                written: Vec::new(),
                answer: None,
            },
        ))
    }

    async fn walk(&self, from: &NsFid, names: &[String]) -> Result<(Vec<QId>, Option<NsFid>)> {
        let mut node = from.node;
        let mut qids = Vec::new();
        for name in names {
            match self.lookup(node, name) {
                Ok(next) => {
                    node = next;
                    qids.push(node.qid());
                }
                Err(e) if qids.is_empty() => return Err(e),
                Err(_) => return Ok((qids, None)),
            }
        }
        Ok((
            qids,
            Some(NsFid {
                node,
                written: Vec::new(),
                answer: None,
            }),
        ))
    }

    async fn getattr(&self, fid: &NsFid, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        Ok((fid.node.qid(), fid.node.stat()))
    }

    async fn open(&self, fid: &mut NsFid, _flags: u32) -> Result<(QId, u32)> {
        if let Node::Dir(id) | Node::File(id, _) = fid.node {
            self.space(id)?;
        }
        Ok((fid.node.qid(), 0))
    }

    async fn read(&self, fid: &mut NsFid, offset: u64, count: u32) -> Result<Vec<u8>> {
        match fid.node {
            Node::Root | Node::Dir(_) => Err(Errno::EISDIR),
            Node::Clone => {
                if fid.answer.is_none() {
                    let id = self.create_space(&fid.written)?;
                    fid.answer = Some(format!("{id}\n").into_bytes());
                }
                Ok(slice(
                    fid.answer.as_deref().unwrap_or_default(),
                    offset,
                    count,
                ))
            }
            Node::File(id, kind) => {
                let space = self.space(id)?;
                let text = match kind {
                    FileKind::Spec => space.spec.to_text(),
                    FileKind::Status => space.status.borrow().line(),
                    FileKind::Ctl => return Ok(Vec::new()),
                    FileKind::Wait => {
                        let mut rx = space.status.subscribe();
                        let end = rx
                            .wait_for(Status::is_final)
                            .await
                            .map_err(|_| Errno::EIO)?;
                        end.line()
                    }
                };
                Ok(slice(text.as_bytes(), offset, count))
            }
        }
    }

    async fn write(&self, fid: &mut NsFid, _offset: u64, data: &[u8]) -> Result<u32> {
        match fid.node {
            Node::Clone if fid.answer.is_none() => {
                if fid.written.len() + data.len() > MAX_SPEC {
                    return Err(Errno::EFBIG);
                }
                fid.written.extend_from_slice(data);
                Ok(data.len() as u32)
            }
            Node::File(id, FileKind::Ctl) => {
                let line = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
                self.ctl(id, line).await?;
                Ok(data.len() as u32)
            }
            Node::Root | Node::Dir(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EACCES),
        }
    }

    async fn readdir(&self, fid: &mut NsFid, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        let entries: Vec<(String, Node)> = match fid.node {
            Node::Root => std::iter::once(("clone".to_string(), Node::Clone))
                .chain(
                    self.shared
                        .spaces
                        .lock()
                        .unwrap()
                        .keys()
                        .map(|id| (id.to_string(), Node::Dir(*id))),
                )
                .collect(),
            Node::Dir(id) => FILES
                .iter()
                .map(|(n, k)| (n.to_string(), Node::File(id, *k)))
                .collect(),
            _ => return Err(Errno::ENOTDIR),
        };
        Ok(entries
            .into_iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, (name, node))| DirEntry {
                qid: node.qid(),
                offset: i as u64 + 1,
                typ: if matches!(node, Node::Root | Node::Dir(_)) {
                    4
                } else {
                    8
                },
                name,
            })
            .collect())
    }
}

/// The largest spec `clone` takes.
const MAX_SPEC: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_namespaces_run_under_their_uid_and_roots_never_as_0() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        assert_eq!(nsd.run_options().uid, None, "root: a per-namespace uid");
        assert_eq!(nsd.for_operator(0).run_options().uid, None);
        assert_eq!(nsd.for_operator(1234).run_options().uid, Some(1234));
        // One set of namespaces, whoever looks.
        assert!(Arc::ptr_eq(&nsd.shared, &nsd.for_operator(1234).shared));
    }
}
