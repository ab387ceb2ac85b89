//! The uid each warren process runs under.
//!
//! Each daemon has its own uid so that a bug in one cannot spend another's authority. They are
//! numeric uids with no passwd entries (nothing on the host needs to know them), allocated from
//! `WARREN_UID_BASE` (default 61000): see docs/decisions.md.

/// A daemon (or worker class) that runs under a uid of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Toolfs,
    Receiptd,
    Gate,
    /// Tool workers of a root operator (a non-root operator's workers run as the operator).
    Worker,
    /// The bridges, once they hold their FUSE fd.
    Bridge,
    /// mcpfs: the client of every MCP server (never the servers themselves: each runs in a
    /// namespace of its own).
    Mcpfs,
    /// llmfs: holds the model's API key and speaks to the model's backend.
    Llmfs,
    /// exportfs: this host's trees served to its peers over TCP (it holds the host key's
    /// handshake, never a grant: nsd makes each peer's connection).
    Exportfs,
    /// The egress proxy (`net proxy`): outside every namespace, the one that connects out.
    Netproxy,
}

pub const DEFAULT_UID_BASE: u32 = 61000;

impl Role {
    pub fn offset(self) -> u32 {
        match self {
            Role::Toolfs => 1,
            Role::Receiptd => 2,
            Role::Gate => 3,
            Role::Bridge => 4,
            Role::Mcpfs => 5,
            Role::Llmfs => 7,
            Role::Exportfs => 8,
            Role::Netproxy => 6,
            Role::Worker => 10,
        }
    }

    /// This role's uid (and gid: the same number).
    pub fn uid(self) -> u32 {
        uid_base() + self.offset()
    }
}

/// Whether `uid` is one of warren's own: a daemon's or its tool workers' (`uid_base()` up to
/// [`Role::Worker`]'s). A payload never runs as one: it would hold that daemon's authority.
pub fn is_warren_uid(uid: u32) -> bool {
    (uid_base()..=uid_base() + Role::Worker.offset()).contains(&uid)
}

/// Refuses `uid` as a payload's: root, or one of warren's own ([`is_warren_uid`]). `what`
/// names where the uid came from.
pub fn refuse_payload_uid(uid: u32, what: &str) -> Result<(), String> {
    if uid == 0 {
        return Err(format!(
            "{what} is owned by root, and an agent never runs as root: pass --uid N (and chown \
             the project to N), or run warren as the project's owner"
        ));
    }
    if is_warren_uid(uid) {
        return Err(format!(
            "{what}: uid {uid} is one of warren's own daemon uids ({}..={}), and an agent never \
             runs as one: pass --uid N of an account made for the agent",
            uid_base(),
            uid_base() + Role::Worker.offset()
        ));
    }
    Ok(())
}

/// `WARREN_UID_BASE`, else [`DEFAULT_UID_BASE`].
pub fn uid_base() -> u32 {
    std::env::var("WARREN_UID_BASE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|b: &u32| (1000..u32::MAX - 1000).contains(b))
        .unwrap_or(DEFAULT_UID_BASE)
}
