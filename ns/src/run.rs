//! Build a namespace from a spec and run a command in it ([`spawn`]). Called by nsd alone in a
//! running system: for `warren run` and `warren sh` on its run socket (`warren_nsd::run_socket`) and for
//! namespaces cloned through `/ns` (`warren_nsd::nsd`); `warren-nsd run` calls it in-process for ns's own
//! tests and benchmarks. The steps are `docs/confinement.md`'s; the spec is `specs/namespace.md`.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};

use crate::confine::fuse::{MountServer, recv_fd};
use crate::confine::guard::{Guard, ProtectedDirs};
use crate::confine::limits::{self, Enforcement};
use crate::confine::{self, Launch, binds};
use crate::spec::{Access, Bind, Net, Spec};
use warren_jail::setup::{Identity, Wait};
use warren_jail::{init, process, tty};

/// How to run; `Default` reads the protected dirs from the environment.
#[derive(Clone)]
pub struct RunOptions {
    /// warren's runtime, data and secrets dirs: never bindable.
    pub protected: ProtectedDirs,
    /// Accept a Landlock ruleset that is not fully enforced (loudly named on purpose).
    pub weaker_landlock: bool,
    /// The payload's uid (the invoking operator's, for a non-root operator). `None`: a
    /// per-namespace uid `uid_base + holder pid`, unique while the namespace lives.
    pub uid: Option<u32>,
    pub uid_base: u32,
    /// Do not bind the host's /etc files (ld.so.cache, nsswitch.conf, certs, …).
    pub bare: bool,
    /// Serves the namespace's 9P mounts over FUSE (the bridge). Without it a spec with a
    /// `mount` line is refused.
    pub mount_server: Option<Arc<dyn MountServer>>,
    /// The payload's stdin/stdout/stderr; `None`: the launcher's own.
    pub stdio: Option<Arc<PayloadStdio>>,
    /// Give the payload a pty of the namespace's own devpts as its controlling terminal and
    /// stdio; its master is `Running::pty_master`, for the launcher to relay (see `pty`).
    pub pty: bool,
    /// The pty's first window size (rows, cols, xpixel, ypixel); `None`: this process's stdin's.
    pub pty_winsize: Option<[u16; 4]>,
    /// Where the payload's TERM, LANG and the spec's `env` names get their values: `None` is
    /// this process's environment (`warren-nsd run`); nsd passes the launcher's values.
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// For a `net proxy` spec: the session and namespace its proxy grant is for. Without it such
    /// a spec is refused (only nsd, with the proxy's control socket, can build one).
    pub net_proxy: Option<crate::netgrant::NetProxyTarget>,
    /// The payload's working directory inside the namespace; `None`: its HOME.
    pub cwd: Option<String>,
}

/// Descriptors to give the payload as fds 0, 1 and 2.
#[derive(Debug)]
pub struct PayloadStdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

impl PayloadStdio {
    /// Their numbers, for the plan: the holder (or attacher) puts them on 0, 1, 2.
    pub(crate) fn raw_fds(&self) -> [RawFd; 3] {
        [
            self.stdin.as_raw_fd(),
            self.stdout.as_raw_fd(),
            self.stderr.as_raw_fd(),
        ]
    }

    /// All three on /dev/null (a daemon-started namespace has no terminal).
    pub fn null() -> io::Result<PayloadStdio> {
        let open = |write: bool| -> io::Result<OwnedFd> {
            Ok(std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open("/dev/null")?
                .into())
        };
        Ok(PayloadStdio {
            stdin: open(false)?,
            stdout: open(true)?,
            stderr: open(true)?,
        })
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            protected: ProtectedDirs::from_env(),
            weaker_landlock: false,
            uid: None,
            uid_base: 200_000,
            bare: false,
            mount_server: None,
            stdio: None,
            pty: false,
            pty_winsize: None,
            env: None,
            net_proxy: None,
            cwd: None,
        }
    }
}

/// The host /etc files a namespace gets (never /etc whole): the dynamic loader's cache, name
/// service config, alternatives, CA certificates, and resolv.conf only with a network.
fn etc_binds(net: Net) -> Vec<Bind> {
    let mut files = vec![
        "/etc/ld.so.cache",
        "/etc/nsswitch.conf",
        "/etc/alternatives",
        "/etc/ssl/certs",
        "/etc/localtime",
    ];
    if net != Net::None {
        files.push("/etc/resolv.conf");
    }
    files
        .into_iter()
        .filter(|f| Path::new(f).exists())
        .map(|f| Bind {
            access: Access::Read,
            recursive: false,
            host: f.into(),
            path: f.into(),
        })
        .collect()
}

