//! The daemon's control socket, `<runtime>/netproxy.ctl` (root only): nsd hands over, per
//! namespace, the listening TCP socket it made inside that namespace's network namespace and the
//! namespace's policy. The connection is the capability: the proxy serves that listener with
//! exactly the patterns of nsd's record, and the session ends when nsd closes the control
//! connection (the namespace ended).
//!
//! Frame: `warren_daemon::handoff` (a length-prefixed JSON [`GrantRecord`], the listener as
//! SCM_RIGHTS), answered with one line, `ok` or `error: <why>`, as toolfs's and mcpfs's control
//! sockets answer.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use warren_gate::policy::Verdict;
use warren_proto::gate::GateClient;
pub use warren_proto::net::{CONTROL, GrantRecord, hand_over};
use warren_toolfs::effects::{ReceiptSlot, Receipts};

use crate::{Decide, Decision, Policy, Record, Records, Resolver, Session};

/// What every granted session shares: the resolver, the gate connection, the receipt queue and
/// the records' own sink.
pub struct Grants {
    pub resolver: Resolver,
    /// `None`: every listed destination is allowed (tests). The daemon always has one; a
    /// daemon given no gate connection has `GateClient::none()`, which denies.
    pub gate: Option<Arc<GateClient>>,
    pub receipts: Option<Arc<Receipts>>,
    pub records: Records,
}

impl Grants {
    /// Serves the control socket forever: root peers in our pid namespace only, one grant per
    /// connection.
    pub async fn serve_control(self: Arc<Self>, listener: UnixListener) {
        loop {
            let sock = warren_daemon::accept::next_peer(&listener, "control socket", |s| {
                warren_daemon::accept::refusal(s.as_fd(), warren_daemon::accept::root_only)
            })
            .await;
            tokio::spawn(self.clone().grant_connection(sock));
        }
    }

    async fn grant_connection(self: Arc<Self>, sock: UnixStream) {
        let (record, fds) = match warren_daemon::handoff::recv_async(&sock).await {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!("control connection: {e}; closing it");
                return;
            }
        };
        // recv_async leaves the socket blocking (its dup shares the flags); this one is then
        // waited on for as long as the namespace runs, so it goes back to the reactor as a
        // non-blocking socket.
        let renewed = sock.into_std().and_then(|s| {
            s.set_nonblocking(true)?;
            UnixStream::from_std(s)
        });
        let mut sock = match renewed {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("control connection: {e}; closing it");
                return;
            }
        };
        let granted = self.accept(&record, fds);
        let reply = match &granted {
            Ok(_) => "ok\n".to_string(),
            Err(msg) => {
                tracing::warn!("grant refused: {msg}");
                warren_proto::control::reply_line(&Err(msg.clone()))
            }
        };
        if let Err(e) = sock.write_all(reply.as_bytes()).await {
            tracing::warn!("control connection: cannot answer: {e}");
            return;
        }
        let Ok((session, listener, namespace)) = granted else {
            return;
        };
        let name = session.name.clone();
        tracing::info!(
            session = name,
            namespace,
            "serving a namespace's proxy listener"
        );
        let serving = tokio::spawn(session.serve_tcp(listener));
        // The session lives as long as nsd's end of this connection: EOF (or any error) is the
        // namespace's end. Nothing more is read from it.
        let mut buf = [0u8; 64];
        while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
        serving.abort();
        tracing::info!(session = name, namespace, "the namespace's grant ended");
    }

    fn accept(
        &self,
        record: &[u8],
        fds: Vec<OwnedFd>,
    ) -> Result<(Arc<Session>, tokio::net::TcpListener, String), String> {
        let record: GrantRecord =
            serde_json::from_slice(record).map_err(|e| format!("bad grant record: {e}"))?;
        if record.version != 1 {
            return Err(format!("grant record version {}", record.version));
        }
        warren_receiptd::receipt::check_scope(&record.session)
            .map_err(|e| format!("session: {e}"))?;
        let policy = Policy::parse(record.patterns.iter().map(String::as_str))?;
        let lineage = match &record.lineage {
            Some(l) => {
                l.check(&record.session, &record.namespace)?;
                Some(serde_json::value::to_raw_value(l).map_err(|e| format!("lineage: {e}"))?)
            }
            None => None,
        };
        if policy.patterns.is_empty() {
            return Err("a grant with no patterns".into());
        }
        let [fd]: [OwnedFd; 1] = fds
            .try_into()
            .map_err(|f: Vec<OwnedFd>| format!("{} fds with the grant; one listener", f.len()))?;
        let listening = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::AcceptConn)
            .map_err(|e| format!("the fd is not a socket: {e}"))?;
        let inet = nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
        )
        .map_err(|e| format!("the fd has no address: {e}"))?
        .as_sockaddr_in()
        .is_some();
        if !listening || !inet {
            return Err("the fd is not a listening TCP/IPv4 socket".into());
        }
        let std_listener = std::net::TcpListener::from(fd);
        std_listener
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let listener =
            tokio::net::TcpListener::from_std(std_listener).map_err(|e| e.to_string())?;
        let mut records = self.records.clone();
        if let Some(receipts) = &self.receipts {
            let (receipts, scope) = (receipts.clone(), record.session.clone());
            // A connection takes its place in the receipt queue before it is served, as a
            // tool call does: none free (receiptd not taking them), the connection is refused.
            records = records.with_reserve(Arc::new(move || {
                let slot = receipts.reserve()?;
                let scope = scope.clone();
                Ok(Box::new(move |r: &Record| receipt(slot, &scope, r)))
            }));
        }
        let decide: Arc<dyn Decide> = match &self.gate {
            Some(gate) => Arc::new(GateDecide {
                gate: gate.clone(),
                session: record.session.clone(),
                lineage,
            }),
            None => Arc::new(crate::AllowListed),
        };
        let session = Session::with_decide(
            record.session.clone(),
            policy,
            self.resolver.clone(),
            records,
            decide,
        );
        Ok((Arc::new(session), listener, record.namespace))
    }
}

