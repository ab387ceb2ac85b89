//! The daemons a gated toolfs works with, as the supervisor runs them: the real
//! `warren-receiptd` (root here) and the real `warren-gate` under a uid of its own (receiptd
//! tells the gate's decision receipts from toolfs's effect receipts by the peer's uid, so the
//! two cannot share root), and the gate connection handed over on `gate.ctl` exactly as the
//! supervisor hands it: `{"version":1,"kind":"daemon","name":"toolfs"}`.

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;
use warren_9p::{Client, Errno, Fid, oflags};
use warren_gate::control::{ControlRecord, RecordKind, hand_over};

/// The gate's uid in these tests (warren's own gate uid: no passwd entry needed).
pub fn gate_uid() -> u32 {
    warren_daemon::identity::Role::Gate.uid()
}

/// `warren-gate`, `warren-receiptd` and `warren-nsd`, next to our binary in the target dir. They are built
/// (in our profile) once per build of this test binary: a marker newer than the test binary
/// says it was done, so the many test processes of one run do not each take cargo's lock.
fn sibling_bins() -> (PathBuf, PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let ours = PathBuf::from(env!("CARGO_BIN_EXE_warren-toolfs"));
            let dir = ours.parent().unwrap().to_path_buf();
            let (gate, receiptd, nsd) = (
                dir.join("warren-gate"),
                dir.join("warren-receiptd"),
                dir.join("warren-nsd"),
            );
            let marker = dir.join(".toolfs-tests-stack-built");
            let test_bin = std::env::current_exe().unwrap();
            let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            let fresh = gate.exists()
                && receiptd.exists()
                && nsd.exists()
                && mtime(&marker).is_some_and(|m| Some(m) >= mtime(&test_bin));
            if !fresh {
                let mut args = vec![
                    "build",
                    "-p",
                    "warren-gate",
                    "--bin",
                    "warren-gate",
                    "-p",
                    "warren-receiptd",
                    "--bin",
                    "warren-receiptd",
                    "-p",
                    "warren-nsd",
                    "--bin",
                    "warren-nsd",
                ];
                if dir.file_name().is_some_and(|n| n == "release") {
                    args.push("--release");
                }
                let status = Command::new(env!("CARGO"))
                    .args(&args)
                    .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                    .status()
                    .expect("run cargo to build warren-gate, warren-receiptd and warren-nsd");
                assert!(status.success(), "cargo {args:?} failed");
                std::fs::write(&marker, b"").unwrap();
            }
            (gate, receiptd, nsd)
        })
        .clone()
}

pub struct Stack {
    pub runtime: PathBuf,
    base: PathBuf,
    receiptd: Option<Child>,
    gate: Option<Child>,
    /// nsd serving only what these tests need of it: the worker socket (it builds every tool
    /// worker; toolfs has no other way to get one).
    nsd: Option<Child>,
}

