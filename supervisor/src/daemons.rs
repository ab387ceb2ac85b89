//! The daemons the supervisor runs: each one's binary, uid and sockets, in start
//! order.

use warren_daemon::identity::Role;

/// One daemon the supervisor runs.
pub(crate) struct Daemon {
    /// Its binary, next to `warren`, and the arguments it starts with.
    pub(crate) binary: &'static str,
    pub(crate) args: &'static [&'static str],
    /// Its name in logs and its data subdirectory.
    pub(crate) name: &'static str,
    /// The uid it runs under; `None` for nsd, which alone stays root (it builds namespaces).
    pub(crate) role: Option<Role>,
    /// Socket file names in the runtime dir, with their modes: `*.sock` are the operator's
    /// (0660, the operator group), `*.ctl` are for root peers only (0600).
    pub(crate) sockets: &'static [&'static str],
    /// Gets a connection to the gate made here (`WARREN_GATE_FD`), and so is restarted whenever
    /// the gate is.
    pub(crate) gate_client: bool,
}

impl Daemon {
    pub(crate) fn uid(&self) -> u32 {
        self.role.map_or(0, Role::uid)
    }
}

/// The daemons, in start order: receipts before anything that writes receipts, the gate before
/// the tools it decides for, nsd before toolfs (which gets its workers from nsd).
pub(crate) const DAEMONS: &[Daemon] = &[
    Daemon {
        binary: "warren-receiptd",
        args: &[],
        name: "receiptd",
        role: Some(Role::Receiptd),
        // receipts.ctl: nsd hands over one-scope views there (a peer's own receipts).
        sockets: &["receipts.sock", "receipts.ctl"],
        gate_client: false,
    },
    Daemon {
        binary: "warren-gate",
        args: &[],
        name: "gate",
        role: Some(Role::Gate),
        sockets: &["gate.sock", "gate.ctl"],
        gate_client: false,
    },
    Daemon {
        binary: "warren-nsd",
        args: &["serve"],
        name: "nsd",
        role: None,
        // ns.run: `warren run`'s launchers (warren_ns::launch; not 9P, so not `*.sock`).
        // nsd-workers.ctl: toolfs asks for its tool workers there (root and toolfs's group).
        // nsd-mcp.ctl: mcpfs has its MCP servers started there (root and mcpfs's group).
        // nsd-export.ctl: exportfs has its peers' trees made there (root and exportfs's group).
        sockets: &[
            "ns.sock",
            "ns.run",
            "nsd-workers.ctl",
            "nsd-mcp.ctl",
            "nsd-export.ctl",
        ],
        gate_client: false,
    },
    Daemon {
        binary: "warren-toolfs",
        args: &[],
        name: "toolfs",
        role: Some(Role::Toolfs),
        sockets: &["tool.sock", "toolfs.ctl"],
        // None: nsd builds every tool worker (on nsd-workers.ctl); toolfs never starts one.
        gate_client: true,
    },
    Daemon {
        binary: "warren-mcpfs",
        args: &[],
        name: "mcpfs",
        role: Some(Role::Mcpfs),
        sockets: &["mcpfs.ctl"],
        // None: nsd starts every MCP server (on nsd-mcp.ctl); mcpfs only speaks to them.
        gate_client: true,
    },
    Daemon {
        // The egress proxy: nsd hands it each `net proxy` namespace's listener on netproxy.ctl
        // (docs/network.md); `WARREN_NETPROXY_HOSTS`, if set, is its hosts file.
        binary: "warren-netproxy",
        args: &["--control"],
        name: "netproxy",
        role: Some(Role::Netproxy),
        sockets: &["netproxy.ctl"],
        gate_client: true,
    },
    Daemon {
        binary: "warren-llmfs",
        args: &[],
        name: "llmfs",
        role: Some(Role::Llmfs),
        // llm.sock: the operator's; llmfs.ctl: each namespace's `mount llm` connection (nsd).
        // Its backend comes from the environment `warren up` was given (WARREN_LLM_URL,
        // WARREN_LLM_API, WARREN_LLM_MODEL); its key file is opened here ([`llm_key_fd`]).
        sockets: &["llm.sock", "llmfs.ctl"],
        // Each namespace's model call is decided by the gate (as `llm`).
        gate_client: true,
    },
];

/// Whether `d`, answering, does its job: receiptd must hold a key to sign with, or it refuses
/// every append and so the gate denies every call ("receiptd is unavailable") while its socket
/// answers as if all were well. The others have nothing to ask beyond their sockets answering.
pub(crate) async fn works(dirs: &warren_daemon::Dirs, d: &Daemon) -> Result<(), String> {
    if d.name != "receiptd" {
        return Ok(());
    }
    // Bounded: a stopped receiptd must not hang `warren status`.
    let asked = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        warren_proto::receipts::signer(&dirs.socket("receipts")),
    )
    .await
    .unwrap_or_else(|_| Err("its `signer` file was not read within 2 s".into()));
    asked
        .map(drop)
        .map_err(|why| format!("cannot sign receipts, so every call is denied: {why}"))
}
