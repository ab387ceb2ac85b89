//! Serving a namespace's 9P mounts: nsd makes each connection, hands one end with the grant to
//! the server, and gives the other end with the FUSE fd to a bridge process.
//!
//! This is "the connection is the capability": toolfs learns what a namespace may call from the
//! grant record that arrives with the connection on its root-only control socket, never from
//! anything the namespace sends. The bridge is its own process, dropped to the bridge uid once
//! it holds its fds, so a bug in it holds no root.
//!
//! Who makes each connection (docs/decisions.md D4, "nsd's run socket"):
//! - `mount tool` — nsd: a socketpair, one end to toolfs's control socket with the grant record.
//! - `mount gate` — nsd: a socketpair to the gate's control socket as a `namespace` record (the
//!   namespace sees and answers only its descendants' asks).
//! - the client-asks mount (`warren mcp serve --elicit`, in no spec: nsd adds it at
//!   `CLIENT_ASKS_PATH`) — nsd: a socketpair to the gate's control socket as a `channel` record
//!   named `mcp-client:<id>`: the namespace's own session's asks, `allow once` up to `write`.
//! - `mount unix!PATH` / `mount tcp!HOST!PORT` — the launcher, with the operator's own
//!   credentials, handed to nsd with the run request ([`ServedMounts::with_connections`]), so
//!   nsd never connects as root on an operator's behalf. Its bridge reads real file sizes and
//!   attaches with the mount's SPEC words as the aname. Plain 9P off this host needs the
//!   line's `--insecure-plain` (`refuse_plain_off_host`).
//! - `mount -k PEER tcp!HOST!PORT` — the launcher's connection first, nsd running the handshake
//!   on it as the host key; after the link drops, nsd dials the same address itself
//!   (`Import::dial`), and receipts the namespace's calls to the peer (`remote`).
//! - `mount llm` — nsd: a socketpair to llmfs's control socket with the namespace's session
//!   (`warren_proto::llm`): its model sessions live on that connection and are receipted in the
//!   namespace's session, in an operator namespace too.
//! - `mount ns` — nsd: a socketpair to the namespace's own view of `/ns` ([`NsView`]; its
//!   descendants only, and its `clone` narrows: `warren_ns::narrow`).
//! - `mount receipts`, and `mount gate|ns` with the operator's authority — only in an operator
//!   namespace ([`ServedMounts::operator`]): the launcher connects to the daemon's operator
//!   socket itself. `mount receipts` is refused in any other namespace.
//!
//! Why one file: every kind of mount's connection is made, handed over, bridged and re-made here,
//! by one `ServedMounts` per namespace.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_daemon::Dirs;
use warren_daemon::identity::Role;
use warren_proto::launch::CLIENT_ASKS_PATH;
use warren_proto::lineage::{Budget, Lineage, Member};
use warren_proto::toolfs::{GrantRecord, RootGrant, ToolGrant};

use warren_ns::confine::fuse::MountServer;
use warren_ns::handles::ToolRoot;
use warren_ns::spec::{Access, Limits, LocalServer, Mount, Server, Spec};

/// Serves `mount tool …` lines through the running toolfs and a `warren-bridge` per mount.
pub struct ServedMounts {
    dirs: Dirs,
    /// The spec's limits: the budgets its lineage names.
    limits: Limits,
    /// The tools' roots, held open since nsd took the spec in: a grant is built from these,
    /// never by opening a path again.
    tool_roots: Vec<ToolRoot>,
    /// The tools the spec gives the network (`tool NAME net proxy`): toolfs asks nsd for their
    /// workers with it, and nsd gives it from the spec again.
    networked: Vec<String>,
    session: String,
    namespace: String,
    bridge_binary: PathBuf,
    bridges: Mutex<Vec<Bridge>>,
    /// What nsd does when a bridge dies while its namespace runs.
    bridge_watch: Arc<BridgeWatch>,
    /// Connections the launcher made, by mount target path.
    connections: Mutex<BTreeMap<String, OwnedFd>>,
    operator: bool,
    /// The attach's uname on a file server's connection: the operator's user name.
    file_server_uname: Option<String>,
    /// This namespace's own `/ns` (narrowing from inside), for `mount ns` outside an operator
    /// namespace.
    ns_view: Option<Arc<dyn NsView>>,
    /// The command the namespace runs, and the namespaces that cloned it (parent first): the
    /// lineage both grant records carry.
    command: Vec<String>,
    ancestors: Vec<Member>,
    /// `warren mcp serve --elicit`: the gate mount at `CLIENT_ASKS_PATH` is the namespace's own
    /// asks on a capped channel ([`ServedMounts::client_asks_record`]).
    client_asks: bool,
}

/// The mount nsd adds, outside the spec, for a launch with `client_asks`: a gate tree at
/// [`CLIENT_ASKS_PATH`] (beneath `/dev`, where no spec line may land).
pub fn client_asks_mount() -> Mount {
    Mount {
        key: None,
        insecure_plain: false,
        server: Server::Local(LocalServer::Gate),
        path: CLIENT_ASKS_PATH.to_owned(),
        spec: Vec::new(),
    }
}

/// How a bridge presents its tree.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Presentation {
    /// warren's synthetic trees: direct I/O on every file, the connection is the capability.
    Synthetic,
    /// toolfs's `/tool`: synthetic, and every file opened for reading and writing is a call
    /// file, whose first write the bridge sends with its first read.
    CallFiles,
    /// A file server (diod, another host's export): page cache for sized files, and the
    /// mount's SPEC words as the attach name.
    FileServer,
}

