//! Shared by the integration tests: a real `warren-toolfs` process in a temp runtime dir, and
//! connections to it (operator socket, or handed over with a grant on the control socket).
#![allow(dead_code)]

pub mod stack;

pub use stack::Stack;

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use warren_9p::{Client, Fid, oflags};
use warren_test_support::daemons::Process;
use warren_toolfs::{Envelope, GrantRecord, ToolGrant};

/// What grant records name as the worker ids (nsd chooses the real ones: [`nsd_worker_uid`]).
pub const WORKER_UID: u32 = 65534;
pub const WORKER_GID: u32 = 65534;

/// The uid (and gid) nsd runs every tool worker as.
pub fn nsd_worker_uid() -> u32 {
    warren_daemon::identity::Role::Worker.uid()
}

pub struct Daemon {
    child: Process,
    pub dir: tempfile::TempDir,
    /// receiptd and the gate, when this toolfs was given a gate.
    pub stack: Option<Stack>,
    /// The fd number `WARREN_GATE_FD` named.
    pub gate_fd: Option<i32>,
}

impl Daemon {
    /// toolfs with receiptd and a gate whose operator allows every ask once (a thread answers
    /// each `pending` event): for tests of what calls do once allowed.
    pub fn start() -> Daemon {
        Daemon::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Daemon {
        let d = Daemon::start_gated(extra);
        d.stack.as_ref().unwrap().approve_every_ask();
        d
    }

    /// toolfs with receiptd and a gate; asks stay open until the test answers them.
    pub fn start_gated(extra: &[&str]) -> Daemon {
        Daemon::start_gated_in(temp_dir(), &[], extra)
    }

    /// As [`Daemon::start_gated`] in `dir` (which has `run/`), receiptd given `receiptd_args`.
    pub fn start_gated_in(
        dir: tempfile::TempDir,
        receiptd_args: &[&str],
        extra: &[&str],
    ) -> Daemon {
        let stack = Stack::up_with(dir.path(), receiptd_args);
        let (ours, theirs) = UnixStream::pair().unwrap();
        stack.hand_toolfs(&theirs);
        drop(theirs);
        // Inherited by toolfs under the number WARREN_GATE_FD names (UnixStream::pair set
        // close-on-exec; toolfs sets it again on its side).
        nix::fcntl::fcntl(
            &ours,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&ours);
        let mut d = Daemon::spawn(dir, extra, Some(&fd.to_string()));
        drop(ours);
        d.stack = Some(stack);
        d.gate_fd = Some(fd);
        d
    }

    /// toolfs alone, without WARREN_GATE_FD: every call is denied.
    pub fn start_ungated(extra: &[&str]) -> Daemon {
        Daemon::spawn(temp_dir(), extra, None)
    }

    /// Starts the real binary with `extra` flags; returns once both sockets answer.
    fn spawn(dir: tempfile::TempDir, extra: &[&str], gate_fd: Option<&str>) -> Daemon {
        let log = std::fs::File::create(dir.path().join("toolfs.log")).unwrap();
        let mut cmd = warren_test_support::daemons::toolfs(&dir.path().join("run"));
        cmd.arg("--echo-journal")
            .arg(dir.path().join("echo.journal"))
            .args(extra)
            .env("WARREN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(fd) = gate_fd {
            cmd.env("WARREN_GATE_FD", fd);
        }
        let run = dir.path().join("run");
        let log = dir.path().join("toolfs.log");
        let sockets = [run.join("toolfs.ctl"), run.join("tool.sock")];
        let child = Process::start_logged(cmd, &[&sockets[0], &sockets[1]], Some(&log));
        Daemon {
            child,
            dir,
            stack: None,
            gate_fd: None,
        }
    }

    pub fn stack(&self) -> &Stack {
        self.stack.as_ref().expect("this toolfs has a gate")
    }

    pub fn stack_mut(&mut self) -> &mut Stack {
        self.stack.as_mut().expect("this toolfs has a gate")
    }

    pub fn ctl(&self) -> PathBuf {
        self.dir.path().join("run/toolfs.ctl")
    }

    pub fn operator_sock(&self) -> PathBuf {
        self.dir.path().join("run/tool.sock")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("toolfs.log")).unwrap_or_default()
    }

