//! `warren-netproxy`: serves proxy sessions on the listeners named on the command line, one
//! session (one policy, one cache of allows) per listener.

// Bulk tunnels allocate little, but the accept path does per connection; as the other daemons.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use warren_netproxy::{Policy, Records, Resolver, Session};

#[derive(Parser, Debug)]
#[command(
    name = "warren-netproxy",
    about = "warren's egress proxy: HTTP CONNECT, plain HTTP and SOCKS5 to listed hosts only"
)]
struct Args {
    /// Where to listen: `tcp:ADDR:PORT` or `unix:PATH` (repeatable). Each line printed as
    /// `listening <kind>:<address>` on stdout once bound (port 0 shows the port chosen).
    #[arg(long = "listen", required_unless_present = "control")]
    listen: Vec<String>,
    /// Serve `<runtime>/netproxy.ctl` (root peers only): nsd hands over each `net proxy`
    /// namespace's listener with its policy; the gate (`WARREN_GATE_FD`) decides each
    /// destination's first use and every connection becomes an `effect` receipt. How
    /// `warren-supervisor` runs it.
    #[arg(long, conflicts_with_all = ["listen", "allow", "policy", "session"])]
    control: bool,
    /// An allowed destination, `HOST[:PORT][=ADDR,…]` (repeatable; see docs/network.md).
    #[arg(long = "allow")]
    allow: Vec<String>,
    /// A file of allowed destinations, one pattern per line, `#` comments.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// A hosts file (/etc/hosts format) answering for the names it lists, before the host's
    /// resolver (under the supervisor: `WARREN_NETPROXY_HOSTS`, for tests).
    #[arg(long, env = "WARREN_NETPROXY_HOSTS")]
    hosts: Option<PathBuf>,
    /// A DNS server, `IP:PORT`, asked instead of the host's resolver (repeatable; under the
    /// supervisor: `WARREN_NETPROXY_DNS`, comma-separated).
    #[arg(long, env = "WARREN_NETPROXY_DNS", value_delimiter = ',')]
    dns: Vec<std::net::SocketAddr>,
    /// Where connection records go: a file (appended) or `-` for stdout.
    #[arg(long, default_value = "-")]
    records: String,
    /// The session name put in records.
    #[arg(long)]
    session: Option<String>,
    /// Client connections served at once per listener; the next accept waits for one to end.
    #[arg(long, default_value_t = warren_netproxy::Limits::default().max_connections)]
    max_connections: usize,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    warren_daemon::init_tracing("netproxy");
    warren_daemon::harden()?;
    if args.control {
        return control(args);
    }
    let mut policy =
        Policy::parse(args.allow.iter().map(String::as_str)).map_err(anyhow::Error::msg)?;
    if let Some(path) = &args.policy {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        policy.patterns.extend(
            Policy::parse_file(&text)
                .map_err(anyhow::Error::msg)?
                .patterns,
        );
    }
    let (resolver, records) = (resolver(&args)?, records(&args)?);
    if policy.patterns.is_empty() {
        tracing::warn!("no --allow and no --policy: every destination is refused");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut listeners = Vec::new();
        let mut bound = String::new();
        for spec in &args.listen {
            let listener = if let Some(addr) = spec.strip_prefix("tcp:") {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {spec}: {e}"))?;
                bound.push_str(&format!("listening tcp:{}\n", l.local_addr()?));
                Listener::Tcp(l)
            } else if let Some(path) = spec.strip_prefix("unix:") {
                let l = tokio::net::UnixListener::bind(path)
                    .map_err(|e| anyhow::anyhow!("cannot listen on {spec}: {e}"))?;
                bound.push_str(&format!("listening unix:{path}\n"));
                Listener::Unix(l)
            } else {
                anyhow::bail!("--listen {spec}: expected tcp:ADDR:PORT or unix:PATH");
            };
            listeners.push(listener);
        }
        // Every listener is bound before any is announced, in one write; a reader that has gone
        // away (a closed stdout) is no reason to stop serving.
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(bound.as_bytes()).and_then(|()| out.flush()) {
                tracing::warn!("cannot announce the listeners on stdout: {e}");
            }
        }
        tracing::info!(patterns = policy.patterns.len(), "netproxy ready");
        let mut tasks = tokio::task::JoinSet::new();
        for listener in listeners {
            let limits = warren_netproxy::Limits {
                max_connections: args.max_connections,
                ..Default::default()
            };
            let session = Arc::new(
                Session::new(
                    args.session.clone().unwrap_or_else(|| "netproxy".into()),
                    policy.clone(),
                    resolver.clone(),
                    records.clone(),
                )
                .with_limits(limits),
            );
            match listener {
                Listener::Tcp(l) => tasks.spawn(session.serve_tcp(l)),
                Listener::Unix(l) => tasks.spawn(session.serve_unix(l)),
            };
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tasks.join_next() => tracing::error!("a listener stopped"),
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        anyhow::Ok(())
    })?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}

/// The resolver `--hosts` and `--dns` say.
fn resolver(args: &Args) -> anyhow::Result<Resolver> {
    let resolver = match &args.hosts {
        Some(path) => Resolver::from_hosts_file(path).map_err(anyhow::Error::msg)?,
        None => Resolver::system(),
    };
    resolver.with_dns(&args.dns).map_err(anyhow::Error::msg)
}

/// Where `--records` says records go.
fn records(args: &Args) -> anyhow::Result<Records> {
    Ok(match args.records.as_str() {
        "-" => Records::stdout(),
        path => Records::file(std::path::Path::new(path))?,
    })
}

/// `--control`: the daemon `warren-supervisor` runs (see [`warren_netproxy::grant`]).
fn control(args: Args) -> anyhow::Result<()> {
    use warren_proto::gate::GateClient;
    use warren_toolfs::gate;
    let gate_fd = gate::take_inherited_fd()?;
    let dirs = warren_daemon::Dirs::from_env();
    let (resolver, records) = (resolver(&args)?, records(&args)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let gate = GateClient::inherited(gate_fd).await;
        let receipts = Arc::new(warren_toolfs::effects::Receipts::start(
            dirs.socket("receipts"),
        ));
        let grants = Arc::new(warren_netproxy::grant::Grants {
            resolver,
            gate: Some(Arc::new(gate)),
            receipts: Some(receipts.clone()),
            records,
        });
        let listener =
            warren_daemon::operator::listen(&dirs.control(warren_netproxy::grant::CONTROL))?;
        tracing::info!(runtime = %dirs.runtime.display(), "netproxy ready");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            () = grants.serve_control(listener) => {}
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        let unwritten = receipts.drain(std::time::Duration::from_secs(5)).await;
        if unwritten > 0 {
            tracing::error!(unwritten, "stopping with receipts not written");
        }
        anyhow::Ok(())
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}
