//! What the encrypted link costs a 9P client: getattr/s on warren-9p's demo tree and, against a
//! running warren, echo calls/s on `/tool`, each locally (a Unix socket) and across an
//! exportfs link on loopback TCP (Noise XX, ChaCha20-Poly1305). `scripts/bench-exportfs` runs it.
//!
//! Usage: bench_link N [RUNTIME_DIR SECRETS_DIR PEERS_FILE tcp!HOST!PORT PEER]
//! With the warren arguments it also measures echo: locally on `<runtime>/tool.sock`, and across
//! the link to the `warren export` at tcp!HOST!PORT, dialled with the host key in SECRETS_DIR
//! and checked against PEER's entry in PEERS_FILE.

use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use warren_9p::demo::DemoTree;
use warren_9p::{Client, Limits, oflags};
use warren_exportfs::keys::{HostKey, host_key_path};
use warren_exportfs::peers::{Peer, Peers, parse_addr};
use warren_exportfs::server::{self, Backend};
use warren_exportfs::wire;

/// Serves the demo tree on each connection.
struct Demo(tokio::runtime::Handle);

impl Backend for Demo {
    fn connect(&self, _peer: &Peer, _tree: &str) -> Result<UnixStream, String> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
        let handle = self.0.clone();
        handle.spawn(async move {
            let _ = warren_9p::serve_fd(Arc::new(DemoTree), theirs.into(), Limits::default()).await;
        });
        Ok(ours)
    }
}

async fn client_on(stream: UnixStream) -> Client {
    stream.set_nonblocking(true).unwrap();
    let stream = tokio::net::UnixStream::from_std(stream).unwrap();
    Client::new(stream, 1 << 20).await.unwrap()
}

/// The link's 9P end: dialled, relayed on a thread, handed back as a Unix socket.
fn linked(addr: &str, key: &HostKey, peer: &Peer, tree: &str) -> UnixStream {
    let (host, port) = parse_addr(addr).unwrap();
    let tcp = TcpStream::connect((host.as_str(), port)).unwrap();
    let link = wire::dial(tcp, key, peer, tree).unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    std::thread::spawn(move || link.relay(theirs));
    ours
}

async fn getattrs(client: &Client, n: usize) -> f64 {
    let root = client.attach("bench", "").await.unwrap();
    let null = root.walk(&["null"]).await.unwrap();
    let start = Instant::now();
    for _ in 0..n {
        null.getattr().await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn echoes(client: &Client, n: usize) -> f64 {
    let root = client.attach("bench", "").await.unwrap();
    let start = Instant::now();
    for i in 0..n {
        let call = root.walk(&["echo", "call"]).await.unwrap();
        call.open(oflags::RDWR).await.unwrap();
        let reply = call
            .call(format!("{{\"i\":{i}}}").as_bytes())
            .await
            .unwrap();
        assert!(
            reply.starts_with(b"{"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
        call.clunk().await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn row(what: &str, local: f64, remote: f64) {
    println!(
        "{what:<34} {local:>10.0} {remote:>10.0} {:>8.2}",
        remote / local
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2000);
    println!(
        "{:<34} {:>10} {:>10} {:>8}",
        "per second (serial)", "local", "link", "ratio"
    );

    // getattr on the demo tree: local socketpair vs a loopback link to an in-process server.
    let dir = tempfile::tempdir().unwrap();
    let (server_key, client_key) = (dir.path().join("s.key"), dir.path().join("c.key"));
    let (s, c) = (
        HostKey::create(&server_key).unwrap(),
        HostKey::create(&client_key).unwrap(),
    );
    let peers = dir.path().join("peers");
    std::fs::write(
        &peers,
        format!("c {} tool:x\ns {}\n", c.public(), s.public()),
    )
    .unwrap();
    let listener = server::listen("tcp!127.0.0.1!0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = server::Config {
        key: s,
        peers: peers.clone(),
        auth_deadline: std::time::Duration::from_secs(10),
        recheck: server::RECHECK,
        backend: Arc::new(Demo(tokio::runtime::Handle::current())),
    };
    std::thread::spawn(move || server::serve(listener, config));
    let (local, theirs) = UnixStream::pair().unwrap();
    tokio::spawn(async move {
        let _ = warren_9p::serve_fd(Arc::new(DemoTree), theirs.into(), Limits::default()).await;
    });
    let local = getattrs(&client_on(local).await, n).await;
    let server_peer = Peers::load(&peers).unwrap().by_name("s").unwrap().clone();
    let remote = tokio::task::spawn_blocking(move || {
        linked(&format!("tcp!127.0.0.1!{port}"), &c, &server_peer, "tool")
    })
    .await
    .unwrap();
    let remote = getattrs(&client_on(remote).await, n).await;
    row("9P getattr (demo tree)", local, remote);

    // echo through toolfs, the gate and receiptd: the operator socket vs a peer's link.
    if let [_, runtime, secrets, peers, addr, peer] = &args[..] {
        let local = Client::connect_unix(Path::new(runtime).join("tool.sock"))
            .await
            .unwrap();
        let local = echoes(&local, n).await;
        let key = HostKey::load(&host_key_path(Path::new(secrets))).unwrap();
        let peer = Peers::load(Path::new(peers))
            .unwrap()
            .by_name(peer)
            .unwrap()
            .clone();
        let addr = addr.clone();
        let stream = tokio::task::spawn_blocking(move || linked(&addr, &key, &peer, "tool"))
            .await
            .unwrap();
        let remote = echoes(&client_on(stream).await, n).await;
        row("echo call (gated, receipted)", local, remote);
    }
}
