//! A non-root operator end to end: a throwaway user in the `warren` group (made here, removed at
//! the end) runs `warren run` through nsd and `warren attach`es to their own namespace, and may
//! not attach to one root started (the control: root can). Needs root (to make the user and
//! start the daemons), useradd/userdel, setpriv, /dev/fuse and the workspace's binaries.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::Warren;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `warren up` as root, and a throwaway operator who can reach its runtime dir; fails, saying
/// which program is missing, where the host cannot make them.
fn up_with_operator() -> (Warren, Operator) {
    for program in ["useradd", "userdel", "setpriv"] {
        let found = Command::new(program).arg("--help").output();
        assert!(
            !found.is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound),
            "{program} is missing (the test makes a throwaway operator user)"
        );
    }
    let w = Warren::up();
    // The operator must be able to pass the test's base dir to the 0750 runtime dir.
    std::fs::set_permissions(w.base.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let op = Operator::create();
    (w, op)
}

/// A throwaway system user in the `warren` group (supplementary, as `usermod -aG warren` makes
/// an operator), with no home and no login shell; removed on drop.
struct Operator {
    name: String,
    uid: u32,
}

impl Operator {
    fn create() -> Operator {
        let name = format!("wop{}", std::process::id());
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--no-user-group",
                "-G",
                "warren",
            ])
            .args(["--shell", "/usr/sbin/nologin", &name])
            .output()
            .unwrap();
        assert!(out.status.success(), "useradd: {}", text(&out.stderr));
        let uid = nix::unistd::User::from_name(&name)
            .unwrap()
            .expect("the user useradd made")
            .uid
            .as_raw();
        Operator { name, uid }
    }

    /// `cmd` run as this user, with the supplementary groups the host gives them (setpriv
    /// --init-groups, as a login would): the same program, arguments and environment.
    fn run_as(&self, cmd: &Command) -> Command {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid()))
            .arg("--init-groups")
            .arg("--")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .env("HOME", "/")
            .stdin(Stdio::null());
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        c
    }

    fn gid(&self) -> u32 {
        nix::unistd::User::from_uid(self.uid.into())
            .unwrap()
            .unwrap()
            .gid
            .as_raw()
    }

    fn output(&self, w: &Warren, args: &[&str]) -> Output {
        self.run_as(&w.cmd(args)).output().unwrap()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        // --force: a namespace of theirs still dying must not leave the user behind.
        let _ = Command::new("userdel")
            .args(["--force", &self.name])
            .status();
    }
}

