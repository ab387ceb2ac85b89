//! `warren agent`: warren's own agent in a namespace nsd builds, its model the scripted backend
//! behind llmfs (`mount llm /mnt/llm`), its tools the spec's. Needs root, /dev/fuse and the
//! workspace's binaries (warren-llmfs, warren-llm-script, warren-agentd among them).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{Warren, approve_every_ask, wait_until};
use serde_json::{Value, json};
use warren_daemon::identity::Role;
use warren_test_support::llm_script::Script;

/// `warren agent` with the operator answering its asks, in the namespace `spec` builds, then
/// `rest` (options, the task).
fn agent_args<'a>(spec: &'a Path, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "agent",
        "--asks",
        "operator",
        "--ns",
        spec.to_str().unwrap(),
    ];
    args.extend_from_slice(rest);
    args
}

/// The run stopped (status 1) because its `which` budget (turns, tokens, time) was spent; its
/// stderr.
fn budget_spent(run: &std::process::Output, which: &str) -> String {
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("the {which} budget is spent")),
        "{stderr}"
    );
    stderr
}

/// A small repository to summarise, readable by the tools' workers, and an output directory
/// owned by the worker uid (fs_write writes as its root's owner, never root).
fn repo(base: &Path) -> (String, String) {
    let repo = base.join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(
        repo.join("README.md"),
        "# tiny\nA tiny library that adds numbers.\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("src/lib.rs"),
        "pub fn add(a: i32, b: i32) -> i32 { a + b }\n",
    )
    .unwrap();
    let out = base.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let uid = Role::Worker.uid();
    nix::unistd::chown(&out, Some(uid.into()), Some(uid.into())).unwrap();
    for d in [base, &repo, &repo.join("src"), &out] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (
        repo.to_str().unwrap().to_owned(),
        out.to_str().unwrap().to_owned(),
    )
}

fn session_of(stderr: &str) -> String {
    let at = stderr
        .find("(session ")
        .unwrap_or_else(|| panic!("no session in: {stderr}"));
    stderr[at + 9..at + 9 + 32].to_owned()
}

