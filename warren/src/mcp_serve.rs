//! `warren mcp serve`: a namespace's grant served to an MCP client. nsd builds the namespace
//! from the flags exactly as for `warren run`, and runs `warren-mcp-server` inside it with this
//! process's stdin/stdout/stderr: the client speaks MCP straight to a program that can reach
//! only what the namespace holds. Its asks wait for the operator (`warren approvals`); stdin is
//! the client's, so nothing here answers them. With `--elicit`, nsd also mounts the namespace's
//! own asks on a capped gate channel, and the server offers a waiting `read`/`write` call's ask
//! to a client that declared elicitation (docs/mcp.md, "Asks offered to the client's user").

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use warren_daemon::Dirs;
use warren_ns::cli::RunArgs;
use warren_ns::launch::client::{LaunchOptions, launch};

/// The program that serves MCP inside the namespace; installed beside `warren`.
pub const SERVER: &str = "warren-mcp-server";

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// A namespace spec file.
    #[arg(long = "ns")]
    pub ns: Option<PathBuf>,
    /// Grant a built-in tool: served as NAME (repeat for more).
    #[arg(long = "tool")]
    pub tools: Vec<String>,
    /// Mount the operator's MCP server NAME (every accepted tool, or `NAME:TOOL,TOOL`): its
    /// tools are served as NAME__TOOL. Repeat for more servers.
    #[arg(long = "mcp", value_name = "NAME[:TOOL,…]")]
    pub mcp: Vec<String>,
    /// Serve streamable HTTP instead of stdio: `127.0.0.1:PORT` (`:0` picks one), `[::1]:PORT`
    /// or `unix:PATH`. The server (inside the namespace) mints a bearer token and prints it once
    /// on stderr; every request must carry it.
    #[arg(long, value_name = "ADDR:PORT|unix:PATH")]
    pub listen: Option<String>,
    /// Let --listen use this non-loopback address (exactly as given to --listen).
    #[arg(long = "allow-remote", value_name = "ADDR:PORT")]
    pub allow_remote: Vec<String>,
    /// With exactly one --mcp server and no built-in tools: serve its tools under their own
    /// names instead of NAME__TOOL (warren as a confining proxy for that one server).
    #[arg(long = "plain-names")]
    pub plain_names: bool,
    /// Accept a Landlock ruleset that is not fully enforced. Weaker confinement.
    #[arg(long = "weaker-landlock")]
    pub weaker_landlock: bool,
    /// Offer a waiting call's ask to the client's user (MCP elicitation, when the client
    /// declares it): an answer that way allows at most a `write`-tier call, once, and its
    /// receipt names the channel `mcp-client:<namespace id>`; `exec`, `network` and
    /// `destructive` calls stay with `warren approvals`. Not with --weaker-landlock: Landlock is
    /// what keeps an attached program from answering on that channel.
    #[arg(long, conflicts_with = "weaker_landlock")]
    pub elicit: bool,
}

/// The server binary beside this one.
fn server_path() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding warren's own path")?;
    let server = exe.with_file_name(SERVER);
    anyhow::ensure!(
        server.is_file(),
        "{} is missing: it is installed beside warren",
        server.display()
    );
    Ok(server)
}

/// `warren run`'s flags for these: the server binary bound read-only at its own path (so it
/// can run inside) and run there as the namespace's command.
fn run_args(args: &ServeArgs, server: &std::path::Path, remote: Option<&str>) -> RunArgs {
    let server = server.to_string_lossy().into_owned();
    let mut command = vec![server.clone()];
    if args.listen.is_some() {
        command.push("--http".into());
    }
    if args.plain_names {
        command.push("--plain-names".into());
    }
    if let Some(host) = remote {
        command.extend(["--allow-host".into(), host.to_string()]);
    }
    if args.elicit {
        command.extend([
            "--client-asks".into(),
            warren_proto::launch::CLIENT_ASKS_PATH.into(),
        ]);
    }
    RunArgs {
        ns: args.ns.clone(),
        tools: args.tools.clone(),
        mcp: args.mcp.clone(),
        imports: Vec::new(),
        net_proxy: Vec::new(),
        ro: vec![server.clone()],
        rw: Vec::new(),
        net: None,
        bare: false,
        weaker_landlock: args.weaker_landlock,
        uid: None,
        profile: None,
        cwd: None,
        print_spec: false,
        command,
    }
}

