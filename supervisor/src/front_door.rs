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
use crate::state::{DaemonState, log_path, read_states, running_pid, try_lock};

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
        Up::Already(pid) => println!("warren is already up (supervisor pid {pid})"),
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
    if try_lock(dirs).ok().flatten().is_some() {
        println!("warren is not up");
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

pub fn status(dirs: &Dirs, json: bool) -> Result<ExitCode> {
    let up = matches!(try_lock(dirs), Ok(None));
    let states = if up { read_states(dirs) } else { Vec::new() };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut sockets = Vec::new();
    for d in DAEMONS {
        let down = states
            .iter()
            .find(|s| s.name == d.name)
            .and_then(DaemonState::down_because);
        for s in d.sockets.iter().filter(|s| s.ends_with(".sock")) {
            let path = dirs.runtime.join(s);
            let answers = rt.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(2),
                    warren_9p::Client::connect_unix(&path),
                )
                .await
                .is_ok_and(|r| r.is_ok())
            });
            sockets.push((d.name, path, answers, down.clone()));
        }
    }
    if json {
        let v = serde_json::json!({
            "up": up,
            "supervisor_pid": if up { running_pid(dirs) } else { None },
            "runtime_dir": dirs.runtime,
            "daemons": sockets.iter().map(|(n, p, a, down)| serde_json::json!({
                "name": n, "socket": p, "answers": a,
                "state": if down.is_some() { "down" } else if *a { "up" } else { "no answer" },
                "why": down,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        if up {
            println!(
                "warren is up (supervisor pid {})",
                running_pid(dirs).unwrap_or(0)
            );
        } else {
            println!("warren is not up");
        }
        for (name, path, answers, down) in &sockets {
            let state = match down {
                Some(why) => format!("down: {why}"),
                None if *answers => "answers".into(),
                None => "no answer".into(),
            };
            println!("  {name:<10} {:<40} {state}", path.display());
        }
    }
    Ok(if up {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
