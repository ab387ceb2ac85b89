//! The one client of the gate: [`GateClient`], one long-lived 9P connection on which toolfs,
//! mcpfs, netproxy and llmfs have every call decided before anything runs (`decide`, `wait`,
//! `withdraw`; `specs/gate-tree.md`).
//!
//! It fails closed: a daemon with no gate connection denies every call ([`NO_GATE`]); once the
//! connection dies, or a decide goes unanswered for [`DECIDE_TIMEOUT`], or a reply does not
//! parse, the call is a deny with basis `gate_unavailable: …` ([`unavailable`]). A daemon never
//! reconnects: its connection was the gate's control socket's handover, and the supervisor
//! restarts the daemon after it restarts the gate.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::value::RawValue;
use warren_9p::{Client, Errno, Fid, oflags};

use super::{Answer, ContextState, Tier, Verdict, encode_in};

/// The inherited, connected Unix stream socket whose other end the gate serves (the
/// supervisor's handover to each deciding daemon).
pub const GATE_FD_ENV: &str = "WARREN_GATE_FD";

/// How the basis of every deny for a gate that could not answer begins.
pub const GATE_UNAVAILABLE: &str = "gate_unavailable";

/// What a call is told when its daemon has no gate.
pub const NO_GATE: &str = "no gate: every call is denied";

/// How long a decide may take: longer than the gate's own receiptd connect and append timeouts
/// (2 s + 10 s), after which the gate itself denies.
pub const DECIDE_TIMEOUT: Duration = Duration::from_secs(30);

/// The deny a caller gets when the gate cannot answer.
pub fn unavailable(why: impl std::fmt::Display) -> Answer {
    deny(format!("{GATE_UNAVAILABLE}: {why}"))
}

fn deny(basis: String) -> Answer {
    Answer {
        decision: Verdict::Deny,
        pending: None,
        basis,
        fingerprint: String::new(),
        tier: String::new(),
        risk: None,
        receipt: None,
    }
}

/// A daemon's connection to the gate, or none (every call denied).
pub struct GateClient {
    attached: Option<Attached>,
}

struct Attached {
    root: Fid,
    /// Opened `decide` fids, one per decide in flight (requests on one fid run in order).
    decide_pool: Mutex<Vec<Fid>>,
}

impl GateClient {
    /// No gate: every call is denied.
    pub fn none() -> GateClient {
        GateClient { attached: None }
    }

    /// Connects to a gate socket (the operator's, or in tests).
    pub async fn connect(path: impl AsRef<Path>) -> std::io::Result<GateClient> {
        let client = Client::connect_unix(path).await?;
        Ok(GateClient::attach(&client).await?)
    }

