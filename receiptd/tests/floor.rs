//! The free-space floor on a real, tiny filesystem: appends are refused below the floor (before
//! ENOSPC), the refusal is receipted once, and nothing acknowledged is lost.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};
use warren_receiptd::verify::EXIT_VERIFIED;
use warren_receiptd::{AppendError, AppendRequest, Log, Role, verify};

struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn tiny_tmpfs(at: &Path) -> Mount {
    std::fs::create_dir_all(at).unwrap();
    match nix::mount::mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=2m,mode=0700"),
    ) {
        Ok(()) => Mount(at.to_owned()),
        Err(e) => panic!(
            "cannot mount a 2 MiB tmpfs at {} ({e}); this test needs root (scripts/test runs as root)",
            at.display()
        ),
    }
}

fn big(scope: &str, i: u64) -> AppendRequest {
    let filler = "x".repeat(16 * 1024);
    AppendRequest::parse(
        json!({"scope": scope, "kind": "cap", "subject": {"i": i, "filler": filler}})
            .to_string()
            .as_bytes(),
    )
    .unwrap()
}

fn events(log: &Log) -> Vec<String> {
    let text = log.log_text("receiptd").unwrap();
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            use base64::Engine;
            let env: Value = serde_json::from_slice(line).unwrap();
            let body: Value = serde_json::from_slice(
                &base64::engine::general_purpose::STANDARD
                    .decode(env["payload"].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap();
            body["subject"]["event"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn appends_stop_at_the_floor_and_the_refusal_is_receipted_once() {
    let dir = tmp();
    let _mount = tiny_tmpfs(&dir.path().join("data"));
    let mut cfg = config(dir.path());
    cfg.min_free_bytes = 1 << 20;
    let mut log = Log::open(cfg).unwrap();
    let mut acked = 0u64;
    let refusal = loop {
        match log.append(big("s", acked), Role::Toolfs) {
            Ok(ack) => {
                assert_eq!(ack.seq, acked);
                acked += 1;
                assert!(acked < 200, "2 MiB cannot hold 200 receipts of 16 KiB");
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(refusal, AppendError::Floor(_)),
        "refused by {refusal}, not by the floor"
    );
    assert!(acked > 0);
    // Further appends, in any scope, are refused too, and not receipted again.
    for i in 0..5 {
        let err = log.append(big("other", i), Role::Toolfs).unwrap_err();
        assert!(matches!(err, AppendError::Floor(_)), "{err}");
    }
    assert_eq!(events(&log), ["free_space_floor"]);
    log.shutdown();
    drop(log);
    let out = verify(&export(dir.path(), "s"), &registry(dir.path()));
    assert_eq!(
        (out.code, out.entries),
        (EXIT_VERIFIED, acked),
        "{}",
        out.message
    );
    let out = verify(&export(dir.path(), "receiptd"), &registry(dir.path()));
    assert_eq!(out.code, EXIT_VERIFIED, "{}", out.message);
}

/// A decision of the gate with `verdict`, in `scope`.
fn decision(scope: &str, verdict: &str, i: u64) -> AppendRequest {
    AppendRequest::parse(
        json!({"scope": scope, "kind": "decision", "subject": {"verdict": verdict, "i": i}})
            .to_string()
            .as_bytes(),
    )
    .unwrap()
}

/// Below the floor, the last reserve (its lower half) is kept for what keeps the host
/// auditable: the gate's denials are still receipted while everything else is refused, and
/// receiptd's own receipt of the episode is written.
#[test]
fn below_the_floor_the_reserve_keeps_the_gates_denials() {
    let dir = tmp();
    let _mount = tiny_tmpfs(&dir.path().join("data"));
    let mut cfg = config(dir.path());
    cfg.min_free_bytes = 1 << 20;
    let mut log = Log::open(cfg).unwrap();
    let mut i = 0;
    while log.append(big("s", i), Role::Toolfs).is_ok() {
        i += 1;
        assert!(i < 200);
    }
    let allow = log
        .append(decision("s", "allow", 0), Role::Gate)
        .unwrap_err();
    assert!(matches!(allow, AppendError::Floor(_)), "{allow}");
    log.append(decision("s", "deny", 1), Role::Gate)
        .expect("a denial is receipted from the reserve");
    assert_eq!(events(&log), ["free_space_floor"]);
}

/// Only the gate and toolfs (which got the namespace's lineage from nsd) may charge a receipt to
/// a subtree's budget: anyone else could spend another namespace's budget by naming it.
#[test]
fn only_the_gate_and_toolfs_name_budgets() {
    let dir = tmp();
    let mut log = Log::open(config(dir.path())).unwrap();
    let charged = |kind: &str| {
        AppendRequest::parse(
            json!({"scope": "s", "kind": kind, "subject": {"verdict": "allow"},
                   "budgets": [{"key": "victim"}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    };
    let err = log
        .append(charged("query"), Role::Operator(1000))
        .unwrap_err();
    assert!(matches!(err, AppendError::Forbidden(_)), "{err}");
    log.append(charged("decision"), Role::Gate).unwrap();
    log.append(charged("query"), Role::Toolfs).unwrap();
}

/// A subtree at the edge of its rate — refused, then a token refills and one decision is taken,
/// then refused again — is one refusal episode: receipted once, not a pair of receipts per
/// refusal (which would be the flood again, in receiptd's own scope).
#[test]
fn a_subtree_at_the_edge_of_its_rate_is_one_episode() {
    let dir = tmp();
    let mut cfg = config(dir.path());
    cfg.subtree_rate = 100;
    let mut log = Log::open(cfg).unwrap();
    let decision = |i: u64| {
        AppendRequest::parse(
            json!({"scope": "s", "kind": "decision", "subject": {"verdict": "allow", "i": i},
                   "budgets": [{"key": "s"}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    };
    let (mut taken, mut refused, mut i) = (0u64, 0u64, 0u64);
    // Past the burst, until refusals and refills have alternated many times.
    while taken < 260 {
        match log.append(decision(i), Role::Gate) {
            Ok(_) => taken += 1,
            Err(AppendError::Budget(..)) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        i += 1;
    }
    assert!(refused > 0);
    let events = events(&log);
    assert_eq!(
        events.iter().filter(|e| *e == "budget_refused").count(),
        1,
        "{events:?}"
    );
}
