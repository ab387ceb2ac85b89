//! The MCP servers mcpfs serves, each started on first use by nsd in the namespace its
//! definition names, and each granted connection's catalog: the server's tools the operator
//! accepted, called through the session, behind toolfs's call files (the same parse, gate,
//! receipts and envelope as a built-in tool's: `warren_toolfs::call`).
//!
//! Why one file: the servers' lifetimes (start on first use, restarts, stderr) and the catalog a
//! connection sees of them share one `Served` per server; split, each half would reach into the
//! other's state.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use warren_toolfs::catalog::{Catalog, ExternalTool, Runner, ToolDef};
use warren_toolfs::control::CatalogSource;
use warren_toolfs::envelope::{Envelope, Status, Taint};
use warren_toolfs::grant::GrantRecord;
use warren_toolfs::tree::ResourceFiles;

use crate::config::{ServerConfig, Transport, pins_path, valid_name};
use crate::{Definition, Outcome, Pins, Session, SessionError};

/// How long a server has to start, answer the handshake and list its tools: within the time
/// nsd waits for mcpfs to take a grant (`warren_daemon::handoff::REPLY_TIMEOUT`), so that a
/// server too slow to start is reported as such, not as a refused handoff.
const START_DEADLINE: Duration =
    warren_daemon::handoff::REPLY_TIMEOUT.saturating_sub(Duration::from_secs(2));
/// The longest wait between two starts of a server that keeps dying.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Every server by name, and where they come from.
pub struct Servers {
    config_dir: PathBuf,
    /// nsd's MCP server socket.
    nsd: PathBuf,
    served: Mutex<HashMap<String, Arc<Served>>>,
}

impl Servers {
    pub fn new(config_dir: PathBuf, nsd: PathBuf) -> Servers {
        Servers {
            config_dir,
            nsd,
            served: Mutex::new(HashMap::new()),
        }
    }

    fn served(&self, name: &str) -> Arc<Served> {
        self.served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(Served {
                    name: name.to_owned(),
                    config_dir: self.config_dir.clone(),
                    nsd: self.nsd.clone(),
                    pins: pins_path(&self.config_dir, name),
                    live: tokio::sync::Mutex::new(None),
                    restarts: Mutex::new(Restarts::default()),
                })
            })
            .clone()
    }
}

impl CatalogSource for Servers {
    fn for_grant(
        &self,
        record: &mut GrantRecord,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Arc<Catalog>, String> {
        let Some(name) = record.server.clone() else {
            return Err("the grant names no MCP server (toolfs serves warren's own tools)".into());
        };
        if !valid_name(&name) {
            return Err(format!("`{name}` is not an MCP server name"));
        }
        let config = ServerConfig::load(&self.config_dir, &name).map_err(|e| e.to_string())?;
        let pins = Pins::load(&pins_path(&self.config_dir, &name)).map_err(|e| e.to_string())?;
        let served = self.served(&name);
        let live = runtime.block_on(served.live(START_DEADLINE))?;
        let mut defs = Vec::new();
        let listed = live.defs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for def in &listed {
            if !pins.standing(def).is_served() {
                tracing::info!(server = %name, tool = %def.name, "held: its definition is not the one accepted");
                continue;
            }
            match tool_def(&served, &config, def) {
                Ok(d) => defs.push(d),
                Err(e) => tracing::warn!(server = %name, tool = %def.name, "not served: {e}"),
            }
        }
        let catalog = Catalog::from_defs(defs)?;
        if record.tools.is_empty() {
            // No names: every tool the operator accepted.
            record.tools = catalog
                .names()
                .map(|n| warren_toolfs::ToolGrant {
                    name: n.to_owned(),
                    roots: Vec::new(),
                    network: false,
                })
                .collect();
        } else {
            // A named tool that is held, or not listed at all, does not exist for this
            // connection: absent, as an ungranted tool is.
            record.tools.retain(|t| {
                let served = catalog.get(&t.name).is_some();
                if !served {
                    tracing::info!(server = %name, tool = %t.name, "granted but not served (held or not listed)");
                }
                served
            });
        }
        Ok(Arc::new(catalog))
    }

    /// A namespace that mounts the whole server (no tool names) gets its resources too.
    fn resources_for(
        &self,
        record: &GrantRecord,
        runtime: &tokio::runtime::Handle,
    ) -> Option<Arc<dyn ResourceFiles>> {
        let name = record.server.as_deref()?;
        if !record.tools.is_empty() || !valid_name(name) {
            return None;
        }
        let served = self.served(name);
        let listed = runtime.block_on(async {
            let live = served.live(START_DEADLINE).await?;
            live.session
                .resources(START_DEADLINE)
                .await
                .map_err(|e| e.to_string())
        });
        match listed {
            Ok(resources) if !resources.is_empty() => Some(Arc::new(McpResources {
                files: resources
                    .into_iter()
                    .map(|(uri, _)| (resource_file_name(&uri), uri))
                    .collect(),
                served,
            })),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(server = %name, "no resources: {e}");
                None
            }
        }
    }
}

