//! `warren attach` at nsd's run socket (`warren_ns::launch::attach`): a real `warren-nsd serve`
//! runs a command inside a live namespace, and the escape suite's probes, rerun from that
//! attached process, are all refused (each with its control outside, as in `confinement.rs`).

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use warren_ns::launch::client::{LaunchOptions, Launched, attach, launch};

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
    need_root();
    let nsd = start_nsd("watt");
    let targets = escape::Targets::new("wats");
    let scratch = &targets.scratch;
    let s = |rel: &str| targets.path(rel);
    // One namespace with every grant the suite's probes need (its `--rw`, `--ro` of the suid
    // dir, `limit pids=64`): the attached process gets all of them.
    let probe_bin = probe_path();
    let spec = format!(
        "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n\
         bind -r {probe_bin} {probe_bin}\nbind -w {rw} {rw}\nbind -r {suid_dir} {suid_dir}\n\
         {pids}",
        pids = escape::PIDS_LIMIT,
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

    let run_socket = warren_ns::launch::socket_path(&nsd.dirs)
        .display()
        .to_string();
    let probes = escape::escape_probes(&targets);
    let mut findings = escape::Findings::default();
    for p in &probes {
        let inside = attached(&nsd, id, &escape::inside_argv(p, &targets), scratch.path());
        findings.judge("attached", p, &inside, &escape::run_control(p, &targets));
    }
    // A daemon's socket (nsd's run socket, by its host path): there outside, absent inside.
    assert!(exists(&run_socket), "the run socket is missing outside");
    let inside = attached(
        &nsd,
        id,
        &words(&[probe_path(), "read", &run_socket]),
        scratch.path(),
    );
    if verdict(&inside) != "blocked" || !text(&inside.stderr).contains("No such file or directory")
    {
        findings.escape("daemon-socket", &inside);
    }
    targets.assert_no_setid_bits();
    // Every probe of confinement.rs's escape suite (the same list).
    assert!(probes.len() >= 44, "the list shrank: {}", probes.len());
    findings.assert_none();

    // The namespace outlived every attached command; dropping its launcher ends it.
    assert!(exists(&format!("/proc/{payload}")), "the namespace ended");
    drop(launched);
}
