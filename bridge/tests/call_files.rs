//! `BridgeOptions::call_files` (`--call-files`, which nsd passes for `/tool` mounts only): a
//! call file opened for reading and writing has its first write answered at once and sent with
//! its first read, one round trip for both; everything a caller can see stays as it was.

mod common;

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::process::Command;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use common::{Mounted, Setup, assert_python_calls, call_result, python, run, wait_until};

fn mounted(call_files: bool) -> Mounted {
    Mounted::start_with(Setup {
        call_files,
        ..Setup::default()
    })
}

/// `call` opened for reading and writing, `args` written with one write(2).
fn call_written(m: &Mounted, args: &[u8]) -> std::fs::File {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("call"))
        .unwrap();
    f.write_all(args).unwrap();
    f
}

/// The property itself: after write(2) returned, the server has not seen the write (it goes with
/// the read); without the option it has.
#[test]
fn a_call_files_first_write_goes_out_with_its_first_read() {
    for call_files in [false, true] {
        let m = mounted(call_files);
        let mut f = call_written(&m, br#"{"x":1}"#);
        let seen = m.stats.call_writes.load(SeqCst);
        assert_eq!(
            seen,
            usize::from(!call_files),
            "call_files={call_files}: writes the server had taken when write(2) returned"
        );
        let mut out = String::new();
        f.read_to_string(&mut out).unwrap();
        assert_eq!(out, call_result(r#"{"x":1}"#));
        assert_eq!(m.stats.call_writes.load(SeqCst), 1);
        drop(f);
        m.unmount().unwrap();
    }
}

/// The idioms of `docs/bridge.md` give the same results with the option: two writes append in
/// order (the second sends the first before it), a shell's exec idiom, Python buffered and not.
#[test]
fn the_call_idioms_run_unchanged_with_call_files() {
    let m = mounted(true);
    for (script, want) in [
        (
            r#"exec 3<>call; printf '{"x":1}' >&3; cat <&3"#,
            r#"{"x":1}"#,
        ),
        (
            r#"exec 3<>call; printf 'ab' >&3; printf 'cd' >&3; cat <&3"#,
            "abcd",
        ),
    ] {
        let out = run(Command::new("bash")
            .current_dir(&m.mnt)
            .arg("-c")
            .arg(script));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), call_result(want));
    }
    let path = m.path("call");
    let path = path.to_str().unwrap();
    assert_python_calls(path);
    assert_eq!(m.stats.calls_run.load(SeqCst), 4);
    m.unmount().unwrap();
}

/// A refused write is never lost: deferred, it fails the read that carried it (with the write's
/// errno); a write-only open does not defer, so its write fails where it was made; a deferred
/// write followed by another fails that other.
#[test]
fn a_refused_deferred_write_fails_the_read_that_carried_it() {
    let m = mounted(true);
    let path = m.path("call");
    let path = path.to_str().unwrap();
    let script = "import sys, errno\n\
        f = open(sys.argv[1], 'r+b', buffering=0)\n\
        assert f.write(sys.argv[2].encode()) == len(sys.argv[2])\n\
        try:\n    f.read()\n    print('read succeeded')\n\
        except OSError as e:\n    print(errno.errorcode[e.errno])";
    assert_eq!(python(script, &[path, "REFUSE"]).trim(), "EFBIG");
    let second = "import sys, errno\n\
        f = open(sys.argv[1], 'r+b', buffering=0)\n\
        f.write(b'REFUSE')\n\
        try:\n    f.write(b'more')\n    print('second write succeeded')\n\
        except OSError as e:\n    print(errno.errorcode[e.errno])";
    assert_eq!(python(second, &[path]).trim(), "EFBIG");
    let out = run(Command::new("bash")
        .current_dir(&m.mnt)
        .arg("-c")
        .arg("printf REFUSE > call"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("File too large"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.unmount().unwrap();
}

/// Written and closed without a read: the write still reaches the server before the clunk, so
/// a server that records withdrawn calls (toolfs's `withdrawn` receipt) records their bytes.
#[test]
fn a_deferred_write_closed_unread_reaches_the_server_before_the_clunk() {
    let m = mounted(true);
    drop(call_written(&m, br#"{"w":1}"#));
    // RELEASE is asynchronous to close(2).
    assert!(
        wait_until(Duration::from_secs(5), || {
            m.stats.withdrawn.lock().unwrap().as_slice() == [br#"{"w":1}"#.to_vec()]
        }),
        "withdrawn: {:?}",
        m.stats.withdrawn.lock().unwrap()
    );
    assert_eq!(m.stats.calls_run.load(SeqCst), 0);
    m.unmount().unwrap();
}

/// A write after the call's first read fails with EBUSY at that write (specs/tool-tree.md §4.1),
/// with and without the option: it is never answered early and surfaced on the next read.
#[test]
fn a_write_after_the_first_read_fails_with_ebusy_where_it_is_made() {
    for call_files in [false, true] {
        let m = mounted(call_files);
        let path = m.path("call");
        let script = "import sys, errno\n\
            f = open(sys.argv[1], 'r+b', buffering=0)\n\
            f.write(b'ab')\n\
            first = f.read()\n\
            try:\n    f.write(b'cd')\n    print('write succeeded')\n\
            except OSError as e:\n    print(errno.errorcode[e.errno])\n\
            f.seek(2)\n\
            print(f.read() == first)";
        assert_eq!(
            python(script, &[path.to_str().unwrap()]).trim(),
            "EBUSY\nTrue",
            "call_files={call_files}"
        );
        m.unmount().unwrap();
    }
}

/// busybox's `cat` and `dd` read a call file through the shell's exec idiom as coreutils and
/// Python do: the answer, never a silent empty read. With and without the option.
#[test]
fn busybox_cat_and_dd_read_a_call_file() {
    for call_files in [false, true] {
        let m = mounted(call_files);
        for reader in [
            "busybox dd bs=65536 <&3 2>/dev/null",
            "cat <&3",
            "busybox cat <&3",
        ] {
            let script = format!(r#"exec 3<>call; printf '{{"x":1}}' >&3; {reader}"#);
            let out = run(Command::new("bash")
                .current_dir(&m.mnt)
                .arg("-c")
                .arg(&script));
            assert!(
                out.status.success(),
                "{script}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                call_result(r#"{"x":1}"#),
                "call_files={call_files}: {script}"
            );
        }
        m.unmount().unwrap();
    }
}
