//! nsd's MCP server socket, `<runtime>/nsd-mcp.ctl`: how mcpfs gets a stdio MCP server started,
//! without ever choosing what the server may touch.
//!
//! mcpfs (its uid, or root) sends one [`StartServer`] naming an operator-defined server, with
//! three fds: the server's stdin, stdout and stderr. nsd reads the server's definition itself
//! (`$WARREN_CONFIG_DIR/mcp/<name>.toml`), builds a namespace from the definition's `spec` and
//! runs its `command` there, exactly as for `warren run` (same checks, same confinement), then
//! follows it on this connection as it follows a launcher's: `started`, and `exited` or
//! `failed` at the end. mcpfs closing the connection ends the server's namespace.
//!
//! So the connection is the capability here too: a compromised mcpfs can start only servers the
//! operator defined, each in the namespace the operator wrote for it.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use warren_daemon::accept::{next_blocking_peer, refusal};
use warren_daemon::identity::Role;
use warren_daemon::peer::{PeerCred, peer_cred};
use warren_proto::mcp::Transport;

use crate::nsd::Nsd;
use crate::run_socket::{refuse, run_and_follow};
use warren_ns::launch::{Request, StartServer, VERSION, recv};

/// The origin `/ns/<id>/info` shows for an MCP server's namespace.
pub const MCP_ORIGIN: &str = "mcp";

/// Who may ask (besides being in nsd's pid namespace): mcpfs's uid or root.
fn mcpfs_or_root(cred: &PeerCred) -> Option<String> {
    (cred.uid != 0 && cred.uid != Role::Mcpfs.uid())
        .then(|| format!("uid {} is neither mcpfs nor root", cred.uid))
}

/// Serves the MCP server socket forever, each connection on a thread of its own.
pub async fn accept_loop(listener: UnixListener, nsd: Nsd, config_dir: PathBuf, secrets: PathBuf) {
    let nsd = Arc::new(nsd);
    loop {
        let sock = next_blocking_peer(&listener, "mcp socket", |s| {
            refusal(s.as_fd(), mcpfs_or_root)
        })
        .await;
        let Ok(cred) = peer_cred(sock.as_fd()) else {
            continue;
        };
        let (nsd, config_dir, secrets) = (nsd.clone(), config_dir.clone(), secrets.clone());
        std::thread::spawn(move || serve(&sock, cred, &nsd, &config_dir, &secrets));
    }
}

fn serve(sock: &UnixStream, cred: PeerCred, nsd: &Nsd, config_dir: &Path, secrets: &Path) {
    let (start, fds) = match recv::<StartServer>(sock) {
        Ok(got) => got,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return,
        Err(e) => return refuse(sock, cred, &e),
    };
    let request = match request_for(&start, config_dir, secrets) {
        Ok(r) => r,
        Err(e) => return refuse(sock, cred, &e),
    };
    if fds.len() != 3 {
        let e = io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds came with the request, not 3 (stdio)", fds.len()),
        );
        return refuse(sock, cred, &e);
    }
    tracing::info!(server = %start.server, "starting MCP server for pid {}", cred.pid);
    // The operator defined the server: its namespace is root's (a uid of its own for the
    // payload), never mcpfs's.
    let owner = PeerCred {
        pid: cred.pid,
        uid: 0,
        gid: 0,
    };
    // Origin `mcp`: mcpfs's, ended when mcpfs lets it go (`warren down` does not wait for it).
    run_and_follow(sock, owner, nsd, request, fds, MCP_ORIGIN);
}

/// The run request for the operator's definition of `start.server`: its spec (with an `env`
/// line per variable it gets), its command, and the variables' values from the secrets dir.
fn request_for(start: &StartServer, config_dir: &Path, secrets: &Path) -> io::Result<Request> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if start.version != VERSION {
        return Err(invalid(format!(
            "mcp request version {} (this nsd speaks {VERSION})",
            start.version
        )));
    }
    if !warren_proto::mcp::valid_name(&start.server) {
        return Err(invalid(format!("`{}` is not a server name", start.server)));
    }
    let config = warren_proto::mcp::ServerConfig::load(config_dir, &start.server)
        .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e.to_string()))?;
    let (command, spec) = match config.transport {
        Transport::Stdio { command, spec } => (command, spec),
        Transport::Http { url } => {
            return Err(invalid(format!(
                "{} is reached over HTTP ({url}): nsd starts only stdio servers",
                start.server
            )));
        }
    };
    let mut spec = warren_ns::spec::parse(&format!("{}.toml spec", start.server), &spec)
        .map_err(|e| invalid(e.to_string()))?;
    let mut env = BTreeMap::new();
    for name in &config.env {
        env.insert(name.clone(), secret_value(secrets, &start.server, name)?);
        if !spec.env.contains(name) {
            spec.env.push(name.clone());
        }
    }
    Ok(Request {
        version: VERSION,
        spec: spec.to_text(),
        argv: command,
        env,
        ..Request::default()
    })
}

/// `<secrets>/mcp/<server>/<NAME>`, its trailing newline dropped: a variable's value is never
/// in a definition, a spec, a receipt or a log.
fn secret_value(secrets: &Path, server: &str, name: &str) -> io::Result<String> {
    let path = secrets.join("mcp").join(server).join(name);
    let value = std::fs::read_to_string(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{server} gets {name}, but {} cannot be read: {e}",
                path.display()
            ),
        )
    })?;
    Ok(value.strip_suffix('\n').unwrap_or(&value).to_string())
}
