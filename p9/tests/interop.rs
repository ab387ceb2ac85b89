//! Third-party 9P2000.L peers against our server, and our client against a real diod. The peers
//! (diod's tools, Python p9fs in the repository's .venv) are installed by scripts/install-test-deps;
//! a test whose peer is missing fails, naming it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use tokio::process::Command;
use warren_9p::demo::{DemoTree, HELLO};
use warren_9p::{Client, Limits, oflags};

/// A peer's path: missing is a failure (scripts/install-test-deps installs every peer).
fn find_peer(name: &str, candidates: &[&str]) -> PathBuf {
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "peer `{name}` not installed (looked in {candidates:?}); scripts/install-test-deps installs it"
            )
        })
}

/// Serves the demo tree on a fresh Unix socket, one `serve` per connection.
fn serve_demo(dir: &Path) -> PathBuf {
    let path = dir.join("9p.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let tree = Arc::new(DemoTree);
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(warren_9p::serve(tree.clone(), s, Limits::default()));
        }
    });
    path
}

/// Runs a peer to completion; it must succeed. Returns its stdout.
async fn run(cmd: &mut Command) -> String {
    run_both(cmd).await.0
}

/// Runs a peer to completion; it must succeed. Returns its stdout and stderr.
async fn run_both(cmd: &mut Command) -> (String, String) {
    let out = tokio::time::timeout(common::HANG, cmd.stdin(Stdio::null()).output())
        .await
        .expect("peer hung")
        .expect("peer runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    (stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diodls_and_diodcat_read_our_server() {
    let (diodls, diodcat) = (
        find_peer("diodls", &["/usr/sbin/diodls", "/usr/bin/diodls"]),
        find_peer("diodcat", &["/usr/sbin/diodcat", "/usr/bin/diodcat"]),
    );
    let dir = common::short_tmp();
    let sock = serve_demo(dir.path());
    let listing = run(Command::new(&diodls)
        .arg("-s")
        .arg(&sock)
        .args(["-a", "/", "-l"]))
    .await;
    for name in ["hello", "zero", "null"] {
        assert!(
            listing.lines().any(|l| l.ends_with(name)),
            "diodls lists {name}: {listing}"
        );
    }
    let cat = run(Command::new(&diodcat)
        .arg("-s")
        .arg(&sock)
        .args(["-a", "/", "hello"]))
    .await;
    assert_eq!(cat.as_bytes(), HELLO);
}

const P9FS_SCRIPT: &str = r#"
import json, socket, sys
import p9fs
from py9p import py9p

class UnixP9FileSystem(p9fs.P9FileSystem):
    """p9fs speaks TCP only; the same client over AF_UNIX."""
    def _connect(self):
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.host)
        self.client = py9p.Client(s, credentials=py9p.Credentials(user=self.username, passwd=self.password),
                                  ver=self.version, chatty=self.verbose, aname=self.aname)

fs = UnixP9FileSystem(sys.argv[1], 0, 'root', skip_instance_cache=True)
names = sorted(p.rsplit('/', 1)[-1] for p in fs.ls('', detail=False))
print(json.dumps({"names": names, "hello": fs.cat('hello').decode(), "size": fs.info('hello')['size']}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_p9fs_lists_and_reads_our_server() {
    let python = find_peer(
        "p9fs (venv python)",
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python")],
    );
    let dir = common::short_tmp();
    let sock = serve_demo(dir.path());
    let out = run(Command::new(&python).arg("-c").arg(P9FS_SCRIPT).arg(&sock)).await;
    let hello = String::from_utf8_lossy(HELLO);
    let expected = format!(
        "{{\"names\": [\"hello\", \"null\", \"zero\"], \"hello\": {}, \"size\": {}}}",
        serde_json_string(&hello),
        HELLO.len()
    );
    assert_eq!(out.trim(), expected);
}

/// JSON string literal as Python's json.dumps writes it (our greeting is plain ASCII + \n).
fn serde_json_string(s: &str) -> String {
    format!(
        "\"{}\"",
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_reads_a_file_served_by_diod() {
    let diod = find_peer("diod", &["/usr/sbin/diod", "/usr/bin/diod"]);
    let dir = common::short_tmp();
    let export = dir.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::create_dir(export.join("sub")).unwrap();
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(export.join("sub/data"), &body).unwrap();

    // diod serves an already-connected socket on its stdin/stdout (-r 0 -w 1): no port needed.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let theirs_out = theirs.try_clone().unwrap();
    let mut child = Command::new(&diod)
        .args(["-f", "-n", "-N", "-r", "0", "-w", "1", "-L", "stderr", "-e"])
        .arg(&export)
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs_out)))
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("diod starts");
    ours.set_nonblocking(true).unwrap();
    let stream = tokio::net::UnixStream::from_std(ours).unwrap();
    let client = Client::new(stream, 65536)
        .await
        .expect("diod negotiates 9P2000.L");
    assert!(client.msize() <= 65536);
    let root = client
        .attach("root", export.to_str().unwrap())
        .await
        .expect("attach the export");
    let file = root.walk_path("sub/data").await.unwrap();
    let (_, stat) = file.getattr().await.unwrap();
    assert_eq!(stat.size, body.len() as u64);
    file.open(oflags::RDONLY).await.unwrap();
    assert_eq!(file.read_to_end(0).await.unwrap(), body);
    let sub = root.walk(&["sub"]).await.unwrap();
    sub.open(oflags::RDONLY).await.unwrap();
    let names: Vec<String> = sub.read_dir_names().await.unwrap();
    assert!(names.contains(&"data".to_string()), "{names:?}");
    drop((file, sub, root, client));
    // With every Client clone gone the connection closes and diod exits.
    let status = tokio::time::timeout(common::HANG, child.wait())
        .await
        .expect("diod exits at EOF")
        .unwrap();
    assert!(status.success(), "diod exit: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diodload_runs_against_our_server() {
    let diodload = find_peer("diodload", &["/usr/sbin/diodload", "/usr/bin/diodload"]);
    let dir = common::short_tmp();
    let sock = serve_demo(dir.path());
    // diodload attaches aname `ctl`, copies zero to null (or getattrs null with -g) on 2
    // connections for a second; any error makes it exit non-zero.
    for extra in [&[][..], &["-g"][..]] {
        let (stdout, stderr) = run_both(
            Command::new(&diodload)
                .arg("-s")
                .arg(&sock)
                .args(["-n", "2", "-r", "1"])
                .args(extra),
        )
        .await;
        let out = stdout + &stderr;
        // "diodload: N ops/s, ..." or "diodload: N getattrs/s"
        let ops: f64 = out
            .split_whitespace()
            .skip_while(|w| *w != "diodload:")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("diodload output: {out}"));
        assert!(ops > 0.0, "diodload {extra:?} made progress: {out}");
    }
}
