//! The supervisor: it binds every daemon's sockets itself as root — so each daemon runs under
//! its own uid from its first instruction and a restarted daemon gets the very same listening
//! socket — starts the daemons one by one, each ready before the next, and restarts a daemon
//! that dies: at once or, after too many deaths in a minute, later with its sockets closed.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_daemon::identity::Role;
use warren_jail::child::BeforeExec;
use warren_jail::privilege::Identity;

use crate::daemons::{DAEMONS, Daemon};
use crate::front_door::libexec_dir;
use crate::prepare::{ensure_operator_group, prepare_dirs};
use crate::state::{
    DaemonState, lock_path, operator_gid, pid_path, states_path, try_lock, unix_now,
};

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
    // Signals at their defaults (the supervisor blocks HUP, INT and TERM for its signalfd, and
    // a daemon restarted with that mask would never see `warren down`'s SIGTERM), the listeners
    // and connections kept, then its own uid.
    let before_exec = BeforeExec::new().default_signals().keep_fds(raw);
    match uid {
        Some(uid) => before_exec.drop_to(Identity::new(uid, uid).with_groups(groups)),
        // nsd: root, but nothing it execs may gain privileges by a setuid binary.
        None => before_exec.no_new_privs(),
    }
    .install(&mut cmd);
    cmd.spawn()
        .with_context(|| format!("start {}", binary.display()))
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
    // `up` passed us the write end of its pipe under this number; taken, it is close-on-exec
    // again, or every daemon would hold `up`'s pipe open.
    let mut ready = ready_fd
        .map(|fd| warren_jail::inherited::take(fd).map(File::from))
        .transpose()?;
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
        // Answering is not enough: `up` must not say up while every call would be denied.
        if let Err(why) = rt.block_on(crate::daemons::works(dirs, d)) {
            bail!("{} {why}", d.name);
        }
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
    eprintln!("warren-supervisor: {msg}");
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
