//! The gate's rpc files (`decide`, `pending/<id>/ctl`, a written `rules`) answer by the o₀
//! rule of `specs/gate-tree.md`, through the real `warren-gate` daemon over 9P: a read answers from where the first read
//! after the write began, at any offset. A shell that writes through an fd and reads on
//! (`exec 3<>decide; printf … >&3; cat <&3`) reads at the write's end, which is what these reads
//! at offset = request length stand for.

mod common;

use common::*;
use serde_json::json;
use warren_9p::{Errno, Fid, oflags};
use warren_gate::{Answer, Verdict};

/// Writes `request` on `f` at offset 0 and reads the reply at the write's end.
async fn write_then_read_on(f: &Fid, request: &str) -> (Result<u32, Errno>, String) {
    let wrote = f.write(0, request.as_bytes()).await;
    let at = request.len() as u64;
    let reply = f.read_to_end(at).await.expect("read at the write's end");
    (wrote, String::from_utf8_lossy(&reply).into_owned())
}

fn decide_request(tool: &str, args: &serde_json::Value) -> String {
    let args = String::from_utf8(canon(args)).unwrap();
    format!(r#"{{"session":"{S1}","tool":"{tool}","args":{args}}}"#)
}

#[tokio::test]
async fn rpc_files_answer_at_the_writes_end_and_from_zero() {
    let env = Env::up(&[]);
    let op = env.operator().await;

    // decide: the answer at the write's end, then nothing past it.
    let f = decide_fid(&op).await;
    let request = decide_request("shell", &json!({"command": "make"}));
    let (wrote, text) = write_then_read_on(&f, &request).await;
    assert_eq!(wrote, Ok(request.len() as u32));
    let asked: Answer =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("decide reply {text:?}: {e}"));
    assert_eq!(asked.decision, Verdict::Ask);
    let end = request.len() as u64 + text.len() as u64;
    assert!(
        f.read(end, 4096).await.unwrap().is_empty(),
        "nothing past the answer"
    );

    // A second request on the same open resets o₀: a client reading from 0 gets it whole.
    let read_req = decide_request("fs_read", &json!({"path": "a"}));
    f.write(0, read_req.as_bytes()).await.unwrap();
    let again: Answer = serde_json::from_slice(&f.read_to_end(0).await.unwrap()).unwrap();
    assert_eq!(again.decision, Verdict::Allow);

    // A refused request: its error line at the write's end.
    let (wrote, text) = write_then_read_on(&f, "not json").await;
    assert_eq!(wrote, Err(Errno::EINVAL));
    assert!(text.starts_with(r#"{"error":"#), "{text:?}");

    // ctl: the answer's result at the write's end.
    let id = asked.pending.expect("an ask");
    let ctl = op.walk_path(&format!("pending/{id}/ctl")).await.unwrap();
    ctl.open(oflags::RDWR).await.unwrap();
    let (wrote, text) = write_then_read_on(&ctl, "deny").await;
    assert_eq!(wrote, Ok(4));
    assert!(!text.is_empty() && !text.contains("error"), "{text:?}");
    assert_eq!(wait(&op, id).await.decision, Verdict::Deny);

    // rules: a write's result at the write's end, not the snapshot.
    let rules = op.walk_path("rules").await.unwrap();
    rules.open(oflags::RDWR).await.unwrap();
    let (wrote, text) = write_then_read_on(&rules, "allow fs_list\n").await;
    assert!(wrote.is_ok());
    assert!(text.starts_with("added rule "), "{text:?}");
}
