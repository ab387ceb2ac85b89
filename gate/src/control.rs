//! The control socket (`<runtime>/gate.ctl`, root peers in our pid namespace only): a trusted peer
//! hands the gate one end of a socketpair with a record saying who is on the other end. The record
//! is the connection's whole standing; nothing said on the connection later widens it.
//!
//! Records (JSON, `warren_daemon::handoff` framing, one fd: the connection):
//! - `{"version":1,"kind":"namespace","session":…,"namespace":…,"descendants":[…],"lineage":[…]}`
//!   (nsd; `kind` may be left out) — sees and answers its listed strict descendants' asks,
//!   `allow once`/`deny` only; `lineage` is the namespace's chain up to its subtree's root
//!   (`warren_proto::lineage`), checked and kept (it widens nothing it sees);
//! - `{"version":1,"kind":"operator","confirmed_tty":true}` (the front door, for
//!   `warren approvals` or `warren run` on a terminal) — the only kind of connection that may
//!   answer `allow session` or `allow always`; an optional `"name"` (e.g. `"warren run"`) is
//!   shown as who answered;
//! - `{"version":1,"kind":"channel","name":"peer:<fingerprint>","sessions":[…],"cap":"write"}`
//!   (nsd, for a peer whose entry says `asks:remote`) — a named, capped answer channel: sees the
//!   listed sessions' asks only, answers `allow once`/`deny` only, and allows no call above its
//!   `cap`, which may itself be no higher than `write` ([`CHANNEL_CAP_MAX`]);
//!   receipts name it as who answered;
//! - `{"version":1,"kind":"daemon","name":"toolfs"}`, or another of [`DECIDING_DAEMONS`] (the supervisor) — `decide`,
//!   `wait`, `withdraw`.
//!
//! Each record is answered with one framed record (same framing): `ok` or `error: <why>`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tokio::net::UnixListener;
use warren_9p::Limits;
use warren_daemon::accept::{next_peer, refusal, root_only};

use warren_proto::control::reply_line;
pub use warren_proto::gate::{
    CHANNEL_CAP_MAX, ControlRecord, RECORD_VERSION, RecordKind, check_session, hand_over,
};

use crate::gate::Gate;
use crate::scope::Scope;
use crate::tree::GateTree;

/// The most descendants one record may name.
pub const MAX_DESCENDANTS: usize = 4096;

