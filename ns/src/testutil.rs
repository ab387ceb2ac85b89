//! Test helpers that need real kernel state.

use std::io::Read;

use nix::unistd::ForkResult;

/// Runs `f` in a forked child inside a private mount namespace, so mounts it makes vanish
/// with it. Returns what `f` returned (as text across a pipe).
pub fn in_private_mount_ns(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    match warren_jail::process::fork_process().unwrap() {
        ForkResult::Child => {
            drop(r);
            let result = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
                .map_err(|e| format!("unshare: {e}"))
                .and_then(|()| warren_jail::mounts::make_root_private())
                .and_then(|()| f());
            let msg = match result {
                Ok(()) => "ok".to_string(),
                Err(e) => e,
            };
            let _ = nix::unistd::write(&w, msg.as_bytes());
            warren_jail::process::exit_now(0)
        }
        ForkResult::Parent { child } => {
            drop(w);
            let mut s = String::new();
            std::fs::File::from(r).read_to_string(&mut s).unwrap();
            nix::sys::wait::waitpid(child, None).unwrap();
            if s == "ok" { Ok(()) } else { Err(s) }
        }
    }
}