/// A namespace as its lineage names it: session, id, command, and the budgets its spec sets.
pub fn member(session: &str, namespace: &str, command: &[String], limits: &Limits) -> Member {
    Member {
        session: session.to_owned(),
        namespace: namespace.to_owned(),
        command: command
            .iter()
            .take(warren_proto::lineage::MAX_COMMAND_WORDS)
            .map(|w| truncate_word(w))
            .collect(),
        budget: Budget {
            receipts: limits.receipts,
            receipt_bytes: limits.receipt_bytes,
            asks: limits.asks,
            llm_bytes: limits.llm_bytes,
        },
    }
}

/// A command word cut to what a lineage keeps (on a char boundary): it is for display only.
fn truncate_word(w: &str) -> String {
    let mut end = w.len().min(warren_proto::lineage::MAX_WORD_BYTES);
    while !w.is_char_boundary(end) {
        end -= 1;
    }
    w[..end].to_owned()
}

/// A fresh 128-bit session id: 32 lowercase hex digits, from the kernel's CSPRNG.
pub fn new_session_id() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(hex::encode(bytes))
}

/// Makes a connection to one namespace's own view of nsd's `/ns` tree (its descendants only;
/// its `clone` narrows). nsd makes it, so the connection is the capability.
pub trait NsView: Send + Sync {
    fn connect(&self) -> io::Result<OwnedFd>;
}

impl ServedMounts {
    /// `spec`: the build spec; `tool_roots`: the handles its tool authorities name
    /// (`warren_ns::handles`); `bridge_binary`: the `warren-bridge` executable.
    pub fn new(
        dirs: Dirs,
        spec: &Spec,
        tool_roots: Vec<ToolRoot>,
        namespace: &str,
        bridge_binary: PathBuf,
    ) -> io::Result<ServedMounts> {
        Ok(ServedMounts {
            dirs,
            limits: spec.limits,
            tool_roots,
            networked: spec
                .tool_nets
                .iter()
                .filter(|t| spec.tool_proxy(&t.name).is_some())
                .map(|t| t.name.clone())
                .collect(),
            session: new_session_id()?,
            namespace: namespace.to_string(),
            bridge_binary,
            bridges: Mutex::new(Vec::new()),
            bridge_watch: Arc::default(),
            connections: Mutex::new(BTreeMap::new()),
            operator: false,
            file_server_uname: None,
            ns_view: None,
            command: Vec::new(),
            ancestors: Vec::new(),
            client_asks: false,
        })
    }

    /// Serve the mount at `CLIENT_ASKS_PATH` as the namespace's own asks on a capped channel
    /// (`warren mcp serve --elicit`; nsd adds that mount, [`client_asks_mount`]).
    pub fn client_asks(mut self, client_asks: bool) -> ServedMounts {
        self.client_asks = client_asks;
        self
    }

    /// The gate record of the client-asks channel: this namespace's own session only (never a
    /// clone's or another namespace's), `allow once` up to the write tier or `deny`, named
    /// `mcp-client:<namespace id>` in the receipts of what it answers.
    fn client_asks_record(&self) -> warren_proto::gate::ControlRecord {
        warren_proto::gate::ControlRecord {
            version: warren_proto::gate::RECORD_VERSION,
            kind: warren_proto::gate::RecordKind::Channel,
            name: Some(format!("mcp-client:{}", self.namespace)),
            sessions: vec![self.session.clone()],
            cap: Some(warren_proto::gate::CHANNEL_CAP_MAX),
            ..Default::default()
        }
    }

    /// Who this namespace is: the command it runs and the namespaces that cloned it (parent
    /// first, the subtree's root last; none for a namespace `warren run` started).
    pub fn lineage(mut self, command: Vec<String>, ancestors: Vec<Member>) -> ServedMounts {
        self.command = command;
        self.ancestors = ancestors;
        self
    }

    /// This namespace as a member of its clones' lineages.
    pub fn member(&self) -> Member {
        member(&self.session, &self.namespace, &self.command, &self.limits)
    }

    fn lineage_record(&self) -> Lineage {
        let mut chain = vec![self.member()];
        chain.extend(self.ancestors.iter().cloned());
        Lineage(chain)
    }

    /// Mounts the launcher connected itself (`unix!`, `tcp!`, and an operator namespace's
    /// local servers), by mount target path.
    pub fn with_connections(mut self, connections: Vec<(String, OwnedFd)>) -> ServedMounts {
        self.connections = Mutex::new(connections.into_iter().collect());
        self
    }

    /// An operator namespace: `mount gate|receipts|ns` use the launcher's connections to the
    /// daemons' operator sockets (the operator's own authority) instead of being refused.
    pub fn operator(mut self, operator: bool) -> ServedMounts {
        self.operator = operator;
        self
    }

    /// Attach to `unix!`/`tcp!` file servers as this user (the operator whose credentials made
    /// the connection; a server such as diod looks the name up).
    pub fn attach_as(mut self, uname: Option<String>) -> ServedMounts {
        self.file_server_uname = uname;
        self
    }

    /// Serve `mount ns` with this namespace's own view of `/ns`.
    pub fn ns_view(mut self, view: Arc<dyn NsView>) -> ServedMounts {
        self.ns_view = Some(view);
        self
    }