/// The scope a sound record gives its connection.
pub fn scope_of(record: &ControlRecord) -> Result<Scope, String> {
    if record.version != RECORD_VERSION {
        return Err(format!(
            "record version {} (this gate speaks {RECORD_VERSION})",
            record.version
        ));
    }
    let no_extras = |what: &str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(format!("a {what} record takes no other fields"))
        }
    };
    match record.kind {
        RecordKind::Namespace => {
            no_extras(
                "namespace",
                !record.confirmed_tty && record.name.is_none() && channel_fields_unset(record),
            )?;
            let session = record
                .session
                .clone()
                .ok_or("a namespace record needs its session")?;
            check_session(&session)?;
            let namespace = record
                .namespace
                .clone()
                .ok_or("a namespace record needs its namespace id")?;
            if namespace.is_empty()
                || namespace.len() > 128
                || namespace.chars().any(char::is_control)
            {
                return Err("namespace id must be 1 to 128 printable characters".into());
            }
            if record.descendants.len() > MAX_DESCENDANTS {
                return Err(format!("more than {MAX_DESCENDANTS} descendants"));
            }
            for d in &record.descendants {
                check_session(d)?;
            }
            if record.descendants.contains(&session) {
                return Err("a namespace cannot be its own descendant".into());
            }
            if let Some(l) = &record.lineage {
                l.check(&session, &namespace)?;
            }
            Ok(Scope::Namespace {
                session,
                namespace,
                descendants: record.descendants.iter().cloned().collect(),
            })
        }
        RecordKind::Operator => {
            no_extras(
                "operator",
                record.session.is_none()
                    && record.namespace.is_none()
                    && record.descendants.is_empty()
                    && record.lineage.is_none()
                    && channel_fields_unset(record),
            )?;
            // `name` says which front-door command answers (e.g. `warren run`); receipts
            // show it as who answered.
            let label = match &record.name {
                None => "operator".to_owned(),
                Some(name) => {
                    check_label(name, MAX_NAME)?;
                    format!("operator: {name}")
                }
            };
            Ok(Scope::Operator {
                confirmed_tty: record.confirmed_tty,
                label,
            })
        }
        RecordKind::Daemon => {
            no_extras(
                "daemon",
                record.session.is_none()
                    && record.namespace.is_none()
                    && record.descendants.is_empty()
                    && record.lineage.is_none()
                    && !record.confirmed_tty
                    && channel_fields_unset(record),
            )?;
            let name = record
                .name
                .clone()
                .ok_or("a daemon record needs its name")?;
            // The daemons whose calls the gate decides: warren's own tools, the MCP servers'
            // tools (`mcp:<server>:<tool>`, never a core tool's name), the egress proxy's
            // connections (`net:<host>:<port>`) and a namespace's model calls (a core name
            // of the tier table: the gate decides them by name and digest alone).
            if !DECIDING_DAEMONS.contains(&name.as_str()) {
                return Err(format!(
                    "daemon {name:?}: only {} ask the gate",
                    DECIDING_DAEMONS.join(", ")
                ));
            }
            Ok(Scope::Daemon { name })
        }
        RecordKind::Channel => {
            no_extras(
                "channel",
                record.session.is_none()
                    && record.namespace.is_none()
                    && record.descendants.is_empty()
                    && record.lineage.is_none()
                    && !record.confirmed_tty,
            )?;
            let name = record
                .name
                .clone()
                .ok_or("a channel record needs its name")?;
            check_channel_name(&name)?;
            let cap = record.cap.ok_or("a channel record needs its cap")?;
            if cap > CHANNEL_CAP_MAX {
                return Err(format!(
                    "a channel's cap is at most {CHANNEL_CAP_MAX} (asked for {cap})"
                ));
            }
            if record.sessions.is_empty() || record.sessions.len() > MAX_DESCENDANTS {
                return Err(format!(
                    "a channel record names 1 to {MAX_DESCENDANTS} sessions"
                ));
            }
            for s in &record.sessions {
                check_session(s)?;
            }
            Ok(Scope::Channel {
                name,
                sessions: record.sessions.iter().cloned().collect(),
                cap,
            })
        }
    }
}

fn channel_fields_unset(record: &ControlRecord) -> bool {
    record.sessions.is_empty() && record.cap.is_none()
}

/// A channel's name is `<kind>:<id>` (e.g. `peer:<fingerprint>`, `mcp-client:<namespace>`),
/// printable, and never one the other connections' labels use: a receipt's `answered_by` must
/// not pass it off as the operator. The kind is lowercase letters, `-` between them.
fn check_channel_name(name: &str) -> Result<(), String> {
    check_label(name, MAX_CHANNEL_NAME)?;
    let kind = name.split_once(':').map_or("", |(k, _)| k);
    if kind.is_empty()
        || !kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
        || kind.starts_with('-')
        || kind.ends_with('-')
        || ["operator", "daemon", "namespace"].contains(&kind)
    {
        return Err(format!(
            "a channel name is <kind>:<id> with a kind of lowercase letters (and `-` between them) other than operator, daemon or namespace (got {name:?})"
        ));
    }
    Ok(())
}

/// The daemons that may hand the gate calls to decide.
pub const DECIDING_DAEMONS: [&str; 4] = ["toolfs", "mcpfs", "netproxy", "llmfs"];

/// The most bytes an operator record's `name` may have.
pub const MAX_NAME: usize = 64;

/// The most bytes a channel record's `name` may have (`peer:SHA256:<64 hex>` fits).
pub const MAX_CHANNEL_NAME: usize = 128;

fn check_label(name: &str, max: usize) -> Result<(), String> {
    if name.is_empty() || name.len() > max || name.chars().any(|c| c.is_control()) {
        return Err(format!(
            "a name must be 1 to {max} bytes of printable characters"
        ));
    }
    Ok(())
}

/// Serves the control socket forever: only root in our own pid namespace hands connections over.
pub async fn serve_control(gate: Arc<Gate>, listener: UnixListener, limits: Limits) {
    loop {
        let sock = next_peer(&listener, "control socket", |s| {
            refusal(s.as_fd(), root_only)
        })
        .await;
        let gate = gate.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            loop {
                let (record, fds) = match warren_daemon::handoff::recv_async(&sock).await {
                    Ok(got) => got,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return,
                    Err(e) => {
                        tracing::warn!("control connection: {e}; closing it");
                        return;
                    }
                };
                let result = accept(&gate, &record, fds, &limits);
                if let Err(msg) = &result {
                    tracing::warn!("handoff refused: {msg}");
                }
                let line = reply_line(&result);
                if let Err(e) =
                    warren_daemon::handoff::send_async(&sock, line.as_bytes(), &[]).await
                {
                    tracing::warn!("control connection: cannot answer: {e}");
                    return;
                }
            }
        });
    }
}