    /// Attaches on an existing 9P connection.
    pub async fn attach(client: &Client) -> Result<GateClient, Errno> {
        let root = client.attach("toolfs", "").await?;
        Ok(GateClient {
            attached: Some(Attached {
                root,
                decide_pool: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The client over the supervisor's handed-over connection (`WARREN_GATE_FD`, taken by the
    /// daemon at start), or, with none, no gate (every call denied) and a warning saying so.
    pub async fn inherited(fd: Option<OwnedFd>) -> GateClient {
        match fd {
            Some(fd) => GateClient::over(fd).await,
            None => {
                tracing::warn!("{GATE_FD_ENV} is not set: {NO_GATE}");
                GateClient::none()
            }
        }
    }

    /// Speaks 9P on the handed-over socket `fd` and attaches to the gate. A failure is logged
    /// and leaves the daemon without a gate (every call denied).
    pub async fn over(fd: OwnedFd) -> GateClient {
        let attached = async {
            let stream = std::os::unix::net::UnixStream::from(fd);
            stream.set_nonblocking(true)?;
            let client =
                warren_9p::Client::new(tokio::net::UnixStream::from_std(stream)?, 1 << 20).await?;
            GateClient::attach(&client)
                .await
                .map_err(std::io::Error::from)
        }
        .await;
        attached.unwrap_or_else(|e| {
            tracing::error!(
                "cannot attach to the gate on {GATE_FD_ENV}: {e}; every call is denied"
            );
            GateClient::none()
        })
    }

    /// Asks the gate about one call. `canonical_args` are the exact RFC 8785 bytes the worker
    /// will get; `lineage` is the namespace's (nsd's, serialised once). An `ask` answer carries
    /// the pending id to [`GateClient::wait`] on.
    pub async fn decide(
        &self,
        session: &str,
        tool: &str,
        canonical_args: &[u8],
        context: &[ContextState],
        lineage: Option<&RawValue>,
    ) -> Answer {
        self.decide_at(session, tool, canonical_args, context, lineage, None)
            .await
    }

    /// [`GateClient::decide`] naming the tool's tier (an MCP server's tool: the tier its
    /// operator-written definition gives it; only mcpfs's connection may name one).
    pub async fn decide_at(
        &self,
        session: &str,
        tool: &str,
        canonical_args: &[u8],
        context: &[ContextState],
        lineage: Option<&RawValue>,
        tier: Option<Tier>,
    ) -> Answer {
        let Some(a) = &self.attached else {
            return deny(NO_GATE.into());
        };
        let body = match encode_in(session, tool, canonical_args, context, lineage, tier) {
            Ok(b) => b,
            Err(e) => return unavailable(e),
        };
        // A gate that stops answering is a gate that is not there. (An ask is answered at once
        // with its pending id; only `wait` blocks for a person.)
        tokio::time::timeout(DECIDE_TIMEOUT, a.decide(&body))
            .await
            .unwrap_or_else(|_| {
                unavailable(format!(
                    "no answer to decide within {} s",
                    DECIDE_TIMEOUT.as_secs()
                ))
            })
    }

    /// Waits for ask `pending_id` to be closed; the outcome is `allow` or `deny` (anything else
    /// is a deny). Call it again (on a new connection) after a reconnect: the ask survives both
    /// sides restarting, within the gate's orphan grace.
    pub async fn wait(&self, pending_id: i64) -> Answer {
        let Some(a) = &self.attached else {
            return deny(NO_GATE.into());
        };
        let result = async {
            let fid = a
                .root
                .walk(&["pending", &pending_id.to_string(), "wait"])
                .await
                .map_err(|e| format!("pending {pending_id}: {e}"))?;
            fid.open(oflags::RDONLY)
                .await
                .map_err(|e| format!("open wait: {e}"))?;
            let reply = fid.read_to_end(0).await.map_err(|e| format!("wait: {e}"))?;
            serde_json::from_slice::<Answer>(&reply)
                .map_err(|e| format!("wait reply does not parse: {e}"))
        }
        .await;
        match result {
            // Fail closed on anything but a definite allow or deny.
            Ok(a) if a.decision == Verdict::Ask => unavailable("wait answered ask"),
            Ok(a) => a,
            Err(e) => unavailable(e),
        }
    }

    /// Withdraws an ask whose caller went away: it is orphaned (denied) and can no longer be
    /// answered. A failure is logged (the gate orphans the ask itself once this connection ends).
    pub async fn withdraw(&self, pending_id: i64) {
        let Some(a) = &self.attached else {
            return;
        };
        let withdrawn = async {
            let fid = a
                .root
                .walk(&["pending", &pending_id.to_string(), "ctl"])
                .await?;
            fid.open(oflags::WRONLY).await?;
            fid.write(0, b"withdraw").await.map(drop)
        }
        .await;
        if let Err(e) = withdrawn {
            tracing::warn!(
                pending = pending_id,
                "cannot withdraw the ask: {e}; it will be orphaned"
            );
        }
    }
}

impl Attached {
    async fn decide_fid(&self) -> Result<Fid, Errno> {
        if let Some(fid) = self
            .decide_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
        {
            return Ok(fid);
        }
        let fid = self.root.walk(&["decide"]).await?;
        fid.open(oflags::RDWR).await?;
        Ok(fid)
    }

    /// One decide request (`body`, [`encode_in`]'s) on a pooled `decide` fid.
    async fn decide(&self, body: &[u8]) -> Answer {
        let fid = match self.decide_fid().await {
            Ok(f) => f,
            Err(e) => return unavailable(format!("open decide: {e}")),
        };
        let result = match fid.call(body).await {
            Ok(reply) => serde_json::from_slice::<Answer>(&reply)
                .map_err(|e| format!("decide reply does not parse: {e}")),
            Err((Errno::EINVAL, said)) => Err(format!(
                "the gate refused the request as malformed: {}",
                String::from_utf8_lossy(&said).trim()
            )),
            Err((e, _)) => Err(format!("decide: {e}")),
        };
        match result {
            Ok(answer) => {
                self.decide_pool
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(fid);
                answer
            }
            Err(e) => unavailable(e),
        }
    }
}
