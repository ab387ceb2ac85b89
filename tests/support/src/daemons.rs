//! Each daemon as a real process, the one way the tests start it: its built binary
//! ([`crate::bins::bin`]) with the directory arguments every test gives it, logging at `warn`,
//! stdin closed. A test adds its own arguments to the returned [`Command`] and hands it to
//! [`Process::start`], which returns once the daemon's sockets accept.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bins::bin;

/// A daemon the test started: killed and reaped when dropped.
pub struct Process {
    child: Child,
    name: String,
}

impl Process {
    /// Spawns `cmd` and waits until each of `sockets` accepts a connection (readiness, not a
    /// timing assertion); fails if the daemon exits first or has not listened within 30 s.
    pub fn start(cmd: Command, sockets: &[&Path]) -> Process {
        Process::start_logged(cmd, sockets, None)
    }

    /// As [`Process::start`]; a daemon that does not come up is reported with its `log` (the
    /// file its stderr goes to).
    pub fn start_logged(mut cmd: Command, sockets: &[&Path], log: Option<&Path>) -> Process {
        let name = Path::new(cmd.get_program())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        let mut p = Process { child, name };
        for socket in sockets {
            if let Err(why) = p.wait_for_socket(socket) {
                let log = log
                    .map(|l| std::fs::read_to_string(l).unwrap_or_default())
                    .unwrap_or_default();
                panic!("{why}\n{log}");
            }
        }
        p
    }

    /// Spawns `cmd` with its stdout piped and returns it with the first line it printed: for a
    /// daemon that says where it listens (netproxy's `listening tcp:ADDR`). Fails if it exits
    /// without a line.
    pub fn start_saying(mut cmd: Command) -> (Process, String) {
        cmd.stdout(Stdio::piped());
        let mut p = Process::start(cmd, &[]);
        let mut line = String::new();
        let stdout = p.child.stdout.take().expect("stdout is piped");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("read {}'s first line: {e}", p.name));
        assert!(!line.is_empty(), "{} exited without a line", p.name);
        (p, line)
    }

    fn wait_for_socket(&mut self, path: &Path) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(path).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{} exited before listening: {status}", self.name));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not listen on {} within 30 s",
                    self.name,
                    path.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for it to end (a test that stopped it and checks how it ended).
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait()
    }

    /// SIGKILL, not waiting (dropping it also reaps it).
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn daemon(name: &str) -> Command {
    let mut cmd = Command::new(bin(name));
    cmd.env("WARREN_LOG", "warn").stdin(Stdio::null());
    cmd
}

/// `warren-receiptd` on `runtime` (its socket: `receipts.sock`), `data` and `secrets`.
pub fn receiptd(runtime: &Path, data: &Path, secrets: &Path) -> Command {
    let mut cmd = daemon("warren-receiptd");
    cmd.arg("--runtime-dir")
        .arg(runtime)
        .arg("--data-dir")
        .arg(data)
        .arg("--secrets-dir")
        .arg(secrets);
    cmd
}

/// `warren-gate` on `runtime` (its sockets: `gate.sock`, `gate.ctl`) and `data`.
pub fn gate(runtime: &Path, data: &Path) -> Command {
    let mut cmd = daemon("warren-gate");
    cmd.arg("--runtime-dir")
        .arg(runtime)
        .arg("--data-dir")
        .arg(data);
    cmd
}

/// `warren-nsd serve` on `runtime` (its worker socket: `nsd-workers.ctl`), with `data` and
/// `secrets` as the directories no namespace may see, building tool workers from the
/// workspace's `warren-tool-worker`.
pub fn nsd(runtime: &Path, data: &Path, secrets: &Path) -> Command {
    let mut cmd = daemon("warren-nsd");
    cmd.arg("serve")
        .env("WARREN_RUNTIME_DIR", runtime)
        .env("WARREN_DATA_DIR", data)
        .env("WARREN_SECRETS_DIR", secrets)
        .env("WARREN_TOOL_WORKER", bin("warren-tool-worker"));
    cmd
}

/// `warren-toolfs` on `runtime` (its sockets: `toolfs.ctl`, `tool.sock`), never inheriting a
/// gate connection the test did not give it.
pub fn toolfs(runtime: &Path) -> Command {
    let mut cmd = daemon("warren-toolfs");
    cmd.arg("--runtime-dir")
        .arg(runtime)
        .env_remove("WARREN_GATE_FD");
    cmd
}

/// `warren-llmfs` on `runtime` (its socket: `llm.sock`) in front of the model backend at
/// `url` speaking `api`, its key file in `secrets`.
pub fn llmfs(runtime: &Path, secrets: &Path, url: &str, api: &str) -> Command {
    let mut cmd = daemon("warren-llmfs");
    cmd.arg("--runtime-dir")
        .arg(runtime)
        .env("WARREN_SECRETS_DIR", secrets)
        .env("WARREN_LLM_URL", url)
        .env("WARREN_LLM_API", api);
    cmd
}
