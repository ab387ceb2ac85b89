//! The bridge in front of a third-party 9P2000.L server: diod exporting a real directory
//! (diod is installed by scripts/install-test-deps and present in CI).

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{need_fuse, run};
use warren_bridge::BridgeOptions;

/// diod, a peer: missing is a failure (scripts/install-test-deps installs it).
fn diod() -> &'static str {
    ["/usr/sbin/diod", "/usr/bin/diod"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("diod is not installed (scripts/install-test-deps installs it)")
}

#[test]
fn a_diod_export_reads_writes_and_lists_through_the_bridge() {
    need_fuse();
    let diod = diod();
    let dir = tempfile::Builder::new()
        .prefix("wbd")
        .tempdir_in("/tmp")
        .unwrap();
    let (export, mnt) = (dir.path().join("export"), dir.path().join("m"));
    std::fs::create_dir_all(export.join("sub")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    // Bigger than one FUSE request and than the page cache's readahead window.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(export.join("big"), &big).unwrap();
    std::fs::write(export.join("sub/small"), b"small file\n").unwrap();
    std::fs::set_permissions(export.join("big"), std::fs::Permissions::from_mode(0o4755)).unwrap();

    // diod serves one connection on its stdin/stdout: our socketpair's other end.
    let (ours, theirs) = StdUnixStream::pair().unwrap();
    let theirs_out = theirs.try_clone().unwrap();
    let mut server = Command::new(diod)
        .args(["-f", "-n", "-r", "0", "-w", "1", "-L", "stderr", "-e"])
        .arg(&export)
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs_out)))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    ours.set_nonblocking(true).unwrap();
    let client = rt
        .block_on(async {
            warren_9p::Client::new(tokio::net::UnixStream::from_std(ours)?, 1 << 20).await
        })
        .unwrap();
    let opts = BridgeOptions {
        direct_io_all: false,
        entry_timeout: Duration::from_secs(1),
        uname: "root".into(),
        aname: export.to_str().unwrap().into(),
        ..Default::default()
    };
    let fuse = warren_bridge::open_dev_fuse().unwrap();
    warren_bridge::mount_fuse(&mnt, fuse.as_fd(), false).unwrap();
    let _detach = common::DetachOnDrop(mnt.clone());
    let bridge = rt.spawn(warren_bridge::serve(fuse, client, opts));

    // Reads through the page cache (not direct I/O: diod's files have real sizes).
    assert_eq!(std::fs::read(mnt.join("big")).unwrap(), big);
    assert_eq!(
        std::fs::read(mnt.join("sub/small")).unwrap(),
        b"small file\n"
    );
    // The setuid bit on the export is not shown.
    assert_eq!(
        std::fs::metadata(mnt.join("big"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    // Writes land in the exported directory.
    std::fs::write(mnt.join("sub/new"), b"written through the bridge").unwrap();
    assert_eq!(
        std::fs::read(export.join("sub/new")).unwrap(),
        b"written through the bridge"
    );
    let out = run(Command::new("ls").arg(mnt.join("sub")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "new\nsmall\n");
    std::fs::remove_file(mnt.join("sub/new")).unwrap();
    assert!(!export.join("sub/new").exists());
    std::fs::create_dir(mnt.join("made")).unwrap();
    assert!(export.join("made").is_dir());
    let unlink_dir = std::fs::remove_file(mnt.join("made")).unwrap_err();
    assert_eq!(unlink_dir.raw_os_error(), Some(libc::EISDIR));
    std::fs::remove_dir(mnt.join("made")).unwrap();
    assert!(!export.join("made").exists());

    nix::mount::umount(&mnt).unwrap();
    let served = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), bridge).await });
    served
        .expect("serve() returned after the unmount")
        .unwrap()
        .unwrap();
    rt.shutdown_background();
    let _ = server.kill();
    let _ = server.wait();
}
