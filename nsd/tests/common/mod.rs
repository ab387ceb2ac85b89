//! Shared helpers for the confinement tests: run `warren-nsd run`, run probes inside and out.

#![allow(dead_code)]

pub mod escape;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use warren_daemon::Dirs;
use warren_test_support::daemons::{self, Process};

pub const NSD: &str = env!("CARGO_BIN_EXE_warren-nsd");
/// The escape suite's probe (`tests/probe`), found as every test finds the workspace's binaries.
pub fn probe_path() -> &'static str {
    static PROBE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        warren_test_support::bins::bin("warren-probe")
            .into_os_string()
            .into_string()
            .expect("a UTF-8 path")
    });
    &PROBE
}
pub const NOBODY: u32 = 65534;

/// These tests build real namespaces; they need root, and fail saying so without it.
pub fn need_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test builds real namespaces and needs root (scripts/test runs as root)"
    );
}

/// A short temp dir under /tmp, world-accessible so a non-root payload can traverse it.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    let t = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        t.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    t
}

/// Protected dirs for a test, under its own temp dir, so tests never depend on /run/warren.
pub struct Protected {
    pub base: tempfile::TempDir,
}

impl Protected {
    pub fn new() -> Protected {
        let base = tempdir("wprot");
        for d in ["run/warren", "var/lib/warren", "etc/warren/secrets"] {
            std::fs::create_dir_all(base.path().join(d)).unwrap();
        }
        Protected { base }
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        self.base.path().join(rel)
    }
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("WARREN_RUNTIME_DIR", self.path("run/warren"))
            .env("WARREN_DATA_DIR", self.path("var/lib/warren"))
            .env("WARREN_SECRETS_DIR", self.path("etc/warren/secrets"));
    }
}

/// `warren-nsd run FLAGS -- CMD…`
pub fn nsd_run(flags: &[&str], cmd: &[&str]) -> Output {
    let mut c = Command::new(NSD);
    c.arg("run").args(flags).arg("--").args(cmd);
    c.output().expect("spawn warren-nsd")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The probe's verdict: the last word it printed.
pub fn verdict(out: &Output) -> String {
    text(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Who runs a probe's control, outside any namespace.
#[derive(Clone, Copy, Debug)]
pub enum Control {
    /// root, as is
    Root,
    /// root inside `unshare -m --propagation private` (for probes that really mount)
    RootPrivateMounts,
    /// a non-root user: shows the block inside is warren's doing, not merely "not root"
    Nobody,
}

pub fn control_output(control: Control, probe_args: &[&str]) -> Output {
    match control {
        Control::Root => Command::new(probe_path())
            .args(probe_args)
            .output()
            .unwrap(),
        Control::RootPrivateMounts => Command::new("unshare")
            .args(["-m", "--propagation", "private", probe_path()])
            .args(probe_args)
            .output()
            .unwrap(),
        Control::Nobody => Command::new(probe_path())
            .args(probe_args)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap(),
    }
}

pub fn exists(p: &str) -> bool {
    Path::new(p).exists()
}

/// A real `warren-nsd serve` in a temp runtime dir of its own; killed when dropped.
pub struct Nsd {
    pub child: Process,
    pub dirs: Dirs,
    _base: tempfile::TempDir,
}

/// Starts `warren-nsd serve` under a fresh temp dir named `prefix…` and returns once its run
/// socket and its /ns socket both accept (readiness, not timing; panics if nsd died first).
pub fn start_nsd(prefix: &str) -> Nsd {
    let base = tempdir(prefix);
    let dirs = Dirs::under(base.path());
    std::fs::create_dir_all(&dirs.runtime).unwrap();
    let cmd = daemons::nsd(&dirs.runtime, &dirs.data, &dirs.secrets);
    let run = warren_ns::launch::socket_path(&dirs);
    let child = Process::start(cmd, &[&run, &dirs.socket("ns")]);
    Nsd {
        child,
        dirs,
        _base: base,
    }
}

/// Reads `/ns/<path>` over 9P on nsd's operator socket.
pub fn ns_read(dirs: &Dirs, path: &str) -> Result<String, warren_9p::Errno> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = warren_9p::Client::connect_unix(dirs.socket("ns"))
            .await
            .unwrap();
        let root = client.attach("root", "").await?;
        let f = root.walk_path(path).await?;
        f.open(warren_9p::oflags::RDONLY).await?;
        if path.is_empty() {
            let names: Vec<String> = f.read_dir_names().await?;
            return Ok(names.join("\n"));
        }
        Ok(String::from_utf8_lossy(&f.read_to_end(0).await?).into_owned())
    })
}

/// The value of `key` in an `info` file (`key value` lines).
pub fn info_field(info: &str, key: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .map(str::to_string)
}
