//! The escape suite's probes, one list for its two runners: `warren-nsd run` (confinement.rs)
//! and a process attached to a live namespace (attach.rs). Each probe must be `blocked` inside
//! and `allowed` in its control outside; a control that is not `allowed` cannot detect anything,
//! so the probe is reported as broken.

use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};

use super::{Control, NOBODY, control_output, probe_path, tempdir, text, verdict};

/// What the probes aim at: a scratch dir (`ctl`, `mnt`, `rw`, `ctl-rw`, `suid`, all 0777), a
/// setuid-root copy of the probe, a symlink out of `rw`, an outside process, a TCP listener and
/// an abstract unix socket. Dropping it kills the outside process.
pub struct Targets {
    pub scratch: tempfile::TempDir,
    /// The setuid-root copy of the probe (in `suid/`).
    pub suid: String,
    /// The outside process's pid.
    pub pid: String,
    pub port: String,
    pub abstract_name: String,
    victim: Child,
    _tcp: TcpListener,
    _abstract: UnixListener,
}

impl Targets {
    pub fn new(prefix: &str) -> Targets {
        let scratch = tempdir(prefix);
        let s = |rel: &str| scratch.path().join(rel).display().to_string();
        for d in ["ctl", "mnt", "rw", "ctl-rw", "suid"] {
            std::fs::create_dir_all(s(d)).unwrap();
            std::fs::set_permissions(s(d), std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let suid = s("suid/warren-probe");
        std::fs::copy(probe_path(), &suid).unwrap();
        std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", s("rw/shadow-link")).unwrap();
        let victim = Command::new("/bin/sleep")
            .arg("120")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port().to_string();
        let abstract_name = format!("warren-probe-{}-{prefix}", std::process::id());
        let abstract_listener =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(&abstract_name).unwrap())
                .unwrap();
        Targets {
            suid,
            pid: victim.id().to_string(),
            port,
            abstract_name,
            victim,
            _tcp: tcp,
            _abstract: abstract_listener,
            scratch,
        }
    }

    /// A path under the scratch dir.
    pub fn path(&self, rel: &str) -> String {
        self.scratch.path().join(rel).display().to_string()
    }

    /// What a chmod u+s or a set-id creat inside did to the host's files: nothing.
    pub fn assert_no_setid_bits(&self) {
        for f in ["rw/probe-chmod", "rw/probe-creat"] {
            if let Ok(m) = std::fs::metadata(self.path(f)) {
                assert_eq!(m.mode() & 0o6000, 0, "{f} has a set-id bit outside");
            }
        }
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        let _ = self.victim.kill();
        let _ = self.victim.wait();
    }
}

pub struct Probe {
    pub name: &'static str,
    pub inside: Vec<String>,
    pub control: Vec<String>,
    pub who: Control,
    /// What the namespace must grant for it, as `warren-nsd run` flags (the attach runner
    /// grants them all in its one namespace).
    pub flags: Vec<String>,
}

pub fn probe(name: &'static str, who: Control) -> Probe {
    Probe {
        name,
        inside: vec![name.into()],
        control: vec![name.into()],
        who,
        flags: vec![],
    }
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

/// A probe with arguments: `inside` in the namespace, `control` outside.
pub fn with_args(name: &'static str, inside: &[&str], control: &[&str], who: Control) -> Probe {
    Probe {
        inside: words(inside),
        control: words(control),
        ..probe(name, who)
    }
}

/// The `limit` line the fork-bomb probe needs.
pub const PIDS_LIMIT: &str = "limit pids=64\n";

/// The escape suite (48 probes). The fork bomb's `--ns` flag names a spec file holding
/// [`PIDS_LIMIT`], written here.
pub fn escape_probes(t: &Targets) -> Vec<Probe> {
    let s = |rel: &str| t.path(rel);
    let limits = s("pids.ns");
    std::fs::write(&limits, PIDS_LIMIT).unwrap();
    let rw_flags = || words(&["--rw", &s("rw")]);
    let mut probes = vec![
        with_args(
            "mount",
            &["mount", "/tmp"],
            &["mount", &s("mnt")],
            Control::RootPrivateMounts,
        ),
        with_args(
            "umount",
            &["umount", "/tmp"],
            &["umount", "/proc"],
            Control::RootPrivateMounts,
        ),
        with_args(
            "mknod",
            &["mknod", "/tmp"],
            &["mknod", &s("ctl")],
            Control::Root,
        ),
        with_args(
            "read-shadow",
            &["read", "/etc/shadow"],
            &["read", "/etc/shadow"],
            Control::Root,
        ),
        with_args(
            "write-ro-bind",
            &["write", "/usr/warren-probe-write"],
            &["write", &s("ctl/write")],
            Control::Root,
        ),
        with_args(
            "proc-sys-write",
            &["open-write", "/proc/sys/kernel/hostname"],
            &["open-write", "/proc/sys/kernel/hostname"],
            Control::Root,
        ),
        with_args(
            "tcp-connect",
            &["tcp-connect", &t.port],
            &["tcp-connect", &t.port],
            Control::Nobody,
        ),
        with_args(
            "abstract-connect",
            &["abstract-connect", &t.abstract_name],
            &["abstract-connect", &t.abstract_name],
            Control::Nobody,
        ),
    ];
    for (name, who) in [
        ("unshare", Control::Root),
        ("userns", Control::Nobody),
        ("clone-newns", Control::Root),
        ("clone3", Control::Nobody),
        ("setns", Control::Root),
        ("chroot", Control::Root),
        ("pivot_root", Control::Root),
        ("open_by_handle_at", Control::Root),
        ("io_uring_setup", Control::Nobody),
        ("bpf", Control::Root),
        ("keyctl", Control::Nobody),
        ("add_key", Control::Nobody),
        ("perf_event_open", Control::Nobody),
        ("tiocsti", Control::Root),
        ("core_pattern", Control::Root),
        ("tcp-bind", Control::Nobody),
        ("x32", Control::Nobody),
        ("reboot", Control::Root),
        ("sethostname", Control::Root),
        ("setuid0", Control::Root),
        ("capset", Control::Root),
        ("fsopen", Control::Root),
        ("open_tree", Control::Root),
        ("raw-socket", Control::Root),
        ("userfaultfd", Control::Nobody),
    ] {
        probes.push(probe(name, who));
    }
    // Socket families no agent needs (the seccomp filter answers EAFNOSUPPORT): the ones this
    // kernel has, so each control can show the family is there. Root's controls for the ones
    // that need CAP_NET_RAW; AF_NETLINK and AF_VSOCK need nothing, and no network namespace
    // reaches AF_VSOCK.
    for (name, family, who) in [
        ("socket-netlink", "netlink", Control::Nobody),
        ("socket-vsock", "vsock", Control::Nobody),
        ("socket-packet", "packet", Control::Root),
        ("socket-xdp", "xdp", Control::Root),
    ] {
        probes.push(with_args(
            name,
            &["socket-family", family],
            &["socket-family", family],
            who,
        ));
    }
    for (name, path, who) in [
        ("proc-keys", "/proc/keys", Control::Nobody),
        ("proc-timer_list", "/proc/timer_list", Control::Root),
    ] {
        probes.push(with_args(
            name,
            &["read-some", path],
            &["read-some", path],
            who,
        ));
    }
    // Out of a bind by a symlink planted in it, and by `..`.
    for (name, path) in [
        ("symlink-out", s("rw/shadow-link")),
        (
            "dotdot-out",
            format!("{}/../../../../../etc/shadow", s("rw")),
        ),
    ] {
        probes.push(Probe {
            flags: rw_flags(),
            ..with_args(name, &["read", &path], &["read", &path], Control::Root)
        });
    }
    for name in ["ptrace", "signal", "proc-root", "process_vm_readv"] {
        probes.push(with_args(
            name,
            &[name, &t.pid],
            &[name, &t.pid],
            Control::Root,
        ));
    }
    probes.push(Probe {
        flags: rw_flags(),
        ..with_args(
            "setuid-bit",
            &["setuid-bit", &s("rw")],
            &["setuid-bit", &s("ctl-rw")],
            Control::Nobody,
        )
    });
    // Runs the setuid-root copy itself, not the probe with arguments ([`inside_argv`]).
    probes.push(Probe {
        flags: words(&["--ro", &s("suid")]),
        ..with_args("setuid-exec", &[], &[], Control::Nobody)
    });
    probes.push(Probe {
        flags: words(&["--ns", &limits]),
        ..with_args(
            "forkbomb-pids64",
            &["forkbomb", "200"],
            &["forkbomb", "200"],
            Control::Nobody,
        )
    });
    probes
}

/// The command a probe runs inside.
pub fn inside_argv(p: &Probe, t: &Targets) -> Vec<String> {
    if p.name == "setuid-exec" {
        return vec![t.suid.clone(), "euid-root".into()];
    }
    let mut argv = vec![probe_path().to_string()];
    argv.extend(p.inside.iter().cloned());
    argv
}

/// Runs a probe's control outside.
pub fn run_control(p: &Probe, t: &Targets) -> Output {
    if p.name == "setuid-exec" {
        return Command::new(&t.suid)
            .arg("euid-root")
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
    }
    let args: Vec<&str> = p.control.iter().map(String::as_str).collect();
    control_output(p.who, &args)
}

/// The escapes and broken probes found so far.
#[derive(Default)]
pub struct Findings {
    pub escapes: Vec<String>,
    pub broken: Vec<String>,
}

impl Findings {
    /// Judges one probe by its inside and control runs (`runner` names where it ran).
    pub fn judge(&mut self, runner: &str, p: &Probe, inside: &Output, control: &Output) {
        let (iv, cv) = (verdict(inside), verdict(control));
        eprintln!(
            "{runner} probe {:<18} inside={iv:<8} control({:?})={cv}   [{}]",
            p.name,
            p.who,
            text(&inside.stderr).trim()
        );
        if cv != "allowed" {
            self.broken.push(format!(
                "{}: control says {cv:?}: {}",
                p.name,
                text(&control.stderr).trim()
            ));
        }
        if iv != "blocked" {
            self.escape(p.name, inside);
        }
    }

    pub fn escape(&mut self, name: &str, inside: &Output) {
        let iv = verdict(inside);
        self.escapes.push(format!(
            "{name}: inside says {iv:?}: {} {}",
            text(&inside.stdout).trim(),
            text(&inside.stderr).trim()
        ));
    }

    pub fn assert_none(&self) {
        assert!(
            self.broken.is_empty(),
            "BROKEN probes (their control failed):\n{}",
            self.broken.join("\n")
        );
        assert!(
            self.escapes.is_empty(),
            "ESCAPES:\n{}",
            self.escapes.join("\n")
        );
    }
}