/// The agent reads a repository through `fs_list`/`fs_read` (two calls in one turn, run
/// concurrently), writes a summary through `fs_write` once the operator allows it, and finishes;
/// every model call and every tool call is receipted in the namespace's session, and the
/// exported chain verifies.
#[test]
fn an_agent_summarises_a_repository_and_every_call_is_receipted() {
    let base = tempfile::Builder::new()
        .prefix("wagent")
        .tempdir_in("/tmp")
        .unwrap();
    let (repo, out) = repo(base.path());
    let summary = format!("{out}/SUMMARY.md");
    let script = Script::openai(
        base.path(),
        &json!([
            {"tool_calls": [
                {"id": "c1", "name": "fs_list", "arguments": {"path": repo}},
                {"id": "c2", "name": "fs_read", "arguments": {"path": format!("{repo}/README.md")}}
             ],
             "usage": {"prompt_tokens": 100, "completion_tokens": 20}},
            {"tool_calls": [
                {"id": "c3", "name": "fs_write",
                 "arguments": {"path": summary, "content": "tiny: a library that adds numbers.\n"}}
             ],
             "usage": {"prompt_tokens": 200, "completion_tokens": 30}},
            {"text": "The summary is in SUMMARY.md: a tiny library that adds numbers.\u{1b}[2J",
             "usage": {"prompt_tokens": 300, "completion_tokens": 15}}
        ]),
    );
    // The key file is root's alone (0600): llmfs, under its own uid, gets it from the supervisor.
    let key_file = base.path().join("llm.key");
    std::fs::write(&key_file, "sk-test-key\n").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let w = Warren::up_with(&[
        ("WARREN_LLM_URL", &script.url()),
        ("WARREN_LLM_MODEL", "scripted"),
        ("WARREN_LLM_KEY_FILE", key_file.to_str().unwrap()),
    ]);
    let _approver = approve_every_ask(&w);
    let spec = base.path().join("agent.ns");
    std::fs::write(
        &spec,
        format!(
            "mount tool /tool fs_list fs_read fs_write\ntool fs_list -r {repo}\n\
             tool fs_read -r {repo}\ntool fs_write -w {out}\n"
        ),
    )
    .unwrap();
    let transcript = base.path().join("transcript.jsonl");
    let run = w.run(&agent_args(
        &spec,
        &[
            "--transcript",
            transcript.to_str().unwrap(),
            "Summarise the repository into SUMMARY.md",
        ],
    ));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert_eq!(
        run.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.contains("a tiny library that adds numbers"),
        "{stdout}"
    );
    // The model's words reach the terminal with its controls escaped.
    assert!(
        !stdout.contains('\u{1b}') && stdout.contains("\\u{001B}[2J"),
        "{stdout}"
    );
    assert!(stderr.contains("turn 1: call fs_read"), "{stderr}");
    assert!(stderr.contains("turn 2: fs_write → ok"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&summary).unwrap(),
        "tiny: a library that adds numbers.\n"
    );

    // What the model was given: the granted tools as native definitions, the grant in words,
    // and each tool result as untrusted data with its digest.
    let requests = script.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["authorization"], "Bearer sk-test-key");
    let first = &requests[0]["body"];
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["fs_list", "fs_read", "fs_write"]);
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("grants exactly these tools"), "{system}");
    assert!(
        system.contains(&format!("`fs_write` may read and write under: {out}")),
        "{system}"
    );
    let second = &requests[1]["body"]["messages"];
    let results: Vec<&Value> = second
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 2, "{second}");
    let read: Value = serde_json::from_str(results[1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        read["untrusted_data"]["source"], "tool fs_read (ok)",
        "{read}"
    );
    assert!(
        read["untrusted_data"]["content"]
            .as_str()
            .unwrap()
            .contains("adds numbers")
    );
    assert!(
        read["untrusted_data"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );

    // The transcript: every step, ending finished.
    let events: Vec<Value> = std::fs::read_to_string(&transcript)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"start"));
    assert_eq!(kinds.iter().filter(|k| **k == "tool_result").count(), 3);
    // Each call that ran names its receipt in the session.
    for e in events.iter().filter(|e| e["event"] == "tool_result") {
        assert!(e["receipt"]["scope"].is_string(), "{e}");
    }
    assert_eq!(events.last().unwrap()["outcome"], "finished");
    assert_eq!(events.last().unwrap()["tokens"], 665);

    // Receipts: three model calls appended by llmfs, and the tool calls' decisions and runs,
    // all in the namespace's session; the exported chain verifies.
    let session = session_of(&stderr);
    let model_calls = |bodies: &[Value]| {
        bodies
            .iter()
            .filter(|b| b["subject"]["server"] == "llmfs")
            .count()
    };
    wait_until("three model-call receipts", || {
        model_calls(&w.receipts(&session)) == 3
    });
    let bodies = w.receipts(&session);
    for b in bodies.iter().filter(|b| b["subject"]["server"] == "llmfs") {
        assert_eq!(b["appender"], "llmfs", "{b}");
        assert_eq!(b["kind"], "query");
        assert_eq!(b["subject"]["model"], "scripted");
        // Each model call was admitted by a decision of the gate's, which its receipt names.
        let seq = &b["subject"]["decision"]["seq"];
        assert!(
            bodies.iter().any(|d| d["kind"] == "decision"
                && d["subject"]["tool"] == "llm"
                && d["seq"] == *seq),
            "{b}"
        );
    }
    let ran: Vec<&str> = bodies
        .iter()
        .filter(|b| b["appender"] == "toolfs" && b["kind"] != "withdrawn")
        .map(|b| b["subject"]["tool"].as_str().unwrap())
        .collect();
    for tool in ["fs_list", "fs_read", "fs_write"] {
        assert!(ran.contains(&tool), "{tool} not receipted as run: {ran:?}");
    }
    assert!(
        bodies
            .iter()
            .any(|b| b["kind"] == "decision" && b["subject"]["tool"] == "fs_write"),
        "no decision receipt for fs_write"
    );
    w.run_ok(&["write", "/receipts/ctl", "checkpoint"]);
    let dir = tempfile::tempdir().unwrap();
    let (export, keys) = (dir.path().join("export"), dir.path().join("keys"));
    std::fs::write(&export, w.run_ok(&["receipts", "export", &session]).stdout).unwrap();
    std::fs::write(&keys, w.run_ok(&["receipts", "keys"]).stdout).unwrap();
    let verify = w.run(&[
        "verify",
        export.to_str().unwrap(),
        "--keys",
        keys.to_str().unwrap(),
    ]);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}

