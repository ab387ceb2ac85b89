//! Interop: the real Linux v9fs client mounts a granted toolfs tree and makes calls.
//!
//! This host's kernel has no 9P, so `scripts/v9fs-vm` boots a stock Debian kernel under QEMU (TCG)
//! whose v9fs mounts a stream that reaches the host over a virtio-serial port: once with
//! `trans=unix` (a guest Unix socket) and once with `trans=fd` (a socketpair end, the way nsd will
//! mount toolfs where the kernel has 9P).
//! The test plays nsd: QEMU connects to a socket of ours, and the accepted connection is handed to
//! the real `warren-toolfs` on its control socket with a grant of `echo` and `fs_read`. The guest
//! runs shell commands; each one's exit status and exact output come back as a marker line on the
//! console, and every assertion is made here, on the host. Needs what `scripts/install-test-deps`
//! installs (qemu-system-x86, busybox-static, socat, a Debian kernel in target/peers/kernel);
//! it never skips: a missing piece fails the test with that script's name.

mod common;

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use warren_toolfs::{Status, Taint};

/// The guest's commands: `step NAME 'shell'` (defined by scripts/v9fs-vm) reports each one.
/// `exec 3<>` is the shell call idiom: the write lands at 0, `cat` reads on from the end of it.
/// `flushed_read` kills a `cat` blocked in a running call: v9fs sends Tflush for its Tread, and
/// the next read on the same open must return that call's result (the call runs once).
const GUEST_COMMANDS: &str = r#"
step ls 'ls /mnt'
step ls_echo 'ls /mnt/echo'
step tools 'cat /mnt/tools'
step fs_read_doc 'cat /mnt/fs_read/doc'
step echo_call 'exec 3<>/mnt/echo/call; printf "{\"text\":\"v9fs\"}" >&3; cat <&3'
step echo_reread 'exec 3<>/mnt/echo/call; printf "{\"n\":1}" >&3; cat <&3; cat <&3'
step fs_read_call 'exec 3<>/mnt/fs_read/call; printf "{\"path\":\"/docs/hello.txt\"}" >&3; cat <&3'
step ungranted 'ls /mnt/shell'
step flushed_read 'exec 3<>/mnt/echo/call; printf "{\"delay_ms\":5000}" >&3; cat <&3 & c=$!; sleep 1; kill -TERM $c; wait $c; echo "first read: $?"; cat <&3'
"#;

const KNOWN_FILE: &str = "read through the kernel's v9fs\n";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Fails (never skips) when a piece the VM needs is missing: CI runs install-test-deps first.
fn require_vm_peers(kernel_dir: &Path) {
    let on_path = |bin: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
    };
    let has_kernel = std::fs::read_dir(kernel_dir.join("boot")).is_ok_and(|mut entries| {
        entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-")))
    });
    for (present, what) in [
        (
            on_path("qemu-system-x86_64"),
            "qemu-system-x86_64 (Debian qemu-system-x86)",
        ),
        (on_path("socat"), "socat (Debian socat)"),
        (
            Path::new("/bin/busybox").is_file(),
            "/bin/busybox (Debian busybox-static)",
        ),
        (has_kernel, "a Debian kernel in target/peers/kernel"),
    ] {
        assert!(present, "{what} is missing: run scripts/install-test-deps");
    }
}

/// One guest step: its exit status and its exact output (stdout and stderr together).
#[derive(Debug)]
struct Step {
    rc: i32,
    out: String,
}

/// Reads the `V9FS-STEP NAME RC HEX` marker lines out of the guest console.
fn steps(console: &str) -> HashMap<String, Step> {
    console
        .lines()
        .filter_map(|line| {
            let mut fields = line
                .trim_end_matches('\r')
                .strip_prefix("V9FS-STEP ")?
                .split(' ');
            let name = fields.next()?.to_owned();
            let rc = fields.next()?.parse().ok()?;
            let out = hex::decode(fields.next().unwrap_or("")).ok()?;
            Some((
                name,
                Step {
                    rc,
                    out: String::from_utf8(out).ok()?,
                },
            ))
        })
        .collect()
}

fn envelope(step: &Step) -> warren_toolfs::Envelope {
    warren_toolfs::Envelope::parse(step.out.as_bytes())
        .unwrap_or_else(|e| panic!("not an envelope ({e}): {:?}", step.out))
}

