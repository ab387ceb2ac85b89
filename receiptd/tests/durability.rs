//! `--durable=fsync` under strace: no append is acknowledged (its Rwrite sent) before an
//! fdatasync of the WAL that started after the append's WAL write finished. The same check over
//! the default mode must find violations, which shows the check can fail.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use common::*;
use warren_proto::receipts::Appender;

const APPENDS: u64 = 40;

/// The Rwrite frame header (size 11, type 119) as `strace -xx` prints it.
const RWRITE: &str = "\"\\x0b\\x00\\x00\\x00\\x77";

/// Acknowledgements that went out with a WAL write not yet covered by a completed fdatasync, and
/// the number of acknowledgements seen.
fn uncovered_acks(trace: &str) -> (usize, usize) {
    // `-xx` prints fd paths in hex too.
    let wal = format!("{}>", strace_hex("-wal"));
    let socket = format!("<{}", strace_hex("socket:"));
    let (mut wal_done, mut synced) = (0usize, 0usize);
    let mut pending_sync: HashMap<&str, usize> = HashMap::new();
    let mut pending_pwrite: HashMap<&str, bool> = HashMap::new();
    let (mut acks, mut uncovered) = (0, 0);
    for line in trace.lines() {
        let Some((tid, call)) = line.split_once(' ') else {
            continue;
        };
        let call = call.trim_start();
        if call.starts_with("pwrite64(") && call.contains(&wal) {
            if call.ends_with("<unfinished ...>") {
                pending_pwrite.insert(tid, true);
            } else {
                wal_done += 1;
            }
        } else if call.starts_with("<... pwrite64 resumed>") && pending_pwrite.remove(tid).is_some()
        {
            wal_done += 1;
        } else if call.starts_with("fdatasync(") && call.contains(&wal) {
            if call.ends_with("<unfinished ...>") {
                pending_sync.insert(tid, wal_done);
            } else if call.ends_with("= 0") {
                synced = synced.max(wal_done);
            }
        } else if call.starts_with("<... fdatasync resumed>") && call.ends_with("= 0") {
            if let Some(covered) = pending_sync.remove(tid) {
                synced = synced.max(covered);
            }
        } else if (call.starts_with("write(")
            || call.starts_with("writev(")
            || call.starts_with("sendmsg(")
            || call.starts_with("sendto("))
            && call.contains(&socket)
            && call.contains(RWRITE)
        {
            acks += 1;
            if synced < wal_done {
                uncovered += 1;
            }
        }
    }
    (acks, uncovered)
}

fn strace_hex(s: &str) -> String {
    s.bytes().map(|b| format!("\\x{b:02x}")).collect()
}

fn traced_run(base: &Path, mode: &str) -> String {
    let trace = base.join("trace.txt");
    let mut cmd = Command::new("strace");
    cmd.args([
        "-f",
        "-qq",
        "-y",
        "-xx",
        "-s",
        "8",
        "-e",
        "trace=pwrite64,fdatasync,fsync,write,writev,sendmsg,sendto",
        "-o",
    ])
    .arg(&trace)
    .arg(env!("CARGO_BIN_EXE_warren-receiptd"));
    let daemon = daemon_cmd(
        base,
        &[
            "--durable",
            mode,
            "--checkpoint-rows",
            "1000000",
            "--checkpoint-ms",
            "100000000",
        ],
    );
    cmd.args(daemon.get_args()).env("WARREN_LOG", "warn");
    let d = Daemon::spawn(cmd, base);
    rt().block_on(async {
        let appender = Appender::connect(&d.socket).await.unwrap();
        for i in 0..APPENDS {
            appender.append(&body("s", "cap", i)).await.unwrap();
        }
    });
    // SIGTERM the traced daemon (strace's child), then let strace finish writing.
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", d.child.id())).unwrap();
    let pid: i32 = children
        .split_whitespace()
        .next()
        .expect("strace's child")
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut d = d;
    assert!(d.child.wait().unwrap().success());
    std::fs::read_to_string(&trace).unwrap()
}

/// strace, a peer: missing is a failure.
fn need_strace() {
    let ok = Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "strace is not installed (scripts/install-test-deps installs it)"
    );
}

#[test]
fn durable_fsync_acknowledges_only_after_the_covering_fdatasync() {
    need_strace();
    let dir = tmp();
    let trace = traced_run(dir.path(), "fsync");
    let (acks, uncovered) = uncovered_acks(&trace);
    assert!(
        acks as u64 >= APPENDS,
        "saw {acks} acknowledgements in the trace"
    );
    assert_eq!(
        uncovered, 0,
        "{uncovered} of {acks} acknowledgements preceded their fdatasync"
    );
}

#[test]
fn the_check_finds_early_acknowledgements_in_the_default_mode() {
    need_strace();
    let dir = tmp();
    let trace = traced_run(dir.path(), "wal");
    let (acks, uncovered) = uncovered_acks(&trace);
    assert!(
        acks as u64 >= APPENDS,
        "saw {acks} acknowledgements in the trace"
    );
    assert!(
        uncovered > 0,
        "the default mode acknowledges at WAL commit, before the fdatasync"
    );
}