/// A model that never stops calling tools is stopped by the turn budget (exit 1), and one
/// that asks for 100 tool calls in one turn gets an error for each, none of them run.
#[test]
fn the_budget_stops_a_model_that_never_finishes() {
    let base = tempfile::Builder::new()
        .prefix("wagent")
        .tempdir_in("/tmp")
        .unwrap();
    let (repo, _) = repo(base.path());
    let flood: Vec<Value> = (0..100)
        .map(|i| json!({"id": format!("f{i}"), "name": "fs_read", "arguments": {"path": "README.md"}}))
        .collect();
    let again = json!({"tool_calls": [{"id": "r", "name": "fs_read",
                                       "arguments": {"path": "README.md"}}]});
    // Three runs share the script: the turn budget's (four turns scripted, three taken), the
    // token budget's (one turn of 5000 tokens against 1000), the time budget's (a model slower
    // than the 1 s budget).
    let heavy = json!({"tool_calls": [{"id": "h", "name": "fs_read",
                                       "arguments": {"path": "README.md"}}],
                       "usage": {"prompt_tokens": 4000, "completion_tokens": 1000}});
    let slow = json!({"text": "too late", "delay_ms": 5000});
    let script = Script::openai(
        base.path(),
        &json!([{"tool_calls": flood}, again, again, again, heavy, slow]),
    );
    let w = Warren::up_with(&[("WARREN_LLM_URL", &script.url()), ("WARREN_LLM_MODEL", "m")]);
    let spec = base.path().join("agent.ns");
    std::fs::write(
        &spec,
        format!("mount tool /tool fs_read\ntool fs_read -r {repo}\n"),
    )
    .unwrap();
    let run = w.run(&agent_args(&spec, &["--max-turns", "3", "read forever"]));
    budget_spent(&run, "turns");
    let requests = script.requests();
    assert_eq!(requests.len(), 3, "the fourth turn was never asked");
    let answers: Vec<&Value> = requests[1]["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(answers.len(), 100);
    assert!(
        answers[0]["content"]
            .as_str()
            .unwrap()
            .contains("100 tool calls in one turn")
    );

    // The fourth scripted turn is skipped: the next run starts at `heavy`.
    let _ = w.run(&agent_args(&spec, &["--max-turns", "1", "skip a turn"]));
    let run = w.run(&agent_args(
        &spec,
        &["--max-tokens", "1000", "spend tokens"],
    ));
    budget_spent(&run, "tokens");
    assert_eq!(
        script.requests().len(),
        5,
        "no ask after the token budget was spent"
    );

    let run = w.run(&agent_args(&spec, &["--max-seconds", "1", "answer slowly"]));
    budget_spent(&run, "time");
}

/// The tool calls of one reply run concurrently: the agent's `fs_read` runs (its receipt lands)
/// while its `fs_write` of the same turn still waits for the operator's answer to its ask.
#[test]
fn the_calls_of_one_turn_run_concurrently() {
    let base = tempfile::Builder::new()
        .prefix("wagent")
        .tempdir_in("/tmp")
        .unwrap();
    let (repo, out) = repo(base.path());
    let script = Script::openai(
        base.path(),
        &json!([
            {"tool_calls": [
                {"id": "w", "name": "fs_write",
                 "arguments": {"path": format!("{out}/a.txt"), "content": "a\n"}},
                {"id": "r", "name": "fs_read", "arguments": {"path": format!("{repo}/README.md")}}
            ]},
            {"text": "both done"}
        ]),
    );
    let w = Warren::up_with(&[("WARREN_LLM_URL", &script.url()), ("WARREN_LLM_MODEL", "m")]);
    let spec = base.path().join("agent.ns");
    std::fs::write(
        &spec,
        format!(
            "mount tool /tool fs_read fs_write\ntool fs_read -r {repo}\ntool fs_write -w {out}\n"
        ),
    )
    .unwrap();
    let agent = w
        .cmd(&agent_args(&spec, &["write and read"]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (id, request) = common::next_ask(&w, 0);
    assert_eq!(common::field(&request, "tool"), "fs_write", "{request}");
    let session = common::field(&request, "session").to_owned();
    wait_until("fs_read ran while fs_write waits for its ask", || {
        w.receipts(&session)
            .iter()
            .any(|b| b["appender"] == "toolfs" && b["subject"]["tool"] == "fs_read")
    });
    let pending = w.run_ok(&["ls", "/gate/pending"]);
    assert!(
        String::from_utf8_lossy(&pending.stdout).contains(&id.to_string()),
        "the ask was still open"
    );
    w.run_ok(&[
        "write",
        &format!("/gate/pending/{id}/ctl"),
        &format!("allow once {}", common::fingerprint(&request)),
    ]);
    let done = agent.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(0), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(format!("{out}/a.txt")).unwrap(),
        "a\n"
    );
}

/// Model calls cross the gate like tool calls: each is decided as `llm` with the namespace's
/// lineage, so a subtree's `limit receipt-bytes=` is spent by model calls alone (their
/// decisions and `query` receipts charged) until the gate denies the next one for the budget;
/// and an operator's `deny llm` stops the agent before its model is asked at all (exit 3, the
/// gate's basis said), with the deny receipted in the namespace's session; under `ask llm` each
/// model call waits for the operator's answer.
#[test]
fn model_calls_are_decided_by_the_gate_and_charged_to_the_budgets() {
    let base = tempfile::Builder::new()
        .prefix("wagent")
        .tempdir_in("/tmp")
        .unwrap();
    let (repo, _) = repo(base.path());
    // Every turn calls a tool the namespace does not have: agentd refuses it itself, so no tool
    // call reaches the gate and only the model calls spend the budget.
    let turn = json!({"tool_calls": [{"id": "n", "name": "nope", "arguments": {}}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1}});
    let script = Script::openai(base.path(), &Value::Array(vec![turn; 30]));
    let w = Warren::up_with(&[("WARREN_LLM_URL", &script.url()), ("WARREN_LLM_MODEL", "m")]);
    let spec = base.path().join("agent.ns");
    let agent = |spec_text: &str| {
        std::fs::write(&spec, spec_text).unwrap();
        let run = w.run(&agent_args(
            &spec,
            &["--max-turns", "30", "call nope forever"],
        ));
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        (run.status.code(), stderr)
    };
    let grant = format!("mount tool /tool fs_read\ntool fs_read -r {repo}\n");

    let (code, stderr) = agent(&format!("{grant}limit receipt-bytes=6000\n"));
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("the gate denied this model call: budget:receipt_bytes"),
        "{stderr}"
    );
    let asked = script.requests().len();
    assert!((1..30).contains(&asked), "{asked} model calls made");
    let session = session_of(&stderr);
    let bodies = w.receipts(&session);
    let queries: Vec<&Value> = bodies.iter().filter(|b| b["kind"] == "query").collect();
    assert_eq!(queries.len(), asked, "one query receipt per model call");
    for q in &queries {
        assert!(q["subject"]["decision"]["seq"].is_u64(), "{q}");
    }
    let llm_allowed = bodies
        .iter()
        .filter(|b| {
            b["kind"] == "decision"
                && b["subject"]["tool"] == "llm"
                && b["subject"]["verdict"] == "allow"
        })
        .count();
    assert_eq!(llm_allowed, asked, "{bodies:?}");

    w.run_ok(&["write", "/gate/rules", "deny llm"]);
    let (code, stderr) = agent(&grant);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("the gate denied this model call: rule"),
        "{stderr}"
    );
    assert_eq!(script.requests().len(), asked, "the model was asked");
    let session = session_of(&stderr);
    wait_until("the deny receipted", || {
        w.receipts(&session).iter().any(|b| {
            b["kind"] == "decision"
                && b["subject"]["tool"] == "llm"
                && b["subject"]["verdict"] == "deny"
        })
    });

    // `ask llm`: each model call waits for the operator, and runs once allowed.
    let rules = String::from_utf8(w.run_ok(&["cat", "/gate/rules"]).stdout).unwrap();
    let deny = rules
        .lines()
        .find(|l| l.contains("deny\tllm"))
        .and_then(|l| l.split('\t').next())
        .unwrap_or_else(|| panic!("no deny rule in {rules}"));
    w.run_ok(&["write", "/gate/rules", &format!("delete {deny}\nask llm")]);
    let _approver = approve_every_ask(&w);
    std::fs::write(&spec, &grant).unwrap();
    let run = w.run(&agent_args(&spec, &["--max-turns", "2", "call nope twice"]));
    let stderr = budget_spent(&run, "turns");
    assert_eq!(script.requests().len(), asked + 2);
    let session = session_of(&stderr);
    let answered = w
        .receipts(&session)
        .iter()
        .filter(|b| {
            b["kind"] == "decision"
                && b["subject"]["tool"] == "llm"
                && b["subject"]["answered_by"].is_string()
        })
        .count();
    assert_eq!(answered, 2, "each model call was asked and answered");
}