    fn ns_connection(&self, mount: &Mount) -> io::Result<OwnedFd> {
        match &self.ns_view {
            Some(view) => view.connect(),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("mount ns at {}: no view of /ns to serve", mount.path),
            )),
        }
    }

    fn launcher_connection(&self, mount: &Mount) -> io::Result<OwnedFd> {
        self.connections
            .lock()
            .map_err(|_| io::Error::other("connection list poisoned"))?
            .remove(&mount.path)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "mount of {} at {}: the launcher handed over no connection for it",
                        mount.server, mount.path
                    ),
                )
            })
    }

    /// The control record of this namespace's connection to the gate: it sees its descendants'
    /// asks only.
    fn gate_record(&self) -> warren_proto::gate::ControlRecord {
        warren_proto::gate::ControlRecord {
            version: warren_proto::gate::RECORD_VERSION,
            kind: warren_proto::gate::RecordKind::Namespace,
            session: Some(self.session.clone()),
            namespace: Some(self.namespace.clone()),
            lineage: Some(self.lineage_record()),
            ..Default::default()
        }
    }

    /// The namespace's session id, as every grant record carries it.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The grant for `mount tool PATH NAMES…`: each named tool with its own authority, and a
    /// new descriptor of each of its held root directories (nothing is opened by name here).
    fn tool_grant(&self, mount: &Mount) -> io::Result<(GrantRecord, Vec<OwnedFd>)> {
        let mut tools = Vec::new();
        let mut fds = Vec::new();
        for name in &mount.spec {
            let mut roots = Vec::new();
            for root in self.tool_roots.iter().filter(|r| &r.tool == name) {
                fds.push(root.dir.try_clone()?);
                roots.push(RootGrant {
                    path: root.path.clone(),
                    writable: root.access == Access::Write,
                });
            }
            tools.push(ToolGrant {
                name: name.clone(),
                roots,
                network: self.networked.contains(name),
            });
        }
        let worker = Role::Worker.uid();
        let record = GrantRecord {
            version: 1,
            session: self.session.clone(),
            namespace: self.namespace.clone(),
            tools,
            worker_uid: worker,
            worker_gid: worker,
            lineage: Some(self.lineage_record()),
            server: None,
        };
        Ok((record, fds))
    }

    /// The grant for `mount mcp:NAME PATH [TOOLS…]`: the server and the tool names as written
    /// (none: every tool the operator accepted). MCP tools hold no host roots: a server's own
    /// authority is its own namespace, built from the operator's definition of it.
    fn mcp_grant(&self, server: &str, mount: &Mount) -> GrantRecord {
        let worker = Role::Worker.uid();
        GrantRecord {
            version: 1,
            session: self.session.clone(),
            namespace: self.namespace.clone(),
            tools: mount
                .spec
                .iter()
                .map(|name| ToolGrant {
                    name: name.clone(),
                    roots: Vec::new(),
                    network: false,
                })
                .collect(),
            worker_uid: worker,
            worker_gid: worker,
            lineage: Some(self.lineage_record()),
            server: Some(server.to_owned()),
        }
    }

    fn spawn_bridge(
        &self,
        fuse: OwnedFd,
        conn: OwnedFd,
        mount: &Mount,
        presentation: Presentation,
        reconnect: Option<OwnedFd>,
    ) -> io::Result<()> {
        let bridge_uid = Role::Bridge.uid();
        let mut cmd = std::process::Command::new(&self.bridge_binary);
        cmd.arg("--fuse-fd")
            .arg(fuse.as_raw_fd().to_string())
            .arg("--9p-fd")
            .arg(conn.as_raw_fd().to_string())
            .arg("--runas")
            .arg(format!("{bridge_uid}:{bridge_uid}"))
            .stdin(std::process::Stdio::null());
        if presentation == Presentation::CallFiles {
            cmd.arg("--call-files");
        }
        if presentation == Presentation::FileServer {
            cmd.arg("--sized-files")
                .arg("--aname")
                .arg(mount.spec.join(" "));
            if let Some(uname) = &self.file_server_uname {
                cmd.arg("--uname").arg(uname);
            }
        }
        if let Some(r) = &reconnect {
            cmd.arg("--reconnect-fd").arg(r.as_raw_fd().to_string());
            // A peer's /tool: the bridge reports each call, and nsd receipts it here.
            if presentation == Presentation::CallFiles && mount.key.is_some() {
                cmd.arg("--report-calls");
            }
        }
        let mut keep = vec![fuse.as_raw_fd(), conn.as_raw_fd()];
        keep.extend(reconnect.as_ref().map(|r| r.as_raw_fd()));
        warren_jail::child::BeforeExec::new()
            .keep_fds(keep)
            .install(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("start {}: {e}", self.bridge_binary.display()),
            )
        })?;
        let bridge = Bridge::watch(child, &mount.path, self.bridge_watch.clone())?;
        self.bridges
            .lock()
            .map_err(|_| io::Error::other("bridge list poisoned"))?
            .push(bridge);
        Ok(())
    }

    /// `mount -k PEER tcp!HOST!PORT PATH [TREE]`: on the connection the launcher made, the
    /// handshake as this host's key, the server's key checked against PEER's entry in the peers
    /// file, and TREE (default `tool`) asked for; the bridge gets the decrypted 9P stream on a
    /// socketpair whose other end a relay thread here encrypts (docs/distribution.md). When
    /// the link drops, nsd dials the same address again itself ([`Import::dial`]).
    fn import(&self, mount: &Mount) -> io::Result<(OwnedFd, Import)> {
        let tcp = std::net::TcpStream::from(self.launcher_connection(mount)?);
        let import = Import {
            peer: mount.key.clone().unwrap_or_default(),
            tree: mount
                .spec
                .first()
                .map_or_else(|| "tool".to_owned(), String::clone),
            label: format!(
                "mount -k {} {} at {}",
                mount.key.as_deref().unwrap_or_default(),
                mount.server,
                mount.path
            ),
            // The address the operator's own connection reached: re-dials go there, never to a
            // name resolved again as root.
            addr: tcp.peer_addr()?,
            secrets: self.dirs.secrets.clone(),
            session: self.session.clone(),
            key: Mutex::new(String::new()),
        };
        let conn = import.link(tcp)?;
        tracing::info!(peer = %import.peer, tree = %import.tree, path = %mount.path, "imported a peer's tree");
        Ok((conn, import))
    }

    /// Calls `on_death` (once, on a thread of its own) when a bridge of this namespace dies
    /// while the namespace runs — killed, or failed — with why; at once if one already has.
    /// A bridge that ends because its mount went away (the namespace ended) is no death.
    pub fn on_bridge_death(&self, on_death: impl FnOnce(String) + Send + 'static) {
        self.bridge_watch.set_hook(Box::new(on_death));
    }

    /// Why a bridge of this namespace died while it ran, if one did.
    pub fn bridge_death(&self) -> Option<String> {
        self.bridge_watch.died()
    }
}

