//! The log, export and verifier through the library: no daemon.
//!
//! Why one file: one library harness (no daemon); each test is one rule of `specs/receipts.md`.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use serde_json::Value;
use warren_receiptd::keys::{Registry, key_path};
use warren_receiptd::log::Write;
use warren_receiptd::verify::{
    EXIT_INVALID, EXIT_KEY_RETIRED, EXIT_UNKNOWN_KEY, EXIT_USAGE, EXIT_VERIFIED,
};
use warren_receiptd::{AppendError, Kind, Log, Role, verify};

fn system_subjects(base: &std::path::Path, log: &Log) -> Vec<Value> {
    let text = log.log_text("receiptd").unwrap();
    let _ = base;
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            let env: Value = serde_json::from_slice(line).unwrap();
            let payload = base64_decode(env["payload"].as_str().unwrap());
            let body: Value = serde_json::from_slice(&payload).unwrap();
            body["subject"].clone()
        })
        .collect()
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[test]
fn a_thousand_mixed_receipts_over_several_scopes_verify() {
    let dir = tmp();
    let mut log = open(dir.path());
    let scopes = ["s0", "s1", "mcp:srv", "session-3", "s.4"];
    for i in 0..1000u64 {
        let scope = scopes[(i % 5) as usize];
        let (req, role) = mixed(scope, i / 5 + i % 3);
        log.append(req, role)
            .unwrap_or_else(|e| panic!("append {i}: {e}"));
        log.checkpoint(false).unwrap();
    }
    log.shutdown();
    drop(log);
    let registry = registry(dir.path());
    let mut total = 0;
    for scope in scopes {
        let export = export(dir.path(), scope);
        let out = verify(&export, &registry);
        assert_eq!(out.code, EXIT_VERIFIED, "{scope}: {}", out.message);
        assert!(
            out.checkpoints >= 2,
            "{scope}: 200 rows make at least two checkpoints"
        );
        total += out.entries;
    }
    assert_eq!(total, 1000);
}

#[test]
fn flipping_any_single_byte_of_a_small_export_is_caught() {
    let dir = tmp();
    let mut log = open(dir.path());
    for i in 0..10 {
        let (req, role) = mixed("s", i);
        log.append(req, role).unwrap();
        if i == 4 {
            log.checkpoint(true).unwrap();
        }
    }
    log.shutdown();
    let export = export(dir.path(), "s");
    let registry = registry(dir.path());
    assert!(
        export.len() <= 16 * 1024,
        "export is {} bytes",
        export.len()
    );
    assert_eq!(verify(&export, &registry).code, EXIT_VERIFIED);
    let mut missed = Vec::new();
    for i in 0..export.len() {
        // The lowest bit: the subtlest change (base64 padding bits, a digit, a letter's case).
        let mut bad = export.clone();
        bad[i] ^= 0x01;
        if verify(&bad, &registry).code == EXIT_VERIFIED {
            missed.push(i);
        }
    }
    assert!(missed.is_empty(), "flips not caught: {missed:?}");
}

#[test]
fn rotation_retires_the_old_key_and_earlier_receipts_still_verify() {
    let dir = tmp();
    let mut log = open(dir.path());
    let first = log.signer_status().unwrap().to_owned();
    for i in 0..10 {
        let (req, role) = mixed("s", i);
        log.append(req, role).unwrap();
    }
    let second = log.rotate().unwrap();
    assert_ne!(first, second);
    for i in 10..20 {
        let (req, role) = mixed("s", i);
        log.append(req, role).unwrap();
    }
    log.shutdown();
    drop(log);

    let registry_bytes = registry(dir.path());
    let reg = Registry::parse(&registry_bytes).unwrap();
    let old = reg.find(&first).unwrap();
    let new = reg.find(&second).unwrap();
    assert!(old.valid_until.is_some());
    assert_eq!(old.superseded_by.as_deref(), Some(second.as_str()));
    assert_eq!(new.valid_until, None);
    assert!(new.valid_from >= old.valid_until.unwrap());
    let out = verify(&export(dir.path(), "s"), &registry_bytes);
    assert_eq!(out.code, EXIT_VERIFIED, "{}", out.message);
    assert_eq!(
        verify(&export(dir.path(), "receiptd"), &registry_bytes).code,
        EXIT_VERIFIED
    );

    // The restarted log signs with the new key, and its boot receipt names it.
    let mut log = open(dir.path());
    assert_eq!(log.signer_status().unwrap(), second);
    log.append_boot().unwrap();
    let subjects = system_subjects(dir.path(), &log);
    assert!(subjects.iter().any(|s| s["event"] == "rotate"
        && s["key"] == second.as_str()
        && s["previous"] == first.as_str()));
    assert_eq!(subjects.last().unwrap()["key"], second.as_str());
}

