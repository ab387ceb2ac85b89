//! Confinement: what is done, in `docs/confinement.md`'s order, to turn a forked launcher child into a
//! namespace whose pid 1 runs the payload. Each step is its own function in its own module;
//! this file only sequences them.
//!
//! Processes: the launcher forks a *holder* (stays in the host pid namespace, holds the new
//! namespaces, waits); the holder unshares and forks *pid 1* (builds the mount tree, drops
//! everything, becomes init); pid 1 forks the *payload*, which execs. Setup errors travel back
//! to the launcher on a close-on-exec pipe: EOF with no bytes means the exec happened.

pub mod binds;
pub mod creds;
pub mod fuse;
pub mod guard;
pub mod init;
pub mod landlock;
pub mod limits;
pub mod mounts;
pub mod seccomp;
pub mod sys;

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use nix::unistd::ForkResult;

use crate::spec::{Access, Net, Spec};
use binds::PreparedBind;

/// Everything the forked processes need, prepared by the launcher.
pub(crate) struct Plan {
    pub spec: Spec,
    pub binds: Vec<PreparedBind>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub uid: Option<u32>,
    pub uid_base: u32,
    pub weaker_landlock: bool,
    /// Setup errors go here; `None` once this process's copy is closed.
    pub err_pipe: Option<OwnedFd>,
    pub fuse_sock: Option<UnixStream>,
    /// Descriptors (open in the launcher, inherited) to become the payload's 0, 1, 2.
    pub stdio: Option<[RawFd; 3]>,
    /// Where pid 1 sends the master of the namespace's own pty (when the launcher has a tty).
    pub pty_sock: Option<UnixStream>,
    /// The pty's slave, set in pid 1, made the payload's controlling terminal and stdio.
    pub pty_slave: Option<OwnedFd>,
    /// The launcher terminal's window size, given to the pty before the command starts.
    pub pty_winsize: [u16; 4],
    pub cgroup_dir: Option<PathBuf>,
    /// pids/mem via rlimits (no cgroup).
    pub rlimit_pids_mem: bool,
    /// `net proxy`: the network namespace nsd made (with the proxy's listener in it), joined
    /// instead of a fresh one.
    pub net_ns: Option<OwnedFd>,
}

/// The namespaces every run gets (step 1).
pub const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWCGROUP);

/// Exit code of a process that failed before exec (the message is on the error pipe).
pub const SETUP_FAILED: i32 = 125;

pub(crate) fn fail(err_pipe: &Option<OwnedFd>, message: &str, code: i32) -> ! {
    if let Some(pipe) = err_pipe {
        let _ = nix::unistd::write(pipe, message.as_bytes());
    }
    sys::exit_now(code)
}

/// The holder: joins the cgroup, unshares the namespaces, makes `/` private, forks pid 1 and
/// waits for it. Never returns.
pub(crate) fn holder(mut plan: Plan) -> ! {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // A session of its own: terminal-generated signals reach only the launcher, which forwards
    // them (once) down holder → pid 1 → payload.
    let _ = nix::unistd::setsid();
    if let Some(fds) = plan.stdio {
        for (target, fd) in fds.into_iter().enumerate() {
            if let Err(e) = sys::dup_onto(fd, target as RawFd) {
                fail(&plan.err_pipe, &format!("stdio: {e}"), SETUP_FAILED);
            }
        }
    }
    if let Err(m) = close_inherited(&plan) {
        fail(&plan.err_pipe, &m, SETUP_FAILED);
    }
    if let Err(m) = enter_namespaces(&plan) {
        fail(&plan.err_pipe, &m, SETUP_FAILED);
    }
    let uid = plan
        .uid
        .unwrap_or_else(|| plan.uid_base + nix::unistd::getpid().as_raw() as u32);
    if let Err(m) = init::block_signals() {
        fail(&plan.err_pipe, &m, SETUP_FAILED);
    }
    match sys::fork_process() {
        Ok(ForkResult::Child) => pid1(&mut plan, uid),
        Ok(ForkResult::Parent { child }) => {
            drop(plan);
            sys::exit_now(init::supervise(child, None, false))
        }
        Err(e) => fail(&plan.err_pipe, &format!("fork pid 1: {e}"), SETUP_FAILED),
    }
}

