//! `warren run`: a command in a namespace of its own, holding only what the flags or the spec
//! grant. Its 9P mounts are connections made here and handed, with their grants, to the running
//! daemons; `warren up` must have started them.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_ns::cli::{RunArgs, run_foreground};

pub fn run(dirs: &Dirs, args: &RunArgs) -> Result<ExitCode> {
    let spec = match args.spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut opts = args.options();
    opts.protected = dirs.clone();
    if !spec.mounts.is_empty() {
        let ctl = dirs.control("toolfs");
        if !ctl.exists() {
            bail!(
                "this namespace mounts warren's servers, but no toolfs answers at {} — run `warren up` first",
                ctl.display()
            );
        }
        let bridge = crate::supervise::libexec_dir()?.join("warren-bridge");
        let namespace = format!("run-{}", std::process::id());
        let served = warren_ns::ServedMounts::new(dirs.clone(), &spec, &namespace, bridge)
            .context("prepare the namespace's mounts")?;
        opts.mount_server = Some(Arc::new(served));
    }
    Ok(ExitCode::from(run_foreground(
        "warren",
        &spec,
        &args.command,
        &opts,
    )))
}