/// A bridge process, reaped by a thread of its own that reports an unexpected death.
struct Bridge {
    /// Never a recycled pid: the watcher reaps the process, so a plain kill could hit another.
    pidfd: OwnedFd,
    watcher: Option<std::thread::JoinHandle<()>>,
}

impl Bridge {
    fn watch(
        mut child: std::process::Child,
        path: &str,
        watch: Arc<BridgeWatch>,
    ) -> io::Result<Bridge> {
        let pidfd = match warren_jail::process::pidfd_open(child.id() as i32) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let path = path.to_owned();
        let watcher = std::thread::Builder::new()
            .name("bridge-watch".into())
            .spawn(move || {
                let status = child.wait();
                if watch.ending.load(Ordering::SeqCst) {
                    return;
                }
                let why = match status {
                    Ok(s) if s.success() => return,
                    Ok(s) => format!("the bridge serving {path} died ({s})"),
                    Err(e) => format!("the bridge serving {path} could not be waited for: {e}"),
                };
                watch.report(why);
            })?;
        Ok(Bridge {
            pidfd,
            watcher: Some(watcher),
        })
    }
}

type DeathHook = Box<dyn FnOnce(String) + Send>;

/// The deaths of one namespace's bridges: a dead bridge's mount answers ENOTCONN for good (the
/// kernel aborted its FUSE connection, and requests it had read are lost), so nsd ends the
/// namespace and says why rather than leave it running half served (docs/decisions.md D16, "A
/// bridge that dies ends its namespace").
#[derive(Default)]
struct BridgeWatch {
    /// Set while the namespace is torn down: bridges ending then are expected.
    ending: AtomicBool,
    state: Mutex<WatchState>,
}

#[derive(Default)]
struct WatchState {
    died: Option<String>,
    hook: Option<DeathHook>,
}

impl BridgeWatch {
    fn report(&self, why: String) {
        tracing::warn!("{why}");
        let hook = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.died.is_some() {
                return;
            }
            state.died = Some(why.clone());
            state.hook.take()
        };
        if let Some(hook) = hook {
            hook(why);
        }
    }

    fn set_hook(&self, hook: DeathHook) {
        let died = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match &state.died {
                Some(why) => why.clone(),
                None => {
                    state.hook = Some(hook);
                    return;
                }
            }
        };
        hook(died);
    }

    fn died(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .died
            .clone()
    }
}

impl ServedMounts {
    /// Serves a mount whose connection nsd makes: makes it now, and again whenever the bridge
    /// finds the server gone (a daemon restarted) and asks on its reconnect socket.
    fn spawn_remade(&self, fuse: OwnedFd, mount: &Mount, remake: Remake) -> io::Result<()> {
        let conn = remake.connect(&self.dirs)?;
        self.spawn_reconnectable(fuse, conn, mount, remake)
    }

    /// Serves a mount on `conn`, and on a new connection from `remake` whenever the bridge
    /// finds the old one gone and asks on its reconnect socket.
    fn spawn_reconnectable(
        &self,
        fuse: OwnedFd,
        conn: OwnedFd,
        mount: &Mount,
        remake: Remake,
    ) -> io::Result<()> {
        let (ours, bridges) = UnixStream::pair()?;
        let presentation = match &remake {
            Remake::Tool { .. } | Remake::Mcp { .. } => Presentation::CallFiles,
            // A peer's `tool` is a /tool tree; any other tree is a directory of files.
            Remake::Import(import) if import.tree == "tool" => Presentation::CallFiles,
            Remake::Import(_) => Presentation::FileServer,
            Remake::Gate { .. } | Remake::Llm { .. } => Presentation::Synthetic,
        };
        self.spawn_bridge(
            fuse,
            conn,
            mount,
            presentation,
            Some(OwnedFd::from(bridges)),
        )?;
        serve_reconnects(ours, self.dirs.clone(), remake);
        Ok(())
    }
}

