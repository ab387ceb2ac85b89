//! `warren`: the front door. Starts and stops the daemons, and speaks 9P to their operator
//! sockets so everything they serve can be read and written as files, with no FUSE needed. Its
//! commands are in `README.md`; how they run the system, in `docs/architecture.md` ("Operating
//! it").

mod agent;
mod approvals;
mod asks;
mod attach;
mod completions;
mod demo;
mod doctor;
mod down;
mod files;
mod keys;
mod log;
mod mcp;
mod mcp_serve;
mod namespaces;
mod ps;
mod receipts;
mod run;
mod sh;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "A capability-namespace microkernel for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Where the daemons' sockets are: the warren this command talks to (default /run/warren).
    #[arg(long, global = true, env = "WARREN_RUNTIME_DIR", value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// The daemons' databases (default /var/lib/warren); `warren up` passes it to them.
    #[arg(long, global = true, env = "WARREN_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The signing and host keys (default /etc/warren/secrets).
    #[arg(long, global = true, env = "WARREN_SECRETS_DIR", value_name = "DIR")]
    secrets_dir: Option<PathBuf>,
}

impl Cli {
    /// The directories from the global options (their environment variables are their
    /// defaults), else warren's defaults. An empty value counts as none, as in
    /// [`warren_daemon::Dirs::from_env`].
    fn dirs(&self) -> warren_daemon::Dirs {
        let pick = |given: &Option<PathBuf>, default: &str| {
            given
                .clone()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or_else(|| PathBuf::from(default))
        };
        warren_daemon::Dirs {
            runtime: pick(&self.runtime_dir, warren_daemon::dirs::DEFAULT_RUNTIME),
            data: pick(&self.data_dir, warren_daemon::dirs::DEFAULT_DATA),
            secrets: pick(&self.secrets_dir, warren_daemon::dirs::DEFAULT_SECRETS),
        }
    }
}

/// What a command says when no daemon answers where it looked: where that was, and the two ways
/// to reach a warren elsewhere or to start one. Only `warren up` starts daemons (and `warren
/// demo`, in a directory of its own): a command that started them itself could bring up a
/// second warren the operator never configured, its calls decided without their rules.
pub(crate) fn none_answers(what: &str, socket: &Path) -> String {
    format!(
        "no {what} answers at {}: start warren with `warren up`, or point at the running one \
         with --runtime-dir DIR (or WARREN_RUNTIME_DIR)",
        socket.display()
    )
}

