//! warren-nsd: `serve` serves `/ns` to the operator over 9P on `<runtime>/ns.sock`; `run`
//! builds one namespace from a spec and the convenience flags, runs a command in it and exits
//! with its status (what `warren run` does).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nix::sys::signal::{SigSet, Signal};
use warren_ns::{CliGrants, RunOptions, pty, spawn, spec_from_cli};

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
    /// Run CMD confined (what `warren run` does).
    Run {
        /// A namespace spec file.
        #[arg(long = "ns")]
        ns: Option<std::path::PathBuf>,
        /// Grant a tool (needs the FUSE bridge).
        #[arg(long = "tool")]
        tools: Vec<String>,
        /// Bind a host path read-only at the same path.
        #[arg(long = "ro")]
        ro: Vec<String>,
        /// Bind a host path read-write at the same path.
        #[arg(long = "rw")]
        rw: Vec<String>,
        /// `loopback` brings up lo in the namespace's own network namespace.
        #[arg(long = "net", value_parser = ["none", "loopback"])]
        net: Option<String>,
        /// No default /usr, /bin, /lib, /lib64 and no host /etc files.
        #[arg(long)]
        bare: bool,
        /// Accept a Landlock ruleset that is not fully enforced. Weaker confinement.
        #[arg(long = "weaker-landlock")]
        weaker_landlock: bool,
        /// The payload's uid (default: a per-namespace uid from 200000 up).
        #[arg(long)]
        uid: Option<u32>,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve { weaker_landlock } => serve(weaker_landlock),
        run @ Command::Run { .. } => run_once(run),
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
    let nsd = match warren_ns::nsd::Nsd::new(opts) {
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
        tracing::info!("serving /ns on {}", path.display());
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

fn run_once(command: Command) -> ExitCode {
    let Command::Run {
        ns,
        tools,
        ro,
        rw,
        net,
        bare,
        weaker_landlock,
        uid,
        command,
    } = command
    else {
        return ExitCode::from(2);
    };
    let base = match ns {
        Some(path) => {
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("warren-nsd: {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            };
            match warren_ns::parse(&path.display().to_string(), &text) {
                Ok(s) => Some(s),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            }
        }
        None => None,
    };
    let grants = CliGrants {
        tools,
        ro,
        rw,
        net_loopback: net.as_deref() == Some("loopback"),
        bare,
    };
    let spec = match spec_from_cli(base.as_ref(), &grants) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if weaker_landlock {
        eprintln!("warren-nsd: WARNING: --weaker-landlock: Landlock may not be fully enforced");
    }
    let tty = nix::unistd::isatty(std::io::stdin()).unwrap_or(false);
    let opts = RunOptions {
        weaker_landlock,
        uid,
        bare,
        pty: tty,
        ..RunOptions::default()
    };
    // Block the forwarded signals before any thread exists, so only the forwarding thread
    // takes them; the namespace's processes set their own masks.
    let mut forwarded = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        forwarded.add(s);
    }
    if let Err(e) = forwarded.thread_block() {
        eprintln!("warren-nsd: blocking signals: {e}");
        return ExitCode::from(125);
    }
    let running = match spawn(&spec, &command, &opts) {
        Ok(r) => std::sync::Arc::new(r),
        Err(e) => {
            eprintln!("warren-nsd: run: {e}");
            return ExitCode::from(125);
        }
    };
    // With a terminal: raw mode here, the namespace's own pty does the line discipline.
    let relay = match running.pty_master() {
        Some(master) => {
            let raw = match pty::RawMode::enter() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("warren-nsd: raw mode: {e}");
                    let _ = running.kill();
                    return ExitCode::from(125);
                }
            };
            let _ = pty::sync_winsize(master);
            match pty::relay(master) {
                Ok(output) => Some((raw, output)),
                Err(e) => {
                    eprintln!("warren-nsd: pty relay: {e}");
                    let _ = running.kill();
                    return ExitCode::from(125);
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
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(255)),
        Err(e) => {
            eprintln!("warren-nsd: run: {e}");
            ExitCode::from(125)
        }
    }
}
