//! The `/tool` tree of one connection (a [`warren_9p::FileTree`]), built from that connection's
//! grant: `tools`, and for each granted tool `<name>/{doc,schema,call}`. Nothing else exists.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use warren_9p::synthetic::walk;
use warren_9p::{DirEntry, Errno, FileTree, GetAttrMask, QId, QIdType, Result, Stat, Time, oflags};

use crate::call::{CallOpen, ResultForm};
use crate::catalog::Runner;
use crate::dispatch::Dispatcher;
use crate::grant::ConnGrant;
use crate::services::Services;

/// Per-connection caps.
#[derive(Debug, Clone)]
pub struct TreeLimits {
    /// Call files open (or still running after their fid went away) at once, per session (per
    /// connection on the operator socket); one more open gets EAGAIN.
    pub max_open_calls: usize,
    /// Argument bytes per call; a write past it gets EFBIG.
    pub max_arg_bytes: usize,
}

impl Default for TreeLimits {
    fn default() -> TreeLimits {
        TreeLimits {
            max_open_calls: 128,
            max_arg_bytes: 1 << 20,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Root,
    Tools,
    Dir(usize),
    Doc(usize),
    Schema(usize),
    Call(usize),
    /// `call.mcp`: a call whose result keeps its MCP form (an MCP server's tools only).
    McpCall(usize),
    /// `resources/` (each file the resource's bytes), when the grant comes with read-only files
    /// (an MCP server's resources); `resources.mcp/` (each file the resource as MCP reads it:
    /// URI, MIME type, text or blob) beside it.
    Resources(ResultForm),
    Resource(usize, ResultForm),
}

/// Read-only files served under `resources/` beside the tools: an MCP server's resources. The
/// names are fixed for the connection's life; a file's bytes are read when it is opened.
#[async_trait::async_trait]
pub trait ResourceFiles: Send + Sync {
    fn names(&self) -> Vec<String>;
    /// The bytes of `name` (one of `names`), read for one open. They are the server's data:
    /// the session is marked as having read untrusted content.
    async fn read(&self, name: &str, session: &str) -> Result<Vec<u8>>;
    /// `name` as MCP's `resources/read` gives it: JSON `{"contents": [{"uri", "mimeType"?,
    /// "text" | "blob"}…]}` (`resources.mcp/`, which `warren mcp serve` reads).
    async fn read_mcp(&self, name: &str, session: &str) -> Result<Vec<u8>>;
}

/// The name of the directory of a resource's MCP form.
const RESOURCES_MCP: &str = "resources.mcp";

/// The names the tree itself serves beside the tools (`tools`, and a whole-server mount's
/// `resources` and `resources.mcp`): no tool may be named one of them, or it would be shadowed
/// (or shadow) in one tree and not in another.
pub const RESERVED_NAMES: [&str; 3] = ["tools", "resources", RESOURCES_MCP];

const DIR_FILES: [&str; 3] = ["doc", "schema", "call"];

/// State of one fid.
pub struct ToolFid {
    node: Node,
    open: Option<Opened>,
}

enum Opened {
    /// A directory or a static file.
    Plain,
    /// A resource, read when it was opened.
    Bytes(Vec<u8>),
    Call(Box<CallOpen>),
}

pub struct ToolTree {
    dispatcher: Arc<Dispatcher>,
    /// `resources/` and its files, when the grant has them.
    resources: Option<(Vec<String>, Arc<dyn ResourceFiles>)>,
    tools_file: Vec<u8>,
    limits: TreeLimits,
    open_calls: Arc<AtomicUsize>,
    mtime: Time,
}

impl ToolTree {
    /// `open_calls` counts the open calls against `limits.max_open_calls`: a counter of the
    /// connection's own, or one shared by every connection of a session.
    pub fn new(
        grant: ConnGrant,
        limits: TreeLimits,
        open_calls: Arc<AtomicUsize>,
        services: Arc<Services>,
    ) -> ToolTree {
        let grant = Arc::new(grant);
        let tools_file = grant
            .tools
            .iter()
            .map(|t| format!("{}\t{}\t{}\n", t.def.name, t.def.tier, t.def.description))
            .collect::<String>()
            .into_bytes();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        tracing::info!(conn = %grant.label, tools = grant.tools.len(), "serving a connection");
        ToolTree {
            dispatcher: Arc::new(Dispatcher::new(grant, services)),
            resources: None,
            tools_file,
            limits,
            open_calls,
            mtime: Time {
                sec: now.as_secs(),
                nsec: u64::from(now.subsec_nanos()),
            },
        }
    }

    /// Serves `files` under `resources/` too.
    pub fn with_resources(mut self, files: Arc<dyn ResourceFiles>) -> ToolTree {
        self.resources = Some((files.names(), files));
        self
    }

    /// Reads resource `i` for one open: the session has then read untrusted content (its
    /// context tightens), and the read is receipted (`query`: what was read, its digest). Fail
    /// closed: a read whose receipt cannot be queued is refused.
    async fn read_resource(&self, i: usize, form: ResultForm) -> Result<Vec<u8>> {
        let (names, files) = self.resources.as_ref().ok_or(Errno::ENOENT)?;
        let receipt = self.dispatcher.services().receipts.reserve().map_err(|e| {
            tracing::error!(conn = %self.grant().label, "resource read refused: {e}");
            Errno::EIO
        })?;
        let session = self.dispatcher.session();
        let (bytes, subject) = match form {
            ResultForm::Envelope => (
                files.read(&names[i], session).await?,
                serde_json::json!({"resource": names[i]}),
            ),
            ResultForm::Mcp => (
                files.read_mcp(&names[i], session).await?,
                serde_json::json!({"resource": names[i], "form": "mcp"}),
            ),
        };
        self.dispatcher.context().mark_untrusted();
        receipt.send_charged(
            self.dispatcher.session(),
            "query",
            subject,
            serde_json::json!({"content": crate::envelope::content_digest(&bytes)}),
            self.grant().budgets.as_ref(),
        );
        Ok(bytes)
    }

    fn resource_name(&self, i: usize) -> &str {
        self.resources.as_ref().map_or("", |(names, _)| &names[i])
    }

    fn grant(&self) -> &ConnGrant {
        self.dispatcher.grant()
    }

    /// Whether tool `i`'s results have an MCP form (it is an MCP server's tool): `call.mcp`.
    fn has_mcp_form(&self, i: usize) -> bool {
        matches!(self.grant().tools[i].def.runner, Runner::External(_))
    }

    fn tool_name(&self, i: usize) -> &str {
        &self.grant().tools[i].def.name
    }

    fn path_of(&self, node: Node) -> String {
        match node {
            Node::Root => "/".into(),
            Node::Tools => "/tools".into(),
            Node::Dir(i) => format!("/{}", self.tool_name(i)),
            Node::Doc(i) => format!("/{}/doc", self.tool_name(i)),
            Node::Schema(i) => format!("/{}/schema", self.tool_name(i)),
            Node::Call(i) => format!("/{}/call", self.tool_name(i)),
            Node::McpCall(i) => format!("/{}/call.mcp", self.tool_name(i)),
            Node::Resources(form) => format!("/{}", resources_dir(form)),
            Node::Resource(i, form) => {
                format!("/{}/{}", resources_dir(form), self.resource_name(i))
            }
        }
    }

    /// The path is hashed, so a file has the same qid path everywhere; a static file's version
    /// is a hash of its content, so `tools` of two different grants never look alike to a cache.
    fn qid(&self, node: Node) -> QId {
        let typ = if matches!(node, Node::Root | Node::Dir(_) | Node::Resources(_)) {
            QIdType::DIR
        } else {
            QIdType::FILE
        };
        let version = self.static_bytes(node).map_or(0, |b| fnv1a(b) as u32);
        QId {
            typ,
            version,
            path: fnv1a(self.path_of(node).as_bytes()),
        }
    }
    fn static_bytes(&self, node: Node) -> Option<&[u8]> {
        match node {
            Node::Tools => Some(&self.tools_file),
            Node::Doc(i) => Some(self.grant().tools[i].def.doc.as_bytes()),
            Node::Schema(i) => Some(&self.grant().tools[i].def.schema_text),
            _ => None,
        }
    }

    fn child(&self, node: Node, name: &str) -> Option<Node> {
        match (node, name) {
            (Node::Root, "..") => Some(Node::Root),
            (Node::Dir(_) | Node::Resources(_), "..") => Some(Node::Root),
            (Node::Root, "resources") if self.resources.is_some() => {
                Some(Node::Resources(ResultForm::Envelope))
            }
            (Node::Root, RESOURCES_MCP) if self.resources.is_some() => {
                Some(Node::Resources(ResultForm::Mcp))
            }
            (Node::Resources(form), name) => self
                .resources
                .as_ref()
                .and_then(|(names, _)| names.iter().position(|n| n == name))
                .map(|i| Node::Resource(i, form)),
            // An empty grant shows nothing at all, not even an empty `tools`.
            (Node::Root, "tools") => (!self.grant().tools.is_empty()).then_some(Node::Tools),
            (Node::Root, name) => self
                .grant()
                .tools
                .iter()
                .position(|t| t.def.name == name)
                .map(Node::Dir),
            (Node::Dir(i), "doc") => Some(Node::Doc(i)),
            (Node::Dir(i), "schema") => Some(Node::Schema(i)),
            (Node::Dir(i), "call") => Some(Node::Call(i)),
            (Node::Dir(i), "call.mcp") if self.has_mcp_form(i) => Some(Node::McpCall(i)),
            _ => None,
        }
    }

    fn entries(&self, node: Node) -> Vec<(String, Node)> {
        match node {
            Node::Root => self
                .child(Node::Root, "tools")
                .map(|n| ("tools".to_owned(), n))
                .into_iter()
                .chain(
                    self.grant()
                        .tools
                        .iter()
                        .enumerate()
                        .map(|(i, t)| (t.def.name.clone(), Node::Dir(i))),
                )
                .chain(self.resources.iter().flat_map(|_| {
                    [ResultForm::Envelope, ResultForm::Mcp]
                        .map(|form| (resources_dir(form).to_owned(), Node::Resources(form)))
                }))
                .collect(),
            Node::Resources(form) => self
                .resources
                .iter()
                .flat_map(|(names, _)| names.iter().cloned().enumerate())
                .map(|(i, n)| (n, Node::Resource(i, form)))
                .collect(),
            Node::Dir(i) => DIR_FILES
                .iter()
                .chain(self.has_mcp_form(i).then_some(&"call.mcp"))
                .map(|n| {
                    (
                        n.to_string(),
                        self.child(Node::Dir(i), n).expect("fixed names"),
                    )
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn resources_dir(form: ResultForm) -> &'static str {
    match form {
        ResultForm::Envelope => "resources",
        ResultForm::Mcp => RESOURCES_MCP,
    }
}

/// FNV-1a: stable across connections, runs and builds (unlike std's randomly keyed hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Counts a connection's open calls; shared by the fid and by a call still running after its
/// fid was clunked, so a client cannot pile up detached calls.
pub(crate) struct CallSlot(Arc<AtomicUsize>);

impl Drop for CallSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[async_trait::async_trait]
impl FileTree for ToolTree {
    type Fid = ToolFid;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, ToolFid)> {
        Ok((
            self.qid(Node::Root),
            ToolFid {
                node: Node::Root,
                open: None,
            },
        ))
    }

    async fn walk(&self, from: &ToolFid, names: &[String]) -> Result<(Vec<QId>, Option<ToolFid>)> {
        let (qids, node) = walk(from.node, names, |&node, name| {
            let Some(next) = self.child(node, name) else {
                return Err(
                    if matches!(node, Node::Root | Node::Dir(_) | Node::Resources(_)) {
                        Errno::ENOENT
                    } else {
                        Errno::ENOTDIR
                    },
                );
            };
            Ok((next, self.qid(next)))
        })?;
        Ok((qids, node.map(|node| ToolFid { node, open: None })))
    }

    async fn getattr(&self, fid: &ToolFid, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        let (mode, nlink, size) = match fid.node {
            Node::Root | Node::Dir(_) | Node::Resources(_) => (libc::S_IFDIR | 0o555, 2, 0),
            // Its size is known only once read: read to the end (the bridge reads directly).
            Node::Resource(..) => (libc::S_IFREG | 0o444, 1, 0),
            Node::Call(_) | Node::McpCall(_) => (libc::S_IFREG | 0o666, 1, 0),
            node => (
                libc::S_IFREG | 0o444,
                1,
                self.static_bytes(node).map_or(0, <[u8]>::len) as u64,
            ),
        };
        let stat = Stat {
            mode,
            uid: 0,
            gid: 0,
            nlink,
            rdev: 0,
            size,
            blksize: 4096,
            blocks: size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
        };
        Ok((self.qid(fid.node), stat))
    }

    async fn open(&self, fid: &mut ToolFid, flags: u32) -> Result<(QId, u32)> {
        if fid.open.is_some() {
            return Err(Errno::EINVAL);
        }
        let writes = flags & oflags::ACCMODE != oflags::RDONLY;
        fid.open = Some(match fid.node {
            Node::Call(i) | Node::McpCall(i) => {
                if self.open_calls.fetch_add(1, Ordering::AcqRel) >= self.limits.max_open_calls {
                    self.open_calls.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(conn = %self.grant().label, "open call cap ({}) reached", self.limits.max_open_calls);
                    return Err(Errno::EAGAIN);
                }
                let slot = CallSlot(self.open_calls.clone());
                let form = if matches!(fid.node, Node::McpCall(_)) {
                    ResultForm::Mcp
                } else {
                    ResultForm::Envelope
                };
                Opened::Call(Box::new(CallOpen::new(
                    self.grant().tools[i].clone(),
                    slot,
                    form,
                )))
            }
            Node::Root | Node::Dir(_) | Node::Resources(_) if writes => return Err(Errno::EISDIR),
            _ if writes => return Err(Errno::EACCES),
            Node::Resource(i, form) => Opened::Bytes(self.read_resource(i, form).await?),
            _ => Opened::Plain,
        });
        Ok((self.qid(fid.node), 0))
    }

    async fn read(&self, fid: &mut ToolFid, offset: u64, count: u32) -> Result<Vec<u8>> {
        match &mut fid.open {
            None => Err(Errno::EBADF),
            Some(Opened::Call(call)) => call.read(&self.dispatcher, offset, count).await,
            Some(Opened::Bytes(bytes)) => Ok(warren_9p::synthetic::slice(bytes, offset, count)),
            Some(Opened::Plain) => {
                let bytes = self.static_bytes(fid.node).ok_or(Errno::EISDIR)?;
                Ok(warren_9p::synthetic::slice(bytes, offset, count))
            }
        }
    }

    async fn write(&self, fid: &mut ToolFid, _offset: u64, data: &[u8]) -> Result<u32> {
        match &mut fid.open {
            Some(Opened::Call(call)) => call.append(data, self.limits.max_arg_bytes),
            Some(Opened::Plain | Opened::Bytes(_)) => Err(Errno::EACCES),
            None => Err(Errno::EBADF),
        }
    }

    async fn readdir(&self, fid: &mut ToolFid, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        if fid.open.is_none() {
            return Err(Errno::EBADF);
        }
        if !matches!(fid.node, Node::Root | Node::Dir(_) | Node::Resources(_)) {
            return Err(Errno::ENOTDIR);
        }
        Ok(self
            .entries(fid.node)
            .into_iter()
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .map(|(i, (name, node))| {
                let qid = self.qid(node);
                let typ = if qid.typ.contains(QIdType::DIR) {
                    libc::DT_DIR
                } else {
                    libc::DT_REG
                };
                DirEntry {
                    qid,
                    offset: i as u64 + 1,
                    typ,
                    name,
                }
            })
            .collect())
    }

    async fn clunk(&self, fid: ToolFid) {
        if let Some(Opened::Call(call)) = fid.open {
            call.closed(&self.dispatcher);
        }
    }
}
