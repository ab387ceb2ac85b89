//! Test fixtures: a plain HTTP server on 127.0.0.1 that counts every byte it reads and writes
//! per connection, the proxy daemon as a real process, and curl.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use warren_test_support::daemons::Process;

/// Bytes one connection of the test server read and wrote, all of them (it reads to EOF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Exchange {
    pub received: u64,
    pub sent: u64,
}

/// `GET /hello` → `hello from the test server\n`; `GET /bytes/N` → N bytes; any request body
/// (Content-Length) is read and counted.
pub struct HttpServer {
    pub addr: SocketAddr,
    pub exchanges: Arc<Mutex<Vec<Exchange>>>,
}

pub const HELLO: &str = "hello from the test server\n";

impl HttpServer {
    pub fn start() -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let exchanges = Arc::new(Mutex::new(Vec::new()));
        let log = exchanges.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let log = log.clone();
                std::thread::spawn(move || {
                    if let Some(x) = serve_one(conn) {
                        log.lock().unwrap().push(x);
                    }
                });
            }
        });
        HttpServer { addr, exchanges }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The exchanges finished so far.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.exchanges.lock().unwrap().clone()
    }

    /// The first `n` exchanges, waiting for them: one is logged when its connection has
    /// closed, which may be just after the client has its answer.
    pub fn wait_exchanges(&self, n: usize) -> Vec<Exchange> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen = self.exchanges();
            if seen.len() >= n {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "{} exchanges, waited for {n}",
                seen.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn serve_one(mut conn: TcpStream) -> Option<Exchange> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return Some(Exchange {
                received: head.len() as u64,
                sent: 0,
            });
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let length: usize = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).ok()?;
    let content: Vec<u8> = if path == "/hello" {
        HELLO.as_bytes().to_vec()
    } else if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        (0..n).map(|i| (i % 251) as u8).collect()
    } else if path == "/echo-length" {
        format!("{length}\n").into_bytes()
    } else {
        b"not found\n".to_vec()
    };
    let mut response = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        content.len()
    )
    .into_bytes();
    response.extend_from_slice(&content);
    conn.write_all(&response).ok()?;
    let _ = conn.shutdown(Shutdown::Write);
    // Everything the client sends after is counted too: the proxy's count is of all of it.
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    Some(Exchange {
        received: (head.len() + length + rest.len()) as u64,
        sent: response.len() as u64,
    })
}

/// The daemon, killed when dropped.
pub struct Proxy {
    child: Process,
    pub addr: SocketAddr,
    pub records: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// A proxy whose hosts file maps `api.test`, `rebind.test` and `other.test` to 127.0.0.1,
    /// allowing `allow`.
    pub fn start(allow: &[String]) -> Proxy {
        Proxy::start_with(allow, |_| Vec::new())
    }

    /// As [`Proxy::start`], with more arguments made from the proxy's temporary directory
    /// (after the TCP listener, whose address is the first line printed).
    pub fn start_with(
        allow: &[String],
        extra: impl FnOnce(&std::path::Path) -> Vec<String>,
    ) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(
            &hosts,
            "127.0.0.1 api.test rebind.test other.test\n::1 v6.test\n",
        )
        .unwrap();
        let records = dir.path().join("records.jsonl");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warren-netproxy"));
        cmd.arg("--listen")
            .arg("tcp:127.0.0.1:0")
            .arg("--hosts")
            .arg(&hosts)
            .arg("--records")
            .arg(&records)
            .arg("--session")
            .arg("test-session");
        for a in allow {
            cmd.arg("--allow").arg(a);
        }
        cmd.args(extra(dir.path()));
        cmd.stderr(Stdio::inherit());
        let (child, line) = Process::start_saying(cmd);
        let addr = line
            .trim()
            .strip_prefix("listening tcp:")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Proxy {
            child,
            addr,
            records,
            _dir: dir,
        }
    }

    /// The first `n` records, waiting for them to be written (each is written when its
    /// connection ends, which may be just after the client has its answer).
    pub fn records(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&self.records).unwrap_or_default();
            let lines: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{} records, waited for {n}: {text}",
                lines.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }
}

/// Runs curl with `args` (no proxy settings from the environment), returning its output.
pub fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["-sS", "--max-time", "30"])
        .args(args)
        .output()
        .expect("curl runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A raw SOCKS5 conversation: no-auth greeting, then one request; returns the reply code.
pub fn socks5_request(proxy: SocketAddr, cmd: u8, addr: &[u8], port: u16) -> u8 {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).unwrap();
    assert_eq!(choice, [5, 0]);
    let mut req = vec![5, cmd, 0];
    req.extend_from_slice(addr);
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[0], 5);
    reply[1]
}

/// A SOCKS5 domain address (`ATYP 3`).
pub fn socks_domain(name: &str) -> Vec<u8> {
    let mut v = vec![3, name.len() as u8];
    v.extend_from_slice(name.as_bytes());
    v
}
