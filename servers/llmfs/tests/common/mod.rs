//! The scripted backend and llmfs as processes, and a 9P client's view of a session.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use warren_9p::{Client, Errno, Fid, oflags};
use warren_test_support::daemons::{self, Process};
pub use warren_test_support::llm_script::Script;

/// The key the tests' llmfs reads from its key file.
pub const KEY: &str = "sk-test-0123456789";

/// A short temp dir under /tmp (socket paths must fit in 108 bytes).
pub fn tmp() -> tempfile::TempDir {
    warren_test_support::dirs::short("llmfs")
}

/// A running `warren-llmfs` on `<dir>/run/llm.sock`.
pub struct Llmfs {
    _process: Process,
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
        let url = format!("http://127.0.0.1:{port}");
        let mut cmd = daemons::llmfs(&run, &secrets, &url, api);
        cmd.args(["--backoff-ms", "10"]).args(extra);
        let process = Process::start(cmd, &[&socket]);
        Llmfs {
            _process: process,
            socket,
        }
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
        self.hand_over_lineage(warren_proto::lineage::Lineage::root(
            warren_proto::lineage::Member {
                session: session.into(),
                namespace: "1".into(),
                ..Default::default()
            },
        ))
        .await
    }

    /// A connection handed over as nsd hands the namespace `lineage` starts with (a clone's
    /// lineage names the namespaces above it, up to its subtree's root).
    pub async fn hand_over_lineage(&self, lineage: warren_proto::lineage::Lineage) -> Conn {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let grant = warren_proto::llm::LlmGrant {
            version: 1,
            session: lineage.0[0].session.clone(),
            namespace: lineage.0[0].namespace.clone(),
            lineage: Some(lineage),
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
