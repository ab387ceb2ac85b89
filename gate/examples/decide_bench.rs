//! Benchmark: `decide` round trips per second over a Unix socket, allow path (`fs_read`), with
//! receiptd up — side by side with the hop it contains, a bare receiptd `append` of the same size,
//! so the ratio is the gate's own cost. Sequential on one open, then 8 callers on 8 opens.
//!
//! ```text
//! cargo build --release -p warren-gate -p warren-receiptd
//! cargo run --release -p warren-gate --example decide_bench [-- N]
//! ```
//! Runs as root (receiptd takes `decision` receipts only from the gate's uid: here, ours).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use warren_9p::{Client, Fid, oflags};

const SESSION: &str = "0123456789abcdef0123456789abcdef";

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_socket(p: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(p).is_err() {
        assert!(Instant::now() < deadline, "{} never listened", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn open(root: &Fid, name: &str) -> Fid {
    let f = root.walk(&[name]).await.unwrap();
    f.open(oflags::RDWR).await.unwrap();
    f
}

async fn rounds(f: Fid, body: Arc<Vec<u8>>, n: usize, check: fn(&[u8]) -> bool) -> (Fid, usize) {
    let mut bad = 0;
    for _ in 0..n {
        // Write and read pipelined, as GateClient and the gate's receipt sink do.
        let r = f.call(&body).await.unwrap_or_default();
        if !check(&r) {
            bad += 1;
        }
    }
    (f, bad)
}

/// Round trips per second with one task per fid; returns the fids for the next run.
async fn rate(
    fids: Vec<Fid>,
    body: &[u8],
    n: usize,
    check: fn(&[u8]) -> bool,
) -> (f64, usize, Vec<Fid>) {
    let body = Arc::new(body.to_vec());
    let callers = fids.len();
    let start = Instant::now();
    let tasks: Vec<_> = fids
        .into_iter()
        .map(|f| tokio::spawn(rounds(f, body.clone(), n, check)))
        .collect();
    let mut fids = Vec::new();
    let mut bad = 0;
    for t in tasks {
        let (f, b) = t.await.unwrap();
        fids.push(f);
        bad += b;
    }
    (
        (n * callers) as f64 / start.elapsed().as_secs_f64(),
        bad,
        fids,
    )
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3000);
    let bin_dir = std::env::var_os("WARREN_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release"));
    let dir = tempfile::Builder::new()
        .prefix("wgb")
        .tempdir_in("/tmp")
        .unwrap();
    let (run, rdata, secrets, gdata) = (
        dir.path().join("run"),
        dir.path().join("rd"),
        dir.path().join("s"),
        dir.path().join("g"),
    );
    for d in [&run, &rdata, &secrets, &gdata] {
        std::fs::create_dir_all(d).unwrap();
    }
    let uid = nix::unistd::geteuid().as_raw().to_string();
    let _receiptd = Kill(
        Command::new(bin_dir.join("warren-receiptd"))
            .args([
                "--runtime-dir",
                run.to_str().unwrap(),
                "--data-dir",
                rdata.to_str().unwrap(),
            ])
            .args([
                "--secrets-dir",
                secrets.to_str().unwrap(),
                "--gate-uid",
                &uid,
                "--rate",
                "1e9",
                "--burst",
                "1e9",
            ])
            .env("WARREN_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .expect("warren-receiptd (cargo build --release -p warren-receiptd)"),
    );
    wait_socket(&run.join("receipts.sock"));
    let _gate = Kill(
        Command::new(bin_dir.join("warren-gate"))
            .args([
                "--runtime-dir",
                run.to_str().unwrap(),
                "--data-dir",
                gdata.to_str().unwrap(),
            ])
            // WARREN_GATE_LOG=debug prints the gate's per-hop timing of each decide on stderr.
            .env(
                "WARREN_LOG",
                std::env::var("WARREN_GATE_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .expect("warren-gate (cargo build --release -p warren-gate)"),
    );
    wait_socket(&run.join("gate.sock"));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let args = serde_json_canonicalizer::to_string(&json!({"path": "notes.md"})).unwrap();
        let decide_body = format!(r#"{{"session":"{SESSION}","tool":"fs_read","args":{args}}}"#).into_bytes();
        // The same receipt the gate writes for this call, appended directly.
        let append_body = serde_json::to_vec(&json!({
            "scope": SESSION, "kind": "decision",
            "subject": {"session": SESSION, "tool": "fs_read", "verdict": "allow", "basis": "default:read", "class": "read",
                        "context": [], "fingerprint": "0".repeat(64), "args_sha256": "0".repeat(64)},
            "digests": {"fingerprint": "0".repeat(64), "args": "0".repeat(64)},
        }))
        .unwrap();
        let gate = Client::connect_unix(run.join("gate.sock")).await.unwrap();
        let receipts = Client::connect_unix(run.join("receipts.sock")).await.unwrap();
        let (groot, rroot) = (gate.attach("bench", "").await.unwrap(), receipts.attach("bench", "").await.unwrap());
        let allow: fn(&[u8]) -> bool = |r| r.starts_with(br#"{"decision":"allow""#);
        let acked: fn(&[u8]) -> bool = |r| r.starts_with(br#"{"hash""#) || r.starts_with(br#"{"seq""#);
        for callers in [1usize, 8] {
            let mut dfids = Vec::new();
            let mut afids = Vec::new();
            for _ in 0..callers {
                dfids.push(open(&groot, "decide").await);
                afids.push(open(&rroot, "append").await);
            }
            // Warm up both.
            let (_, _, dfids) = rate(dfids, &decide_body, 200 / callers, allow).await;
            let (_, _, afids) = rate(afids, &append_body, 200 / callers, acked).await;
            let per = n / callers;
            let (append_rate, abad, _) = rate(afids, &append_body, per, acked).await;
            let (decide_rate, dbad, _) = rate(dfids, &decide_body, per, allow).await;
            assert_eq!((abad, dbad), (0, 0), "some appends were not acknowledged or decides not allowed");
            println!(
                "{callers} caller(s), {} rounds: receiptd append {append_rate:.0}/s ({:.1} µs), gate decide {decide_rate:.0}/s ({:.1} µs), decide/append ratio {:.2}",
                per * callers,
                1e6 / append_rate,
                1e6 / decide_rate,
                decide_rate / append_rate
            );
        }
    });
}
