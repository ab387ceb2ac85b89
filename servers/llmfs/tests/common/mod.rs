//! The scripted backend and llmfs as processes, and a 9P client's view of a session.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use warren_9p::{Client, Errno, Fid, oflags};

/// The key the tests' llmfs reads from its key file.
pub const KEY: &str = "sk-test-0123456789";

/// A short temp dir under /tmp (socket paths must fit in 108 bytes).
pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("llmfs")
        .tempdir_in("/tmp")
        .expect("temp dir")
}

/// A running `warren-llm-script`.
pub struct Script {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Script {
    /// Starts the scripted backend with `turns` (`api`: `openai` or `anthropic`).
    pub fn start(dir: &Path, api: &str, turns: Value) -> Script {
        let script = dir.join("script.json");
        std::fs::write(&script, turns.to_string()).unwrap();
        let log = dir.join("requests.jsonl");
        let mut child = Command::new(env!("CARGO_BIN_EXE_warren-llm-script"))
            .arg("--script")
            .arg(&script)
            .arg("--log")
            .arg(&log)
            .args(["--api", api])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn warren-llm-script");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let port = first
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("warren-llm-script printed {first:?}, not its port"));
        Script { child, port, log }
    }

    /// The requests it received, in order.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `warren-llmfs` on `<dir>/run/llm.sock`.
pub struct Llmfs {
    child: Child,
    pub socket: PathBuf,
}

impl Llmfs {
    /// llmfs in front of the backend on `port`, the key in `<dir>/secrets/llm.key`, no receipts, fast
    /// backoff; `extra` flags after those.
    pub fn start(dir: &Path, port: u16, api: &str, extra: &[&str]) -> Llmfs {
        let mut args = vec!["--no-receipts", "--no-gate"];
        args.extend_from_slice(extra);
        Llmfs::start_with(dir, port, api, &args)
    }

    /// As [`Llmfs::start`], without `--no-receipts` (the caller names receiptd's socket).
    pub fn start_with(dir: &Path, port: u16, api: &str, extra: &[&str]) -> Llmfs {
        let run = dir.join("run");
        let secrets = dir.join("secrets");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::write(secrets.join("llm.key"), format!("{KEY}\n")).unwrap();
        let socket = run.join("llm.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_warren-llmfs"))
            .arg("--runtime-dir")
            .arg(&run)
            .args(["--backoff-ms", "10"])
            .args(extra)
            .env("WARREN_SECRETS_DIR", &secrets)
            .env("WARREN_LLM_URL", format!("http://127.0.0.1:{port}"))
            .env("WARREN_LLM_API", api)
            .env("WARREN_LOG", "warn")
            .spawn()
            .expect("spawn warren-llmfs");
        let mut fs = Llmfs { child, socket };
        fs.wait_ready();
        fs
    }

    /// Waits until the socket accepts (readiness, not a timing assertion).
    fn wait_ready(&mut self) {
        for _ in 0..1000 {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("warren-llmfs exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("warren-llmfs did not come up at {}", self.socket.display());
    }

    pub async fn connect(&self) -> Conn {
        let client = Client::connect_unix(&self.socket).await.unwrap();
        let root = client.attach("operator", "").await.unwrap();
        Conn {
            _client: client,
            root,
        }
    }

    /// A connection handed over on `llmfs.ctl` as nsd hands a namespace's (`mount llm`), with
    /// `session` as the namespace's session.
    pub async fn hand_over(&self, session: &str) -> Conn {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let grant = warren_proto::llm::LlmGrant {
            version: 1,
            session: session.into(),
            namespace: "1".into(),
            lineage: Some(warren_gate::lineage::Lineage::root(
                warren_gate::lineage::Member {
                    session: session.into(),
                    namespace: "1".into(),
                    ..Default::default()
                },
            )),
        };
        let ctl = self.socket.with_file_name("llmfs.ctl");
        warren_proto::llm::hand_over(&ctl, &grant, std::os::fd::AsFd::as_fd(&theirs)).unwrap();
        drop(theirs);
        ours.set_nonblocking(true).unwrap();
        let stream = tokio::net::UnixStream::from_std(ours).unwrap();
        let client = Client::new(stream, 1 << 20).await.unwrap();
        let root = client.attach("agent", "").await.unwrap();
        Conn {
            _client: client,
            root,
        }
    }
}

impl Drop for Llmfs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One 9P connection to llmfs.
pub struct Conn {
    _client: Client,
    pub root: Fid,
}

impl Conn {
    /// Mints a session: its token.
    pub async fn new_session(&self) -> String {
        let new = self.root.walk(&["new"]).await.unwrap();
        new.open(oflags::RDONLY).await.unwrap();
        let token = String::from_utf8(new.read_to_end(0).await.unwrap()).unwrap();
        token.trim_end().to_owned()
    }

    pub async fn open(&self, token: &str, file: &str, flags: u32) -> Result<Fid, Errno> {
        let fid = self.root.walk(&[token, file]).await?;
        fid.open(flags).await?;
        Ok(fid)
    }

    /// Writes `text` to `<token>/<file>` (a fresh open, written at 0).
    pub async fn put(&self, token: &str, file: &str, text: &str) -> Result<(), Errno> {
        let fid = self.open(token, file, oflags::WRONLY).await?;
        fid.write_all(0, text.as_bytes()).await
    }

    pub async fn get(&self, token: &str, file: &str) -> String {
        let fid = self.open(token, file, oflags::RDONLY).await.unwrap();
        String::from_utf8(fid.read_to_end(0).await.unwrap()).unwrap()
    }

    /// Asks `message` and reads the whole reply: its JSON lines. A reply that does not end is a
    /// failure (bounded, so a hang fails the test instead of stalling it).
    pub async fn ask(&self, token: &str, message: &str) -> Vec<Value> {
        let fid = self.open(token, "ask", oflags::RDWR).await.unwrap();
        fid.write_all(0, message.as_bytes()).await.unwrap();
        let bytes = tokio::time::timeout(Duration::from_secs(60), fid.read_to_end(0))
            .await
            .expect("the reply ends")
            .unwrap();
        lines(&bytes)
    }
}

pub fn lines(bytes: &[u8]) -> Vec<Value> {
    std::str::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// The `error` of the last line (every line before it must not be one).
pub fn error_of(reply: &[Value]) -> String {
    let last = reply.last().expect("a line");
    last["error"]
        .as_str()
        .unwrap_or_else(|| panic!("the reply does not end with an error: {reply:?}"))
        .to_owned()
}
