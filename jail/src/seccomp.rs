//! Step 6 (syscalls): four stacked seccomp filters, installed last before the payload runs.
//! The kernel runs every filter and takes the most severe answer, so they compose:
//!
//! 1. a deny-list answering EPERM (seccompiler): the mount API, namespace entry, tracing,
//!    keys, handles, modules, kexec, TIOCSTI/TIOCLINUX, `clone` with any CLONE_NEW* flag, and
//!    any chmod/open/creat/mknod whose mode carries S_ISUID or S_ISGID;
//! 2. ENOSYS for clone3 (so libc falls back to clone, whose flags filter 1 can read — clone3
//!    passes them in memory a filter cannot see), openat2 (same reason, for its mode),
//!    io_uring_* and bpf;
//! 3. a hand-written classic-BPF filter killing the process on a foreign architecture or an x32
//!    syscall number (nr & 0x40000000). seccompiler matches exact numbers only, so a
//!    deny-list alone is bypassable on kernels built with CONFIG_X86_X32_ABI;
//! 4. EAFNOSUPPORT for `socket`/`socketpair` of any family but AF_UNIX, AF_INET and AF_INET6
//!    ([`ALLOWED_SOCKET_FAMILIES`]): no agent or tool needs another, and some (AF_VSOCK, AF_ALG)
//!    reach past every namespace to the hypervisor or the kernel's crypto API.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// open_tree_attr (Linux 6.15), not yet in libc 0.2.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// Denied with EPERM.
fn eperm_syscalls() -> Vec<(&'static str, i64)> {
    vec![
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("chroot", libc::SYS_chroot),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("open_tree_attr", SYS_OPEN_TREE_ATTR),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("reboot", libc::SYS_reboot),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("acct", libc::SYS_acct),
    ]
}

/// Answered with ENOSYS ("not here"), so callers fall back or give up cleanly.
fn enosys_syscalls() -> Vec<(&'static str, i64)> {
    vec![
        ("clone3", libc::SYS_clone3),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("bpf", libc::SYS_bpf),
        // Its mode lives in a struct no filter can read (see SETID_MODE_ARGS); libc's open
        // never needs it.
        ("openat2", libc::SYS_openat2),
    ]
}

/// fchmodat2 (Linux 6.6), not yet in libc 0.2.
const SYS_FCHMODAT2: i64 = 452;

/// Syscalls that take a file mode, and which argument it is.
const SETID_MODE_ARGS: &[(i64, u8)] = &[
    (libc::SYS_chmod, 1),
    (libc::SYS_fchmod, 1),
    (libc::SYS_fchmodat, 2),
    (SYS_FCHMODAT2, 2),
    (libc::SYS_open, 2),
    (libc::SYS_openat, 3),
    (libc::SYS_creat, 1),
    (libc::SYS_mknod, 1),
    (libc::SYS_mknodat, 2),
];

const CLONE_NEW_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    // Dword: the kernel reads clone flags and ioctl numbers as 32-bit values, so the upper
    // half of the register must not be able to hide a match.
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn eperm_filter(allowed_clone_flags: u64) -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in eperm_syscalls() {
        rules.insert(nr, vec![]);
    }
    let mut clone_rules = Vec::new();
    for &flag in CLONE_NEW_FLAGS
        .iter()
        .filter(|&&f| f & allowed_clone_flags == 0)
    {
        clone_rules.push(
            SeccompRule::new(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?])
                .map_err(|e| e.to_string())?,
        );
    }
    rules.insert(libc::SYS_clone, clone_rules);
    let mut ioctl_rules = Vec::new();
    for req in [libc::TIOCSTI, libc::TIOCLINUX] {
        ioctl_rules.push(
            SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, req)?]).map_err(|e| e.to_string())?,
        );
    }
    rules.insert(libc::SYS_ioctl, ioctl_rules);
    // No set-id bits on anything the payload creates or chmods: a -w bind is the host's
    // filesystem, and nosuid only protects this namespace's mounts, not the host's view.
    for (nr, mode_arg) in SETID_MODE_ARGS {
        let mut r = Vec::new();
        for bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
            r.push(
                SeccompRule::new(vec![cond(*mode_arg, SeccompCmpOp::MaskedEq(bit), bit)?])
                    .map_err(|e| e.to_string())?,
            );
        }
        rules.insert(*nr, r);
    }
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .and_then(|f| f.try_into())
    .map_err(|e| format!("seccomp deny-list: {e}"))
}