/// What nsd needs to make a mount's connection again: the same grant, to the same daemon.
enum Remake {
    Tool {
        record: GrantRecord,
        roots: Vec<OwnedFd>,
    },
    Gate {
        record: warren_proto::gate::ControlRecord,
    },
    Mcp {
        record: GrantRecord,
    },
    Llm {
        grant: warren_proto::llm::LlmGrant,
    },
    /// A peer's tree: dialled again, with a new handshake.
    Import(Import),
}

impl Remake {
    /// A fresh connection: one end handed with the grant to the daemon's control socket, the
    /// other returned for the bridge.
    fn connect(&self, dirs: &Dirs) -> io::Result<OwnedFd> {
        let (ours, theirs) = UnixStream::pair()?;
        match self {
            Remake::Tool { record, roots } => return tool_connection(dirs, record, roots),
            Remake::Import(import) => return import.dial(),
            Remake::Mcp { record } => {
                warren_proto::toolfs::hand_over(&dirs.control("mcpfs"), record, theirs.as_fd(), &[])
                    .map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!(
                                "hand the mcp:{} connection to mcpfs: {e}",
                                record.server.as_deref().unwrap_or_default()
                            ),
                        )
                    })?
            }
            Remake::Llm { grant } => warren_proto::llm::hand_over(
                &dirs.control(warren_proto::llm::CONTROL_NAME),
                grant,
                theirs.as_fd(),
            )
            .map_err(|e| {
                io::Error::new(e.kind(), format!("hand the /llm connection to llmfs: {e}"))
            })?,
            Remake::Gate { record } => {
                warren_proto::gate::hand_over(&dirs.control("gate"), record, &theirs).map_err(
                    |e| {
                        io::Error::new(
                            e.kind(),
                            format!("hand the /gate connection to the gate: {e}"),
                        )
                    },
                )?
            }
        }
        Ok(OwnedFd::from(ours))
    }
}

/// Refuses plain 9P (a `tcp!` mount without `-k`) to an address that is not this host's
/// loopback unless the spec line says `--insecure-plain`: on the network such a link is
/// neither authenticated nor encrypted (docs/decisions.md D30, "Plain 9P off this host is
/// refused unless the spec says --insecure-plain"). The address checked is the one the
/// launcher's connection reached, not a name.
fn refuse_plain_off_host(conn: &OwnedFd, mount: &Mount) -> io::Result<()> {
    let tcp = std::net::TcpStream::from(conn.try_clone()?);
    let peer = tcp.peer_addr()?;
    if peer.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "mount {} at {}: plain 9P to {peer}, off this host, is neither authenticated nor \
             encrypted; mount a warren peer with `mount -k PEER`, or write `mount \
             --insecure-plain {} {}` to accept that",
            mount.server, mount.path, mount.server, mount.path
        ),
    ))
}

/// A keyed mount's link, as nsd makes it again after it dropped.
struct Import {
    peer: String,
    tree: String,
    /// `mount -k PEER tcp!HOST!PORT at PATH`, for messages.
    label: String,
    addr: std::net::SocketAddr,
    secrets: PathBuf,
    /// The namespace's session: where its calls to the peer are receipted.
    session: String,
    /// The fingerprint of the key the current link's server proved.
    key: Mutex<String>,
}

/// How long a re-dial waits for the peer's TCP connect (the handshake has its own limit).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

impl Import {
    /// On `tcp`: the handshake as this host's key, the server's key checked against the peer's
    /// entry in the peers file as it is now, the tree asked for; then a relay thread that
    /// encrypts what the returned end (the bridge's) carries.
    fn link(&self, tcp: std::net::TcpStream) -> io::Result<OwnedFd> {
        use warren_proto::export::{keys, peers, wire};
        let refused = |kind: io::ErrorKind, why: String| {
            io::Error::new(kind, format!("{}: {why}", self.label))
        };
        let peers_path = peers::peers_path();
        let peers = peers::Peers::load(&peers_path)
            .map_err(|e| refused(io::ErrorKind::PermissionDenied, e.to_string()))?;
        let peer = peers.by_name(&self.peer).ok_or_else(|| {
            refused(
                io::ErrorKind::NotFound,
                format!("no peer {} in {}", self.peer, peers_path.display()),
            )
        })?;
        let key = keys::HostKey::load(&keys::host_key_path(&self.secrets))
            .map_err(|e| refused(e.kind(), e.to_string()))?;
        let link = wire::dial(tcp, &key, peer, &self.tree).map_err(|e| {
            let kind = match e {
                wire::DialError::Io(ref io) => io.kind(),
                _ => io::ErrorKind::PermissionDenied,
            };
            refused(kind, e.to_string())
        })?;
        *self.key.lock().unwrap_or_else(|p| p.into_inner()) = peer.key.fingerprint();
        let (ours, bridges) = UnixStream::pair()?;
        let label = self.label.clone();
        std::thread::Builder::new()
            .name("import-relay".into())
            .spawn(move || {
                if let Err(e) = link.relay(ours) {
                    tracing::warn!("the link of {label} ended: {e}");
                }
            })?;
        Ok(OwnedFd::from(bridges))
    }

    /// A new TCP connection to the address the launcher's reached, and a new link on it. nsd
    /// dials it (docs/decisions.md D26, "nsd re-dials a dropped peer link").
    fn dial(&self) -> io::Result<OwnedFd> {
        let tcp = std::net::TcpStream::connect_timeout(&self.addr, DIAL_TIMEOUT).map_err(|e| {
            io::Error::new(e.kind(), format!("{}: dial {}: {e}", self.label, self.addr))
        })?;
        let conn = self.link(tcp)?;
        tracing::info!(peer = %self.peer, tree = %self.tree, "a peer's link was dialled again");
        Ok(conn)
    }
}

