//! `warren attach` at nsd's run socket (`warren_ns::launch::attach`): a real `warren-nsd serve`
//! runs a command inside a live namespace, and the escape suite's probes, rerun from that
//! attached process, are all refused (each with its control outside, as in `confinement.rs`).

mod common;

use std::net::TcpListener;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use warren_daemon::Dirs;
use warren_ns::launch::client::{LaunchOptions, Launched, attach, launch};

struct Nsd {
    child: Child,
    dirs: Dirs,
    _base: tempfile::TempDir,
}

impl Drop for Nsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_nsd() -> Nsd {
    let base = tempdir("watt");
    let dirs = Dirs::under(base.path());
    std::fs::create_dir_all(&dirs.runtime).unwrap();
    let mut child = Command::new(NSD)
        .arg("serve")
        .env("WARREN_RUNTIME_DIR", &dirs.runtime)
        .env("WARREN_DATA_DIR", &dirs.data)
        .env("WARREN_SECRETS_DIR", &dirs.secrets)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // Readiness, not timing: until the run socket accepts (or nsd died).
    while UnixStream::connect(warren_ns::launch::socket_path(&dirs)).is_err() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("warren-nsd serve exited: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Nsd {
        child,
        dirs,
        _base: base,
    }
}

/// The children of `pid`, forked by any of its threads.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn open(path: &std::path::Path, write: bool) -> OwnedFd {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .create(write)
        .truncate(write)
        .open(path)
        .unwrap()
        .into()
}

/// Runs `argv` attached to namespace `id`; its status, stdout and stderr.
fn attached(nsd: &Nsd, id: u64, argv: &[String], scratch: &std::path::Path) -> Output {
    let (out, err) = (scratch.join("attach.out"), scratch.join("attach.err"));
    let stdio = [
        open(std::path::Path::new("/dev/null"), false),
        open(&out, true),
        open(&err, true),
    ];
    let code = attach(
        &nsd.dirs,
        id,
        argv,
        None,
        [stdio[0].as_fd(), stdio[1].as_fd(), stdio[2].as_fd()],
    )
    .and_then(|a| a.wait())
    .unwrap_or_else(|e| panic!("attach {argv:?}: {e}"));
    use std::os::unix::process::ExitStatusExt;
    Output {
        status: std::process::ExitStatus::from_raw(code << 8),
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    }
}

/// A probe: its arguments inside (attached) and in its control (outside), and who runs the
/// control — as `confinement.rs`'s escape suite has them.
struct Probe {
    name: &'static str,
    inside: Vec<String>,
    control: Vec<String>,
    who: Control,
}

fn probe(name: &'static str, who: Control) -> Probe {
    Probe {
        name,
        inside: vec![name.into()],
        control: vec![name.into()],
        who,
    }
}

fn with_args(name: &'static str, inside: &[&str], control: &[&str], who: Control) -> Probe {
    Probe {
        name,
        inside: inside.iter().map(|s| s.to_string()).collect(),
        control: control.iter().map(|s| s.to_string()).collect(),
        who,
    }
}

