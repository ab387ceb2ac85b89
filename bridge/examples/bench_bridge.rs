//! Sequential call transactions per second, side by side in one run (scripts/bench-bridge):
//!
//! - through the FUSE bridge: Python `os.open/os.write/os.read/os.close` on the test tree's
//!   `call` file (kernel FUSE → bridge → 9P over a socketpair → the tree);
//! - straight over 9P with `warren_9p::Client` on the same tree (walk, Tlopen, Twrite, Tread,
//!   Tclunk: the 9P requests the bridge makes for one transaction);
//! - the same Python loop on a tmpfs file.
//!
//! Needs root (mount). Usage: bench_bridge [TRANSACTIONS]

#[path = "../tests/common/tree.rs"]
#[allow(dead_code)]
mod tree;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tree::{Shared, TestTree};

const INPUT: &[u8] = b"{\"x\":1}";
const WARMUP: usize = 200;

/// The Python side: WARMUP untimed then N timed transactions; prints seconds elapsed.
const PY_LOOP: &str = r#"
import os, sys, time
path, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def tx():
    fd = os.open(path, os.O_RDWR)
    os.write(fd, b'{"x":1}')
    os.read(fd, 65536)
    os.close(fd)
for _ in range(warm): tx()
t = time.perf_counter()
for _ in range(n): tx()
print(time.perf_counter() - t)
"#;

fn python_loop(path: &std::path::Path, n: usize) -> f64 {
    let out = Command::new("python3")
        .args([
            "-c",
            PY_LOOP,
            path.to_str().unwrap(),
            &n.to_string(),
            &WARMUP.to_string(),
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secs: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("seconds");
    n as f64 / secs
}

/// A 9P connection to the tree: the server end served on `server_rt` (the server's own
/// runtime, as a separate daemon would have), the client end returned for the caller's runtime.
fn connect(server_rt: &tokio::runtime::Runtime, shared: &Arc<Shared>) -> StdUnixStream {
    let (ours, theirs) = StdUnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    theirs.set_nonblocking(true).unwrap();
    let tree = Arc::new(TestTree(shared.clone()));
    server_rt.spawn(async move {
        let stream = tokio::net::UnixStream::from_std(ours).unwrap();
        warren_9p::serve(tree, stream, warren_9p::Limits::default()).await
    });
    theirs
}

async fn client(stream: StdUnixStream) -> warren_9p::Client {
    let stream = tokio::net::UnixStream::from_std(stream).unwrap();
    warren_9p::Client::new(stream, 1 << 20).await.unwrap()
}

/// The Python loop through the bridge, the bridge serving on a runtime of `flavor` in a thread
/// of its own.
fn through_bridge(stream: StdUnixStream, mnt: &Path, multi_thread: bool, n: usize) -> f64 {
    let (mounted_tx, mounted_rx) = std::sync::mpsc::channel();
    let bridge = {
        let mnt = mnt.to_owned();
        std::thread::spawn(move || {
            let rt = if multi_thread {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            }
            .unwrap();
            rt.block_on(async {
                let client = client(stream).await;
                let fuse = warren_bridge::open_dev_fuse().unwrap();
                warren_bridge::mount_fuse(&mnt, fuse.as_fd(), false).unwrap();
                mounted_tx.send(()).unwrap();
                warren_bridge::serve(fuse, client, warren_bridge::BridgeOptions::default()).await
            })
        })
    };
    mounted_rx.recv().unwrap();
    let tps = python_loop(&mnt.join("call"), n);
    nix::mount::umount(mnt).unwrap();
    bridge.join().unwrap().unwrap();
    tps
}

async fn direct_9p(client: &warren_9p::Client, n: usize) -> f64 {
    let root = client.attach("bench", "").await.unwrap();
    let tx = async || {
        let fid = root.walk(&["call"]).await.unwrap();
        fid.open(warren_9p::oflags::RDWR).await.unwrap();
        fid.write(0, INPUT).await.unwrap();
        let result = fid.read(INPUT.len() as u64, 65536).await.unwrap();
        assert!(result.ends_with(INPUT));
        fid.clunk().await.unwrap();
    };
    for _ in 0..WARMUP {
        tx().await;
    }
    let start = Instant::now();
    for _ in 0..n {
        tx().await;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(5000, |a| a.parse().expect("TRANSACTIONS"));
    assert!(
        nix::unistd::geteuid().is_root(),
        "bench_bridge mounts FUSE and tmpfs: run it as root"
    );
    let dir = tempfile::Builder::new()
        .prefix("wbb")
        .tempdir_in("/tmp")
        .unwrap();
    let (fuse_mnt, tmpfs_mnt) = (dir.path().join("m"), dir.path().join("t"));
    std::fs::create_dir(&fuse_mnt).unwrap();
    std::fs::create_dir(&tmpfs_mnt).unwrap();

    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let shared = Shared::new(Duration::ZERO);

    let bridge_multi = through_bridge(connect(&server_rt, &shared), &fuse_mnt, true, n);
    let bridge_current = through_bridge(connect(&server_rt, &shared), &fuse_mnt, false, n);

    // Straight over 9P, from a current-thread runtime (as a client process would).
    let stream = connect(&server_rt, &shared);
    let p9_tps = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let client = client(stream).await;
            direct_9p(&client, n).await
        });

    // tmpfs.
    nix::mount::mount(
        Some("tmpfs"),
        &tmpfs_mnt,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    std::fs::write(tmpfs_mnt.join("call"), b"").unwrap();
    let tmpfs_tps = python_loop(&tmpfs_mnt.join("call"), n);
    nix::mount::umount(&tmpfs_mnt).unwrap();

    let row =
        |name: &str, tps: f64| println!("{name:<52} {tps:>9.0} tx/s {:>8.1} µs/tx", 1e6 / tps);
    let calls = shared
        .stats
        .calls_run
        .load(std::sync::atomic::Ordering::SeqCst);
    println!("{n} sequential call transactions after {WARMUP} warm-up ({calls} calls run in all)");
    row(
        "FUSE bridge, multi-thread runtime (python os.*)",
        bridge_multi,
    );
    row(
        "FUSE bridge, current-thread runtime (python os.*)",
        bridge_current,
    );
    row("9P direct (warren_9p::Client)", p9_tps);
    row("tmpfs file (python os.*)", tmpfs_tps);
    let best = bridge_multi.max(bridge_current);
    println!(
        "ratio (time per transaction): best bridge / direct 9P = {:.2}, best bridge / tmpfs = {:.1}",
        p9_tps / best,
        tmpfs_tps / best
    );
    server_rt.shutdown_background();
}
