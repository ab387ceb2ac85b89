//! `warren up|down|status` and the supervisor they start.
//!
//! `up` starts `warren supervise` detached and returns once every daemon answers 9P. The
//! supervisor holds a flock on `<runtime>/warren.lock` for its whole life (one set of daemons per
//! runtime dir), binds every daemon's sockets itself as root — so each daemon runs under its own
//! uid from its first instruction and a restarted daemon gets the very same listening socket —
//! and restarts a daemon that dies.
//!
//! Why one file: `up`, `down`, `status` and the supervisor share the daemon table, the lock, pid
//! and state files; splitting the supervisor loop out is noted in `docs/gaps.md` ("Code
//! structure").

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};
use warren_daemon::Dirs;
use warren_daemon::identity::Role;

/// One daemon the supervisor runs.
struct Daemon {
    /// Its binary, next to `warren`, and the arguments it starts with.
    binary: &'static str,
    args: &'static [&'static str],
    /// Its name in logs and its data subdirectory.
    name: &'static str,
    /// The uid it runs under; `None` for nsd, which alone stays root (it builds namespaces).
    role: Option<Role>,
    /// Socket file names in the runtime dir, with their modes: `*.sock` are the operator's
    /// (0660, the operator group), `*.ctl` are for root peers only (0600).
    sockets: &'static [&'static str],
    /// Capabilities it keeps as ambient capabilities under its own uid.
    caps: &'static [caps::Capability],
    /// Gets a connection to the gate made here (`WARREN_GATE_FD`), and so is restarted whenever
    /// the gate is.
    gate_client: bool,
}

impl Daemon {
    fn uid(&self) -> u32 {
        self.role.map_or(0, Role::uid)
    }
}

/// The daemons, in start order: receipts before anything that writes receipts, the gate before
/// the tools it decides for, nsd before toolfs (which gets its workers from nsd).
const DAEMONS: &[Daemon] = &[
    Daemon {
        binary: "warren-receiptd",
        args: &[],
        name: "receiptd",
        role: Some(Role::Receiptd),
        // receipts.ctl: nsd hands over one-scope views there (a peer's own receipts).
        sockets: &["receipts.sock", "receipts.ctl"],
        caps: &[],
        gate_client: false,
    },
    Daemon {
        binary: "warren-gate",
        args: &[],
        name: "gate",
        role: Some(Role::Gate),
        sockets: &["gate.sock", "gate.ctl"],
        caps: &[],
        gate_client: false,
    },
    Daemon {
        binary: "warren-nsd",
        args: &["serve"],
        name: "nsd",
        role: None,
        // ns.run: `warren run`'s launchers (warren_ns::launch; not 9P, so not `*.sock`).
        // nsd-workers.ctl: toolfs asks for its tool workers there (root and toolfs's group).
        // nsd-mcp.ctl: mcpfs has its MCP servers started there (root and mcpfs's group).
        // nsd-export.ctl: exportfs has its peers' trees made there (root and exportfs's group).
        sockets: &[
            "ns.sock",
            "ns.run",
            "nsd-workers.ctl",
            "nsd-mcp.ctl",
            "nsd-export.ctl",
        ],
        caps: &[],
        gate_client: false,
    },
    Daemon {
        binary: "warren-toolfs",
        args: &[],
        name: "toolfs",
        role: Some(Role::Toolfs),
        sockets: &["tool.sock", "toolfs.ctl"],
        // None: nsd builds every tool worker (on nsd-workers.ctl); toolfs never starts one.
        caps: &[],
        gate_client: true,
    },
    Daemon {
        binary: "warren-mcpfs",
        args: &[],
        name: "mcpfs",
        role: Some(Role::Mcpfs),
        sockets: &["mcpfs.ctl"],
        // None: nsd starts every MCP server (on nsd-mcp.ctl); mcpfs only speaks to them.
        caps: &[],
        gate_client: true,
    },
    Daemon {
        // The egress proxy: nsd hands it each `net proxy` namespace's listener on netproxy.ctl
        // (docs/network.md); `WARREN_NETPROXY_HOSTS`, if set, is its hosts file.
        binary: "warren-netproxy",
        args: &["--control"],
        name: "netproxy",
        role: Some(Role::Netproxy),
        sockets: &["netproxy.ctl"],
        caps: &[],
        gate_client: true,
    },
    Daemon {
        binary: "warren-llmfs",
        args: &[],
        name: "llmfs",
        role: Some(Role::Llmfs),
        // llm.sock: the operator's; llmfs.ctl: each namespace's `mount llm` connection (nsd).
        // Its backend comes from the environment `warren up` was given (WARREN_LLM_URL,
        // WARREN_LLM_API, WARREN_LLM_MODEL); its key file is opened here ([`llm_key_fd`]).
        sockets: &["llm.sock", "llmfs.ctl"],
        caps: &[],
        // Each namespace's model call is decided by the gate (as `llm`).
        gate_client: true,
    },
];

