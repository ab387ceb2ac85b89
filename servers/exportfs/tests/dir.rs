//! A host directory served read-only (`dir:NAME:/PATH`): what is under it can be listed and read,
//! nothing outside it is reachable (no `..` past the root, no symlink followed), and nothing can
//! be written.

use std::os::fd::OwnedFd;

use warren_9p::{Client, Errno, oflags};
use warren_exportfs::control::serve_dir;

fn tree() -> (tempfile::TempDir, tempfile::TempDir) {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "outside").unwrap();
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(shared.path().join("hello.txt"), "hello from b\n").unwrap();
    std::fs::create_dir(shared.path().join("sub")).unwrap();
    std::fs::write(shared.path().join("sub/deep"), "deep").unwrap();
    std::os::unix::fs::symlink(outside.path(), shared.path().join("out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), shared.path().join("leak")).unwrap();
    (shared, outside)
}

async fn client(dir: &std::path::Path) -> Client {
    let fd: OwnedFd = std::fs::File::open(dir).unwrap().into();
    let sock = serve_dir(&tokio::runtime::Handle::current(), fd).unwrap();
    sock.set_nonblocking(true).unwrap();
    Client::new(tokio::net::UnixStream::from_std(sock).unwrap(), 1 << 20)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_is_listed_and_read_and_never_left_or_written() {
    let (shared, _outside) = tree();
    let c = client(shared.path()).await;
    let root = c.attach("peer", "docs").await.unwrap();

    let listing = root.walk(&[]).await.unwrap();
    listing.open(oflags::RDONLY).await.unwrap();
    let names: Vec<String> = listing.read_dir_names().await.unwrap();
    assert_eq!(names, ["hello.txt", "leak", "out", "sub"]);

    let hello = root.walk(&["hello.txt"]).await.unwrap();
    hello.open(oflags::RDONLY).await.unwrap();
    assert_eq!(hello.read_to_end(0).await.unwrap(), b"hello from b\n");
    let deep = root.walk(&["sub", "..", "sub", "deep"]).await.unwrap();
    deep.open(oflags::RDONLY).await.unwrap();
    assert_eq!(deep.read_to_end(0).await.unwrap(), b"deep");

    // `..` at the root stays there.
    let up = root.walk(&["..", "..", "hello.txt"]).await.unwrap();
    up.open(oflags::RDONLY).await.unwrap();
    // A symlink is never followed: not through a directory link, not to open a file link.
    assert!(root.walk(&["out", "secret"]).await.is_err());
    let leak = root.walk(&["leak"]).await.unwrap();
    assert_eq!(leak.open(oflags::RDONLY).await.err(), Some(Errno::ELOOP));

    // Nothing is written.
    let w = root.walk(&["hello.txt"]).await.unwrap();
    assert_eq!(w.open(oflags::RDWR).await.err(), Some(Errno::EROFS));
    let t = root.walk(&["hello.txt"]).await.unwrap();
    assert_eq!(
        t.open(oflags::RDONLY | oflags::TRUNC).await.err(),
        Some(Errno::EROFS)
    );
    assert_eq!(
        std::fs::read_to_string(shared.path().join("hello.txt")).unwrap(),
        "hello from b\n"
    );
}

/// A FIFO under a granted directory (anyone on the host may make one where they can write) is
/// refused at open: never a read that waits for a writer and holds one of exportfs's threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_under_the_directory_is_refused_not_waited_on() {
    let (shared, _outside) = tree();
    nix::unistd::mkfifo(
        &shared.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let c = client(shared.path()).await;
    let root = c.attach("peer", "docs").await.unwrap();
    let pipe = root.walk(&["pipe"]).await.unwrap();
    // Bounded so that an open left waiting on the FIFO fails here instead of hanging the test.
    let opened = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        pipe.open(oflags::RDONLY),
    )
    .await
    .expect("the open waited on the FIFO");
    assert_eq!(opened.err(), Some(Errno::EACCES));
}
