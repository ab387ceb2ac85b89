//! An operator that allows every ask the gate shows, as one watching `events` would (toolfs's
//! gated stack and warren's front-door tests).

use std::path::PathBuf;

use warren_9p::{Client, oflags};

/// `pending <id> … fp=<hex> …` → (id, fp).
fn pending_event(line: &str) -> Option<(i64, String)> {
    let mut words = line.split_whitespace();
    if words.next()? != "pending" {
        return None;
    }
    let id = words.next()?.parse().ok()?;
    let fp = words.find_map(|w| w.strip_prefix("fp="))?.to_owned();
    Some((id, fp))
}

/// Answers `allow once <fp>` to every ask on the gate's operator socket `sock`; returns when
/// the gate hangs up. `ready` is told once it follows `events` and has answered the asks that
/// were open before it did (a reader of `events` sees only what comes after it opens it).
pub async fn allow_every_ask(sock: PathBuf, ready: Option<std::sync::mpsc::Sender<()>>) {
    let c = Client::connect_unix(&sock).await.unwrap_or_else(|e| {
        panic!(
            "the approver cannot reach the gate at {}: {e}",
            sock.display()
        )
    });
    let root = c.attach("approver", "").await.unwrap();
    let events = root.walk(&["events"]).await.unwrap();
    events.open(oflags::RDONLY).await.unwrap();
    answer_open_asks(&root).await;
    if let Some(ready) = ready {
        let _ = ready.send(());
    }
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

/// Answers `allow once <fp>` to every ask already pending.
async fn answer_open_asks(root: &warren_9p::Fid) {
    let Ok(dir) = root.walk(&["pending"]).await else {
        return;
    };
    if dir.open(oflags::RDONLY).await.is_err() {
        return;
    }
    for entry in dir.readdir_all().await.unwrap_or_default() {
        let Ok(id) = entry.name.parse::<i64>() else {
            continue;
        };
        let Ok(request) = root.walk(&["pending", &entry.name, "request"]).await else {
            continue;
        };
        if request.open(oflags::RDONLY).await.is_err() {
            continue;
        }
        let text =
            String::from_utf8_lossy(&request.read_to_end(0).await.unwrap_or_default()).into_owned();
        let fp = text
            .lines()
            .find_map(|l| l.strip_prefix("fingerprint "))
            .map(str::trim);
        if let Some(fp) = fp {
            let _ = warren_gate::approvals::answer(root, id, &format!("allow once {fp}")).await;
        }
    }
}
