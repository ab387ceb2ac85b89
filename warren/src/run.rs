//! `warren run`: a command in a namespace of its own, holding only what the flags or the spec
//! grant. This process never builds the namespace: nsd does, on its run socket
//! (`warren_ns::launch`); here we only send the request with our stdio (or relay nsd's pty),
//! answer the session's asks (`asks`), forward signals and exit with the command's status. With
//! no daemons up it fails, saying where it looked: only `warren up` starts them.

use std::process::ExitCode;

use anyhow::Result;
use warren_daemon::Dirs;
use warren_ns::cli::{Invocation, RunArgs, run_through_nsd};

use crate::asks::AsksMode;

pub fn run(dirs: &Dirs, args: &RunArgs, asks: AsksMode) -> Result<ExitCode> {
    let invocation = match args.invocation() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("warren: run: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if args.print_spec {
        print!("{}", invocation.shown());
        return Ok(ExitCode::SUCCESS);
    }
    run_invocation(dirs, &invocation, args, asks, |_| {})
}

/// [`run`] with the spec already made (`warren agent` adds its mounts to it); `started` is told
/// of the namespace once its command runs.
pub fn run_spec(
    dirs: &Dirs,
    spec: &warren_ns::Spec,
    args: &RunArgs,
    asks: AsksMode,
    started: impl FnOnce(&warren_ns::launch::client::Launched),
) -> Result<ExitCode> {
    let invocation = Invocation {
        spec: spec.clone(),
        command: args.command.clone(),
        uid: args.uid,
        uid_from_bind: None,
        cwd: args.cwd.clone(),
        env_set: Default::default(),
        profile: None,
    };
    run_invocation(dirs, &invocation, args, asks, started)
}

fn run_invocation(
    dirs: &Dirs,
    invocation: &Invocation,
    args: &RunArgs,
    asks: AsksMode,
    started: impl FnOnce(&warren_ns::launch::client::Launched),
) -> Result<ExitCode> {
    if let Err(status) = require_nsd(dirs, "run") {
        return Ok(status);
    }
    let follow_asks = |launched: &warren_ns::launch::client::Launched| {
        started(launched);
        crate::asks::follow(dirs, &launched.session, asks)
            .map_err(|e| format!("following the session's asks: {e:#}"))
    };
    Ok(ExitCode::from(run_through_nsd(
        "warren",
        dirs,
        invocation,
        args,
        follow_asks,
    )))
}

/// Fails unless nsd answers on its run socket; never starts daemons (that is `warren up`'s
/// alone: started here, they would be a second warren at whatever directories this process was
/// given, without the operator's policy or key). Err: the exit status, once the reason is said
/// (`who` names the command in it).
pub fn require_nsd(dirs: &Dirs, who: &str) -> Result<(), ExitCode> {
    if nsd_answers(dirs) {
        return Ok(());
    }
    match warren_supervisor::daemon_states(dirs) {
        // Up, but nsd is not: the supervisor closed its sockets until its next try.
        Some(states) => {
            let why = states
                .iter()
                .find(|s| s.name == "nsd")
                .and_then(warren_supervisor::DaemonState::down_because)
                .unwrap_or_else(|| "its run socket does not answer".into());
            eprintln!("warren: {who}: nsd is down: {why} (see `warren status`)");
        }
        None => eprintln!(
            "warren: {who}: {}",
            crate::none_answers("nsd", &warren_ns::launch::socket_path(dirs))
        ),
    }
    Err(ExitCode::from(125))
}

/// Whether something listens on nsd's run socket (the supervisor binds it before nsd starts and
/// keeps it across nsd restarts, closing it only while nsd is down for a pause after too many
/// deaths).
fn nsd_answers(dirs: &Dirs) -> bool {
    std::os::unix::net::UnixStream::connect(warren_ns::launch::socket_path(dirs)).is_ok()
}
