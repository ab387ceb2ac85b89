//! nsd's run socket (`warren_ns::launch`): a real `warren-nsd serve` builds the namespace this
//! test (the launcher) asks for; the test holds no namespace code path of its own.

mod common;

use std::io::{BufRead, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use warren_ns::launch::client::{LaunchOptions, Launched, launch};
use warren_ns::launch::{Reply, Request, VERSION};

const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

fn spec(text: &str) -> warren_ns::Spec {
    warren_ns::parse("<test>", text).unwrap()
}

fn devnull(write: bool) -> OwnedFd {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .unwrap()
        .into()
}

fn ppid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Waits (bounded) until `cond` holds.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn launch_plain(
    nsd: &Nsd,
    text: &str,
    words: &[&str],
    stdio: [&OwnedFd; 3],
) -> std::io::Result<Launched> {
    launch(
        &nsd.dirs,
        &spec(text),
        &argv(words),
        &LaunchOptions::default(),
        [stdio[0].as_fd(), stdio[1].as_fd(), stdio[2].as_fd()],
    )
}

/// The namespace is built by nsd (its holder is nsd's child, not the launcher's), gets the
/// launcher's stdio, shows up in /ns with its info while it runs, and its status comes back.
#[test]
fn nsd_builds_it_with_the_launchers_stdio_and_status() {
    need_root();
    let nsd = start_nsd("wlch");
    let t = tempdir("wlio");
    let (stdin_r, stdin_w) = std::io::pipe().unwrap();
    let out: OwnedFd = std::fs::File::create(t.path().join("out")).unwrap().into();
    let err: OwnedFd = std::fs::File::create(t.path().join("err")).unwrap().into();
    let stdin_r: OwnedFd = stdin_r.into();
    let launched = launch_plain(
        &nsd,
        &format!("{SYSTEM}env WARREN_TEST_VALUE\n"),
        &[
            "/bin/sh",
            "-c",
            "read x; echo \"got $x $WARREN_TEST_VALUE\"; echo oops >&2; exit 7",
        ],
        [&stdin_r, &out, &err],
    )
    .unwrap();
    drop(stdin_r);

    let id = launched.id.to_string();
    assert!(ns_read(&nsd.dirs, "").unwrap().lines().any(|l| l == id));
    let info = ns_read(&nsd.dirs, &format!("{id}/info")).unwrap();
    assert_eq!(
        info_field(&info, "origin").as_deref(),
        Some("run"),
        "{info}"
    );
    assert_eq!(
        info_field(&info, "operator").as_deref(),
        Some("0"),
        "{info}"
    );
    assert_eq!(
        info_field(&info, "launcher"),
        Some(std::process::id().to_string()),
        "{info}"
    );
    assert_eq!(info_field(&info, "session"), Some(launched.session.clone()));
    assert!(info.contains("argv /bin/sh -c "), "{info}");
    assert!(info_field(&info, "started").is_some(), "{info}");
    let holder: u32 = info_field(&info, "holder").unwrap().parse().unwrap();
    // The namespace's holder is nsd's child: this process never built it.
    assert_eq!(
        ppid(holder),
        nsd.child.id(),
        "holder {holder} is not nsd's child"
    );
    assert_ne!(ppid(holder), std::process::id());
    let status = ns_read(&nsd.dirs, &format!("{id}/status")).unwrap();
    assert_eq!(status, format!("running holder={holder}\n"));

    let mut w = std::fs::File::from(OwnedFd::from(stdin_w));
    writeln!(w, "hello").unwrap();
    drop(w);
    assert_eq!(launched.wait().unwrap(), 7);
    assert_eq!(
        std::fs::read_to_string(t.path().join("out")).unwrap(),
        "got hello \n",
        "an env value not given by the launcher must not appear"
    );
    assert_eq!(
        std::fs::read_to_string(t.path().join("err")).unwrap(),
        "oops\n"
    );
    eventually("the ended namespace leaves /ns", || {
        !ns_read(&nsd.dirs, "").unwrap().lines().any(|l| l == id)
    });
}

/// Forwarded signals reach the command; a launcher that goes away takes its namespace with it.
#[test]
fn signals_are_forwarded_and_a_vanished_launcher_kills_the_namespace() {
    need_root();
    let nsd = start_nsd("wlch");
    let (out_r, out_w) = std::io::pipe().unwrap();
    let out_w: OwnedFd = out_w.into();
    let (null_in, null_err) = (devnull(false), devnull(true));
    let launched = launch_plain(
        &nsd,
        SYSTEM,
        &[
            "/bin/sh",
            "-c",
            "trap 'exit 41' INT; echo ready; while :; do sleep 0.1; done",
        ],
        [&null_in, &out_w, &null_err],
    )
    .unwrap();
    drop(out_w);
    let mut line = String::new();
    std::io::BufReader::new(out_r).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SIGKILL is not a signal a launcher may forward: nsd ignores it.
    launched.signal(libc::SIGKILL).unwrap();
    launched.signal(libc::SIGINT).unwrap();
    assert_eq!(launched.wait().unwrap(), 41);

    let null_out = devnull(true);
    let launched = launch_plain(
        &nsd,
        SYSTEM,
        &["/bin/sleep", "600"],
        [&null_in, &null_out, &null_err],
    )
    .unwrap();
    let id = launched.id.to_string();
    let info = ns_read(&nsd.dirs, &format!("{id}/info")).unwrap();
    let holder: u32 = info_field(&info, "holder").unwrap().parse().unwrap();
    assert!(Path::new(&format!("/proc/{holder}")).exists());
    drop(launched);
    eventually("the namespace dies with its launcher's connection", || {
        !Path::new(&format!("/proc/{holder}")).exists()
    });
    eventually("it leaves /ns", || {
        !ns_read(&nsd.dirs, "").unwrap().lines().any(|l| l == id)
    });
}

/// diod, a peer: missing is a failure (scripts/install-test-deps installs it).
fn diod() -> &'static str {
    ["/usr/sbin/diod", "/usr/bin/diod"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("diod is not installed (scripts/install-test-deps installs it)")
}

fn bridge_next_to_nsd() -> PathBuf {
    warren_test_support::bins::bin("warren-bridge")
}

/// A diod exporting a 3 MB file and a small one, listening on `listen` (a socket path or
/// HOST:PORT).
struct Diod {
    child: Child,
    export: PathBuf,
    big: Vec<u8>,
}

impl Drop for Diod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_diod(diod: &str, dir: &Path, listen: &str) -> Diod {
    let export = dir.join("export");
    std::fs::create_dir(&export).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(export.join("big"), &big).unwrap();
    std::fs::write(export.join("small"), "through diod\n").unwrap();
    let child = Command::new(diod)
        .args(["-f", "-n", "-L", "stderr", "-l", listen, "-e"])
        .arg(&export)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Diod { child, export, big }
}

/// Runs `cat small; cksum < big; ls` on the mount at /mnt/d and checks it against the export.
fn read_export_inside(nsd: &Nsd, dir: &Path, d: &Diod, mount_line: &str) {
    let out_path = dir.join("out");
    let out: OwnedFd = std::fs::File::create(&out_path).unwrap().into();
    let (null_in, null_err) = (devnull(false), devnull(true));
    let launched = launch_plain(
        nsd,
        &format!("{SYSTEM}{mount_line}\n"),
        &[
            "/bin/sh",
            "-c",
            "cat /mnt/d/small; cksum < /mnt/d/big; ls /mnt/d",
        ],
        [&null_in, &out, &null_err],
    )
    .unwrap();
    let code = launched.wait().unwrap();
    let got = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(code, 0, "{got}");
    assert_eq!(std::fs::read(d.export.join("big")).unwrap(), d.big);
    let host_sum = Command::new("cksum")
        .stdin(std::fs::File::open(d.export.join("big")).unwrap())
        .output()
        .unwrap();
    let want = format!(
        "through diod\n{}big\nsmall\n",
        String::from_utf8_lossy(&host_sum.stdout)
    );
    assert_eq!(got, want);
}

/// `mount unix!SOCKET PATH EXPORT`: the launcher connects to a real diod, nsd hands the
/// connection to a bridge, and the payload reads the export's bytes through FUSE.
#[test]
fn a_unix_mount_of_a_diod_export_is_read_inside() {
    need_root();
    let diod = diod();
    bridge_next_to_nsd();
    let nsd = start_nsd("wlch");
    let t = tempdir("wldd");
    let sock = t.path().join("d.sock");
    let d = start_diod(diod, t.path(), sock.to_str().unwrap());
    eventually("diod listens", || UnixStream::connect(&sock).is_ok());
    read_export_inside(
        &nsd,
        t.path(),
        &d,
        &format!(
            "mount unix!{} /mnt/d {}",
            sock.display(),
            d.export.display()
        ),
    );
}

/// `mount tcp!HOST!PORT PATH EXPORT`: the same over a TCP connection the launcher made (the
/// namespace itself has no network: `net none`).
#[test]
fn a_tcp_mount_of_a_diod_export_is_read_inside() {
    need_root();
    let diod = diod();
    bridge_next_to_nsd();
    let nsd = start_nsd("wlch");
    let t = tempdir("wldt");
    // A free port: the kernel's pick, released for diod to take.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = start_diod(diod, t.path(), &format!("127.0.0.1:{port}"));
    eventually("diod listens", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    read_export_inside(
        &nsd,
        t.path(),
        &d,
        &format!("mount tcp!127.0.0.1!{port} /mnt/d {}", d.export.display()),
    );
}

/// A `unix!` socket inside warren's runtime dir is refused by the launcher, and by nsd itself
/// when a launcher skips that check (the planted violation: a hand-made request); nsd also
/// refuses a connection for a mount that is its own to make.
#[test]
fn unix_mounts_inside_warrens_dirs_are_refused() {
    need_root();
    let nsd = start_nsd("wlch");
    let inside = nsd.dirs.socket("ns");
    let text = format!("{SYSTEM}mount unix!{} /mnt/x\n", inside.display());
    let (null_in, null_out, null_err) = (devnull(false), devnull(true), devnull(true));
    let err = match launch_plain(
        &nsd,
        &text,
        &["/bin/true"],
        [&null_in, &null_out, &null_err],
    ) {
        Ok(_) => panic!("a unix! mount inside the runtime dir was launched"),
        Err(e) => e,
    };
    assert!(
        err.to_string().contains("inside warren's runtime dir"),
        "{err}"
    );

    let raw = |spec_text: &str, target: &str| -> Reply {
        let conn = UnixStream::connect(&inside).unwrap();
        let request = Request {
            version: VERSION,
            spec: spec_text.to_string(),
            argv: argv(&["/bin/true"]),
            connections: vec![target.to_string()],
            ..Request::default()
        };
        let sock = UnixStream::connect(warren_ns::launch::socket_path(&nsd.dirs)).unwrap();
        warren_daemon::handoff::send(
            &sock,
            &serde_json::to_vec(&request).unwrap(),
            &[
                null_in.as_fd(),
                null_out.as_fd(),
                null_err.as_fd(),
                conn.as_fd(),
            ],
        )
        .unwrap();
        let (reply, _) = warren_daemon::handoff::recv(&sock).unwrap();
        serde_json::from_slice(&reply).unwrap()
    };
    match raw(&text, "/mnt/x") {
        Reply::Failed { message } => {
            assert!(message.contains("inside warren's runtime dir"), "{message}")
        }
        other => panic!("nsd accepted a unix! mount inside its runtime dir: {other:?}"),
    }
    match raw(&format!("{SYSTEM}mount tool /tool echo\n"), "/tool") {
        Reply::Failed { message } => {
            assert!(message.contains("no mount the launcher makes"), "{message}")
        }
        other => panic!("nsd took a launcher's connection for /tool: {other:?}"),
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|_| ppid(p) == pid)
        })
        .collect()
}