/// llmfs's API key file (`WARREN_LLM_KEY_FILE`, else `<secrets>/llm.key`), opened here as root:
/// the secrets dir is receiptd's, so llmfs gets the open file (`WARREN_LLM_KEY_FD`) rather than
/// a path it could not read. None: no key file (a local backend often needs none).
fn llm_key_fd(dirs: &Dirs) -> Result<Option<File>> {
    let path = std::env::var_os("WARREN_LLM_KEY_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| dirs.secrets.join("llm.key"));
    // No symlink followed, and a FIFO or device never blocks the supervisor: only a regular file.
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) if f.metadata()?.is_file() => Ok(Some(f)),
        Ok(_) => bail!("llmfs's key file {} is not a regular file", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("open llmfs's key file {}", path.display())),
    }
}

pub fn libexec_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("WARREN_LIBEXEC_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("cannot find the warren executable")?;
    Ok(exe
        .parent()
        .context("warren executable has no directory")?
        .to_path_buf())
}

/// Creates the `warren` system group if the host has none: its members are operators, and the
/// daemons carry it so they can reach each other's sockets in the 0750 runtime dir.
fn ensure_operator_group() -> Result<()> {
    if nix::unistd::Group::from_name("warren")?.is_some() {
        return Ok(());
    }
    let status = std::process::Command::new("groupadd")
        .args(["--system", "warren"])
        .status()
        .context("run groupadd to create the warren group")?;
    if !status.success() && nix::unistd::Group::from_name("warren")?.is_none() {
        bail!("groupadd --system warren failed ({status})");
    }
    Ok(())
}

fn operator_gid() -> u32 {
    warren_daemon::operator::OperatorPolicy::from_host()
        .operator_gid
        .unwrap_or(0)
}

fn lock_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("warren.lock")
}

fn pid_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("warren.pid")
}

fn log_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("warren.log")
}

/// The daemons run under their own uids: every directory above warren's three must let them
/// pass (search permission for others), or they die at start with EACCES.
fn check_reachable(dirs: &Dirs) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    for dir in [&dirs.runtime, &dirs.data, &dirs.secrets] {
        let absolute = std::path::absolute(dir)?;
        for ancestor in absolute.ancestors().skip(1) {
            let Ok(meta) = fs::metadata(ancestor) else {
                continue;
            };
            if meta.mode() & 0o001 == 0 {
                bail!(
                    "{} (mode {:o}) is not searchable by others, so the daemons, each under its \
                     own uid, could not reach {}: give it o+x or choose other directories",
                    ancestor.display(),
                    meta.mode() & 0o7777,
                    dir.display()
                );
            }
        }
    }
    Ok(())
}