/// llmfs killed while a namespace with `mount llm` runs: the supervisor restarts it, the bridge
/// gets a new connection through nsd (with the namespace's grant again), and a session minted
/// afterwards is answered and receipted in the namespace's session; the session of the old
/// connection is gone with it.
#[test]
fn a_restarted_llmfs_serves_the_running_namespace_again() {
    let script_dir = tempfile::Builder::new()
        .prefix("wllmr")
        .tempdir_in("/tmp")
        .unwrap();
    let script = Script::openai(
        script_dir.path(),
        &json!([{"text": "before"}, {"text": "after"}]),
    );
    let w = Warren::up_with(&[("WARREN_LLM_URL", &script.url()), ("WARREN_LLM_MODEL", "m")]);
    let share = tempfile::Builder::new()
        .prefix("wllmr")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = share.path().to_str().unwrap();
    let spec = script_dir.path().join("llm.ns");
    std::fs::write(&spec, "mount llm /mnt/llm\n").unwrap();
    // One open of `ask` is one ask: the message written, the reply read on the same fd (in a
    // subshell: a failed `exec` redirection would end the script).
    let sh = format!(
        "ask() ( exec 3<>\"/mnt/llm/$1/ask\" && printf '%s' \"$2\" >&3 && cat <&3 > \"$3\" )\n\
         old=$(cat /mnt/llm/new)\n\
         ask \"$old\" hello {s}/first\n\
         while [ ! -e {s}/go ]; do sleep 0.05; done\n\
         if ask \"$old\" again {s}/old 2>{s}/old.err; then echo kept > {s}/old.status; else echo gone > {s}/old.status; fi\n\
         new=$(cat /mnt/llm/new)\n\
         ask \"$new\" hello {s}/second\n"
    );
    let launcher = w.spawn_sh(
        &[
            "--asks",
            "operator",
            "--ns",
            spec.to_str().unwrap(),
            "--rw",
            s,
        ],
        &sh,
    );
    let first = share.path().join("first");
    wait_until("the first ask's reply", || {
        std::fs::read_to_string(&first).is_ok_and(|t| t.contains("\"done\""))
    });
    assert!(
        std::fs::read_to_string(&first).unwrap().contains("before"),
        "{}",
        std::fs::read_to_string(&first).unwrap()
    );
    // llmfs queues a call's receipt off the call's path, and one still queued when llmfs is
    // killed is lost (docs/gaps.md, "llmfs"): kill it only once the first is in the log.
    wait_until("the first model call receipted", || {
        llmfs_queries_in_one_session(&w) >= 1
    });
    let old = w.daemon_pid("warren-llmfs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until("a new llmfs", || {
        let pids = w.daemon_pids("warren-llmfs");
        pids.len() == 1 && pids[0] != old
    });
    std::fs::write(share.path().join("go"), "").unwrap();
    let out = launcher.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let read = |name: &str| std::fs::read_to_string(share.path().join(name)).unwrap_or_default();
    assert!(
        out.status.success(),
        "{:?} {stderr}\nold: {} {}\nsecond: {}",
        out.status,
        read("old.status"),
        read("old.err"),
        read("second")
    );
    assert_eq!(read("old.status").trim(), "gone", "{}", read("old.err"));
    let second = read("second");
    assert!(
        second.contains("after") && second.contains("\"done\""),
        "{second}"
    );
    assert_eq!(script.requests().len(), 2);
    // Both model calls, before and after the restart, in the one namespace's session.
    wait_until(
        "both model calls receipted in the namespace's session",
        || llmfs_queries_in_one_session(&w) == 2,
    );
}

