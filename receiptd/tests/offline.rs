//! The verifier binary run by a stranger, and the independent Python checker.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use warren_receiptd::Log;
use warren_receiptd::keys::Registry;

/// A scope of 37 entries checkpointed at 5, 16 and 37 (and the log shut down cleanly).
fn build(base: &Path) -> Log {
    let mut log = open(base);
    for i in 0..37 {
        let (req, role) = mixed("sess-1", i);
        log.append(req, role).unwrap();
        if [4, 15].contains(&i) {
            log.checkpoint(true).unwrap();
        }
    }
    log.checkpoint(true).unwrap();
    log
}

fn run_verifier(dir: &Path, args: &[&str]) -> (i32, String) {
    // A copy just written may still be open for writing in a child another test thread forked
    // meanwhile (`cargo test` runs tests as threads of one process): exec then fails with
    // ETXTBSY until that child has exec'd, which closes it.
    let mut tries = 0;
    let out = loop {
        match Command::new(dir.join("warren-verify"))
            .args(args)
            .current_dir(dir)
            .env_clear()
            .output()
        {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

#[test]
fn a_stranger_verifies_from_an_empty_directory() {
    let dir = tmp();
    let mut log = build(dir.path());
    log.shutdown();
    let stranger = tmp();
    let s = stranger.path();
    assert_eq!(std::fs::read_dir(s).unwrap().count(), 0);
    std::fs::copy(env!("CARGO_BIN_EXE_warren-verify"), s.join("warren-verify")).unwrap();
    std::fs::write(s.join("export.jsonl"), export(dir.path(), "sess-1")).unwrap();
    std::fs::write(s.join("keys.json"), registry(dir.path())).unwrap();

    let (code, msg) = run_verifier(s, &["export.jsonl", "--keys", "keys.json"]);
    assert_eq!(code, 0, "{msg}");
    assert!(msg.contains("37 entries"), "{msg}");

    // 1: a signed receipt's subject edited (and re-encoded, so it is still well-formed).
    let text = std::fs::read_to_string(s.join("export.jsonl")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut env: serde_json::Value = serde_json::from_str(&lines[5]).unwrap();
    let payload = b64(env["payload"].as_str().unwrap());
    let edited = String::from_utf8(payload)
        .unwrap()
        .replace("fs_read", "fs_writ");
    env["payload"] = b64e(edited.as_bytes()).into();
    lines[5] = String::from_utf8(serde_json_canonicalizer::to_vec(&env).unwrap()).unwrap();
    std::fs::write(s.join("tampered.jsonl"), lines.join("\n") + "\n").unwrap();
    let (code, msg) = run_verifier(s, &["tampered.jsonl", "--keys", "keys.json"]);
    assert_eq!(code, 1, "{msg}");
    assert!(msg.contains("line 6") && msg.contains("signature"), "{msg}");

    // 2: usage.
    assert_eq!(run_verifier(s, &["export.jsonl"]).0, 2);
    assert_eq!(
        run_verifier(s, &["missing.jsonl", "--keys", "keys.json"]).0,
        2
    );

    // 5: a registry that does not hold the key.
    let mut reg = Registry::parse(&std::fs::read(s.join("keys.json")).unwrap()).unwrap();
    let stranger_key = warren_receiptd::keys::Signer::generate().unwrap();
    let mut other = reg.clone();
    other.keys = vec![warren_receiptd::keys::KeyRow::for_signer(
        &stranger_key,
        &reg.keys[0].note_name,
        0,
    )];
    std::fs::write(s.join("other-keys.json"), other.to_bytes()).unwrap();
    let (code, msg) = run_verifier(s, &["export.jsonl", "--keys", "other-keys.json"]);
    assert_eq!(code, 5, "{msg}");

    // 6: the registry says the key was retired before it signed these.
    reg.keys[0].valid_until = Some(reg.keys[0].valid_from);
    reg.keys[0].superseded_by = Some(stranger_key.keyid().to_owned());
    std::fs::write(s.join("retired-keys.json"), reg.to_bytes()).unwrap();
    let (code, msg) = run_verifier(s, &["export.jsonl", "--keys", "retired-keys.json"]);
    assert_eq!(code, 6, "{msg}");
    assert!(msg.contains("retired"), "{msg}");
}

fn b64(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn b64e(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The venv scripts/install-test-deps makes in this checkout.
const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");

/// The venv's Python with `cryptography`, a peer: missing is a failure.
fn python() -> String {
    let python = std::env::var("WARREN_TEST_PYTHON").unwrap_or_else(|_| PYTHON.into());
    let ok = Command::new(&python)
        .args(["-c", "import cryptography"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{python} with the `cryptography` module is missing (run scripts/install-test-deps)"
    );
    python
}

#[test]
fn an_independent_python_checker_accepts_our_proofs_and_checkpoints() {
    let python = python();
    let dir = tmp();
    let log = build(dir.path());
    let mut proofs = Vec::new();
    for seq in 0..37 {
        proofs.push(log.inclusion_proof("sess-1", seq).unwrap());
    }
    for new in [5u64, 16, 37] {
        for old in 1..=new {
            proofs.push(log.consistency_proof("sess-1", old, new).unwrap());
        }
    }
    let lines: String = proofs.iter().map(|p| p.to_string() + "\n").collect();
    let d = dir.path();
    std::fs::write(d.join("export.jsonl"), export(d, "sess-1")).unwrap();
    std::fs::write(d.join("keys.json"), registry(d)).unwrap();
    std::fs::write(d.join("proofs.jsonl"), &lines).unwrap();
    let checker = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/checker.py");
    let run = |proofs: &str| {
        let out = Command::new(&python)
            .arg(checker)
            .args(["export.jsonl", "keys.json", proofs])
            .current_dir(d)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, msg) = run("proofs.jsonl");
    assert_eq!(code, Some(0), "{msg}");
    assert!(
        msg.contains("37 entries, 3 checkpoints, 37 inclusion and 58 consistency proofs"),
        "{msg}"
    );

    // The checker can fail: one hash of one inclusion path changed.
    let mut bad: serde_json::Value = serde_json::from_str(lines.lines().nth(9).unwrap()).unwrap();
    let h = bad["path"][1].as_str().unwrap().to_owned();
    bad["path"][1] = format!("{}{}", if h.starts_with('0') { "1" } else { "0" }, &h[1..]).into();
    std::fs::write(d.join("bad.jsonl"), bad.to_string() + "\n").unwrap();
    let (code, msg) = run("bad.jsonl");
    assert_eq!(code, Some(1), "{msg}");
    assert!(msg.contains("inclusion proof of seq 9"), "{msg}");
}

/// An export cut at an older checkpoint (192 later entries left out) verifies only as what it
/// is: the plain result says it covers nothing after its checkpoint, and with the newer head
/// (`--head`, as read from `/receipts/<scope>/head`) or its size (`--size`) it is refused as
/// incomplete (exit 3), while the full export passes both.
#[test]
fn a_stale_export_is_refused_when_the_newer_head_or_size_is_required() {
    let dir = tmp();
    let mut log = open(dir.path());
    for i in 0..8 {
        let (req, role) = mixed("sess-1", i);
        log.append(req, role).unwrap();
    }
    log.checkpoint(true).unwrap();
    let (stale_size, _) = log.head("sess-1").unwrap().unwrap();
    let v = tmp();
    let v = v.path();
    std::fs::copy(env!("CARGO_BIN_EXE_warren-verify"), v.join("warren-verify")).unwrap();
    std::fs::write(v.join("stale.jsonl"), export(dir.path(), "sess-1")).unwrap();
    for i in 8..200 {
        let (req, role) = mixed("sess-1", i);
        log.append(req, role).unwrap();
    }
    log.checkpoint(true).unwrap();
    let (size, head) = log.head("sess-1").unwrap().unwrap();
    assert_eq!(size - stale_size, 192);
    std::fs::write(v.join("head"), &head).unwrap();
    std::fs::write(v.join("full.jsonl"), export(dir.path(), "sess-1")).unwrap();
    std::fs::write(v.join("keys.json"), registry(dir.path())).unwrap();
    let keys = ["--keys", "keys.json"];

    let (code, msg) = run_verifier(v, &["stale.jsonl", keys[0], keys[1]]);
    assert_eq!(code, 0, "{msg}");
    assert!(
        msg.contains(&format!(
            "{stale_size} entries up to its checkpoint of size {stale_size}"
        )) && msg.contains("this export says nothing about entries after it"),
        "{msg}"
    );
    assert!(!msg.contains("all of them"), "{msg}");

    let (code, msg) = run_verifier(v, &["stale.jsonl", keys[0], keys[1], "--head", "head"]);
    assert_eq!(code, 3, "{msg}");
    assert!(
        msg.contains("the 192 entries after it are not in this export"),
        "{msg}"
    );
    // With the consistency proof the tree serves: still incomplete, but shown to be a cut of the
    // same log, not another history; a proof that does not verify, or for other sizes, is not.
    let proof = log.consistency_proof("sess-1", stale_size, size).unwrap();
    std::fs::write(v.join("proof"), proof.to_string()).unwrap();
    let with_proof = [
        "stale.jsonl",
        keys[0],
        keys[1],
        "--head",
        "head",
        "--proof",
        "proof",
    ];
    let (code, msg) = run_verifier(v, &with_proof);
    assert_eq!(code, 3, "{msg}");
    assert!(msg.contains("are the first of that log"), "{msg}");
    let mut bad = proof.clone();
    let first = bad["proof"][0].as_str().unwrap().to_owned();
    let flipped = format!(
        "{}{}",
        if first.starts_with('0') { "1" } else { "0" },
        &first[1..]
    );
    bad["proof"][0] = flipped.into();
    std::fs::write(v.join("proof"), bad.to_string()).unwrap();
    let (code, msg) = run_verifier(v, &with_proof);
    assert_eq!(code, 1, "{msg}");
    assert!(msg.contains("does not verify"), "{msg}");
    let other_sizes = log
        .consistency_proof("sess-1", stale_size + 1, size)
        .unwrap();
    std::fs::write(v.join("proof"), other_sizes.to_string()).unwrap();
    assert_eq!(run_verifier(v, &with_proof).0, 1);
    assert_eq!(
        run_verifier(v, &["stale.jsonl", keys[0], keys[1], "--proof", "proof"]).0,
        2
    );

    let size_arg = size.to_string();
    let (code, msg) = run_verifier(v, &["stale.jsonl", keys[0], keys[1], "--size", &size_arg]);
    assert_eq!(code, 3, "{msg}");
    assert!(msg.contains("192 are not in this export"), "{msg}");

    let (code, msg) = run_verifier(
        v,
        &[
            "full.jsonl",
            keys[0],
            keys[1],
            "--head",
            "head",
            "--size",
            &size_arg,
        ],
    );
    assert_eq!(code, 0, "{msg}");
    assert!(
        msg.contains(&format!(
            "complete up to the checkpoint given with --head (size {size})"
        )),
        "{msg}"
    );

    // A head of another log (another key) is not taken as this one's.
    let other = tmp();
    let mut other_log = open(other.path());
    let (req, role) = mixed("sess-1", 0);
    other_log.append(req, role).unwrap();
    other_log.checkpoint(true).unwrap();
    std::fs::write(
        v.join("other-head"),
        other_log.head("sess-1").unwrap().unwrap().1,
    )
    .unwrap();
    let (code, msg) = run_verifier(v, &["full.jsonl", keys[0], keys[1], "--head", "other-head"]);
    assert_eq!(code, 5, "{msg}");
    assert!(msg.contains("--head"), "{msg}");
    // A head that is not a checkpoint at all.
    std::fs::write(v.join("junk"), "not a checkpoint\n").unwrap();
    let (code, msg) = run_verifier(v, &["full.jsonl", keys[0], keys[1], "--head", "junk"]);
    assert_eq!(code, 1, "{msg}");
    assert_eq!(
        run_verifier(v, &["full.jsonl", keys[0], keys[1], "--size", "x"]).0,
        2
    );
}

/// `--entry SEQ:HASH`: the entry at SEQ must have exactly that hash and be under the checkpoint
/// (`--head`'s when given); a wrong hash, an entry past it, or a malformed argument is refused.
#[test]
fn an_entry_is_found_under_the_checkpoint_by_its_hash_only() {
    let dir = tmp();
    let mut log = open(dir.path());
    for i in 0..8 {
        let (req, role) = mixed("sess-1", i);
        log.append(req, role).unwrap();
    }
    log.checkpoint(true).unwrap();
    let (_, head) = log.head("sess-1").unwrap().unwrap();
    let v = tmp();
    let v = v.path();
    let export = export(dir.path(), "sess-1");
    std::fs::write(v.join("export.jsonl"), &export).unwrap();
    std::fs::write(v.join("head"), &head).unwrap();
    std::fs::write(v.join("keys.json"), registry(dir.path())).unwrap();
    let line = export.split(|b| *b == b'\n').nth(3).unwrap();
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(line));
    let run = |entry: &str| {
        // The built binary itself, not a copy: a copy being written while another test forks
        // is ETXTBSY for its exec.
        let out = Command::new(env!("CARGO_BIN_EXE_warren-verify"))
            .current_dir(v)
            .args([
                "export.jsonl",
                "--keys",
                "keys.json",
                "--head",
                "head",
                "--entry",
                entry,
            ])
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout),
        )
    };
    let (code, msg) = run(&format!("3:{hash}"));
    assert_eq!(code, 0, "{msg}");
    assert!(
        msg.contains(&format!(
            "entry 3 has hash {hash} under the checkpoint of size 8"
        )),
        "{msg}"
    );
    let (code, msg) = run(&format!("4:{hash}"));
    assert_eq!(code, 1, "{msg}");
    assert!(msg.contains(&format!("not {hash}")), "{msg}");
    let (code, msg) = run(&format!("8:{hash}"));
    assert_eq!(code, 1, "{msg}");
    assert!(
        msg.contains("entry 8 is not under the checkpoint (size 8)"),
        "{msg}"
    );
    let (code, msg) = run("3:beef");
    assert_eq!(code, 2, "{msg}");
}