/// The most of a peer's receipt reference a `remote` receipt copies (it is the peer's claim).
const MAX_REMOTE_REF: usize = 1024;

impl Import {
    /// The `remote` receipt of one call the bridge reported (`called TOOL ARGS_SHA256 ARGS_LEN
    /// RESULT_LEN`, a newline, the result's first bytes): the tool, the arguments' digest, the
    /// peer and its key, and the receipt the peer's envelope names (its decision: scope, seq,
    /// hash). The bridge's words are checked, never trusted to be well formed.
    fn remote_receipt(&self, report: &[u8]) -> Result<serde_json::Value, String> {
        let (head, result) = match report.iter().position(|&b| b == b'\n') {
            Some(i) => (&report[..i], &report[i + 1..]),
            None => return Err("a call report without its header line".into()),
        };
        let head = std::str::from_utf8(head).map_err(|_| "a call report that is not UTF-8")?;
        let [tool, args, args_len, result_len] = head.split(' ').collect::<Vec<_>>()[..] else {
            return Err(
                "a call report's header is not TOOL ARGS_SHA256 ARGS_LEN RESULT_LEN".into(),
            );
        };
        let hex64 = |s: &str| {
            s.len() == 64
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let (Ok(args_len), Ok(result_len)) = (args_len.parse::<u64>(), result_len.parse::<u64>())
        else {
            return Err("a call report's lengths are not numbers".into());
        };
        if !warren_ns::spec::is_tool_name(tool) || !hex64(args) || result.len() as u64 > result_len
        {
            return Err("a call report with a bad tool name, digest or length".into());
        }
        let mut subject = serde_json::json!({
            "peer": self.peer,
            "key": *self.key.lock().unwrap_or_else(|p| p.into_inner()),
            "tool": tool,
            "args_bytes": args_len,
            "result_bytes": result_len,
        });
        let mut digests = serde_json::json!({"args": format!("sha256:{args}")});
        if result.len() as u64 == result_len {
            let d = <sha2::Sha256 as sha2::Digest>::digest(result);
            digests["result"] = serde_json::json!(format!("sha256:{}", hex::encode(d)));
        }
        // The peer's envelope: its status and the receipt it names, as the peer wrote them.
        if let Ok(envelope) = serde_json::from_slice::<serde_json::Value>(result) {
            if let Some(status) = envelope.get("status").and_then(|s| s.as_str())
                && status.len() <= 64
            {
                subject["status"] = serde_json::json!(status);
            }
            if let Some(r) = envelope.get("receipt").filter(|r| r.is_object())
                && r.to_string().len() <= MAX_REMOTE_REF
            {
                subject["remote"] = r.clone();
            }
        }
        Ok(serde_json::json!({
            "scope": self.session,
            "kind": "remote",
            "subject": subject,
            "digests": digests,
        }))
    }
}

/// How long nsd waits for receiptd to take a `remote` receipt.
const REMOTE_APPEND_PATIENCE: Duration = Duration::from_secs(10);

/// nsd's connection to receiptd for `remote` receipts, made on first use on the thread that
/// serves one mount's reconnect socket (and made again after it failed).
#[derive(Default)]
struct RemoteReceipts {
    rt: Option<tokio::runtime::Runtime>,
    appender: Option<warren_proto::receipts::Appender>,
}

impl RemoteReceipts {
    fn append(&mut self, dirs: &Dirs, request: &serde_json::Value) -> Result<(), String> {
        let rt = match &mut self.rt {
            Some(rt) => rt,
            None => self.rt.insert(
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?,
            ),
        };
        let bytes = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        let appender = &mut self.appender;
        rt.block_on(async {
            let a = match appender {
                Some(a) => a,
                None => appender.insert(
                    tokio::time::timeout(
                        REMOTE_APPEND_PATIENCE,
                        warren_proto::receipts::Appender::connect(&dirs.socket("receipts")),
                    )
                    .await
                    .map_err(|_| "receiptd did not answer the connection".to_owned())?
                    .map_err(|e| format!("receiptd: {e}"))?,
                ),
            };
            // Bounded: the reader's read waits for this answer.
            match tokio::time::timeout(REMOTE_APPEND_PATIENCE, a.append(&bytes)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => {
                    *appender = None;
                    Err(e.to_string())
                }
                Err(_) => {
                    *appender = None;
                    Err(format!(
                        "receiptd did not answer within {REMOTE_APPEND_PATIENCE:?}"
                    ))
                }
            }
        })
    }
}

/// The first wait after a failed re-dial of a peer's link; each failure doubles it, up to
/// [`REDIAL_MAX`].
const REDIAL_FIRST: Duration = Duration::from_secs(1);
const REDIAL_MAX: Duration = Duration::from_secs(30);

/// Spaces a dropped link's re-dials: while the wait after a failure runs, a request is
/// refused at once (the bridge answers EIO) instead of dialling, or waiting, again.
#[derive(Default)]
struct Backoff {
    wait: Duration,
    not_before: Option<Instant>,
    last_error: String,
}

impl Backoff {
    fn attempt(&mut self, dial: impl FnOnce() -> io::Result<OwnedFd>) -> io::Result<OwnedFd> {
        let now = Instant::now();
        if let Some(t) = self.not_before
            && now < t
        {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "the link is down ({}); the next dial is in {} s",
                    self.last_error,
                    (t - now).as_secs() + 1
                ),
            ));
        }
        dial()
            .inspect(|_| *self = Backoff::default())
            .inspect_err(|e| {
                self.wait = (self.wait * 2).clamp(REDIAL_FIRST, REDIAL_MAX);
                self.not_before = Some(Instant::now() + self.wait);
                self.last_error = e.to_string();
            })
    }
}