/// The gate's name for a destination: `net:<host>:<port>`, an IPv6 literal without its
/// brackets and with `-` for each `:` (a tool name's alphabet, `[A-Za-z0-9_.:-]`).
pub fn tool_name(host: &str, port: u16) -> String {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .map_or_else(|| host.to_string(), |v6| v6.replace(':', "-"));
    format!("net:{host}:{port}")
}

/// The connection's record as an `effect` receipt in the namespace's scope, in the place the
/// connection took before it was served: a connection is bytes sent out of the namespace on its
/// behalf, so it is signed like a tool's effect.
fn receipt(slot: ReceiptSlot, scope: &str, record: &Record) {
    let mut subject = serde_json::to_value(record).expect("a record serialises");
    if let (Some(host), Some(port)) = (&record.host, record.port) {
        subject["tool"] = tool_name(host, port).into();
    }
    slot.send(scope, "effect", subject, serde_json::json!({}));
}

/// The gate behind [`Decide`]: `net:<host>:<port>` at the network tier, in the namespace's
/// session; an ask is waited for.
pub struct GateDecide {
    pub gate: Arc<GateClient>,
    pub session: String,
    pub lineage: Option<Box<serde_json::value::RawValue>>,
}

#[async_trait]
impl Decide for GateDecide {
    async fn decide(&self, host: &str, port: u16) -> Decision {
        let tool = tool_name(host, port);
        let args = warren_jcs::to_vec(&serde_json::json!({"host": host, "port": port}))
            .expect("canonical JSON of a name and a port");
        let mut answer = self
            .gate
            .decide(&self.session, &tool, &args, &[], self.lineage.as_deref())
            .await;
        if answer.decision == Verdict::Ask {
            answer = match answer.pending {
                Some(id) => self.gate.wait(id).await,
                None => return Decision::Deny(format!("the gate asked about {tool} with no id")),
            };
        }
        match answer.decision {
            Verdict::Allow => Decision::Allow,
            _ => Decision::Deny(format!("the gate denied {tool}: {}", answer.basis)),
        }
    }
}
