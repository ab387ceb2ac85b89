//! echo calls/s through the real `warren-toolfs` over a Unix socket (a handed-over socketpair,
//! as nsd makes them), gated: the real warren-gate decides each call and the real
//! warren-receiptd takes its decision and effect receipts. Sequential and with 8 concurrent
//! callers on one connection, side by side in one run with an ungated MCP stdio `tools/call` on
//! @modelcontextprotocol/server-everything.
//!
//! One toolfs call here is what a client really sends: Twalk echo/call, Tlopen, Twrite, Tread
//! (the result), Tread (0 bytes: the end), Tclunk — six round trips.
//!
//! Env: N (calls per measurement, default 3000), MCP_ECHO_RATE (the anchor,
//! `scripts/mcp-echo-rate`; set it: the default path below lies outside this repository),
//! MCP_SERVER (server-everything's dist/index.js).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Daemon, temp_dir};
use warren_9p::{Client, Fid, oflags};
use warren_toolfs::{GrantRecord, ToolGrant};

/// Mean µs of `n` sequential gate decides (an echo call's) and `n` receiptd effect appends,
/// made directly, each on one long-lived connection as toolfs makes them.
async fn bare_hops(runtime: &std::path::Path, n: usize) -> (f64, f64) {
    let session = "fedcba9876543210fedcba9876543210";
    let gate = warren_proto::gate::GateClient::connect(runtime.join("gate.sock"))
        .await
        .unwrap();
    let t = Instant::now();
    for i in 0..n {
        let args = format!(r#"{{"message":"hello {i}"}}"#);
        let a = gate
            .decide(session, "echo", args.as_bytes(), &[], None)
            .await;
        assert_eq!(
            a.decision,
            warren_proto::gate::Verdict::Allow,
            "{}",
            a.basis
        );
    }
    let decide = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let appender = warren_proto::receipts::Appender::connect(&runtime.join("receipts.sock"))
        .await
        .unwrap();
    let t = Instant::now();
    for i in 0..n {
        let req = format!(
            r#"{{"scope":"{session}","kind":"effect","subject":{{"tool":"echo","n":{i}}},"digests":{{"result":"sha256:00"}}}}"#
        );
        appender.append(req.as_bytes()).await.unwrap();
    }
    (decide, t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Stops toolfs with SIGTERM and returns the per-hop line it logs on the way out.
fn hop_summary(mut daemon: Daemon) -> String {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    for _ in 0..500 {
        if !daemon.is_running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon
        .log()
        .lines()
        .find_map(|l| {
            l.split_once("decide (incl.")
                .map(|(_, rest)| format!("decide (incl.{rest}"))
        })
        .unwrap_or_else(|| "not logged".into())
}

async fn one_call(root: &Fid, i: usize) {
    let fid = root.walk(&["echo", "call"]).await.unwrap();
    fid.open(oflags::RDWR).await.unwrap();
    let args = format!(r#"{{"message":"hello {i}"}}"#);
    fid.write(0, args.as_bytes()).await.unwrap();
    let out = fid.read_to_end(args.len() as u64).await.unwrap();
    assert!(
        out.starts_with(br#"{"content":"{\"message\":\"hello"#),
        "{}",
        String::from_utf8_lossy(&out)
    );
    fid.clunk().await.unwrap();
}

fn main() {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    // The whole path a call takes: toolfs with its gate connection handed over on gate.ctl,
    // the gate deciding (and receipting the decision in receiptd) before echo runs, and
    // toolfs appending the effect receipt after. receiptd's per-scope rate limit is lifted:
    // this measures the path, not the limiter.
    let daemon = Daemon::start_gated_in(
        temp_dir(),
        &["--rate", "1e9", "--burst", "1e9"],
        &std::env::var("TOOLFS_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>(),
    );
    let record = GrantRecord {
        version: 1,
        session: "0123456789abcdef0123456789abcdef".into(),
        namespace: "bench".into(),
        tools: vec![ToolGrant {
            name: "echo".into(),
            roots: vec![],
            network: false,
        }],
        worker_uid: 65534,
        worker_gid: 65534,
        lineage: None,
        server: None,
    };
    let ours = daemon.hand_over(&record, &[]).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (seq, conc) = rt.block_on(async move {
        ours.set_nonblocking(true).unwrap();
        let client = Client::new(tokio::net::UnixStream::from_std(ours).unwrap(), 1 << 20)
            .await
            .unwrap();
        let root = Arc::new(client.attach("bench", "").await.unwrap());
        for i in 0..200 {
            one_call(&root, i).await;
        }
        let t = Instant::now();
        for i in 0..n {
            one_call(&root, i).await;
        }
        let seq = t.elapsed();
        let t = Instant::now();
        let callers: Vec<_> = (0..8)
            .map(|c| {
                let root = root.clone();
                tokio::spawn(async move {
                    for i in (c..n).step_by(8) {
                        one_call(&root, i).await;
                    }
                })
            })
            .collect();
        for c in callers {
            c.await.unwrap();
        }
        (seq, t.elapsed())
    });
    let runtime = daemon.stack().runtime.clone();
    let (decide_us, append_us) = rt.block_on(bare_hops(&runtime, n / 3));
    let hops = hop_summary(daemon);

    let seq_rate = n as f64 / seq.as_secs_f64();
    let conc_rate = n as f64 / conc.as_secs_f64();
    println!(
        "toolfs echo over a Unix socket, sequential: {seq_rate:.0} calls/s, {:.0} us/call",
        seq.as_secs_f64() / n as f64 * 1e6
    );
    println!(
        "toolfs echo over a Unix socket, 8 concurrent callers on one connection: {conc_rate:.0} calls/s"
    );
    println!("per hop inside toolfs (mean over every call of the run, warm-up included): {hops}");
    println!(
        "the two receipted hops alone, sequential from this process: gate decide {decide_us:.0} us, receiptd effect append {append_us:.0} us"
    );

    let script = std::env::var("MCP_ECHO_RATE")
        .unwrap_or_else(|_| "/work/shared/tools/mcp_echo_rate.py".into());
    let server = std::env::var("MCP_SERVER").map(PathBuf::from).unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/peers/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    });
    if !server.exists() || !std::path::Path::new(&script).exists() {
        println!(
            "MCP anchor not run: {} or {script} is missing (scripts/install-test-deps installs the server)",
            server.display()
        );
        return;
    }
    let out = Command::new("python3")
        .arg(&script)
        .arg("node")
        .arg(&server)
        .arg("stdio")
        .env("N", n.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    let mcp_rate: Option<f64> = text
        .split("stdio: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok());
    match mcp_rate {
        Some(mcp) => println!(
            "ratio toolfs/MCP: sequential {:.2}x, 8 concurrent {:.2}x",
            seq_rate / mcp,
            conc_rate / mcp
        ),
        None => println!(
            "could not read the MCP rate: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