/// A `/tool` connection for `record`: one end handed to toolfs's control socket with the
/// record and `roots`, the other returned (a namespace's bridge, or a peer's link).
pub fn tool_connection(
    dirs: &Dirs,
    record: &GrantRecord,
    roots: &[OwnedFd],
) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let root_fds: Vec<BorrowedFd<'_>> = roots.iter().map(|f| f.as_fd()).collect();
    warren_proto::toolfs::hand_over(&dirs.control("toolfs"), record, theirs.as_fd(), &root_fds)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("hand the /tool connection to toolfs: {e}"),
            )
        })?;
    Ok(OwnedFd::from(ours))
}

/// How long a reconnect waits for a restarting daemon's control socket to take the grant.
const RECONNECT_PATIENCE: Duration = Duration::from_secs(10);
/// At most one reconnect a second per mount, so a bridge cannot make nsd hand out connections
/// in a loop (each is the same grant, so this bounds work, not authority).
const RECONNECT_SPACING: Duration = Duration::from_secs(1);

/// Answers the bridge's reconnect requests (`reconnect` → `ok` with the new connection's fd, or
/// `error: <why>`) until the bridge closes its end, i.e. until the mount is gone.
fn serve_reconnects(sock: UnixStream, dirs: Dirs, remake: Remake) {
    std::thread::spawn(move || {
        let mut last: Option<Instant> = None;
        let mut redial = Backoff::default();
        let mut receipts = RemoteReceipts::default();
        while let Ok((request, _)) = warren_daemon::handoff::recv(&sock) {
            if let (Some(report), Remake::Import(import)) =
                (request.strip_prefix(b"called "), &remake)
            {
                let recorded = import
                    .remote_receipt(report)
                    .and_then(|r| receipts.append(&dirs, &r));
                let answer = match recorded {
                    Ok(()) => "ok".to_owned(),
                    Err(e) => {
                        tracing::warn!(peer = %import.peer, "a call to the peer not receipted: {e}");
                        format!("error: {e}")
                    }
                };
                if warren_daemon::handoff::send(&sock, answer.as_bytes(), &[]).is_err() {
                    return;
                }
                continue;
            }
            if request != b"reconnect" {
                let _ = warren_daemon::handoff::send(&sock, b"error: unknown request", &[]);
                continue;
            }
            let made = if let Remake::Import(import) = &remake {
                // A peer may be down for long: one dial, then refusals until the next is due.
                redial.attempt(|| import.dial())
            } else {
                if let Some(wait) = last.and_then(|t| RECONNECT_SPACING.checked_sub(t.elapsed())) {
                    std::thread::sleep(wait);
                }
                last = Some(Instant::now());
                let deadline = Instant::now() + RECONNECT_PATIENCE;
                loop {
                    match remake.connect(&dirs) {
                        Ok(fd) => break Ok(fd),
                        Err(e) if Instant::now() < deadline => {
                            tracing::debug!(error = %e, "reconnect: the daemon is not back yet");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        Err(e) => break Err(e),
                    }
                }
            };
            let sent = match made {
                Ok(fd) => {
                    tracing::info!("reconnect: a mount's connection was made again");
                    warren_daemon::handoff::send(&sock, b"ok", &[fd.as_fd()])
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconnect failed");
                    warren_daemon::handoff::send(&sock, format!("error: {e}").as_bytes(), &[])
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
}

impl MountServer for ServedMounts {
    fn serve(&self, mount: &Mount, fuse: OwnedFd) -> io::Result<()> {
        match &mount.server {
            Server::Local(LocalServer::Tool) => {
                let (record, roots) = self.tool_grant(mount)?;
                self.spawn_remade(fuse, mount, Remake::Tool { record, roots })
            }
            Server::Mcp(server) => {
                let record = self.mcp_grant(server, mount);
                self.spawn_remade(fuse, mount, Remake::Mcp { record })
            }
            Server::Local(LocalServer::Llm) if mount.key.is_none() => {
                let grant = warren_proto::llm::LlmGrant {
                    version: 1,
                    session: self.session.clone(),
                    namespace: self.namespace.clone(),
                    lineage: Some(self.lineage_record()),
                };
                self.spawn_remade(fuse, mount, Remake::Llm { grant })
            }
            Server::Tcp { .. } if mount.key.is_some() => {
                let (conn, import) = self.import(mount)?;
                self.spawn_reconnectable(fuse, conn, mount, Remake::Import(import))
            }
            _ if mount.key.is_some() => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "mount -k of {} at {}: a peer is reached over tcp!HOST!PORT",
                    mount.server, mount.path
                ),
            )),
            Server::Unix(_) | Server::Tcp { .. } => {
                let conn = self.launcher_connection(mount)?;
                if matches!(mount.server, Server::Tcp { .. }) && !mount.insecure_plain {
                    refuse_plain_off_host(&conn, mount)?;
                }
                self.spawn_bridge(fuse, conn, mount, Presentation::FileServer, None)
            }
            Server::Local(LocalServer::Gate)
                if self.client_asks && mount.path == CLIENT_ASKS_PATH =>
            {
                let record = self.client_asks_record();
                self.spawn_remade(fuse, mount, Remake::Gate { record })
            }
            Server::Local(_) if self.operator => {
                let conn = self.launcher_connection(mount)?;
                self.spawn_bridge(fuse, conn, mount, Presentation::Synthetic, None)
            }
            Server::Local(LocalServer::Ns) if self.ns_view.is_some() => {
                let conn = self.ns_connection(mount)?;
                self.spawn_bridge(fuse, conn, mount, Presentation::Synthetic, None)
            }
            Server::Local(LocalServer::Gate) => {
                let record = self.gate_record();
                self.spawn_remade(fuse, mount, Remake::Gate { record })
            }
            Server::Local(other) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "mount {} at {}: only an operator namespace may mount it (no per-namespace \
                     view of {} exists yet)",
                    other.name(),
                    mount.path,
                    other.name()
                ),
            )),
        }
    }
}

