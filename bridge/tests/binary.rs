//! The `warren-bridge` binary: inherits a mounted FUSE fd and a 9P socket, drops privileges,
//! serves, and exits 0 when the mount goes away.

mod common;

use std::io::{BufRead, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Server, need_fuse, wait_bounded};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

#[test]
fn the_binary_serves_unprivileged_and_exits_at_unmount() {
    need_fuse();
    let dir = tempfile::Builder::new()
        .prefix("wbb")
        .tempdir_in("/tmp")
        .unwrap();
    let mnt = dir.path().join("m");
    std::fs::create_dir(&mnt).unwrap();
    let server = Server::new(Duration::from_millis(1));
    let p9 = server.connect().unwrap();
    p9.set_nonblocking(false).unwrap();
    let fuse = warren_bridge::open_dev_fuse().unwrap();
    warren_bridge::mount_fuse(&mnt, fuse.as_fd(), false).unwrap();
    let _detach = common::DetachOnDrop(mnt.clone());

    // The control socket is inherited as it is (no close-on-exec on the child's end).
    let (ctl, ctl_child) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::empty(),
    )
    .unwrap();
    // This process holds supplementary groups the bridge must not keep after its drop.
    nix::unistd::setgroups(&[
        nix::unistd::Gid::from_raw(4),
        nix::unistd::Gid::from_raw(27),
    ])
    .expect("setgroups: the test runs as root");
    // The fds go down as stdin (FUSE) and stdout (9P).
    let mut bridge = Command::new(env!("CARGO_BIN_EXE_warren-bridge"))
        .args([
            "--fuse-fd",
            "0",
            "--9p-fd",
            "1",
            "--runas",
            "65534:65534",
            "--owner",
            "1000:1000",
            "--ctl-fd",
            &ctl_child.as_raw_fd().to_string(),
        ])
        .stdin(Stdio::from(fuse))
        .stdout(Stdio::from(OwnedFd::from(p9)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    assert_eq!(
        std::fs::read(mnt.join("static")).unwrap(),
        common::STATIC_TEXT
    );
    let meta = std::fs::metadata(mnt.join("static")).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::gid(&meta)
        ),
        (1000, 1000)
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.id())).unwrap();
    let uids = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>();
    assert_eq!(uids, ["65534"; 4], "the bridge did not drop its uid");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(field("Groups:"), "", "the bridge kept its parent's groups");
    assert_eq!(field("CapBnd:"), "0000000000000000");
    assert_eq!(field("NoNewPrivs:"), "1");

    drop(ctl_child);

    // A shrunk grant: the name goes from the server, the control socket drops it from the cache.
    server.shared.hide("static");
    let ctl = std::os::unix::net::UnixStream::from(ctl);
    let mut answers = std::io::BufReader::new(ctl.try_clone().unwrap());
    let mut ask = |line: &str| {
        (&ctl).write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        answers.read_line(&mut answer).unwrap();
        answer
    };
    assert_eq!(ask("/static"), "ok\n");
    let gone = std::fs::metadata(mnt.join("static")).unwrap_err();
    assert_eq!(gone.raw_os_error(), Some(libc::ENOENT));
    assert!(ask("").starts_with("error: "), "an empty path is refused");
    assert!(ask(&"x".repeat(5000)).starts_with("error: line longer"));

    nix::mount::umount(&mnt).unwrap();
    let exit = wait_bounded(&mut bridge, Duration::from_secs(10))
        .expect("the bridge did not exit after the unmount");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut bridge.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(exit.success(), "exit {exit:?}: {stderr}");
    server.kill();
}

#[test]
fn the_binary_refuses_an_fd_it_was_not_given() {
    let out = Command::new(env!("CARGO_BIN_EXE_warren-bridge"))
        .args(["--fuse-fd", "97", "--9p-fd", "98"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Bad file descriptor"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
