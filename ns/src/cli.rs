//! `warren run` (and `warren-nsd run`): the flags, and running a namespace in the foreground
//! with the launcher's signals forwarded and its terminal relayed through the namespace's pty.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::signal::{SigSet, Signal};

use crate::launch::client::{LaunchOptions, Launched, launch};
use crate::{CliGrants, RunOptions, Running, Spec, pty, spawn, spec_from_cli};

/// The flags of `warren run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// A namespace spec file.
    #[arg(long = "ns")]
    pub ns: Option<PathBuf>,
    /// Grant a tool: it appears under /tool (repeat for more).
    #[arg(long = "tool")]
    pub tools: Vec<String>,
    /// Mount the operator's MCP server NAME at /mnt/mcp/NAME: every tool the operator accepted,
    /// or only those listed (`NAME:TOOL,TOOL`). Repeat for more servers.
    #[arg(long = "mcp", value_name = "NAME[:TOOL,…]")]
    pub mcp: Vec<String>,
    /// Mount peer PEER's TREE (e.g. `tool`) at PATH, over the encrypted link to the address its
    /// peers entry names (`mount -k PEER tcp!HOST!PORT PATH TREE`). Repeat for more.
    #[arg(long = "import", value_name = "PEER:TREE:PATH")]
    pub imports: Vec<String>,
    /// Bind a host path read-only at the same path.
    #[arg(long = "ro")]
    pub ro: Vec<String>,
    /// Bind a host path read-write at the same path.
    #[arg(long = "rw")]
    pub rw: Vec<String>,
    /// `loopback` brings up lo in the namespace's own network namespace.
    #[arg(long = "net", value_parser = ["none", "loopback"])]
    pub net: Option<String>,
    /// Reach this destination through the egress proxy, `HOST[:PORT][=ADDR,…]` (repeat for
    /// more): `net proxy PATTERN…` (docs/network.md).
    #[arg(long = "net-proxy", value_name = "PATTERN", conflicts_with = "net")]
    pub net_proxy: Vec<String>,
    /// No default /usr, /bin, /lib, /lib64 and no host /etc files.
    #[arg(long)]
    pub bare: bool,
    /// Accept a Landlock ruleset that is not fully enforced. Weaker confinement.
    #[arg(long = "weaker-landlock")]
    pub weaker_landlock: bool,
    /// The payload's uid (default: a per-namespace uid from 200000 up).
    #[arg(long)]
    pub uid: Option<u32>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

impl RunArgs {
    /// The spec: the `--ns` file (if any) plus the convenience flags, through the one parser.
    pub fn spec(&self) -> Result<Spec, String> {
        let base = match &self.ns {
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
                Some(
                    crate::spec::parse_bytes(&path.display().to_string(), &bytes)
                        .map_err(|e| e.to_string())?,
                )
            }
            None => None,
        };
        let grants = CliGrants {
            tools: self.tools.clone(),
            mcp: self.mcp.clone(),
            ro: self.ro.clone(),
            rw: self.rw.clone(),
            net_loopback: self.net.as_deref() == Some("loopback"),
            imports: self.imports.clone(),
            net_proxy: self.net_proxy.clone(),
            bare: self.bare,
        };
        spec_from_cli(base.as_ref(), &grants).map_err(|e| e.to_string())
    }

    /// Run options from the flags (no mount server: the caller adds one).
    pub fn options(&self) -> RunOptions {
        RunOptions {
            weaker_landlock: self.weaker_landlock,
            uid: self.uid,
            bare: self.bare,
            pty: nix::unistd::isatty(std::io::stdin()).unwrap_or(false),
            ..RunOptions::default()
        }
    }
}

/// A started command the foreground loop drives: a namespace built here (`warren-nsd run`) or
/// one nsd built for us (`warren run`).
trait Foreground: Send + Sync + 'static {
    fn pty_master(&self) -> Option<&OwnedFd>;
    fn forward(&self, signal: Signal) -> io::Result<()>;
    fn kill(&self);
    fn wait(&self) -> io::Result<i32>;
}

impl Foreground for Running {
    fn pty_master(&self) -> Option<&OwnedFd> {
        Running::pty_master(self)
    }
    fn forward(&self, signal: Signal) -> io::Result<()> {
        self.signal(signal)
    }
    fn kill(&self) {
        let _ = Running::kill(self);
    }
    fn wait(&self) -> io::Result<i32> {
        Running::wait(self)
    }
}

impl Foreground for Launched {
    fn pty_master(&self) -> Option<&OwnedFd> {
        self.pty_master.as_ref()
    }
    fn forward(&self, signal: Signal) -> io::Result<()> {
        self.signal(signal as i32)
    }
    fn kill(&self) {
        // Closing our end of the run socket (at exit) makes nsd kill the namespace.
    }
    fn wait(&self) -> io::Result<i32> {
        Launched::wait(self)
    }
}

/// Blocks the forwarded signals in this thread (and so in every thread started after it), so
/// that only the forwarding thread takes them.
/// Err: `failed`, the exit status, once the reason is said.
fn block_forwarded(who: &str, failed: u8) -> Result<SigSet, u8> {
    let mut forwarded = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGWINCH,
    ] {
        forwarded.add(s);
    }
    match forwarded.thread_block() {
        Ok(()) => Ok(forwarded),
        Err(e) => {
            eprintln!("{who}: blocking signals: {e}");
            Err(failed)
        }
    }
}