/// Creates the three directories with their owners and modes, following no symlink and taking
/// none another user could have made or could replace (warren_daemon::dirs::make_dir).
fn prepare_dirs(dirs: &Dirs) -> Result<()> {
    check_reachable(dirs)?;
    let make = |path: &Path, mode: u32, uid: u32, gid: u32| -> Result<()> {
        warren_daemon::dirs::make_dir(path, uid, gid, mode)
            .with_context(|| format!("prepare {}", path.display()))?;
        Ok(())
    };
    make(&dirs.runtime, 0o750, 0, operator_gid())?;
    make(&dirs.data, 0o751, 0, 0)?;
    make(
        &dirs.secrets,
        0o700,
        Role::Receiptd.uid(),
        Role::Receiptd.uid(),
    )?;
    for d in DAEMONS {
        make(&dirs.data.join(d.name), 0o700, d.uid(), d.uid())?;
    }
    Ok(())
}

/// Tries the lock: `Ok(Some(lock))` if we got it, `Ok(None)` if a supervisor holds it.
fn try_lock(dirs: &Dirs) -> Result<Option<Flock<File>>> {
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

fn running_pid(dirs: &Dirs) -> Option<i32> {
    fs::read_to_string(pid_path(dirs)).ok()?.trim().parse().ok()
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
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("supervise")
        .envs(env.iter().copied())
        .env("WARREN_RUNTIME_DIR", &dirs.runtime)
        .env("WARREN_DATA_DIR", &dirs.data)
        .env("WARREN_SECRETS_DIR", &dirs.secrets)
        .arg("--ready-fd")
        .arg(ready_w.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let ready_raw = ready_w.as_raw_fd();
    // SAFETY: between fork and exec we only make syscalls (setsid, fcntl) that are
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            // The pipe's write end must survive exec so the supervisor can say "ready".
            nix::fcntl::fcntl(
                std::os::fd::BorrowedFd::borrow_raw(ready_raw),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )?;
            Ok(())
        });
    }
    let child = cmd.spawn().context("start the supervisor")?;
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

/// A socket the supervisor bound, and the fd number it has in the daemon.
struct Bound {
    name: &'static str,
    listener: UnixListener,
}