/// The namespace (`sleep 600`) nsd started for this test; its id, and its payload's pid.
fn start_namespace(nsd: &Nsd, spec: &str, scratch: &std::path::Path) -> (Launched, u32) {
    let null_in = open(std::path::Path::new("/dev/null"), false);
    let null_out = open(&scratch.join("ns.out"), true);
    let launched = launch(
        &nsd.dirs,
        &warren_ns::parse("<test>", spec).unwrap(),
        &["/bin/sleep".to_string(), "600".to_string()],
        &LaunchOptions::default(),
        [null_in.as_fd(), null_out.as_fd(), null_out.as_fd()],
    )
    .unwrap();
    // nsd's only child is the holder; its only child pid 1; pid 1's the payload.
    let deadline = Instant::now() + Duration::from_secs(20);
    let payload = loop {
        let found = children(nsd.child.id())
            .first()
            .and_then(|h| children(*h).first().copied())
            .and_then(|pid1| children(pid1).first().copied());
        if let Some(p) = found {
            break p;
        }
        assert!(Instant::now() < deadline, "the payload never appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    (launched, payload)
}

/// The attached process is in the namespace's own pid, mount, net, ipc, uts and cgroup
/// namespaces, under the payload's uid with no capability, no_new_privs and seccomp on; a
/// missing id is refused with a clear error; and every probe of the list below — run from the
/// attached process — is `blocked`, while its control outside is `allowed`.
#[test]
fn escape_probes_rerun_from_an_attached_process_are_refused() {
    if !need_root("escape_probes_rerun_from_an_attached_process_are_refused") {
        return;
    }
    let nsd = start_nsd();
    let scratch = tempdir("wats");
    let s = |rel: &str| scratch.path().join(rel).display().to_string();
    for d in ["ctl", "mnt", "rw", "ctl-rw", "suid"] {
        std::fs::create_dir_all(s(d)).unwrap();
        std::fs::set_permissions(s(d), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    // A setuid-root copy of the probe, and a symlink out of the writable bind.
    let suid = s("suid/warren-probe");
    std::fs::copy(PROBE, &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", s("rw/shadow-link")).unwrap();
    // One namespace with every grant the suite's probes need (its `--rw`, `--ro` of the suid
    // dir, `limit pids=64`): the attached process gets all of them.
    let spec = format!(
        "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n\
         bind -r {PROBE} {PROBE}\nbind -w {rw} {rw}\nbind -r {suid_dir} {suid_dir}\n\
         limit pids=64\n",
        rw = s("rw"),
        suid_dir = s("suid"),
    );
    let (launched, payload) = start_namespace(&nsd, &spec, scratch.path());
    let id = launched.id;
    let words = |w: &[&str]| -> Vec<String> { w.iter().map(|s| s.to_string()).collect() };

    // Same namespaces as the payload, same uid, nothing privileged.
    let out = attached(
        &nsd,
        id,
        &words(&[
            "/bin/sh",
            "-c",
            "for n in pid mnt net ipc uts cgroup; do readlink /proc/self/ns/$n; done; id -u; \
             grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; hostname",
        ]),
        scratch.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut expected = String::new();
    for n in ["pid", "mnt", "net", "ipc", "uts", "cgroup"] {
        let link = std::fs::read_link(format!("/proc/{payload}/ns/{n}")).unwrap();
        expected.push_str(&format!("{}\n", link.display()));
        let ours = std::fs::read_link(format!("/proc/self/ns/{n}")).unwrap();
        assert_ne!(link, ours, "the namespace shares our {n} namespace");
    }
    let status = std::fs::read_to_string(format!("/proc/{payload}/status")).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap();
    assert_ne!(uid, "0");
    expected.push_str(&format!("{uid}\n"));
    for line in [
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
    ] {
        expected.push_str(line);
        expected.push('\n');
    }
    expected.push_str("warren\n");
    let got = text(&out.stdout);
    let mut got_sorted: Vec<&str> = got.lines().collect();
    let mut want_sorted: Vec<&str> = expected.lines().collect();
    got_sorted.sort_unstable();
    want_sorted.sort_unstable();
    assert_eq!(
        got_sorted, want_sorted,
        "attached:\n{got}\nwanted:\n{expected}"
    );

    // With a pty: the command's terminal is a pty of the namespace's own devpts, whose master
    // comes back to the launcher; the status follows.
    let null: OwnedFd = open(std::path::Path::new("/dev/null"), true);
    let with_pty = attach(
        &nsd.dirs,
        id,
        &words(&["/bin/sh", "-c", "tty; stty size; exit 3"]),
        Some([33, 99, 0, 0]),
        [null.as_fd(), null.as_fd(), null.as_fd()],
    )
    .unwrap();
    let master = with_pty.pty_master.as_ref().expect("no pty master");
    let mut screen = Vec::new();
    let mut reader = std::fs::File::from(master.try_clone().unwrap());
    // Until the slave's last holder is gone (EIO).
    let _ = std::io::Read::read_to_end(&mut reader, &mut screen);
    assert_eq!(with_pty.wait().unwrap(), 3);
    let screen = text(&screen);
    assert!(
        screen.contains("/dev/pts/0") && screen.contains("33 99"),
        "{screen}"
    );

    // A missing id: refused, clearly, and nothing runs.
    let e = attach(
        &nsd.dirs,
        id + 1000,
        &words(&["/bin/true"]),
        None,
        [null.as_fd(), null.as_fd(), null.as_fd()],
    )
    .err()
    .expect("attach to a missing id succeeded");
    assert!(
        e.to_string()
            .contains(&format!("no running namespace {}", id + 1000)),
        "{e}"
    );

    // Outside things to aim at.
    let mut victim = Command::new("/bin/sleep")
        .arg("120")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = victim.id().to_string();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port().to_string();
    let abstract_name = format!("warren-attach-probe-{}", std::process::id());
    let _abs =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(&abstract_name).unwrap()).unwrap();
    let run_socket = warren_ns::launch::socket_path(&nsd.dirs)
        .display()
        .to_string();

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
        // A daemon's socket: absent inside (nsd's run socket, by its host path).
        with_args(
            "daemon-socket",
            &["read", &run_socket],
            &["read", &run_socket],
            Control::Root,
        ),
        with_args(
            "write-ro-bind",
            &["write", "/usr/warren-attach-probe-write"],
            &["write", &s("ctl/write")],
            Control::Root,
        ),
        with_args(
            "tcp-connect",
            &["tcp-connect", &port],
            &["tcp-connect", &port],
            Control::Nobody,
        ),
        with_args(
            "abstract-connect",
            &["abstract-connect", &abstract_name],
            &["abstract-connect", &abstract_name],
            Control::Nobody,
        ),
        with_args(
            "process_vm_readv",
            &["process_vm_readv", &pid],
            &["process_vm_readv", &pid],
            Control::Root,
        ),
        with_args(
            "proc-keys",
            &["read-some", "/proc/keys"],
            &["read-some", "/proc/keys"],
            Control::Nobody,
        ),
        with_args(
            "proc-timer_list",
            &["read-some", "/proc/timer_list"],
            &["read-some", "/proc/timer_list"],
            Control::Root,
        ),
        with_args(
            "proc-sys-write",
            &["open-write", "/proc/sys/kernel/hostname"],
            &["open-write", "/proc/sys/kernel/hostname"],
            Control::Root,
        ),
    ];
    for name in ["ptrace", "signal", "proc-root"] {
        probes.push(with_args(name, &[name, &pid], &[name, &pid], Control::Root));
    }
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

    for (name, path) in [
        ("symlink-out", s("rw/shadow-link")),
        (
            "dotdot-out",
            format!("{}/../../../../../etc/shadow", s("rw")),
        ),
    ] {
        probes.push(with_args(
            name,
            &["read", &path],
            &["read", &path],
            Control::Root,
        ));
    }
    probes.push(with_args(
        "setuid-bit",
        &["setuid-bit", &s("rw")],
        &["setuid-bit", &s("ctl-rw")],
        Control::Nobody,
    ));
    probes.push(with_args(
        "forkbomb-pids64",
        &["forkbomb", "200"],
        &["forkbomb", "200"],
        Control::Nobody,
    ));
    // Runs the setuid-root copy itself, not the probe with arguments (special-cased below).
    probes.push(with_args("setuid-exec", &[], &[], Control::Nobody));

    let mut escapes = Vec::new();
    let mut broken = Vec::new();
    for p in &probes {
        let (inside, control) = if p.name == "setuid-exec" {
            let argv = words(&[&suid, "euid-root"]);
            use std::os::unix::process::CommandExt;
            let control = Command::new(&suid)
                .arg("euid-root")
                .uid(NOBODY)
                .gid(NOBODY)
                .output()
                .unwrap();
            (attached(&nsd, id, &argv, scratch.path()), control)
        } else {
            let mut inside = vec![PROBE.to_string()];
            inside.extend(p.inside.iter().cloned());
            let control_args: Vec<&str> = p.control.iter().map(String::as_str).collect();
            (
                attached(&nsd, id, &inside, scratch.path()),
                control_output(p.who, &control_args),
            )
        };
        let (iv, cv) = (verdict(&inside), verdict(&control));
        eprintln!(
            "attached probe {:<18} inside={iv:<8} control({:?})={cv}   [{}]",
            p.name,
            p.who,
            text(&inside.stderr).trim()
        );
        // The daemon's socket is no file to read outside either; its control is that it exists.
        if p.name == "daemon-socket" {
            assert!(exists(&run_socket), "the run socket is missing outside");
        } else if cv != "allowed" {
            broken.push(format!(
                "{}: control says {cv:?}: {}",
                p.name,
                text(&control.stderr).trim()
            ));
        }
        let absent =
            p.name == "daemon-socket" && text(&inside.stderr).contains("No such file or directory");
        if iv != "blocked" || (p.name == "daemon-socket" && !absent) {
            escapes.push(format!(
                "{}: inside says {iv:?}: {} {}",
                p.name,
                text(&inside.stdout).trim(),
                text(&inside.stderr).trim()
            ));
        }
    }
    // What a chmod u+s inside did to the host's file: nothing.
    for f in ["rw/probe-chmod", "rw/probe-creat"] {
        if let Ok(m) = std::fs::metadata(s(f)) {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(m.mode() & 0o6000, 0, "{f} has a set-id bit outside");
        }
    }
    let _ = victim.kill();
    let _ = victim.wait();
    // Every probe of confinement.rs's escape suite (44), and nsd's run socket.
    assert!(probes.len() >= 45, "the list shrank: {}", probes.len());
    assert!(
        broken.is_empty(),
        "BROKEN probes (their control failed):\n{}",
        broken.join("\n")
    );
    assert!(escapes.is_empty(), "ESCAPES:\n{}", escapes.join("\n"));

    // The namespace outlived every attached command; dropping its launcher ends it.
    assert!(exists(&format!("/proc/{payload}")), "the namespace ended");
    drop(launched);
}
