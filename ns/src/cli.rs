//! `warren run` (and `warren-nsd run`): the flags, and running a namespace in the foreground
//! with the launcher's signals forwarded and its terminal relayed through the namespace's pty.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
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
    /// The payload's uid (default: a non-root operator's own; for root, a per-namespace uid
    /// from 200000 up, or under --profile the owner of the project).
    #[arg(long)]
    pub uid: Option<u32>,
    /// Run a coding agent by its profile (`claude`, `codex`, or the operator's
    /// $WARREN_CONFIG_DIR/profiles/NAME.ns): the current directory is the project, bound
    /// writable; ARGs after `--` go to the agent.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// The payload's working directory inside the namespace (default: the current directory
    /// when a bind shows it at the same path, else HOME).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Print the spec, command, working directory and uid the run would use, and run nothing.
    #[arg(long = "print-spec")]
    pub print_spec: bool,
    /// The command and its arguments (with --profile: the agent's arguments).
    #[arg(last = true, required_unless_present = "profile")]
    pub command: Vec<String>,
}

/// One run as the launcher sends it: the flags (and a profile) made into a spec, a command,
/// a uid, a working directory and the values it sets itself.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub spec: Spec,
    pub command: Vec<String>,
    pub uid: Option<u32>,
    /// Without `uid`: the payload runs as the owner of the source of the bind at this target,
    /// as nsd opens it (`Request::uid_from_bind`).
    pub uid_from_bind: Option<String>,
    /// Inside the namespace; `None`: HOME.
    pub cwd: Option<String>,
    /// Values for some of the spec's `env` names, over the launcher's environment.
    pub env_set: std::collections::BTreeMap<String, String>,
    /// `NAME (ORIGIN)` of the profile it came from.
    pub profile: Option<String>,
}