fn bind_sockets(dirs: &Dirs, d: &Daemon) -> Result<Vec<Bound>> {
    let mut out = Vec::new();
    for &name in d.sockets {
        let path = dirs.runtime.join(name);
        if path.exists() {
            // We hold the lock, so whatever is there is stale.
            fs::remove_file(&path)?;
        }
        let listener =
            UnixListener::bind(&path).with_context(|| format!("bind {}", path.display()))?;
        let (mode, gid) = if name == "nsd-workers.ctl" {
            // Its peer is toolfs (its own uid and gid; nsd checks the peer's uid too).
            (0o660, Role::Toolfs.uid())
        } else if name == "nsd-mcp.ctl" {
            (0o660, Role::Mcpfs.uid())
        } else if name == "nsd-export.ctl" {
            (0o660, Role::Exportfs.uid())
        } else if name.ends_with(".ctl") {
            (0o600, 0)
        } else {
            (0o660, operator_gid())
        };
        nix::unistd::chown(&path, Some(0.into()), Some(gid.into()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        out.push(Bound { name, listener });
    }
    Ok(out)
}

/// A connection to the gate for a trusted daemon: one end handed to the gate's control socket
/// with the daemon's name, the other returned for the daemon to inherit.
fn gate_connection(dirs: &Dirs, name: &str) -> Result<std::os::unix::net::UnixStream> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let record = warren_gate::control::ControlRecord {
        version: 1,
        kind: warren_gate::control::RecordKind::Daemon,
        name: Some(name.to_string()),
        ..Default::default()
    };
    warren_gate::control::hand_over(&dirs.control("gate"), &record, &theirs)
        .with_context(|| format!("hand {name}'s gate connection to the gate"))?;
    Ok(ours)
}

fn spawn_daemon(dirs: &Dirs, d: &Daemon, bound: &[Bound]) -> Result<std::process::Child> {
    let binary = libexec_dir()?.join(d.binary);
    let listen_fds: Vec<String> = bound
        .iter()
        .map(|b| format!("{}={}", b.name, b.listener.as_raw_fd()))
        .collect();
    let gate = if d.gate_client {
        Some(gate_connection(dirs, d.name)?)
    } else {
        None
    };
    let key = if d.role == Some(Role::Llmfs) {
        llm_key_fd(dirs)?
    } else {
        None
    };
    let mut raw: Vec<i32> = bound.iter().map(|b| b.listener.as_raw_fd()).collect();
    raw.extend(gate.as_ref().map(|g| g.as_raw_fd()));
    raw.extend(key.as_ref().map(|k| k.as_raw_fd()));
    let uid = d.role.map(Role::uid);
    // The operator group lets daemons reach each other's operator sockets; with no such group,
    // no supplementary group at all (never root's group 0).
    let groups: Vec<u32> = warren_daemon::operator::OperatorPolicy::from_host()
        .operator_gid
        .into_iter()
        .collect();
    let caps_wanted: Vec<caps::Capability> = d.caps.to_vec();
    let mut cmd = std::process::Command::new(&binary);
    cmd.args(d.args)
        .env("WARREN_RUNTIME_DIR", &dirs.runtime)
        .env("WARREN_DATA_DIR", dirs.data.join(d.name))
        .env("WARREN_SECRETS_DIR", &dirs.secrets)
        .env(
            warren_daemon::operator::LISTEN_FDS_ENV,
            listen_fds.join(","),
        )
        .stdin(std::process::Stdio::null());
    if let Some(g) = &gate {
        cmd.env("WARREN_GATE_FD", g.as_raw_fd().to_string());
    }
    if d.role == Some(Role::Llmfs) {
        // Empty: the supervisor found no key file (llmfs must not look in the secrets dir).
        let fd = key.as_ref().map(|k| k.as_raw_fd().to_string());
        cmd.env("WARREN_LLM_KEY_FD", fd.unwrap_or_default());
    }
    // SAFETY: the closure only makes syscalls (sigaction, sigprocmask, fcntl, prctl, setgroups,
    // setres[ug]id, capset); the caps crate's set operations build small sets, and glibc's fork
    // handlers leave malloc usable in the child.
    unsafe {
        cmd.pre_exec(move || {
            reset_signals()?;
            for &fd in &raw {
                nix::fcntl::fcntl(
                    std::os::fd::BorrowedFd::borrow_raw(fd),
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )?;
            }
            match uid {
                Some(uid) => drop_privileges(uid, &groups, &caps_wanted),
                // nsd: root, but nothing it execs may gain privileges by a setuid binary.
                None => nix::sys::prctl::set_no_new_privs().map_err(Into::into),
            }
        });
    }
    cmd.spawn()
        .with_context(|| format!("start {}", binary.display()))
}

/// In a daemon's child, before exec: every signal at its default disposition and none blocked.
/// The supervisor blocks HUP, INT and TERM for its signalfd, and a child inherits the mask
/// across exec: a daemon restarted with it would never see `warren down`'s SIGTERM (no final
/// checkpoint, no drain of queued receipts) and be SIGKILLed after 5 s.
fn reset_signals() -> std::io::Result<()> {
    use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
    for sig in Signal::iterator().filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP)) {
        // SAFETY: SIG_DFL installs no handler; this process execs next.
        unsafe { signal(sig, SigHandler::SigDfl) }?;
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    Ok(())
}

