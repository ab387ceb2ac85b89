//! `warren-gate`: serves `/gate` on the operator socket `<runtime>/gate.sock` and on every
//! connection a trusted peer hands over on `<runtime>/gate.ctl`; keeps `gate.db` in its data dir;
//! receipts every decision through receiptd. The contract is `specs/gate-tree.md`.

// The daemons on a call's path allocate per request; mimalloc: docs/decisions.md D11 "Allocator".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use warren_daemon::Dirs;
use warren_daemon::operator::{OperatorPolicy, accept_loop, listen};
use warren_gate::gate::{Config, Gate};
use warren_gate::receipts::ReceiptSink;
use warren_gate::scope::Scope;
use warren_gate::store::Store;
use warren_gate::tree::GateTree;

#[derive(Parser, Debug)]
#[command(
    name = "warren-gate",
    about = "warren's permission gate: serves /gate over 9P2000.L"
)]
struct Args {
    /// Where the sockets live (gate.sock, gate.ctl; receiptd's receipts.sock).
    #[arg(long, env = "WARREN_RUNTIME_DIR", default_value = warren_daemon::dirs::DEFAULT_RUNTIME)]
    runtime_dir: PathBuf,
    /// The gate's own data dir (gate.db, mode 0600).
    #[arg(long, env = "WARREN_DATA_DIR", default_value = warren_daemon::dirs::DEFAULT_DATA)]
    data_dir: PathBuf,
    /// receiptd's socket (default <runtime>/receipts.sock).
    #[arg(long)]
    receipts_socket: Option<PathBuf>,
    /// An ask nobody answers within this many milliseconds is denied (basis `expiry`).
    #[arg(long, env = "WARREN_GATE_ASK_TTL_MS", default_value_t = 600_000)]
    ask_ttl_ms: u64,
    /// Open asks per session; one more is denied (basis `ask_cap`).
    #[arg(long, default_value_t = 16)]
    max_open_asks: usize,
    /// Open asks per namespace subtree (a clone's count against every namespace above it) where
    /// no spec sets `limit asks=`; one more is denied (basis `budget:asks`).
    #[arg(long, default_value_t = warren_proto::lineage::DEFAULT_SUBTREE_ASKS)]
    subtree_asks: u64,
    /// An ask whose caller's connection closed is orphaned unless waited on again within this.
    #[arg(long, default_value_t = 30_000)]
    orphan_grace_ms: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    warren_daemon::init_tracing("gate");
    warren_daemon::harden()?;
    let dirs = Dirs {
        runtime: args.runtime_dir.clone(),
        data: args.data_dir.clone(),
        ..Dirs::from_env()
    };
    // Ours alone: no symlink, no other uid's, nobody else can write to it.
    warren_daemon::dirs::make_own_dir(&dirs.data)?;
    let store = Store::open_exclusive(&dirs.data.join("gate.db"))?;
    let receipts = ReceiptSink::new(
        args.receipts_socket
            .clone()
            .unwrap_or_else(|| dirs.socket("receipts")),
    );
    let cfg = Config {
        ask_ttl: Duration::from_millis(args.ask_ttl_ms),
        max_open_asks: args.max_open_asks,
        subtree_asks: args.subtree_asks,
        orphan_grace: Duration::from_millis(args.orphan_grace_ms),
    };
    // One thread: SQLite calls are short and the design budgets a current-thread runtime.
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async move {
        let gate = Gate::new(store, receipts, cfg);
        gate.start();
        let limits = warren_9p::Limits::default();
        let operator = listen(&dirs.socket("gate"))?;
        let ctl_path = dirs.control("gate");
        let control = listen(&ctl_path)?;
        // A socket the supervisor bound is already 0600 and root's; one we bound ourselves is
        // made 0600 here (root peers only reach it anyway: see control.rs).
        if std::fs::metadata(&ctl_path)?.permissions().mode() & 0o777 != 0o600 {
            std::fs::set_permissions(&ctl_path, std::fs::Permissions::from_mode(0o600))?;
        }
        tracing::info!(runtime = %dirs.runtime.display(), data = %dirs.data.display(), "gate ready");
        let op_gate = gate.clone();
        let make = move |peer: warren_daemon::peer::PeerCred| {
            let scope = Scope::Operator { confirmed_tty: false, label: format!("operator uid={}", peer.uid) };
            Some(Arc::new(GateTree::new(op_gate.clone(), scope)))
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            () = accept_loop(operator, OperatorPolicy::from_host(), make, limits.clone()) => {}
            () = warren_gate::control::serve_control(gate.clone(), control, limits) => {}
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        gate.flush_decisions();
        Ok(())
    })
}
