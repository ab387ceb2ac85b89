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
            let mut cmd = cmd.disable_help_subcommand(true);
            cmd.build();
            write_pages(&cmd, dir)?;
            eprintln!("warren: manual pages written to {}", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `cmd`'s page and one per visible subcommand, as `clap_mangen::generate_to` names them, each
/// file made by [`warren_daemon::dirs::create_operator_file`] (never through a symlink or over
/// anything but a file of the operator's).
fn write_pages(cmd: &clap::Command, dir: &Path) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(cmd.clone());
    let path = dir.join(man.get_filename());
    let mut file = warren_daemon::dirs::create_operator_file(&path, 0o644)?;
    man.render(&mut file)
        .and_then(|()| file.flush())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(())
}
