//! echo calls/s through the real `warren-toolfs` over a Unix socket (a handed-over socketpair,
//! as nsd makes them), sequential and with 8 concurrent callers on one connection, side by side
//! in one run with an ungated MCP stdio `tools/call` on @modelcontextprotocol/server-everything.
//!
//! One toolfs call here is what a client really sends: Twalk echo/call, Tlopen, Twrite, Tread
//! (the result), Tread (0 bytes: the end), Tclunk — six round trips.
//!
//! Env: N (calls per measurement, default 3000), MCP_ECHO_RATE (the anchor script, default
//! /work/shared/tools/mcp_echo_rate.py), MCP_SERVER (server-everything's dist/index.js).

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_9p::{Client, Fid, oflags};
use warren_toolfs::{GrantRecord, ToolGrant};

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
    let dir = tempfile::Builder::new()
        .prefix("tfsb")
        .tempdir_in("/tmp")
        .unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_warren-toolfs"))
        .arg("--runtime-dir")
        .arg(&run)
        .args(
            std::env::var("TOOLFS_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let ctl = run.join("toolfs.ctl");
    while UnixStream::connect(&ctl).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
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
    };
    let (ours, theirs) = UnixStream::pair().unwrap();
    warren_toolfs::hand_over(&ctl, &record, theirs.as_fd(), &[]).unwrap();
    drop(theirs);

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
    let _ = daemon.kill();
    let _ = daemon.wait();

    let seq_rate = n as f64 / seq.as_secs_f64();
    let conc_rate = n as f64 / conc.as_secs_f64();
    println!(
        "toolfs echo over a Unix socket, sequential: {seq_rate:.0} calls/s, {:.0} us/call",
        seq.as_secs_f64() / n as f64 * 1e6
    );
    println!(
        "toolfs echo over a Unix socket, 8 concurrent callers on one connection: {conc_rate:.0} calls/s"
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