/// A resource's file name: its URI, with `%`, `/` and control characters percent-encoded, so
/// that every URI is one file name and two URIs never share one.
pub fn resource_file_name(uri: &str) -> String {
    let mut out = String::with_capacity(uri.len());
    for c in uri.chars() {
        if c == '%' || c == '/' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    if out == "." || out == ".." {
        out = out.replace('.', "%2E");
    }
    out
}

/// A server's resources as read-only files (`resources/`): listed when the namespace mounts the
/// whole server, each read from the server when opened.
struct McpResources {
    served: Arc<Served>,
    /// (file name, URI), in the server's order.
    files: Vec<(String, String)>,
}

#[async_trait::async_trait]
impl ResourceFiles for McpResources {
    fn names(&self) -> Vec<String> {
        self.files.iter().map(|(n, _)| n.clone()).collect()
    }

    async fn read(&self, name: &str, _session: &str) -> warren_9p::Result<Vec<u8>> {
        let (live, uri) = self.live_for(name).await?;
        live.session
            .read_resource(uri, START_DEADLINE)
            .await
            .map_err(|e| self.failed(uri, e))
    }

    async fn read_mcp(&self, name: &str, _session: &str) -> warren_9p::Result<Vec<u8>> {
        let (live, uri) = self.live_for(name).await?;
        let read = live
            .session
            .read_resource_mcp(uri, START_DEADLINE)
            .await
            .map_err(|e| self.failed(uri, e))?;
        serde_json::to_vec(&read).map_err(|_| warren_9p::Errno::EIO)
    }
}

impl McpResources {
    /// The live session and the URI of the resource whose file is `name`.
    async fn live_for(&self, name: &str) -> warren_9p::Result<(Arc<Live>, &str)> {
        let uri = self
            .files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, u)| u.as_str())
            .ok_or(warren_9p::Errno::ENOENT)?;
        let live = self.served.live(START_DEADLINE).await.map_err(|e| {
            tracing::warn!(server = %self.served.name, "resource {uri}: {e}");
            warren_9p::Errno::EIO
        })?;
        Ok((live, uri))
    }

    fn failed(&self, uri: &str, e: SessionError) -> warren_9p::Errno {
        tracing::warn!(server = %self.served.name, "resource {uri}: {e}");
        warren_9p::Errno::EIO
    }
}

/// The tree's definition of one accepted tool: the server's description and schema, the tier
/// the operator gave it (raised by the server's own claims, never lowered), the gate name
/// `mcp:<server>:<tool>`.
fn tool_def(
    served: &Arc<Served>,
    config: &ServerConfig,
    def: &Definition,
) -> Result<ToolDef, String> {
    let tier = def.tier(config.tier_of(&def.name));
    let doc = format!(
        "{}\n\nA tool of the MCP server {}, called through warren: decided by the gate as {}, \
         receipted, its result untrusted data.\n",
        def.description.as_deref().unwrap_or("(no description)"),
        served.name,
        def.gate_name(&served.name)
    );
    let runner = Runner::External(Arc::new(McpTool {
        served: served.clone(),
        tool: def.name.clone(),
        timeout: config.call_timeout,
    }));
    Ok(ToolDef::new(
        def.name.clone(),
        tier.as_str().to_owned(),
        def.summary(),
        doc,
        def.input_schema.clone(),
        runner,
    )?
    .gated_as(def.gate_name(&served.name))
    .at_tier(tier))
}

/// One server: its live session (started on first use) and its restarts.
pub struct Served {
    name: String,
    config_dir: PathBuf,
    nsd: PathBuf,
    pins: PathBuf,
    live: tokio::sync::Mutex<Option<Arc<Live>>>,
    restarts: Mutex<Restarts>,
}

#[derive(Default)]
struct Restarts {
    /// Starts that failed, or sessions that died, since the last one that served a call.
    failures: u32,
    not_before: Option<Instant>,
}

