//! `warren sh` driven through a real terminal (tmux): the daemons' trees are files under /n, an
//! ask is answered by writing its ctl file, and `allow always` is refused there.
//! Needs root, /dev/fuse, tmux and the workspace's binaries.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Warren, fingerprint};

/// A tmux server of our own (its socket in a temp dir), killed on drop.
struct Tmux {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmux {
    fn start(command: &str) -> Tmux {
        let dir = tempfile::Builder::new()
            .prefix("wtmx")
            .tempdir_in("/tmp")
            .unwrap();
        let t = Tmux {
            socket: dir.path().join("s"),
            _dir: dir,
        };
        let ok = t
            .tmux(&["new-session", "-d", "-x", "200", "-y", "60", command])
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux new-session failed");
        t
    }

    fn tmux(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket).args(args);
        c
    }

    fn screen(&self) -> String {
        let out = self
            .tmux(&["capture-pane", "-p", "-J", "-S", "-200"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types a line and presses Enter.
    fn line(&self, text: &str) {
        assert!(
            self.tmux(&["send-keys", "-l", text])
                .status()
                .unwrap()
                .success()
        );
        assert!(
            self.tmux(&["send-keys", "Enter"])
                .status()
                .unwrap()
                .success()
        );
    }

    /// Runs `command` in the shell and returns what it printed: the screen after the line that
    /// typed it, up to a marker only the shell's arithmetic prints (so the typed line, which
    /// holds the marker's formula, never matches).
    fn run(&self, command: &str, tag: &str) -> String {
        self.line(&format!("{command}; echo {tag}-$((6*7))"));
        let done = format!("{tag}-42");
        let screen = self.wait_for(&format!("{done}\n"));
        let typed = format!("echo {tag}-$((6*7))");
        let start = screen.rfind(&typed).expect("the typed line") + typed.len();
        let end = screen.rfind(&done).unwrap();
        screen[start..end].to_owned()
    }

    /// Waits (bounded) until the screen shows `needle`; returns the screen.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if screen.contains(needle) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the screen never showed {needle:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]).status();
    }
}

fn have_tmux() -> bool {
    Command::new("tmux").arg("-V").output().is_ok()
}

#[test]
fn the_operator_shell_answers_an_ask_by_writing_its_ctl_and_cannot_allow_always() {
    assert!(
        have_tmux(),
        "tmux is not installed (scripts/install-test-deps installs it)"
    );
    let w = Warren::up();
    // Two asks, as a namespace's exec calls would make them.
    let ask = |cmd: &str| -> i64 {
        let req = format!(
            r#"{{"session":"0123456789abcdef0123456789abcdef","tool":"shell","args":{{"command":"{cmd}"}}}}"#
        );
        let out = w.run(&["write", "/gate/decide", &req]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["decision"], "ask", "{v}");
        v["pending"].as_i64().unwrap()
    };
    // A bidi override in the arguments: the shell shows the gate's escaped request.
    let first = ask("make test \u{202E}x");
    let second = ask("make bench");
    let request = |id: i64| {
        String::from_utf8(
            w.run(&["cat", &format!("/gate/pending/{id}/request")])
                .stdout,
        )
        .unwrap()
    };
    let fp = fingerprint(&request(first)).to_owned();

    let base = w.base.path();
    let command = format!(
        "env SHELL=/bin/sh WARREN_RUNTIME_DIR={} WARREN_DATA_DIR={} WARREN_SECRETS_DIR={} {} sh; \
         echo SHELL-ENDED $?; sleep 600",
        w.runtime().display(),
        base.join("data").display(),
        base.join("secrets").display(),
        env!("CARGO_BIN_EXE_warren"),
    );
    let t = Tmux::start(&command);
    t.wait_for("holds operator authority");
    let uid = t.run("id -u", "UID");
    assert_ne!(uid.trim(), "0", "the operator's shell runs as uid 0");

    // Everything is plain files.
    let tools = t.run("cat /n/tool/tools", "TOOLS");
    for tool in ["echo", "fs_read", "shell"] {
        assert!(
            tools.lines().any(|l| l.starts_with(tool)),
            "{tool} not in /n/tool/tools:\n{tools}"
        );
    }
    let pending = t.run("ls /n/gate/pending", "PENDING");
    for id in [first, second] {
        assert!(
            pending.split_whitespace().any(|w| w == id.to_string()),
            "ask {id} not in /n/gate/pending: {pending}"
        );
    }
    let shown = t.run(&format!("cat /n/gate/pending/{first}/request"), "REQUEST");
    assert!(shown.contains(r"make test \u{202E}x"), "{shown}");
    assert!(!shown.contains('\u{202E}'), "{shown}");

    // Answered exactly as a person would: the gate records the operator's allow once.
    let said = t.run(
        &format!("echo 'allow once {fp}' > /n/gate/pending/{first}/ctl && echo ANSWERED"),
        "ONCE",
    );
    assert!(said.contains("ANSWERED"), "{said}");
    let answered = request(first);
    assert!(
        answered.contains("state answered") && answered.contains("outcome allow"),
        "{answered}"
    );

    // `allow always` is not the shell's to give: the write fails and the ask stays open.
    let said = t.run(
        &format!("echo 'allow always' > /n/gate/pending/{second}/ctl || echo REFUSED"),
        "ALWAYS",
    );
    assert!(said.contains("REFUSED"), "{said}");
    assert!(
        request(second).contains("state open"),
        "{}",
        request(second)
    );

    // The other trees are there too, and leaving the shell ends the namespace.
    let listed = t.run("ls /n/ns /n/receipts", "LISTED");
    assert!(
        listed.contains("clone") && listed.contains("keys"),
        "{listed}"
    );
    t.line("exit 7");
    t.wait_for("SHELL-ENDED 7");
}