fn accept(
    gate: &Arc<Gate>,
    record: &[u8],
    fds: Vec<OwnedFd>,
    limits: &Limits,
) -> Result<(), String> {
    let (record, stream): (ControlRecord, UnixStream) =
        warren_proto::control::one_connection(record, fds)?;
    let scope = scope_of(&record)?;
    let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| e.to_string())?;
    let label = scope.label();
    let tree = Arc::new(GateTree::new(gate.clone(), scope));
    let limits = limits.clone();
    tokio::spawn(async move {
        match warren_9p::serve(tree, stream, limits).await {
            Ok(()) => tracing::info!(peer = %label, "handed-over connection closed"),
            Err(e) => tracing::info!(peer = %label, "handed-over connection ended: {e}"),
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(c: char) -> String {
        c.to_string().repeat(32)
    }

    #[test]
    fn a_channel_name_is_a_lowercase_kind_and_an_id() {
        for ok in ["peer:SHA256:ab", "mcp-client:7"] {
            assert!(check_channel_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "operator:x",
            "namespace:7",
            "daemon:toolfs",
            "-mcp:7",
            "mcp-:7",
            "Mcp:7",
            "mcp client:7",
            ":7",
            "nokind",
        ] {
            assert!(check_channel_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_parse_into_scopes() {
        let ns = ControlRecord {
            version: 1,
            session: Some(s('a')),
            namespace: Some("n".into()),
            descendants: vec![s('b')],
            ..Default::default()
        };
        assert!(matches!(scope_of(&ns).unwrap(), Scope::Namespace { .. }));
        let op = ControlRecord {
            version: 1,
            kind: RecordKind::Operator,
            confirmed_tty: true,
            ..Default::default()
        };
        assert_eq!(
            scope_of(&op).unwrap(),
            Scope::Operator {
                confirmed_tty: true,
                label: "operator".into()
            }
        );
        let named = ControlRecord {
            version: 1,
            kind: RecordKind::Operator,
            name: Some("warren run".into()),
            ..Default::default()
        };
        assert_eq!(
            scope_of(&named).unwrap(),
            Scope::Operator {
                confirmed_tty: false,
                label: "operator: warren run".into()
            }
        );
        let d = ControlRecord {
            version: 1,
            kind: RecordKind::Daemon,
            name: Some("toolfs".into()),
            ..Default::default()
        };
        assert!(matches!(scope_of(&d).unwrap(), Scope::Daemon { .. }));
    }

    #[test]
    fn unsound_records_are_refused() {
        let base = ControlRecord {
            version: 1,
            session: Some(s('a')),
            namespace: Some("n".into()),
            ..Default::default()
        };
        for bad in [
            ControlRecord {
                version: 2,
                ..base.clone()
            },
            ControlRecord {
                session: Some("xyz".into()),
                ..base.clone()
            },
            ControlRecord {
                descendants: vec![s('a')],
                ..base.clone()
            },
            ControlRecord {
                confirmed_tty: true,
                ..base.clone()
            },
            ControlRecord {
                namespace: None,
                ..base.clone()
            },
            ControlRecord {
                version: 1,
                kind: RecordKind::Operator,
                session: Some(s('a')),
                ..Default::default()
            },
            ControlRecord {
                version: 1,
                kind: RecordKind::Daemon,
                name: Some("nsd".into()),
                ..Default::default()
            },
            ControlRecord {
                version: 1,
                kind: RecordKind::Operator,
                name: Some("line\nbreak".into()),
                ..Default::default()
            },
            ControlRecord {
                version: 1,
                kind: RecordKind::Operator,
                name: Some(String::new()),
                ..Default::default()
            },
        ] {
            assert!(scope_of(&bad).is_err(), "{bad:?}");
        }
        assert!(
            serde_json::from_str::<ControlRecord>(r#"{"version":1,"session":"a","bogus":1}"#)
                .is_err()
        );
    }
}