/// An error as the launcher prints it: nsd's messages may quote a spec or words a namespace
/// wrote, so they are escaped (lines kept) like every other view.
fn shown(e: &dyn std::fmt::Display) -> String {
    warren_daemon::escape::escaped_lines(&e.to_string())
}

/// The size of the launcher's terminal when stdin is one: the namespace then gets a pty of that
/// size (rows, cols, xpixel, ypixel); None: no pty, plain stdio.
fn terminal_size() -> Option<[u16; 4]> {
    let stdin = io::stdin();
    if nix::unistd::isatty(&stdin).unwrap_or(false) {
        Some(warren_jail::tty::get_winsize(stdin.as_fd()).unwrap_or_default())
    } else {
        None
    }
}

/// Runs `command` confined by `spec`, building the namespace in this process, and returns its
/// exit status (125: warren could not set the namespace up). `warren-nsd run` and ns's own
/// tests; `warren run` goes through nsd ([`run_through_nsd`]). Call before any thread exists.
pub fn run_foreground(who: &str, spec: &Spec, command: &[String], opts: &RunOptions) -> u8 {
    if opts.weaker_landlock {
        eprintln!("{who}: WARNING: --weaker-landlock: Landlock may not be fully enforced");
    }
    let forwarded = match block_forwarded(who, 125) {
        Ok(f) => f,
        Err(status) => return status,
    };
    match spawn(spec, command, opts) {
        Ok(r) => drive(who, Arc::new(r), forwarded),
        Err(e) => {
            eprintln!("{who}: run: {}", shown(&e));
            125
        }
    }
}

/// `warren run`: asks nsd (its run socket in `dirs`' runtime dir) to run `command` confined by
/// `spec`; relays the terminal, forwards signals, returns the exit status (125: warren could
/// not set the namespace up). This process never builds a namespace. `on_started` runs once the
/// command has exec'd (e.g. to follow the session's asks); its error kills the namespace (125).
/// Call before any thread exists.
pub fn run_through_nsd(
    who: &str,
    dirs: &warren_daemon::Dirs,
    spec: &Spec,
    command: &[String],
    args: &RunArgs,
    on_started: impl FnOnce(&Launched) -> Result<(), String>,
) -> u8 {
    if args.weaker_landlock {
        eprintln!("{who}: WARNING: --weaker-landlock: Landlock may not be fully enforced");
    }
    let forwarded = match block_forwarded(who, 125) {
        Ok(f) => f,
        Err(status) => return status,
    };
    let pty = terminal_size();
    let opts = LaunchOptions {
        pty,
        weaker_landlock: args.weaker_landlock,
        uid: args.uid,
        bare: args.bare,
        ..LaunchOptions::default()
    };
    let (stdin, stdout, stderr) = (io::stdin(), io::stdout(), io::stderr());
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    match launch(dirs, spec, command, &opts, stdio) {
        Ok(launched) => {
            if let Err(e) = on_started(&launched) {
                // Dropping `launched` closes the run socket: nsd kills the namespace.
                eprintln!("{who}: run: {}", shown(&e));
                return 125;
            }
            drive(who, Arc::new(launched), forwarded)
        }
        Err(e) => {
            eprintln!("{who}: run: {}", shown(&e));
            125
        }
    }
}

/// `warren attach`: asks nsd to run `command` inside the live namespace `id`, confined as its
/// payload; relays the terminal and signals exactly as [`run_through_nsd`] and returns the
/// command's status (1: nsd refused — no such namespace, not an operator, …). Call before any
/// thread exists.
pub fn attach_through_nsd(
    who: &str,
    dirs: &warren_daemon::Dirs,
    id: u64,
    command: &[String],
) -> u8 {
    let forwarded = match block_forwarded(who, 1) {
        Ok(f) => f,
        Err(status) => return status,
    };
    let pty = terminal_size();
    let (stdin, stdout, stderr) = (io::stdin(), io::stdout(), io::stderr());
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    match crate::launch::client::attach(dirs, id, command, pty, stdio) {
        Ok(attached) => drive(who, Arc::new(attached), forwarded),
        Err(e) => {
            eprintln!("{who}: attach {id}: {}", shown(&e));
            1
        }
    }
}

/// Relays the pty (if any), forwards signals, waits, and returns the exit status.
fn drive<F: Foreground>(who: &str, running: Arc<F>, forwarded: SigSet) -> u8 {
    // With a terminal: raw mode here, the namespace's own pty does the line discipline.
    let relay = match running.pty_master() {
        Some(master) => {
            let raw = match pty::RawMode::enter() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("{who}: raw mode: {e}");
                    running.kill();
                    return 125;
                }
            };
            let _ = pty::sync_winsize(master);
            match pty::relay(master) {
                Ok(output) => Some((raw, output)),
                Err(e) => {
                    eprintln!("{who}: pty relay: {e}");
                    running.kill();
                    return 125;
                }
            }
        }
        None => None,
    };
    let forwarder = running.clone();
    std::thread::spawn(move || {
        while let Ok(sig) = forwarded.wait() {
            if sig == Signal::SIGWINCH {
                if let Some(master) = forwarder.pty_master() {
                    let _ = pty::sync_winsize(master);
                }
            } else {
                let _ = forwarder.forward(sig);
            }
        }
    });
    let status = running.wait();
    if let Some((raw, output)) = relay {
        let _ = output.join();
        drop(raw);
    }
    match status {
        Ok(code) => u8::try_from(code).unwrap_or(255),
        Err(e) => {
            eprintln!("{who}: run: {}", shown(&e));
            125
        }
    }
}