/// A running server: the session, its tools as listed at start, and nsd's connection, which
/// holds its namespace (dropping it ends the server).
pub struct Live {
    session: Session,
    /// The tools as last listed: at the start, and again after the server said they changed.
    defs: Mutex<Vec<Definition>>,
    /// Which of `defs` the operator's pins accept, as of the pins file's modification time:
    /// worked out again only when the file or the listing changes, not on every call.
    accepted: Mutex<Option<Accepted>>,
    /// A stdio server's namespace (none for an HTTP server, which runs elsewhere).
    _namespace: Option<warren_proto::launch::Launched>,
    ended: Arc<AtomicBool>,
}

impl Served {
    /// The live session, started (by nsd) if there is none or the last one ended; a server
    /// that keeps dying is started again no sooner than its backoff allows, which the caller
    /// waits for if it is shorter than `patience` (else it gets the error at once).
    async fn live(self: &Arc<Self>, patience: Duration) -> Result<Arc<Live>, String> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref()
            && !live.ended.load(Ordering::Acquire)
            && !live.session.is_closed()
        {
            return Ok(live.clone());
        }
        if slot.take().is_some() {
            self.failed();
        }
        let not_before = self.restarts().not_before;
        if let Some(wait) = not_before.and_then(|at| at.checked_duration_since(Instant::now())) {
            if wait > patience {
                return Err(format!(
                    "MCP server {} is restarting after a failure: next start in {} ms",
                    self.name,
                    wait.as_millis()
                ));
            }
            tokio::time::sleep(wait).await;
        }
        match self.start().await {
            Ok(live) => {
                let live = Arc::new(live);
                *slot = Some(live.clone());
                Ok(live)
            }
            Err(e) => {
                self.failed();
                Err(format!(
                    "MCP server {} could not be started: {e}",
                    self.name
                ))
            }
        }
    }

    fn restarts(&self) -> std::sync::MutexGuard<'_, Restarts> {
        self.restarts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A start failed or a session died: the next start waits 250 ms × 2ⁿ, at most 30 s.
    fn failed(&self) {
        let mut r = self.restarts();
        r.failures = r.failures.saturating_add(1);
        let wait = Duration::from_millis(250)
            .saturating_mul(1 << r.failures.min(8))
            .min(MAX_BACKOFF);
        tracing::warn!(server = %self.name, failures = r.failures, "next start no sooner than {wait:?}");
        r.not_before = Some(Instant::now() + wait);
    }

    fn served_a_call(&self) {
        let mut r = self.restarts();
        r.failures = 0;
        r.not_before = None;
    }

    /// Forgets `live` if it is still the current session (it failed a call), so that the next
    /// call starts the server again.
    async fn forget(&self, live: &Arc<Live>) {
        let mut slot = self.live.lock().await;
        if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
            *slot = None;
            drop(slot);
            self.failed();
        }
    }

    /// Reaches the server as its definition says — a stdio server started by nsd in its own
    /// namespace, spoken to on its pipes; an HTTP server at its URL — and lists its tools.
    async fn start(&self) -> Result<Live, String> {
        let config = ServerConfig::load(&self.config_dir, &self.name).map_err(|e| e.to_string())?;
        let (session, namespace) = match &config.transport {
            Transport::Stdio { .. } => {
                let (session, namespace) = self.start_stdio().await?;
                (session, Some(namespace))
            }
            Transport::Http { url } => (
                Session::http(url, START_DEADLINE)
                    .await
                    .map_err(|e| e.to_string())?,
                None,
            ),
        };
        let mut defs = Vec::new();
        for d in session
            .tools(START_DEADLINE)
            .await
            .map_err(|e| e.to_string())?
        {
            match d {
                Ok(d) => defs.push(d),
                Err(e) => tracing::warn!(server = %self.name, "a listed tool is not served: {e}"),
            }
        }
        tracing::info!(server = %self.name, info = ?session.server_info(), tools = defs.len(), "MCP server started");
        Ok(Live {
            session,
            defs: Mutex::new(defs),
            accepted: Mutex::new(None),
            _namespace: namespace,
            ended: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl Served {
    /// Has nsd start the stdio server in the namespace its definition names (nsd reads the
    /// definition itself), and opens a session on its pipes.
    async fn start_stdio(&self) -> Result<(Session, warren_proto::launch::Launched), String> {
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e.to_string());
        let (server_in, to_server) = pipe()?;
        let (from_server, server_out) = pipe()?;
        // Its stderr is a pipe mcpfs reads, never a file of warren's: its lines reach warren's
        // log escaped, cut and rate-limited ([`relay_stderr`]).
        let (from_stderr, stderr) = pipe()?;
        relay_stderr(&self.name, from_stderr);
        let (nsd, name) = (self.nsd.clone(), self.name.clone());
        let namespace = tokio::task::spawn_blocking(move || {
            warren_proto::launch::start_server(
                &nsd,
                &name,
                [server_in.as_fd(), server_out.as_fd(), stderr.as_fd()],
                START_DEADLINE,
            )
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("nsd: {e}"))?;
        let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(from_server)
            .map_err(|e| e.to_string())?;
        let writer =
            tokio::net::unix::pipe::Sender::from_owned_fd(to_server).map_err(|e| e.to_string())?;
        let session = Session::over(reader, writer, START_DEADLINE)
            .await
            .map_err(|e| e.to_string())?;
        Ok((session, namespace))
    }
}

/// The most bytes of one stderr line of a server that reach the log.
const STDERR_LINE_BYTES: usize = 512;
/// The most stderr lines of one server start that reach the log per minute; the rest are
/// counted and dropped.
const STDERR_LINES_PER_MINUTE: u32 = 120;

/// Copies a server's stderr to mcpfs's log, a line at a time: each escaped (no terminal
/// control reaches whoever reads the log), cut to [`STDERR_LINE_BYTES`], and at most
/// [`STDERR_LINES_PER_MINUTE`] a minute. Ends when the server's end of the pipe closes.
fn relay_stderr(server: &str, pipe: OwnedFd) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let server = server.to_owned();
    let Ok(reader) = tokio::net::unix::pipe::Receiver::from_owned_fd(pipe) else {
        return;
    };
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(reader);
        let mut line = Vec::new();
        let (mut window, mut shown, mut dropped) = (Instant::now(), 0u32, 0u64);
        loop {
            line.clear();
            // Read at most a line's worth more than is shown, then skip to the newline.
            let read = (&mut reader)
                .take(STDERR_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .await;
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") && line.len() > STDERR_LINE_BYTES {
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    match (&mut reader)
                        .take(64 * 1024)
                        .read_until(b'\n', &mut rest)
                        .await
                    {
                        Ok(0) | Err(_) => break,
                        Ok(_) if rest.ends_with(b"\n") => break,
                        Ok(_) => {}
                    }
                }
            }
            if window.elapsed() >= Duration::from_secs(60) {
                if dropped > 0 {
                    tracing::warn!(server = %server, dropped, "stderr lines dropped (over the rate)");
                }
                (window, shown, dropped) = (Instant::now(), 0, 0);
            }
            if shown >= STDERR_LINES_PER_MINUTE {
                dropped += 1;
                continue;
            }
            shown += 1;
            let cut = &line[..line.len().min(STDERR_LINE_BYTES)];
            let text = String::from_utf8_lossy(cut);
            tracing::info!(server = %server, "stderr: {}", warren_daemon::escape::escape(text.trim_end_matches('\n')));
        }
    });
}

