//! warren-exportfs: serves this host's trees to the peers in the peers file (docs/distribution.md).
//! Started as root: it reads the host key and binds, then drops to its own uid.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use warren_daemon::identity::Role;
use warren_exportfs::{control, keys, peers, server};

#[derive(Parser)]
#[command(
    name = "warren-exportfs",
    about = "serve this host's trees to its peers"
)]
struct Cli {
    /// Where to listen: tcp!ADDR!PORT.
    #[arg(long)]
    listen: String,
    /// A connection that has not authenticated by then is dropped.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    auth_deadline: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    warren_daemon::init_tracing("exportfs");
    if let Err(e) = warren_daemon::harden() {
        eprintln!("warren-exportfs: harden: {e}");
        return ExitCode::from(1);
    }
    let dirs = warren_daemon::Dirs::from_env();
    let key = match keys::HostKey::load(&keys::host_key_path(&dirs.secrets)) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("warren-exportfs: {e}");
            return ExitCode::from(1);
        }
    };
    let peers_path = peers::peers_path();
    if let Err(e) = peers::Peers::load(&peers_path) {
        eprintln!("warren-exportfs: {e}");
        return ExitCode::from(1);
    }
    let listener = match server::listen(&cli.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("warren-exportfs: listen {}: {e}", cli.listen);
            return ExitCode::from(1);
        }
    };
    if nix::unistd::geteuid().is_root() {
        let uid = Role::Exportfs.uid();
        let operators = warren_daemon::operator::OperatorPolicy::from_host().operator_gid;
        if let Err(e) = warren_jail::privilege::drop_to(
            &warren_jail::privilege::Identity::new(uid, uid).with_groups(operators),
        ) {
            eprintln!("warren-exportfs: drop to uid {uid}: {e}");
            return ExitCode::from(1);
        }
    }
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        "serving as {} ({}) on {local}",
        key.public(),
        key.public().fingerprint()
    );
    // The test harness and the operator read the bound address from stdout's first line.
    println!("listening {local}");
    // Directories granted as trees are served on this runtime (the links run on threads).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warren-exportfs: runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let backend = Arc::new(control::NsdBackend {
        socket: dirs.control(control::CONTROL),
        runtime: runtime.handle().clone(),
    });
    server::serve(
        listener,
        server::Config {
            key,
            peers: peers_path,
            auth_deadline: cli.auth_deadline,
            recheck: server::RECHECK,
            backend,
        },
    );
    ExitCode::SUCCESS
}