#[test]
fn no_usable_signer_refuses_every_append() {
    let dir = tmp();
    let mut log = open(dir.path());
    log.append_boot().unwrap();
    log.shutdown();
    drop(log);
    let key = key_path(&dir.path().join("secrets"));

    // Readable by others: refused.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut log = open(dir.path());
    let (req, role) = mixed("s", 0);
    match log.append(req, role) {
        Err(AppendError::NoSigner(why)) => assert!(why.contains("readable by others"), "{why}"),
        other => panic!("expected NoSigner, got {other:?}"),
    }
    drop(log);

    // Gone (and the registry is not empty, so no new key is made behind the operator's back).
    std::fs::remove_file(&key).unwrap();
    let mut log = open(dir.path());
    for i in 0..5 {
        let (req, role) = mixed("s", i);
        let err = log.append(req, role).unwrap_err();
        assert!(matches!(err, AppendError::NoSigner(_)), "{err}");
        assert!(err.to_string().contains("signing key"), "{err}");
    }
    assert!(log.append_boot().is_err());
    assert!(!key.exists());
    drop(log);

    // A different key in the file: refused, naming both ids.
    let other = warren_receiptd::keys::Signer::generate().unwrap();
    other.save_new(&key).unwrap();
    let mut log2 = open(dir.path());
    let err = log2.append(mixed("s", 2).0, Role::Toolfs).unwrap_err();
    assert!(err.to_string().contains(other.keyid()), "{err}");
}

