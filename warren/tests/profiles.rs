//! `warren run --profile NAME`: an agent found on PATH, run in the directory `warren run` is
//! started in (bound writable) as that project's owner, its config bound from the operator's
//! HOME, its profile's switches set; refused, with nothing run, when a piece is missing. And
//! the working directory of a plain `warren run`. Needs root, /dev/fuse, the workspace's
//! binaries and, for the real agents, scripts/install-test-deps.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{Warren, repo, tempdir_with_mode};

/// The uid the projects here belong to: neither root nor a uid of warren's.
const OWNER: u32 = 4321;

/// A project owned by [`OWNER`], an operator HOME, an operator config dir holding the `fake`
/// profile, and the fake agent installed in a prefix of its own.
struct Fixture {
    project: tempfile::TempDir,
    home: tempfile::TempDir,
    config: tempfile::TempDir,
    prefix: tempfile::TempDir,
}

/// The fake agent: what a coding agent does with its tools, in sh. It writes RESULT.txt in its
/// working directory (relative), with what it saw.
const FAKE_AGENT: &str = r#"#!/bin/sh
{
  echo "pwd $(pwd)"
  echo "uid $(id -u)"
  echo "args $*"
  echo "switch $FAKE_SWITCH"
  echo "key $FAKE_KEY"
  echo "config $(cat "$HOME/.fake/config")"
  echo "path $PATH"
  echo "secret $(cat "$OPERATOR_HOME/secret" 2>&1)"
} > RESULT.txt
"#;

const FAKE_PROFILE: &str = "agent fakeagent --from-profile\n\
set FAKE_SWITCH=on\n\
bind -w ${PROJECT} ${PROJECT}\n\
bind -w ${HOME}/.fake /home/agent/.fake\n\
env FAKE_KEY OPERATOR_HOME\n\
limit pids=64\n";

impl Fixture {
    fn new() -> Fixture {
        let project = tempdir_with_mode("wproj", 0o755);
        std::os::unix::fs::chown(project.path(), Some(OWNER), Some(OWNER)).unwrap();
        let home = tempdir_with_mode("whome", 0o755);
        std::fs::write(home.path().join("secret"), "the operator's secret\n").unwrap();
        let fake = home.path().join(".fake");
        std::fs::create_dir(&fake).unwrap();
        std::fs::write(fake.join("config"), "from the operator's HOME\n").unwrap();
        let config = tempdir_with_mode("wcfg", 0o755);
        std::fs::create_dir(config.path().join("profiles")).unwrap();
        std::fs::write(config.path().join("profiles/fake.ns"), FAKE_PROFILE).unwrap();
        let prefix = tempdir_with_mode("wpfx", 0o755);
        let bin = prefix.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::write(bin.join("fakeagent"), FAKE_AGENT).unwrap();
        std::fs::set_permissions(bin.join("fakeagent"), PermissionsExt::from_mode(0o755)).unwrap();
        Fixture {
            project,
            home,
            config,
            prefix,
        }
    }

