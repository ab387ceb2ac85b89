//! The way nsd uses the bridge: /dev/fuse opened here, the mount made in another mount
//! namespace (by a thread that unshared its fs and mount namespace), the fd served from here.

mod common;

use std::os::fd::AsFd;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use common::{Server, client_for, need_fuse};
use nix::mount::{MsFlags, mount, umount};
use nix::sched::{CloneFlags, unshare};

/// statfs f_type of a FUSE mount (linux/magic.h FUSE_SUPER_MAGIC).
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

fn is_fuse(path: &std::path::Path) -> bool {
    nix::sys::statfs::statfs(path).unwrap().filesystem_type().0 as i64 == FUSE_SUPER_MAGIC
}

#[test]
fn a_mount_made_in_another_mount_namespace_is_served_and_unseen_outside() {
    need_fuse();
    let dir = tempfile::Builder::new()
        .prefix("wbn")
        .tempdir_in("/tmp")
        .unwrap();
    let mnt = dir.path().join("m");
    std::fs::create_dir(&mnt).unwrap();
    let server = Server::new(Duration::from_millis(1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(client_for(&server)).unwrap();
    let fuse = warren_bridge::open_dev_fuse().unwrap();

    let (mounted_tx, mounted_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let inside = {
        let (mnt, fuse) = (mnt.clone(), fuse.try_clone().unwrap());
        std::thread::spawn(move || {
            unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS).unwrap();
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            warren_bridge::mount_fuse(&mnt, fuse.as_fd(), false).unwrap();
            drop(fuse); // the mount holds the connection now
            mounted_tx.send(()).unwrap();
            // Nothing on the mount may be touched before the bridge has answered INIT.
            go_rx.recv().unwrap();
            assert!(is_fuse(&mnt), "the mount is there inside the namespace");
            // Children of this thread are in its mount namespace.
            let out = Command::new("cat")
                .arg(mnt.join("static"))
                .output()
                .unwrap();
            umount(&mnt).unwrap();
            out
        })
    };
    mounted_rx.recv().unwrap();
    let bridge = rt.spawn(warren_bridge::serve(
        fuse,
        client,
        warren_bridge::BridgeOptions::default(),
    ));
    assert!(
        !is_fuse(&mnt),
        "the mount leaked into the test's own namespace"
    );
    go_tx.send(()).unwrap();
    let out = inside.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, common::STATIC_TEXT);
    let served = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), bridge).await });
    served
        .expect("serve() returned after the unmount inside the namespace")
        .unwrap()
        .unwrap();
    rt.shutdown_background();
    server.kill();
}
