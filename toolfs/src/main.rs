//! `warren-toolfs`: serves `/tool` on the operator socket `<runtime>/tool.sock` and on every
//! connection a trusted peer hands over on `<runtime>/toolfs.ctl`. The contract is
//! `specs/tool-tree.md`.

// The daemons on a call's path allocate per request; mimalloc: docs/decisions.md D11 "Allocator".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use warren_daemon::Dirs;
use warren_proto::gate::GateClient;
use warren_toolfs::catalog::Catalog;
use warren_toolfs::control::Server;
use warren_toolfs::echo::EchoJournal;
use warren_toolfs::effects::Receipts;
use warren_toolfs::gate;
use warren_toolfs::services::Services;
use warren_toolfs::tree::TreeLimits;
use warren_toolfs::worker::nsd::{NSD_WORKER_CONTROL, WorkerBuilder};

#[derive(Parser, Debug)]
#[command(name = "warren-toolfs", about = "warren's /tool server (9P2000.L)")]
struct Args {
    /// Where the sockets live (default: $WARREN_RUNTIME_DIR, else /run/warren).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// Call files open (or running) at once per session (operator: per connection); one more
    /// open gets EAGAIN.
    #[arg(long, default_value_t = TreeLimits::default().max_open_calls)]
    max_open_calls: usize,
    /// Argument bytes per call; a write past it gets EFBIG.
    #[arg(long, default_value_t = TreeLimits::default().max_arg_bytes)]
    max_arg_bytes: usize,
    /// Runtime threads serving 9P (1: a single-threaded runtime, which keeps a call's hops on
    /// one CPU; more: a work-stealing pool).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// nsd's worker socket, where every tool worker is built (default:
    /// <runtime>/nsd-workers.ctl). There is no other way to get a worker: without nsd, calls of
    /// worker tools are refused.
    #[arg(long)]
    nsd_workers: Option<PathBuf>,
    /// Append a line per echo start and end to this file (a test knob: it shows whether a call ran).
    #[arg(long)]
    echo_journal: Option<PathBuf>,
}

/// The control socket is for root alone: 0600. When the supervisor bound it (root-owned, already
/// 0600) there is nothing to do; if its mode is wider and cannot be narrowed, toolfs says so and
/// goes on, since the peer check refuses every non-root peer anyway.
fn restrict_control_socket(path: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let wide = std::fs::metadata(path)
        .map(|m| m.mode() & 0o077 != 0)
        .unwrap_or(true);
    if wide && let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!(
            "cannot make {} 0600 ({e}); non-root peers are still refused",
            path.display()
        );
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    warren_daemon::init_tracing("toolfs");
    warren_daemon::harden()?;
    // Taken first, before anything else opens fds; a bad value stops toolfs (the supervisor
    // named an fd that is not its handover) rather than run without the gate it meant to give.
    let gate_fd = gate::take_inherited_fd()?;
    let runtime_dir = args.runtime_dir.unwrap_or_else(|| Dirs::from_env().runtime);
    let dirs = Dirs {
        runtime: runtime_dir,
        ..Dirs::from_env()
    };
    let catalog = Catalog::builtin().map_err(anyhow::Error::msg)?;
    let journal = match &args.echo_journal {
        Some(p) => EchoJournal::open(p)?,
        None => EchoJournal::default(),
    };
    let runtime = match args.threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    let result = runtime.block_on(async move {
        let gate = GateClient::inherited(gate_fd).await;
        let workers = WorkerBuilder::new(
            args.nsd_workers
                .clone()
                .unwrap_or_else(|| dirs.control(NSD_WORKER_CONTROL)),
        );
        let services = Services::new(
            gate,
            Receipts::start(dirs.socket("receipts")),
            journal,
            workers,
        );
        let server = Arc::new(Server::new(
            catalog,
            TreeLimits {
                max_open_calls: args.max_open_calls,
                max_arg_bytes: args.max_arg_bytes,
            },
            warren_9p::Limits::default(),
            services,
        ));
        let operator = warren_daemon::operator::listen(&dirs.socket("tool"))?;
        let ctl_path = dirs.control("toolfs");
        let control = warren_daemon::operator::listen(&ctl_path)?;
        restrict_control_socket(&ctl_path);
        tracing::info!(runtime = %dirs.runtime.display(), "toolfs ready");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            () = server.clone().serve_operator(operator) => {}
            () = server.clone().serve_control(control) => {}
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        // Receipts still queued are written before toolfs goes (for a bounded time).
        server.drain_receipts().await;
        tracing::info!(target: "warren_toolfs::hops", "{}", server.services.hops.summary());
        anyhow::Ok(())
    });
    // Dropping the connections' tasks drops their trees, which kills and reaps their workers.
    // Control connections block in a thread on their next record: they are not waited for.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}