/// A listening socket made here, outside the namespace, by the operator's process; the server
/// inside gets it as stdin.
enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener, PathBuf),
}

impl Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l, _) => l.as_fd(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds `--listen`. A non-loopback address must be named by `--allow-remote` too. Returns the
/// listener and the host name requests must carry when it is remote.
fn bind(listen: &str, allow_remote: &[String]) -> Result<(Listener, Option<String>)> {
    if let Some(path) = listen.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        let listener = std::os::unix::net::UnixListener::bind(&path)
            .with_context(|| format!("binding {}", path.display()))?;
        // Only the operator's own uid may connect (the token is asked for as well).
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        eprintln!(
            "warren: mcp serve: listening on unix:{} (streamable HTTP, any path)",
            path.display()
        );
        return Ok((Listener::Unix(listener, path), None));
    }
    let addr: std::net::SocketAddr = listen.parse().with_context(|| {
        format!("--listen {listen}: not ADDR:PORT (127.0.0.1:8080, [::1]:8080) or unix:PATH")
    })?;
    let remote = !addr.ip().is_loopback();
    anyhow::ensure!(
        !remote || allow_remote.iter().any(|a| a == listen),
        "--listen {listen}: not a loopback address; name it with --allow-remote {listen} to \
         serve this namespace's grant to other hosts"
    );
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("binding {listen}"))?;
    let local = listener.local_addr()?;
    eprintln!("warren: mcp serve: listening on http://{local}/mcp (streamable HTTP)");
    Ok((
        Listener::Tcp(listener),
        remote.then(|| addr.ip().to_string()),
    ))
}

pub fn serve(dirs: &Dirs, args: &ServeArgs) -> Result<ExitCode> {
    let listener = match &args.listen {
        Some(listen) => Some(bind(listen, &args.allow_remote)?),
        None => None,
    };
    let remote = listener.as_ref().and_then(|(_, r)| r.as_deref());
    let run = run_args(args, &server_path()?, remote);
    let spec = match run.spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warren: mcp serve: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if let Err(status) = crate::run::require_nsd(dirs, "mcp serve") {
        return Ok(status);
    }
    if args.weaker_landlock {
        eprintln!(
            "warren: mcp serve: WARNING: --weaker-landlock: Landlock may not be fully enforced"
        );
    }
    // Never a pty: stdin and stdout carry JSON-RPC, byte for byte.
    let opts = LaunchOptions {
        pty: None,
        weaker_landlock: args.weaker_landlock,
        uid: None,
        bare: false,
        operator: false,
        client_asks: args.elicit,
        ..LaunchOptions::default()
    };
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    // Over HTTP the server's stdin is the listener and its stdout goes to our stderr.
    let stdio = match &listener {
        Some((l, _)) => [l.as_fd(), stderr.as_fd(), stderr.as_fd()],
        None => [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    };
    if let Some((Listener::Unix(_, path), _)) = &listener {
        remove_on_signal(path.clone())?;
    }
    let launched =
        launch(dirs, &spec, &run.command, &opts, stdio).context("starting the namespace")?;
    // If this process dies, its run socket closes and nsd ends the namespace.
    let status = launched.wait().context("waiting for the namespace")?;
    Ok(ExitCode::from(u8::try_from(status).unwrap_or(255)))
}

/// A Unix listener's socket file is removed when this process is told to stop (SIGTERM, SIGINT,
/// SIGHUP), not only on a clean exit: a file left behind would refuse the next `--listen` on
/// that path. Exiting closes the run socket, so nsd ends the namespace.
fn remove_on_signal(path: PathBuf) -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut stopping = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        stopping.add(signal);
    }
    stopping.thread_block().context("blocking signals")?;
    std::thread::spawn(move || {
        if let Ok(signal) = stopping.wait() {
            let _ = std::fs::remove_file(&path);
            std::process::exit(128 + signal as i32);
        }
    });
    Ok(())
}
