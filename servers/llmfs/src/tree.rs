//! The `/llm` tree of one connection (a [`warren_9p::FileTree`]): `new`, and for each session
//! this connection minted `<token>/{model,system,tools,ask,usage,ctl,err}`. A token minted on another
//! connection does not exist here (ENOENT): a connection sees only its own sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;

use warren_9p::synthetic::walk;
use warren_9p::{DirEntry, Errno, FileTree, GetAttrMask, QId, QIdType, Result, Stat, Time, oflags};

use crate::backend::Backend;
use crate::gate::ModelGate;
use crate::memory::{Account, Charge, EDQUOT, Ledger};
use crate::receipts::Receipts;
use crate::session::{
    Defaults, MAX_ASKS_IN_FLIGHT, MAX_FILE_BYTES, Session, Setting, SettingError,
};

/// Sessions one connection may hold; one more open of `new` gets EAGAIN.
pub const MAX_SESSIONS: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum File {
    Model,
    System,
    Tools,
    Ask,
    Usage,
    Ctl,
    Err,
}

const FILES: [(&str, File); 7] = [
    ("model", File::Model),
    ("system", File::System),
    ("tools", File::Tools),
    ("ask", File::Ask),
    ("usage", File::Usage),
    ("ctl", File::Ctl),
    ("err", File::Err),
];

impl File {
    fn name(self) -> &'static str {
        FILES.iter().find(|(_, f)| *f == self).expect("listed").0
    }
    fn setting(self) -> Option<Setting> {
        match self {
            File::Model => Some(Setting::Model),
            File::System => Some(Setting::System),
            File::Tools => Some(Setting::Tools),
            _ => None,
        }
    }
}

#[derive(Clone)]
enum Node {
    Root,
    New,
    Dir(Arc<Session>),
    File(Arc<Session>, File),
}

pub struct LlmFid {
    node: Node,
    open: Option<Opened>,
}

enum Opened {
    Plain,
    /// An open of `new`: the token it minted (read as often as asked).
    New(Vec<u8>),
    Ask(AskOpen),
}

/// One open of `ask`: writes gather a message, whatever their offset; the next read (or the
/// clunk) starts the ask with it; reads return the reply at `offset − o₀`, o₀ being the offset
/// of the first read of that turn.
struct AskOpen {
    message: Vec<u8>,
    /// The message's bytes, charged to the subtree's memory budget until the ask takes it.
    held: Charge,
    /// The turn this fid reads, and its o₀.
    reading: Option<(u64, u64)>,
}

pub struct LlmTree {
    backend: Arc<Backend>,
    receipts: Option<Arc<Receipts>>,
    defaults: Defaults,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// The namespace session this connection was handed over for (`llmfs.ctl`): every session
    /// minted here is receipted in its scope. None: the operator socket.
    scope: Option<String>,
    /// How this namespace's model calls are decided (`crate::gate`); None: not decided (the
    /// operator socket, or llmfs run with `--no-gate`).
    gate: Option<Arc<ModelGate>>,
    /// The connection's share of asks running at once ([`MAX_ASKS_IN_FLIGHT`]).
    in_flight: Arc<Semaphore>,
    /// What its sessions hold is charged to: the namespace's subtree, or (the operator socket)
    /// the connection's own.
    ledger: Arc<Ledger>,
    account: Arc<Account>,
    mtime: Time,
}

