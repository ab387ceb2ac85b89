//! A waiting call's ask offered to the client's user through MCP elicitation (`--client-asks`,
//! `warren mcp serve --elicit`): a low-trust channel. nsd mounts at `--client-asks` the gate tree
//! of a capped channel that sees this namespace's own asks only and may answer `allow once` up to
//! the `write` tier, or `deny`; the gate enforces the cap and names the channel in the receipt.
//! Here an ask is offered only when the gate's own `request` file says this channel may allow it
//! (its `answer` line), so an `exec`, `network` or `destructive` ask is never offered: it stays
//! with the operator. A decline or cancel leaves the ask open for the operator too.
//! docs/mcp.md ("Asks offered to the client's user").

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::ElicitationMode;
use rmcp::{Peer, RoleServer};

/// How often a waiting call looks for its ask on the channel.
const POLL: Duration = Duration::from_millis(200);
/// The most characters of a call's arguments shown to the client's user.
const ARGS_SHOWN: usize = 1000;

/// The channel's gate tree, and the asks already offered (each at most once).
#[derive(Clone)]
pub struct ClientAsks {
    root: PathBuf,
    offered: Arc<Mutex<HashSet<String>>>,
}

/// An open ask as the channel's `request` file shows it (every value escaped by the gate).
#[derive(Debug, PartialEq)]
struct Ask {
    id: String,
    tool: String,
    tier: String,
    fingerprint: String,
    args: String,
    /// The gate's `answer` line for this channel: `allow once <fp> | deny` when the channel may
    /// allow it, `deny (…)` when it is above the cap.
    answer: String,
}

impl Ask {
    fn parse(id: &str, request: &str) -> Option<Ask> {
        let field = |name: &str| {
            request
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .map(str::to_owned)
        };
        (field("state")? == "open").then_some(())?;
        Some(Ask {
            id: id.to_owned(),
            tool: field("tool")?,
            tier: field("tier")?,
            fingerprint: field("fingerprint")?,
            args: field("args")?,
            answer: field("answer")?,
        })
    }

    /// Whether the gate says this channel may allow it (never above `write`; the gate refuses an
    /// `allow once` above its cap in any case).
    ///
    /// An ask whose arguments are longer than [`ARGS_SHOWN`] is not offered either: the user
    /// would see only their start, and canonical JSON sorts keys, so a long `content` would
    /// hide the `path` after it. The operator, who sees them whole, answers it.
    fn allowable(&self) -> bool {
        self.answer.starts_with("allow once ")
            && matches!(self.tier.as_str(), "read" | "write")
            && self.args.chars().count() <= ARGS_SHOWN
    }

    /// Whether it is the ask of a call of `tool` with `canonical` arguments (RFC 8785 bytes,
    /// as toolfs hands the gate).
    fn is_of(&self, tool: &str, canonical: &[u8]) -> bool {
        self.tool == warren_daemon::escape::escape(tool)
            && warren_daemon::escape::unescape(&self.args).is_ok_and(|a| a == canonical)
    }

    /// What the client's user reads: the tool, its tier and its arguments, whole (escaped by
    /// the gate; an ask with longer ones is not offered: [`Ask::allowable`]).
    fn message(&self, called_as: &str) -> String {
        let args = &self.args;
        format!(
            "warren: the call of {} waits for approval (gate ask {}).\n\
             tool: {}\ntier: {}\narguments: {args}\n\
             Allow this one call once, or deny it. Declining leaves it to warren's operator; \
             exec, network and destructive calls are never offered here.",
            warren_daemon::escape::escape(called_as),
            self.id,
            self.tool,
            self.tier,
        )
    }
}

/// The form the client shows: one choice, allow once or deny.
fn schema() -> ElicitationSchema {
    serde_json::from_value(serde_json::json!({
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": "Decision",
                "description": "allow_once: this one call runs; deny: it is refused",
                "enum": ["allow_once", "deny"],
            }
        },
        "required": ["decision"],
    }))
    .expect("a valid elicitation schema")
}

/// The line written to the ask's `ctl` for the user's accepted form, if it holds a decision.
fn answer_line(ask: &Ask, content: Option<&serde_json::Value>) -> Option<String> {
    match content?.get("decision")?.as_str()? {
        "allow_once" => Some(format!("allow once {}", ask.fingerprint)),
        "deny" => Some("deny".to_owned()),
        _ => None,
    }
}

impl ClientAsks {
    pub fn new(root: PathBuf) -> ClientAsks {
        ClientAsks {
            root,
            offered: Arc::default(),
        }
    }

    /// The open ask of the call of `tool` with `canonical` arguments, not offered before.
    fn find(&self, tool: &str, canonical: &[u8]) -> Option<Ask> {
        let pending = self.root.join("pending");
        let mut ids: Vec<String> = std::fs::read_dir(&pending)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        ids.sort();
        let offered = self.offered.lock().unwrap_or_else(|e| e.into_inner());
        ids.into_iter()
            .filter(|id| !offered.contains(id))
            .filter_map(|id| {
                let request = std::fs::read_to_string(pending.join(&id).join("request")).ok()?;
                Ask::parse(&id, &request)
            })
            .find(|ask| ask.is_of(tool, canonical))
    }

    /// Writes `line` to the ask's `ctl` and reads the gate's result back (an rpc file).
    fn answer(root: &Path, id: &str, line: &str) -> std::io::Result<String> {
        let mut ctl = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(root.join("pending").join(id).join("ctl"))?;
        ctl.write_all(format!("{line}\n").as_bytes())?;
        let mut result = String::new();
        ctl.read_to_string(&mut result)?;
        Ok(result)
    }