fn enosys_filter(openat2_allowed: bool) -> Result<BpfProgram, String> {
    let rules = enosys_syscalls()
        .into_iter()
        .filter(|&(_, nr)| !(openat2_allowed && nr == libc::SYS_openat2))
        .map(|(_, nr)| (nr, vec![]))
        .collect();
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .and_then(|f| f.try_into())
    .map_err(|e| format!("seccomp enosys filter: {e}"))
}

/// The only socket families a payload or a tool worker may create. nsd brings `lo` up itself
/// (an AF_INET ioctl, before the filters), so nothing inside needs AF_NETLINK.
pub const ALLOWED_SOCKET_FAMILIES: &[i32] = &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6];

/// `socket(domain, …)` and `socketpair(domain, …)` with a domain outside
/// [`ALLOWED_SOCKET_FAMILIES`] answer EAFNOSUPPORT, as a kernel without that family would.
fn socket_family_filter() -> Result<BpfProgram, String> {
    let other_family = || -> Result<SeccompRule, String> {
        let conds = ALLOWED_SOCKET_FAMILIES
            .iter()
            .map(|&f| cond(0, SeccompCmpOp::Ne, f as u64))
            .collect::<Result<Vec<_>, _>>()?;
        SeccompRule::new(conds).map_err(|e| e.to_string())
    };
    let rules = [libc::SYS_socket, libc::SYS_socketpair]
        .into_iter()
        .map(|nr| Ok((nr, vec![other_family()?])))
        .collect::<Result<BTreeMap<_, _>, String>>()?;
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
        TargetArch::x86_64,
    )
    .and_then(|f| f.try_into())
    .map_err(|e| format!("seccomp socket-family filter: {e}"))
}

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Kill on a foreign arch or an x32 number; allow everything else (the other filters decide).
fn x32_kill_program() -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let (arch_off, nr_off) = (4, 0); // struct seccomp_data { int nr; __u32 arch; … }
    vec![
        stmt(BPF_LD | BPF_W | BPF_ABS, arch_off),
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD | BPF_W | BPF_ABS, nr_off),
        jump(BPF_JMP | BPF_JSET | BPF_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Installs all four. Needs no_new_privs (Landlock has set it; seccompiler sets it again).
pub fn install() -> Result<(), String> {
    install_relaxed(Relaxed::default())
}

/// What a tool worker needs beyond a namespace's payload (see `crate::setup`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Relaxed {
    /// CLONE_NEW* flags `clone` may use (the shell's worker: CLONE_NEWUSER | CLONE_NEWPID, a pid
    /// namespace per command). Every other namespace flag, unshare and setns stay denied.
    pub clone_flags: u64,
    /// openat2 is allowed: the workers resolve every tool path with RESOLVE_IN_ROOT. Its mode
    /// is then unfiltered (docs/gaps.md).
    pub openat2: bool,
}

/// [`install`] with a worker's relaxations.
pub fn install_relaxed(relaxed: Relaxed) -> Result<(), String> {
    let allowed = relaxed.clone_flags;
    let eperm = eperm_filter(allowed)?;
    let enosys = enosys_filter(relaxed.openat2)?;
    let families = socket_family_filter()?;
    seccomp_install(&x32_kill_program()).map_err(|e| format!("seccomp x32 filter: {e}"))?;
    seccompiler::apply_filter(&eperm).map_err(|e| format!("seccomp deny-list: {e}"))?;
    seccompiler::apply_filter(&enosys).map_err(|e| format!("seccomp enosys filter: {e}"))?;
    seccompiler::apply_filter(&families)
        .map_err(|e| format!("seccomp socket-family filter: {e}"))?;
    Ok(())
}

/// Installs a classic BPF seccomp program. The caller has set no_new_privs.
fn seccomp_install(program: &[libc::sock_filter]) -> std::io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies it.
    crate::syscall_ret::check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    })?;
    Ok(())
}
