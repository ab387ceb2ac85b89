//! The confinement sequence, written once and run for each profile: the payload of a
//! namespace, a tool worker, a command attached to a live namespace. Each step is a named
//! function called in `docs/confinement.md`'s order; each failure is a [`SetupError`] naming
//! its [`Step`], written to the launcher's error pipe before the process `_exit`s.
//!
//! Processes: the launcher forks a *holder* ([`holder`]: stays in the host pid namespace,
//! holds the new namespaces, waits); the holder unshares and forks *pid 1* (builds the mount
//! tree, locks itself down); a namespace's pid 1 forks the *payload*, which execs and pid 1
//! becomes its init, while a worker's pid 1 execs itself. An *attacher* ([`attacher`]) joins a
//! live namespace instead of making one, locks down the same way and forks the command. Setup
//! errors travel back on a close-on-exec pipe: EOF with no bytes means the exec happened.
//!
//! This crate knows no spec language: the caller maps its own (warren's `Spec`, a worker's
//! build request) to a [`Plan`].

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::CloneFlags;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::Signal;
use nix::unistd::{ForkResult, Pid};

use crate::fuse::{self, SendFd};
use crate::landlock::{self, Network};
use crate::openat2::{Dir, openat2};
use crate::privilege;
use crate::{fds, init, loopback, mounts, process, seccomp, tty};

pub use crate::plan::{Command, Identity, Limits, LockDown, Names, Pid1, Plan, Tree, Wait};
pub use crate::step::{AtStep, EXEC_FAILED, SETUP_FAILED, SetupError, Step, report};

/// The namespaces every profile gets.
pub const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWCGROUP);

/// The namespaces an attacher joins through the holder's pidfd in one atomic `setns`. The pid
/// namespace is not among them: the holder's own is the host's; its children's comes from
/// `PIDFD_GET_PID_FOR_CHILDREN_NAMESPACE`.
const JOINED: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWCGROUP);

/// The holder: its own session, stdio, every inherited fd but the plan's closed, the cgroup,
/// the namespaces, `/` private; forks pid 1 and waits as `wait` says. Never returns.
pub fn holder(mut plan: Plan, wait: Wait) -> ! {
    if plan.die_with_launcher {
        let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    }
    let mut keep = plan.own_fds();
    if let Wait::Lifeline(fd) = &wait {
        keep.push(fd.as_raw_fd());
    }
    let supervise = matches!(wait, Wait::Supervise);
    let uid = match enter(&plan, &keep, supervise) {
        Ok(uid) => uid,
        Err(e) => report(&plan.err_pipe, &e, SETUP_FAILED),
    };
    let child = match process::fork_process().at(Step::ForkPid1) {
        Ok(ForkResult::Child) => pid1(&mut plan, uid),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => report(&plan.err_pipe, &e, SETUP_FAILED),
    };
    drop(plan);
    match wait {
        Wait::Supervise => process::exit_now(init::supervise(child, None, false)),
        Wait::Lifeline(lifeline) => wait_lifeline(child, lifeline),
    }
}

/// The holder's steps before the fork. Returns the (uid, gid) pid 1 will drop to.
fn enter(plan: &Plan, keep: &[RawFd], supervise: bool) -> Result<(u32, u32), SetupError> {
    // A session of its own: terminal-generated signals reach only the launcher, which forwards
    // them (once) down holder → pid 1 → payload.
    let _ = nix::unistd::setsid();
    stdio(plan.stdio)?;
    close_fds(keep)?;
    join_cgroup(plan)?;
    unshare_namespaces(plan.net_ns.as_ref()).at(Step::Namespaces)?;
    mounts::make_root_private().at(Step::PrivateRoot)?;
    let ids = match plan.identity {
        Identity::Fixed { uid, gid } => (uid, gid),
        Identity::HolderPid { base } => {
            let uid = base + nix::unistd::getpid().as_raw() as u32;
            (uid, uid)
        }
    };
    if supervise {
        init::block_signals().at(Step::BlockSignals)?;
    }
    Ok(ids)
}

fn stdio(fds: Option<[RawFd; 3]>) -> Result<(), SetupError> {
    if let Some(fds) = fds {
        for (target, fd) in fds.into_iter().enumerate() {
            fds::dup_onto(fd, target as RawFd).at(Step::Stdio)?;
        }
    }
    Ok(())
}

