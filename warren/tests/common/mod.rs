//! Shared by the front door's integration tests: `warren up` in a temp dir of its own, `warren
//! run` against it, the gate's asks as an operator sees them, and the daemons' processes.
//! Needs root, /dev/fuse and the workspace's binaries.
#![allow(dead_code)]

pub mod netns;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use warren_test_support::{bins, kernel, receipts};

pub struct Warren {
    pub base: tempfile::TempDir,
}

impl Warren {
    /// `warren up` in a fresh temp dir. Fails, saying why, on a host that cannot run namespaces:
    /// scripts/test leaves these tests out (skipped) when the kernel has no FUSE.
    pub fn up() -> Warren {
        Warren::up_with(&[])
    }

    /// As `up`, with `env` set for `warren up` (the supervisor and its daemons inherit it).
    pub fn up_with(env: &[(&str, &str)]) -> Warren {
        kernel::require_root();
        kernel::require_fuse();
        for b in [
            "warren-supervisor",
            "warren-toolfs",
            "warren-bridge",
            "warren-tool-worker",
        ] {
            bins::bin(b);
        }
        let base = tempfile::Builder::new()
            .prefix("wrun")
            .tempdir_in("/tmp")
            .unwrap();
        let w = Warren { base };
        let mut up = w.cmd(&["up"]);
        for (k, v) in env {
            up.env(k, v);
        }
        let out = up.output().unwrap();
        assert!(
            out.status.success(),
            "warren up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        w
    }

    pub fn runtime(&self) -> PathBuf {
        self.base.path().join("run")
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = self.program(Path::new(env!("CARGO_BIN_EXE_warren")));
        c.args(args);
        c
    }

    /// `warren-supervisor` on this warren's directories, as systemd starts it.
    pub fn supervisor(&self) -> Command {
        self.program(&bins::bin("warren-supervisor"))
    }

    /// `program` with this warren's directories in its environment and stdin closed.
    fn program(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.env("WARREN_RUNTIME_DIR", self.runtime())
            .env("WARREN_DATA_DIR", self.base.path().join("data"))
            .env("WARREN_SECRETS_DIR", self.base.path().join("secrets"))
            .stdin(std::process::Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// `warren ARGS…`, which must succeed (else the test fails with its stderr).
    pub fn run_ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "warren {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `warren run FLAGS -- sh -c SCRIPT`, returning (status, stdout, stderr).
    pub fn sh(&self, flags: &[&str], script: &str) -> (i32, String, String) {
        let out = self.run(&sh_args(flags, script));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `warren run FLAGS -- sh -c SCRIPT` started in the background, stdout and stderr piped.
    pub fn spawn_sh(&self, flags: &[&str], script: &str) -> std::process::Child {
        self.spawn_run(&sh_args(flags, script)[1..])
    }

    /// `warren run ARGS…` started in the background, stdout and stderr piped.
    pub fn spawn_run(&self, args: &[&str]) -> std::process::Child {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        self.cmd(&all)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The supervisor's pid (it writes it in the runtime dir).
    pub fn supervisor_pid(&self) -> i32 {
        std::fs::read_to_string(self.runtime().join("warren.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The pid of this warren's running `binary` (e.g. `warren-gate`): the process whose
    /// executable has that name and whose environment names this runtime dir.
    pub fn daemon_pid(&self, binary: &str) -> i32 {
        let found = self.daemon_pids(binary);
        assert_eq!(
            found.len(),
            1,
            "{binary} processes of this warren: {found:?}"
        );
        found[0]
    }

    /// Every process of this warren running `binary` (none while the supervisor restarts it).
    pub fn daemon_pids(&self, binary: &str) -> Vec<i32> {
        let wanted = format!("WARREN_RUNTIME_DIR={}", self.runtime().display());
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let exe = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
            if exe.file_name().is_none_or(|n| n != binary) {
                continue;
            }
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            if environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) {
                found.push(pid);
            }
        }
        found
    }

    /// A session's receipt bodies, oldest first (`/receipts/<session>/log`, each DSSE payload).
    pub fn receipts(&self, session: &str) -> Vec<serde_json::Value> {
        let out = self.run(&["cat", &format!("/receipts/{session}/log")]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        receipts::bodies_of(&out.stdout)
    }

    /// The subjects of a session's decision receipts, oldest first.
    pub fn decisions(&self, session: &str) -> Vec<serde_json::Value> {
        self.receipts(session)
            .into_iter()
            .filter(|b| b["kind"] == "decision")
            .map(|b| b["subject"].clone())
            .collect()
    }
}

impl Drop for Warren {
    fn drop(&mut self) {
        let _ = self.run(&["down", "--force"]);
    }
}

fn sh_args<'a>(flags: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut args = vec!["run"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "/bin/sh", "-c", script]);
    args
}

/// Every receipts scope (a namespace's session each).
pub fn scopes(w: &Warren) -> Vec<String> {
    let out = w.run_ok(&["ls", "/receipts"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .filter(|s| !warren_receiptd::receipt::RESERVED_NAMES.contains(&s.as_str()))
        .collect()
}

/// Every receipt of every scope.
pub fn all_receipts(w: &Warren) -> Vec<serde_json::Value> {
    scopes(w)
        .iter()
        .flat_map(|scope| w.receipts(scope))
        .collect()
}

/// Waits (bounded) for a pending ask with an id above `after` to appear on the gate and returns
/// (id, request text).
/// The operator, as a task on a runtime of its own: every `pending` event on the gate's operator
/// socket is answered `allow once <fp>`. Dropping the runtime ends it (and its connection, so
/// `warren down` is not kept waiting).
pub fn approve_every_ask(w: &Warren) -> tokio::runtime::Runtime {
    let sock = w.runtime().join("gate.sock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (ready, watching) = std::sync::mpsc::channel();
    rt.spawn(warren_test_support::approver::allow_every_ask(
        sock,
        Some(ready),
    ));
    watching
        .recv_timeout(Duration::from_secs(60))
        .expect("the approver never started watching the gate's events");
    rt
}

/// Makes `dir` writable by the `shell` worker of every namespace: each runs as a uid of its own
/// (its namespace subtree's).
pub fn open_to_shell_workers(dir: &Path) {
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
}

/// The ids `warren ls /ns` lists.
pub fn ns_ids(w: &Warren) -> Vec<String> {
    let out = w.run(&["ls", "/ns"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .filter(|l| l.parse::<u64>().is_ok())
        .collect()
}

/// Polls `cond` until it holds; fails the test after 30 s.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn next_ask(w: &Warren, after: i64) -> (i64, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = w.run(&["ls", "/gate/pending"]);
        let ids: Vec<i64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim_end_matches('/').parse().ok())
            .filter(|&id| id > after)
            .collect();
        if let Some(&id) = ids.iter().min() {
            let req = w.run(&["cat", &format!("/gate/pending/{id}/request")]);
            return (id, String::from_utf8_lossy(&req.stdout).into_owned());
        }
        assert!(Instant::now() < deadline, "no ask appeared on the gate");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A field of a `request` file (`fingerprint`, `session`, `args`, …).
pub fn field<'a>(request: &'a str, name: &str) -> &'a str {
    request
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("the request shows no {name}: {request}"))
        .trim()
}

pub fn fingerprint(request: &str) -> &str {
    field(request, "fingerprint")
}

/// The JSON lines (result envelopes) of a command's output.
pub fn envelopes(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The workspace's root (where `target/peers` is).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The host's system directories, bound read-only, for an MCP server's spec.
pub const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

/// `warren mcp …` with this test's config dir.
pub fn mcp(
    w: &Warren,
    config: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
    let mut all = vec!["mcp"];
    all.extend_from_slice(args);
    let mut cmd = w.cmd(&all);
    cmd.env("WARREN_CONFIG_DIR", config);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `warren mcp check NAME` (which must succeed), then `warren mcp accept NAME TOOLS…`: an
/// operator accepting what `check` showed them (every tool shown when `tools` is empty).
pub fn check_then_accept(
    w: &Warren,
    config: &Path,
    name: &str,
    tools: &[&str],
) -> (bool, String, String) {
    let (ok, out, err) = mcp(w, config, &["check", name], &[]);
    assert!(ok, "warren mcp check {name}: {out}\n{err}");
    let mut args = vec!["accept", name];
    args.extend_from_slice(tools);
    mcp(w, config, &args, &[])
}

/// An operator config dir the daemons can read (mcpfs runs under its own uid), and warren up
/// with it: nsd and mcpfs read the server definitions there.
pub fn up_with_config() -> (Warren, tempfile::TempDir) {
    up_with_config_and(&[])
}

/// [`up_with_config`], with more `env` for `warren up`.
pub fn up_with_config_and(env: &[(&str, &str)]) -> (Warren, tempfile::TempDir) {
    let config = tempdir_with_mode("wmcp", 0o755);
    std::fs::create_dir_all(config.path().join("mcp")).unwrap();
    let mut all = vec![("WARREN_CONFIG_DIR", config.path().to_str().unwrap())];
    all.extend_from_slice(env);
    let w = Warren::up_with(&all);
    (w, config)
}

/// A temp dir in /tmp with `mode`: one the daemons, the servers and the payloads, each under a
/// uid of its own, can reach.
pub fn tempdir_with_mode(prefix: &str, mode: u32) -> tempfile::TempDir {
    let dir = warren_test_support::dirs::short(prefix);
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(mode),
    )
    .unwrap();
    dir
}

/// `server-everything` defined with `echo` at the read tier.
pub fn define_everything(config: &Path) {
    let peers = repo().join("target/peers/mcp");
    let js = peers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        js.exists(),
        "{}: run scripts/install-test-deps",
        js.display()
    );
    std::fs::write(
        config.join("mcp/everything.toml"),
        format!(
            "command = [\"/usr/bin/node\", \"{js}\", \"stdio\"]\nspec = \"\"\"\n{SYSTEM}bind -r {p} {p}\nnet none\n\"\"\"\n[tiers]\necho = \"read\"\n",
            js = js.display(),
            p = peers.display()
        ),
    )
    .unwrap();
}

/// The operator's `.bashrc` in `dir`, 0644: what a planted symlink aims an operator's output
/// file at. [`assert_bashrc_untouched`] checks it after.
pub fn operators_bashrc(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bashrc = dir.join(".bashrc");
    std::fs::write(&bashrc, BASHRC).unwrap();
    std::fs::set_permissions(&bashrc, std::fs::Permissions::from_mode(0o644)).unwrap();
    bashrc
}

const BASHRC: &str = "alias ls='ls --color'\n";

/// [`operators_bashrc`] as it was made: the same bytes, mode 0644.
pub fn assert_bashrc_untouched(bashrc: &Path) {
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::read_to_string(bashrc).unwrap(), BASHRC);
    assert_eq!(
        std::fs::metadata(bashrc).unwrap().permissions().mode() & 0o7777,
        0o644
    );
}