/// The id of the running namespace whose `operator` is `uid`, once its command runs.
fn running_namespace_of(w: &Warren, uid: u32) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listing = text(&w.run(&["ls", "/ns"]).stdout);
        for id in listing.lines().map(|l| l.trim_end_matches('/')) {
            if id.parse::<u64>().is_err() {
                continue;
            }
            let info = text(&w.run(&["cat", &format!("/ns/{id}/info")]).stdout);
            let mine = info.lines().any(|l| l == format!("operator {uid}"));
            if mine && info.lines().any(|l| l.starts_with("holder ")) {
                return id.to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no running namespace of uid {uid}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `warren run` in the background, killed (and so its namespace) when dropped.
struct Launcher(Child);

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// As a member of the `warren` group: `warren run --tool echo -- cat /tool/tools` through nsd
/// sees the echo tool, its namespace runs under the operator's own uid, `warren attach` reaches
/// their own namespace, and attaching to a namespace root started is refused — which root itself
/// can do (the control).
#[test]
fn a_non_root_operator_runs_and_attaches_to_their_own_namespaces_only() {
    let (w, op) = up_with_operator();

    let out = op.output(&w, &["run", "--tool", "echo", "--", "cat", "/tool/tools"]);
    assert!(
        out.status.success(),
        "warren run as {}: {}",
        op.name,
        text(&out.stderr)
    );
    let tools: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect();
    assert_eq!(tools, ["echo"], "{}", text(&out.stdout));

    // Their own namespace, long-running; `warren attach` to it runs under their uid.
    let theirs = Launcher(
        op.run_as(&w.cmd(&["run", "--tool", "echo", "--", "sleep", "600"]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let their_id = running_namespace_of(&w, op.uid);
    let out = op.output(
        &w,
        &[
            "attach",
            &their_id,
            "--",
            "sh",
            "-c",
            "id -u; cat /tool/tools",
        ],
    );
    assert!(out.status.success(), "attach: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(op.uid.to_string().as_str()), "{stdout}");
    assert_eq!(
        lines
            .map(|l| l.split('\t').next().unwrap())
            .collect::<Vec<_>>(),
        ["echo"],
        "{stdout}"
    );

    // Root's namespace: the operator is refused; root attaches (the control).
    let roots = Launcher(w.spawn_sh(&["--tool", "echo"], "sleep 600"));
    let root_id = running_namespace_of(&w, 0);
    let out = op.output(&w, &["attach", &root_id, "--", "echo", "inside"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains(&format!("namespace {root_id}")),
        "{}",
        text(&out.stderr)
    );
    let out = w.run(&["attach", &root_id, "--", "echo", "inside"]);
    assert!(out.status.success(), "root: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "inside\n");

    drop(roots);
    drop(theirs);
}

/// nsd builds as root, yet a `warren` group member may not bind what they cannot reach on the
/// host: a world-readable file under a 0700 root directory is refused by name, while root's
/// same `warren run` reads it (the control), and so does the operator's for a path they can
/// reach.
#[test]
fn a_non_root_operator_cannot_bind_what_they_cannot_reach() {
    let (w, op) = up_with_operator();
    let private = w.base.path().join("private");
    let inner = private.join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(inner.join("f"), "secret\n").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(inner.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (inner, file) = (
        inner.display().to_string(),
        inner.join("f").display().to_string(),
    );

    let out = op.output(&w, &["run", "--ro", &inner, "--", "cat", &file]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        !text(&out.stdout).contains("secret"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains(&format!("uid {} cannot reach bind `{inner}`", op.uid)),
        "{}",
        text(&out.stderr)
    );
    let out = w.run(&["run", "--ro", &inner, "--", "cat", &file]);
    assert!(out.status.success(), "root: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "secret\n");

    // Made reachable, the operator's own run reads it: the refusal was the reach, nothing else.
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = op.output(&w, &["run", "--ro", &inner, "--", "cat", &file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "secret\n");
}

/// Attack (write identity for a non-root operator): `fs_write` writes as the owner of its
/// writable root. A `warren` group member who can merely reach another user's 0755 home directory
/// (as every 0755 home is) runs `warren run` with `tool fs_write -w THAT_HOME` and writes
/// `.bashrc` there, created as that user: a group member becomes any non-root user. An operator
/// must never write, through a tool, where they cannot write themselves.
#[test]
fn a_non_root_operator_never_writes_as_another_user_through_fs_write() {
    const VICTIM: u32 = 4244;
    let (w, op) = up_with_operator();
    let home = w.base.path().join("home-of-4244");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    nix::unistd::chown(home.as_path(), Some(VICTIM.into()), Some(VICTIM.into())).unwrap();
    let h = home.display().to_string();
    let rule = w.run(&["write", "/gate/rules", "allow fs_write"]);
    assert!(rule.status.success(), "{}", text(&rule.stderr));
    let spec = w.base.path().join("op.ns");
    std::fs::write(
        &spec,
        format!("mount tool /tool fs_write\ntool fs_write -w {h}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&spec, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The control: the operator cannot write there themselves.
    let own = op
        .run_as(Command::new("sh").args(["-c", &format!("echo x > {h}/own")]))
        .output()
        .unwrap();
    assert!(!own.status.success(), "the operator can write {h} itself");

    let script = format!(
        r#"exec 3<>/tool/fs_write/call; printf '{{"path":"{h}/.bashrc","content":"echo owned"}}' >&3; cat <&3"#
    );
    let out = op.output(
        &w,
        &[
            "run",
            "--ns",
            spec.to_str().unwrap(),
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    );
    let rc = home.join(".bashrc");
    let owner = std::fs::metadata(&rc).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    assert!(
        !rc.exists(),
        "operator uid {} wrote {h}/.bashrc as uid {owner:?}: {} {}",
        op.uid,
        text(&out.stdout),
        text(&out.stderr)
    );
}