/// Closes every descriptor the launcher had open except stdio and the plan's own, so neither
/// the holder nor the namespace's pid 1 keeps a copy of anything of the launcher's (nsd's
/// operator connections, a test harness's files).
fn close_inherited(plan: &Plan) -> Result<(), String> {
    let mut keep: Vec<RawFd> = vec![0, 1, 2];
    keep.extend(plan.err_pipe.as_ref().map(|f| f.as_raw_fd()));
    keep.extend(plan.fuse_sock.as_ref().map(|s| s.as_raw_fd()));
    keep.extend(plan.pty_sock.as_ref().map(|s| s.as_raw_fd()));
    keep.extend(plan.binds.iter().map(|b| b.tree.as_raw_fd()));
    keep.extend(plan.net_ns.as_ref().map(|f| f.as_raw_fd()));
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("listing fds: {e}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open {
        if !keep.contains(&fd) {
            // The read_dir's own fd is already closed or fails harmlessly here.
            let _ = nix::unistd::close(fd);
        }
    }
    Ok(())
}

/// Steps 1 and 2a.
fn enter_namespaces(plan: &Plan) -> Result<(), String> {
    if let Some(dir) = &plan.cgroup_dir {
        std::fs::write(dir.join("cgroup.procs"), "0")
            .map_err(|e| format!("joining cgroup {}: {e}", dir.display()))?;
    }
    unshare_namespaces(plan.net_ns.as_ref())?;
    mounts::make_root_private()
}

/// Unshares [`NAMESPACES`], but joins `net_ns` (a `net proxy` grant's network namespace, with
/// its proxy listener) instead of a fresh network namespace when given one.
pub fn unshare_namespaces(net_ns: Option<&OwnedFd>) -> Result<(), String> {
    let Some(fd) = net_ns else {
        return nix::sched::unshare(NAMESPACES).map_err(|e| format!("unshare namespaces: {e}"));
    };
    nix::sched::unshare(NAMESPACES.difference(CloneFlags::CLONE_NEWNET))
        .map_err(|e| format!("unshare namespaces: {e}"))?;
    nix::sched::setns(fd, CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("joining the granted network namespace: {e}"))
}

fn pid1(plan: &mut Plan, uid: u32) -> ! {
    match build(plan, uid) {
        Ok(payload) => {
            // Our copy of the error pipe must close so the launcher sees EOF at the exec, and of
            // the pty's slave so the launcher's relay ends with the payload.
            plan.err_pipe = None;
            plan.pty_slave = None;
            sys::exit_now(init::supervise(payload, plan.spec.limits.wall, true))
        }
        Err(m) => fail(&plan.err_pipe, &m, SETUP_FAILED),
    }
}

/// Steps 2–6 in pid 1, then the payload's fork. Returns the payload's pid.
fn build(plan: &mut Plan, uid: u32) -> Result<nix::unistd::Pid, String> {
    let root = mounts::tmpfs_root()?;
    // /tmp, HOME and /etc first: binds may land beneath /tmp and HOME, and the host /etc
    // files are binds into /etc.
    mounts::mount_tmp_and_home(&root, uid, plan.spec.limits.mem)?;
    mounts::write_etc(&root, uid)?;
    binds::attach_all(&root, &mut plan.binds)?;
    // nsd's own mounts beneath /dev (no spec line may land there): their points, made before
    // /dev turns read-only.
    let dev_points: Vec<&str> = plan
        .spec
        .mounts
        .iter()
        .filter_map(|m| m.path.strip_prefix("/dev/"))
        .collect();
    mounts::mount_dev(&root, &dev_points)?;
    mounts::mount_proc(&root)?;
    let mut mount_points = Vec::new();
    if !plan.spec.mounts.is_empty() {
        let sock = plan
            .fuse_sock
            .take()
            .ok_or("9P mounts need a FUSE handoff socket")?;
        for (i, m) in plan.spec.mounts.iter().enumerate() {
            mount_points.push(fuse::mount_and_send(&root, i as u32, m, &sock)?);
        }
        fuse::await_served(&sock)?;
    }
    plan.fuse_sock = None;
    mounts::pivot(&root)?;
    drop(root);
    plan.binds.clear();
    if let Some(sock) = plan.pty_sock.take() {
        plan.pty_slave = Some(open_pty(&sock, uid, plan.pty_winsize)?);
    }
    if matches!(plan.spec.net(), Net::Loopback | Net::Proxy) {
        sys::interface_up(c"lo").map_err(|e| format!("bringing lo up: {e}"))?;
    }
    nix::unistd::sethostname(crate::HOSTNAME).map_err(|e| format!("sethostname: {e}"))?;
    lock_down(&plan.spec, uid, mount_points, plan.weaker_landlock)?;
    match sys::fork_process().map_err(|e| format!("fork payload: {e}"))? {
        ForkResult::Child => payload(plan),
        ForkResult::Parent { child } => Ok(child),
    }
}

