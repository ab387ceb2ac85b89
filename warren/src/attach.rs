//! `warren attach ID [-- CMD ARGS]`: a command (default `/bin/sh`) inside a live namespace,
//! confined exactly as its payload. nsd joins the namespace and confines the command (it alone
//! holds CAP_SYS_ADMIN); this process only relays the terminal, signals and the exit status.

use std::process::ExitCode;

use anyhow::Result;
use warren_daemon::Dirs;

/// The command when none is given.
pub const DEFAULT_COMMAND: &str = "/bin/sh";

pub fn attach(dirs: &Dirs, id: u64, command: &[String]) -> Result<ExitCode> {
    let command = if command.is_empty() {
        vec![DEFAULT_COMMAND.to_string()]
    } else {
        command.to_vec()
    };
    Ok(ExitCode::from(warren_ns::cli::attach_through_nsd(
        "warren", dirs, id, &command,
    )))
}
