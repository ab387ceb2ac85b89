//! The operator's side of the front door: completions and the man page from the clap
//! definitions, the systemd unit in dist/, `warren log` (plain words, JSON, following),
//! `warren ps`/`warren ns`, and `warren down` refusing to strand live namespaces.

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Warren;

fn warren() -> Command {
    Command::new(env!("CARGO_BIN_EXE_warren"))
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Completion scripts exist for every shell clap_complete knows; bash's parses and registers
/// a completion for `warren` that offers the subcommands.
#[test]
fn completions_are_generated_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout_of(warren().args(["completions", shell]));
        assert!(
            script.contains("warren") && script.contains("approvals"),
            "{shell}: {script}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("warren.bash");
    std::fs::write(&file, stdout_of(warren().args(["completions", "bash"]))).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        syntax.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    // Sourced, it registers itself, and completing `warren l` offers `log` and `ls`.
    let probe = format!(
        "source {}; complete -p warren; COMP_WORDS=(warren l); COMP_CWORD=1; COMP_LINE='warren l'; \
         COMP_POINT=8; _warren warren l warren; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        file.display()
    );
    let out = stdout_of(Command::new("bash").args(["-c", &probe]));
    assert!(out.contains("-F _warren warren"), "{out}");
    let offered: Vec<&str> = out.lines().skip(1).collect();
    assert!(
        offered.contains(&"log") && offered.contains(&"ls"),
        "{offered:?}"
    );
    // A bad shell name is a usage error, not an empty script.
    let bad = warren().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// The man page is roff naming every subcommand; `--dir` writes one page per subcommand; groff
/// renders it (when the host has groff).
#[test]
fn the_man_page_names_every_subcommand_and_renders() {
    let page = stdout_of(warren().arg("man"));
    assert!(
        page.starts_with(".ie") || page.contains(".TH warren"),
        "{page}"
    );
    for sub in ["up", "down", "log", "ps", "ns", "verify", "completions"] {
        assert!(
            page.contains(&format!("warren\\-{sub}")) || page.contains(&format!("\\fB{sub}\\fR")),
            "the page does not name {sub}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    stdout_of(warren().args(["man", "--dir"]).arg(dir.path()));
    for name in ["warren.1", "warren-log.1", "warren-down.1", "warren-ps.1"] {
        assert!(dir.path().join(name).exists(), "{name} not written");
    }
    assert!(
        have("groff"),
        "groff is not installed (scripts/install-test-deps installs groff-base)"
    );
    // Every page, with every warning on (-k: UTF-8 input through preconv, as man(1) does).
    for page in std::fs::read_dir(dir.path()).unwrap() {
        let page = page.unwrap().path();
        let rendered = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
            .arg(&page)
            .output()
            .unwrap();
        assert!(
            rendered.status.success() && rendered.stderr.is_empty(),
            "groff on {}: {}",
            page.display(),
            String::from_utf8_lossy(&rendered.stderr)
        );
    }
    let text = stdout_of(
        Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-P-cbou"])
            .arg(dir.path().join("warren-log.1")),
    );
    assert!(text.contains("--follow"), "{text}");
}

/// `warren man --dir` never writes a page through what someone planted in the directory: a
/// symlink at `warren.1` (to the operator's `.bashrc`) or a FIFO at a subcommand's page is
/// refused with the path named, and the symlink's target keeps its content and mode.
#[test]
fn man_pages_are_never_written_through_a_planted_file() {
    let base = tempfile::tempdir().unwrap();
    let bashrc = common::operators_bashrc(base.path());
    let dir = base.path().join("man");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(&bashrc, dir.join("warren.1")).unwrap();
    let out = warren().args(["man", "--dir"]).arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: is a symbolic link: refusing to write it",
            dir.join("warren.1").display()
        )),
        "{stderr}"
    );
    common::assert_bashrc_untouched(&bashrc);
    let fifo_dir = base.path().join("man2");
    std::fs::create_dir(&fifo_dir).unwrap();
    let fifo = fifo_dir.join("warren-log.1");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let out = warren()
        .args(["man", "--dir"])
        .arg(&fifo_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}: is not a regular file", fifo.display())),
        "{stderr}"
    );
}