pub(crate) fn payload_env(
    spec: &Spec,
    given: Option<&std::collections::BTreeMap<String, String>>,
) -> io::Result<Vec<CString>> {
    let mut env = vec![
        format!("PATH={}", crate::PAYLOAD_PATH),
        format!("HOME={}", crate::HOME),
        "USER=agent".to_string(),
        "LOGNAME=agent".to_string(),
    ];
    for name in ["TERM", "LANG"]
        .iter()
        .copied()
        .chain(spec.env.iter().map(String::as_str))
    {
        let value = match given {
            Some(values) => values.get(name).cloned(),
            None => std::env::var_os(name)
                .map(|v| {
                    v.into_string().map_err(|_| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("env {name} is not UTF-8"),
                        )
                    })
                })
                .transpose()?,
        };
        if let Some(v) = value {
            // A spec's name (PATH, say) replaces warren's default rather than following it as a
            // second entry the payload's getenv would never see.
            env.retain(|e| e.split('=').next() != Some(name));
            env.push(format!("{name}={v}"));
        }
    }
    if spec.net() == Net::Proxy {
        // These name the only way out: a launcher's value for one (through the spec's `env`)
        // must not point elsewhere, so it is dropped for the proxy's.
        let proxy = crate::netgrant::proxy_env();
        fn name(e: &str) -> &str {
            e.split('=').next().unwrap_or("")
        }
        env.retain(|e| !proxy.iter().any(|p| name(p) == name(e)));
        env.extend(proxy);
    }
    env.into_iter()
        .map(|s| {
            CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in env"))
        })
        .collect()
}

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Runs `argv` confined by `spec`; returns its exit status (128+N when killed by signal N).
/// Setup failures (a refused bind, Landlock not enforced, exec failing, …) are `Err`, never a
/// silently weaker run.
pub fn run(spec: &Spec, argv: &[String], opts: &RunOptions) -> io::Result<i32> {
    spawn(spec, argv, opts)?.wait()
}

/// A confined command that has exec'd. Dropping it removes its cgroup (killing what is left);
/// with rlimits, a namespace not waited for runs on until its command ends.
#[derive(Debug)]
pub struct Running {
    holder: Pid,
    holder_fd: OwnedFd,
    /// Held for its Drop: a cgroup is killed and removed with the `Running`.
    enforcement: Enforcement,
    pty_master: Option<OwnedFd>,
    /// How its payload was confined, for a process attached later (`launch::attach`).
    confinement: Confinement,
    /// A `net proxy` namespace's grant: its session at the proxy ends with it (its Drop).
    net_grant: Option<crate::netgrant::NetGrant>,
}

/// What a process joining a running namespace must get to be confined exactly as its payload
/// was (besides the spec, which nsd keeps with the namespace).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Confinement {
    pub uid: u32,
    pub weaker_landlock: bool,
    /// pids/mem via rlimits (no cgroup).
    pub rlimit_pids_mem: bool,
}

impl Running {
    /// Whom its `net proxy` grant is for (none without one): a tool worker the namespace's
    /// spec gives the network gets a grant of its own in the same name.
    pub fn net_target(&self) -> Option<&crate::netgrant::NetProxyTarget> {
        self.net_grant.as_ref().map(|g| &g.target)
    }

    /// The master side of the namespace's pty (with `RunOptions::pty`).
    pub fn pty_master(&self) -> Option<&OwnedFd> {
        self.pty_master.as_ref()
    }

    /// Takes the pty's master (nsd hands it to the launcher and keeps no copy).
    pub fn take_pty_master(&mut self) -> Option<OwnedFd> {
        self.pty_master.take()
    }

    /// Sends `signal` to the holder, which forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT to
    /// the namespace's pid 1, which forwards them to the command.
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> io::Result<()> {
        process::pidfd_signal(self.holder_fd.as_fd(), signal as i32)
    }

    /// The host pid of the process holding the namespaces.
    pub fn holder_pid(&self) -> u32 {
        self.holder.as_raw() as u32
    }

