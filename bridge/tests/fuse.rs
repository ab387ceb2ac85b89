//! The bridge on a real kernel FUSE mount, served from a real 9P connection (as root).

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{
    Mounted, Setup, assert_python_calls, call_result, python, run, wait_bounded, wait_until,
};

/// N threads × R rounds of call transactions with os.open/os.write/os.read/os.close, each with
/// its own input written in two pieces. Prints the number of transactions whose result was not
/// exactly their own input's.
const CONCURRENT_CALLS: &str = r#"
import os, sys, threading
path, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bad = []
start = threading.Barrier(n)
def worker(i):
    start.wait()
    for r in range(rounds):
        a, b = ('{"id":%d,' % i).encode(), ('"round":%d}' % r).encode()
        fd = os.open(path, os.O_RDWR)
        os.write(fd, a)
        os.write(fd, b)
        out = b''
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
        os.close(fd)
        if out != b'result:' + a + b:
            bad.append((i, r, out))
threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(len(bad), bad[:3])
"#;

#[test]
fn cat_of_a_static_file_and_a_listing() {
    let m = Mounted::start();
    let out = run(Command::new("cat").arg(m.path("static")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, common::STATIC_TEXT);
    let out = run(Command::new("ls").arg(&m.mnt));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "call\nscratch\nslow\nstatic\n"
    );
    let missing = std::fs::metadata(m.path("not-granted")).unwrap_err();
    assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    m.unmount().unwrap();
}

