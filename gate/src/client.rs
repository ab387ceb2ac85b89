//! What toolfs calls: [`GateClient`] over one long-lived 9P connection to the gate. It fails
//! closed: any error (gate down, connection lost, a reply that does not parse) is a deny with
//! basis `gate_unavailable: …`.

use std::path::Path;
use std::sync::Mutex;

use warren_9p::{Client, Errno, Fid, oflags};

use crate::gate::Answer;
use crate::policy::{ContextState, Verdict};

pub struct GateClient {
    root: Fid,
    /// Opened `decide` fids, one per decide in flight (requests on one fid run in order).
    decide_pool: Mutex<Vec<Fid>>,
}

/// How the basis of every deny for a gate that could not answer begins.
pub const GATE_UNAVAILABLE: &str = "gate_unavailable";

/// The deny a caller gets when the gate cannot answer.
pub fn unavailable(why: impl std::fmt::Display) -> Answer {
    Answer {
        decision: Verdict::Deny,
        pending: None,
        basis: format!("{GATE_UNAVAILABLE}: {why}"),
        fingerprint: String::new(),
        tier: String::new(),
        risk: None,
        receipt: None,
    }
}

impl GateClient {
    /// Connects to a gate socket (the operator's, or in tests).
    pub async fn connect(path: impl AsRef<Path>) -> std::io::Result<GateClient> {
        let client = Client::connect_unix(path).await?;
        Ok(GateClient::attach(&client).await?)
    }

    /// Attaches on an existing connection (e.g. the socketpair end the supervisor handed over).
    pub async fn attach(client: &Client) -> Result<GateClient, Errno> {
        let root = client.attach("toolfs", "").await?;
        Ok(GateClient {
            root,
            decide_pool: Mutex::new(Vec::new()),
        })
    }

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

    /// Asks the gate about one call. `canonical_args` are the exact RFC 8785 bytes the worker
    /// will get. An `ask` answer carries the pending id to [`GateClient::wait`] on.
    pub async fn decide(
        &self,
        session: &str,
        tool: &str,
        canonical_args: &[u8],
        context: &[ContextState],
    ) -> Answer {
        self.decide_in(session, tool, canonical_args, context, None, None)
            .await
    }

    /// [`GateClient::decide`] for a namespace whose lineage (nsd's, serialised once) comes along.
    pub async fn decide_in(
        &self,
        session: &str,
        tool: &str,
        canonical_args: &[u8],
        context: &[ContextState],
        lineage: Option<&serde_json::value::RawValue>,
        tier: Option<crate::policy::tier::Tier>,
    ) -> Answer {
        let body = match crate::request::encode_in(
            session,
            tool,
            canonical_args,
            context,
            lineage,
            tier,
        ) {
            Ok(b) => b,
            Err(e) => return unavailable(e),
        };
        let fid = match self.decide_fid().await {
            Ok(f) => f,
            Err(e) => return unavailable(format!("open decide: {e}")),
        };
        let result = match crate::rpc::call(&fid, &body).await {
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

    /// Waits for ask `pending_id` to be closed; the outcome is `allow` or `deny`. Call it again
    /// (on a new connection) after a reconnect: the ask survives both sides restarting, within
    /// the gate's orphan grace.
    pub async fn wait(&self, pending_id: i64) -> Answer {
        let result = async {
            let fid = self
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

    /// Withdraws an ask whose caller went away: it is orphaned (denied) and can no longer be answered.
    pub async fn withdraw(&self, pending_id: i64) -> Result<(), Errno> {
        let fid = self
            .root
            .walk(&["pending", &pending_id.to_string(), "ctl"])
            .await?;
        fid.open(oflags::WRONLY).await?;
        fid.write(0, b"withdraw").await.map(drop)
    }
}
