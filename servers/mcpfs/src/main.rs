//! `warren-mcpfs`: serves each operator-defined MCP server as a tree of the `/tool` shape on
//! every connection nsd hands over on `<runtime>/mcpfs.ctl` with a grant naming the server
//! (`mount mcp:NAME PATH [TOOL…]`). The servers themselves run in namespaces of their own that
//! nsd builds (`<runtime>/nsd-mcp.ctl`); mcpfs holds only their sessions. `docs/mcp.md`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use warren_daemon::Dirs;
use warren_mcpfs::served::Servers;
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
#[command(
    name = "warren-mcpfs",
    about = "warren's MCP servers as 9P trees (9P2000.L)"
)]
struct Args {
    /// Where the sockets live (default: $WARREN_RUNTIME_DIR, else /run/warren).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// Where the servers are defined (default: $WARREN_CONFIG_DIR/mcp, else /etc/warren/mcp).
    #[arg(long)]
    config_dir: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // rmcp logs each message of a server at info: a hostile server would fill the log.
    warren_daemon::init_tracing_with("mcpfs", "info,rmcp=warn");
    warren_daemon::harden()?;
    let gate_fd = gate::take_inherited_fd()?;
    let runtime_dir = args.runtime_dir.unwrap_or_else(|| Dirs::from_env().runtime);
    let dirs = Dirs {
        runtime: runtime_dir,
        ..Dirs::from_env()
    };
    let config_dir = args
        .config_dir
        .unwrap_or_else(warren_mcpfs::config::config_dir);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let gate = GateClient::inherited(gate_fd).await;
        // MCP tools run in no worker: the builder is never asked.
        let services = Services::new(
            gate,
            Receipts::start(dirs.socket("receipts")),
            EchoJournal::default(),
            WorkerBuilder::new(dirs.control(NSD_WORKER_CONTROL)),
        );
        let servers = Servers::new(config_dir, dirs.control(warren_proto::launch::MCP_CONTROL));
        let server = Arc::new(Server::with_source(
            Arc::new(Catalog::from_defs(Vec::new()).map_err(anyhow::Error::msg)?),
            Arc::new(servers),
            TreeLimits::default(),
            warren_9p::Limits::default(),
            services,
        ));
        let ctl_path = dirs.control("mcpfs");
        let control = warren_daemon::operator::listen(&ctl_path)?;
        tracing::info!(runtime = %dirs.runtime.display(), "mcpfs ready");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            () = server.clone().serve_control(control) => {}
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        server.drain_receipts().await;
        anyhow::Ok(())
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}
