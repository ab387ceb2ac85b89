//! warren-nsd: `serve` serves `/ns` to the operator over 9P on `<runtime>/ns.sock` and builds
//! `warren run`'s namespaces for launchers on `<runtime>/ns.run` (`warren_ns::launch`); `run`
//! builds one namespace in this process from a spec and the convenience flags, runs a command in
//! it and exits with its status (standalone, for ns's own tests and benchmarks). The contract is
//! `specs/ns-tree.md`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use warren_ns::RunOptions;

#[derive(Parser)]
#[command(name = "warren-nsd", about = "warren's namespace daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve /ns on <runtime>/ns.sock (WARREN_RUNTIME_DIR, default /run/warren).
    Serve {
        /// Accept a Landlock ruleset that is not fully enforced. Weaker confinement.
        #[arg(long = "weaker-landlock")]
        weaker_landlock: bool,
    },
    /// Run CMD confined, building the namespace in this process (standalone; `warren run`
    /// asks a serving nsd instead).
    Run(Box<warren_ns::cli::RunArgs>),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve { weaker_landlock } => serve(weaker_landlock),
        Command::Run(args) => run_once(*args),
    }
}

fn serve(weaker_landlock: bool) -> ExitCode {
    warren_daemon::init_tracing("nsd");
    if let Err(e) = warren_daemon::harden() {
        eprintln!("warren-nsd: harden: {e}");
        return ExitCode::from(1);
    }
    if weaker_landlock {
        tracing::warn!("--weaker-landlock: namespaces may run without a fully enforced Landlock");
    }
    let dirs = warren_daemon::Dirs::from_env();
    let opts = RunOptions {
        weaker_landlock,
        protected: dirs.clone(),
        ..RunOptions::default()
    };
    let nsd = match warren_nsd::nsd::Nsd::new(opts) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("warren-nsd: {e}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warren-nsd: runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        let path = dirs.socket("ns");
        let listener = match warren_daemon::operator::listen(&path) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("warren-nsd: listen {}: {e}", path.display());
                return ExitCode::from(1);
            }
        };
        // Tool workers for toolfs: without this socket no worker tool can run.
        let scopes = std::sync::Arc::new(nsd.for_operator(0));
        match warren_nsd::worker::spawn_server(&dirs, weaker_landlock, scopes) {
            Ok(p) => tracing::info!("building tool workers on {}", p.display()),
            Err(e) => {
                eprintln!("warren-nsd: tool worker socket: {e}");
                return ExitCode::from(1);
            }
        }
        let run_path = warren_ns::launch::socket_path(&dirs);
        let run_listener = match warren_daemon::operator::listen(&run_path) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("warren-nsd: listen {}: {e}", run_path.display());
                return ExitCode::from(1);
            }
        };
        tracing::info!(
            "serving /ns on {}, runs on {}",
            path.display(),
            run_path.display()
        );
        // mcpfs's MCP servers: each started from the operator's definition, in its own namespace.
        let mcp_path = dirs.control(warren_ns::launch::MCP_CONTROL);
        match warren_daemon::operator::listen(&mcp_path) {
            Ok(l) => {
                tokio::spawn(warren_nsd::mcp_socket::accept_loop(
                    l,
                    nsd.for_operator(0),
                    warren_proto::mcp::config_dir(),
                    dirs.secrets.clone(),
                ));
            }
            Err(e) => {
                eprintln!("warren-nsd: listen {}: {e}", mcp_path.display());
                return ExitCode::from(1);
            }
        }
        // exportfs's peers: each authenticated peer's /tool, built from its peers entry.
        let export_path = dirs.control(warren_proto::export::CONTROL);
        match warren_daemon::operator::listen(&export_path) {
            Ok(l) => {
                tokio::spawn(warren_nsd::export_socket::accept_loop(
                    l,
                    dirs.clone(),
                    warren_proto::export::peers::peers_path(),
                ));
            }
            Err(e) => {
                eprintln!("warren-nsd: listen {}: {e}", export_path.display());
                return ExitCode::from(1);
            }
        }
        tokio::spawn(warren_nsd::run_socket::accept_loop(
            run_listener,
            warren_daemon::operator::OperatorPolicy::from_host(),
            nsd.for_operator(0),
            bridge_binary(),
        ));
        warren_daemon::operator::accept_loop(
            listener,
            warren_daemon::operator::OperatorPolicy::from_host(),
            move |peer| Some(std::sync::Arc::new(nsd.for_operator(peer.uid))),
            warren_9p::Limits::default(),
        )
        .await;
        ExitCode::SUCCESS
    })
}

/// `warren-bridge`: in WARREN_LIBEXEC_DIR, else next to this executable.
fn bridge_binary() -> std::path::PathBuf {
    let dir = std::env::var_os("WARREN_LIBEXEC_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(std::path::Path::to_path_buf))
        })
        .unwrap_or_default();
    dir.join("warren-bridge")
}

fn run_once(args: warren_ns::cli::RunArgs) -> ExitCode {
    // A profile's run (its uid, PATH and switches) goes through nsd: `warren run --profile`.
    if args.profile.is_some() || args.print_spec {
        eprintln!("warren-nsd run: --profile and --print-spec are warren run's");
        return ExitCode::from(2);
    }
    let spec = match args.spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let opts = args.options();
    ExitCode::from(warren_ns::cli::run_foreground(
        "warren-nsd",
        &spec,
        &args.command,
        &opts,
    ))
}