/// Steps 5 and 6, the namespace's own confinement of the calling process: capabilities and the
/// bounding set dropped, `uid`/`uid` with no supplementary groups, non-dumpable, no_new_privs,
/// the Landlock ruleset of `spec` (`mount_points`: O_PATH fds of its 9P mounts' roots, in spec
/// order), the seccomp filters. The namespace's pid 1 calls it before forking the payload; a
/// process attached later (`launch::attach`) calls it with the same arguments.
pub(crate) fn lock_down(
    spec: &Spec,
    uid: u32,
    mount_points: Vec<OwnedFd>,
    weaker_landlock: bool,
) -> Result<(), String> {
    creds::drop_to(uid)?;
    // A credential change clears these; set them again.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("non-dumpable: {e}"))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    landlock::restrict(&landlock_view(spec, mount_points), weaker_landlock)?;
    seccomp::install()
}

/// Step 7 (terminal): a pty on the namespace's own devpts, its slave owned by the payload's uid;
/// the master goes to the launcher, which relays it to its terminal.
pub(crate) fn open_pty(sock: &UnixStream, uid: u32, winsize: [u16; 4]) -> Result<OwnedFd, String> {
    let (master, slave) = sys::open_pty(c"/dev/pts/ptmx").map_err(|e| format!("pty: {e}"))?;
    sys::set_winsize(master.as_fd(), winsize).map_err(|e| format!("pty size: {e}"))?;
    nix::unistd::fchown(
        &slave,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(uid)),
    )
    .map_err(|e| format!("pty owner: {e}"))?;
    fuse::send_fd(sock, 0, master.as_fd()).map_err(|e| format!("handing off the pty: {e}"))?;
    Ok(slave)
}

fn landlock_view(spec: &Spec, ninep: Vec<OwnedFd>) -> landlock::View {
    let mut write: Vec<String> = vec!["/tmp".into(), crate::HOME.into(), "/dev/shm".into()];
    write.extend(
        spec.binds
            .iter()
            .filter(|b| b.access == Access::Write)
            .map(|b| b.path.clone()),
    );
    landlock::View {
        read: vec!["/".into()],
        write,
        devices: mounts::dev_nodes(),
        ninep,
        net: spec.net(),
    }
}

fn resolve_command(argv0: &CString) -> Result<CString, String> {
    let name = argv0.to_string_lossy();
    if name.contains('/') {
        return Ok(argv0.clone());
    }
    for dir in crate::PAYLOAD_PATH.split(':') {
        let candidate = format!("{dir}/{name}");
        if nix::unistd::access(candidate.as_str(), nix::unistd::AccessFlags::X_OK).is_ok() {
            return CString::new(candidate).map_err(|e| e.to_string());
        }
    }
    Err(format!(
        "{name}: command not found in the namespace (PATH={})",
        crate::PAYLOAD_PATH
    ))
}

/// Step 7 in the payload: signals, rlimits, cwd, fds, exec.
pub(crate) fn payload(plan: &Plan) -> ! {
    let run = || -> Result<std::convert::Infallible, String> {
        init::unblock_all()?;
        if let Some(tty) = &plan.pty_slave {
            sys::take_controlling_tty(tty.as_fd()).map_err(|e| format!("controlling tty: {e}"))?;
            for target in 0..3 {
                sys::dup_onto(tty.as_raw_fd(), target).map_err(|e| format!("pty stdio: {e}"))?;
            }
        }
        limits::apply_rlimits(&plan.spec.limits, plan.rlimit_pids_mem)?;
        nix::unistd::chdir(crate::HOME).map_err(|e| format!("chdir {}: {e}", crate::HOME))?;
        let argv0 = plan.argv.first().ok_or("empty command")?;
        let path = resolve_command(argv0)?;
        sys::cloexec_from(3).map_err(|e| format!("close_range: {e}"))?;
        nix::unistd::execve(&path, &plan.argv, &plan.env)
            .map_err(|e| format!("exec {}: {e}", path.to_string_lossy()))
    };
    match run() {
        Ok(never) => match never {},
        Err(m) => fail(&plan.err_pipe, &m, 127),
    }
}
