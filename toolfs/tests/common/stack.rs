//! The daemons a gated toolfs works with, as the supervisor runs them: the real
//! `warren-receiptd` (root here) and the real `warren-gate` under a uid of its own (receiptd
//! tells the gate's decision receipts from toolfs's effect receipts by the peer's uid, so the
//! two cannot share root), and the gate connection handed over on `gate.ctl` exactly as the
//! supervisor hands it: `{"version":1,"kind":"daemon","name":"toolfs"}`.

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use serde_json::Value;
use warren_9p::{Client, Errno, Fid, oflags};
use warren_gate::control::{ControlRecord, RecordKind, hand_over};
use warren_test_support::daemons::{self, Process};
use warren_test_support::receipts;

/// The gate's uid in these tests (warren's own gate uid: no passwd entry needed).
pub fn gate_uid() -> u32 {
    warren_daemon::identity::Role::Gate.uid()
}

pub struct Stack {
    pub runtime: PathBuf,
    base: PathBuf,
    receiptd: Option<Process>,
    gate: Option<Process>,
    /// nsd serving only what these tests need of it: the worker socket (it builds every tool
    /// worker; toolfs has no other way to get one).
    nsd: Option<Process>,
}

/// Starts `warren-nsd serve` for `runtime` (logging to `<base>/nsd.log`) and waits for its
/// worker socket.
fn spawn_nsd(base: &Path, runtime: &Path) -> Process {
    let log = std::fs::File::create(base.join("nsd.log")).unwrap();
    let mut cmd = daemons::nsd(runtime, &base.join("rdata"), &base.join("secrets"));
    cmd.env("WARREN_LOG", "info").stderr(log);
    Process::start(cmd, &[&runtime.join("nsd-workers.ctl")])
}

/// nsd alone in a temp dir of its own: for tests that play toolfs's part on its worker socket.
pub struct Nsd {
    _process: Process,
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
        let process = spawn_nsd(dir.path(), &runtime);
        Nsd {
            _process: process,
            dir,
        }
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
        let mut cmd = daemons::receiptd(
            &self.runtime,
            &self.base.join("rdata"),
            &self.base.join("secrets"),
        );
        cmd.args(["--gate-uid", &gate_uid().to_string()])
            // toolfs runs as root in these tests, unless a test names another uid.
            .args(if extra.contains(&"--toolfs-uid") {
                &[][..]
            } else {
                &["--toolfs-uid", "0"][..]
            })
            .args(extra);
        self.receiptd = Some(Process::start(cmd, &[&self.runtime.join("receipts.sock")]));
    }

    fn start_gate(&mut self) {
        let mut cmd = daemons::gate(&self.runtime, &self.base.join("gate"));
        cmd.uid(gate_uid()).gid(gate_uid());
        let sockets = ["gate.sock", "gate.ctl"].map(|s| self.runtime.join(s));
        self.gate = Some(Process::start(
            cmd,
            &sockets.each_ref().map(|p| p.as_path()),
        ));
    }

    /// The real `warren-nsd serve` (root, as the supervisor runs it) in this runtime dir, with
    /// this base's data and secrets dirs as the directories no worker may see.
    pub fn start_nsd(&mut self) {
        self.nsd = Some(spawn_nsd(&self.base, &self.runtime));
    }

    pub fn kill_nsd(&mut self) {
        self.nsd.take();
    }

    pub fn nsd_pid(&self) -> Option<u32> {
        self.nsd.as_ref().map(Process::id)
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
        self.gate.take();
    }

    /// The gate's pid, while it runs.
    pub fn gate_pid(&self) -> Option<u32> {
        self.gate.as_ref().map(Process::id)
    }

    /// receiptd's pid, while it runs.
    pub fn receiptd_pid(&self) -> Option<u32> {
        self.receiptd.as_ref().map(Process::id)
    }

    pub fn kill_receiptd(&mut self) {
        self.receiptd.take();
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
            rt.block_on(warren_test_support::approver::allow_every_ask(
                sock,
                Some(ready),
            ));
        });
        watching
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the approver never started watching the gate's events");
    }

    /// The bodies of the receipts in `scope`, in log order.
    pub async fn receipts(&self, scope: &str) -> Vec<Value> {
        receipts::bodies(&self.runtime.join("receipts.sock"), scope).await
    }

    /// The DSSE envelopes of `scope`'s log, in order (none for an unknown scope).
    pub async fn envelopes(&self, scope: &str) -> Vec<Value> {
        receipts::envelopes(&self.runtime.join("receipts.sock"), scope).await
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
