//! Test harness: the test tree served over real socketpairs (each connection on a runtime of its
//! own, so "the server dies" is real: its runtime shuts down and its socket closes), and the
//! bridge serving a real kernel FUSE mount under a short temp dir.

#![allow(dead_code, unused_imports)] // each test binary uses a different part

pub mod tree;

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use warren_bridge::{Bridge, BridgeOptions, Invalidator};

pub use tree::{RESULT_PREFIX, STATIC_TEXT, Shared, Stats, TestTree};

/// The tree's server side: one runtime per accepted connection.
pub struct Server {
    pub shared: Arc<Shared>,
    conns: Mutex<Vec<Runtime>>,
    /// Connections made so far.
    pub connects: std::sync::atomic::AtomicUsize,
    /// While set, new connections are refused (a server that is not back yet).
    pub refusing: std::sync::atomic::AtomicBool,
}

impl Server {
    pub fn new(call_delay: Duration) -> Arc<Server> {
        Arc::new(Server {
            shared: Shared::new(call_delay),
            conns: Mutex::new(Vec::new()),
            connects: Default::default(),
            refusing: Default::default(),
        })
    }

    /// A new connection to the tree; returns the client's end.
    pub fn connect(&self) -> io::Result<StdUnixStream> {
        if self.refusing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(io::Error::from(io::ErrorKind::ConnectionRefused));
        }
        let (ours, theirs) = StdUnixStream::pair()?;
        ours.set_nonblocking(true)?;
        theirs.set_nonblocking(true)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let tree = Arc::new(TestTree(self.shared.clone()));
        rt.spawn(async move {
            let stream = tokio::net::UnixStream::from_std(ours)?;
            warren_9p::serve(tree, stream, warren_9p::Limits::default()).await
        });
        self.conns.lock().unwrap().push(rt);
        self.connects
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(theirs)
    }

    /// Every connection's server dies at once (its tasks dropped, its sockets closed).
    pub fn kill(&self) {
        for rt in self.conns.lock().unwrap().drain(..) {
            rt.shutdown_background();
        }
    }
}

/// A 9P client on a new connection to `server`, on the current runtime.
pub async fn client_for(server: &Server) -> io::Result<warren_9p::Client> {
    let stream = tokio::net::UnixStream::from_std(server.connect()?)?;
    warren_9p::Client::new(stream, 1 << 20).await
}

/// The bridge tests mount FUSE as root. Fails, saying why, on a host that cannot: scripts/test
/// leaves these tests out (nextest counts them as skipped) when the kernel has no FUSE.
pub fn need_fuse() {
    warren_test_support::kernel::require_root();
    warren_test_support::kernel::require_fuse();
}

/// The bridge serving the test tree at `<tmp>/m`.
pub struct Mounted {
    pub server: Arc<Server>,
    pub stats: Arc<Stats>,
    pub mnt: PathBuf,
    invalidator: Invalidator,
    _dir: tempfile::TempDir,
    rt: Option<Runtime>,
    bridge: Option<JoinHandle<io::Result<()>>>,
}

pub struct Setup {
    pub call_delay: Duration,
    pub reconnect: bool,
    /// `BridgeOptions::call_files`.
    pub call_files: bool,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            call_delay: Duration::from_millis(5),
            reconnect: false,
            call_files: false,
        }
    }
}

impl Mounted {
    /// Mounts with the default setup (fails, saying why, when FUSE is not available).
    pub fn start() -> Mounted {
        Mounted::start_with(Setup::default())
    }

