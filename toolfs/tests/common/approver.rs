//! An operator that allows every ask the gate shows, as one watching `events` would. Shared by
//! toolfs's tests (through `common`) and, by `#[path]`, warren's confined_workers.rs.
#![allow(dead_code)]

use std::path::PathBuf;

use warren_9p::{Client, oflags};

/// `pending <id> … fp=<hex> …` → (id, fp).
pub fn pending_event(line: &str) -> Option<(i64, String)> {
    let mut words = line.split_whitespace();
    if words.next()? != "pending" {
        return None;
    }
    let id = words.next()?.parse().ok()?;
    let fp = words.find_map(|w| w.strip_prefix("fp="))?.to_owned();
    Some((id, fp))
}

/// Answers `allow once <fp>` to every ask on the gate's operator socket `sock`; returns when
/// the gate hangs up (or cannot be reached).
pub async fn allow_every_ask(sock: PathBuf) {
    let Ok(c) = Client::connect_unix(&sock).await else {
        return;
    };
    let root = c.attach("approver", "").await.unwrap();
    let events = root.walk(&["events"]).await.unwrap();
    events.open(oflags::RDONLY).await.unwrap();
    let (mut offset, mut buf) = (0u64, Vec::new());
    while let Ok(chunk) = events.read(offset, 8192).await {
        if chunk.is_empty() {
            return;
        }
        offset += chunk.len() as u64;
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            if let Some((id, fp)) = pending_event(&String::from_utf8_lossy(&line)) {
                let verb = format!("allow once {fp}");
                let _ = warren_gate::approvals::answer(&root, id, &verb).await;
            }
        }
    }
}