/// The most `query` receipts llmfs appended in any one namespace's session.
fn llmfs_queries_in_one_session(w: &Warren) -> usize {
    let listing = String::from_utf8_lossy(&w.run_ok(&["ls", "/receipts"]).stdout).into_owned();
    listing
        .lines()
        .map(|l| l.trim_end_matches('/'))
        .filter(|l| l.len() == 32)
        .map(|scope| {
            w.receipts(scope)
                .iter()
                .filter(|b| b["kind"] == "query" && b["appender"] == "llmfs")
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// What a backend says reaches the operator's terminal escaped, on the failure paths too: an
/// error body, and a tool call whose arguments are not JSON (llmfs quotes them in its error),
/// each carrying a sequence that would erase the line and print a forged `finished`.
#[test]
fn a_models_failure_reaches_the_operators_terminal_escaped() {
    const FORGED: &str = "\u{1b}[2K\r\u{1b}[32magent: finished OK\u{1b}[0m";
    let base = tempfile::Builder::new()
        .prefix("wagent")
        .tempdir_in("/tmp")
        .unwrap();
    let script = Script::openai(
        base.path(),
        &json!([
            {"tool_calls": [{"id": "c1", "name": "echo", "arguments": format!("not json {FORGED}")}]},
            {"status": 404, "error": FORGED}
        ]),
    );
    let w = Warren::up_with(&[
        ("WARREN_LLM_URL", &script.url()),
        ("WARREN_LLM_MODEL", "scripted"),
    ]);
    let spec = base.path().join("agent.ns");
    std::fs::write(&spec, "mount tool /tool echo\n").unwrap();
    for (what, said) in [
        ("a tool call's non-JSON arguments", "are not JSON"),
        ("an error body", "HTTP 404"),
    ] {
        let run = w.run(&agent_args(&spec, &["say hello"]));
        let (stdout, stderr) = (
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
        );
        assert_eq!(run.status.code(), Some(3), "{what}: {stderr}");
        assert!(stderr.contains("the model failed"), "{what}: {stderr}");
        assert!(stderr.contains(said), "{what}: {stderr}");
        // The forged words are there, every control in them escaped.
        assert!(
            stderr.contains("\\u{001B}[2K\\u{000D}\\u{001B}[32magent: finished OK"),
            "{what}: {stderr}"
        );
        for (name, out) in [("stdout", &stdout), ("stderr", &stderr)] {
            assert!(
                !out.contains(['\u{1b}', '\r']),
                "{what}: a raw control on {name}: {out:?}"
            );
        }
    }
}

/// `--transcript` never writes through what someone planted at its path (an agent with a shell
/// on the output directory in an earlier run): a symlink to the operator's `.bashrc`, a FIFO or
/// a directory is refused before anything runs, and the symlink's target keeps its content and
/// mode.
#[test]
fn the_transcript_is_never_written_through_a_planted_file() {
    let base = tempfile::Builder::new()
        .prefix("wagent")
        .tempdir_in("/tmp")
        .unwrap();
    let w = Warren::up();
    let home = base.path().join("home");
    let out = base.path().join("out");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let bashrc = common::operators_bashrc(&home);
    let spec = base.path().join("agent.ns");
    std::fs::write(&spec, "mount tool /tool echo\n").unwrap();
    let link = out.join("run.jsonl");
    std::os::unix::fs::symlink("../home/.bashrc", &link).unwrap();
    let fifo = out.join("fifo.jsonl");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let dir = out.join("dir.jsonl");
    std::fs::create_dir(&dir).unwrap();
    for (path, why) in [
        (&link, "is a symbolic link"),
        (&fifo, "is not a regular file"),
        (&dir, "is a directory"),
    ] {
        let run = w.run(&agent_args(
            &spec,
            &["--transcript", path.to_str().unwrap(), "say hello"],
        ));
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{}: {stderr}", path.display());
        assert!(
            stderr.contains(&format!("{}: {why}: refusing to write it", path.display())),
            "{stderr}"
        );
        assert!(!stderr.contains("namespace"), "it ran: {stderr}");
    }
    common::assert_bashrc_untouched(&bashrc);
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
}
