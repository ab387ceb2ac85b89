//! Real namespaces, built by `warren-nsd run` as root, checked from inside and outside.

mod common;

use std::process::{Command, Stdio};

use common::*;

/// The facts the brief asks for, read by a plain shell inside a namespace with the usual
/// read-only system binds.
#[test]
fn shell_sees_only_its_grant_and_no_privilege() {
    need_root();
    let script = r#"
        echo uid=$(id -u)
        grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
        cat /etc/shadow 2>&1 || true
        ls /root 2>&1 || true
        ls /work 2>&1 || true
        (echo x > /usr/warren-write-probe) 2>&1 || true
        echo pids=$(ls /proc | grep -E '^[0-9]+$' | tr '\n' ' ')
        echo hostname=$(cat /proc/sys/kernel/hostname)
        echo home=$HOME; touch $HOME/ok && echo home-writable
        touch /tmp/ok && echo tmp-writable
    "#;
    let out = nsd_run(&[], &["/bin/sh", "-c", script]);
    let so = text(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\n{so}\n{}",
        out.status,
        text(&out.stderr)
    );
    let uid: u32 = so
        .lines()
        .find_map(|l| l.strip_prefix("uid="))
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(uid, 0, "{so}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            so.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {so}"
        );
    }
    assert!(so.contains("NoNewPrivs:\t1"), "{so}");
    assert!(so.contains("Seccomp:\t2"), "{so}");
    assert!(
        so.contains("/etc/shadow: No such file or directory"),
        "{so}"
    );
    assert!(so.contains("/root': No such file or directory"), "{so}");
    assert!(so.contains("/work': No such file or directory"), "{so}");
    assert!(so.contains("Read-only file system"), "{so}");
    let pids: Vec<u32> = so
        .lines()
        .find_map(|l| l.strip_prefix("pids="))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // Our own pid namespace: init is 1, the shell 2, and the few commands it ran.
    assert!(
        pids.contains(&1) && pids.iter().all(|&p| p < 50),
        "{pids:?}"
    );
    assert!(so.contains("hostname=warren"), "{so}");
    assert!(
        so.contains("home=/home/agent") && so.contains("home-writable"),
        "{so}"
    );
    assert!(so.contains("tmp-writable"), "{so}");
}

