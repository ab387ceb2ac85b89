//! `warren up|down|status`: start the supervisor binary detached and wait until every daemon
//! answers, stop it, and say what it runs. The CLI calls these; the supervisor is
//! `warren-supervisor`, next to `warren`.

use std::fs::OpenOptions;
use std::io::BufRead;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_jail::child::BeforeExec;

use crate::daemons::DAEMONS;
use crate::prepare::{ensure_operator_group, prepare_dirs};
use crate::state::{DaemonState, log_path, read_states, running_pid, supervisor_running, try_lock};

/// Where the supervisor and the daemons are: `WARREN_LIBEXEC_DIR`, else the running
/// executable's own directory (they are installed side by side with `warren`).
pub fn libexec_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("WARREN_LIBEXEC_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    Ok(exe
        .parent()
        .context("the running executable has no directory")?
        .to_path_buf())
}

pub fn up(dirs: &Dirs) -> Result<ExitCode> {
    match bring_up(dirs)? {
        Up::Already(pid) => {
            // Up is not working: never say "up" over a daemon that cannot do its job.
            let broken: Vec<String> = daemon_reports(dirs)?
                .iter()
                .filter(|r| supervised(r) && !r.works)
                .map(|r| format!("{} {}: {}", r.name, r.state, r.why.as_deref().unwrap_or("")))
                .collect();
            if !broken.is_empty() {
                bail!(
                    "warren is up (supervisor pid {pid}) but not working: {} (see `warren \
                     status`)",
                    broken.join("; ")
                );
            }
            println!("warren is already up (supervisor pid {pid})")
        }
        Up::Started(pid) => println!(
            "warren is up: supervisor pid {pid}, sockets in {}, log {}",
            dirs.runtime.display(),
            log_path(dirs).display()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// What [`bring_up`] found or did.
pub enum Up {
    /// A supervisor already held the lock (its pid, 0 if unknown).
    Already(i32),
    /// This call started the supervisor (its pid), and every daemon answers.
    Started(u32),
}

/// `warren up` without printing (also `warren run` with no daemons up): the same flock, so
/// concurrent callers start one set.
pub fn bring_up(dirs: &Dirs) -> Result<Up> {
    bring_up_with_env(dirs, &[])
}

/// [`bring_up`] with `env` added to the supervisor's environment, which every daemon it starts
/// inherits (`warren demo` gives llmfs its scripted model this way, not through its own env).
pub fn bring_up_with_env(dirs: &Dirs, env: &[(&str, &std::ffi::OsStr)]) -> Result<Up> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "warren up needs root in this version (nsd is a system service; see docs/decisions.md)"
        );
    }
    ensure_operator_group()?;
    prepare_dirs(dirs)?;
    match try_lock(dirs)? {
        None => return Ok(Up::Already(running_pid(dirs).unwrap_or(0))),
        Some(lock) => drop(lock),
    }
    let (mut ready_r, ready_w) = std::io::pipe()?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(log_path(dirs))?;
    let supervisor = libexec_dir()?.join("warren-supervisor");
    let mut cmd = std::process::Command::new(&supervisor);
    cmd.envs(env.iter().copied())
        .env("WARREN_RUNTIME_DIR", &dirs.runtime)
        .env("WARREN_DATA_DIR", &dirs.data)
        .env("WARREN_SECRETS_DIR", &dirs.secrets)
        .arg("--ready-fd")
        .arg(ready_w.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Its own session; the pipe's write end survives exec so the supervisor can say "ready".
    BeforeExec::new()
        .new_session()
        .keep_fds([ready_w.as_raw_fd()])
        .install(&mut cmd);
    let child = cmd
        .spawn()
        .with_context(|| format!("start the supervisor {}", supervisor.display()))?;
    drop(ready_w);
    drop(cmd);
    let mut said = String::new();
    std::io::BufReader::new(&mut ready_r).read_line(&mut said)?;
    let said = said.trim();
    if said == "ready" {
        Ok(Up::Started(child.id()))
    } else if said.is_empty() {
        bail!(
            "the supervisor exited before it was ready; see {}",
            log_path(dirs).display()
        )
    } else {
        bail!("{said} (log: {})", log_path(dirs).display())
    }
}

/// Stops the daemons. Namespaces still running would be stranded (their mounts served by
/// daemons about to go), so they are listed and the stop refused, unless `force`, which kills
/// each through nsd and waits until it has ended, before the daemons stop.
/// `settle(dirs, force)` is the caller's check of the namespaces: whether `down` may go on.
pub fn down_with(
    dirs: &Dirs,
    force: bool,
    settle: impl FnOnce(&Dirs, bool) -> Result<bool>,
) -> Result<ExitCode> {
    // Only a supervisor holding the lock is "up": a runtime dir that is not there, or a lock
    // nobody holds, is "not up" — never "the lock is held" (taking the lock here could not
    // tell a missing dir from a held lock).
    if !supervisor_running(dirs) {
        println!(
            "warren is not up at {} (--runtime-dir or WARREN_RUNTIME_DIR names another)",
            dirs.runtime.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let pid = running_pid(dirs).context("the lock is held but there is no pid file")?;
    if !settle(dirs, force)? {
        return Ok(ExitCode::from(1));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGTERM)
        .with_context(|| format!("signal supervisor {pid}"))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if try_lock(dirs).ok().flatten().is_some() {
            println!("warren is down");
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("supervisor {pid} did not stop within 15 s")
}

/// One operator socket of a daemon, and whether it answers a 9P handshake.
#[derive(Debug, serde::Serialize)]
pub struct SocketReport {
    pub socket: PathBuf,
    pub answers: bool,
}

/// What `warren status` and `warren doctor` say of one daemon warren may run.
#[derive(Debug, serde::Serialize)]
pub struct DaemonReport {
    pub name: &'static str,
    /// `up`, `down` (the supervisor waits to try it again), `not working` (it answers but
    /// cannot do its job), `no answer`, `not running` (warren is not up) or `not started by
    /// warren up` (exportfs).
    pub state: &'static str,
    /// Why it is not `up` (exportfs: what runs it instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Its operator sockets (mcpfs and netproxy have none: only root's control sockets).
    pub sockets: Vec<SocketReport>,
    /// Every operator socket answers (with none: its process is alive).
    pub answers: bool,
    /// It answers and does its job (receiptd: it has a key to sign with).
    pub works: bool,
}

/// Every daemon warren may run, in start order, each asked whether it answers and whether it
/// works; exportfs last, which `warren up` never starts (`warren export` runs it in the
/// foreground, on its own listener).
pub fn daemon_reports(dirs: &Dirs) -> Result<Vec<DaemonReport>> {
    let up = crate::state::supervisor_running(dirs);
    let states = if up { read_states(dirs) } else { Vec::new() };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut reports = Vec::new();
    for d in DAEMONS {
        let state = states.iter().find(|s| s.name == d.name);
        let pid = state.and_then(|s| s.pid);
        let sockets: Vec<SocketReport> = d
            .sockets
            .iter()
            .filter(|s| s.ends_with(".sock"))
            .map(|s| {
                let socket = dirs.runtime.join(s);
                let answers = rt.block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(2),
                        warren_9p::Client::connect_unix(&socket),
                    )
                    .await
                    .is_ok_and(|r| r.is_ok())
                });
                SocketReport { socket, answers }
            })
            .collect();
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        let answers = up
            && if sockets.is_empty() {
                alive
            } else {
                sockets.iter().all(|s| s.answers)
            };
        let (state, why) = if !up {
            ("not running", None)
        } else if let Some(why) = state.and_then(DaemonState::down_because) {
            ("down", Some(why))
        } else if !answers {
            (
                "no answer",
                Some(if sockets.is_empty() {
                    "its process is not running".to_string()
                } else {
                    "a socket of its does not answer".to_string()
                }),
            )
        } else {
            match rt.block_on(crate::daemons::works(dirs, d)) {
                Err(why) => ("not working", Some(why)),
                Ok(()) => ("up", None),
            }
        };
        reports.push(DaemonReport {
            name: d.name,
            works: state == "up",
            state,
            why,
            pid,
            sockets,
            answers,
        });
    }
    reports.push(DaemonReport {
        name: "exportfs",
        state: "not started by warren up",
        why: Some(format!(
            "`warren export --listen tcp!ADDR!PORT` serves this host's trees to the peers in {} \
             in the foreground, under its own uid",
            warren_proto::export::peers::peers_path().display()
        )),
        pid: None,
        sockets: Vec::new(),
        answers: false,
        works: false,
    });
    Ok(reports)
}

/// Whether a report speaks of a daemon the supervisor runs (exportfs is not one).
fn supervised(r: &DaemonReport) -> bool {
    DAEMONS.iter().any(|d| d.name == r.name)
}

/// Says whether warren is up and, for every daemon it may run, whether it answers and works.
/// Exit 0 only when it is up and every daemon it runs works.
pub fn status(dirs: &Dirs, json: bool) -> Result<ExitCode> {
    let up = crate::state::supervisor_running(dirs);
    let reports = daemon_reports(dirs)?;
    let (supervised, others): (Vec<&DaemonReport>, Vec<&DaemonReport>) =
        reports.iter().partition(|r| supervised(r));
    let working = up && supervised.iter().all(|r| r.works);
    if json {
        let v = serde_json::json!({
            "up": up,
            "works": working,
            "supervisor_pid": if up { running_pid(dirs) } else { None },
            "runtime_dir": dirs.runtime,
            "daemons": supervised,
            "others": others,
        });
        println!("{v}");
    } else {
        match (up, working) {
            (false, _) => println!(
                "warren is not up at {} (`warren up` starts it; --runtime-dir or \
                 WARREN_RUNTIME_DIR names another)",
                dirs.runtime.display()
            ),
            (true, true) => println!(
                "warren is up (supervisor pid {}), sockets in {}",
                running_pid(dirs).unwrap_or(0),
                dirs.runtime.display()
            ),
            (true, false) => println!(
                "warren is up (supervisor pid {}), but not every daemon works: calls may be \
                 denied",
                running_pid(dirs).unwrap_or(0)
            ),
        }
        for r in &reports {
            let mut said = r.state.to_string();
            if let Some(why) = &r.why {
                said.push_str(&format!(": {why}"));
            } else if r.state == "up" && r.sockets.is_empty() {
                said.push_str(&format!(
                    " (pid {}; no operator socket, only root's control socket)",
                    r.pid.unwrap_or(0)
                ));
            }
            println!("  {:<10} {said}", r.name);
            for s in &r.sockets {
                let answers = if s.answers { "answers" } else { "no answer" };
                println!("  {:<10}   {} {answers}", "", s.socket.display());
            }
        }
    }
    Ok(if working {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
