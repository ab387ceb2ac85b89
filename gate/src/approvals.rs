//! What `warren approvals` needs: the open asks (each as its escaped `request` text), answering
//! one, and the live event stream. The front door owns the terminal; this owns the files.
//!
//! Files used (see `specs/gate-tree.md`): `pending/` (list), `pending/<id>/request` (show),
//! `pending/<id>/ctl` (answer), `events` (blocking reads: `pending <id> …` when an ask appears,
//! `closed <id> <state> <outcome> <basis>` when one closes).

use warren_9p::{Client, Errno, Fid, oflags};

/// One open ask as a person sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    pub id: i64,
    /// The `request` file: escaped, with the byte length and fingerprint prefix.
    pub request: String,
}

/// A live event, parsed from one `events` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new ask: show it (read its `request`).
    Pending { id: i64, line: String },
    /// An ask closed: take it off the screen.
    Closed { id: i64, line: String },
}

impl Event {
    pub fn parse(line: &str) -> Option<Event> {
        let mut words = line.split_whitespace();
        let kind = words.next()?;
        let id = words.next()?.parse().ok()?;
        match kind {
            "pending" => Some(Event::Pending {
                id,
                line: line.to_owned(),
            }),
            "closed" => Some(Event::Closed {
                id,
                line: line.to_owned(),
            }),
            _ => None,
        }
    }
}

/// The open asks this connection may see, oldest first.
pub async fn list(root: &Fid) -> Result<Vec<Shown>, Errno> {
    let dir = root.walk(&["pending"]).await?;
    dir.open(oflags::RDONLY).await?;
    let mut ids: Vec<i64> = dir
        .readdir_all()
        .await?
        .into_iter()
        .filter_map(|e| e.name.parse().ok())
        .collect();
    ids.sort();
    let mut out = Vec::new();
    for id in ids {
        match show(root, id).await {
            Ok(s) => out.push(s),
            Err(Errno::ENOENT) => {} // closed since the listing
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// One ask's `request` text.
pub async fn show(root: &Fid, id: i64) -> Result<Shown, Errno> {
    let f = root.walk(&["pending", &id.to_string(), "request"]).await?;
    f.open(oflags::RDONLY).await?;
    let text = f.read_to_end(0).await?;
    Ok(Shown {
        id,
        request: String::from_utf8_lossy(&text).into_owned(),
    })
}

/// Writes an answer (`allow once <fp-prefix>`, `allow session`, `allow always`, `deny`). On a
/// refusal the error carries the gate's message.
pub async fn answer(root: &Fid, id: i64, verb: &str) -> Result<String, String> {
    let f = root
        .walk(&["pending", &id.to_string(), "ctl"])
        .await
        .map_err(|e| format!("ask {id}: {e}"))?;
    f.open(oflags::RDWR)
        .await
        .map_err(|e| format!("ask {id}: {e}"))?;
    match f.write(0, verb.as_bytes()).await {
        Ok(_) => Ok(
            String::from_utf8_lossy(&f.read_to_end(0).await.unwrap_or_default())
                .trim()
                .to_owned(),
        ),
        Err(e) => {
            let msg = f.read_to_end(0).await.unwrap_or_default();
            let msg: serde_json::Value = serde_json::from_slice(&msg).unwrap_or_default();
            Err(format!("{e}: {}", msg["error"].as_str().unwrap_or("")))
        }
    }
}

/// The live view: shows every open ask, then calls `on_event` for each event as it happens
/// (blocking reads of `events`, never a poll) until `on_event` returns false or the connection ends.
pub async fn approvals(
    client: &Client,
    mut on_shown: impl FnMut(&Shown),
    mut on_event: impl FnMut(&Event) -> bool,
) -> Result<(), Errno> {
    let root = client.attach("approvals", "").await?;
    // Open the stream first so nothing between the listing and the first read is missed.
    let events = root.walk(&["events"]).await?;
    events.open(oflags::RDONLY).await?;
    for s in list(&root).await? {
        on_shown(&s);
    }
    let mut offset = 0u64;
    let mut partial = String::new();
    loop {
        let chunk = events.read(offset, 64 * 1024).await?;
        if chunk.is_empty() {
            return Ok(());
        }
        offset += chunk.len() as u64;
        partial.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(nl) = partial.find('\n') {
            let line: String = partial.drain(..=nl).collect();
            if let Some(ev) = Event::parse(line.trim_end()) {
                if let Event::Pending { id, .. } = &ev
                    && let Ok(s) = show(&root, *id).await
                {
                    on_shown(&s);
                }
                if !on_event(&ev) {
                    return Ok(());
                }
            }
        }
    }
}
