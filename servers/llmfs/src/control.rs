//! The control socket `<runtime>/llmfs.ctl`: nsd hands over a namespace's connection with its
//! session (`warren_proto::llm`); the tree served on it is a fresh [`LlmTree`] whose sessions
//! live and die with that connection and are receipted in the namespace's session scope.
//! Root peers in llmfs's pid namespace only.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tokio::net::UnixListener;
use warren_daemon::accept::{next_blocking_peer, refusal, root_only};
use warren_proto::lineage::{Lineage, Member};
use warren_proto::llm::{LlmGrant, reply_line};

use crate::gate::ModelGate;
use crate::tree::LlmTree;
use warren_proto::gate::GateClient;

/// Serves the control socket forever; `make` builds the tree for a connection (with no scope);
/// `gate` decides each namespace's model calls (None: `--no-gate`, they are not decided).
pub async fn serve_control(
    listener: UnixListener,
    make: Arc<dyn Fn() -> LlmTree + Send + Sync>,
    gate: Option<Arc<GateClient>>,
    limits: warren_9p::Limits,
) {
    loop {
        let sock =
            next_blocking_peer(&listener, "llmfs.ctl", |s| refusal(s.as_fd(), root_only)).await;
        let (make, gate, limits) = (make.clone(), gate.clone(), limits.clone());
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            loop {
                let (record, fds) = match warren_daemon::handoff::recv(&sock) {
                    Ok(got) => got,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return,
                    Err(e) => {
                        tracing::warn!("llmfs.ctl: {e}; closing the control connection");
                        return;
                    }
                };
                let result = accept(&record, fds, &*make, gate.as_ref(), &limits, &runtime);
                if let Err(msg) = &result {
                    tracing::warn!("llmfs.ctl: refused a connection: {msg}");
                }
                if (&sock).write_all(reply_line(&result).as_bytes()).is_err() {
                    return;
                }
            }
        });
    }
}

fn accept(
    record: &[u8],
    fds: Vec<OwnedFd>,
    make: &(dyn Fn() -> LlmTree + Send + Sync),
    gate: Option<&Arc<GateClient>>,
    limits: &warren_9p::Limits,
    runtime: &tokio::runtime::Handle,
) -> Result<(), String> {
    let [conn]: [OwnedFd; 1] = fds
        .try_into()
        .map_err(|_| "one fd (the connection) per record".to_owned())?;
    let grant: LlmGrant = serde_json::from_slice(record).map_err(|e| format!("bad record: {e}"))?;
    grant.check()?;
    let st = nix::sys::stat::fstat(&conn).map_err(|e| format!("connection fd: {e}"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err("the fd is not a socket".into());
    }
    let stream = std::os::unix::net::UnixStream::from(conn);
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let _guard = runtime.enter();
    let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| e.to_string())?;
    let gate = match (gate, &grant.lineage) {
        (Some(g), Some(lineage)) => Some(ModelGate::new(g.clone(), lineage)?),
        // Fail closed: the gate decides a namespace's calls with who the namespace is.
        (Some(_), None) => {
            return Err(
                "the grant has no lineage: with a gate, a namespace's model calls are decided with its lineage, so its connection is refused".into(),
            );
        }
        (None, _) => None,
    };
    // Without a lineage (only with no gate: llmfs's own tests), the namespace is its own root.
    let lineage = grant.lineage.clone().unwrap_or_else(|| {
        Lineage::root(Member {
            session: grant.session.clone(),
            namespace: grant.namespace.clone(),
            ..Member::default()
        })
    });
    let tree = Arc::new(make().in_scope(grant.session.clone(), gate, &lineage));
    let limits = limits.clone();
    let label = format!("namespace {}", grant.namespace);
    tracing::info!(peer = %label, "serving a namespace's connection");
    runtime.spawn(async move {
        match warren_9p::serve(tree, stream, limits).await {
            Ok(()) => tracing::info!(peer = %label, "connection closed"),
            Err(e) => tracing::info!(peer = %label, "connection ended: {e}"),
        }
    });
    Ok(())
}
