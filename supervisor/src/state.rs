//! What the supervisor leaves in the runtime dir for the front door: its lock (held for its
//! whole life: one set of daemons per runtime dir), its pid, its log and each daemon's state.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};
use warren_daemon::Dirs;

pub(crate) fn operator_gid() -> u32 {
    warren_daemon::operator::OperatorPolicy::from_host()
        .operator_gid
        .unwrap_or(0)
}

pub(crate) fn lock_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("warren.lock")
}

pub(crate) fn pid_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("warren.pid")
}

pub(crate) fn log_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("warren.log")
}

/// Tries the lock: `Ok(Some(lock))` if we got it, `Ok(None)` if a supervisor holds it.
pub(crate) fn try_lock(dirs: &Dirs) -> Result<Option<Flock<File>>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(lock_path(dirs))
        .with_context(|| format!("open {}", lock_path(dirs).display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e).context("flock"),
    }
}

/// Whether a supervisor holds the lock, found without making anything: a command that only
/// looks (`status`, `doctor`, `run` with none up) leaves a runtime dir as it found it.
pub fn supervisor_running(dirs: &Dirs) -> bool {
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(lock_path(dirs))
    else {
        return false;
    };
    matches!(
        Flock::lock(file, FlockArg::LockExclusiveNonblock),
        Err((_, nix::errno::Errno::EWOULDBLOCK))
    )
}

pub(crate) fn running_pid(dirs: &Dirs) -> Option<i32> {
    fs::read_to_string(pid_path(dirs)).ok()?.trim().parse().ok()
}

/// The supervisor's word on each daemon, for `warren status` and `warren doctor`.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct DaemonState {
    pub name: String,
    /// `up` or `down`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Why it is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// When it is tried again (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_try: Option<u64>,
}

impl DaemonState {
    /// Why it is down and when it is tried next, as `warren status` and `warren doctor` say it.
    pub fn down_because(&self) -> Option<String> {
        if self.state != "down" {
            return None;
        }
        let mut why = self.why.clone().unwrap_or_else(|| "no reason given".into());
        if let Some(at) = self.next_try {
            let now = unix_now();
            why.push_str(&format!(
                "; next try in {} s",
                at.saturating_sub(now).max(1)
            ));
        }
        Some(why)
    }
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn states_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("daemons.json")
}

/// The supervisor's word on each daemon, if warren is up.
pub fn daemon_states(dirs: &Dirs) -> Option<Vec<DaemonState>> {
    supervisor_running(dirs).then(|| read_states(dirs))
}

/// The supervisor's last word on each daemon (empty when it has written none).
pub(crate) fn read_states(dirs: &Dirs) -> Vec<DaemonState> {
    fs::read(states_path(dirs))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}