/// In the child, before exec: become `uid`, keeping exactly `keep` as ambient capabilities.
fn drop_privileges(uid: u32, groups: &[u32], keep: &[caps::Capability]) -> std::io::Result<()> {
    use caps::{CapSet, CapsHashSet};
    let to_io = |e: caps::errors::CapsError| std::io::Error::other(e.to_string());
    nix::sys::prctl::set_keepcaps(true)?;
    let groups: Vec<nix::unistd::Gid> = groups.iter().map(|&g| g.into()).collect();
    let keep: CapsHashSet = keep.iter().copied().collect();
    // The bounding set first, while we still hold CAP_SETPCAP: nothing this process execs can
    // ever get a capability outside `keep`.
    for c in caps::all() {
        if !keep.contains(&c) {
            caps::drop(None, CapSet::Bounding, c).map_err(to_io)?;
        }
    }
    nix::unistd::setgroups(&groups)?;
    nix::unistd::setresgid(uid.into(), uid.into(), uid.into())?;
    nix::unistd::setresuid(uid.into(), uid.into(), uid.into())?;
    caps::set(None, CapSet::Effective, &keep).map_err(to_io)?;
    caps::set(None, CapSet::Permitted, &keep).map_err(to_io)?;
    caps::set(None, CapSet::Inheritable, &keep).map_err(to_io)?;
    for c in &keep {
        caps::raise(None, CapSet::Ambient, *c).map_err(to_io)?;
    }
    // No setuid binary may give it more than this.
    nix::sys::prctl::set_no_new_privs()?;
    Ok(())
}

