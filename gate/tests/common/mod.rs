//! Test harness: the real `warren-gate` and `warren-receiptd` binaries in a short temp dir, and
//! 9P clients to them (the operator socket, and connections handed over on the control socket).

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde_json::Value;
use warren_9p::{Client, Errno, Fid, oflags};
use warren_gate::control::{ControlRecord, hand_over};
use warren_gate::gate::Answer;
use warren_test_support::daemons::{self, Process};
use warren_test_support::receipts;

pub const S1: &str = "11111111111111111111111111111111";
pub const S2: &str = "22222222222222222222222222222222";
pub const S3: &str = "33333333333333333333333333333333";

pub struct Env {
    _dir: tempfile::TempDir,
    pub base: PathBuf,
    pub runtime: PathBuf,
    pub gate_data: PathBuf,
    gate: Option<Process>,
    receiptd: Option<Process>,
    gate_args: Vec<String>,
}

impl Env {
    /// A fresh directory with receiptd running and the gate started with `gate_args`.
    pub fn up(gate_args: &[&str]) -> Env {
        let mut env = Env::bare(gate_args);
        env.start_receiptd();
        env.start_gate();
        env
    }

    /// A fresh directory, nothing running.
    pub fn bare(gate_args: &[&str]) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("wg")
            .tempdir_in("/tmp")
            .unwrap();
        let base = dir.path().to_path_buf();
        let runtime = base.join("run");
        let gate_data = base.join("gate");
        for d in [
            &runtime,
            &gate_data,
            &base.join("rdata"),
            &base.join("secrets"),
        ] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        Env {
            _dir: dir,
            base,
            runtime,
            gate_data,
            gate: None,
            receiptd: None,
            gate_args: gate_args.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub fn start_receiptd(&mut self) {
        let mut cmd = daemons::receiptd(
            &self.runtime,
            &self.base.join("rdata"),
            &self.base.join("secrets"),
        );
        cmd.arg("--gate-uid")
            .arg(nix::unistd::geteuid().as_raw().to_string());
        self.receiptd = Some(Process::start(cmd, &[&self.runtime.join("receipts.sock")]));
    }

    pub fn start_gate(&mut self) {
        let mut cmd = daemons::gate(&self.runtime, &self.gate_data);
        cmd.args(&self.gate_args);
        self.gate = Some(Process::start(cmd, &[&self.runtime.join("gate.sock")]));
    }

    pub fn kill_gate(&mut self) {
        self.gate.take();
    }

    pub fn kill_receiptd(&mut self) {
        self.receiptd.take();
    }

    /// An operator attach on `gate.sock`.
    pub async fn operator(&self) -> Fid {
        let c = Client::connect_unix(self.runtime.join("gate.sock"))
            .await
            .expect("connect gate.sock");
        c.attach("test", "").await.expect("attach")
    }

    /// A connection handed over on `gate.ctl` with `record`.
    pub async fn handed(&self, record: &ControlRecord) -> Result<Fid, std::io::Error> {
        let (mine, theirs) = std::os::unix::net::UnixStream::pair()?;
        hand_over(&self.runtime.join("gate.ctl"), record, &theirs)?;
        drop(theirs);
        mine.set_nonblocking(true)?;
        let c = Client::new(tokio::net::UnixStream::from_std(mine)?, 1 << 20).await?;
        Ok(c.attach("test", "").await?)
    }

    /// An operator connection the front door marked as `warren approvals`'s tty.
    pub async fn tty_operator(&self) -> Fid {
        let record = ControlRecord {
            version: 1,
            kind: warren_gate::control::RecordKind::Operator,
            confirmed_tty: true,
            ..Default::default()
        };
        self.handed(&record)
            .await
            .expect("hand over a tty operator connection")
    }

    /// The number of receipts in receiptd's log for `scope`.
    pub async fn receipts_in(&self, scope: &str) -> usize {
        self.receipts_log(scope)
            .await
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count()
    }

    /// The receipt bodies (each DSSE envelope's payload) in receiptd's log for `scope`.
    pub async fn receipt_bodies(&self, scope: &str) -> Vec<Value> {
        receipts::bodies(&self.runtime.join("receipts.sock"), scope).await
    }

    /// receiptd's log for `scope` (empty while it has none).
    pub async fn receipts_log(&self, scope: &str) -> Vec<u8> {
        receipts::log(&self.runtime.join("receipts.sock"), scope).await
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.kill_gate();
        self.kill_receiptd();
    }
}

/// The canonical (RFC 8785) bytes of `v`.
pub fn canon(v: &Value) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(v).unwrap()
}

/// An open `decide` fid.
pub async fn decide_fid(root: &Fid) -> Fid {
    let f = root.walk(&["decide"]).await.expect("walk decide");
    f.open(oflags::RDWR).await.expect("open decide");
    f
}

/// One decide round trip on a fresh open.
pub async fn decide(
    root: &Fid,
    session: &str,
    tool: &str,
    args: &Value,
    context: &[&str],
) -> Answer {
    let f = decide_fid(root).await;
    decide_on(&f, session, tool, args, context).await
}

/// One decide round trip on an open `decide` fid.
pub async fn decide_on(
    f: &Fid,
    session: &str,
    tool: &str,
    args: &Value,
    context: &[&str],
) -> Answer {
    let args = String::from_utf8(canon(args)).unwrap();
    let req = format!(
        r#"{{"session":"{session}","tool":"{tool}","args":{args},"context":{}}}"#,
        serde_json::to_string(context).unwrap()
    );
    f.write(0, req.as_bytes()).await.expect("write decide");
    let reply = f.read_to_end(0).await.expect("read decide");
    serde_json::from_slice(&reply)
        .unwrap_or_else(|e| panic!("decide reply {:?}: {e}", String::from_utf8_lossy(&reply)))
}

/// Reads a file whole.
pub async fn read(root: &Fid, path: &str) -> Result<String, Errno> {
    let f = root.walk_path(path).await?;
    f.open(oflags::RDONLY).await?;
    Ok(String::from_utf8_lossy(&f.read_to_end(0).await?).into_owned())
}

/// Writes `text` to a file in one write; on error returns the errno and the message read back.
pub async fn write(root: &Fid, path: &str, text: &str) -> Result<String, (Errno, String)> {
    let f = root.walk_path(path).await.map_err(|e| (e, String::new()))?;
    f.open(oflags::RDWR).await.map_err(|e| (e, String::new()))?;
    match f.write(0, text.as_bytes()).await {
        Ok(_) => {
            Ok(String::from_utf8_lossy(&f.read_to_end(0).await.unwrap_or_default()).into_owned())
        }
        Err(e) => Err((
            e,
            String::from_utf8_lossy(&f.read_to_end(0).await.unwrap_or_default()).into_owned(),
        )),
    }
}

/// Waits on an ask and returns its outcome.
pub async fn wait(root: &Fid, id: i64) -> Answer {
    let text = read(root, &format!("pending/{id}/wait"))
        .await
        .expect("read wait");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("wait reply {text:?}: {e}"))
}

/// The open asks listed in `pending/`.
pub async fn listed(root: &Fid) -> Vec<i64> {
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
