//! Shared test helpers: short temp dirs, a log with test settings, mixed appends.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::json;
use warren_receiptd::{AppendRequest, Kind, Log, LogConfig, Role};
use warren_test_support::daemons::Process;

/// A short temp dir under /tmp (socket paths must fit in 108 bytes).
pub fn tmp() -> tempfile::TempDir {
    warren_test_support::dirs::short("rcpt")
}

pub fn config(base: &Path) -> LogConfig {
    let mut cfg = LogConfig::new(&base.join("data"), &base.join("secrets"));
    cfg.min_free_bytes = 0;
    cfg.rate_per_sec = 1e9;
    cfg.rate_burst = 1e9;
    cfg
}

pub fn open(base: &Path) -> Log {
    Log::open(config(base)).expect("open log")
}

pub fn db(base: &Path) -> PathBuf {
    base.join("data").join("receipts.db")
}

pub fn request(scope: &str, kind: Kind, i: u64) -> AppendRequest {
    let body = json!({
        "scope": scope, "kind": kind.as_str(),
        "subject": {"tool": "fs_read", "call": i, "note": "caf\u{e9} \u{1F600}"},
        "digests": {"args": format!("sha256:{:064x}", i)},
        "policy_hash": "sha256:00ff",
    });
    AppendRequest::parse(body.to_string().as_bytes()).expect("valid request")
}

/// The i-th receipt of a mixed workload: (request, the role allowed to append it).
pub fn mixed(scope: &str, i: u64) -> (AppendRequest, Role) {
    let (kind, role) = match i % 5 {
        0 => (Kind::Decision, Role::Gate),
        1 => (Kind::Effect, Role::Toolfs),
        2 | 3 => (Kind::Query, Role::Toolfs),
        _ => (Kind::Cap, Role::Operator(0)),
    };
    (request(scope, kind, i), role)
}

pub fn export(base: &Path, scope: &str) -> Vec<u8> {
    let mut out = Vec::new();
    warren_receiptd::export(&db(base), scope, &mut out).expect("export");
    out
}

pub fn registry(base: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    warren_receiptd::export_registry(&db(base), &mut out).expect("registry");
    out
}

/// A receiptd process on its own dirs under `base`.
pub struct Daemon {
    pub child: Process,
    pub socket: PathBuf,
}

pub fn daemon_cmd(base: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = warren_test_support::daemons::receiptd(
        &base.join("run"),
        &base.join("data"),
        &base.join("secrets"),
    );
    cmd.args([
        "--min-free-mb",
        "0",
        "--rate",
        "1000000",
        "--burst",
        "1000000",
    ])
    .args(extra);
    cmd
}

impl Daemon {
    pub fn start(base: &Path, extra: &[&str]) -> Daemon {
        Daemon::spawn(daemon_cmd(base, extra), base)
    }

    pub fn spawn(cmd: std::process::Command, base: &Path) -> Daemon {
        std::fs::create_dir_all(base.join("run")).unwrap();
        let socket = base.join("run").join("receipts.sock");
        let _ = std::fs::remove_file(&socket);
        let child = Process::start(cmd, &[&socket]);
        Daemon { child, socket }
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM: final checkpoint, clean exit.
    pub fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "receiptd exited with {status}");
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn body(scope: &str, kind: &str, i: u64) -> Vec<u8> {
    json!({"scope": scope, "kind": kind, "subject": {"i": i}, "digests": {"args": format!("sha256:{i:064x}")}}).to_string().into_bytes()
}
