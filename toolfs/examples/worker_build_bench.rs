//! Benchmark: what confinement costs a worker. Side by side in one run:
//! - building a worker: nsd's build (request on its worker socket, namespaces, mounts, Landlock,
//!   seccomp, exec, `hello`) and teardown, against an unconfined child process (fork, exec,
//!   `hello`) and its kill;
//! - one `fs_read` call of a 4 KiB file on a confined worker, against an unconfined one.
//!
//! Starts the real `warren-nsd serve` (`$WARREN_NSD`, else beside this example's directory) in
//! a temp runtime dir. Needs root. Prints µs per operation and the ratios.
//! Run: `cargo run --release -p warren-toolfs --example worker_build_bench [builds] [calls]`

use std::os::unix::fs::chown;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use warren_toolfs::worker::nsd::WorkerBuilder;
use warren_toolfs::worker::{Root, ToolAuthority, Worker};

fn per_op(total: Duration, n: usize) -> f64 {
    total.as_secs_f64() * 1e6 / n as f64
}

fn sibling(name: &str, env: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let up = if dir.file_name().is_some_and(|n| n == "examples") {
        dir.parent().unwrap()
    } else {
        dir
    };
    up.join(name)
}

fn authority(dir: &std::path::Path) -> ToolAuthority {
    ToolAuthority {
        roots: vec![Root {
            path: "/r".into(),
            dir: open(
                dir,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .unwrap(),
            writable: false,
        }],
        network: false,
    }
}

async fn time_calls(worker: &Worker, calls: usize) -> Duration {
    let args = br#"{"path":"/r/f.txt"}"#;
    for _ in 0..100 {
        assert!(worker.call(args, Duration::from_secs(10)).await.unwrap().ok);
    }
    let started = Instant::now();
    for _ in 0..calls {
        worker.call(args, Duration::from_secs(10)).await.unwrap();
    }
    started.elapsed()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut argv = std::env::args().skip(1).map(|a| a.parse().unwrap());
    let builds: usize = argv.next().unwrap_or(200);
    let calls: usize = argv.next().unwrap_or(5000);
    let base = tempfile::Builder::new()
        .prefix("wbb")
        .tempdir_in("/tmp")
        .unwrap();
    let runtime = base.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let data = base.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mut nsd = Command::new(sibling("warren-nsd", "WARREN_NSD"))
        .arg("serve")
        .env("WARREN_RUNTIME_DIR", &runtime)
        .env("WARREN_DATA_DIR", &data)
        .env("WARREN_SECRETS_DIR", base.path().join("secrets"))
        .env(
            "WARREN_TOOL_WORKER",
            sibling("warren-tool-worker", "WARREN_TOOL_WORKER"),
        )
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("start warren-nsd");
    let ctl = runtime.join("nsd-workers.ctl");
    while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let uid = warren_daemon::identity::Role::Worker.uid();
    let dir = base.path().join("root");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("f.txt"), "x".repeat(4096)).unwrap();
    chown(&dir, Some(uid), Some(uid)).unwrap();
    chown(dir.join("f.txt"), Some(uid), Some(uid)).unwrap();
    let builder = WorkerBuilder::new(&ctl);
    let session = "0".repeat(32);

    let confined_build = {
        let started = Instant::now();
        for _ in 0..builds {
            let a = authority(&dir);
            let launched = builder.build(&session, "bench", "fs_read", &a).unwrap();
            drop(Worker::start("fs_read", &a, launched).unwrap());
        }
        started.elapsed()
    };
    let unconfined_build = {
        let started = Instant::now();
        for _ in 0..builds {
            drop(Worker::spawn_unconfined("fs_read", &authority(&dir), uid, uid).unwrap());
        }
        started.elapsed()
    };
    let a = authority(&dir);
    let confined = Worker::start(
        "fs_read",
        &a,
        builder.build(&session, "bench", "fs_read", &a).unwrap(),
    )
    .unwrap();
    let confined_calls = time_calls(&confined, calls).await;
    drop(confined);
    let unconfined = Worker::spawn_unconfined("fs_read", &authority(&dir), uid, uid).unwrap();
    let unconfined_calls = time_calls(&unconfined, calls).await;
    drop(unconfined);
    let _ = nsd.kill();
    let _ = nsd.wait();

    let (cb, ub) = (
        per_op(confined_build, builds),
        per_op(unconfined_build, builds),
    );
    let (cc, uc) = (
        per_op(confined_calls, calls),
        per_op(unconfined_calls, calls),
    );
    println!("worker build + teardown ({builds} each):");
    println!("  confined by nsd    {cb:9.0} µs");
    println!(
        "  unconfined child   {ub:9.0} µs   ratio confined/unconfined {:.2}x",
        cb / ub
    );
    println!("fs_read of 4 KiB ({calls} calls each):");
    println!("  confined worker    {cc:9.1} µs");
    println!(
        "  unconfined worker  {uc:9.1} µs   ratio confined/unconfined {:.2}x",
        cc / uc
    );
}
