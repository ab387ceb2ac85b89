//! The daemon over real 9P on its real socket: tree, uid rule, crash safety, durability, floor.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};
use warren_9p::{Client, Errno, oflags};
use warren_proto::receipts::Appender;
use warren_receiptd::verify::EXIT_VERIFIED;
use warren_receiptd::{keys::Registry, verify};

async fn read_file(client: &Client, path: &str) -> warren_9p::Result<Vec<u8>> {
    let root = client.attach("op", "").await?;
    let fid = root.walk_path(path).await?;
    fid.open(oflags::RDONLY).await?;
    fid.read_to_end(0).await
}

async fn write_file(client: &Client, path: &str, data: &[u8]) -> warren_9p::Result<Vec<u8>> {
    let root = client.attach("op", "").await?;
    let fid = root.walk_path(path).await?;
    fid.open(oflags::RDWR).await?;
    fid.write(0, data).await?;
    fid.read(0, 4096).await
}

fn verify_all(base: &std::path::Path) -> u64 {
    let conn = rusqlite_scopes(base);
    let registry = registry(base);
    let mut total = 0;
    for scope in conn {
        let out = verify(&export(base, &scope), &registry);
        assert_eq!(out.code, EXIT_VERIFIED, "{scope}: {}", out.message);
        if scope != "receiptd" {
            total += out.entries;
        }
    }
    total
}

fn rusqlite_scopes(base: &std::path::Path) -> Vec<String> {
    let conn = warren_receiptd::store::open_ro(&db(base)).unwrap();
    warren_receiptd::store::scopes(&conn).unwrap()
}

#[test]
fn the_tree_serves_log_head_proofs_keys_and_ctl() {
    let dir = tmp();
    let d = Daemon::start(dir.path(), &[]);
    rt().block_on(async {
        let appender = Appender::connect(&d.socket).await.unwrap();
        let mut hashes = Vec::new();
        for i in 0..12 {
            let r = appender
                .append(&body("s1", if i % 2 == 0 { "query" } else { "cap" }, i))
                .await
                .unwrap();
            assert_eq!(r.seq, i);
            hashes.push(r.hash);
        }
        // Refusals carry the errno and receiptd's reason.
        let refusal = appender
            .append(&body("s1", "decision", 0))
            .await
            .unwrap_err();
        assert_eq!(refusal.errno, Errno::EACCES);
        assert!(
            refusal.message.contains("gate's uid"),
            "{}",
            refusal.message
        );
        let refusal = appender
            .append(br#"{"scope":"s1","kind":"query","subject":{"a":1,"a":2}}"#)
            .await
            .unwrap_err();
        assert_eq!(refusal.errno, Errno::EINVAL);
        assert!(
            refusal.message.contains("duplicate key"),
            "{}",
            refusal.message
        );

        let client = Client::connect_unix(&d.socket).await.unwrap();
        let log = read_file(&client, "s1/log").await.unwrap();
        let lines: Vec<&[u8]> = log
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), 12);
        for (line, hash) in lines.iter().zip(&hashes) {
            assert_eq!(hex::encode(Sha256::digest(line)), *hash);
        }
        assert_eq!(
            write_file(&client, "ctl", b"checkpoint").await.unwrap(),
            b"{\"ok\":true}"
        );
        let head = String::from_utf8(read_file(&client, "s1/head").await.unwrap()).unwrap();
        assert!(head.lines().nth(1) == Some("12"), "{head}");
        let inc: Value =
            serde_json::from_slice(&read_file(&client, "s1/proof/inclusion/7").await.unwrap())
                .unwrap();
        assert_eq!(inc["tree_size"], 12);
        let con: Value = serde_json::from_slice(
            &read_file(&client, "s1/proof/consistency/3-12")
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(con["old_size"], 3);
        assert_eq!(
            read_file(&client, "s1/proof/inclusion/12")
                .await
                .unwrap_err(),
            Errno::ENOENT
        );
        assert_eq!(
            read_file(&client, "nosuch/log").await.unwrap_err(),
            Errno::ENOENT
        );

        // Rotation through ctl: the registry gains a row and retires the old one.
        let before = Registry::parse(&read_file(&client, "keys").await.unwrap()).unwrap();
        let rotated: Value =
            serde_json::from_slice(&write_file(&client, "ctl", b"rotate").await.unwrap()).unwrap();
        let after = Registry::parse(&read_file(&client, "keys").await.unwrap()).unwrap();
        assert_eq!(after.keys.len(), before.keys.len() + 1);
        let old = after.find(&before.keys[0].keyid).unwrap();
        assert_eq!(old.superseded_by.as_deref(), rotated["key"].as_str());
        appender.append(&body("s1", "cap", 99)).await.unwrap();
    });
    d.stop();
    assert_eq!(verify_all(dir.path()), 13);
}