    /// The payload's uid.
    pub fn payload_uid(&self) -> u32 {
        self.confinement.uid
    }

    /// A pidfd of the holder (never a recycled pid), to join its namespaces.
    pub(crate) fn holder_pidfd(&self) -> io::Result<OwnedFd> {
        self.holder_fd.try_clone()
    }

    pub(crate) fn confinement(&self) -> Confinement {
        self.confinement
    }

    /// The namespace's cgroup, when pids/mem are enforced by one.
    pub(crate) fn cgroup_dir(&self) -> Option<&Path> {
        match &self.enforcement {
            Enforcement::Cgroup(c) => Some(&c.dir),
            Enforcement::Rlimits => None,
        }
    }

    /// SIGKILLs the namespace: the holder dies, its pid 1 follows (PDEATHSIG), and with pid 1
    /// the kernel kills every process of the pid namespace. Sent through a pidfd, so a reused
    /// pid can never be hit.
    pub fn kill(&self) -> io::Result<()> {
        process::pidfd_signal(self.holder_fd.as_fd(), libc::SIGKILL)
    }

    /// Waits for the command; its exit status (128+N for signal N). Call once. `kill` stays
    /// safe during and after it (the pidfd never names another process).
    pub fn wait(&self) -> io::Result<i32> {
        init::wait_exit_code(self.holder)
    }
}