/// Whether a 9P server answers a handshake on `path` within a second (the supervisor holds the
/// listening socket, so a connect succeeds even when no daemon is accepting).
async fn answers(path: &Path) -> bool {
    tokio::time::timeout(
        Duration::from_secs(1),
        warren_9p::Client::connect_unix(path),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}

pub fn supervise(dirs: &Dirs, ready_fd: Option<i32>) -> Result<ExitCode> {
    // SAFETY: `up` passed us the write end of its pipe under this number, and nothing else here
    // uses it.
    let mut ready = ready_fd.map(|fd| File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
    if let Some(r) = &ready {
        // Back to close-on-exec, or every daemon would hold `up`'s pipe open.
        nix::fcntl::fcntl(
            r,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
    }
    let result = supervise_inner(dirs, &mut ready);
    if let (Err(e), Some(r)) = (&result, ready.as_mut()) {
        let _ = writeln!(r, "{e:#}");
    }
    result
}

fn supervise_inner(dirs: &Dirs, ready: &mut Option<File>) -> Result<ExitCode> {
    warren_daemon::harden()?;
    // Started by systemd rather than `up`, nothing has made the group yet.
    ensure_operator_group()?;
    prepare_dirs(dirs)?;
    let Some(_lock) = try_lock(dirs)? else {
        bail!("another supervisor holds {}", lock_path(dirs).display())
    };
    fs::write(pid_path(dirs), format!("{}\n", std::process::id()))?;
    let mut running = Vec::new();
    let started = start_all(dirs, &mut running);
    if let Err(e) = started {
        // Never leave a half-started set behind.
        stop_all(dirs, &mut running)?;
        return Err(e);
    }
    if let Some(mut r) = ready.take() {
        writeln!(r, "ready")?;
    }
    notify_systemd_ready()?;
    supervise_loop(dirs, &mut running)
}

/// Under systemd's `Type=notify` (dist/systemd/warren.service): one `READY=1` datagram to
/// `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace), as sd_notify(3) specifies.
fn notify_systemd_ready() -> Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let target = target.to_string_lossy().into_owned();
    let addr = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(&target)?,
    };
    UnixDatagram::unbound()?
        .send_to_addr(b"READY=1", &addr)
        .with_context(|| format!("tell systemd we are ready on {target}"))?;
    Ok(())
}

fn start_all(dirs: &Dirs, running: &mut Vec<Supervised>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // One at a time, each ready before the next: later daemons connect to earlier ones.
    for d in DAEMONS {
        let bound = bind_sockets(dirs, d)?;
        let child = spawn_daemon(dirs, d, &bound)?;
        running.push(Supervised {
            daemon: d,
            bound,
            child: Some(child),
            deaths: Vec::new(),
            down: None,
        });
        let s = running.last_mut().expect("just pushed");
        let child = s.child.as_mut().expect("just started");
        wait_ready(&rt, dirs, d, child)?;
        tracing_line(&format!(
            "{} up (pid {}, uid {})",
            d.name,
            child.id(),
            d.uid()
        ));
    }
    write_states(dirs, running);
    Ok(())
}

/// Waits until every operator socket of `d` answers a 9P handshake.
fn wait_ready(
    rt: &tokio::runtime::Runtime,
    dirs: &Dirs,
    d: &Daemon,
    child: &mut std::process::Child,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    for s in d.sockets.iter().filter(|s| s.ends_with(".sock")) {
        let path = dirs.runtime.join(s);
        loop {
            if rt.block_on(answers(&path)) {
                break;
            }
            if let Some(status) = child.try_wait()? {
                bail!("{} exited during startup ({status})", d.name);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer on {} within 20 s",
                    d.name,
                    path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

fn tracing_line(msg: &str) {
    eprintln!("warren supervise: {msg}");
}

/// One daemon under supervision.
struct Supervised {
    daemon: &'static Daemon,
    /// Its listening sockets; none while it is down (closed, so clients are refused at once
    /// instead of waiting on a socket nobody accepts on).
    bound: Vec<Bound>,
    /// Its process; `None` while it is down.
    child: Option<std::process::Child>,
    /// When it died, over the last minute.
    deaths: Vec<Instant>,
    down: Option<Down>,
}

/// A daemon that died too often, waiting for its next try.
struct Down {
    /// Why, as `warren status` and `warren doctor` show it.
    why: String,
    retry_at: Instant,
}

/// Restarted at once this many times a minute; after that, each try waits twice as long as the
/// one before (from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`]) with the daemon's sockets closed.
const MAX_RESTARTS: usize = 5;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How long to wait before the next try of a daemon that died `deaths` times in a minute.
fn backoff(deaths: usize) -> Option<Duration> {
    let over = deaths.checked_sub(MAX_RESTARTS + 1)?;
    Some(
        FIRST_BACKOFF
            .saturating_mul(1 << over.min(16))
            .min(MAX_BACKOFF),
    )
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

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn states_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join("daemons.json")
}

/// Writes every daemon's state (atomically: a reader never sees half a file).
fn write_states(dirs: &Dirs, running: &[Supervised]) {
    let states: Vec<DaemonState> = running
        .iter()
        .map(|s| DaemonState {
            name: s.daemon.name.to_string(),
            state: if s.down.is_some() { "down" } else { "up" }.to_string(),
            pid: s.child.as_ref().map(std::process::Child::id),
            why: s.down.as_ref().map(|d| d.why.clone()),
            next_try: s.down.as_ref().map(|d| {
                unix_now()
                    + d.retry_at
                        .saturating_duration_since(Instant::now())
                        .as_secs()
            }),
        })
        .collect();
    let path = states_path(dirs);
    let tmp = path.with_extension("json.new");
    let written = serde_json::to_vec(&states)
        .map_err(std::io::Error::other)
        .and_then(|bytes| fs::write(&tmp, bytes))
        .and_then(|()| fs::set_permissions(&tmp, fs::Permissions::from_mode(0o640)))
        .and_then(|()| {
            nix::unistd::chown(&tmp, Some(0.into()), Some(operator_gid().into()))
                .map_err(Into::into)
        })
        .and_then(|()| fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing_line(&format!("cannot write {}: {e}", path.display()));
    }
}

/// The supervisor's word on each daemon, if warren is up.
pub fn daemon_states(dirs: &Dirs) -> Option<Vec<DaemonState>> {
    matches!(try_lock(dirs), Ok(None)).then(|| read_states(dirs))
}

/// The supervisor's last word on each daemon (empty when it has written none).
fn read_states(dirs: &Dirs) -> Vec<DaemonState> {
    fs::read(states_path(dirs))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

impl Supervised {
    /// Starts it again: its sockets bound anew if they were closed. A failure to start is a
    /// death like any other.
    fn start(&mut self, dirs: &Dirs) -> std::result::Result<(), String> {
        if self.bound.is_empty() {
            self.bound = bind_sockets(dirs, self.daemon).map_err(|e| format!("{e:#}"))?;
        }
        let child = spawn_daemon(dirs, self.daemon, &self.bound).map_err(|e| format!("{e:#}"))?;
        self.child = Some(child);
        self.down = None;
        Ok(())
    }

    /// Records a death (`why`) and restarts it, at once or, after too many deaths in a minute,
    /// later with its sockets closed meanwhile.
    fn died(&mut self, dirs: &Dirs, why: String) {
        let name = self.daemon.name;
        let now = Instant::now();
        self.child = None;
        self.deaths
            .retain(|t| now.duration_since(*t) < Duration::from_secs(60));
        self.deaths.push(now);
        match backoff(self.deaths.len()) {
            None => {
                tracing_line(&format!("{name} died ({why}): restarting"));
                if let Err(e) = self.start(dirs) {
                    self.died(dirs, format!("could not start: {e}"));
                }
            }
            Some(wait) => {
                let why = format!("died {} times in a minute, last: {why}", self.deaths.len());
                tracing_line(&format!(
                    "{name} {why}: its sockets are closed; next try in {} s",
                    wait.as_secs()
                ));
                for b in self.bound.drain(..) {
                    let _ = fs::remove_file(dirs.runtime.join(b.name));
                }
                self.down = Some(Down {
                    why,
                    retry_at: now + wait,
                });
            }
        }
    }
}

/// Restarts dead daemons until SIGTERM or SIGINT: at once, and after too many deaths in a
/// minute with a growing pause (never giving up).
fn supervise_loop(dirs: &Dirs, running: &mut [Supervised]) -> Result<ExitCode> {
    use nix::sys::signal::{SigSet, Signal};
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGHUP);
    mask.thread_block()?;
    let sfd = nix::sys::signalfd::SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    )?;
    loop {
        if let Ok(Some(sig)) = sfd.read_signal() {
            tracing_line(&format!("signal {}: stopping", sig.ssi_signo));
            break;
        }
        let mut gate_restarted = false;
        let mut changed = false;
        for s in running.iter_mut() {
            let ended = match s.child.as_mut().map(std::process::Child::try_wait) {
                Some(Ok(Some(status))) => Some(status.to_string()),
                Some(Ok(None)) => None,
                Some(Err(e)) => Some(format!("wait: {e}")),
                None => {
                    if s.down
                        .as_ref()
                        .is_some_and(|d| Instant::now() >= d.retry_at)
                    {
                        tracing_line(&format!("{}: trying again", s.daemon.name));
                        changed = true;
                        if let Err(e) = s.start(dirs) {
                            s.died(dirs, format!("could not start: {e}"));
                        }
                        gate_restarted |= s.daemon.name == "gate" && s.child.is_some();
                    }
                    None
                }
            };
            if let Some(why) = ended {
                changed = true;
                s.died(dirs, why);
                gate_restarted |= s.daemon.name == "gate" && s.child.is_some();
            }
        }
        if gate_restarted {
            // Their gate connection died with the gate: restart them with a fresh one (until
            // then they deny every call).
            for s in running.iter_mut().filter(|s| s.daemon.gate_client) {
                if let Some(child) = s.child.as_mut() {
                    tracing_line(&format!("gate restarted: restarting {}", s.daemon.name));
                    let _ = child.kill();
                }
            }
        }
        if changed {
            write_states(dirs, running);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_all(dirs, running)?;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM to every daemon, SIGKILL after 5 s, then their sockets and the pid file are removed.
fn stop_all(dirs: &Dirs, running: &mut [Supervised]) -> Result<()> {
    for child in running.iter().filter_map(|s| s.child.as_ref()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for s in running.iter_mut() {
        if let Some(child) = s.child.as_mut() {
            while child.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if child.try_wait()?.is_none() {
                tracing_line(&format!("{} ignored SIGTERM: killing", s.daemon.name));
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for b in s.bound.iter() {
            let _ = fs::remove_file(dirs.runtime.join(b.name));
        }
    }
    let _ = fs::remove_file(pid_path(dirs));
    let _ = fs::remove_file(states_path(dirs));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const STRANGER: u32 = 4242;

    /// A base directory with `mode`, as another user's world-writable /tmp would be (the tests
    /// run as root, as CI does).
    fn base(mode: u32) -> tempfile::TempDir {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root (CI runs as root)"
        );
        let t = tempfile::tempdir().unwrap();
        fs::set_permissions(t.path(), fs::Permissions::from_mode(mode)).unwrap();
        t
    }

    fn dirs_in(base: &Path, runtime: &Path, data: &Path) -> Dirs {
        Dirs {
            runtime: runtime.to_path_buf(),
            data: data.to_path_buf(),
            secrets: base.join("secrets"),
        }
    }

    fn owner_and_mode(p: &Path) -> (u32, u32) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.mode() & 0o7777)
    }

    /// Another user plants `<shared>/run` as a symlink to a directory of theirs: `up` neither
    /// follows it nor chowns the target.
    #[test]
    fn up_follows_no_symlink_planted_at_its_runtime_dir() {
        let shared = base(0o1777);
        let target = base(0o755);
        std::os::unix::fs::chown(target.path(), Some(STRANGER), Some(STRANGER)).unwrap();
        let link = shared.path().join("run");
        std::os::unix::fs::symlink(target.path(), &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(STRANGER), Some(STRANGER)).unwrap();
        let dirs = dirs_in(shared.path(), &link, &shared.path().join("data"));
        let e = format!("{:#}", prepare_dirs(&dirs).unwrap_err());
        assert!(e.contains("symlink"), "{e}");
        assert_eq!(owner_and_mode(target.path()), (STRANGER, 0o755));
    }

    /// Another user pre-creates `<shared>/data` in a sticky world-writable dir: `up` refuses it
    /// rather than taking it over (they could have planted files in it, or keep a handle).
    #[test]
    fn up_refuses_a_data_dir_another_user_made_in_a_sticky_dir() {
        let shared = base(0o1777);
        let data = shared.path().join("data");
        fs::create_dir(&data).unwrap();
        fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&data, Some(STRANGER), Some(STRANGER)).unwrap();
        let dirs = dirs_in(shared.path(), &shared.path().join("run"), &data);
        let e = format!("{:#}", prepare_dirs(&dirs).unwrap_err());
        assert!(e.contains("belongs to uid 4242"), "{e}");
        assert_eq!(owner_and_mode(&data), (STRANGER, 0o755));
        assert!(!data.join("receiptd").exists());
    }

    /// A world-writable parent that is not sticky lets anyone rename warren's dir away and put
    /// their own in its place: refused.
    #[test]
    fn up_refuses_a_world_writable_ancestor_that_is_not_sticky() {
        let open = base(0o777);
        let dirs = Dirs::under(open.path());
        let e = format!("{:#}", prepare_dirs(&dirs).unwrap_err());
        assert!(e.contains("not sticky"), "{e}");
        assert!(!open.path().join("run").exists());
    }

    /// Under a sticky world-writable dir, directories `up` makes itself are fine.
    #[test]
    fn up_makes_its_dirs_in_a_sticky_dir() {
        let shared = base(0o1777);
        let dirs = Dirs::under(shared.path().join("w"));
        prepare_dirs(&dirs).unwrap();
        assert_eq!(owner_and_mode(&dirs.runtime), (0, 0o750));
        assert_eq!(owner_and_mode(&dirs.data), (0, 0o751));
        assert_eq!(
            owner_and_mode(&dirs.data.join("receiptd")),
            (Role::Receiptd.uid(), 0o700)
        );
        assert_eq!(owner_and_mode(&dirs.secrets), (Role::Receiptd.uid(), 0o700));
    }
}