/// Closes every descriptor but `keep`, so no confined process keeps a copy of anything of the
/// launcher's (nsd's operator connections, a test harness's files).
fn close_fds(keep: &[RawFd]) -> Result<(), SetupError> {
    fds::close_all_but(keep).at(Step::CloseFds)
}

fn join_cgroup(plan: &Plan) -> Result<(), SetupError> {
    if let Some(dir) = &plan.cgroup_dir {
        std::fs::write(dir.join("cgroup.procs"), "0")
            .map_err(|e| format!("joining {}: {e}", dir.display()))
            .at(Step::Cgroup)?;
    }
    Ok(())
}

/// Unshares [`NAMESPACES`], but joins `net_ns` (a granted network namespace, with its proxy
/// listener) instead of a fresh network namespace when given one.
pub fn unshare_namespaces(net_ns: Option<&OwnedFd>) -> Result<(), String> {
    let Some(fd) = net_ns else {
        return nix::sched::unshare(NAMESPACES).map_err(|e| format!("unshare: {e}"));
    };
    nix::sched::unshare(NAMESPACES.difference(CloneFlags::CLONE_NEWNET))
        .map_err(|e| format!("unshare: {e}"))?;
    nix::sched::setns(fd, CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("joining the granted network namespace: {e}"))
}