#[test]
fn offline_rotation_is_refused_while_the_daemon_runs() {
    let dir = tmp();
    let d = Daemon::start(dir.path(), &[]);
    let out = daemon_cmd(dir.path(), &["--rotate-key"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another receiptd owns this database"), "{err}");
    d.stop();
    let out = daemon_cmd(dir.path(), &["--rotate-key"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reg = Registry::parse(&registry(dir.path())).unwrap();
    assert_eq!(reg.keys.len(), 2);
    assert_eq!(
        reg.keys.iter().filter(|k| k.valid_until.is_none()).count(),
        1
    );
}

#[test]
fn no_key_means_every_append_is_refused() {
    let dir = tmp();
    let d = Daemon::start(dir.path(), &["--no-generate-key"]);
    rt().block_on(async {
        let appender = Appender::connect(&d.socket).await.unwrap();
        for kind in ["query", "cap"] {
            let refusal = appender.append(&body("s", kind, 0)).await.unwrap_err();
            assert_eq!(refusal.errno, Errno(libc::EKEYREJECTED as u32));
            assert!(
                refusal.message.contains("no usable signer")
                    && refusal.message.contains("--init-key"),
                "{}",
                refusal.message
            );
        }
    });
}

/// Runs `warren-receipt-append` as `uid` (gid 0, so the 0660 root socket admits it).
fn append_as(uid: u32, socket: &std::path::Path, request: &[u8]) -> (i32, String) {
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warren-receipt-append"))
        .arg(socket)
        .arg(String::from_utf8_lossy(request).as_ref())
        .uid(uid)
        .gid(0)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn decision_only_from_the_gate_uid_and_effect_only_from_toolfs_uid() {
    const GATE: u32 = 61903;
    const TOOLFS: u32 = 61901;
    const NETPROXY: u32 = 61906;
    assert!(
        nix::unistd::geteuid().is_root(),
        "the uid rule test spawns clients under other uids and needs root (scripts/test runs as root)"
    );
    let dir = tmp();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(dir.path().join("run")).unwrap();
    std::fs::set_permissions(
        dir.path().join("run"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let d = Daemon::start(
        dir.path(),
        &[
            "--gate-uid",
            &GATE.to_string(),
            "--toolfs-uid",
            &TOOLFS.to_string(),
            "--netproxy-uid",
            &NETPROXY.to_string(),
        ],
    );
    let s = &d.socket;
    // The gate's uid: decision yes, effect no.
    let (code, out) = append_as(GATE, s, &body("sess", "decision", 1));
    assert_eq!(code, 0, "{out}");
    let (code, out) = append_as(GATE, s, &body("sess", "effect", 2));
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("toolfs's, mcpfs's or netproxy's uid")
            && out.contains("this connection is gate"),
        "{out}"
    );
    // toolfs's uid: effect yes, decision no.
    let (code, out) = append_as(TOOLFS, s, &body("sess", "effect", 3));
    assert_eq!(code, 0, "{out}");
    let (code, out) = append_as(TOOLFS, s, &body("sess", "decision", 4));
    assert_eq!(code, 3, "{out}");
    // netproxy's uid: effect (a proxied connection's record) yes, decision no.
    let (code, out) = append_as(NETPROXY, s, &body("sess", "effect", 5));
    assert_eq!(code, 0, "{out}");
    let (code, out) = append_as(NETPROXY, s, &body("sess", "decision", 6));
    assert_eq!(code, 3, "{out}");
    // The operator (root, this process) reads but never appends either.
    rt().block_on(async {
        let appender = Appender::connect(s).await.unwrap();
        for kind in ["decision", "effect"] {
            assert_eq!(
                appender
                    .append(&body("sess", kind, 5))
                    .await
                    .unwrap_err()
                    .errno,
                Errno::EACCES
            );
        }
        let client = Client::connect_unix(s).await.unwrap();
        let log = read_file(&client, "sess/log").await.unwrap();
        let appenders: Vec<String> = log
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let env: Value = serde_json::from_slice(l).unwrap();
                let payload = base64_decode(env["payload"].as_str().unwrap());
                let body: Value = serde_json::from_slice(&payload).unwrap();
                format!(
                    "{}:{}",
                    body["kind"].as_str().unwrap(),
                    body["appender"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            appenders,
            ["decision:gate", "effect:toolfs", "effect:netproxy"]
        );
    });
    // Another uid that is neither daemon nor operator is not served at all.
    let (code, out) = append_as(61999, s, &body("sess", "query", 7));
    assert_ne!(code, 0, "{out}");
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[test]
fn kill_9_during_ten_thousand_appends_from_eight_writers_loses_no_acknowledged_receipt() {
    const WRITERS: usize = 8;
    const PER_WRITER: usize = 1250;
    let dir = tmp();
    let base = dir.path().to_owned();
    let mut d = Daemon::start(&base, &[]);
    let socket = d.socket.clone();
    let acked: Arc<Mutex<Vec<(String, u64, String)>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (socket, acked, count) = (socket.clone(), Arc::clone(&acked), Arc::clone(&count));
            std::thread::spawn(move || {
                rt().block_on(async move {
                    let scope = format!("w{}", w % 4);
                    let mut done = 0;
                    let mut appender: Option<Appender> = None;
                    let mut reconnects = 0;
                    while done < PER_WRITER {
                        let Some(a) = &appender else {
                            match Appender::connect(&socket).await {
                                Ok(a) => appender = Some(a),
                                Err(_) => {
                                    reconnects += 1;
                                    assert!(reconnects < 5000, "writer {w} cannot reconnect");
                                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                                }
                            }
                            continue;
                        };
                        let kind = if done % 3 == 0 { "cap" } else { "query" };
                        match a
                            .append(&body(&scope, kind, (w * PER_WRITER + done) as u64))
                            .await
                        {
                            Ok(r) => {
                                acked.lock().unwrap().push((scope.clone(), r.seq, r.hash));
                                count.fetch_add(1, Ordering::SeqCst);
                                done += 1;
                            }
                            // The daemon died under us: reconnect to its successor.
                            Err(_) => appender = None,
                        }
                    }
                })
            })
        })
        .collect();
    while count.load(Ordering::SeqCst) < WRITERS * PER_WRITER / 2 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    d.kill9();
    let at_kill = count.load(Ordering::SeqCst);
    assert!(
        at_kill < WRITERS * PER_WRITER,
        "the kill came after the last append"
    );
    let d = Daemon::start(&base, &[]);
    for t in threads {
        t.join().unwrap();
    }
    d.stop();

    let acked = acked.lock().unwrap();
    assert_eq!(acked.len(), WRITERS * PER_WRITER);
    let conn = warren_receiptd::store::open_ro(&db(&base)).unwrap();
    let mut by_scope: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
    for scope in warren_receiptd::store::scopes(&conn).unwrap() {
        let envs = warren_receiptd::store::envelopes(&conn, &scope, 0, i64::MAX as u64).unwrap();
        by_scope.insert(scope, envs);
    }
    for (scope, seq, hash) in acked.iter() {
        let env = by_scope[scope]
            .get(*seq as usize)
            .unwrap_or_else(|| panic!("{scope}/{seq} acknowledged but missing"));
        assert_eq!(
            hex::encode(Sha256::digest(env)),
            *hash,
            "{scope}/{seq} differs from what was acknowledged"
        );
    }
    let total = verify_all(&base);
    assert!(total >= (WRITERS * PER_WRITER) as u64, "{total}");
}

/// An export right after the appends covers them all: it requests the checkpoint it needs (the
/// periodic one is an hour away here), and it takes a unique prefix of the scope, as `warren
/// log` prints it; an ambiguous or unknown prefix is refused, saying why.
#[test]
fn an_export_through_the_tree_checkpoints_now_takes_a_unique_prefix_and_verifies() {
    let dir = tmp();
    let d = Daemon::start(dir.path(), &["--checkpoint-ms", "3600000"]);
    let (export, keys) = rt().block_on(async {
        let appender = Appender::connect(&d.socket).await.unwrap();
        for i in 0..7 {
            appender
                .append(&body("s0a1", if i % 2 == 0 { "query" } else { "cap" }, i))
                .await
                .unwrap();
        }
        let client = Client::connect_unix(&d.socket).await.unwrap();
        write_file(&client, "ctl", b"checkpoint").await.unwrap();
        appender.append(&body("s0a1", "query", 7)).await.unwrap();
        appender.append(&body("s0b2", "cap", 0)).await.unwrap();
        let mut out = Vec::new();
        let (scope, n) = warren_receiptd::client::export(&d.socket, "s0a", &mut out)
            .await
            .unwrap();
        assert_eq!(
            (scope.as_str(), n),
            ("s0a1", 8),
            "the entry after the last head too"
        );
        for (prefix, why) in [
            ("s0", "2 scopes start with \"s0\": s0a1, s0b2"),
            ("s1", "no scope starting with \"s1\""),
        ] {
            let err = warren_receiptd::client::export(&d.socket, prefix, &mut Vec::new())
                .await
                .unwrap_err();
            assert!(format!("{err:#}").contains(why), "{err:#}");
        }
        (out, warren_receiptd::client::keys(&d.socket).await.unwrap())
    });
    let out = verify(&export, &keys);
    assert_eq!(
        (out.code, out.entries, out.checkpoints),
        (EXIT_VERIFIED, 8, 1),
        "{}",
        out.message
    );
}

#[test]
fn an_uncovered_query_receipt_gets_a_checkpoint_from_the_timer() {
    let dir = tmp();
    let d = Daemon::start(dir.path(), &["--checkpoint-ms", "200"]);
    rt().block_on(async {
        let appender = Appender::connect(&d.socket).await.unwrap();
        appender.append(&body("q", "query", 0)).await.unwrap();
        let client = Client::connect_unix(&d.socket).await.unwrap();
        // Waits for the timer (readiness, bounded), then checks what it signed.
        let mut head = Vec::new();
        for _ in 0..500 {
            head = read_file(&client, "q/head").await.unwrap();
            if !head.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let head = String::from_utf8(head).unwrap();
        assert_eq!(
            head.lines().nth(1),
            Some("1"),
            "no checkpoint covered the query receipt: {head:?}"
        );
    });
    // Killed, not stopped: the timer's checkpoint alone must cover the entry.
    let mut d = d;
    d.kill9();
    let out = verify(&export(dir.path(), "q"), &registry(dir.path()));
    assert_eq!(
        (out.code, out.entries),
        (EXIT_VERIFIED, 1),
        "{}",
        out.message
    );
}

/// A write of a JSON array is a batch: appended all or none, its reply the array of the acks.
#[test]
fn a_batch_write_is_appended_all_or_none_and_acked_per_request() {
    let dir = tmp();
    let d = Daemon::start(dir.path(), &[]);
    let batch = |items: &[Vec<u8>]| {
        let items: Vec<&str> = items
            .iter()
            .map(|b| std::str::from_utf8(b).unwrap())
            .collect();
        format!("[{}]", items.join(",")).into_bytes()
    };
    rt().block_on(async {
        let client = Client::connect_unix(&d.socket).await.unwrap();
        let three: Vec<Vec<u8>> = (0..3).map(|i| body("s", "query", i)).collect();
        let reply = write_file(&client, "append", &batch(&three)).await.unwrap();
        let acks: Vec<Value> = serde_json::from_slice(&reply).unwrap();
        let seqs: Vec<u64> = acks.iter().map(|a| a["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, [0, 1, 2]);
        let log = read_file(&client, "s/log").await.unwrap();
        let hashes: Vec<String> = log
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| hex::encode(Sha256::digest(l)))
            .collect();
        let acked: Vec<&str> = acks.iter().map(|a| a["hash"].as_str().unwrap()).collect();
        assert_eq!(hashes, acked);

        // One bad request (a decision, which an operator may not write; then a malformed one)
        // refuses the whole batch, and nothing of it is appended.
        for (bad, want, says) in [
            (body("s", "decision", 4), Errno::EACCES, "forbidden"),
            (
                b"{\"scope\":\"s\"}".to_vec(),
                Errno::EINVAL,
                "batch request 1",
            ),
            (body("../x", "query", 5), Errno::EINVAL, "batch request 1"),
        ] {
            let items = [body("s", "query", 3), bad, body("s", "query", 6)];
            let root = client.attach("op", "").await.unwrap();
            let fid = root.walk(&["append"]).await.unwrap();
            fid.open(oflags::RDWR).await.unwrap();
            let (errno, said) = fid.call(&batch(&items)).await.unwrap_err();
            assert_eq!(errno, want, "{}", String::from_utf8_lossy(&said));
            assert!(
                String::from_utf8_lossy(&said).contains(says),
                "{}",
                String::from_utf8_lossy(&said)
            );
        }
        for empty in [&b"[]"[..], b" [ ] "] {
            let root = client.attach("op", "").await.unwrap();
            let fid = root.walk(&["append"]).await.unwrap();
            fid.open(oflags::RDWR).await.unwrap();
            let (errno, said) = fid.call(empty).await.unwrap_err();
            assert_eq!(errno, Errno::EINVAL);
            assert!(String::from_utf8_lossy(&said).contains("1 to 256"));
        }
        let log = read_file(&client, "s/log").await.unwrap();
        assert_eq!(
            log.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count(),
            3
        );
    });
    d.stop();
    assert_eq!(verify_all(dir.path()), 3);
}

/// A connection handed over on `receipts.ctl` with a scope is a read-only view of that scope:
/// its `log`, `head` and proofs and the key registry are there; another scope, receiptd's own,
/// `append` and `ctl` are absent (ENOENT), and a listing shows `keys` and the scope alone.
#[test]
fn a_view_handed_over_shows_one_scope_and_keys_and_appends_nothing() {
    let dir = tmp();
    let d = Daemon::start(dir.path(), &[]);
    rt().block_on(async {
        let appender = Appender::connect(&d.socket).await.unwrap();
        for (scope, i) in [("s1", 0), ("s2", 0), ("s1", 1)] {
            appender.append(&body(scope, "query", i)).await.unwrap();
        }
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let ctl = dir.path().join("run").join("receipts.ctl");
        warren_receiptd::control::hand_over(&ctl, "s1", &theirs).unwrap();
        drop(theirs);
        ours.set_nonblocking(true).unwrap();
        let stream = tokio::net::UnixStream::from_std(ours).unwrap();
        let view = Client::new(stream, 1 << 20).await.unwrap();
        let log = read_file(&view, "s1/log").await.unwrap();
        assert_eq!(
            log.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count(),
            2
        );
        assert!(!read_file(&view, "keys").await.unwrap().is_empty());
        read_file(&view, "s1/head").await.unwrap();
        for absent in ["s2/log", "s2", "receiptd/log", "append", "ctl"] {
            assert_eq!(
                read_file(&view, absent).await.unwrap_err(),
                Errno::ENOENT,
                "{absent}"
            );
        }
        let root = view.attach("peer", "").await.unwrap();
        let listing = root.walk(&[]).await.unwrap();
        listing.open(oflags::RDONLY).await.unwrap();
        let mut names = listing.read_dir_names().await.unwrap();
        names.retain(|n| n != "." && n != "..");
        names.sort();
        assert_eq!(names, ["keys", "s1"]);
        // Open files are bounded per connection (each holds a copy of what it read): the one
        // past the bound is EMFILE, and a place comes back when a file is closed.
        let mut open = Vec::new();
        for _ in 0..warren_receiptd::tree::MAX_SNAPSHOTS {
            let f = root.walk(&["s1", "log"]).await.unwrap();
            f.open(oflags::RDONLY).await.unwrap();
            open.push(f);
        }
        let one_more = root.walk(&["s1", "log"]).await.unwrap();
        assert_eq!(
            one_more.open(oflags::RDONLY).await.unwrap_err(),
            Errno::EMFILE
        );
        open.pop().unwrap().clunk().await.unwrap();
        one_more.open(oflags::RDONLY).await.unwrap();
        drop(open);
        // A record naming no valid scope is refused, and the connection is not served.
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let refused = warren_receiptd::control::hand_over(&ctl, "../s2", &theirs).unwrap_err();
        assert!(refused.to_string().contains("scope"), "{refused}");
    });
    assert_eq!(
        warren_receiptd::Role::Reader.may_append(warren_receiptd::Kind::Query),
        Err(warren_receiptd::AppendError::Forbidden(
            "a read-only view appends nothing".into()
        ))
    );
}