/// The names of the listed tools whose definitions are the accepted ones, and the pins file's
/// modification time they were worked out from.
struct Accepted {
    pins_modified: Option<std::time::SystemTime>,
    tools: std::collections::HashSet<String>,
}

/// One accepted tool of one server, as a call file's runner.
struct McpTool {
    served: Arc<Served>,
    tool: String,
    /// The definition's `timeout`: past it the caller gets an error, and the server is
    /// started again for the next call.
    timeout: Duration,
}

impl McpTool {
    /// A call that got no tool result. Untrusted, like the result itself: the reason is a
    /// session's or a start's error, whose text quotes the server (a JSON-RPC error's message
    /// and data, its handshake answer, the bytes a reply failed to parse on), so it may carry
    /// injected text, and only an untrusted envelope taints the session. The few reasons in
    /// warren's words alone (a timeout) are marked so too: one rule, failing closed.
    fn error(&self, status: Status, why: String) -> Envelope {
        Envelope::new(
            &format!("mcp:{}:{}", self.served.name, self.tool),
            status,
            Taint::Untrusted,
            why,
        )
    }

    /// The definition the operator accepted is still the one the live server lists — listed
    /// again first if the server said its tools changed (a definition changed mid-session is
    /// then held, like one changed between starts). `Err` is the envelope to answer with.
    async fn still_accepted(&self, live: &Live) -> Result<(), Envelope> {
        if live.session.take_tools_changed() {
            let listed = live.session.tools(self.timeout).await.map_err(|e| {
                self.error(
                    Status::Error,
                    format!("listing the tools again after list_changed: {e}"),
                )
            })?;
            let defs: Vec<Definition> = listed.into_iter().filter_map(Result::ok).collect();
            tracing::info!(server = %self.served.name, tools = defs.len(), "tools listed again after list_changed");
            *live.defs.lock().unwrap_or_else(|p| p.into_inner()) = defs;
            *live.accepted.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        let modified = std::fs::metadata(&self.served.pins)
            .and_then(|m| m.modified())
            .ok();
        let defs = live.defs.lock().unwrap_or_else(|p| p.into_inner());
        let mut accepted = live.accepted.lock().unwrap_or_else(|p| p.into_inner());
        if accepted
            .as_ref()
            .is_none_or(|a| a.pins_modified != modified)
        {
            let pins = Pins::load(&self.served.pins).map_err(|e| self.held(e.to_string()))?;
            *accepted = Some(Accepted {
                pins_modified: modified,
                tools: defs
                    .iter()
                    .filter(|d| pins.standing(d).is_served())
                    .map(|d| d.name.clone())
                    .collect(),
            });
        }
        let served = accepted
            .as_ref()
            .is_some_and(|a| a.tools.contains(&self.tool));
        match defs.iter().find(|d| d.name == self.tool) {
            Some(_) if served => Ok(()),
            Some(_) => Err(self.held(format!(
                "the server's definition of {} changed since the operator accepted it (drift): \
                 held until the operator accepts it again (`warren mcp check {}`, then `accept`)",
                self.tool, self.served.name
            ))),
            None => Err(self.held(format!("the server no longer lists {}", self.tool))),
        }
    }

    /// The call denied as drift, `why` in warren's words (trusted).
    fn held(&self, why: String) -> Envelope {
        let mut env = Envelope::denied(&format!("mcp:{}:{}", self.served.name, self.tool), "drift");
        env.content = format!("denied: {why}");
        env.digest = warren_toolfs::envelope::content_digest(env.content.as_bytes());
        env
    }
}

#[async_trait::async_trait]
impl ExternalTool for McpTool {
    async fn call(&self, _canonical: &[u8], value: &Value) -> Envelope {
        let live = match self.served.live(self.timeout).await {
            Ok(l) => l,
            Err(e) => return self.error(Status::Error, e),
        };
        if let Err(env) = self.still_accepted(&live).await {
            return env;
        }
        let arguments = value.as_object().cloned().unwrap_or_default();
        match live.session.call(&self.tool, arguments, self.timeout).await {
            Ok(outcome) => {
                self.served.served_a_call();
                envelope(&self.served.name, &self.tool, &outcome)
            }
            Err(e @ SessionError::InputRequired(_)) => self.error(Status::Error, e.to_string()),
            Err(e) => {
                // Timed out, hung up or spoke garbage: the server is started again for the
                // next call (with backoff), and this caller gets why.
                tracing::warn!(server = %self.served.name, tool = %self.tool, "call failed: {e}; the server will be restarted");
                live.ended.store(true, Ordering::Release);
                self.served.forget(&live).await;
                self.error(
                    Status::Error,
                    format!("MCP server {} failed the call: {e}", self.served.name),
                )
            }
        }
    }
}

/// A result as the call file returns it: the server's text (attachments described by type,
/// size and digest), `isError` as the status, always untrusted; its MCP form beside it for
/// `call.mcp`.
fn envelope(server: &str, tool: &str, outcome: &Outcome) -> Envelope {
    let status = if outcome.is_error {
        Status::Error
    } else {
        Status::Ok
    };
    let mut env = Envelope::new(
        &format!("mcp:{server}:{tool}"),
        status,
        Taint::Untrusted,
        outcome.text.clone(),
    );
    // Only `call.mcp` hands this on (warren_toolfs::call::ResultForm): `call` drops it.
    env.mcp = Some(serde_json::json!({
        "content": outcome.blocks,
        "notifications": outcome.notes,
    }));
    env
}

#[cfg(test)]
mod tests {
    use super::resource_file_name;

    #[test]
    fn every_resource_uri_is_one_file_name_and_no_two_share_one() {
        assert_eq!(resource_file_name("demo://a/b.md"), "demo:%2F%2Fa%2Fb.md");
        assert_eq!(resource_file_name("x%2Fy"), "x%252Fy");
        assert_ne!(resource_file_name("a/b"), resource_file_name("a%2Fb"));
        assert_eq!(resource_file_name(".."), "%2E%2E");
        assert_eq!(resource_file_name("a\nb"), "a%0Ab");
        for uri in ["file:///etc/passwd", "../../x", "a/../../b"] {
            assert!(!resource_file_name(uri).contains('/'), "{uri}");
        }
    }
}
