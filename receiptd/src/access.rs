//! Who may append which kind, and what is refused with which error.

use crate::receipt::Kind;

/// Who is on a connection, from its peer credentials (never from anything the peer sent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The gate's uid: the only appender of `decision` receipts.
    Gate,
    /// toolfs's uid: an appender of `effect` receipts (warren's own tools' calls).
    Toolfs,
    /// mcpfs's uid: an appender of `effect` receipts (MCP servers' tools' calls).
    Mcpfs,
    /// llmfs's uid: an appender of `query` receipts (model calls), in the scopes of the
    /// namespaces it serves.
    Llmfs,
    /// The egress proxy's uid: an appender of `effect` receipts (each proxied connection).
    Netproxy,
    /// Anyone else the operator socket let in (root or the `warren` group), with its uid.
    Operator(u32),
    /// receiptd itself: `boot` and `checkpoint` receipts.
    Receiptd,
    /// A read-only view of one scope handed over on the control socket (a peer host reading its
    /// own session's receipts): appends nothing.
    Reader,
}

/// The uids of the daemons whose connections are not an operator's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DaemonUids {
    pub gate: Option<u32>,
    pub toolfs: Option<u32>,
    pub mcpfs: Option<u32>,
    pub llmfs: Option<u32>,
    pub netproxy: Option<u32>,
}

impl Role {
    pub fn from_uid(uid: u32, daemons: &DaemonUids) -> Role {
        if Some(uid) == daemons.gate {
            Role::Gate
        } else if Some(uid) == daemons.toolfs {
            Role::Toolfs
        } else if Some(uid) == daemons.mcpfs {
            Role::Mcpfs
        } else if Some(uid) == daemons.llmfs {
            Role::Llmfs
        } else if Some(uid) == daemons.netproxy {
            Role::Netproxy
        } else {
            Role::Operator(uid)
        }
    }

    /// The `appender` recorded in the body.
    pub fn appender(self) -> String {
        match self {
            Role::Gate => "gate".into(),
            Role::Toolfs => "toolfs".into(),
            Role::Mcpfs => "mcpfs".into(),
            Role::Llmfs => "llmfs".into(),
            Role::Netproxy => "netproxy".into(),
            Role::Operator(uid) => format!("operator:{uid}"),
            Role::Receiptd => "receiptd".into(),
            Role::Reader => "reader".into(),
        }
    }

    /// Whether this connection may charge a receipt to a namespace subtree's budgets: only the
    /// daemons that got the namespace's lineage from nsd (anyone else could spend another
    /// namespace's budget by naming it).
    pub fn may_charge_budgets(self) -> Result<(), AppendError> {
        match self {
            Role::Gate | Role::Toolfs | Role::Mcpfs | Role::Llmfs => Ok(()),
            _ => Err(AppendError::Forbidden(format!(
                "budgets are named only by the gate, toolfs, mcpfs and llmfs; this connection is {}",
                self.appender()
            ))),
        }
    }

    pub fn may_append(self, kind: Kind) -> Result<(), AppendError> {
        if self == Role::Reader {
            return Err(AppendError::Forbidden(
                "a read-only view appends nothing".into(),
            ));
        }
        let allowed = match kind {
            Kind::Decision => self == Role::Gate,
            Kind::Effect => matches!(self, Role::Toolfs | Role::Mcpfs | Role::Netproxy),
            Kind::Boot | Kind::Checkpoint => self == Role::Receiptd,
            Kind::Query | Kind::Cap | Kind::Conflict | Kind::Withdrawn => true,
            // Only an operator accepts a definition: never a daemon on a call's path.
            Kind::Accept => matches!(self, Role::Operator(_)),
            // nsd (root) records its namespaces' calls to peers; no daemon on a call's path.
            Kind::Remote => self == Role::Operator(0),
        };
        if allowed {
            Ok(())
        } else {
            let who = match kind {
                Kind::Decision => "the gate's uid",
                Kind::Effect => "toolfs's, mcpfs's or netproxy's uid",
                Kind::Accept => "an operator",
                Kind::Remote => "nsd (root)",
                _ => "receiptd itself",
            };
            Err(AppendError::Forbidden(format!(
                "{kind} receipts are taken only from {who}; this connection is {}",
                self.appender()
            )))
        }
    }
}

/// Why an append was refused. Every refusal is an error the caller sees (callers deny); nothing
/// is written in part.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("refused: {0}")]
    Forbidden(String),
    #[error("no usable signer: {0}; appends are refused")]
    NoSigner(String),
    #[error("free-space floor: {0}; appends are refused")]
    Floor(String),
    #[error("rate limit: {0}")]
    RateLimited(String),
    /// The namespace subtree the receipt is charged to is over one of its budgets.
    #[error("{code}: {1}", code = .0.code())]
    Budget(crate::budget::Over, String),
    #[error("storage: {0}")]
    Storage(String),
}

impl AppendError {
    /// The errno a 9P caller gets (the message is readable from the same fid).
    pub fn errno(&self) -> i32 {
        match self {
            AppendError::Invalid(_) => libc::EINVAL,
            AppendError::Forbidden(_) => libc::EACCES,
            AppendError::NoSigner(_) => libc::EKEYREJECTED,
            AppendError::Floor(_) => libc::ENOSPC,
            AppendError::RateLimited(_) => libc::EAGAIN,
            AppendError::Budget(..) => libc::EDQUOT,
            AppendError::Storage(_) => libc::EIO,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            AppendError::Invalid(_) => "invalid",
            AppendError::Forbidden(_) => "forbidden",
            AppendError::NoSigner(_) => "no_signer",
            AppendError::Floor(_) => "free_space_floor",
            AppendError::RateLimited(_) => "rate_limited",
            AppendError::Budget(over, _) => over.code(),
            AppendError::Storage(_) => "storage",
        }
    }
}
