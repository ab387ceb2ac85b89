//! `warren run` (and `warren-nsd run`): the flags, and running a namespace in the foreground
//! with the launcher's signals forwarded and its terminal relayed through the namespace's pty.

use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::signal::{SigSet, Signal};

use crate::{CliGrants, RunOptions, Spec, pty, spawn, spec_from_cli};

/// The flags of `warren run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// A namespace spec file.
    #[arg(long = "ns")]
    pub ns: Option<PathBuf>,
    /// Grant a tool: it appears under /tool (repeat for more).
    #[arg(long = "tool")]
    pub tools: Vec<String>,
    /// Bind a host path read-only at the same path.
    #[arg(long = "ro")]
    pub ro: Vec<String>,
    /// Bind a host path read-write at the same path.
    #[arg(long = "rw")]
    pub rw: Vec<String>,
    /// `loopback` brings up lo in the namespace's own network namespace.
    #[arg(long = "net", value_parser = ["none", "loopback"])]
    pub net: Option<String>,
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
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Some(crate::parse(&path.display().to_string(), &text).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        let grants = CliGrants {
            tools: self.tools.clone(),
            ro: self.ro.clone(),
            rw: self.rw.clone(),
            net_loopback: self.net.as_deref() == Some("loopback"),
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

/// Runs `command` confined by `spec` and returns its exit status (125: warren could not set the
/// namespace up). Call before any thread exists: the forwarded signals are blocked here so that
/// only the forwarding thread takes them.
pub fn run_foreground(who: &str, spec: &Spec, command: &[String], opts: &RunOptions) -> u8 {
    if opts.weaker_landlock {
        eprintln!("{who}: WARNING: --weaker-landlock: Landlock may not be fully enforced");
    }
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
    if let Err(e) = forwarded.thread_block() {
        eprintln!("{who}: blocking signals: {e}");
        return 125;
    }
    let running = match spawn(spec, command, opts) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprintln!("{who}: run: {e}");
            return 125;
        }
    };
    // With a terminal: raw mode here, the namespace's own pty does the line discipline.
    let relay = match running.pty_master() {
        Some(master) => {
            let raw = match pty::RawMode::enter() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("{who}: raw mode: {e}");
                    let _ = running.kill();
                    return 125;
                }
            };
            let _ = pty::sync_winsize(master);
            match pty::relay(master) {
                Ok(output) => Some((raw, output)),
                Err(e) => {
                    eprintln!("{who}: pty relay: {e}");
                    let _ = running.kill();
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
                let _ = forwarder.signal(sig);
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
            eprintln!("{who}: run: {e}");
            125
        }
    }
}