/// The worker holder's wait: SIGKILLs pid 1 when the lifeline closes or pid 1 ends, reaps it,
/// exits; with its pid 1 the kernel kills the whole pid namespace.
fn wait_lifeline(child: Pid, lifeline: OwnedFd) -> ! {
    let Ok(pidfd) = process::pidfd_open(child.as_raw()) else {
        end_child(child, None)
    };
    loop {
        let mut fds = [
            PollFd::new(lifeline.as_fd(), PollFlags::POLLIN),
            PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {
                if fds
                    .iter()
                    .any(|f| f.revents().is_some_and(|r| !r.is_empty()))
                {
                    end_child(child, Some(&pidfd));
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => end_child(child, Some(&pidfd)),
        }
    }
}

/// SIGKILLs `child` (through its pidfd when there is one), reaps it, exits.
fn end_child(child: Pid, pidfd: Option<&OwnedFd>) -> ! {
    match pidfd {
        Some(fd) => {
            let _ = process::pidfd_signal(fd.as_fd(), libc::SIGKILL);
        }
        None => {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        }
    }
    let _ = nix::sys::wait::waitpid(child, None);
    process::exit_now(0)
}

/// pid 1: builds the tree, locks down, then runs the command as [`Plan::pid1`] says.
fn pid1(plan: &mut Plan, (uid, gid): (u32, u32)) -> ! {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    let built = build(plan, uid).and_then(|mount_points| {
        lock_down(&plan.lock_down, uid, gid, mount_points, plan.network)?;
        Ok(())
    });
    if let Err(e) = built {
        report(&plan.err_pipe, &e, SETUP_FAILED);
    }
    match plan.pid1 {
        Pid1::Exec => exec_command(plan),
        Pid1::Init => match process::fork_process().at(Step::ForkPayload) {
            Ok(ForkResult::Child) => exec_command(plan),
            Ok(ForkResult::Parent { child }) => {
                // Our copy of the error pipe must close so the launcher sees EOF at the exec,
                // and of the pty's slave so the launcher's relay ends with the payload.
                plan.err_pipe = None;
                plan.pty_slave = None;
                process::exit_now(init::supervise(child, plan.limits.wall, true))
            }
            Err(e) => report(&plan.err_pipe, &e, SETUP_FAILED),
        },
    }
}

/// pid 1's tree, then the pty, `lo`, the hostname and the command's handles. Returns O_PATH fds
/// of the FUSE mounts' roots, for their Landlock rules.
fn build(plan: &mut Plan, uid: u32) -> Result<Vec<OwnedFd>, SetupError> {
    let root = mounts::tmpfs_root().at(Step::RootTmpfs)?;
    // /tmp, home and /etc first: binds may land beneath /tmp and home, and the host /etc
    // files are binds into /etc.
    if let Some(size) = plan.tree.user_dirs {
        mounts::mount_tmp_and_home(&root, plan.names.home, uid, size).at(Step::TmpAndHome)?;
        mounts::write_etc(&root, uid, plan.names.home, plan.names.hostname).at(Step::Etc)?;
    }
    mounts::attach_binds(&root, &mut plan.tree.binds).at(Step::Binds)?;
    let dev_points: Vec<&str> = plan.tree.dev_points.iter().map(String::as_str).collect();
    mounts::mount_dev(&root, &dev_points).at(Step::Dev)?;
    if plan.tree.proc {
        mounts::mount_proc(&root).at(Step::Proc)?;
    }
    let mount_points = fuse_mounts(plan, &root).at(Step::FuseMounts)?;
    mounts::pivot(&root).at(Step::Pivot)?;
    drop(root);
    plan.tree.binds.clear();
    plan.net_ns = None;
    if let Some(sock) = plan.pty_sock.take() {
        plan.pty_slave = Some(open_pty(&sock, uid, plan.pty_winsize, plan.send_fd).at(Step::Pty)?);
    }
    if plan.network != Network::None {
        loopback::interface_up(c"lo").at(Step::Loopback)?;
    }
    nix::unistd::sethostname(plan.names.hostname).at(Step::Hostname)?;
    open_handles(&mut plan.command)?;
    Ok(mount_points)
}

fn fuse_mounts(plan: &mut Plan, root: &OwnedFd) -> Result<Vec<OwnedFd>, String> {
    let sock = plan.fuse_sock.take();
    if plan.tree.fuse_mounts.is_empty() {
        return Ok(Vec::new());
    }
    let sock = sock.ok_or("9P mounts need a FUSE handoff socket")?;
    let mut points = Vec::new();
    for (i, path) in plan.tree.fuse_mounts.iter().enumerate() {
        points.push(fuse::mount_and_send(
            root,
            i as u32,
            path,
            &sock,
            plan.send_fd,
        )?);
    }
    fuse::await_served(&sock)?;
    Ok(points)
}

/// A pty on the namespace's own devpts, its slave owned by `uid`; the master goes to the
/// launcher, which relays it to its terminal.
fn open_pty(
    sock: &UnixStream,
    uid: u32,
    winsize: [u16; 4],
    send: SendFd,
) -> Result<OwnedFd, String> {
    let (master, slave) = tty::open_pty(c"/dev/pts/ptmx").map_err(|e| e.to_string())?;
    tty::set_winsize(master.as_fd(), winsize).map_err(|e| format!("size: {e}"))?;
    nix::unistd::fchown(
        &slave,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(uid)),
    )
    .map_err(|e| format!("owner: {e}"))?;
    send(sock, 0, master.as_fd()).map_err(|e| format!("handing off: {e}"))?;
    Ok(slave)
}

/// Each of the command's `open_in_root` directories, opened in the new root: the command gets
/// them across the exec.
fn open_handles(command: &mut Command) -> Result<(), SetupError> {
    for path in &command.open_in_root {
        let fd = openat2(
            Dir::Cwd,
            path.as_str(),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            libc::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|e| format!("{path}: {e}"))
        .at(Step::OpenHandles)?;
        command.pass.push(fd);
    }
    Ok(())
}

/// The lock-down of the calling process, the same for every profile, in this order:
/// capabilities and the bounding set dropped, `uid`/`gid` with no supplementary groups
/// ([`privilege::drop_to`]); PDEATHSIG again and non-dumpable (a credential change
/// clears both); no_new_privs; the Landlock ruleset (`mount_points`: O_PATH fds of the 9P
/// mounts' roots); the seccomp filters, last.
pub fn lock_down(
    conf: &LockDown,
    uid: u32,
    gid: u32,
    mount_points: Vec<OwnedFd>,
    network: Network,
) -> Result<(), SetupError> {
    privilege::drop_to(&privilege::Identity::new(uid, gid)).at(Step::DropPrivileges)?;
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    nix::sys::prctl::set_dumpable(false).at(Step::Dumpable)?;
    nix::sys::prctl::set_no_new_privs().at(Step::NoNewPrivs)?;
    let view = landlock::View {
        read: vec!["/".into()],
        write: conf.write.clone(),
        devices: mounts::dev_nodes(),
        ninep: mount_points,
        net: network,
    };
    landlock::restrict(&view, conf.weaker_landlock).at(Step::Landlock)?;
    seccomp::install_relaxed(conf.seccomp).at(Step::Seccomp)
}

/// The command's own steps, after the lock-down: signals, tty, rlimits, cwd, fds, exec.
/// Never returns.
fn exec_command(plan: &Plan) -> ! {
    let code = if plan.pid1 == Pid1::Exec {
        SETUP_FAILED
    } else {
        EXEC_FAILED
    };
    match try_exec(plan) {
        Ok(never) => match never {},
        Err(e) => report(&plan.err_pipe, &e, code),
    }
}

fn try_exec(plan: &Plan) -> Result<Infallible, SetupError> {
    init::unblock_all().at(Step::UnblockSignals)?;
    if let Some(tty) = &plan.pty_slave {
        tty::take_controlling_tty(tty.as_fd()).at(Step::ControllingTty)?;
        for target in 0..3 {
            fds::dup_onto(tty.as_raw_fd(), target).at(Step::ControllingTty)?;
        }
    }
    apply_rlimits(&plan.limits).at(Step::Rlimits)?;
    let cmd = &plan.command;
    nix::unistd::chdir(cmd.cwd.as_str())
        .map_err(|e| format!("{}: {e}", cmd.cwd))
        .at(Step::Chdir)?;
    let program = match &cmd.program {
        Some(p) => p.clone(),
        None => resolve_command(cmd.argv.first(), plan.names.path).at(Step::Command)?,
    };
    // Nothing but stdio and the passed handles crosses the exec (the error pipe closes at it).
    fds::cloexec_from(3).at(Step::KeepFds)?;
    let mut argv = cmd.argv.clone();
    for fd in &cmd.pass {
        fds::keep_across_exec(fd.as_raw_fd()).at(Step::KeepFds)?;
        argv.push(CString::new(fd.as_raw_fd().to_string()).at(Step::KeepFds)?);
    }
    nix::unistd::execve(&program, &argv, &cmd.env)
        .map_err(|e| format!("{}: {e}", program.to_string_lossy()))
        .at(Step::Exec)
}

/// RLIMIT_NPROC, _AS, _CPU as given, and no core dumps.
fn apply_rlimits(limits: &Limits) -> Result<(), String> {
    let set = |r: Resource, v: u64, name: &str| {
        setrlimit(r, v, v).map_err(|e| format!("setrlimit {name}={v}: {e}"))
    };
    if let Some(p) = limits.pids {
        set(Resource::RLIMIT_NPROC, p, "pids")?;
    }
    if let Some(m) = limits.mem {
        set(Resource::RLIMIT_AS, m, "mem")?;
    }
    if let Some(c) = limits.cpu {
        set(Resource::RLIMIT_CPU, c, "cpu")?;
    }
    set(Resource::RLIMIT_CORE, 0, "core")
}

fn resolve_command(argv0: Option<&CString>, path: &str) -> Result<CString, String> {
    let argv0 = argv0.ok_or("empty command")?;
    let name = argv0.to_string_lossy();
    if name.contains('/') {
        return Ok(argv0.clone());
    }
    for dir in path.split(':') {
        let candidate = format!("{dir}/{name}");
        if nix::unistd::access(candidate.as_str(), nix::unistd::AccessFlags::X_OK).is_ok() {
            return CString::new(candidate).map_err(|e| e.to_string());
        }
    }
    Err(format!(
        "{name}: command not found in the namespace (PATH={path})"
    ))
}

/// The attacher: non-dumpable from the start, its own session, stdio, every inherited fd but
/// the plan's and `holder` closed, the cgroup, the namespaces joined through `holder` (a pidfd
/// of the namespace's holder, never a pid), the pty, the same lock-down as the namespace's
/// pid 1; forks the command (which lands in the namespace's pid namespace: a pid-namespace
/// `setns` applies to children only), forwards signals and exits with its status. Never
/// returns.
pub fn attacher(mut plan: Plan, holder: OwnedFd) -> ! {
    if let Err(e) = join(&mut plan, holder) {
        report(&plan.err_pipe, &e, SETUP_FAILED);
    }
    match process::fork_process().at(Step::ForkPayload) {
        Ok(ForkResult::Child) => {
            // The attacher is outside this pid namespace (getppid says 0); if it is already
            // gone, the PDEATHSIG came too late: leave.
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            if nix::unistd::getppid().as_raw() != 0 {
                process::exit_now(SETUP_FAILED);
            }
            exec_command(&plan)
        }
        Ok(ForkResult::Parent { child }) => {
            // Our copies must close: the launcher sees EOF at the command's exec, and the relay
            // ends with the command.
            plan.err_pipe = None;
            plan.pty_slave = None;
            process::exit_now(init::supervise(child, None, false))
        }
        Err(e) => report(&plan.err_pipe, &e, SETUP_FAILED),
    }
}

/// The attacher's steps up to the fork.
fn join(plan: &mut Plan, holder: OwnedFd) -> Result<(), SetupError> {
    // Nothing in the namespace may ptrace or read the memory of this still-privileged process.
    nix::sys::prctl::set_dumpable(false).at(Step::Dumpable)?;
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // A session of its own: terminal signals reach only the launcher, which forwards them.
    let _ = nix::unistd::setsid();
    stdio(plan.stdio)?;
    let mut keep = plan.own_fds();
    keep.push(holder.as_raw_fd());
    close_fds(&keep)?;
    join_cgroup(plan)?;
    join_namespaces(holder).at(Step::Join)?;
    let Identity::Fixed { uid, gid } = plan.identity else {
        return Err("an attached command needs the namespace's uid").at(Step::Join);
    };
    if let Some(sock) = plan.pty_sock.take() {
        plan.pty_slave = Some(open_pty(&sock, uid, plan.pty_winsize, plan.send_fd).at(Step::Pty)?);
    }
    let root = std::fs::File::open("/")
        .map_err(|e| format!("opening /: {e}"))
        .at(Step::FuseMounts)?;
    let mount_points = plan
        .tree
        .fuse_mounts
        .iter()
        .map(|path| fuse::open_mount_root(root.as_fd(), path))
        .collect::<Result<Vec<_>, _>>()
        .at(Step::FuseMounts)?;
    drop(root);
    lock_down(&plan.lock_down, uid, gid, mount_points, plan.network)?;
    init::block_signals().at(Step::BlockSignals)
}

/// `setns` into every namespace of `holder`'s (its children's pid namespace included), then
/// `chdir /` (setns(mnt) moved root and cwd to the namespace's root; say so explicitly).
fn join_namespaces(holder: OwnedFd) -> Result<(), String> {
    let pid_ns = process::pidfd_namespace(
        holder.as_fd(),
        process::PIDFD_GET_PID_FOR_CHILDREN_NAMESPACE,
    )
    .map_err(|e| format!("the namespace's pid namespace: {e}"))?;
    let mut flags = JOINED;
    if joins_a_user_namespace(&holder)? {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    nix::sched::setns(&holder, flags).map_err(|e| format!("setns through the holder: {e}"))?;
    nix::sched::setns(&pid_ns, CloneFlags::CLONE_NEWPID)
        .map_err(|e| format!("setns pid namespace: {e}"))?;
    drop(pid_ns);
    drop(holder);
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))
}

