//! Authority is a handle, not a name: a namespace that can write the directory holding one of
//! its tools' roots clones a child with that tool's authority, then swaps the checked root for a
//! symlink to a directory outside every grant — after the clone's read, after `ctl run`, and
//! between two calls; by `ln -s` over a moved root and by `rename(2)` of a symlink over it. The
//! child's `fs_read`, `fs_list`, `fs_write` and `shell` must still act on the directory that was
//! checked, and nothing outside it is ever read or written. The same for a bind source.
//!
//! A version that re-opened a cloned child's tool root by name at `ctl run` gave the child's
//! `fs_read` the host's `/etc/passwd` this way.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const SYSTEM: &str =
    "bind -r /usr /usr\\nbind -r /bin /bin\\nbind -r /lib /lib\\nbind -r /lib64 /lib64\\n";

/// The parent's payload. `scenario NAME TOOL STAGE SWAP ARGS` clones a child holding only TOOL
/// (its authority: the root `$R`), and swaps `$R` for a symlink to `$OUT` at STAGE (`read`:
/// after the clone's read, before `ctl run`; `run`: after `ctl run`, before the first call;
/// `between`: between the child's two calls) by SWAP (`symlink`: the root moved away and a
/// symlink made in its place; `rename`: a symlink renamed over the moved root's name). The
/// child writes each call's envelope to `/out/NAME-1` and `/out/NAME-2`.
const PARENT_SH: &str = r#"
set -eu
R=/data/root
HR=@HOSTROOT@
OUT=@OUTSIDE@
clone() {
  exec 3<>/ns/clone
  printf "$1" >&3
  id=$(cat <&3)
  exec 3<&-
  echo "$id"
}
swap() {
  mv "$R" "$R.real"
  case "$1" in
    symlink) ln -s "$OUT" "$R" ;;
    rename) ln -s "$OUT" "$R.evil"; mv -T "$R.evil" "$R" ;;
  esac
}
unswap() { rm "$R"; mv "$R.real" "$R"; }
wait_for() { while [ ! -e "$1" ]; do sleep 0.05; done; }
scenario() {
  name=$1 tool=$2 access=$3 stage=$4 how=$5 args=$6
  cat > /data/out/$name.sh <<EOF
call() { exec 3<>/tool/$tool/call; printf '%s' '$args' >&3; cat <&3 > /out/$name-\$1; exec 3<&-; }
if [ $stage = run ]; then while [ ! -e /out/$name.go ]; do sleep 0.05; done; fi
call 1
touch /out/$name.first
if [ $stage = between ]; then while [ ! -e /out/$name.go ]; do sleep 0.05; done; fi
call 2
EOF
  id=$(clone "@SYSTEM@bind -w /data/out /out\nmount tool /tool $tool\ntool $tool -$access $HR\n")
  if [ "$stage" = read ]; then swap "$how"; fi
  echo "run /bin/sh /out/$name.sh" > /ns/$id/ctl
  if [ "$stage" = run ]; then swap "$how"; touch /data/out/$name.go; fi
  if [ "$stage" = between ]; then wait_for /data/out/$name.first; swap "$how"; touch /data/out/$name.go; fi
  cat /ns/$id/wait > /data/out/$name.status
  unswap
}
"#;

struct Case {
    tool: &'static str,
    access: &'static str,
    args: String,
}