impl Invocation {
    /// What `--print-spec` shows: the facts beside the spec as comments, then the spec.
    pub fn shown(&self) -> String {
        let mut out = String::new();
        if let Some(p) = &self.profile {
            out.push_str(&format!("# profile: {p}\n"));
        }
        let words: Vec<String> = self.command.iter().map(|w| crate::spec::quote(w)).collect();
        out.push_str(&format!("# command: {}\n", words.join(" ")));
        out.push_str(&format!(
            "# cwd: {}\n",
            crate::spec::quote(self.cwd.as_deref().unwrap_or(crate::HOME))
        ));
        let operator = nix::unistd::geteuid().as_raw();
        match self.uid {
            Some(u) => out.push_str(&format!("# uid: {u}\n")),
            // nsd runs a non-root operator's namespace as that operator.
            None if operator != 0 => out.push_str(&format!("# uid: {operator}\n")),
            // Shown only: nsd decides, with fstat on the handle it binds at that target.
            None if self.uid_from_bind.is_some() => {
                use std::os::unix::fs::MetadataExt;
                let target = self.uid_from_bind.as_deref().unwrap_or_default();
                match std::fs::metadata(target) {
                    Ok(m) => out.push_str(&format!("# uid: {}\n", m.uid())),
                    Err(_) => out.push_str(&format!("# uid: the owner of {target}\n")),
                }
            }
            None => out.push_str("# uid: a per-namespace uid\n"),
        }
        for (k, v) in &self.env_set {
            out.push_str(&format!("# set: {k}={}\n", crate::spec::quote(v)));
        }
        out.push_str(&self.spec.to_text());
        out
    }
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
        spec_from_cli(base.as_ref(), &self.grants()).map_err(|e| e.to_string())
    }

    /// The convenience flags.
    fn grants(&self) -> CliGrants {
        CliGrants {
            tools: self.tools.clone(),
            mcp: self.mcp.clone(),
            ro: self.ro.clone(),
            rw: self.rw.clone(),
            net_loopback: self.net.as_deref() == Some("loopback"),
            imports: self.imports.clone(),
            net_proxy: self.net_proxy.clone(),
            bare: self.bare,
        }
    }

    /// The run these flags ask for: with `--profile`, the profile's (`invocation_of_profile`);
    /// else the spec of [`RunArgs::spec`], the command as given, and the current directory as
    /// the working directory when a bind shows it at the same path.
    pub fn invocation(&self) -> Result<Invocation, String> {
        if let Some(name) = &self.profile {
            return self.invocation_of_profile(name);
        }
        let spec = self.spec()?;
        let cwd = self.cwd.clone().or_else(|| {
            let here = std::env::current_dir().ok()?;
            shown_at_same_path(&spec, &here).then(|| here.to_string_lossy().into_owned())
        });
        Ok(Invocation {
            spec,
            command: self.command.clone(),
            uid: self.uid,
            uid_from_bind: None,
            cwd,
            env_set: Default::default(),
            profile: None,
        })
    }

    /// `--profile NAME`: the project is the current directory; the profile's spec, its agent
    /// found on PATH (its prefix bound read-only unless a system directory holds it, its bin
    /// directory first on PATH), the flags' grants added; the uid a non-root operator's own,
    /// else `--uid`, else the project's owner (never 0).
    fn invocation_of_profile(&self, name: &str) -> Result<Invocation, String> {
        if self.ns.is_some() {
            return Err("--profile and --ns: a profile is a spec; write one of your own instead (--print-spec shows the profile's)".into());
        }
        let source = crate::profile::load(name)?;
        let project = std::env::current_dir()
            .map_err(|e| format!("profile {name}: the current directory: {e}"))?;
        let project_text = project
            .to_str()
            .ok_or_else(|| format!("profile {name}: {} is not UTF-8", project.display()))?;
        let vars = crate::profile::Vars {
            home: std::env::var("HOME").ok().filter(|h| !h.is_empty()),
            project: project_text.to_string(),
        };
        let mut profile = crate::profile::read(&source, &vars)?;
        let origin = format!("{name} ({})", source.origin);
        // A bind the profile names must be there: refused here, by name, not by nsd later.
        for b in &profile.spec.binds {
            if std::fs::symlink_metadata(&b.host).is_err() {
                return Err(format!(
                    "profile {origin}: {} is not there (bound at {}): create it, or write a profile of your own",
                    b.host, b.path
                ));
            }
        }
        let path = std::env::var("PATH").unwrap_or_default();
        let install = crate::profile::find_install(&profile.agent[0], &path)?;
        let mut grants = self.grants();
        let in_system_dir = !self.bare
            && crate::cli_spec::SYSTEM_DIRS
                .iter()
                .any(|d| install.prefix.starts_with(d));
        let prefix = install.prefix.to_string_lossy().into_owned();
        if !in_system_dir && !profile.spec.binds.iter().any(|b| b.path == prefix) {
            grants.ro.push(prefix);
        }
        let bin = install.program.parent().unwrap_or(Path::new("/"));
        profile.set.insert(
            "PATH".into(),
            format!("{}:{}", bin.display(), crate::PAYLOAD_PATH),
        );
        if !profile.spec.env.iter().any(|e| e == "PATH") {
            profile.spec.env.push("PATH".into());
        }
        let spec = spec_from_cli(Some(&profile.spec), &grants).map_err(|e| e.to_string())?;
        let mut command = vec![install.program.to_string_lossy().into_owned()];
        command.extend(profile.agent[1..].iter().cloned());
        command.extend(self.command.iter().cloned());
        Ok(Invocation {
            spec,
            command,
            uid: profile_uid(self.uid)?,
            uid_from_bind: (nix::unistd::geteuid().is_root() && self.uid.is_none())
                .then(|| project_text.to_string()),
            cwd: Some(self.cwd.clone().unwrap_or_else(|| project_text.to_string())),
            env_set: profile.set,
            profile: Some(origin),
        })
    }

    /// Run options from the flags (no mount server: the caller adds one).
    pub fn options(&self) -> RunOptions {
        RunOptions {
            weaker_landlock: self.weaker_landlock,
            uid: self.uid,
            cwd: self.cwd.clone(),
            bare: self.bare,
            pty: nix::unistd::isatty(std::io::stdin()).unwrap_or(false),
            ..RunOptions::default()
        }
    }
}

/// Whether `dir` appears in the namespace at its own path: beneath the source of a bind whose
/// target is that same path.
fn shown_at_same_path(spec: &Spec, dir: &Path) -> bool {
    spec.binds.iter().any(|b| {
        b.host == b.path
            && Path::new(&b.host)
                .canonicalize()
                .is_ok_and(|host| host == Path::new(&b.host) && dir.starts_with(&host))
    })
}

/// A profile's payload uid: a non-root operator's own (nsd allows no other), else `--uid`
/// (never 0 nor a uid of warren's own), else `None`: nsd runs the agent as the owner of the
/// project bind's handle (`Invocation::uid_from_bind`), so the uid and what is bound come from
/// one open file, never from two lookups of the project's name.
fn profile_uid(asked: Option<u32>) -> Result<Option<u32>, String> {
    let operator = nix::unistd::geteuid().as_raw();
    if operator != 0 {
        return Ok(asked.or(Some(operator)));
    }
    if let Some(uid) = asked {
        warren_daemon::identity::refuse_payload_uid(uid, &format!("--uid {uid}"))?;
    }
    Ok(asked)
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
    run: &Invocation,
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
        uid: run.uid,
        uid_from_bind: run.uid_from_bind.clone(),
        bare: args.bare,
        cwd: run.cwd.clone(),
        env_set: run.env_set.clone(),
        ..LaunchOptions::default()
    };
    let (stdin, stdout, stderr) = (io::stdin(), io::stdout(), io::stderr());
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    match launch(dirs, &run.spec, &run.command, &opts, stdio) {
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