#[tokio::test(flavor = "multi_thread")]
async fn v9fs_trans_unix_mounts_the_grant_and_calls_tools() {
    mount_the_grant_and_call_tools("unix").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn v9fs_trans_fd_mounts_the_grant_and_calls_tools() {
    mount_the_grant_and_call_tools("fd").await;
}

async fn mount_the_grant_and_call_tools(transport: &'static str) {
    let root = workspace_root();
    let kernel_dir = root.join("target/peers/kernel");
    require_vm_peers(&kernel_dir);

    let d = Daemon::start();
    let (docs, docs_fd) = tool_root(&d, "docs");
    std::fs::write(docs.join("hello.txt"), KNOWN_FILE).unwrap();
    std::fs::set_permissions(
        docs.join("hello.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let grant = record_with_root(&["echo", "fs_read"], "/docs");

    // What our own client sees on a connection with the same grant: the guest must see the same.
    let docs_fd2 = docs_fd.try_clone().unwrap();
    let (_client, ours) = d.granted(&grant, &[docs_fd2.as_fd()]).await;
    let tools_ours = String::from_utf8(read_file(&ours, "tools").await).unwrap();
    let fs_read_doc_ours = String::from_utf8(read_file(&ours, "fs_read/doc").await).unwrap();

    // nsd's part: QEMU's one connection is handed to toolfs with the grant.
    let sock = d.dir.path().join("vm.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let ctl = d.ctl();
    let nsd_grant = grant.clone();
    let nsd = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        warren_toolfs::hand_over(&ctl, &nsd_grant, conn.as_fd(), &[docs_fd.as_fd()]).unwrap();
    });
    let vm_sock = sock.clone();

    let commands = d.dir.path().join("guest.sh");
    std::fs::write(&commands, GUEST_COMMANDS).unwrap();
    let vm = tokio::task::spawn_blocking(move || {
        Command::new(root.join("scripts/v9fs-vm"))
            .arg("--kernel-dir")
            .arg(&kernel_dir)
            .arg("--socket")
            .arg(&sock)
            .arg("--commands")
            .arg(&commands)
            .args(["--aname", "/ignored-on-a-granted-connection"])
            .args(["--mount-opts", "cache=none,access=any"])
            .args(["--transport", transport])
            .args(["--timeout", "240"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    if !nsd.is_finished() {
        // QEMU never connected (it failed or timed out): release the accept so the test fails
        // with the console below instead of hanging.
        let _ = std::os::unix::net::UnixStream::connect(&vm_sock);
    }
    // Its outcome shows in the assertions on the console below.
    let _ = nsd.join();
    let console = String::from_utf8_lossy(&vm.stdout);
    let context = format!(
        "console:\n{console}\nstderr:\n{}\ntoolfs log:\n{}",
        String::from_utf8_lossy(&vm.stderr),
        d.log()
    );
    assert!(vm.status.success(), "scripts/v9fs-vm failed\n{context}");
    assert!(
        console.contains("V9FS-MOUNT 0"),
        "the mount failed\n{context}"
    );
    let steps = steps(&console);
    let step = |name: &str| {
        steps
            .get(name)
            .unwrap_or_else(|| panic!("no step {name}\n{context}"))
    };
    let ok = |name: &str| {
        let s = step(name);
        assert_eq!(s.rc, 0, "step {name} failed: {:?}\n{context}", s.out);
        s
    };

    // The root lists exactly the grant, plus `tools`; a tool directory its three files.
    assert_eq!(ok("ls").out, "echo\nfs_read\ntools\n");
    assert_eq!(ok("ls_echo").out, "call\ndoc\nschema\n");
    assert_eq!(ok("tools").out, tools_ours);
    assert_eq!(ok("fs_read_doc").out, fs_read_doc_ours);

    // One open is one call: written at 0, read from the end of the write.
    let echo = envelope(ok("echo_call"));
    assert_eq!(echo.status, Status::Ok);
    assert_eq!(echo.content, r#"{"text":"v9fs"}"#);
    assert_eq!(echo.tool, "echo");
    assert_eq!(echo.taint, Taint::Untrusted);
    assert!(echo.digest_matches(), "{echo:?}");
    // A second `cat` on the same open reads at the end of the result: nothing more, no new call.
    let reread = envelope(ok("echo_reread"));
    assert_eq!(reread.content, r#"{"n":1}"#);
    let read = envelope(ok("fs_read_call"));
    assert_eq!(read.status, Status::Ok, "{read:?}");
    assert_eq!(read.content, KNOWN_FILE);
    assert_eq!(read.taint, Taint::Untrusted);

    // An ungranted tool does not exist.
    let ungranted = step("ungranted");
    assert_ne!(ungranted.rc, 0);
    assert!(
        ungranted.out.contains("No such file or directory"),
        "{:?}",
        ungranted.out
    );

    // The killed read and the one after it: one call, one result.
    let flushed = ok("flushed_read");
    // (busybox sh may also print "Terminated" for the killed job.)
    let (_, rest) = flushed
        .out
        .split_once("first read: 143\n")
        .unwrap_or_else(|| panic!("the first read was not killed: {flushed:?}"));
    let after = warren_toolfs::Envelope::parse(rest.as_bytes()).unwrap();
    assert_eq!(after.content, r#"{"delay_ms":5000}"#);

    // Every call ran exactly once: none again for a second `cat`, none again after the flush.
    let mut ran: Vec<String> = d
        .journal()
        .into_iter()
        .filter(|l| l.starts_with("done "))
        .collect();
    ran.sort();
    let mut want: Vec<String> = [r#"{"text":"v9fs"}"#, r#"{"n":1}"#, r#"{"delay_ms":5000}"#]
        .iter()
        .map(|args| format!("done {}", digest(args.as_bytes())))
        .collect();
    want.sort();
    assert_eq!(ran, want, "echo runs (journal)");
}