fn wait_for_socket(path: &Path, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `warren-nsd serve` for `runtime` (logging to `<base>/nsd.log`) and waits for its
/// worker socket.
fn spawn_nsd(base: &Path, runtime: &Path) -> Child {
    let log = std::fs::File::create(base.join("nsd.log")).unwrap();
    let mut child = Command::new(sibling_bins().2)
        .arg("serve")
        .env("WARREN_RUNTIME_DIR", runtime)
        .env("WARREN_DATA_DIR", base.join("rdata"))
        .env("WARREN_SECRETS_DIR", base.join("secrets"))
        .env(
            "WARREN_TOOL_WORKER",
            env!("CARGO_BIN_EXE_warren-tool-worker"),
        )
        .env("WARREN_LOG", "info")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start warren-nsd");
    wait_for_socket(&runtime.join("nsd-workers.ctl"), &mut child, "warren-nsd");
    child
}

/// nsd alone in a temp dir of its own: for tests that play toolfs's part on its worker socket.
pub struct Nsd {
    child: Child,
    pub dir: tempfile::TempDir,
}

impl Nsd {
    pub fn start() -> Nsd {
        let dir = tempfile::Builder::new()
            .prefix("nsd")
            .tempdir_in("/tmp")
            .unwrap();
        let runtime = dir.path().join("run");
        std::fs::create_dir(&runtime).unwrap();
        let child = spawn_nsd(dir.path(), &runtime);
        Nsd { child, dir }
    }

    pub fn control(&self) -> PathBuf {
        self.dir.path().join("run/nsd-workers.ctl")
    }

    /// A confined worker for `tool` built by this nsd, greeted and ready.
    pub fn worker(
        &self,
        tool: &str,
        authority: &warren_toolfs::worker::ToolAuthority,
    ) -> std::io::Result<warren_toolfs::worker::Worker> {
        let session = format!("{:032x}", std::process::id());
        let launched = warren_toolfs::worker::nsd::WorkerBuilder::new(self.control())
            .build(&session, "test-ns", tool, authority)?;
        warren_toolfs::worker::Worker::start(tool, authority, launched)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nsd.log")).unwrap_or_default()
    }
}

impl Drop for Nsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Stack {
    /// receiptd and the gate in `base` (whose `run/` is the runtime dir).
    pub fn up(base: &Path) -> Stack {
        Stack::up_with(base, &[])
    }

    /// As [`Stack::up`], receiptd started with `receiptd_args` too.
    pub fn up_with(base: &Path, receiptd_args: &[&str]) -> Stack {
        let g = gate_uid();
        let runtime = base.join("run");
        // The gate's uid must reach the runtime dir and the sockets in it: the dir is setgid
        // to the gate's gid, so receipts.sock (0660) is in its group.
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o711)).unwrap();
        nix::unistd::chown(&runtime, Some(0.into()), Some(g.into())).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o2770)).unwrap();
        for d in ["rdata", "secrets", "gate"] {
            let p = base.join(d);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        nix::unistd::chown(&base.join("gate"), Some(g.into()), Some(g.into())).unwrap();
        let mut stack = Stack {
            runtime,
            base: base.to_path_buf(),
            receiptd: None,
            gate: None,
            nsd: None,
        };
        stack.start_receiptd(receiptd_args);
        stack.start_gate();
        stack.start_nsd();
        stack
    }

    /// (Re)starts receiptd with `extra` arguments (after [`Stack::kill_receiptd`]).
    pub fn start_receiptd(&mut self, extra: &[&str]) {
        let mut child = Command::new(sibling_bins().1)
            .arg("--runtime-dir")
            .arg(&self.runtime)
            .arg("--data-dir")
            .arg(self.base.join("rdata"))
            .arg("--secrets-dir")
            .arg(self.base.join("secrets"))
            .args(["--gate-uid", &gate_uid().to_string()])
            // toolfs runs as root in these tests, unless a test names another uid.
            .args(if extra.contains(&"--toolfs-uid") {
                &[][..]
            } else {
                &["--toolfs-uid", "0"][..]
            })
            .args(extra)
            .env("WARREN_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start warren-receiptd");
        wait_for_socket(
            &self.runtime.join("receipts.sock"),
            &mut child,
            "warren-receiptd",
        );
        self.receiptd = Some(child);
    }

    fn start_gate(&mut self) {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(sibling_bins().0)
            .arg("--runtime-dir")
            .arg(&self.runtime)
            .arg("--data-dir")
            .arg(self.base.join("gate"))
            .uid(gate_uid())
            .gid(gate_uid())
            .env("WARREN_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start warren-gate");
        for sock in ["gate.sock", "gate.ctl"] {
            wait_for_socket(&self.runtime.join(sock), &mut child, "warren-gate");
        }
        self.gate = Some(child);
    }

    /// The real `warren-nsd serve` (root, as the supervisor runs it) in this runtime dir, with
    /// this base's data and secrets dirs as the directories no worker may see.
    pub fn start_nsd(&mut self) {
        self.nsd = Some(spawn_nsd(&self.base, &self.runtime));
    }

    pub fn kill_nsd(&mut self) {
        if let Some(mut c) = self.nsd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn nsd_pid(&self) -> Option<u32> {
        self.nsd.as_ref().map(Child::id)
    }

    pub fn nsd_log(&self) -> String {
        std::fs::read_to_string(self.base.join("nsd.log")).unwrap_or_default()
    }

    /// Hands `conn` to the gate as toolfs's connection, the way the supervisor does.
    pub fn hand_toolfs(&self, conn: &impl AsFd) {
        let record = ControlRecord {
            version: 1,
            kind: RecordKind::Daemon,
            name: Some("toolfs".into()),
            ..Default::default()
        };
        hand_over(&self.runtime.join("gate.ctl"), &record, conn.as_fd())
            .expect("hand toolfs's connection to the gate");
    }

    pub fn kill_gate(&mut self) {
        if let Some(mut c) = self.gate.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The gate's pid, while it runs.
    pub fn gate_pid(&self) -> Option<u32> {
        self.gate.as_ref().map(Child::id)
    }

    /// receiptd's pid, while it runs.
    pub fn receiptd_pid(&self) -> Option<u32> {
        self.receiptd.as_ref().map(Child::id)
    }

    pub fn kill_receiptd(&mut self) {
        if let Some(mut c) = self.receiptd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// An operator attach on `gate.sock`.
    pub async fn gate_operator(&self) -> Fid {
        let c = Client::connect_unix(self.runtime.join("gate.sock"))
            .await
            .expect("connect gate.sock");
        c.attach("operator", "").await.expect("attach gate.sock")
    }

    /// A thread that answers `allow once <fp>` to every ask the gate shows, as an operator
    /// watching `events` would; returns once it is watching. It ends when the gate does.
    pub fn approve_every_ask(&self) {
        let sock = self.runtime.join("gate.sock");
        let (ready, watching) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(super::approver::allow_every_ask(sock, Some(ready)));
        });
        watching
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the approver never started watching the gate's events");
    }

    /// The bodies of the receipts in `scope`, in log order.
    pub async fn receipts(&self, scope: &str) -> Vec<Value> {
        self.envelopes(scope)
            .await
            .iter()
            .map(|entry| {
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(entry["payload"].as_str().expect("a DSSE payload"))
                    .unwrap();
                serde_json::from_slice(&payload).unwrap()
            })
            .collect()
    }

    /// The DSSE envelopes of `scope`'s log, in order (none for an unknown scope).
    pub async fn envelopes(&self, scope: &str) -> Vec<Value> {
        let c = Client::connect_unix(self.runtime.join("receipts.sock"))
            .await
            .expect("connect receipts.sock");
        let root = c.attach("test", "").await.unwrap();
        let Ok(log) = root.walk(&[scope, "log"]).await else {
            return Vec::new();
        };
        log.open(oflags::RDONLY).await.unwrap();
        let text = log.read_to_end(0).await.unwrap();
        text.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|line| serde_json::from_slice(line).unwrap())
            .collect()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.kill_gate();
        self.kill_receiptd();
        self.kill_nsd();
    }
}

/// Writes an answer to `pending/<id>/ctl`.
pub async fn answer(root: &Fid, id: i64, text: &str) -> Result<(), Errno> {
    let f = root.walk(&["pending", &id.to_string(), "ctl"]).await?;
    f.open(oflags::WRONLY).await?;
    f.write(0, text.as_bytes()).await.map(drop)
}

/// The open asks listed in `pending/`.
pub async fn open_asks(root: &Fid) -> Vec<i64> {
    let d = root.walk(&["pending"]).await.unwrap();
    d.open(oflags::RDONLY).await.unwrap();
    let mut ids: Vec<i64> = d
        .readdir_all()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| e.name.parse().ok())
        .collect();
    ids.sort();
    ids
}