#[test]
fn exit_status_signals_and_wall_limit() {
    need_root();
    let out = nsd_run(&[], &["/bin/sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = nsd_run(&[], &["/bin/sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
    let dir = tempdir("wwall");
    let spec = dir.path().join("wall.ns");
    std::fs::write(&spec, "limit wall=1\n").unwrap();
    let out = nsd_run(&["--ns", spec.to_str().unwrap()], &["/bin/sleep", "60"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", text(&out.stderr));
    // A missing command is a setup error, not a silent status.
    let out = nsd_run(&[], &["no-such-command-warren"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("command not found"),
        "{}",
        text(&out.stderr)
    );
}

/// A signal sent to the launcher reaches the confined command once, through holder and pid 1:
/// the command's TERM trap decides the exit status.
#[test]
fn signals_to_the_launcher_are_forwarded() {
    need_root();
    use std::io::BufRead;
    let script = "n=0; trap 'n=$((n+1))' INT; trap 'exit $((40+n))' TERM; echo ready; while :; do sleep 0.05; done";
    let mut child = Command::new(NSD)
        .args(["run", "--", "/bin/sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    // Let the INT trap run before TERM: wait for the loop to go round (read-only, no timing
    // assertion — the exit code says whether INT arrived exactly once).
    std::thread::sleep(std::time::Duration::from_millis(300));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(41), "INT delivered once, then TERM");
}

/// With a terminal on the launcher, the command gets a pty of the namespace's own devpts as its
/// controlling terminal, owned by its uid, with the launcher's window size; bytes are relayed
/// and the exit status propagates. `script` gives the launcher its terminal.
#[test]
fn launcher_tty_becomes_a_namespace_pty() {
    need_root();
    assert!(
        Command::new("script").arg("--version").output().is_ok(),
        "`script` (util-linux, essential on Debian) is missing"
    );
    let inner = format!(
        "stty cols 123 rows 45; {NSD} run -- /bin/sh -c 'tty; stty size; stat -c %U:%a $(tty); exit 5'"
    );
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let so = text(&out.stdout);
    assert!(
        so.contains("/dev/pts/0"),
        "the namespace's own devpts: {so}"
    );
    assert!(so.contains("45 123"), "window size carried over: {so}");
    assert!(so.contains("agent:620"), "pty owned by the payload: {so}");
    assert_eq!(out.status.code(), Some(5), "{so}");
}

/// warren's runtime, data and secrets dirs never enter a namespace: not by a direct bind, not
/// by a bind of an ancestor (`--ro /`, `--ro $HOME`), not through a symlink.
#[test]
fn protected_dirs_are_refused_by_inode() {
    need_root();
    let p = Protected::new();
    let home = p.path("home/me");
    std::fs::create_dir_all(&home).unwrap();
    // The data dir inside a "home", as a per-user install would have it.
    let data = home.join(".local/share/warren");
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::symlink(p.path("run"), home.join("innocent")).unwrap();
    let run = |flags: &[&str], data_dir: &std::path::Path| {
        let mut c = Command::new(NSD);
        p.apply(&mut c);
        c.env("WARREN_DATA_DIR", data_dir);
        c.arg("run").args(flags).args(["--", "/bin/true"]);
        c.output().unwrap()
    };
    let cases = [
        ("/".to_string(), "contains warren's"),
        (p.base.path().display().to_string(), "contains warren's"),
        (home.display().to_string(), "contains warren's data dir"),
        (
            p.path("run/warren").display().to_string(),
            "contains warren's runtime dir",
        ),
        (
            home.join("innocent").display().to_string(),
            "contains warren's runtime dir",
        ),
        (
            home.join("innocent/warren").display().to_string(),
            "warren's runtime dir",
        ),
        (
            p.path("etc").display().to_string(),
            "contains warren's secrets dir",
        ),
    ];
    for (path, needle) in &cases {
        let out = run(&["--ro", path], &data);
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(125),
            "--ro {path} was not refused: {err}"
        );
        assert!(err.contains(needle), "--ro {path}: {err}");
    }
    std::fs::create_dir_all(p.path("run/warren/sub")).unwrap();
    let out = run(&["--ro", p.path("run/warren/sub").to_str().unwrap()], &data);
    assert!(
        text(&out.stderr).contains("lies inside warren's runtime dir"),
        "{}",
        text(&out.stderr)
    );
    // Control: a sibling that holds none of them is bound fine.
    let clean = p.path("home/other");
    std::fs::create_dir_all(&clean).unwrap();
    let out = run(&["--ro", clean.to_str().unwrap()], &data);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The host's kernel interfaces are never bound in, at any target: proc, sysfs, devpts.
#[test]
fn kernel_filesystems_are_never_bind_sources() {
    need_root();
    let dir = tempdir("wkfs");
    for (source, fstype) in [
        ("/proc", "proc"),
        ("/proc/1", "proc"),
        ("/sys", "sysfs"),
        ("/dev/pts", "devpts"),
    ] {
        let spec = dir.path().join("k.ns");
        std::fs::write(&spec, format!("bind -r {source} /host\n")).unwrap();
        let out = nsd_run(&["--ns", spec.to_str().unwrap()], &["/bin/true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{source} was bound: {err}");
        assert!(
            err.contains(&format!("on a {fstype} mount")),
            "{source}: {err}"
        );
    }
    // Control: an ordinary directory binds.
    let spec = dir.path().join("ok.ns");
    std::fs::write(&spec, format!("bind -r {} /host\n", dir.path().display())).unwrap();
    let out = nsd_run(&["--ns", spec.to_str().unwrap()], &["/bin/true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Mounts made for a namespace never propagate out, even when the launcher's mounts are
/// shared (as on systemd hosts): run inside `unshare -m --propagation shared` and compare that
/// namespace's mount table before and after.
#[test]
fn no_mount_propagates_to_the_launcher() {
    need_root();
    let script = format!(
        "cat /proc/self/mountinfo > \"$1/before\"; {NSD} run -- /bin/sh -c 'ls /proc >/dev/null'; echo rc=$?; cat /proc/self/mountinfo > \"$1/after\""
    );
    let dir = tempdir("wprop");
    let out = Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "shared",
            "/bin/sh",
            "-c",
            &script,
            "sh",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).contains("rc=0"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let before = std::fs::read_to_string(dir.path().join("before")).unwrap();
    let after = std::fs::read_to_string(dir.path().join("after")).unwrap();
    assert!(
        before.contains("shared:"),
        "the outer namespace must really be shared: {before}"
    );
    assert_eq!(before, after, "a mount propagated out of the namespace");
}

/// `-R` refuses kernel-interface submounts; a non-recursive bind does not show submounts;
/// writes under a read-only bind and under a submount of a `-R` read-only bind fail.
#[test]
fn bind_recursion_and_read_only_submounts() {
    need_root();
    let dir = tempdir("wrec");
    let d = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("data/sub")).unwrap();
    std::fs::create_dir_all(dir.path().join("data/kproc")).unwrap();
    std::fs::write(
        dir.path().join("flat.ns"),
        format!("bind -r {d}/data /data\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("deep.ns"),
        format!("bind -r -R {d}/data /data\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("deep-rw.ns"),
        format!("bind -w -R {d}/data /data\n"),
    )
    .unwrap();
    let probe_bin = probe_path();
    let script = format!(
        r#"set -e
        mount -t tmpfs none {d}/data/sub
        echo seen > {d}/data/sub/marker
        {NSD} run --ro {probe_bin} --ns {d}/flat.ns -- /bin/sh -c 'ls /data/sub; echo flat-listed' || true
        {NSD} run --ro {probe_bin} --ns {d}/deep.ns -- /bin/sh -c 'cat /data/sub/marker; {probe_bin} write /data/sub/new; {probe_bin} write /data/new'
        {probe_bin} write {d}/data/sub/control
        mount -t proc proc {d}/data/kproc
        {NSD} run --ns {d}/deep-rw.ns -- /bin/true || echo refused-rc=$?
        "#
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "/bin/sh", "-c", &script])
        .output()
        .unwrap();
    let so = text(&out.stdout);
    let se = text(&out.stderr);
    let lines: Vec<&str> = so.lines().collect();
    // flat: the submount is not there, only its empty mount point
    assert_eq!(lines[0], "flat-listed", "{so}\n{se}");
    // deep: the submount's content, then both writes blocked, then the control allowed
    assert_eq!(lines[1], "seen", "{so}\n{se}");
    assert_eq!(
        lines[2], "blocked",
        "write under a submount of a -r -R bind: {so}\n{se}"
    );
    assert_eq!(lines[3], "blocked", "write under a -r bind: {so}\n{se}");
    assert_eq!(lines[4], "allowed", "control write outside: {so}\n{se}");
    assert!(se.contains("Read-only file system"), "{se}");
    assert_eq!(lines[5], "refused-rc=125", "{so}\n{se}");
    assert!(se.contains("holds a proc mount"), "{se}");
}

/// `net loopback` brings lo up (bind and connect work inside); `net none` has neither.
#[test]
fn net_loopback_and_none() {
    need_root();
    let probe_bin = probe_path();
    let script = format!("{probe_bin} tcp-bind");
    let out = nsd_run(
        &["--net", "loopback", "--ro", probe_path()],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(verdict(&out), "allowed", "{}", text(&out.stderr));
    let out = nsd_run(&["--ro", probe_path()], &["/bin/sh", "-c", &script]);
    assert_eq!(verdict(&out), "blocked", "{}", text(&out.stderr));
}

/// Inside, `socket` and `socketpair` of a family other than AF_UNIX, AF_INET, AF_INET6 fail
/// with EAFNOSUPPORT, the seccomp filter's answer (AF_NETLINK and AF_VSOCK work for anyone
/// outside and AF_NETLINK in any network namespace, so nothing else refuses them), while the
/// three allowed families still work.
#[test]
fn only_unix_and_inet_sockets_inside() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (CI runs the suite as root)"
    );
    let eafnosupport = std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT).to_string();
    for (probe, family) in [
        ("socket-family", "netlink"),
        ("socket-family", "vsock"),
        ("socket-family", "packet"),
        ("socket-family", "xdp"),
        ("socketpair-family", "netlink"),
    ] {
        let out = nsd_run(&["--ro", probe_path()], &[probe_path(), probe, family]);
        let err = text(&out.stderr);
        assert_eq!(verdict(&out), "blocked", "{probe} {family}: {err}");
        // Every socket type tried answered EAFNOSUPPORT, none anything else.
        let answers: Vec<&str> = err.split("; ").collect();
        assert!(
            answers.len() == 4 && answers.iter().all(|a| a.contains(&eafnosupport)),
            "{probe} {family}: {err}"
        );
    }
    for (probe, family) in [
        ("socket-family", "unix"),
        ("socket-family", "inet"),
        ("socketpair-family", "unix"),
    ] {
        let out = nsd_run(&["--ro", probe_path()], &[probe_path(), probe, family]);
        assert_eq!(
            verdict(&out),
            "allowed",
            "{probe} {family}: {}",
            text(&out.stderr)
        );
    }
}

/// The escape suite (common/escape.rs), each probe in a `warren-nsd run` of its own with the
/// grants it needs: every probe must be `blocked` inside and `allowed` in its control.
#[test]
fn escape_suite() {
    need_root();
    let targets = escape::Targets::new("wesc");
    let probes = escape::escape_probes(&targets);
    let mut findings = escape::Findings::default();
    for p in &probes {
        let mut flags: Vec<&str> = vec!["--ro", probe_path()];
        flags.extend(p.flags.iter().map(String::as_str));
        let argv = escape::inside_argv(p, &targets);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let inside = nsd_run(&flags, &argv);
        findings.judge("run", p, &inside, &escape::run_control(p, &targets));
    }
    targets.assert_no_setid_bits();
    assert!(probes.len() >= 48, "the suite shrank: {}", probes.len());
    findings.assert_none();
}