/// Builds the namespace and starts `argv` in it; returns once the command has exec'd (or the
/// setup failed, as `Err`).
pub fn spawn(spec: &Spec, argv: &[String], opts: &RunOptions) -> io::Result<Running> {
    if argv.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no command to run",
        ));
    }
    if let Some(m) = spec.mounts.first()
        && opts.mount_server.is_none()
    {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "mount of {} at {} needs the FUSE bridge (RunOptions::mount_server)",
                m.server, m.path
            ),
        ));
    }
    let argv = argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in an argument"))?;
    let env = payload_env(spec, opts.env.as_ref())?;
    let net_grant = match (spec.net(), &opts.net_proxy) {
        (Net::Proxy, Some(target)) => Some(crate::netgrant::grant(
            &spec.proxy,
            target,
            &opts.protected,
        )?),
        (Net::Proxy, None) => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "net proxy needs nsd (the egress proxy's grant is made by nsd)",
            ));
        }
        _ => None,
    };

    let guard = Guard::new(&opts.protected)?;
    let mut all_binds = spec.binds.clone();
    if !opts.bare {
        all_binds.extend(etc_binds(spec.net()));
    }
    let prepared = all_binds
        .iter()
        .map(|b| binds::prepare(b, &guard))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|m| io::Error::new(io::ErrorKind::PermissionDenied, m))?;

    let id = format!(
        "run-{}-{}",
        std::process::id(),
        RUN_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let enforcement = limits::enforcement(&spec.limits, &id)?;
    let (err_read, err_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let pair = |wanted: bool| -> io::Result<(Option<UnixStream>, Option<UnixStream>)> {
        if !wanted {
            return Ok((None, None));
        }
        let (a, b) = UnixStream::pair()?;
        Ok((Some(a), Some(b)))
    };
    let (fuse_parent, fuse_child) = pair(!spec.mounts.is_empty())?;
    let (pty_parent, pty_child) = pair(opts.pty)?;
    let plan = confine::plan(
        spec,
        Launch {
            binds: prepared,
            argv,
            env,
            identity: match opts.uid {
                Some(uid) => Identity::Fixed { uid, gid: uid },
                None => Identity::HolderPid {
                    base: opts.uid_base,
                },
            },
            weaker_landlock: opts.weaker_landlock,
            err_pipe: err_write,
            stdio: opts.stdio.as_ref().map(|s| s.raw_fds()),
            fuse_sock: fuse_child,
            pty_sock: pty_child,
            pty_winsize: if opts.pty {
                opts.pty_winsize
                    .unwrap_or_else(|| tty::get_winsize(io::stdin().as_fd()).unwrap_or_default())
            } else {
                [0; 4]
            },
            cgroup_dir: match &enforcement {
                Enforcement::Cgroup(c) => Some(c.dir.clone()),
                Enforcement::Rlimits => None,
            },
            rlimit_pids_mem: matches!(enforcement, Enforcement::Rlimits),
            net_ns: net_grant
                .as_ref()
                .map(|g| g.netns.try_clone())
                .transpose()?,
            cwd: opts.cwd.clone().unwrap_or_else(|| crate::HOME.into()),
        },
    );
    let holder = match process::fork_process()? {
        ForkResult::Child => {
            drop(err_read);
            drop(fuse_parent);
            drop(pty_parent);
            warren_jail::setup::holder(plan, Wait::Supervise)
        }
        ForkResult::Parent { child } => child,
    };
    drop(plan);
    let deadline = Instant::now() + SETUP_DEADLINE;
    let errors = SetupErrors::drain(err_read);
    let served = match (fuse_parent, &opts.mount_server) {
        (Some(sock), Some(server)) => sock
            .set_read_timeout(Some(SETUP_DEADLINE))
            .and_then(|()| serve_mounts(&sock, spec, server.as_ref()))
            .and_then(|()| std::io::Write::write_all(&mut &sock, &confine::fuse::SERVED)),
        _ => Ok(()),
    };
    let (holder_fd, pty_master) = collect_started(holder, served, pty_parent, errors, deadline)?;
    Ok(Running {
        holder,
        holder_fd,
        pty_master,
        net_grant,
        confinement: Confinement {
            uid: payload_uid(opts, holder),
            weaker_landlock: opts.weaker_landlock,
            rlimit_pids_mem: matches!(enforcement, Enforcement::Rlimits),
        },
        enforcement,
    })
}

/// How long a namespace's setup may take, from the fork until its command has exec'd: past it
/// the setup is killed and refused, so no launch waits forever on a child that never answers.
pub const SETUP_DEADLINE: Duration = Duration::from_secs(30);

/// The most of a setup error kept (the rest is read and dropped, so the child never blocks).
const MAX_SETUP_ERROR: u64 = 1 << 20;

/// A child's setup-error pipe, read to EOF on a thread of its own from the fork on: the child
/// never blocks writing its error (a pipe holds 64 KiB) while the parent waits on something
/// else, such as the FUSE or pty handoff.
pub struct SetupErrors {
    read: mpsc::Receiver<io::Result<String>>,
}

impl SetupErrors {
    pub fn drain(err_read: OwnedFd) -> SetupErrors {
        let (tx, read) = mpsc::sync_channel(1);
        let reader = move || {
            let mut pipe = std::fs::File::from(err_read);
            let mut kept = Vec::new();
            let got = (&mut pipe)
                .take(MAX_SETUP_ERROR)
                .read_to_end(&mut kept)
                .and_then(|_| io::copy(&mut pipe, &mut io::sink()));
            let message = got.map(|dropped| {
                let mut m = String::from_utf8_lossy(&kept).into_owned();
                if dropped > 0 {
                    m.push_str(&format!(" [{dropped} more bytes of this error dropped]"));
                }
                m
            });
            let _ = tx.send(message);
        };
        if let Err(e) = std::thread::Builder::new()
            .name("setup-errors".into())
            .spawn(reader)
        {
            // No thread: the receiver reports it (its sender is gone with the closure).
            tracing::error!("setup errors: no reader thread: {e}");
        }
        SetupErrors { read }
    }

    /// What the child wrote before it exec'd or ended (empty: it exec'd), waited for until
    /// `deadline`.
    pub fn wait(&self, deadline: Instant) -> io::Result<String> {
        match self
            .read
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(read) => read,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(setup_timed_out()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(io::Error::other("setup errors: the pipe's reader is gone"))
            }
        }
    }
}

fn setup_timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the namespace's setup did not finish within {} s: killed",
            SETUP_DEADLINE.as_secs()
        ),
    )
}

/// Whether the parent's side failed only because the child was gone (it failed first: its own
/// message says why).
fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
    )
}