    /// While the call of `tool` (`called_as` to the client) with `args` waits: finds its ask on
    /// the channel and, if the channel may allow it, asks the client's user and writes the
    /// answer. Returns when that is done or the ask is not the channel's to allow; the caller
    /// drops this future when the call ends.
    pub async fn offer(
        self,
        peer: Peer<RoleServer>,
        called_as: String,
        tool: String,
        args: Vec<u8>,
    ) {
        let Ok(canonical) = serde_json::from_slice::<serde_json::Value>(&args)
            .map_err(|_| ())
            .and_then(|v| warren_jcs::value_to_vec(&v).map_err(|_| ()))
        else {
            return;
        };
        let canonical: Arc<[u8]> = canonical.into();
        let ask = loop {
            let (this, tool, canonical) = (self.clone(), tool.clone(), canonical.clone());
            if let Ok(Some(ask)) =
                tokio::task::spawn_blocking(move || this.find(&tool, &canonical)).await
            {
                break ask;
            }
            tokio::time::sleep(POLL).await;
        };
        self.offered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ask.id.clone());
        if !ask.allowable() {
            // Above the channel's cap: the operator's alone, never put to the client's user.
            return;
        }
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: ask.message(&called_as),
            requested_schema: schema(),
        };
        let reply = match peer.create_elicitation(params).await {
            Ok(reply) => reply,
            Err(e) => {
                eprintln!("warren-mcp-server: ask {}: elicitation failed: {e}", ask.id);
                return;
            }
        };
        if reply.action != ElicitationAction::Accept {
            // Declined or cancelled: the ask stays open for the operator.
            return;
        }
        let Some(line) = answer_line(&ask, reply.content.as_ref()) else {
            eprintln!(
                "warren-mcp-server: ask {}: the client's answer holds no decision",
                ask.id
            );
            return;
        };
        let root = self.root.clone();
        let id = ask.id.clone();
        match tokio::task::spawn_blocking(move || ClientAsks::answer(&root, &id, &line)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!(
                "warren-mcp-server: ask {}: the gate refused the client's answer: {e}",
                ask.id
            ),
            Err(e) => eprintln!("warren-mcp-server: ask {}: {e}", ask.id),
        }
    }
}

/// Whether the client declared form elicitation at initialize.
pub fn client_elicits(peer: &Peer<RoleServer>) -> bool {
    peer.supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUEST: &str = "ask 7\nsession 0123\nnamespace 3\ncommand x\nparents -\nsubtree 0123\n\
        subtree_open_asks 1\ntool fs_write\ntier write\nbasis default:write\ncontext -\n\
        fingerprint 0011223344556677\nbytes 29\nargs {\"content\":\"y\\\\n\",\"path\":\"/w/x\"}\n\
        state open\noutcome -\nexpires 2026-12-05T13:40:00Z (in 5m)\n\
        answer allow once 0011223344556677 | deny\n";

    #[test]
    fn an_ask_is_matched_by_tool_and_canonical_arguments_and_offered_only_up_to_write() {
        let ask = Ask::parse("7", REQUEST).unwrap();
        assert!(ask.is_of("fs_write", br#"{"content":"y\n","path":"/w/x"}"#));
        assert!(!ask.is_of("fs_write", br#"{"content":"z","path":"/w/x"}"#));
        assert!(!ask.is_of("fs_edit", br#"{"content":"y\n","path":"/w/x"}"#));
        assert!(ask.allowable());
        let exec = REQUEST.replace("tier write", "tier exec").replace(
            "answer allow once 0011223344556677 | deny",
            "answer deny (allowing it is this host's operator's)",
        );
        assert!(!Ask::parse("7", &exec).unwrap().allowable());
        // Even were the gate to offer `allow once`, an exec ask is not put to the client.
        let lying = REQUEST.replace("tier write", "tier exec");
        assert!(!Ask::parse("7", &lying).unwrap().allowable());
        assert!(Ask::parse("7", &REQUEST.replace("state open", "state answered")).is_none());
    }

    /// Canonical JSON sorts keys: a long `content` comes before `path`, so a cut would hide
    /// where the write goes. Such an ask is not offered; a short one is shown whole.
    #[test]
    fn an_ask_is_offered_only_when_its_arguments_are_shown_whole() {
        let long = REQUEST.replace(
            r#"args {"content":"y\\n","path":"/w/x"}"#,
            &format!(
                r#"args {{"content":"{}","path":"/w/.git/hooks/pre-commit"}}"#,
                "a".repeat(ARGS_SHOWN)
            ),
        );
        assert_ne!(long, REQUEST);
        assert!(!Ask::parse("7", &long).unwrap().allowable());
        let short = Ask::parse("7", REQUEST).unwrap();
        assert!(short.allowable());
        assert!(short.message("fs_write").contains(r#""path":"/w/x""#));
    }

    #[test]
    fn the_form_has_one_decision_and_only_its_two_values_answer() {
        let schema = serde_json::to_value(schema()).unwrap();
        assert_eq!(
            schema["properties"]["decision"]["enum"],
            serde_json::json!(["allow_once", "deny"])
        );
        let ask = Ask::parse("7", REQUEST).unwrap();
        let line = |v| answer_line(&ask, Some(&v));
        assert_eq!(
            line(serde_json::json!({"decision": "allow_once"})).as_deref(),
            Some("allow once 0011223344556677")
        );
        assert_eq!(
            line(serde_json::json!({"decision": "deny"})).as_deref(),
            Some("deny")
        );
        assert_eq!(line(serde_json::json!({"decision": "allow always"})), None);
        assert_eq!(answer_line(&ask, None), None);
    }
}