#[derive(Subcommand)]
enum Command {
    /// Start the daemons in the background (returns once each answers 9P).
    Up,
    /// Stop the daemons. Refused while namespaces run (they are listed), unless --force.
    Down {
        /// Kill every running namespace through nsd first, then stop the daemons.
        #[arg(long)]
        force: bool,
    },
    /// Say whether the daemons are up, and which sockets answer.
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List a directory served by a daemon: `/tool`, `/tool/echo`, `/receipts` and so on.
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
    /// Run a command in a namespace of its own: only what is granted exists there. Its asks are
    /// answered on this terminal (once, session or deny); with no terminal they are denied.
    Run {
        /// Who answers the command's asks: `terminal` (this one; none: deny at once) or
        /// `operator` (leave them to `warren approvals`).
        #[arg(long, value_enum, default_value_t)]
        asks: asks::AsksMode,
        #[command(flatten)]
        args: warren_ns::cli::RunArgs,
    },
    /// Run warren's agent on a task in a namespace of its own: its tools are the spec's, its
    /// model is mounted at /mnt/llm; progress here, the final answer on stdout.
    Agent {
        /// Who answers the agent's asks: `terminal` or `operator` (as for `run`).
        #[arg(long, value_enum, default_value_t)]
        asks: asks::AsksMode,
        #[command(flatten)]
        args: agent::AgentArgs,
    },
    /// Receipts: export a scope's chain, or print the key registry.
    #[command(subcommand)]
    Receipts(ReceiptsCommand),
    /// Verify an exported receipt chain offline: exit 0 verified, 1 invalid, 2 usage, 3
    /// incomplete (it ends before --head or --size), 5 unknown key, 6 key used after its
    /// retirement. An export says nothing about entries after its last checkpoint: give --head
    /// or --size to require them.
    Verify {
        /// The export (`warren receipts export SCOPE > FILE`).
        file: std::path::PathBuf,
        /// The key registry (`warren receipts keys > FILE`); default: ask the running receiptd.
        #[arg(long)]
        keys: Option<std::path::PathBuf>,
        /// A signed checkpoint of the scope got elsewhere (`warren cat /receipts/SCOPE/head >
        /// FILE`): the export must reach it and agree with it.
        #[arg(long)]
        head: Option<std::path::PathBuf>,
        /// The export must hold at least this many entries.
        #[arg(long)]
        size: Option<u64>,
        /// With --head, for an export that ends before it: a consistency proof from the
        /// export's last checkpoint to the head (`warren cat
        /// /receipts/SCOPE/proof/consistency/M-N > FILE`), to tell a cut export from a
        /// different history.
        #[arg(long, requires = "head")]
        proof: Option<std::path::PathBuf>,
        /// SEQ:HASH — the entry at SEQ must have this hash and be under the checkpoint (--head's
        /// when given): the decision another host's `remote` receipt names (`{seq, hash}`),
        /// checked in the log that host read of its own session here (its `receipts` tree).
        #[arg(long)]
        entry: Option<String>,
    },
    /// Receipts in plain words, one line each (time, scope, seq, kind, tool, decision or
    /// effect and why, digest prefix), in clock order; `-f` follows new ones as they land.
    Log {
        /// A scope (a session id) or the start of one; every scope if none.
        scope: Option<String>,
        /// Keep printing receipts as they are appended.
        #[arg(short, long)]
        follow: bool,
        /// One JSON object per receipt.
        #[arg(long)]
        json: bool,
    },
    /// The live namespaces: id, status, uptime, mounts, granted tools, command.
    Ps {
        /// Ended namespaces too.
        #[arg(short, long)]
        all: bool,
        /// One JSON object per namespace.
        #[arg(long)]
        json: bool,
    },
    /// Print a namespace as a spec (env names only, never their values).
    Ns {
        /// The namespace's id, as `warren ps` shows it.
        id: u64,
    },
    /// A shell (or CMD) inside a live namespace, confined exactly as its command: its uid,
    /// Landlock, seccomp, no capabilities.
    Attach {
        /// The namespace's id, as `warren ps` shows it.
        id: u64,
        /// The command and its arguments (default /bin/sh).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// The operator's shell: the host (less warren's own directories) with the daemons' trees at
    /// /n/tool, /n/gate, /n/receipts, /n/ns. What it starts holds operator authority.
    Sh {
        /// A spec file whose lines are added (other servers: `mount unix!/PATH /n/NAME`).
        spec: Option<std::path::PathBuf>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff), or write one page per subcommand into DIR.
    Man {
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// The operator's MCP servers: define, check and accept their tools.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// This host's identity for serving and importing trees across hosts.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Serve this host's trees to the peers in $WARREN_CONFIG_DIR/peers (foreground).
    Export {
        /// Where to listen: tcp!ADDR!PORT (port 0: any free port, printed).
        #[arg(long)]
        listen: String,
        /// A connection that has not authenticated by then is dropped (e.g. 10s).
        #[arg(long)]
        auth_deadline: Option<String>,
    },
    /// What this host's kernel offers warren, and which weaker mode, if any, it would need.
    Doctor {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Make this host's Ed25519 key in the secrets dir (root, 0600).
    Init,
    /// Print this host's public key and its fingerprint.
    Show,
}

#[derive(Subcommand)]
enum McpCommand {
    /// The MCP servers defined in $WARREN_CONFIG_DIR/mcp (default /etc/warren/mcp).
    List,
    /// Define server NAME from a definition file (checked, then installed as
    /// $WARREN_CONFIG_DIR/mcp/NAME.toml); its tools are held until accepted.
    Add {
        name: String,
        definition: std::path::PathBuf,
        /// Replace an existing definition of the same name.
        #[arg(long)]
        replace: bool,
    },
    /// Start a server the way warren does (confined by its own spec) and list its tools:
    /// name, tier, whether its definition is accepted, TOOL@sha256:… (what `accept` takes),
    /// description. What it shows is recorded for `accept`.
    Check {
        name: String,
        /// Also print each tool's whole pinned definition (name, description, inputSchema,
        /// annotations: every byte its digest covers, escaped), not only the first line of
        /// its description.
        #[arg(long)]
        full: bool,
    },
    /// Pin tool definitions you were shown: each TOOL@sha256:… as `check` printed it, or for
    /// a bare TOOL (every tool when none is named) the digest `check` last showed. Refused,
    /// with nothing pinned, when the server now lists another definition.
    Accept { name: String, tools: Vec<String> },
    /// Serve a namespace's grant to an MCP client on stdin/stdout: built by nsd from the
    /// flags, the server runs inside it; its asks wait for `warren approvals`.
    Serve(mcp_serve::ServeArgs),
}

#[derive(Subcommand)]
enum ReceiptsCommand {
    /// Write a scope's chain and its covering signed checkpoint to standard output; the
    /// checkpoint is made now, so it covers every receipt so far.
    Export {
        /// The scope, or a prefix naming one scope (the 8 digits `warren log` prints).
        scope: String,
    },
    /// Write the public key registry to standard output.
    Keys,
}

fn main() -> ExitCode {
    // Every command that prints ends quietly when its reader goes away, as coreutils do.
    if let Err(e) = warren_jail::process::default_sigpipe() {
        eprintln!("warren: SIGPIPE: {e}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
    let dirs = cli.dirs();
    let result = match cli.command {
        Command::Up => warren_supervisor::up(&dirs),
        Command::Down { force } => {
            warren_supervisor::down_with(&dirs, force, down::settle_namespaces)
        }
        Command::Status { json } => warren_supervisor::status(&dirs, json),
        Command::Run { asks, args } => run::run(&dirs, &args, asks),
        Command::Agent { asks, args } => agent::agent(&dirs, &args, asks),
        Command::Demo => demo::demo(),
        Command::Approvals => approvals::approvals(&dirs),
        Command::Receipts(ReceiptsCommand::Export { scope }) => receipts::export(&dirs, &scope),
        Command::Receipts(ReceiptsCommand::Keys) => receipts::keys(&dirs),
        Command::Verify {
            file,
            keys,
            head,
            size,
            proof,
            entry,
        } => receipts::verify(
            &dirs,
            &file,
            keys.as_deref(),
            receipts::Require {
                head: head.as_deref(),
                size,
                proof: proof.as_deref(),
                entry: entry.as_deref(),
            },
        ),
        Command::Doctor { json } => doctor::doctor(&dirs, json),
        Command::Keys(KeysCommand::Init) => keys::init(&dirs),
        Command::Keys(KeysCommand::Show) => keys::show(&dirs),
        Command::Export {
            listen,
            auth_deadline,
        } => keys::export(&dirs, &listen, auth_deadline.as_deref()),
        Command::Mcp(McpCommand::List) => mcp::list(),
        Command::Mcp(McpCommand::Add {
            name,
            definition,
            replace,
        }) => mcp::add(&name, &definition, replace),
        Command::Mcp(McpCommand::Check { name, full }) => mcp::check(&dirs, &name, full),
        Command::Mcp(McpCommand::Accept { name, tools }) => mcp::accept(&dirs, &name, &tools),
        Command::Mcp(McpCommand::Serve(args)) => mcp_serve::serve(&dirs, &args),
        Command::Log {
            scope,
            follow,
            json,
        } => log::log(&dirs, scope.as_deref(), follow, json),
        Command::Ps { all, json } => ps::ps(&dirs, all, json),
        Command::Ns { id } => ps::ns(&dirs, id),
        Command::Attach { id, command } => attach::attach(&dirs, id, &command),
        Command::Sh { spec } => sh::sh(&dirs, spec.as_deref()),
        Command::Completions { shell } => completions::completions(Cli::command(), shell),
        Command::Man { dir } => completions::man(Cli::command(), dir.as_deref()),
        Command::Ls { path } => files::run(files::ls(&dirs, &path)),
        Command::Cat { path } => files::run(files::cat(&dirs, &path)),
        Command::Write { path, data } => files::run(files::write(&dirs, &path, data)),
        Command::Call { tool, json } => files::run(files::call(&dirs, &tool, &json)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // An error may quote what a server or a namespace said.
            eprintln!(
                "warren: {}",
                warren_daemon::escape::escaped_lines(&format!("{e:#}"))
            );
            ExitCode::from(1)
        }
    }
}