/// The parent's side once `child` (the holder, or an attacher) is forked: takes the pty master
/// it sends on `pty_parent` (if it makes one), waits for its setup-error pipe to reach EOF
/// (nothing: set up) and opens its pidfd, all by `deadline`. `ours`: how the parent's own part
/// went. The child's own message wins over an error of ours that only says the child went
/// away. On any failure the child is SIGKILLed and reaped, so no half-built namespace outlives
/// the error.
pub(crate) fn collect_started(
    child: Pid,
    ours: io::Result<()>,
    pty_parent: Option<UnixStream>,
    errors: SetupErrors,
    deadline: Instant,
) -> io::Result<(OwnedFd, Option<OwnedFd>)> {
    // Our own failure (other than the child being gone) is the reason: the child then fails
    // only because we stopped serving it. Kill it now rather than wait for it to notice.
    if let Err(e) = &ours
        && !peer_gone(e)
    {
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    }
    let pty_master = match &pty_parent {
        Some(sock) => sock
            .set_read_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ))
            .and_then(|()| recv_fd(sock))
            .map(|got| got.map(|(_, fd)| fd))
            .map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => setup_timed_out(),
                _ => e,
            }),
        None => Ok(None),
    };
    drop(pty_parent);
    let message = errors.wait(deadline);
    let started = (move || {
        match (ours, message) {
            (Err(e), _) if !peer_gone(&e) => return Err(e),
            (_, Ok(m)) if !m.is_empty() => return Err(io::Error::other(m)),
            (Err(e), _) => return Err(e),
            (Ok(()), Err(e)) => return Err(e),
            (Ok(()), Ok(_)) => {}
        }
        let pty_master = pty_master?;
        let child_fd = process::pidfd_open(child.as_raw())
            .map_err(|e| io::Error::new(e.kind(), format!("pidfd_open: {e}")))?;
        Ok((child_fd, pty_master))
    })();
    if started.is_err() {
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(child, None);
    }
    started
}

/// The payload's uid: the one asked for, else `uid_base` + the holder's pid (as the holder
/// computes it).
fn payload_uid(opts: &RunOptions, holder: Pid) -> u32 {
    opts.uid
        .unwrap_or_else(|| opts.uid_base + holder.as_raw() as u32)
}

fn serve_mounts(sock: &UnixStream, spec: &Spec, server: &dyn MountServer) -> io::Result<()> {
    while let Some((index, fd)) = recv_fd(sock)? {
        let mount = spec
            .mounts
            .get(index as usize)
            .ok_or_else(|| io::Error::other("fuse handoff for an unknown mount"))?;
        server.serve(mount, fd).map_err(mount_failed)?;
    }
    Ok(())
}

/// A mount's server failed: that is the reason the setup fails, whatever its kind. A kind that
/// reads as the child being gone (a peer that closed its connection: `UnexpectedEof`) would
/// otherwise let the child's own message, which only says its mounts were not served, win.
fn mount_failed(e: io::Error) -> io::Error {
    if peer_gone(&e) {
        io::Error::other(e.to_string())
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload's environment for `spec` given the launcher's `given`, as strings.
    fn env_strings(spec: &crate::spec::Spec, given: &[(&str, &str)]) -> Vec<String> {
        let given = given
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        payload_env(spec, Some(&given))
            .unwrap()
            .into_iter()
            .map(|c| c.into_string().unwrap())
            .collect()
    }

    #[test]
    fn a_net_proxy_payload_gets_the_proxy_variables_over_the_launchers() {
        let spec =
            crate::spec::parse("p.ns", "net proxy api.test\nenv HTTPS_PROXY LANG\n").unwrap();
        let env = env_strings(
            &spec,
            &[("HTTPS_PROXY", "http://elsewhere:1"), ("LANG", "C.UTF-8")],
        );
        assert!(
            env.contains(&"HTTPS_PROXY=http://127.0.0.1:3128".to_string()),
            "{env:?}"
        );
        assert!(env.contains(&"ALL_PROXY=socks5h://127.0.0.1:3128".to_string()));
        assert!(env.contains(&"no_proxy=localhost,127.0.0.1".to_string()));
        assert!(env.contains(&"LANG=C.UTF-8".to_string()));
        assert!(!env.iter().any(|e| e.contains("elsewhere")), "{env:?}");
    }

    #[test]
    fn a_spec_env_name_replaces_the_default_of_that_name() {
        let spec = crate::spec::parse("p.ns", "env PATH\n").unwrap();
        let env = env_strings(&spec, &[("PATH", "/opt/agent/bin:/usr/bin:/bin")]);
        let paths: Vec<&String> = env.iter().filter(|e| e.starts_with("PATH=")).collect();
        assert_eq!(paths, ["PATH=/opt/agent/bin:/usr/bin:/bin"], "{env:?}");
    }
}