#[test]
fn decision_and_effect_only_from_their_daemons_and_the_appender_is_recorded() {
    let dir = tmp();
    let mut log = open(dir.path());
    for (kind, role, ok) in [
        (Kind::Decision, Role::Gate, true),
        (Kind::Decision, Role::Toolfs, false),
        (Kind::Decision, Role::Operator(0), false),
        (Kind::Effect, Role::Toolfs, true),
        (Kind::Effect, Role::Gate, false),
        (Kind::Effect, Role::Operator(1000), false),
        (Kind::Effect, Role::Mcpfs, true),
        (Kind::Decision, Role::Mcpfs, false),
        (Kind::Accept, Role::Operator(0), true),
        (Kind::Accept, Role::Mcpfs, false),
        (Kind::Accept, Role::Toolfs, false),
        (Kind::Accept, Role::Gate, false),
        (Kind::Remote, Role::Operator(0), true),
        (Kind::Remote, Role::Operator(1000), false),
        (Kind::Remote, Role::Toolfs, false),
        (Kind::Remote, Role::Gate, false),
        (Kind::Boot, Role::Operator(0), false),
        (Kind::Checkpoint, Role::Gate, false),
        (Kind::Query, Role::Operator(0), true),
    ] {
        let res = log.append(request("s", kind, 1), role);
        assert_eq!(res.is_ok(), ok, "{kind} from {role:?}: {res:?}");
        if let Err(e) = res {
            assert!(matches!(e, AppendError::Forbidden(_)));
        }
    }
    let text = String::from_utf8(log.log_text("s").unwrap()).unwrap();
    let appenders: Vec<String> = text
        .lines()
        .map(|l| {
            let env: Value = serde_json::from_str(l).unwrap();
            let body: Value =
                serde_json::from_slice(&base64_decode(env["payload"].as_str().unwrap())).unwrap();
            body["appender"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        appenders,
        [
            "gate",
            "toolfs",
            "mcpfs",
            "operator:0",
            "operator:0",
            "operator:0"
        ]
    );
}

#[test]
fn a_second_writer_on_the_same_database_is_refused() {
    let dir = tmp();
    let log = open(dir.path());
    let err = Log::open(config(dir.path()))
        .err()
        .expect("a second open must fail");
    assert!(
        err.to_string()
            .contains("another receiptd owns this database"),
        "{err}"
    );
    drop(log);
    open(dir.path());
}

#[test]
fn a_secrets_dir_inside_the_data_dir_is_refused() {
    let dir = tmp();
    let cfg = warren_receiptd::LogConfig::new(
        &dir.path().join("data"),
        &dir.path().join("data/sub/../secrets"),
    );
    let err = Log::open(cfg).err().expect("must refuse");
    assert!(err.to_string().contains("inside the data dir"), "{err}");
    assert!(!dir.path().join("data/secrets").exists());
}

#[test]
fn the_rate_limit_is_per_scope() {
    let dir = tmp();
    let mut cfg = config(dir.path());
    cfg.rate_per_sec = 0.0;
    cfg.rate_burst = 3.0;
    let mut log = Log::open(cfg).unwrap();
    for i in 0..3 {
        log.append(request("a", Kind::Query, i), Role::Toolfs)
            .unwrap();
    }
    let err = log
        .append(request("a", Kind::Query, 3), Role::Toolfs)
        .unwrap_err();
    assert!(matches!(err, AppendError::RateLimited(_)), "{err}");
    log.append(request("b", Kind::Query, 0), Role::Toolfs)
        .unwrap();
}

#[test]
fn the_clock_and_chain_survive_a_restart() {
    let dir = tmp();
    let mut log = open(dir.path());
    for i in 0..5 {
        log.append(request("s", Kind::Cap, i), Role::Toolfs)
            .unwrap();
    }
    drop(log); // no shutdown: as after a crash, the tail is uncovered
    let mut log = open(dir.path());
    for i in 5..10 {
        log.append(request("s", Kind::Query, i), Role::Toolfs)
            .unwrap();
    }
    log.shutdown();
    let out = verify(&export(dir.path(), "s"), &registry(dir.path()));
    assert_eq!(
        (out.code, out.entries),
        (EXIT_VERIFIED, 10),
        "{}",
        out.message
    );
}

#[test]
fn verifier_exit_codes() {
    let dir = tmp();
    let mut log = open(dir.path());
    for i in 0..6 {
        let (req, role) = mixed("s", i);
        log.append(req, role).unwrap();
    }
    log.shutdown();
    let export = export(dir.path(), "s");
    let registry = registry(dir.path());
    assert_eq!(verify(&export, &registry).code, EXIT_VERIFIED);

    // 1: an entry removed from the middle of the chain.
    let text = String::from_utf8(export.clone()).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.remove(2);
    let dropped = lines.join("\n") + "\n";
    let out = verify(dropped.as_bytes(), &registry);
    assert_eq!(out.code, EXIT_INVALID, "{}", out.message);
    assert!(out.message.contains("line 3"), "{}", out.message);

    // 2: an unreadable registry.
    assert_eq!(verify(&export, b"{not json").code, EXIT_USAGE);

    // 5: a registry without the key.
    let other = tmp();
    let mut other_log = open(other.path());
    other_log.append_boot().unwrap();
    other_log.shutdown();
    let out = verify(&export, &common::registry(other.path()));
    assert_eq!(out.code, EXIT_UNKNOWN_KEY, "{}", out.message);
    assert!(out.message.contains("line 1"), "{}", out.message);

    // 6: the key retired before the receipts were signed.
    let mut reg = Registry::parse(&registry).unwrap();
    reg.keys[0].valid_until = Some(reg.keys[0].valid_from);
    reg.keys[0].superseded_by = Some("someone-else".into());
    let out = verify(&export, &reg.to_bytes());
    assert_eq!(out.code, EXIT_KEY_RETIRED, "{}", out.message);
    assert!(out.message.contains("retired"), "{}", out.message);
}

#[test]
fn the_clock_never_goes_backwards_across_a_restart() {
    let dir = tmp();
    let mut log = open(dir.path());
    log.append(request("s", Kind::Cap, 0), Role::Toolfs)
        .unwrap();
    drop(log);
    // As if the wall clock had run an hour ahead before the restart and then stepped back.
    let ahead = warren_receiptd::log::now_ms() + 3_600_000;
    let conn = rusqlite::Connection::open(db(dir.path())).unwrap();
    let changed = conn
        .execute(
            "UPDATE scopes SET hlc_wall = ?1, hlc_counter = 0",
            [ahead as i64],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);
    let mut log = open(dir.path());
    log.append(request("s", Kind::Cap, 1), Role::Toolfs)
        .unwrap();
    log.append(request("s", Kind::Query, 2), Role::Toolfs)
        .unwrap();
    let clocks: Vec<(u64, u64)> = String::from_utf8(log.log_text("s").unwrap())
        .unwrap()
        .lines()
        .map(|l| {
            let env: Value = serde_json::from_str(l).unwrap();
            let body: Value =
                serde_json::from_slice(&base64_decode(env["payload"].as_str().unwrap())).unwrap();
            (
                body["hlc"]["wall_ms"].as_u64().unwrap(),
                body["hlc"]["counter"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(&clocks[1..], [(ahead, 1), (ahead, 2)]);
    log.shutdown();
    assert_eq!(
        verify(&export(dir.path(), "s"), &registry(dir.path())).code,
        EXIT_VERIFIED
    );
}

/// What receiptd's batching relies on: writes committed together are each all or none. A write
/// with one refused request appends none of its requests and takes nothing from the others.
#[test]
fn writes_committed_together_are_each_all_or_none() {
    let dir = tmp();
    let mut log = open(dir.path());
    let write = |requests, role| Write { requests, role };
    let results = log.append_writes(vec![
        write(
            vec![request("a", Kind::Query, 0), request("a", Kind::Query, 1)],
            Role::Toolfs,
        ),
        // An effect the toolfs may write, then a decision it may not: neither is appended.
        write(
            vec![
                request("a", Kind::Effect, 2),
                request("a", Kind::Decision, 3),
            ],
            Role::Toolfs,
        ),
        write(vec![request("b", Kind::Decision, 4)], Role::Gate),
        write(vec![request("a", Kind::Query, 5)], Role::Operator(0)),
    ]);
    let seqs: Vec<Result<Vec<u64>, &str>> = results
        .iter()
        .map(|r| match r {
            Ok(acks) => Ok(acks.iter().map(|a| a.seq).collect()),
            Err(e) => Err(e.code()),
        })
        .collect();
    assert_eq!(
        seqs,
        vec![Ok(vec![0, 1]), Err("forbidden"), Ok(vec![0]), Ok(vec![2])]
    );
    assert_eq!((log.size("a"), log.size("b")), (Some(3), Some(1)));
    // The chain runs through the batch: each entry's prev is the hash the one before was acked with.
    let acks = results[0].as_ref().unwrap();
    let text = String::from_utf8(log.log_text("a").unwrap()).unwrap();
    let prevs: Vec<String> = text
        .lines()
        .map(|l| {
            let env: Value = serde_json::from_str(l).unwrap();
            let body: Value =
                serde_json::from_slice(&base64_decode(env["payload"].as_str().unwrap())).unwrap();
            body["prev"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(prevs[1], acks[0].hash);
    assert_eq!(prevs[2], acks[1].hash);
    log.checkpoint(true).unwrap();
    let out = verify(&export(dir.path(), "a"), &registry(dir.path()));
    assert_eq!(
        out.code,
        warren_receiptd::verify::EXIT_VERIFIED,
        "{}",
        out.message
    );
}

/// A write's requests take their rate tokens together: a batch over the scope's remaining
/// burst is refused whole and leaves the tokens for a write that fits.
#[test]
fn a_batch_over_the_rate_takes_no_tokens_and_appends_nothing() {
    let dir = tmp();
    let mut cfg = config(dir.path());
    cfg.rate_per_sec = 0.0;
    cfg.rate_burst = 2.0;
    let mut log = Log::open(cfg).unwrap();
    let three = (0..3).map(|i| request("a", Kind::Query, i)).collect();
    let refused = log
        .append_writes(vec![Write {
            requests: three,
            role: Role::Toolfs,
        }])
        .pop()
        .unwrap()
        .unwrap_err();
    assert!(matches!(refused, AppendError::RateLimited(_)), "{refused}");
    assert_eq!(log.size("a"), None);
    let two = (0..2).map(|i| request("a", Kind::Query, i)).collect();
    let acks = log
        .append_writes(vec![Write {
            requests: two,
            role: Role::Toolfs,
        }])
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(acks.len(), 2);
}

/// A query receipt has no signature of its own: the hash chain and the signed checkpoint over it
/// are what vouch for it (`specs/receipts.md`). So an export whose checkpoint is gone does not
/// verify, and a query entry that carries a signature is refused as such.
#[test]
fn a_query_receipt_rests_on_the_checkpoint_over_it() {
    let dir = tmp();
    let mut log = open(dir.path());
    log.append(request("s", Kind::Decision, 0), Role::Gate)
        .unwrap();
    log.append(request("s", Kind::Query, 1), Role::Toolfs)
        .unwrap();
    log.shutdown();
    let export = String::from_utf8(export(dir.path(), "s")).unwrap();
    let registry = registry(dir.path());
    assert_eq!(verify(export.as_bytes(), &registry).code, EXIT_VERIFIED);
    let lines: Vec<&str> = export.lines().collect();
    let entry = |line: &str| serde_json::from_str::<Value>(line).unwrap();
    let (decision, query) = (entry(lines[0]), entry(lines[1]));
    assert_eq!(decision["signatures"].as_array().unwrap().len(), 1);
    assert_eq!(query["signatures"], serde_json::json!([]));

    let without_checkpoints: String = lines
        .iter()
        .filter(|l| !l.starts_with(r#"{"checkpoint""#))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = verify(without_checkpoints.as_bytes(), &registry);
    assert_eq!(out.code, EXIT_INVALID, "{}", out.message);
    assert!(
        out.message.contains("not covered by a signature"),
        "{}",
        out.message
    );

    let mut signed_query = query.clone();
    signed_query["signatures"] = decision["signatures"].clone();
    let mut forged: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    forged[1] =
        String::from_utf8(serde_json_canonicalizer::to_vec(&signed_query).unwrap()).unwrap();
    let forged = forged.join("\n") + "\n";
    let out = verify(forged.as_bytes(), &registry);
    assert_eq!(out.code, EXIT_INVALID, "{}", out.message);
    assert!(
        out.message.contains("query receipts are unsigned"),
        "{}",
        out.message
    );
}

/// Another uid than receiptd's (the tests run as root, as CI does).
const STRANGER: u32 = 4242;

fn plant(path: &std::path::Path, mode: u32, uid: u32) {
    std::fs::write(path, b"").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

fn owner_and_mode(path: &std::path::Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.mode() & 0o7777)
}

/// A `receipts.db` another user made (0666, theirs) is refused, not adopted: they could reopen
/// it read-write; so is a symlink in its place, a -wal of theirs, and a data dir that is a
/// symlink.
#[test]
fn a_database_another_user_planted_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (CI runs as root)"
    );
    let dir = tmp();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = db(dir.path());
    plant(&db, 0o666, STRANGER);
    let err = format!(
        "{:#}",
        Log::open(config(dir.path())).err().expect("refused")
    );
    assert!(err.contains("owner uid 4242"), "{err}");
    assert_eq!(owner_and_mode(&db), (STRANGER, 0o666), "left as it was");

    std::fs::remove_file(&db).unwrap();
    let elsewhere = dir.path().join("elsewhere.db");
    plant(&elsewhere, 0o600, 0);
    std::os::unix::fs::symlink(&elsewhere, &db).unwrap();
    let err = format!(
        "{:#}",
        Log::open(config(dir.path())).err().expect("refused")
    );
    assert!(err.contains("symlink"), "{err}");
    assert_eq!(
        std::fs::metadata(&elsewhere).unwrap().len(),
        0,
        "not written"
    );

    std::fs::remove_file(&db).unwrap();
    plant(&data.join("receipts.db-wal"), 0o666, STRANGER);
    let err = format!(
        "{:#}",
        Log::open(config(dir.path())).err().expect("refused")
    );
    assert!(err.contains("receipts.db-wal"), "{err}");
    std::fs::remove_file(data.join("receipts.db-wal")).unwrap();
    open(dir.path());

    // The data dir itself a symlink: not followed.
    let other = tmp();
    std::os::unix::fs::symlink(other.path(), other.path().join("data-link")).unwrap();
    let cfg = warren_receiptd::LogConfig::new(
        &other.path().join("data-link"),
        &other.path().join("secrets"),
    );
    let err = format!("{:#}", Log::open(cfg).err().expect("refused"));
    assert!(err.contains("symlink"), "{err}");
}

/// The signing key is opened without following a symlink and must be receiptd's own.
#[test]
fn a_signing_key_that_is_a_symlink_or_another_users_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (CI runs as root)"
    );
    let dir = tmp();
    let mut log = open(dir.path());
    log.append_boot().unwrap();
    log.shutdown();
    drop(log);
    let key = key_path(&dir.path().join("secrets"));
    let moved = dir.path().join("moved.key");
    std::fs::rename(&key, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &key).unwrap();
    let expect_refused = |what: &str| {
        let mut log = open(dir.path());
        let (req, role) = mixed("s", 0);
        match log.append(req, role) {
            Err(AppendError::NoSigner(why)) => assert!(why.contains(what), "{why}"),
            other => panic!("expected NoSigner, got {other:?}"),
        }
    };
    expect_refused("is a symlink");
    std::fs::remove_file(&key).unwrap();
    std::fs::rename(&moved, &key).unwrap();
    std::os::unix::fs::chown(&key, Some(STRANGER), Some(STRANGER)).unwrap();
    expect_refused("not a file of uid 0");
    std::os::unix::fs::chown(&key, Some(0), Some(0)).unwrap();
    let mut log = open(dir.path());
    log.append_boot().unwrap();
}
