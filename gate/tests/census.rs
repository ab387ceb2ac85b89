//! Census: no module of the gate reads session history or message content. The gate's inputs are
//! the session id, the tool name, the canonical arguments and typed context states; a name for
//! anything else (a conversation, its messages, a prompt, the model's server, another tree's log)
//! in `gate/src` fails this test. The fixture plants such a read to show the census catches it.
//!
//! Four lines name the model server and are let through, each exactly as written: the tier
//! table's row for a model call (a tool name, decided like any other: by name and the digest in
//! its arguments), that tool name's constant (its arguments are checked to be a model's name and
//! a digest, nothing else), the list of daemons that may ask the gate to decide, and the model
//! server's row of which names each of them decides. None reads anything of the model's.

use std::path::{Path, PathBuf};

use regex::Regex;

/// What a gate module must never name: conversation state and the trees that hold it.
const FORBIDDEN: &[(&str, &str)] = &[
    (r"(?i)\bhistor(y|ies)\b", "session history"),
    (
        r"(?i)\bmessages\b|\bmessage_(content|body|text)\b",
        "message content",
    ),
    (r"(?i)\btranscripts?\b", "a transcript"),
    (r"(?i)\b(system_)?prompts?\b", "a prompt"),
    (r"(?i)\bconversations?\b", "a conversation"),
    (r"(?i)\bchat\b", "a chat"),
    (
        r"(?i)(/mnt/llm|\bllmfs\b|\bllm\b)",
        "the model server's tree",
    ),
    (r"(?i)\bagentd\b", "the agent loop"),
    (
        r#""(log|head|proof)""#,
        "reading a receipt log (the gate only appends)",
    ),
];

/// The lines (trimmed) that name the model server without reading it: see the module's doc.
const NAMED_NOT_READ: &[&str] = &[
    r#"("llm", Tier::Read),"#,
    r#"pub const DECIDING_DAEMONS: [&str; 4] = ["toolfs", "mcpfs", "netproxy", "llmfs"];"#,
    r#"pub const LLM_TOOL: &str = "llm";"#,
    r#""llmfs" => model_call,"#,
];

/// Every violation in `text`: (line number, what it names, the line).
fn violations(text: &str) -> Vec<(usize, &'static str, String)> {
    let rules: Vec<(Regex, &str)> = FORBIDDEN
        .iter()
        .map(|(p, what)| (Regex::new(p).unwrap(), *what))
        .collect();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if NAMED_NOT_READ.contains(&line.trim()) {
            continue;
        }
        for (re, what) in &rules {
            if re.is_match(line) {
                out.push((i + 1, *what, line.trim().to_owned()));
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_gate_module_reads_history_or_message_content() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() >= 10,
        "the census found only {} files under {}",
        files.len(),
        src.display()
    );
    let mut found = Vec::new();
    for f in &files {
        for (line, what, text) in violations(&std::fs::read_to_string(f).unwrap()) {
            found.push(format!("{}:{line}: names {what}: {text}", f.display()));
        }
    }
    assert!(
        found.is_empty(),
        "the gate must not read conversation state:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_census_catches_a_planted_violation() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/census_violation.rs.txt");
    let text = std::fs::read_to_string(&fixture).unwrap();
    let found = violations(&text);
    let named: Vec<&str> = found.iter().map(|(_, what, _)| *what).collect();
    for want in [
        "session history",
        "message content",
        "a prompt",
        "the model server's tree",
        "reading a receipt log (the gate only appends)",
    ] {
        assert!(
            named.contains(&want),
            "the census missed {want:?} in the fixture: {found:?}"
        );
    }
}