#[test]
fn a_swapped_tool_root_never_moves_a_cloned_childs_authority() {
    let w = Warren::up();
    let t = tempfile::Builder::new()
        .prefix("whandle")
        .tempdir_in("/tmp")
        .unwrap();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    let data = t.path().join("data");
    let root = data.join("root");
    let outside = t.path().join("outside");
    for d in [&root, &outside, &data.join("out")] {
        std::fs::create_dir_all(d).unwrap();
        mode(d, 0o777);
    }
    mode(t.path(), 0o755);
    mode(&data, 0o777);
    std::fs::write(root.join("secret"), "INSIDE\n").unwrap();
    std::fs::write(outside.join("secret"), "OUTSIDE\n").unwrap();
    for d in [&root, &outside] {
        nix::unistd::chown(d.as_path(), Some(65534.into()), Some(65534.into())).unwrap();
    }
    let r = root.to_str().unwrap();

    let cases = |tool: &str, name: &str| -> Case {
        match tool {
            "fs_read" => Case {
                tool: "fs_read",
                access: "r",
                args: format!(r#"{{"path":"{r}/secret"}}"#),
            },
            "fs_list" => Case {
                tool: "fs_list",
                access: "r",
                args: format!(r#"{{"path":"{r}"}}"#),
            },
            "fs_write" => Case {
                tool: "fs_write",
                access: "w",
                args: format!(r#"{{"path":"{r}/written-{name}","content":"by the child"}}"#),
            },
            _ => Case {
                tool: "shell",
                access: "w",
                args: format!(r#"{{"command":"cat secret; echo ran >> ran-{name}","cwd":"{r}"}}"#),
            },
        }
    };
    // Every tool at every stage by a symlink; fs_read again by rename.
    let mut runs = Vec::new();
    for tool in ["fs_read", "fs_list", "fs_write", "shell"] {
        for stage in ["read", "run", "between"] {
            let name = format!("{tool}-{stage}");
            runs.push((name.clone(), cases(tool, &name), stage, "symlink"));
        }
    }
    for stage in ["read", "run", "between"] {
        let name = format!("rename-{stage}");
        runs.push((name.clone(), cases("fs_read", &name), stage, "rename"));
    }

    let mut script = PARENT_SH
        .replace("@HOSTROOT@", r)
        .replace("@OUTSIDE@", outside.to_str().unwrap())
        .replace("@SYSTEM@", SYSTEM);
    let mut tools = std::collections::BTreeSet::new();
    for (name, case, stage, how) in &runs {
        script.push_str(&format!(
            "scenario {name} {} {} {stage} {how} '{}'\n",
            case.tool, case.access, case.args
        ));
        tools.insert((case.tool, case.access));
    }
    let mut spec = format!(
        "{}bind -w {} /data\nmount ns /ns\nmount tool /tool",
        SYSTEM.replace("\\n", "\n"),
        data.display()
    );
    for (tool, _) in &tools {
        spec.push_str(&format!(" {tool}"));
    }
    spec.push('\n');
    for (tool, access) in &tools {
        spec.push_str(&format!("tool {tool} -{access} {r}\n"));
    }
    let spec_path = w.base.path().join("parent.ns");
    std::fs::write(&spec_path, &spec).unwrap();

    let mut agent = w.spawn_run(&[
        "--asks",
        "operator",
        "--ns",
        spec_path.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    // The operator allows every ask (fs_write and shell are asked); the test is about what an
    // allowed call can reach.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut answered = 0;
    let mut last = 0;
    while agent.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the parent did not finish");
        let out = w.run(&["ls", "/gate/pending"]);
        let ids: Vec<i64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim_end_matches('/').parse().ok())
            .filter(|&id| id > last)
            .collect();
        for id in ids {
            let req = w.run(&["cat", &format!("/gate/pending/{id}/request")]);
            let req = String::from_utf8_lossy(&req.stdout).into_owned();
            let verb = format!("allow once {}", fingerprint(&req));
            w.run(&["write", &format!("/gate/pending/{id}/ctl"), &verb]);
            answered += 1;
            last = last.max(id);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = agent.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the parent failed: {stderr}");
    assert!(answered >= 12, "asks answered: {answered}");

    let got = |name: &str| std::fs::read_to_string(data.join("out").join(name)).unwrap_or_default();
    for (name, case, _, _) in &runs {
        assert_eq!(got(&format!("{name}.status")).trim(), "exited 0", "{name}");
        for n in ["1", "2"] {
            let envelope = got(&format!("{name}-{n}"));
            assert!(
                !envelope.contains("OUTSIDE") && !envelope.contains("outside"),
                "{name} call {n} reached outside its grant: {envelope}"
            );
            let v: serde_json::Value = serde_json::from_str(&envelope)
                .unwrap_or_else(|e| panic!("{name} call {n}: {e}: {envelope}"));
            assert_eq!(v["status"], "ok", "{name} call {n}: {envelope}");
            match case.tool {
                "fs_read" | "shell" => {
                    assert!(envelope.contains("INSIDE"), "{name} call {n}: {envelope}")
                }
                "fs_list" => assert!(envelope.contains("secret"), "{name} call {n}: {envelope}"),
                _ => {}
            }
        }
    }
    // Nothing was written outside; what the children wrote is in the checked root.
    let outside_now: Vec<String> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(outside_now, ["secret"], "written outside the grant");
    for stage in ["read", "run", "between"] {
        assert_eq!(
            std::fs::read_to_string(root.join(format!("written-fs_write-{stage}"))).unwrap(),
            "by the child"
        );
        assert_eq!(
            std::fs::read_to_string(root.join(format!("ran-shell-{stage}"))).unwrap(),
            "ran\nran\n"
        );
    }
}

/// A parent's bind source swapped by name before it clones: the child's bind is resolved
/// beneath the handle nsd took the parent in with, never beneath the name.
#[test]
fn a_swapped_bind_source_never_moves_a_cloned_childs_bind() {
    let w = Warren::up();
    let t = tempfile::Builder::new()
        .prefix("whbind")
        .tempdir_in("/tmp")
        .unwrap();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    let data = t.path().join("data");
    let outside = t.path().join("outside");
    for d in [&data.join("sub"), &data.join("out"), &outside] {
        std::fs::create_dir_all(d).unwrap();
        mode(d, 0o777);
    }
    mode(t.path(), 0o755);
    mode(&data, 0o777);
    std::fs::write(data.join("sub/secret"), "INSIDE\n").unwrap();
    std::fs::write(outside.join("secret"), "OUTSIDE\n").unwrap();
    let spec = format!(
        "{}bind -w {d} /data\nbind -r {d}/sub /sub\nmount ns /ns\n",
        SYSTEM.replace("\\n", "\n"),
        d = data.display()
    );
    let spec_path = w.base.path().join("parent.ns");
    std::fs::write(&spec_path, &spec).unwrap();
    let script = format!(
        r#"set -eu
           mv /data/sub /data/sub.real
           ln -s {outside} /data/sub.evil
           mv -T /data/sub.evil /data/sub
           exec 3<>/ns/clone
           printf '{SYSTEM}bind -r /sub /s\nbind -w /data/out /out\n' >&3
           id=$(cat <&3)
           exec 3<&-
           echo "run /bin/sh -c 'cat /s/secret > /out/got'" > /ns/$id/ctl
           cat /ns/$id/wait"#,
        outside = outside.display()
    );
    let (code, stdout, stderr) = w.sh(&["--ns", spec_path.to_str().unwrap()], &script);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "exited 0", "{stderr}");
    assert_eq!(
        std::fs::read_to_string(data.join("out/got")).unwrap(),
        "INSIDE\n"
    );
}
