//! `warren approvals`: the operator's live view of the gate's asks, answered from the terminal.
//!
//! On a terminal, as root, the front door asks the gate (over its root-only control socket) for a
//! connection marked `confirmed_tty`: only such a connection may answer `allow session` or
//! `allow always`. Anywhere else it attaches on the operator socket, which answers `allow once`
//! and `deny` only. The view is the gate's `events` stream: blocking reads, never a poll.

use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::process::ExitCode;

use anyhow::{Context, Result};
use tokio::io::AsyncBufReadExt;
use warren_daemon::Dirs;
use warren_daemon::escape::escaped_lines;
use warren_gate::approvals::Shown;

/// The fingerprint prefix a `request` file shows (its `fingerprint` line).
pub fn fingerprint_prefix(request: &str) -> Option<String> {
    request.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("fingerprint")?;
        let word = rest
            .trim_start_matches([':', ' ', '\t'])
            .split_whitespace()
            .next()?;
        Some(word.to_string())
    })
}

/// One field of a `request` file (`session`, `tool`, …): the rest of its line.
pub fn request_field<'a>(request: &'a str, name: &str) -> Option<&'a str> {
    request.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .map(str::trim)
    })
}

/// An operator connection the gate hands out on its root-only control socket: `confirmed_tty`
/// only for the front door's own interactive terminal; `name` is shown as who answered.
pub async fn operator_connection(
    dirs: &Dirs,
    confirmed_tty: bool,
    name: Option<&str>,
) -> Result<warren_9p::Client> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let record = warren_gate::control::ControlRecord {
        version: 1,
        kind: warren_gate::control::RecordKind::Operator,
        confirmed_tty,
        name: name.map(str::to_owned),
        ..Default::default()
    };
    warren_gate::control::hand_over(&dirs.control("gate"), &record, &theirs).with_context(
        || {
            format!(
                "ask the gate at {} for an operator connection",
                dirs.control("gate").display()
            )
        },
    )?;
    ours.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(ours)?;
    Ok(warren_9p::Client::new(stream, 1 << 20).await?)
}

async fn connect(dirs: &Dirs) -> Result<(warren_9p::Client, bool)> {
    let confirmed = std::io::stdin().is_terminal() && nix::unistd::geteuid().is_root();
    if confirmed {
        return Ok((operator_connection(dirs, true, None).await?, true));
    }
    let client = warren_9p::Client::connect_unix(dirs.socket("gate"))
        .await
        .with_context(|| crate::none_answers("gate", &dirs.socket("gate")))?;
    Ok((client, false))
}

/// The verb a typed answer means: `once`, `session`, `always`, `deny`.
pub fn verb(word: &str, request: Option<&str>) -> Result<String, String> {
    match word {
        "once" | "allow-once" => {
            let fp = request
                .and_then(fingerprint_prefix)
                .ok_or("that ask is not on screen (or has no fingerprint)")?;
            Ok(format!("allow once {fp}"))
        }
        "session" => Ok("allow session".into()),
        "always" => Ok("allow always".into()),
        "deny" => Ok("deny".into()),
        other => Err(format!(
            "{other:?}: answer with once, session, always or deny"
        )),
    }
}

/// An open ask as `warren approvals` prints it: the gate's escaped `request` text, with anything
/// the gate let through escaped here all the same (one rule: `warren_daemon::escape`).
fn ask_shown(s: &Shown) -> String {
    let text = escaped_lines(s.request.trim_end());
    // On a terminal, fitted to it: no line wraps into what looks like another field, and
    // nothing scrolls the ask's own lines away (the whole request: `warren cat`).
    let text = match warren_jail::tty::get_winsize(std::io::stdout().as_fd()) {
        Ok([rows, cols, ..]) if std::io::stdout().is_terminal() => {
            crate::asks::fit_to_screen(&text, (rows, cols)).join("\n")
        }
        _ => text,
    };
    format!("\n── ask {} ──\n{text}", s.id)
}

/// A closed ask's line, escaped the same way.
fn closed_shown(id: i64, line: &str) -> String {
    format!("── ask {id} closed: {}", escaped_lines(line))
}

