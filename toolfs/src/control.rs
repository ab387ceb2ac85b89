//! The two ways into toolfs: the operator socket (every tool, no host authority) and the control
//! socket, on which a trusted peer hands over a connection with its grant.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, Weak};

use tokio::net::UnixListener;
use warren_9p::Limits;
use warren_daemon::accept::{next_blocking_peer, refusal, root_only};
use warren_daemon::operator::{self, OperatorPolicy};
use warren_daemon::peer::PeerCred;

use crate::catalog::Catalog;
use crate::grant::{ConnGrant, GrantRecord, write_reply};
use crate::services::Services;
use crate::tree::{ResourceFiles, ToolTree, TreeLimits};

/// Where the tools of a handed-over grant come from.
pub trait CatalogSource: Send + Sync {
    /// The catalog `record`'s tool names are checked against and served from. It may rewrite
    /// the record's tool list to what will be served (mcpfs: no names means every accepted
    /// tool); it runs on a blocking thread, so it may wait (`runtime.block_on`) for a server.
    fn for_grant(
        &self,
        record: &mut GrantRecord,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Arc<Catalog>, String>;

    /// Read-only files the grant's tree serves under `resources/` (none by default), for the
    /// record as nsd wrote it; called before [`CatalogSource::for_grant`].
    fn resources_for(
        &self,
        _record: &GrantRecord,
        _runtime: &tokio::runtime::Handle,
    ) -> Option<Arc<dyn ResourceFiles>> {
        None
    }
}

/// toolfs's own tools: a record naming an MCP server is not for it.
pub struct Builtin(pub Arc<Catalog>);

impl CatalogSource for Builtin {
    fn for_grant(
        &self,
        record: &mut GrantRecord,
        _runtime: &tokio::runtime::Handle,
    ) -> Result<Arc<Catalog>, String> {
        match &record.server {
            Some(server) => Err(format!(
                "the grant names MCP server {server}: mcpfs serves it, not toolfs"
            )),
            None => Ok(self.0.clone()),
        }
    }
}

/// What every connection's tree is built with.
pub struct Server {
    /// What the operator socket serves (toolfs's own tools).
    pub catalog: Arc<Catalog>,
    /// What a handed-over grant is served from.
    pub source: Arc<dyn CatalogSource>,
    pub tree_limits: TreeLimits,
    pub p9_limits: Limits,
    pub services: Arc<Services>,
    /// Open-call counters of the sessions that have live connections: a session's connections
    /// share one cap, so a namespace cannot multiply it by opening more connections.
    pub session_calls: Mutex<HashMap<String, Weak<AtomicUsize>>>,
}

impl Server {
    pub fn new(
        catalog: Catalog,
        tree_limits: TreeLimits,
        p9_limits: Limits,
        services: Services,
    ) -> Server {
        let catalog = Arc::new(catalog);
        Server::with_source(
            catalog.clone(),
            Arc::new(Builtin(catalog)),
            tree_limits,
            p9_limits,
            services,
        )
    }

    /// A server whose granted connections are served from `source` (mcpfs).
    pub fn with_source(
        catalog: Arc<Catalog>,
        source: Arc<dyn CatalogSource>,
        tree_limits: TreeLimits,
        p9_limits: Limits,
        services: Services,
    ) -> Server {
        Server {
            catalog,
            source,
            tree_limits,
            p9_limits,
            services: Arc::new(services),
            session_calls: Mutex::new(HashMap::new()),
        }
    }

    fn tree(&self, grant: ConnGrant, resources: Option<Arc<dyn ResourceFiles>>) -> Arc<ToolTree> {
        let open_calls = self.session_counter(&grant.session);
        let tree = ToolTree::new(
            grant,
            self.tree_limits.clone(),
            open_calls,
            self.services.clone(),
        );
        Arc::new(match resources {
            Some(files) => tree.with_resources(files),
            None => tree,
        })
    }

