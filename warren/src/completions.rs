//! `warren completions SHELL` and `warren man`: shell completion scripts and roff manual pages,
//! both generated from the clap definitions in `main.rs`, so they can never drift from the CLI.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};

/// Prints the completion script for `shell` (source it, or install it where the shell looks).
pub fn completions(cmd: clap::Command, shell: clap_complete::Shell) -> Result<ExitCode> {
    let mut cmd = cmd;
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, "warren", &mut out);
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Prints `warren(1)`, or with `dir` writes `warren.1` and one `warren-<sub>.1` per subcommand
/// there (what a package installs under `share/man/man1`).
pub fn man(cmd: clap::Command, dir: Option<&Path>) -> Result<ExitCode> {
    match dir {
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            out.flush()?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("write manual pages to {}", dir.display()))?;
            eprintln!("warren: manual pages written to {}", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