    /// Lines of the echo journal (`start <digest>` / `done <digest>`).
    pub fn journal(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("echo.journal"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Host pids of this toolfs's live workers: nsd builds each as the child of a holder of its
    /// own (nsd → holder → worker), so they are nsd's live grandchildren.
    pub fn workers(&self) -> Vec<u32> {
        let Some(nsd) = self.stack.as_ref().and_then(Stack::nsd_pid) else {
            return Vec::new();
        };
        let holders = live_children(nsd);
        holders.into_iter().flat_map(live_children).collect()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }

    /// A connection to the operator socket, attached.
    pub async fn operator(&self) -> (Client, Fid) {
        let client = Client::connect_unix(self.operator_sock()).await.unwrap();
        let root = client.attach("root", "").await.unwrap();
        (client, root)
    }

    /// Hands over one end of a fresh socketpair with `record`, returning the other end.
    pub fn hand_over(
        &self,
        record: &GrantRecord,
        roots: &[BorrowedFd<'_>],
    ) -> std::io::Result<UnixStream> {
        let (ours, theirs) = UnixStream::pair().unwrap();
        warren_toolfs::hand_over(&self.ctl(), record, theirs.as_fd(), roots)?;
        Ok(ours)
    }

    /// A granted connection, attached (with an aname that must not matter).
    pub async fn granted(&self, record: &GrantRecord, roots: &[BorrowedFd<'_>]) -> (Client, Fid) {
        let sock = self.hand_over(record, roots).unwrap();
        sock.set_nonblocking(true).unwrap();
        let client = Client::new(tokio::net::UnixStream::from_std(sock).unwrap(), 1 << 20)
            .await
            .unwrap();
        let root = client.attach("nobody", "/everything").await.unwrap();
        (client, root)
    }
}

/// Pids of `ppid`'s live (not zombie) children.
pub fn live_children(ppid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // pid (comm) state ppid …: comm may hold spaces, so split after the last ')'.
            let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            state != Some("Z") && fields.next().and_then(|p| p.parse::<u32>().ok()) == Some(ppid)
        })
        .collect()
}

/// A short temp dir with `run/` in it.
pub fn temp_dir() -> tempfile::TempDir {
    let dir = warren_test_support::dirs::short("tfs");
    std::fs::create_dir(dir.path().join("run")).unwrap();
    dir
}

/// A fresh session id (32 hex digits) per call.
pub fn session_id() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{:016x}{:08x}{:08x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        0xdead_beefu32
    )
}

/// A grant of `tools`, none with roots.
pub fn record(tools: &[&str]) -> GrantRecord {
    GrantRecord {
        version: 1,
        session: session_id(),
        namespace: "test-ns".into(),
        tools: tools
            .iter()
            .map(|n| ToolGrant {
                name: (*n).into(),
                roots: vec![],
                network: false,
            })
            .collect(),
        worker_uid: WORKER_UID,
        worker_gid: WORKER_GID,
        lineage: None,
        server: None,
    }
}

/// A directory for a tool's root that the unprivileged worker uid can use, and an O_PATH fd of it.
pub fn tool_root(d: &Daemon, name: &str) -> (PathBuf, std::os::fd::OwnedFd) {
    use std::os::unix::fs::PermissionsExt;
    let path = d.dir.path().join(name);
    std::fs::create_dir(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fd = nix::fcntl::open(
        &path,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    (path, fd)
}

/// A grant of `tools`, each with the one root `path` (read-only).
pub fn record_with_root(tools: &[&str], path: &str) -> GrantRecord {
    let mut r = record(tools);
    for t in &mut r.tools {
        if t.name != "echo" {
            t.roots.push(warren_toolfs::RootGrant {
                path: path.into(),
                writable: false,
            });
        }
    }
    r
}

/// Opens `<tool>/call` for reading and writing.
pub async fn open_call(root: &Fid, tool: &str) -> Fid {
    let fid = root.walk(&[tool, "call"]).await.unwrap();
    fid.open(oflags::RDWR).await.unwrap();
    fid
}

/// One whole call the way Python's `r+b` does it: write at 0, read from the end of what was written.
pub async fn call(root: &Fid, tool: &str, args: &[u8]) -> Vec<u8> {
    warren_toolfs::client::call_bytes(root, tool, args)
        .await
        .unwrap()
}

pub async fn call_envelope(root: &Fid, tool: &str, args: &[u8]) -> Envelope {
    let bytes = call(root, tool, args).await;
    Envelope::parse(&bytes)
        .unwrap_or_else(|e| panic!("not an envelope ({e}): {}", String::from_utf8_lossy(&bytes)))
}

/// Reads a whole static file.
pub async fn read_file(root: &Fid, path: &str) -> Vec<u8> {
    let fid = root.walk_path(path).await.unwrap();
    fid.open(oflags::RDONLY).await.unwrap();
    let out = fid.read_to_end(0).await.unwrap();
    fid.clunk().await.unwrap();
    out
}

/// Names in a directory.
pub async fn list(root: &Fid, path: &str) -> Vec<String> {
    let fid = root.walk_path(path).await.unwrap();
    fid.open(oflags::RDONLY).await.unwrap();
    let mut names = fid.read_dir_names().await.unwrap();
    names.retain(|n| n != "." && n != "..");
    fid.clunk().await.unwrap();
    names.sort();
    names
}

/// Tool names in the `tools` file (empty when the file does not exist: an empty grant).
pub async fn tools_file_names(root: &Fid) -> Vec<String> {
    let Ok(fid) = root.walk(&["tools"]).await else {
        return vec![];
    };
    fid.open(oflags::RDONLY).await.unwrap();
    let text = String::from_utf8(fid.read_to_end(0).await.unwrap()).unwrap();
    let mut names: Vec<String> = text
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

/// Polls the echo journal until `pred` holds (the daemon writes it as calls run).
pub async fn wait_journal(d: &Daemon, pred: impl Fn(&[String]) -> bool) {
    for _ in 0..1000 {
        if pred(&d.journal()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("echo journal never matched; it is {:?}", d.journal());
}

pub fn digest(bytes: &[u8]) -> String {
    warren_toolfs::envelope::content_digest(bytes)
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}