impl LlmTree {
    pub fn new(
        backend: Arc<Backend>,
        receipts: Option<Arc<Receipts>>,
        defaults: Defaults,
        ledger: Arc<Ledger>,
    ) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        LlmTree {
            backend,
            receipts,
            defaults,
            sessions: Mutex::new(HashMap::new()),
            scope: None,
            gate: None,
            in_flight: Arc::new(Semaphore::new(MAX_ASKS_IN_FLIGHT)),
            account: ledger.connection(),
            ledger,
            mtime: Time {
                sec: now.as_secs(),
                nsec: u64::from(now.subsec_nanos()),
            },
        }
    }

    /// This connection's sessions are receipted in `scope` (a namespace's session), their calls
    /// decided through `gate`, their bytes charged to the subtree `lineage` names.
    pub fn in_scope(
        mut self,
        scope: String,
        gate: Option<ModelGate>,
        lineage: &warren_proto::lineage::Lineage,
    ) -> Self {
        self.scope = Some(scope);
        self.gate = gate.map(Arc::new);
        self.account = self.ledger.namespace(lineage);
        self
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mint(&self) -> Result<String> {
        let mut sessions = self.sessions();
        if sessions.len() >= MAX_SESSIONS {
            tracing::warn!("session cap ({MAX_SESSIONS}) reached on a connection");
            return Err(Errno::EAGAIN);
        }
        let mut bits = [0u8; 16];
        getrandom::fill(&mut bits).map_err(|_| Errno::EIO)?;
        let token = hex::encode(bits);
        sessions.insert(
            token.clone(),
            Arc::new(match &self.scope {
                Some(scope) => Session::in_scope(
                    token.clone(),
                    scope.clone(),
                    &self.defaults,
                    self.account.clone(),
                ),
                None => Session::new(token.clone(), &self.defaults, self.account.clone()),
            }),
        );
        Ok(token)
    }

    fn child(&self, node: &Node, name: &str) -> Option<Node> {
        match (node, name) {
            (Node::Root, "..") | (Node::Dir(_), "..") => Some(Node::Root),
            (Node::Root, "new") => Some(Node::New),
            (Node::Root, token) => self.sessions().get(token).cloned().map(Node::Dir),
            (Node::Dir(s), name) => FILES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, f)| Node::File(s.clone(), *f)),
            _ => None,
        }
    }

    fn qid(node: &Node) -> QId {
        let path = match node {
            Node::Root => "/".to_owned(),
            Node::New => "/new".to_owned(),
            Node::Dir(s) => format!("/{}", s.token()),
            Node::File(s, f) => format!("/{}/{}", s.token(), f.name()),
        };
        warren_9p::synthetic::qid(
            matches!(node, Node::Root | Node::Dir(_)),
            0,
            fnv1a(path.as_bytes()),
        )
    }

    fn entries(&self, node: &Node) -> Vec<(String, Node)> {
        match node {
            Node::Root => {
                let mut sessions: Vec<_> = self
                    .sessions()
                    .iter()
                    .map(|(t, s)| (t.clone(), Node::Dir(s.clone())))
                    .collect();
                sessions.sort_by(|a, b| a.0.cmp(&b.0));
                std::iter::once(("new".to_owned(), Node::New))
                    .chain(sessions)
                    .collect()
            }
            Node::Dir(s) => FILES
                .iter()
                .map(|(n, f)| (n.to_string(), Node::File(s.clone(), *f)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Starts the ask gathered on this fid, if it gathered one.
    fn start_pending(&self, session: &Arc<Session>, ask: &mut AskOpen, offset: u64) -> Result<()> {
        if ask.message.is_empty() {
            return Ok(());
        }
        let turn = session
            .start(
                &ask.message,
                self.backend.clone(),
                self.receipts.clone(),
                self.gate.clone(),
                &self.in_flight,
            )
            .ok_or(Errno::EBUSY)?;
        ask.message = Vec::new();
        // Given back: the ask's request holds the message now.
        let _ = ask.held.set(0);
        ask.reading = Some((turn, offset));
        Ok(())
    }

    /// Reads the current turn's reply at `offset`, waiting until there is more or it ended.
    async fn read_reply(
        session: &Session,
        ask: &mut AskOpen,
        offset: u64,
        count: u32,
    ) -> Result<Vec<u8>> {
        let mut rx = session.subscribe();
        let (turn, base) = {
            let current = rx.borrow().turn;
            if current == 0 {
                // Nothing asked yet: nothing to wait for.
                return Ok(Vec::new());
            }
            match ask.reading {
                Some((t, base)) if t == current => (t, base),
                // The reply this open was reading is over, and another open asked again.
                Some(_) => return Ok(Vec::new()),
                // The first read of an open that asked nothing: the current reply.
                None => {
                    ask.reading = Some((current, offset));
                    (current, offset)
                }
            }
        };
        let at = usize::try_from(offset.saturating_sub(base)).unwrap_or(usize::MAX);
        let ready = rx
            .wait_for(|r| r.turn != turn || r.done || r.bytes.len() > at)
            .await
            .map_err(|_| Errno::EIO)?;
        if ready.turn != turn || at >= ready.bytes.len() {
            return Ok(Vec::new());
        }
        let end = at.saturating_add(count as usize).min(ready.bytes.len());
        Ok(ready.bytes[at..end].to_vec())
    }
}

impl Drop for LlmTree {
    /// The connection is gone, and with it every session it held: their asks end.
    fn drop(&mut self) {
        for s in self.sessions().values() {
            s.abort();
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[async_trait::async_trait]
impl FileTree for LlmTree {
    type Fid = LlmFid;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, LlmFid)> {
        Ok((
            Self::qid(&Node::Root),
            LlmFid {
                node: Node::Root,
                open: None,
            },
        ))
    }

    async fn walk(&self, from: &LlmFid, names: &[String]) -> Result<(Vec<QId>, Option<LlmFid>)> {
        let (qids, node) = walk(from.node.clone(), names, |node, name| {
            let Some(next) = self.child(node, name) else {
                return Err(if matches!(node, Node::Root | Node::Dir(_)) {
                    Errno::ENOENT
                } else {
                    Errno::ENOTDIR
                });
            };
            let qid = Self::qid(&next);
            Ok((next, qid))
        })?;
        Ok((qids, node.map(|node| LlmFid { node, open: None })))
    }

    async fn getattr(&self, fid: &LlmFid, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        let mode = match &fid.node {
            Node::Root | Node::Dir(_) => libc::S_IFDIR | 0o555,
            Node::New | Node::File(_, File::Usage | File::Err) => libc::S_IFREG | 0o444,
            Node::File(..) => libc::S_IFREG | 0o666,
        };
        let dir = mode & libc::S_IFDIR != 0;
        let stat = Stat {
            mode,
            uid: 0,
            gid: 0,
            nlink: if dir { 2 } else { 1 },
            rdev: 0,
            size: 0,
            blksize: 4096,
            blocks: 0,
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
        };
        Ok((Self::qid(&fid.node), stat))
    }

    async fn open(&self, fid: &mut LlmFid, flags: u32) -> Result<(QId, u32)> {
        if fid.open.is_some() {
            return Err(Errno::EINVAL);
        }
        let writes = flags & oflags::ACCMODE != oflags::RDONLY;
        fid.open = Some(match &fid.node {
            Node::Root | Node::Dir(_) if writes => return Err(Errno::EISDIR),
            Node::New | Node::File(_, File::Usage | File::Err) if writes => {
                return Err(Errno::EACCES);
            }
            Node::New => {
                let mut token = self.mint()?.into_bytes();
                token.push(b'\n');
                Opened::New(token)
            }
            Node::File(s, File::Ask) => Opened::Ask(AskOpen {
                message: Vec::new(),
                held: s.charge(),
                reading: None,
            }),
            _ => Opened::Plain,
        });
        Ok((Self::qid(&fid.node), 0))
    }

    async fn read(&self, fid: &mut LlmFid, offset: u64, count: u32) -> Result<Vec<u8>> {
        let Some(open) = &mut fid.open else {
            return Err(Errno::EBADF);
        };
        match (&fid.node, open) {
            (_, Opened::New(token)) => Ok(warren_9p::synthetic::slice(token, offset, count)),
            (Node::File(s, _), Opened::Ask(ask)) => {
                self.start_pending(s, ask, offset)?;
                Self::read_reply(s, ask, offset, count).await
            }
            (Node::File(s, File::Ctl), _) => Ok(warren_9p::synthetic::slice(
                s.control_text().as_bytes(),
                offset,
                count,
            )),
            (Node::File(s, File::Usage), _) => Ok(warren_9p::synthetic::slice(
                s.usage_text().as_bytes(),
                offset,
                count,
            )),
            (Node::File(s, File::Err), _) => Ok(warren_9p::synthetic::slice(
                s.refusal_text().as_bytes(),
                offset,
                count,
            )),
            (Node::File(s, f), _) => {
                let which = f.setting().ok_or(Errno::EINVAL)?;
                Ok(warren_9p::synthetic::slice(
                    &s.read_setting(which),
                    offset,
                    count,
                ))
            }
            _ => Err(Errno::EISDIR),
        }
    }

    async fn write(&self, fid: &mut LlmFid, offset: u64, data: &[u8]) -> Result<u32> {
        let Some(open) = &mut fid.open else {
            return Err(Errno::EBADF);
        };
        let taken = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        // A refused write fails with its errno; the session's `err` file says why.
        let refuse = |s: &Session, file: File, errno: Errno, why: String| {
            tracing::info!("{} refused: {why}", file.name());
            s.refused(&format!("{}: {why}", file.name()));
            errno
        };
        match (&fid.node, open) {
            (Node::File(s, File::Ask), Opened::Ask(ask)) => {
                let size = ask.message.len() + data.len();
                if size > MAX_FILE_BYTES {
                    let why = format!("a message is at most {MAX_FILE_BYTES} bytes");
                    return Err(refuse(s, File::Ask, Errno::EFBIG, why));
                }
                ask.held
                    .set(size as u64)
                    .map_err(|e| refuse(s, File::Ask, EDQUOT, e.to_string()))?;
                ask.message.extend_from_slice(data);
                Ok(taken)
            }
            // Each write is whole lines of control (Plan 9's ctl files): applied, or refused whole.
            (Node::File(s, File::Ctl), Opened::Plain) => {
                let text = std::str::from_utf8(data)
                    .map_err(|_| refuse(s, File::Ctl, Errno::EINVAL, "not UTF-8".into()))?;
                s.control(text)
                    .map_err(|e| refuse(s, File::Ctl, Errno::EINVAL, e))?;
                Ok(taken)
            }
            (Node::File(s, f), Opened::Plain) => {
                let which = f.setting().ok_or(Errno::EACCES)?;
                s.write_setting(which, offset, data).map_err(|e| {
                    let errno = match e {
                        SettingError::TooBig(_) => Errno::EFBIG,
                        SettingError::Invalid(_) => Errno::EINVAL,
                        SettingError::OverBudget(_) => EDQUOT,
                    };
                    refuse(s, *f, errno, e.to_string())
                })?;
                Ok(taken)
            }
            _ => Err(Errno::EACCES),
        }
    }

    async fn readdir(&self, fid: &mut LlmFid, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        if fid.open.is_none() {
            return Err(Errno::EBADF);
        }
        if !matches!(fid.node, Node::Root | Node::Dir(_)) {
            return Err(Errno::ENOTDIR);
        }
        Ok(self
            .entries(&fid.node)
            .into_iter()
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .map(|(i, (name, node))| {
                let qid = Self::qid(&node);
                DirEntry {
                    qid,
                    offset: i as u64 + 1,
                    typ: if qid.typ.contains(QIdType::DIR) {
                        libc::DT_DIR
                    } else {
                        libc::DT_REG
                    },
                    name,
                }
            })
            .collect())
    }

    async fn clunk(&self, fid: LlmFid) {
        // `echo hi > ask`: written, never read; the ask starts now, for `cat ask` to read.
        if let (Node::File(s, File::Ask), Some(Opened::Ask(mut ask))) = (fid.node, fid.open)
            && let Err(e) = self.start_pending(&s, &mut ask, 0)
        {
            tracing::info!("ask written and closed while another runs: dropped ({e})");
        }
    }
}