/// Whether the holder is in a user namespace other than ours (warren's namespaces have none
/// today; joining one first would be required if they did).
fn joins_a_user_namespace(holder: &OwnedFd) -> Result<bool, String> {
    let theirs = process::pidfd_namespace(holder.as_fd(), process::PIDFD_GET_USER_NAMESPACE)
        .map_err(|e| format!("the namespace's user namespace: {e}"))?;
    let theirs = std::fs::File::from(theirs)
        .metadata()
        .map_err(|e| format!("stat user namespace: {e}"))?;
    let ours = std::fs::metadata("/proc/self/ns/user")
        .map_err(|e| format!("stat /proc/self/ns/user: {e}"))?;
    Ok((theirs.dev(), theirs.ino()) != (ours.dev(), ours.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the launcher shows for a failed setup names the step first, then the step's own
    /// words.
    #[test]
    fn a_setup_error_names_its_step() {
        let e = Err::<(), _>("target /usr/x: Read-only file system")
            .at(Step::Binds)
            .unwrap_err();
        assert_eq!(e.step, Step::Binds);
        assert_eq!(e.to_string(), "binds: target /usr/x: Read-only file system");
        let e = resolve_command(Some(&CString::new("nope").unwrap()), "/nonexistent")
            .at(Step::Command)
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("command: nope: command not found in the namespace"),
            "{e}"
        );
    }
}
