//! `warren`: the front door. Starts and stops the daemons, and speaks 9P to their operator
//! sockets so everything they serve can be read and written as files, with no FUSE needed.

mod approvals;
mod demo;
mod doctor;
mod files;
mod receipts;
mod run;
mod supervise;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "A capability-namespace microkernel for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the daemons in the background (returns once each answers 9P).
    Up,
    /// Stop the daemons.
    Down,
    /// Say whether the daemons are up, and which sockets answer.
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List a directory served by a daemon: `/tool`, `/tool/echo`, `/receipts`, …
    Ls {
        /// A path whose first element names the server.
        path: String,
    },
    /// Print a file served by a daemon.
    Cat {
        /// A path whose first element names the server.
        path: String,
    },
    /// Write DATA (else standard input) to a file served by a daemon, then print what a read of
    /// the same open returns, if anything (rpc-style files answer there).
    Write { path: String, data: Option<String> },
    /// Call a tool: write JSON arguments to /tool/TOOL/call and print the result envelope.
    /// Exit status: 0 ok, 1 the tool failed, 3 denied.
    Call {
        tool: String,
        /// The arguments, a JSON object.
        json: String,
    },
    /// The main job on its embedded default: daemons, a confined agent, an ask answered by a
    /// scripted operator, and the receipts verified. No config, no network.
    Demo,
    /// The live view of the gate's asks, answered from this terminal.
    Approvals,
    /// Run a command in a namespace of its own: only what is granted exists there.
    Run(warren_ns::cli::RunArgs),
    /// Receipts: export a scope's chain, or print the key registry.
    #[command(subcommand)]
    Receipts(ReceiptsCommand),
    /// Verify an exported receipt chain offline: exit 0 verified, 1 invalid, 2 usage, 5 unknown
    /// key, 6 key used after its retirement.
    Verify {
        /// The export (`warren receipts export SCOPE > FILE`).
        file: std::path::PathBuf,
        /// The key registry (`warren receipts keys > FILE`); default: ask the running receiptd.
        #[arg(long)]
        keys: Option<std::path::PathBuf>,
    },
    /// What this host's kernel offers warren, and which weaker mode, if any, it would need.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Run the daemons in the foreground and restart any that dies (what `up` starts).
    #[command(hide = true)]
    Supervise {
        /// The fd on which to say "ready" (or why not) once the daemons answer.
        #[arg(long)]
        ready_fd: Option<i32>,
    },
}

#[derive(Subcommand)]
enum ReceiptsCommand {
    /// Write a scope's chain and its covering signed checkpoint to standard output.
    Export { scope: String },
    /// Write the public key registry to standard output.
    Keys,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let dirs = warren_daemon::Dirs::from_env();
    let result = match cli.command {
        Command::Up => supervise::up(&dirs),
        Command::Down => supervise::down(&dirs),
        Command::Status { json } => supervise::status(&dirs, json),
        Command::Run(args) => run::run(&dirs, &args),
        Command::Demo => demo::demo(),
        Command::Approvals => approvals::approvals(&dirs),
        Command::Receipts(ReceiptsCommand::Export { scope }) => receipts::export(&dirs, &scope),
        Command::Receipts(ReceiptsCommand::Keys) => receipts::keys(&dirs),
        Command::Verify { file, keys } => receipts::verify(&dirs, &file, keys.as_deref()),
        Command::Doctor { json } => doctor::doctor(json),
        Command::Supervise { ready_fd } => supervise::supervise(&dirs, ready_fd),
        Command::Ls { path } => files::run(files::ls(&dirs, &path)),
        Command::Cat { path } => files::run(files::cat(&dirs, &path)),
        Command::Write { path, data } => files::run(files::write(&dirs, &path, data)),
        Command::Call { tool, json } => files::run(files::call(&dirs, &tool, &json)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warren: {e:#}");
            ExitCode::from(1)
        }
    }
}