pub fn approvals(dirs: &Dirs) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (client, confirmed) = connect(dirs).await?;
        let root = client.attach("approvals", "").await?;
        println!(
            "warren approvals: live view of the gate's asks ({}).\nAnswer with `<id> once|{}deny`; ^D to quit.",
            if confirmed { "confirmed terminal" } else { "operator socket: allow once and deny only" },
            if confirmed { "session|always|" } else { "" },
        );
        let shown: std::sync::Mutex<std::collections::HashMap<i64, String>> = Default::default();
        let show = |s: &warren_gate::approvals::Shown| {
            // The stream's own listing repeats the asks listed below: each is shown once.
            if shown.lock().expect("shown").insert(s.id, s.request.clone()).is_none() {
                println!("{}", ask_shown(s));
            }
        };
        // The open asks first, before any answer is read: with no terminal (standard input a
        // file, a pipe, /dev/null) the input may end at once, and the view still lists them.
        let open = warren_gate::approvals::list(&root)
            .await
            .map_err(|e| anyhow::anyhow!("listing the gate's open asks: {e}"))?;
        if open.is_empty() {
            println!("no open asks");
        }
        open.iter().for_each(show);
        let view = warren_gate::approvals::approvals(
            &client,
            show,
            |ev| {
                if let warren_gate::approvals::Event::Closed { id, line } = ev {
                    println!("{}", closed_shown(*id, line));
                    shown.lock().expect("shown").remove(id);
                }
                true
            },
        );
        let answers = async {
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Some(line) = lines.next_line().await? {
                let mut words = line.split_whitespace();
                let (Some(id), Some(word)) = (words.next(), words.next()) else { continue };
                let Ok(id) = id.parse::<i64>() else {
                    println!("{id:?} is not an ask id");
                    continue;
                };
                let request = shown.lock().expect("shown").get(&id).cloned();
                match verb(word, request.as_deref()) {
                    Ok(v) => match warren_gate::approvals::answer(&root, id, &v).await {
                        Ok(reply) => println!("ask {id}: {v}: {}", escaped_lines(reply.trim())),
                        Err(e) => println!("ask {id}: {v}: refused: {}", escaped_lines(&e.to_string())),
                    },
                    Err(e) => println!("{e}"),
                }
            }
            let left = shown.lock().expect("shown").len();
            println!("standard input ended: no more answers; {left} ask(s) left open");
            Ok::<(), anyhow::Error>(())
        };
        tokio::select! {
            r = view => r.context("the gate's event stream")?,
            r = answers => r?,
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever a request or an event line holds that must not reach a terminal (ESC
    /// sequences, a bidi override, a carriage return) is escaped; the lines stay lines.
    #[test]
    fn asks_and_closed_lines_are_escaped() {
        let s = Shown {
            id: 4,
            request: "ask 4\ntool sh\u{202E}ll\nargs {\"command\":\"ls\"}\x1b[1A\r\x1b[2Kargs x\n"
                .into(),
        };
        let shown = ask_shown(&s);
        assert_eq!(shown.lines().count(), 5, "{shown}");
        assert!(
            !shown
                .chars()
                .any(|c| c != '\n' && warren_daemon::escape::misleads(c)),
            "{shown:?}"
        );
        let closed = closed_shown(4, "closed 4 answered allow\x1b]0;x\x07");
        assert!(
            !closed.chars().any(warren_daemon::escape::misleads),
            "{closed:?}"
        );
    }

    #[test]
    fn answers_map_to_verbs() {
        let req = "ask 3\nfingerprint 7d64a508fbc365d9\n";
        assert_eq!(
            verb("once", Some(req)).unwrap(),
            "allow once 7d64a508fbc365d9"
        );
        assert!(verb("once", None).is_err());
        assert_eq!(verb("deny", None).unwrap(), "deny");
        assert!(verb("yes", Some(req)).is_err());
        assert_eq!(request_field(req, "ask"), Some("3"));
        assert_eq!(request_field(req, "finger"), None);
    }
}
