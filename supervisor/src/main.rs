//! `warren-supervisor`: runs warren's daemons in the foreground and restarts any that dies.
//! `warren up` starts it detached (and waits on `--ready-fd`); systemd starts it as
//! `Type=notify` (dist/systemd/warren.service). Its directories come from the environment
//! (`WARREN_RUNTIME_DIR`, `WARREN_DATA_DIR`, `WARREN_SECRETS_DIR`), as every daemon's do.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(name = "warren-supervisor", version, about)]
struct Args {
    /// The fd on which to say "ready" (or why not) once the daemons answer.
    #[arg(long)]
    ready_fd: Option<i32>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let dirs = warren_daemon::Dirs::from_env();
    match warren_supervisor::supervise::supervise(&dirs, args.ready_fd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "warren-supervisor: {}",
                warren_daemon::escape::escaped_lines(&format!("{e:#}"))
            );
            ExitCode::from(1)
        }
    }
}