    pub fn start_with(setup: Setup) -> Mounted {
        need_fuse();
        let dir = tempfile::Builder::new()
            .prefix("wbr")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let mnt = dir.path().join("m");
        std::fs::create_dir(&mnt).expect("mount point");
        let server = Server::new(setup.call_delay);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut opts = BridgeOptions {
            direct_io_all: true,
            entry_timeout: Duration::from_secs(60),
            call_files: setup.call_files,
            ..Default::default()
        };
        if setup.reconnect {
            let server = server.clone();
            opts.reconnect = Some(Box::new(move || {
                let server = server.clone();
                Box::pin(async move { client_for(&server).await })
            }));
        }
        let client = rt.block_on(client_for(&server)).expect("9P client");
        let fuse = warren_bridge::open_dev_fuse().expect("open /dev/fuse");
        warren_bridge::mount_fuse(&mnt, fuse.as_fd(), false).expect("mount fuse");
        let bridge = rt
            .block_on(Bridge::new(fuse, client, opts))
            .expect("attach");
        let invalidator = bridge.invalidator();
        let bridge = rt.spawn(bridge.run());
        let stats = server.shared.stats.clone();
        Mounted {
            server,
            stats,
            mnt,
            invalidator,
            _dir: dir,
            rt: Some(rt),
            bridge: Some(bridge),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    pub fn invalidate(&self, path: &str) -> io::Result<()> {
        self.rt
            .as_ref()
            .expect("runtime")
            .block_on(self.invalidator.invalidate(path))
    }

    /// Unmounts and returns what `serve` returned (bounded: an error if it did not return).
    pub fn unmount(mut self) -> io::Result<()> {
        nix::mount::umount(&self.mnt)?;
        let rt = self.rt.take().expect("runtime");
        let bridge = self.bridge.take().expect("bridge task");
        let result =
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), bridge).await });
        rt.shutdown_background();
        match result {
            Ok(joined) => joined.map_err(io::Error::other)?,
            Err(_) => Err(io::Error::other(
                "serve() did not return within 10 s of the unmount",
            )),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.bridge.is_some() {
            // Lazy: a test that failed may have left a process inside.
            let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        self.server.kill();
    }
}

/// Detaches a mount when dropped, so a failing test leaves no mount behind.
pub struct DetachOnDrop(pub PathBuf);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        // Already unmounted when the test passed: EINVAL, ignored.
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Polls `cond` until it holds or `bound` passes (a generous bound, never a timing assertion).
pub fn wait_until(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < bound {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

/// Waits for `child` up to `bound`; `None` if it is still running.
pub fn wait_bounded(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    let mut status = None;
    wait_until(bound, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status
}

/// Runs a command to completion within a generous bound, capturing its output.
pub fn run(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = wait_bounded(&mut child, Duration::from_secs(60));
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    assert!(
        status.is_some(),
        "{cmd:?} did not finish within 60 s; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a Python snippet (argv[1..] = `args`) and returns its stdout; fails the test on a
/// non-zero exit.
pub fn python(script: &str, args: &[&str]) -> String {
    let out = run(Command::new("python3").arg("-c").arg(script).args(args));
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The result the test tree's `call` gives for `input`.
/// A call through `open(path, 'r+b', buffering=0)`: write `{"x":1}`, read the result.
pub const PY_UNBUFFERED_CALL: &str = "import sys\nf = open(sys.argv[1], 'r+b', buffering=0)\nf.write(b'{\"x\":1}')\nsys.stdout.buffer.write(f.read())";
/// The same through a buffered `r+b` file (write `{"y":2}`, flush, read).
pub const PY_BUFFERED_CALL: &str = "import sys\nf = open(sys.argv[1], 'r+b')\nf.write(b'{\"y\":2}')\nf.flush()\nsys.stdout.buffer.write(f.read())";

/// Both Python idioms on the call file at `path` give their own results.
pub fn assert_python_calls(path: &str) {
    assert_eq!(
        python(PY_UNBUFFERED_CALL, &[path]),
        call_result(r#"{"x":1}"#)
    );
    assert_eq!(python(PY_BUFFERED_CALL, &[path]), call_result(r#"{"y":2}"#));
}

pub fn call_result(input: &str) -> String {
    format!("{}{input}", String::from_utf8_lossy(RESULT_PREFIX))
}