/// A command whose reader goes away (`warren keys init | head -1`) ends as coreutils do: killed
/// by SIGPIPE, quietly, with no panic. The pipe's read end is closed before the command starts,
/// so its first write meets a closed pipe.
#[test]
fn a_command_whose_reader_goes_away_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let secrets = tempfile::tempdir().unwrap();
    let runs: [&[&str]; 3] = [&["keys", "init"], &["man"], &["completions", "bash"]];
    for args in runs {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = warren()
            .args(args)
            .env("WARREN_SECRETS_DIR", secrets.path().join("secrets"))
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "warren {args:?}: {stderr}");
        assert_eq!(
            out.status.signal(),
            Some(nix::libc::SIGPIPE),
            "warren {args:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.is_empty(), "warren {args:?}: {stderr}");
    }
}

/// The shipped unit runs a real binary with a real subcommand, sets exactly the directories the
/// code reads (with the code's defaults), and passes `systemd-analyze verify`.
#[test]
fn the_systemd_unit_names_real_binaries_and_flags() {
    let unit_path = repo_root().join("dist/systemd/warren.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let value = |key: &str| -> Vec<&str> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    };
    let exec = value("ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(
        Path::new(words[0]).file_name().unwrap(),
        "warren-supervisor"
    );
    assert!(Path::new(words[0]).is_absolute());
    let supervisor = warren_test_support::bins::bin("warren-supervisor");
    // The flags parse: `--help` after them succeeds only if they do.
    let mut help = Command::new(&supervisor);
    help.args(&words[1..]).arg("--help");
    stdout_of(&mut help);
    assert_eq!(value("Type"), ["notify"]);

    let defaults = [
        ("WARREN_RUNTIME_DIR", warren_daemon::dirs::DEFAULT_RUNTIME),
        ("WARREN_DATA_DIR", warren_daemon::dirs::DEFAULT_DATA),
        ("WARREN_SECRETS_DIR", warren_daemon::dirs::DEFAULT_SECRETS),
    ];
    let env = value("Environment");
    assert_eq!(env.len(), defaults.len(), "{env:?}");
    for (name, default) in defaults {
        assert!(
            env.contains(&format!("{name}={default}").as_str()),
            "{name} missing or not the default: {env:?}"
        );
    }

    assert!(
        have("systemd-analyze"),
        "systemd-analyze is not installed (scripts/install-test-deps installs systemd)"
    );
    // verify checks that ExecStart exists: point it at the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("warren.service");
    std::fs::write(&copy, unit.replace(words[0], supervisor.to_str().unwrap())).unwrap();
    // verify also checks that `Documentation=man:warren(1)` resolves: give it the pages
    // `warren man --dir` writes, as a package would install them.
    let man1 = dir.path().join("man/man1");
    stdout_of(warren().args(["man", "--dir"]).arg(&man1));
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .env("MANPATH", dir.path().join("man"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `Type=notify`: started as systemd starts it, the supervisor sends `READY=1` to
/// `$NOTIFY_SOCKET` once every daemon answers.
#[test]
fn the_supervisor_tells_systemd_it_is_ready() {
    let w = Warren::up();
    // Stop the harness's supervisor: this test starts its own, as systemd would.
    assert!(w.run(&["down"]).status.success());
    let notify = w.base.path().join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    let mut supervisor = w
        .supervisor()
        .env("NOTIFY_SOCKET", &notify)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A guard against a hang, not a timing assertion.
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = socket
        .recv(&mut buf)
        .expect("no READY=1 from the supervisor");
    assert_eq!(&buf[..n], b"READY=1");
    // Ready means ready: the daemons answer now.
    let status = stdout_of(&mut w.cmd(&["status", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        v["daemons"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["answers"] == true),
        "{v}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    assert!(supervisor.wait().unwrap().success());
}

/// One receipt per line in plain words; `--json` one object per receipt; `-f` prints receipts
/// of calls made after it started, including new scopes, without being asked again.
#[test]
fn log_prints_receipts_in_words_and_follows_new_ones() {
    let w = Warren::up();
    let call = |text: &str| -> serde_json::Value {
        let out = w.run(&["call", "echo", &format!(r#"{{"text":"{text}"}}"#)]);
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let first = call("one");
    let scope = first["receipt"]["scope"].as_str().unwrap().to_owned();

    // The effect receipt is queued off the call's path: wait for it to be written.
    let mut words = String::new();
    for _ in 0..500 {
        words = String::from_utf8(w.run(&["log", &scope]).stdout).unwrap();
        if words.lines().count() >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let lines: Vec<&str> = words.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "a decision and a query (echo is read-tier):\n{words}"
    );
    assert!(
        lines[0].contains(" decision ") && lines[0].contains("echo") && lines[0].contains("allow"),
        "{words}"
    );
    assert!(lines[0].contains(&scope[..8]));
    assert!(
        lines[1].contains(" query ") && lines[1].contains("ran: ok (decision #0)"),
        "{words}"
    );

    let json = String::from_utf8(w.run(&["log", "--json", &scope[..12]]).stdout).unwrap();
    let objects: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["decision", "query"]);
    assert_eq!(objects[0]["verdict"], "allow");
    assert_eq!(objects[1]["seq"], 1);

    // Every scope, in clock order: receiptd's own boot receipt comes first.
    let all = String::from_utf8(w.run(&["log"]).stdout).unwrap();
    assert!(
        all.lines().next().unwrap().contains("receiptd start"),
        "{all}"
    );
    // An unknown scope is an error that says so.
    let none = w.run(&["log", "ffffffffffff"]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no scope starting with"));

    // Following: start it, see the existing receipts, then a new call's appear.
    let mut follow = w
        .cmd(&["log", "-f", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut seen_first = 0;
    while seen_first < 2 {
        let v: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if v["scope"] == scope.as_str() {
            seen_first += 1;
        }
    }
    let second = call("two");
    let new_scope = second["receipt"]["scope"].as_str().unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let v: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if v["scope"] == new_scope {
            kinds.push(v["kind"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(kinds, ["decision", "query"]);
    let _ = follow.kill();
    let _ = follow.wait();
}

/// Starts `/bin/sleep 600` in a namespace made through nsd's `/ns/clone`; returns its id.
fn start_namespace(w: &Warren) -> u64 {
    let spec = "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";
    let out = w.run_ok(&["write", "/ns/clone", spec]);
    let id: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    w.run_ok(&["write", &format!("/ns/{id}/ctl"), "run /bin/sleep 600"]);
    id
}

/// A namespace's words are shown escaped. ESC sequences written into a clone's `ctl run …`
/// words (drawing a forged `warren ps` row) leave `warren ps` one printable row for that
/// namespace while `--json` keeps the exact words; a child spec whose mount path holds a
/// right-to-left override is refused.
#[test]
fn warren_ps_shows_a_namespaces_hostile_words_escaped() {
    let w = Warren::up();
    let spec = "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";
    let out = w.run_ok(&["write", "/ns/clone", spec]);
    let id: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let forged =
        "\x1b[2K\x1b[1A\r99    running 1s      /tool            echo                 /bin/true";
    let words = format!("run /bin/sh -c 'exec sleep 600' '{forged}' 'a\nb' '\u{202E}txt.exe'");
    w.run_ok(&["write", &format!("/ns/{id}/ctl"), &words]);
    let row = wait_for_row(&w, |v| {
        v["id"] == id && v["status"].as_str().unwrap().starts_with("running")
    });
    assert_eq!(
        row["argv"],
        serde_json::json!([
            "/bin/sh",
            "-c",
            "exec sleep 600",
            forged,
            "a\nb",
            "\u{202E}txt.exe"
        ])
    );
    let text = String::from_utf8(w.run(&["ps"]).stdout).unwrap();
    assert!(
        !text
            .chars()
            .any(|c| c != '\n' && warren_daemon::escape::misleads(c)),
        "warren ps printed a raw control or bidi code point: {text:?}"
    );
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("exec sleep 600"))
        .collect();
    assert_eq!(rows.len(), 1, "{text}");
    assert!(rows[0].starts_with(&format!("{id} ")), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("99 ")),
        "a forged row: {text}"
    );
    let json = String::from_utf8(w.run(&["ps", "--json"]).stdout).unwrap();
    assert!(
        !json
            .chars()
            .any(|c| c != '\n' && warren_daemon::escape::misleads(c)),
        "{json:?}"
    );

    // A child spec's mount path with U+202E: refused (the clone answers no id), and no
    // namespace lists such a path.
    let out = w.run(&["write", "/ns/clone", "mount gate /n/\u{202E}etag\n"]);
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(
        said.trim().parse::<u64>().is_err(),
        "a namespace was made: {said}"
    );
    let all = String::from_utf8(w.run(&["ps", "--all", "--json"]).stdout).unwrap();
    assert!(!all.contains("etag"), "{all}");
    assert!(w.run(&["down", "--force"]).status.success());
}

/// Waits (bounded) until `warren ps --json` shows a namespace `matches` accepts.
fn wait_for_row(w: &Warren, matches: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ps = String::from_utf8(w.run(&["ps", "--json"]).stdout).unwrap();
        if let Some(row) = ps
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| matches(v))
        {
            return row;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no such namespace in ps: {ps}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ns_status(w: &Warren, id: u64) -> String {
    String::from_utf8(w.run(&["cat", &format!("/ns/{id}/status")]).stdout).unwrap()
}

/// `warren ps` lists a running namespace, `warren ns` prints its spec, and `warren down`
/// refuses to strand it (listing it) until `--force`, which kills it first.
#[test]
fn down_refuses_to_strand_live_namespaces_until_forced() {
    let w = Warren::up();
    let id = start_namespace(&w);
    // And one `warren run` started, holding a tool.
    let mut launcher = w
        .cmd(&["run", "--tool", "echo", "--", "/bin/sleep", "600"])
        .spawn()
        .unwrap();
    let run_row = wait_for_row(&w, |v| {
        v["origin"] == "run" && v["status"].as_str().unwrap().starts_with("running")
    });
    assert_eq!(run_row["argv"], serde_json::json!(["/bin/sleep", "600"]));
    assert_eq!(run_row["tools"], serde_json::json!(["echo"]));
    assert_eq!(run_row["mounts"][0]["path"], "/tool");
    assert_eq!(run_row["session"].as_str().unwrap().len(), 32);
    let run_id = run_row["id"].as_u64().unwrap();
    let holder: i32 = ns_status(&w, id)
        .trim()
        .strip_prefix("running holder=")
        .expect("running")
        .parse()
        .unwrap();

    let ps = String::from_utf8(w.run(&["ps", "--json"]).stdout).unwrap();
    let row: serde_json::Value = ps
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("namespace {id} not in ps: {ps}"));
    assert_eq!(row["holder"], holder);
    assert!(row["status"].as_str().unwrap().starts_with("running"));
    let text = String::from_utf8(w.run(&["ps"]).stdout).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with(&format!("{id} "))),
        "{text}"
    );
    let spec = String::from_utf8(w.run(&["ns", &id.to_string()]).stdout).unwrap();
    assert!(spec.contains("bind -r /usr /usr"), "{spec}");

    let refused = w.run(&["down"]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    for listed in [id, run_id] {
        assert!(
            err.contains("refused") && err.contains(&format!("namespace {listed} ")),
            "{err}"
        );
    }
    // Nothing was stopped: the daemons answer and the namespace still runs.
    assert!(w.run(&["status"]).status.success());
    assert!(
        ns_status(&w, id).starts_with("running"),
        "{}",
        ns_status(&w, id)
    );

    let forced = w.run_ok(&["down", "--force"]);
    let said = String::from_utf8_lossy(&forced.stdout);
    assert!(said.contains(&format!("killed namespace {id} ")), "{said}");
    assert!(
        said.contains(&format!("killed namespace {run_id} ")),
        "{said}"
    );
    // The launcher was told its namespace's end (SIGKILL: 137), not left waiting.
    assert_eq!(launcher.wait().unwrap().code(), Some(137));
    assert!(said.contains("warren is down"), "{said}");
    assert!(
        !Path::new(&format!("/proc/{holder}")).exists()
            || std::fs::read_to_string(format!("/proc/{holder}/status"))
                .is_ok_and(|s| s.contains("State:\tZ")),
        "the namespace's holder {holder} outlived down --force"
    );
}