impl Drop for ServedMounts {
    fn drop(&mut self) {
        // A bridge ends by itself when its mount goes away; end it if it has not yet (or the
        // namespace never came up), and have its watcher reap it.
        self.bridge_watch.ending.store(true, Ordering::SeqCst);
        if let Ok(mut bridges) = self.bridges.lock() {
            for bridge in bridges.iter_mut() {
                let _ = warren_jail::process::pidfd_signal(bridge.pidfd.as_fd(), libc::SIGKILL);
                if let Some(watcher) = bridge.watcher.take() {
                    let _ = watcher.join();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace's lineage carries every subtree budget its spec sets, llmfs's memory budget
    /// among them: what the daemons charge a subtree to is what its spec says.
    #[test]
    fn a_member_carries_every_budget_its_spec_sets() {
        let spec = warren_ns::spec::parse(
            "x",
            "limit receipts=500 receipt-bytes=64M asks=8 llm-bytes=16M",
        )
        .unwrap();
        let m = member(&"a".repeat(32), "3", &[], &spec.limits);
        assert_eq!(
            m.budget,
            Budget {
                receipts: Some(500),
                receipt_bytes: Some(64 << 20),
                asks: Some(8),
                llm_bytes: Some(16 << 20),
            }
        );
    }

    /// After a failed re-dial the next request is refused without dialling until the wait is
    /// over; each failure doubles the wait up to the cap, and a success starts it over.
    #[test]
    fn a_failed_redial_is_spaced_by_a_doubling_wait() {
        let mut b = Backoff::default();
        let down = || Err(io::Error::from(io::ErrorKind::NetworkUnreachable));
        assert!(b.attempt(down).is_err());
        assert_eq!(b.wait, REDIAL_FIRST);
        let e = b.attempt(|| panic!("dialled during the wait")).unwrap_err();
        assert!(e.to_string().contains("the link is down"), "{e}");
        for want in [2, 4, 8, 16, 30, 30] {
            b.not_before = Some(Instant::now());
            assert!(b.attempt(down).is_err());
            assert_eq!(b.wait, Duration::from_secs(want));
        }
        b.not_before = Some(Instant::now());
        let (ours, _theirs) = UnixStream::pair().unwrap();
        assert!(b.attempt(|| Ok(OwnedFd::from(ours))).is_ok());
        assert_eq!((b.wait, b.not_before), (Duration::ZERO, None));
    }

    /// The client-asks channel (`warren mcp serve --elicit`) sees its own namespace's session
    /// and nothing else, answers `allow once` up to the write tier only, and is named
    /// `mcp-client:<id>` (what receipts show as who answered).
    #[test]
    fn the_client_asks_channel_is_the_namespaces_own_session_capped_at_write() {
        use warren_gate::scope::Scope;
        let dirs = Dirs {
            runtime: "/nonexistent/run".into(),
            data: "/nonexistent/data".into(),
            secrets: "/nonexistent/secrets".into(),
        };
        let served = ServedMounts::new(dirs, &Spec::default(), Vec::new(), "7", "/x".into())
            .unwrap()
            .client_asks(true);
        let scope = warren_gate::control::scope_of(&served.client_asks_record()).unwrap();
        assert!(matches!(scope, Scope::Channel { .. }), "{scope:?}");
        assert!(scope.sees_session(served.session()));
        assert!(
            !scope.sees_session(&"1".repeat(32)),
            "another session's asks"
        );
        assert_eq!(scope.label(), "mcp-client:7");
        assert!(
            scope.may_allow("read", "default:read").is_ok()
                && scope.may_allow("write", "default:write").is_ok()
        );
        for above in ["exec", "network", "destructive", "dynamic", "unmapped"] {
            assert!(scope.may_allow(above, "default:exec").is_err(), "{above}");
        }
        assert!(!scope.may_decide());
        assert_eq!(client_asks_mount().path, CLIENT_ASKS_PATH);
        // Where no spec line may land: a spec cannot mount or bind anything there.
        for line in [
            format!("mount gate {CLIENT_ASKS_PATH}\n"),
            format!("bind -r /usr {CLIENT_ASKS_PATH}\n"),
        ] {
            let refused = warren_ns::spec::parse("t", &line).unwrap_err();
            assert!(refused.message.contains("reserved"), "{refused}");
        }
    }
}