    fn session_counter(&self, session: &str) -> Arc<AtomicUsize> {
        let mut sessions = self.session_calls.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, counter| counter.strong_count() > 0);
        if let Some(counter) = sessions.get(session).and_then(Weak::upgrade) {
            return counter;
        }
        let counter = Arc::new(AtomicUsize::new(0));
        sessions.insert(session.to_owned(), Arc::downgrade(&counter));
        counter
    }

    /// Writes the receipts still queued before the daemon goes (for a bounded time), and says at
    /// error level how many could not be.
    pub async fn drain_receipts(&self) {
        let unwritten = self
            .services
            .receipts
            .drain(std::time::Duration::from_secs(5))
            .await;
        if unwritten > 0 {
            tracing::error!(unwritten, "stopping with receipts not written");
        }
    }

    /// Serves the operator socket forever.
    pub async fn serve_operator(self: Arc<Self>, listener: UnixListener) {
        let server = self.clone();
        let make = move |peer: PeerCred| {
            Some(server.tree(ConnGrant::operator(&server.catalog, peer.uid), None))
        };
        operator::accept_loop(
            listener,
            OperatorPolicy::from_host(),
            make,
            self.p9_limits.clone(),
        )
        .await;
    }

    /// Serves the control socket forever: root peers in our pid namespace only; each control
    /// connection is handled on a blocking thread of its own (one grant after another, each
    /// answered with one line).
    pub async fn serve_control(self: Arc<Self>, listener: UnixListener) {
        loop {
            let std_sock = next_blocking_peer(&listener, "control socket", |s| {
                refusal(s.as_fd(), root_only)
            })
            .await;
            let server = self.clone();
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || server.control_connection(std_sock, runtime));
        }
    }

    fn control_connection(&self, sock: UnixStream, runtime: tokio::runtime::Handle) {
        loop {
            let (record, fds) = match warren_daemon::handoff::recv(&sock) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return,
                Err(e) => {
                    tracing::warn!("control connection: {e}; closing it");
                    return;
                }
            };
            let result = self.accept_grant(&record, fds, &runtime);
            if let Err(msg) = &result {
                tracing::warn!("grant refused: {msg}");
            }
            if let Err(e) = write_reply(&sock, &result) {
                tracing::warn!("control connection: cannot answer: {e}");
                return;
            }
        }
    }

    /// Checks one handed-over grant and, if it is sound, serves its connection.
    fn accept_grant(
        &self,
        record: &[u8],
        fds: Vec<OwnedFd>,
        runtime: &tokio::runtime::Handle,
    ) -> Result<(), String> {
        let mut fds = fds.into_iter();
        let conn = fds.next().ok_or("no connection fd came with the grant")?;
        let mut record: GrantRecord =
            serde_json::from_slice(record).map_err(|e| format!("bad grant record: {e}"))?;
        let st = nix::sys::stat::fstat(&conn).map_err(|e| format!("connection fd: {e}"))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err("the first fd is not a socket".into());
        }
        // Asked of the record as nsd wrote it (before `for_grant` may fill in its tool list).
        let resources = self.source.resources_for(&record, runtime);
        let catalog = self.source.for_grant(&mut record, runtime)?;
        let grant = ConnGrant::from_record(&record, fds.collect(), &catalog)?;
        let tree = self.tree(grant, resources);
        let stream = UnixStream::from(conn);
        stream.set_nonblocking(true).map_err(|e| e.to_string())?;
        let limits = self.p9_limits.clone();
        let session = record.session.clone();
        runtime.spawn(async move {
            let result = match tokio::net::UnixStream::from_std(stream) {
                Ok(stream) => warren_9p::serve(tree, stream, limits).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => tracing::info!(session, "granted connection closed"),
                Err(e) => tracing::info!(session, "granted connection ended: {e}"),
            }
        });
        Ok(())
    }
}
