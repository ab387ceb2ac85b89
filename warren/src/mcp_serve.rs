//! `warren mcp serve`: a namespace's grant served to an MCP client. nsd builds the namespace
//! from the flags exactly as for `warren run`, and runs `warren-mcp-server` inside it with this
//! process's stdin/stdout/stderr: the client speaks MCP straight to a program that can reach
//! only what the namespace holds. Its asks wait for the operator (`warren approvals`); stdin is
//! the client's, so nothing here answers them.

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
    /// Accept a Landlock ruleset that is not fully enforced. Weaker confinement.
    #[arg(long = "weaker-landlock")]
    pub weaker_landlock: bool,
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
fn run_args(args: &ServeArgs, server: &std::path::Path) -> RunArgs {
    let server = server.to_string_lossy().into_owned();
    RunArgs {
        ns: args.ns.clone(),
        tools: args.tools.clone(),
        mcp: args.mcp.clone(),
        ro: vec![server.clone()],
        rw: Vec::new(),
        net: None,
        bare: false,
        weaker_landlock: args.weaker_landlock,
        uid: None,
        command: vec![server],
    }
}

pub fn serve(dirs: &Dirs, args: &ServeArgs) -> Result<ExitCode> {
    let run = run_args(args, &server_path()?);
    let spec = match run.spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warren: mcp serve: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if let Err(status) = crate::run::ensure_nsd(dirs, "mcp serve") {
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
    };
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let launched = launch(
        dirs,
        &spec,
        &run.command,
        &opts,
        [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .context("starting the namespace")?;
    // If this process dies, its run socket closes and nsd ends the namespace.
    let status = launched.wait().context("waiting for the namespace")?;
    Ok(ExitCode::from(u8::try_from(status).unwrap_or(255)))
}
