//! Receipt append throughput against its two floors, side by side in one run:
//!
//! - raw Ed25519 signatures per second (ed25519-dalek, the same PAE-sized message);
//! - raw SQLite WAL inserts per second (one insert per transaction, synchronous=NORMAL, the same
//!   row shape);
//! - receiptd appends per second over 9P on its socket (signed `cap` receipts), with 1 and 16
//!   writers, in the default (`wal`) and `fsync` durability modes; and the library's in-process
//!   append (no 9P) for reference.
//!
//! Run: `cargo bench -p warren-receiptd --bench receipts`. Prints a table and the ratios.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use ed25519_dalek::{Signer, SigningKey};
use serde_json::json;
use warren_proto::receipts::Appender;
use warren_receiptd::{AppendRequest, Log, LogConfig, Role};

const SIGNS: usize = 20_000;
const INSERTS: usize = 20_000;
const APPENDS: usize = 4_000;
const ROUNDS: usize = 3;

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

fn request_json(scope: &str, i: usize) -> Vec<u8> {
    json!({"scope": scope, "kind": "cap", "subject": {"tool": "echo", "call": i},
           "digests": {"args": format!("sha256:{i:064x}")}, "policy_hash": "sha256:00ff"})
    .to_string()
    .into_bytes()
}

fn raw_sign() -> f64 {
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let msg = vec![b'x'; 420];
    let start = Instant::now();
    for i in 0..SIGNS {
        let mut m = msg.clone();
        m[0] = i as u8;
        std::hint::black_box(key.sign(&m));
    }
    rate(SIGNS, start.elapsed())
}

fn raw_sqlite(dir: &Path) -> f64 {
    let conn = rusqlite::Connection::open(dir.join("raw.db")).unwrap();
    conn.pragma_update(None, "page_size", warren_receiptd::store::PAGE_SIZE)
        .unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.execute_batch("CREATE TABLE entries (scope TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
        envelope BLOB NOT NULL, leaf_hash BLOB NOT NULL, PRIMARY KEY (scope, seq)) STRICT, WITHOUT ROWID;").unwrap();
    // A decision receipt's envelope is ~1 240 bytes.
    let envelope = vec![b'e'; 1240];
    let start = Instant::now();
    for i in 0..INSERTS {
        let tx = conn.unchecked_transaction().unwrap();
        tx.prepare_cached("INSERT INTO entries VALUES (?1, ?2, 'cap', ?3, ?4)")
            .unwrap()
            .execute(rusqlite::params![
                "s",
                i as i64,
                envelope,
                [0u8; 32].as_slice()
            ])
            .unwrap();
        tx.commit().unwrap();
    }
    rate(INSERTS, start.elapsed())
}

fn library_append(dir: &Path) -> f64 {
    let mut cfg = LogConfig::new(&dir.join("lib-data"), &dir.join("lib-secrets"));
    cfg.min_free_bytes = 0;
    cfg.rate_per_sec = 1e12;
    cfg.rate_burst = 1e12;
    let mut log = Log::open(cfg).unwrap();
    let start = Instant::now();
    for i in 0..APPENDS {
        let req = AppendRequest::parse(&request_json("s", i)).unwrap();
        log.append(req, Role::Toolfs).unwrap();
    }
    let r = rate(APPENDS, start.elapsed());
    log.shutdown();
    r
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

fn daemon_appends(dir: &Path, mode: &str, writers: usize) -> f64 {
    let base = dir.join(format!("{mode}-{writers}"));
    std::fs::create_dir_all(base.join("run")).unwrap();
    let socket = base.join("run/receipts.sock");
    let child = warren_test_support::daemons::receiptd(
        &base.join("run"),
        &base.join("data"),
        &base.join("secrets"),
    )
    .args([
        "--min-free-mb",
        "0",
        "--rate",
        "1e12",
        "--burst",
        "1e12",
        "--durable",
        mode,
    ])
    .env("WARREN_LOG", "warn")
    .spawn()
    .unwrap();
    let _daemon = Daemon(child);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut appenders = Vec::new();
        for _ in 0..writers {
            appenders.push(Appender::connect(&socket).await.unwrap());
        }
        let per = APPENDS / writers;
        let start = Instant::now();
        let tasks: Vec<_> = appenders
            .into_iter()
            .enumerate()
            .map(|(w, a)| {
                tokio::spawn(async move {
                    let scope = format!("w{w}");
                    for i in 0..per {
                        a.append(&request_json(&scope, i)).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        rate(per * writers, start.elapsed())
    })
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too: keep that quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("receipts bench: run with `cargo bench -p warren-receiptd --bench receipts`");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("rbench")
        .tempdir_in("/tmp")
        .unwrap();
    // Each row is the best of ROUNDS, the rows interleaved within a round, so a burst of load from
    // other work on the machine skews no one row.
    let mut rows: Vec<(String, f64)> = Vec::new();
    for round in 0..ROUNDS {
        let sub = dir.path().join(format!("r{round}"));
        std::fs::create_dir_all(&sub).unwrap();
        let mut these = vec![
            ("raw Ed25519 sign".to_owned(), raw_sign()),
            (
                "raw SQLite WAL insert (1 txn each)".to_owned(),
                raw_sqlite(&sub),
            ),
            ("library append (no 9P)".to_owned(), library_append(&sub)),
        ];
        for mode in ["wal", "fsync"] {
            for writers in [1, 16] {
                let name = format!("receiptd append, --durable={mode}, {writers} writer(s)");
                these.push((name, daemon_appends(&sub, mode, writers)));
            }
        }
        if rows.is_empty() {
            rows = these;
        } else {
            for (row, (_, r)) in rows.iter_mut().zip(these) {
                row.1 = row.1.max(r);
            }
        }
    }
    let (sign, sqlite) = (rows[0].1, rows[1].1);
    println!("best of {ROUNDS} rounds");
    println!(
        "{:<48} {:>12} {:>10} {:>10}",
        "", "per second", "/ sign", "/ sqlite"
    );
    for (name, r) in &rows {
        println!(
            "{name:<48} {r:>12.0} {:>10.3} {:>10.3}",
            r / sign,
            r / sqlite
        );
    }
}