/// A setup error inside the namespace reaches the launcher as the namespace's own message,
/// however long, also with a mount in the spec (nsd then waits for the FUSE handoff too): never
/// a deadlock on a full error pipe, never "Broken pipe" in its place; and the failed launch
/// leaves no process and no namespace behind in nsd.
#[test]
fn a_setup_error_with_a_mount_is_the_namespaces_own_message_however_long() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let nsd = start_nsd("wlerr");
    let host = tempdir("wlsrc");
    // 300 components of 250 bytes: a 75 KB target, so its error overflows a 64 KiB pipe.
    let long: String = (0..300).map(|i| format!("/{i:0>250}")).collect();
    for target in [format!("/usr/newdir{long}"), "/usr/newdir/x".to_string()] {
        let text = format!(
            "{SYSTEM}bind -r {} {target}\nmount tool /tool echo\n",
            host.path().display()
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let dirs = nsd.dirs.clone();
        std::thread::spawn(move || {
            let (i, o, e) = (devnull(false), devnull(true), devnull(true));
            let launched = launch(
                &dirs,
                &spec(&text),
                &argv(&["/bin/true"]),
                &LaunchOptions::default(),
                [i.as_fd(), o.as_fd(), e.as_fd()],
            );
            let _ = tx.send(launched.err().map(|e| e.to_string()));
        });
        let err = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the launch hung")
            .expect("a bind under the read-only /usr was launched");
        let shown = &err[..err.len().min(300)];
        assert!(
            err.starts_with(&format!("binds: target {target}: Read-only file system")),
            "{shown}"
        );
    }
    eventually("nsd has no namespace and no child left", || {
        let listed = ns_read(&nsd.dirs, "").unwrap();
        listed.lines().all(|l| l == "clone") && children_of(nsd.child.id()).is_empty()
    });
}

/// nsd's death while a command runs reaches the launcher as that, never as a transport error.
#[test]
fn nsds_death_is_named_to_the_launcher() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let mut nsd = start_nsd("wlend");
    let (i, o, e) = (devnull(false), devnull(true), devnull(true));
    let launched = launch_plain(&nsd, SYSTEM, &["/bin/sleep", "1000"], [&i, &o, &e]).unwrap();
    nsd.child.kill().unwrap();
    let err = launched.wait().unwrap_err().to_string();
    assert!(err.starts_with("nsd ended (see `warren status`)"), "{err}");
}
