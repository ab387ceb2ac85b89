//! `warren ps [--all] [--json]` and `warren ns ID`: the live namespaces as nsd's `/ns` shows them
//! (`<id>/status`, `<id>/info`, `<id>/spec`), read over the operator socket.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use serde_json::{Value, json};
use warren_daemon::Dirs;
use warren_daemon::escape::{escape, escaped_lines, json_line};

use crate::namespaces::{Listed, NsTree};

/// One namespace's `info` file (`key value…` lines, words quoted as in specs), parsed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Info {
    pub origin: Option<String>,
    pub argv: Vec<String>,
    /// Unix seconds at start.
    pub started: Option<u64>,
    pub session: Option<String>,
    /// `(server, path)` of each 9P mount.
    pub mounts: Vec<(String, String)>,
    pub tools: Vec<String>,
}

impl Info {
    pub fn parse(text: &str) -> Info {
        let mut info = Info::default();
        for line in text.lines() {
            let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
            let words = || warren_ns::spec::split_command(rest).unwrap_or_default();
            match key {
                "origin" => info.origin = Some(rest.to_owned()),
                "argv" => info.argv = words(),
                "started" => info.started = rest.trim().parse().ok(),
                "session" => info.session = Some(rest.to_owned()),
                "mount" => {
                    if let [server, path] = words().as_slice() {
                        info.mounts.push((server.clone(), path.clone()));
                    }
                }
                "tool" => info.tools.extend(words()),
                // Lines this version does not know are shown by `warren ns`, not guessed at.
                _ => {}
            }
        }
        info
    }
}

/// Seconds as `3d04h`, `2h05m`, `4m07s`, `9s`.
fn uptime(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn row_json(n: &Listed, info: &Info) -> Value {
    json!({
        "id": n.id,
        "status": n.status,
        "holder": n.holder(),
        "origin": info.origin,
        "argv": info.argv,
        "started": info.started,
        "uptime_secs": info.started.map(|t| now_secs().saturating_sub(t)),
        "session": info.session,
        "mounts": info.mounts.iter().map(|(s, p)| json!({"server": s, "path": p})).collect::<Vec<_>>(),
        "tools": info.tools,
    })
}

fn row_text(n: &Listed, info: &Info) -> String {
    let command = if info.argv.is_empty() {
        "-".to_owned()
    } else {
        info.argv
            .iter()
            .map(|w| warren_ns::spec::quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Everything in a row but the id came from a namespace or its spec: escaped (one rule,
    // `warren_daemon::escape`), so no word can hide, reverse or forge a row or a column.
    let state = escape(n.status.split_whitespace().next().unwrap_or("?"));
    let up = match (n.is_running(), info.started) {
        (true, Some(t)) => uptime(now_secs().saturating_sub(t)),
        _ => "-".into(),
    };
    let mounts = if info.mounts.is_empty() {
        "-".to_owned()
    } else {
        info.mounts
            .iter()
            .map(|(_, p)| escape(p))
            .collect::<Vec<_>>()
            .join(",")
    };
    let tools = if info.tools.is_empty() {
        "-".to_owned()
    } else {
        escape(&info.tools.join(","))
    };
    format!(
        "{:<5} {state:<8} {up:<7} {mounts:<16} {tools:<20} {command}",
        n.id
    )
}

pub fn ps(dirs: &Dirs, all: bool, json: bool) -> Result<ExitCode> {
    let rows = crate::namespaces::block_on(async {
        let tree = NsTree::connect(dirs).await?;
        let mut rows = Vec::new();
        for n in tree.list().await? {
            if !(all || n.is_running() || n.status == "created") {
                continue;
            }
            // An nsd without `info` still lists its namespaces, with what status says.
            let info = tree
                .read(n.id, "info")
                .await
                .map(|t| Info::parse(&t))
                .unwrap_or_default();
            rows.push((n, info));
        }
        Ok(rows)
    })?;
    let mut out = std::io::stdout().lock();
    if json {
        for (n, info) in &rows {
            writeln!(out, "{}", json_line(&row_json(n, info)))?;
        }
    } else {
        writeln!(
            out,
            "{:<5} {:<8} {:<7} {:<16} {:<20} COMMAND",
            "ID", "STATUS", "UPTIME", "MOUNTS", "TOOLS"
        )?;
        for (n, info) in &rows {
            writeln!(out, "{}", row_text(n, info))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a namespace as a spec (`/ns/<id>/spec`: env names, never their values).
pub fn ns(dirs: &Dirs, id: u64) -> Result<ExitCode> {
    let spec = crate::namespaces::block_on(async {
        let tree = NsTree::connect(dirs).await?;
        tree.read(id, "spec").await
    })?;
    let mut out = std::io::stdout().lock();
    out.write_all(escaped_lines(&spec).as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lines_parse_into_fields() {
        let info = Info::parse(
            "origin run\noperator 0\nargv /bin/sh -c 'echo hi'\nstarted 1700000000\n\
             holder 77\nsession abcd\nmount unix!/run/warren/tool.sock /tool\ntool echo\n\
             tool fs_read\nsomething new\n",
        );
        assert_eq!(info.argv, vec!["/bin/sh", "-c", "echo hi"]);
        assert_eq!(info.started, Some(1_700_000_000));
        assert_eq!(
            info.mounts,
            vec![("unix!/run/warren/tool.sock".into(), "/tool".into())]
        );
        assert_eq!(info.tools, vec!["echo", "fs_read"]);
        assert_eq!(info.session.as_deref(), Some("abcd"));
    }

    /// What a clone's `ctl run …` words and a child spec's mount path can hold: ESC sequences
    /// that would redraw the table (here a forged row), a newline and tab, a bidi override.
    /// The row is one printable line, and `--json` says the same words without hiding any.
    #[test]
    fn hostile_words_and_paths_cannot_forge_or_hide_a_row() {
        let forged_row =
            "\x1b[2K\x1b[1A\r7     running 1s      /tool            echo                 true";
        let argv = [forged_row, "a\nb\tc", "\u{202E}txt.exe"];
        // The info file as nsd writes it: words quoted with `spec::quote`.
        let quoted: Vec<String> = argv.iter().map(|w| warren_ns::spec::quote(w)).collect();
        let text = format!(
            "argv {}\nmount gate {}\ntool echo\n",
            quoted.join(" "),
            warren_ns::spec::quote("/n/\u{202E}etag")
        );
        let info = Info::parse(&text);
        assert_eq!(info.argv, argv, "{text}");
        let listed = Listed {
            id: 3,
            status: "running holder=9".into(),
        };
        let row = row_text(&listed, &info);
        assert!(
            !row.chars().any(warren_daemon::escape::misleads),
            "the row holds a hidden code point: {row:?}"
        );
        assert!(row.starts_with("3 "), "{row}");
        assert!(row.contains("/n/\\u{202E}etag"), "{row}");
        let line = json_line(&row_json(&listed, &info));
        assert!(!line.chars().any(warren_daemon::escape::misleads), "{line}");
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["argv"], json!(argv));
        let spec = "mount gate /n/gate\n# \x1b[2J\u{202E}\n";
        assert_eq!(
            escaped_lines(spec),
            "mount gate /n/gate\n# \\u{001B}[2J\\u{202E}\n"
        );
    }

    #[test]
    fn uptime_reads_as_a_duration() {
        assert_eq!(uptime(9), "9s");
        assert_eq!(uptime(247), "4m07s");
        assert_eq!(uptime(7500), "2h05m");
        assert_eq!(uptime(3 * 86400 + 4 * 3600), "3d04h");
    }
}