#[test]
fn bash_exec_idiom_runs_one_transaction() {
    let m = Mounted::start();
    let out = run(Command::new("bash")
        .current_dir(&m.mnt)
        .arg("-c")
        .arg(r#"exec 3<>call; printf '{"x":1}' >&3; cat <&3"#));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        call_result(r#"{"x":1}"#)
    );
    // Two writes append; the result does not depend on the offset of the first read.
    let out = run(Command::new("bash")
        .current_dir(&m.mnt)
        .arg("-c")
        .arg(r#"exec 3<>call; printf 'ab' >&3; printf 'cd' >&3; cat <&3"#));
    assert_eq!(String::from_utf8_lossy(&out.stdout), call_result("abcd"));
    assert_eq!(m.stats.calls_run.load(Ordering::SeqCst), 2);
    m.unmount().unwrap();
}

#[test]
fn python_unbuffered_and_buffered_read_write_run_one_transaction() {
    let m = Mounted::start();
    let path = m.path("call");
    let path = path.to_str().unwrap();
    assert_python_calls(path);
    m.unmount().unwrap();
}

#[test]
fn concurrent_transactions_never_see_each_others_results() {
    let m = Mounted::start_with(Setup {
        call_delay: Duration::from_millis(20),
        ..Default::default()
    });
    let out = python(
        CONCURRENT_CALLS,
        &[m.path("call").to_str().unwrap(), "50", "2"],
    );
    assert_eq!(out.trim(), "0 []");
    assert_eq!(m.stats.calls_run.load(Ordering::SeqCst), 100);
    m.unmount().unwrap();
}

/// A `cat` of `slow`, once its read is the `nth` to have reached the server (where it blocks).
fn cat_blocked_in_slow(m: &Mounted, nth: usize) -> std::process::Child {
    let cat = Command::new("cat")
        .arg(m.path("slow"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || m
        .stats
        .slow_reads_started
        .load(Ordering::SeqCst)
        == nth));
    cat
}

#[test]
fn a_read_blocked_in_the_server_blocks_neither_cat_nor_a_hundred_calls() {
    let m = Mounted::start();
    let mut blocked = cat_blocked_in_slow(&m, 1);

    let out = run(Command::new("cat").arg(m.path("static")));
    assert_eq!(out.stdout, common::STATIC_TEXT);
    let out = python(
        CONCURRENT_CALLS,
        &[m.path("call").to_str().unwrap(), "100", "1"],
    );
    assert_eq!(out.trim(), "0 []");
    assert_eq!(m.stats.calls_run.load(Ordering::SeqCst), 100);

    // All of that happened while the slow read was still blocked in the server.
    assert!(
        blocked.try_wait().unwrap().is_none(),
        "the slow reader finished early"
    );
    assert_eq!(m.stats.slow_reads_flushed.load(Ordering::SeqCst), 0);
    blocked.kill().unwrap();
    assert!(wait_bounded(&mut blocked, Duration::from_secs(5)).is_some());
    m.unmount().unwrap();
}

#[test]
fn a_sigkilled_reader_blocked_in_the_server_is_reaped_and_its_read_flushed() {
    let m = Mounted::start();
    let mut reader = cat_blocked_in_slow(&m, 1);
    reader.kill().unwrap(); // SIGKILL
    let status = wait_bounded(&mut reader, Duration::from_secs(5))
        .expect("the killed reader was not reaped within 5 s");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(
        wait_until(Duration::from_secs(5), || m
            .stats
            .slow_reads_flushed
            .load(Ordering::SeqCst)
            == 1),
        "the server never saw the read flushed"
    );
    // A second interrupt on the same connection works too (the first did not turn them off).
    let mut second = cat_blocked_in_slow(&m, 2);
    second.kill().unwrap();
    assert!(wait_bounded(&mut second, Duration::from_secs(5)).is_some());
    assert!(wait_until(Duration::from_secs(5), || m
        .stats
        .slow_reads_flushed
        .load(Ordering::SeqCst)
        == 2));
    m.unmount().unwrap();
}

#[test]
fn privileged_xattrs_are_refused_and_others_unsupported() {
    let m = Mounted::start();
    let script = r#"
import errno, os, struct, sys
p = sys.argv[1]
# A well-formed file capability (VFS_CAP_REVISION_2, effective, CAP_SYS_ADMIN permitted), so
# the kernel's own checks pass and the request reaches the bridge.
cap = struct.pack('<5I', 0x02000001, 1 << 21, 0, 0, 0)
def code(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
print(code(lambda: os.setxattr(p, 'security.capability', cap)),
      code(lambda: os.setxattr(p, 'security.warren', b'x')),
      code(lambda: os.setxattr(p, 'trusted.overlay.opaque', b'y')),
      code(lambda: os.setxattr(p, 'user.note', b'z')),
      code(lambda: os.getxattr(p, 'user.note')),
      os.listxattr(p))
"#;
    // (errno calls EOPNOTSUPP by its other Linux name, ENOTSUP.)
    assert_eq!(
        python(script, &[m.path("scratch").to_str().unwrap()]).trim(),
        "EPERM EPERM EPERM ENOTSUP ENODATA []"
    );
    m.unmount().unwrap();
}

#[test]
fn setid_bits_never_reach_the_server_and_chown_is_refused() {
    let m = Mounted::start();
    let scratch = m.path("scratch");
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o6755)).unwrap();
    assert_eq!(m.stats.modes_of("scratch"), vec![0o755]);
    assert_eq!(std::fs::metadata(&scratch).unwrap().mode() & 0o7777, 0o755);

    let chown = std::os::unix::fs::chown(&scratch, Some(1), Some(1)).unwrap_err();
    assert_eq!(chown.raw_os_error(), Some(libc::EPERM));

    let script = "import os, sys\nos.umask(0)\nos.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o4755))\nos.mkdir(sys.argv[2], 0o2775)";
    python(
        script,
        &[
            m.path("made").to_str().unwrap(),
            m.path("madedir").to_str().unwrap(),
        ],
    );
    assert_eq!(m.stats.modes_of("made"), vec![0o755]);
    assert_eq!(m.stats.modes_of("madedir"), vec![0o775]);
    m.unmount().unwrap();
}

#[test]
fn create_write_read_list_and_remove() {
    let m = Mounted::start();
    std::fs::write(m.path("notes"), b"some notes").unwrap();
    assert_eq!(std::fs::read(m.path("notes")).unwrap(), b"some notes");
    std::fs::create_dir(m.path("sub")).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["call", "notes", "scratch", "slow", "static", "sub"]);
    assert!(std::fs::metadata(m.path("sub")).unwrap().is_dir());
    std::fs::remove_file(m.path("notes")).unwrap();
    std::fs::remove_dir(m.path("sub")).unwrap();
    assert_eq!(
        std::fs::metadata(m.path("notes"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );
    let stat = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
    assert_eq!(stat.name_max(), 255);
    m.unmount().unwrap();
}

#[test]
fn unmount_makes_serve_return() {
    let m = Mounted::start();
    assert_eq!(
        std::fs::read(m.path("static")).unwrap(),
        common::STATIC_TEXT
    );
    m.unmount().expect("serve() returned Ok after the unmount");
}

#[test]
fn a_server_gone_for_good_gives_enotconn_never_a_hang() {
    let m = Mounted::start();
    let mut blocked = cat_blocked_in_slow(&m, 1);
    m.server.kill();
    let status = wait_bounded(&mut blocked, Duration::from_secs(10))
        .expect("the blocked reader hung after the server died");
    assert!(!status.success());
    let err = std::fs::read(m.path("static")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
    m.unmount().unwrap();
}

#[test]
fn a_restarted_server_is_reattached_and_names_rewalked() {
    let m = Mounted::start_with(Setup {
        reconnect: true,
        ..Default::default()
    });
    assert_eq!(
        std::fs::read(m.path("static")).unwrap(),
        common::STATIC_TEXT
    );
    let mut open_before = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("call"))
        .unwrap();
    open_before.write_all(b"lost").unwrap();
    m.server.kill();
    // A handle of the dead connection cannot be carried over: its transaction is gone.
    let mut buf = [0u8; 64];
    assert_eq!(
        open_before.read(&mut buf).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    // The kernel still caches the names; the bridge re-attached and re-walks them.
    assert_eq!(
        std::fs::read(m.path("static")).unwrap(),
        common::STATIC_TEXT
    );
    let out = run(Command::new("bash")
        .current_dir(&m.mnt)
        .arg("-c")
        .arg("exec 3<>call; printf again >&3; cat <&3"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), call_result("again"));
    // Still EIO for the old handle, and no further reconnect for it.
    assert_eq!(
        open_before.read(&mut buf).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    assert_eq!(m.server.connects.load(Ordering::SeqCst), 2);
    drop(open_before);
    m.unmount().unwrap();
}

/// A server that is not back yet (its reconnect fails) gives EIO, not ENOTCONN and never a
/// hang: the mount is not dead, and a later request, once the server is back, re-attaches.
#[test]
fn a_server_not_back_yet_gives_eio_and_a_later_request_reattaches() {
    let m = Mounted::start_with(Setup {
        reconnect: true,
        ..Default::default()
    });
    let mut blocked = cat_blocked_in_slow(&m, 1);
    m.server.refusing.store(true, Ordering::SeqCst);
    m.server.kill();
    let status = wait_bounded(&mut blocked, Duration::from_secs(10))
        .expect("the blocked reader hung after the server died");
    assert!(!status.success());
    let mut stderr = String::new();
    blocked
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("Input/output error"), "{stderr}");
    for _ in 0..2 {
        let err = std::fs::read(m.path("static")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
    }
    m.server.refusing.store(false, Ordering::SeqCst);
    assert_eq!(
        std::fs::read(m.path("static")).unwrap(),
        common::STATIC_TEXT
    );
    m.unmount().unwrap();
}

#[test]
fn names_are_cached_until_invalidated() {
    let m = Mounted::start();
    assert!(std::fs::metadata(m.path("static")).is_ok());
    m.server.shared.hide("static");
    // Cached for the entry timeout (60 s here): the withdrawn name still resolves...
    assert!(std::fs::metadata(m.path("static")).is_ok());
    // ...until the owner invalidates it; then it is absent at once.
    m.invalidate("/static").unwrap();
    let gone = std::fs::metadata(m.path("static")).unwrap_err();
    assert_eq!(gone.raw_os_error(), Some(libc::ENOENT));
    // Invalidating a name the kernel never cached is no error.
    m.invalidate("/never-looked-up").unwrap();
    m.unmount().unwrap();
}
