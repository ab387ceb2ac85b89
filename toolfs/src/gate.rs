//! toolfs's side of the gate: the one long-lived connection the supervisor handed over
//! (`WARREN_GATE_FD`), on which every call is decided before anything runs.
//!
//! Fail closed: with no gate fd every call is denied; once the connection dies every later
//! decide fails and is a deny (`gate_unavailable: …`). toolfs never reconnects: the other end
//! was the gate's control socket's handover, and the supervisor restarts toolfs after it
//! restarts the gate.

use std::os::fd::OwnedFd;

use warren_gate::policy::{ContextState, Verdict};
use warren_gate::{Answer, GateClient};

/// The inherited, connected Unix stream socket whose other end the gate serves.
pub const GATE_FD_ENV: &str = "WARREN_GATE_FD";

/// How long a decide may take: longer than the gate's own receiptd connect and append timeouts
/// (2 s + 10 s), after which the gate itself denies.
const DECIDE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a call is told when toolfs has no gate.
pub const NO_GATE: &str = "no gate: every call is denied";

pub struct GateLink {
    client: Option<GateClient>,
}

/// Takes the fd named by `WARREN_GATE_FD`, if the variable is set: it must be an open socket.
/// It is made close-on-exec so no worker inherits it. Call before any other fd is opened.
pub fn take_inherited_fd() -> std::io::Result<Option<OwnedFd>> {
    let Some(value) = std::env::var_os(GATE_FD_ENV) else {
        return Ok(None);
    };
    let fd: i32 = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| std::io::Error::other(format!("{GATE_FD_ENV}={value:?} is not an fd")))?;
    let st = warren_jail::inherited::inspect(fd, |fd| nix::sys::stat::fstat(fd))
        .and_then(|st| st.map_err(std::io::Error::from))
        .map_err(|e| std::io::Error::other(format!("{GATE_FD_ENV}={fd}: {e}")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(std::io::Error::other(format!(
            "{GATE_FD_ENV}={fd} is not a socket"
        )));
    }
    // The supervisor handed this fd to us alone (close-on-exec once taken).
    Ok(Some(warren_jail::inherited::take(fd)?))
}

impl GateLink {
    /// No gate: every call is denied.
    pub fn none() -> GateLink {
        GateLink { client: None }
    }

    /// Speaks 9P on the handed-over socket and attaches to the gate. A failure is logged and
    /// leaves toolfs without a gate (every call denied).
    /// The link over the supervisor's handed-over connection ([`take_inherited_fd`]), or, with
    /// none, no gate (every call denied) and a warning saying so.
    pub async fn inherited(fd: Option<OwnedFd>) -> GateLink {
        match fd {
            Some(fd) => GateLink::attach(fd).await,
            None => {
                tracing::warn!("{GATE_FD_ENV} is not set: {NO_GATE}");
                GateLink::none()
            }
        }
    }

    pub async fn attach(fd: OwnedFd) -> GateLink {
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
        match attached {
            Ok(client) => GateLink {
                client: Some(client),
            },
            Err(e) => {
                tracing::error!(
                    "cannot attach to the gate on {GATE_FD_ENV}: {e}; every call is denied"
                );
                GateLink::none()
            }
        }
    }

    pub async fn decide(
        &self,
        session: &str,
        tool: &str,
        canonical_args: &[u8],
        context: &[ContextState],
        lineage: Option<&serde_json::value::RawValue>,
    ) -> Answer {
        self.decide_at(session, tool, canonical_args, context, lineage, None)
            .await
    }

    /// [`GateLink::decide`] naming the tool's tier (an MCP server's tool: the tier its
    /// operator-written definition gives it; only mcpfs's connection may name one).
    pub async fn decide_at(
        &self,
        session: &str,
        tool: &str,
        canonical_args: &[u8],
        context: &[ContextState],
        lineage: Option<&serde_json::value::RawValue>,
        tier: Option<warren_gate::policy::tier::Tier>,
    ) -> Answer {
        let Some(c) = &self.client else {
            return no_gate();
        };
        // A gate that stops answering is a gate that is not there. (An ask is answered at once
        // with its pending id; only `wait` blocks for a person.)
        tokio::time::timeout(
            DECIDE_TIMEOUT,
            c.decide_in(session, tool, canonical_args, context, lineage, tier),
        )
        .await
        .unwrap_or_else(|_| {
            warren_gate::client::unavailable(format!(
                "no answer to decide within {} s",
                DECIDE_TIMEOUT.as_secs()
            ))
        })
    }

    /// Blocks until ask `pending` is answered; anything but a definite allow or deny is a deny.
    pub async fn wait(&self, pending: i64) -> Answer {
        match &self.client {
            Some(c) => c.wait(pending).await,
            None => no_gate(),
        }
    }

    pub async fn withdraw(&self, pending: i64) {
        if let Some(c) = &self.client
            && let Err(e) = c.withdraw(pending).await
        {
            tracing::warn!(pending, "cannot withdraw the ask: {e}; it will be orphaned");
        }
    }
}

fn no_gate() -> Answer {
    Answer {
        decision: Verdict::Deny,
        pending: None,
        basis: NO_GATE.into(),
        fingerprint: String::new(),
        tier: String::new(),
        risk: None,
        receipt: None,
    }
}