    /// `warren run ARGS…` started in `cwd`, with this fixture's HOME, config dir and PATH.
    fn run_in(&self, w: &Warren, cwd: &Path, args: &[&str]) -> Output {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let path = format!("{}/bin:/usr/bin:/bin", self.prefix.path().display());
        w.cmd(&all)
            .current_dir(cwd)
            .env("HOME", self.home.path())
            .env("OPERATOR_HOME", self.home.path())
            .env("WARREN_CONFIG_DIR", self.config.path())
            .env("PATH", path)
            .env("FAKE_KEY", "k-123")
            .output()
            .unwrap()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The agent runs in the project, as its owner, with its config from the operator's HOME, the
/// profile's switch and the operator's key; what it writes there is the owner's; the rest of
/// the operator's HOME is not there.
#[test]
fn a_profile_runs_its_agent_in_the_project_as_its_owner() {
    let w = Warren::up();
    let f = Fixture::new();
    let out = f.run_in(&w, f.project.path(), &["--profile", "fake", "--", "task"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let result = f.project.path().join("RESULT.txt");
    let seen = std::fs::read_to_string(&result).unwrap();
    let project = f.project.path().display().to_string();
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines[0], format!("pwd {project}"), "{seen}");
    assert_eq!(lines[1], format!("uid {OWNER}"), "{seen}");
    assert_eq!(lines[2], "args --from-profile task", "{seen}");
    assert_eq!(lines[3], "switch on", "{seen}");
    assert_eq!(lines[4], "key k-123", "{seen}");
    assert_eq!(lines[5], "config from the operator's HOME", "{seen}");
    assert_eq!(
        lines[6],
        format!("path {}/bin:/usr/bin:/bin", f.prefix.path().display()),
        "{seen}"
    );
    assert!(
        lines[7].contains("No such file or directory"),
        "the operator's HOME is visible: {seen}"
    );
    assert_eq!(std::fs::metadata(&result).unwrap().uid(), OWNER);
}

/// A plain `warren run` starts in the current directory when a bind shows it at the same path,
/// in HOME when none does, and where `--cwd` says.
#[test]
fn warren_run_starts_in_the_current_directory_it_binds() {
    let w = Warren::up();
    let f = Fixture::new();
    let dir = f.project.path().to_str().unwrap();
    let pwd = |args: &[&str]| {
        let out = f.run_in(&w, f.project.path(), args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    };
    assert_eq!(pwd(&["--rw", dir, "--", "/bin/pwd"]), dir);
    assert_eq!(pwd(&["--", "/bin/pwd"]), "/home/agent");
    assert_eq!(
        pwd(&["--rw", dir, "--cwd", "/tmp", "--", "/bin/pwd"]),
        "/tmp"
    );
    let out = f.run_in(
        &w,
        f.project.path(),
        &["--cwd", "/nowhere", "--", "/bin/true"],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("/nowhere"),
        "{}",
        text(&out.stderr)
    );
}

/// The agent's uid and what is bound at the project come from one open file: a profile whose
/// project bind's source is a symlink (the project's owner's, 4321) to a directory another uid
/// (4322) owns runs its agent as 4322, the owner of the directory nsd opened and bound — never
/// as the project's owner over another user's directory (a lookup of the project's name apart
/// from nsd's open of it could be swapped between the two).
#[test]
fn a_profile_runs_its_agent_as_the_owner_of_what_is_bound_at_the_project() {
    let w = Warren::up();
    let f = Fixture::new();
    const OTHER: u32 = OWNER + 1;
    let others = tempdir_with_mode("wother", 0o777);
    std::os::unix::fs::chown(others.path(), Some(OTHER), Some(OTHER)).unwrap();
    let link = f.project.path().join("link");
    std::os::unix::fs::symlink(others.path(), &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(OWNER), Some(OWNER)).unwrap();
    std::fs::write(
        f.config.path().join("profiles/linked.ns"),
        FAKE_PROFILE.replace(
            "bind -w ${PROJECT} ${PROJECT}",
            "bind -w ${PROJECT}/link ${PROJECT}",
        ),
    )
    .unwrap();
    let out = f.run_in(&w, f.project.path(), &["--profile", "linked", "--", "task"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let result = others.path().join("RESULT.txt");
    let seen = std::fs::read_to_string(&result).unwrap();
    assert_eq!(
        seen.lines().nth(1),
        Some(format!("uid {OTHER}").as_str()),
        "{seen}"
    );
    assert_eq!(std::fs::metadata(&result).unwrap().uid(), OTHER);
    assert!(!f.project.path().join("RESULT.txt").exists());
}

/// Root's `--uid` is never one of warren's daemon uids: refused before anything runs.
#[test]
fn a_profile_never_runs_its_agent_as_a_daemon_uid() {
    let w = Warren::up();
    let f = Fixture::new();
    let gate = warren_daemon::identity::Role::Gate.uid().to_string();
    let out = f.run_in(&w, f.project.path(), &["--profile", "fake", "--uid", &gate]);
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "ran: {err}");
    assert!(err.contains("one of warren's own daemon uids"), "{err}");
    assert!(
        !f.project.path().join("RESULT.txt").exists(),
        "the agent ran"
    );
}

/// A root-owned project, a missing config dir, an agent not on PATH, a profile nobody wrote:
/// each refused by name, non-zero, and the agent never runs.
#[test]
fn a_profile_with_a_missing_piece_is_refused_and_runs_nothing() {
    let w = Warren::up();
    let f = Fixture::new();
    let refused = |cwd: &Path, args: &[&str], why: &str| {
        let out = f.run_in(&w, cwd, args);
        let err = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?} ran: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!cwd.join("RESULT.txt").exists(), "{args:?}: the agent ran");
    };
    let root_owned = tempdir_with_mode("wroot", 0o755);
    refused(root_owned.path(), &["--profile", "fake"], "owned by root");
    // With --uid the same project runs, as that uid.
    let out = f.run_in(
        &w,
        root_owned.path(),
        &["--profile", "fake", "--uid", "4322", "--print-spec"],
    );
    assert!(
        text(&out.stdout).contains("# uid: 4322"),
        "{}",
        text(&out.stderr)
    );

    std::fs::rename(f.home.path().join(".fake"), f.home.path().join("elsewhere")).unwrap();
    refused(
        f.project.path(),
        &["--profile", "fake"],
        "/.fake is not there",
    );
    std::fs::rename(f.home.path().join("elsewhere"), f.home.path().join(".fake")).unwrap();

    std::fs::remove_file(f.prefix.path().join("bin/fakeagent")).unwrap();
    refused(
        f.project.path(),
        &["--profile", "fake"],
        "agent fakeagent: not found on PATH",
    );
    refused(
        f.project.path(),
        &["--profile", "nobody"],
        "no profile nobody",
    );
}

/// The real agents' npm packages (scripts/install-test-deps).
fn agents_bin() -> PathBuf {
    let bin = repo().join("target/peers/agents/node_modules/.bin");
    for agent in ["claude", "codex"] {
        assert!(
            bin.join(agent).exists(),
            "{}: missing: run scripts/install-test-deps",
            bin.join(agent).display()
        );
    }
    bin
}

/// Claude Code and Codex, the real npm packages, start under their built-in profiles: found on
/// PATH, their installation bound read-only, their config dirs from HOME, their API host the
/// only destination.
#[test]
fn the_real_agents_start_under_their_built_in_profiles() {
    let w = Warren::up();
    let f = Fixture::new();
    let bin = agents_bin();
    for dir in [".claude", ".codex"] {
        let d = f.home.path().join(dir);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(OWNER), Some(OWNER)).unwrap();
    }
    let run_status = |args: &[&str]| {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let out = w
            .cmd(&all)
            .current_dir(f.project.path())
            .env("HOME", f.home.path())
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("WARREN_CONFIG_DIR", f.config.path())
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let run = |args: &[&str]| {
        let (code, out, err) = run_status(args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        out
    };
    let prefix = bin.parent().unwrap().canonicalize().unwrap();
    let project = f.project.path().display().to_string();
    let home = f.home.path().display().to_string();
    for (agent, host, config) in [
        ("claude", "api.anthropic.com", ".claude"),
        ("codex", "api.openai.com", ".codex"),
    ] {
        let shown = run(&["--profile", agent, "--print-spec"]);
        for line in [
            format!("# profile: {agent} (built in)"),
            format!("# cwd: {project}"),
            format!("# uid: {OWNER}"),
            format!("bind -r {0} {0}", prefix.display()),
            format!("bind -w {project} {project}"),
            format!("bind -w {home}/{config} /home/agent/{config}"),
            format!("net proxy {host}"),
        ] {
            assert!(
                shown.lines().any(|l| l == line),
                "{agent}: no line {line:?} in\n{shown}"
            );
        }
    }
    assert_eq!(
        run(&["--profile", "codex", "--", "--version"]).trim(),
        "codex-cli 0.171.0"
    );
    assert_eq!(
        run(&["--profile", "claude", "--", "--version"]).trim(),
        "2.1.337 (Claude Code)"
    );
    // An agent that fails fails the run: Claude with no key gives up, and so does warren run.
    let (code, out, err) = run_status(&["--profile", "claude", "--", "-p", "hello"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("Not logged in"), "{out}{err}");
}

/// A scripted model API (scripts/scripted-model-api) for `host` on 443, in a network namespace
/// playing the internet (as netgrant.rs's): the API's certificate is signed by a test CA
/// (`dir/ca.pem`), and a DNS server there answers `host` with the namespace's address. warren's
/// proxy is pointed at that DNS server, so the agent reaches `host` exactly as in production:
/// `HTTPS_PROXY`, CONNECT by name, the gate, TLS to the real name.
struct ModelApi {
    server: std::process::Child,
    ip: String,
    /// `ca.pem`, the leaf, the script and the request log (`requests.jsonl`).
    dir: tempfile::TempDir,
    /// Last: the servers end before their network namespace goes.
    _link: common::netns::Link,
}

impl ModelApi {
    fn start(host: &'static str, turns: &serde_json::Value) -> ModelApi {
        use std::io::BufRead;
        let link = common::netns::Link::in_prefix("11.232");
        let ip = link.inside_ip.clone();
        let dir = tempdir_with_mode("wmodel", 0o755);
        warren_test_support::tls::test_ca(dir.path(), &[host]);
        std::fs::write(dir.path().join("script.json"), turns.to_string()).unwrap();
        let (d, at) = (dir.path().to_path_buf(), ip.clone());
        let mut server = link.inside(move || {
            std::process::Command::new(repo().join("scripts/scripted-model-api"))
                .arg("--script")
                .arg(d.join("script.json"))
                .arg("--log")
                .arg(d.join("requests.jsonl"))
                .args(["--listen", &format!("{at}:443"), "--cert"])
                .arg(d.join("leaf.pem"))
                .arg("--key")
                .arg(d.join("leaf.key"))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("scripts/scripted-model-api runs")
        });
        // It prints its port once it listens.
        let mut port = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        assert_eq!(port.trim(), "443", "scripted-model-api printed {port:?}");
        let at = ip.clone();
        let dns = link.inside(move || std::net::UdpSocket::bind(format!("{at}:53")).unwrap());
        let addr: std::net::Ipv4Addr = ip.parse().unwrap();
        std::thread::spawn(move || common::netns::answer_dns(&dns, &[(host, addr)]));
        ModelApi {
            server,
            ip,
            dir,
            _link: link,
        }
    }

    /// The requests it received, in order (`{"method", "path", "body"}`).
    fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The model requests among them (`POST path`): Claude Code also asks
    /// `GET /api/claude_code/settings` and `…/policy_limits`, Codex first asks for a WebSocket
    /// (`GET /v1/responses`); unscripted, answered 400 and 404, which they take.
    fn posts(&self, path: &str) -> Vec<serde_json::Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["method"] == "POST" && r["path"] == path)
            .collect()
    }

    /// [`ModelApi::posts`] of Anthropic Messages, as Claude Code asks.
    fn messages(&self) -> Vec<serde_json::Value> {
        self.posts("/v1/messages?beta=true")
    }
}

impl Drop for ModelApi {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// `warren run --profile AGENT -- ARGS…` in the fixture's project, against `api`: warren up
/// with its proxy asking the API's DNS; the agent's config dir (`.claude`, `.codex`: owned by
/// the project's owner) holds the test CA, named by `ca_env` (a path the profile binds).
fn run_agent(
    f: &Fixture,
    api: &ModelApi,
    agent: &str,
    ca_env: &str,
    args: &[&str],
) -> (Warren, Output) {
    let bin = agents_bin();
    let w = Warren::up_with(&[("WARREN_NETPROXY_DNS", &format!("{}:53", api.ip))]);
    let config = f.home.path().join(format!(".{agent}"));
    std::fs::create_dir(&config).unwrap();
    std::fs::copy(api.dir.path().join("ca.pem"), config.join("ca.pem")).unwrap();
    for p in [&config, &config.join("ca.pem")] {
        std::os::unix::fs::chown(p, Some(OWNER), Some(OWNER)).unwrap();
    }
    let mut all = vec!["run", "--profile", agent, "--"];
    all.extend_from_slice(args);
    let out = w
        .cmd(&all)
        .current_dir(f.project.path())
        .env("HOME", f.home.path())
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("WARREN_CONFIG_DIR", f.config.path())
        .env("ANTHROPIC_API_KEY", "sk-ant-test")
        .env("OPENAI_API_KEY", "sk-test")
        .env(ca_env, format!("/home/agent/.{agent}/ca.pem"))
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .unwrap();
    (w, out)
}

/// [`run_agent`]: `claude -p TASK --dangerously-skip-permissions`, trusting the test CA by
/// `NODE_EXTRA_CA_CERTS`.
fn run_claude(f: &Fixture, api: &ModelApi, task: &str) -> (Warren, Output) {
    run_agent(
        f,
        api,
        "claude",
        "NODE_EXTRA_CA_CERTS",
        &["-p", task, "--dangerously-skip-permissions"],
    )
}

/// [`run_agent`]: `codex exec --skip-git-repo-check TASK`, trusting the test CA by
/// `SSL_CERT_FILE`, under the built-in profile (which sets no `mem`: on a host with no writable
/// cgroup v2, such as this one, `limit mem` is RLIMIT_AS, and Codex's code-mode host, the V8
/// isolate its `exec` tool runs in, dies under it).
fn run_codex(f: &Fixture, api: &ModelApi, task: &str) -> (Warren, Output) {
    run_agent(
        f,
        api,
        "codex",
        "SSL_CERT_FILE",
        &["exec", "--skip-git-repo-check", task],
    )
}

/// Claude Code, the real package, under its built-in profile, talks to a scripted Anthropic
/// Messages API at `api.anthropic.com` through warren's proxy: told by the model, its Bash tool
/// tries to `cat` a planted secret in the operator's HOME (outside the grant) and fails — the
/// tool_result it sends back says so and carries none of the secret — and its Write tool writes
/// the task's file in the project, owned by the project's owner; the connection to the API is
/// an `effect` receipt.
#[test]
fn claude_code_finishes_a_scripted_task_and_cannot_read_a_planted_secret() {
    let f = Fixture::new();
    let secret = f.home.path().join("secret");
    let done = f.project.path().join("DONE.txt");
    let api = ModelApi::start(
        "api.anthropic.com",
        &serde_json::json!([
            {"tool_use": {"name": "Bash", "input": {
                "command": format!("cat {}", secret.display()),
                "description": "Read the secret"}}},
            {"tool_use": {"name": "Write", "input": {
                "file_path": done.display().to_string(), "content": "done\n"}}},
            {"text": "All done."}
        ]),
    );
    let (w, out) = run_claude(&f, &api, "Write DONE.txt");
    let requests = api.messages();
    assert_finished(&out, &requests);
    assert_eq!(text(&out.stdout).trim(), "All done.");
    assert_eq!(requests.len(), 3, "{requests:#?}");
    for r in &requests {
        assert_eq!(r["body"]["stream"], true, "{r:#?}");
    }
    // The second request answers the Bash tool_use: the cat failed, and nothing of the secret
    // left the namespace.
    let sent = requests[1]["body"]["messages"].to_string();
    assert!(!sent.contains("the operator's secret"), "{sent}");
    let answer = &requests[1]["body"]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"][0];
    assert_eq!(answer["type"], "tool_result", "{answer:#?}");
    assert_eq!(answer["is_error"], true, "{answer:#?}");
    assert!(
        answer["content"]
            .to_string()
            .contains("No such file or directory"),
        "{answer:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "the operator's secret\n"
    );
    assert_done_by_the_owner(&done);
    assert_api_receipted(&w, &api, "api.anthropic.com");
}

/// The agent's run ended well (the model API's requests shown if not).
fn assert_finished(out: &Output, requests: &[serde_json::Value]) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}\nrequests: {requests:#?}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The task's file, written by the agent's own tool, holds what it was told and belongs to the
/// project's owner.
fn assert_done_by_the_owner(done: &std::path::Path) {
    assert_eq!(std::fs::read_to_string(done).unwrap(), "done\n");
    assert_eq!(std::fs::metadata(done).unwrap().uid(), OWNER);
}

/// The model API answers the agent's first request with an error: the agent gives up after that
/// one request, and `warren run` exits non-zero with it, having written nothing.
fn assert_an_api_error_fails_the_run(
    f: &Fixture,
    api: &ModelApi,
    out: &Output,
    requests: Vec<serde_json::Value>,
) {
    assert_eq!(requests.len(), 1, "{:#?}", api.requests());
    assert_ne!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!f.project.path().join("DONE.txt").exists());
}

/// The gate allowed `net:HOST:443`, and each connection to `host` is an `effect` receipt from
/// the API's address that carried bytes.
fn assert_api_receipted(w: &Warren, api: &ModelApi, host: &str) {
    common::wait_until("the API connection's effect receipt", || {
        common::all_receipts(w)
            .iter()
            .any(|r| r["kind"] == "effect" && r["subject"]["host"] == host)
    });
    let receipts = common::all_receipts(w);
    let effects: Vec<_> = receipts
        .iter()
        .filter(|r| r["kind"] == "effect" && r["subject"]["host"] == host)
        .map(|r| &r["subject"])
        .collect();
    assert!(
        effects
            .iter()
            .all(|e| e["address"] == format!("{}:443", api.ip).as_str()
                && e["bytes_client_to_server"].as_u64().unwrap() > 0),
        "{effects:#?}"
    );
    let tool = format!("net:{host}:443");
    assert!(
        receipts.iter().any(|r| r["kind"] == "decision"
            && r["subject"]["tool"] == tool.as_str()
            && r["subject"]["verdict"] == "allow"),
        "no allow decision for {tool}: {receipts:#?}"
    );
}

/// The scripted API answers Claude's first request with an error: Claude gives up, and `warren
/// run` exits non-zero with it, having written nothing.
#[test]
fn claude_code_failing_on_a_model_api_error_fails_warren_run() {
    let f = Fixture::new();
    let api = ModelApi::start("api.anthropic.com", &serde_json::json!([{"error": 400}]));
    let (_w, out) = run_claude(&f, &api, "Write DONE.txt");
    assert_an_api_error_fails_the_run(&f, &api, &out, api.messages());
}

/// Codex, the real package, under its built-in profile ([`run_codex`]),
/// talks to a scripted OpenAI Responses API
/// at `api.openai.com` through warren's proxy (trusting the test CA by `SSL_CERT_FILE`): told by
/// the model, its shell tool (`exec_command`, called from its `exec` tool) tries to `cat` a
/// planted secret in the operator's HOME and fails — the tool output it sends back says so and
/// carries none of the secret — then writes the task's file in the project, owned by the
/// project's owner; the connection to the API is an `effect` receipt.
#[test]
fn codex_finishes_a_scripted_task_and_cannot_read_a_planted_secret() {
    let f = Fixture::new();
    let secret = f.home.path().join("secret");
    let done = f.project.path().join("DONE.txt");
    let shell = |cmd: &str| {
        serde_json::json!({"custom_tool_call": {"name": "exec", "input": format!(
            "const r = await tools.exec_command({{cmd: {}}});\ntext(r);",
            serde_json::Value::from(cmd)
        )}})
    };
    let api = ModelApi::start(
        "api.openai.com",
        &serde_json::json!([
            shell(&format!("cat {}", secret.display())),
            shell("echo done > DONE.txt"),
            {"text": "All done."}
        ]),
    );
    let (w, out) = run_codex(&f, &api, "Write DONE.txt");
    let requests = api.posts("/v1/responses");
    assert_finished(&out, &requests);
    assert!(
        text(&out.stdout).contains("All done."),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(requests.len(), 3, "{requests:#?}");
    let sent = requests[1]["body"]["input"].to_string();
    assert!(!sent.contains("the operator's secret"), "{sent}");
    let answer = requests[1]["body"]["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "custom_tool_call_output" && i["call_id"] == "call_0")
        .unwrap_or_else(|| panic!("no output for call_0: {sent}"))
        .to_string();
    assert!(answer.contains("No such file or directory"), "{answer}");
    assert_done_by_the_owner(&done);
    assert_api_receipted(&w, &api, "api.openai.com");
}

/// The scripted API answers Codex's first request with an error: Codex gives up, and `warren
/// run` exits non-zero with it, having written nothing.
#[test]
fn codex_failing_on_a_model_api_error_fails_warren_run() {
    let f = Fixture::new();
    let api = ModelApi::start("api.openai.com", &serde_json::json!([{"error": 400}]));
    let (_w, out) = run_codex(&f, &api, "Write DONE.txt");
    assert_an_api_error_fails_the_run(&f, &api, &out, api.posts("/v1/responses"));
}
