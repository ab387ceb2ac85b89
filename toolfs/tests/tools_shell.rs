//! shell through a real worker process: reduced environment, working directory, exit status,
//! the 1 MiB head+tail cap, and the timeout killing the command's whole process group.

mod tools_support;

use serde_json::json;
use tools_support::*;

/// Variables sh itself may add to what it was given.
const SHELL_OWN: [&str; 4] = ["PWD", "SHLVL", "_", "OLDPWD"];

#[tokio::test]
async fn the_environment_is_reduced_to_the_kept_names() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    let w = spawn("shell", &[("/r", &root, true)]);
    let out = call(&w, json!({"command": "env"})).await;
    let text = assert_ok(&out);
    let names: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('['))
        .filter_map(|l| l.split('=').next())
        .collect();
    assert!(!names.is_empty());
    for name in &names {
        assert!(
            warren_toolfs::tools::shell::ENV_KEPT.contains(name) || SHELL_OWN.contains(name),
            "{name} leaked into the command's environment:\n{text}"
        );
    }
    // The test process itself has CARGO_* variables (cargo sets them); none reach the command.
    assert!(
        std::env::vars().any(|(k, _)| k.starts_with("CARGO")),
        "precondition: the test runs with CARGO_* set"
    );
    assert!(names.contains(&"PATH"));
}

#[tokio::test]
async fn status_cwd_and_output_interleaving() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    std::fs::create_dir(root.join("sub")).unwrap();
    let w = spawn("shell", &[("/r", &root, true)]);
    let out = call(&w, json!({"command": "echo out; echo err >&2; exit 3"})).await;
    assert!(!out.ok);
    assert_eq!(out.content, "out\nerr\n[exit status 3]");
    let pwd = call(&w, json!({"command": "pwd -P"})).await;
    assert_eq!(
        assert_ok(&pwd),
        format!(
            "{}\n[exit status 0]",
            root.canonicalize().unwrap().display()
        )
    );
    let sub = call(&w, json!({"command": "pwd -P", "cwd": "/r/sub"})).await;
    assert_eq!(
        assert_ok(&sub),
        format!(
            "{}\n[exit status 0]",
            root.join("sub").canonicalize().unwrap().display()
        )
    );
    assert_refused(
        &call(&w, json!({"command": "pwd", "cwd": "/elsewhere"})).await,
        &["outside"],
    );
    assert_refused(
        &call(&w, json!({"command": "true", "timeout_s": 601})).await,
        &["timeout_s"],
    );
    // The command may write where the worker uid may.
    assert_ok(&call(&w, json!({"command": "echo made > made.txt"})).await);
    assert_eq!(
        std::fs::read_to_string(root.join("made.txt")).unwrap(),
        "made\n"
    );
}

#[tokio::test]
async fn output_is_capped_at_one_mebibyte_keeping_head_and_tail() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    let w = spawn("shell", &[("/r", &root, true)]);
    let out = call(&w, json!({"command": "printf HEADSTART; head -c 3000000 /dev/zero | tr '\\0' m; printf TAILEND"})).await;
    let text = assert_ok(&out);
    assert!(text.starts_with("HEADSTARTmmm"), "{}", &text[..40]);
    assert!(
        text.ends_with("mmmTAILEND\n[exit status 0]"),
        "{}",
        &text[text.len() - 60..]
    );
    let total = 3_000_000 + "HEADSTART".len() + "TAILEND".len();
    assert!(
        text.contains(&format!(
            "[shell: {} bytes of output elided",
            total - (1 << 20)
        )),
        "marker names the elided count"
    );
    assert!(
        text.len() <= (1 << 20) + 200,
        "{} bytes returned",
        text.len()
    );
}

#[tokio::test]
async fn the_timeout_kills_the_whole_process_group() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    let w = spawn("shell", &[("/r", &root, true)]);
    // A background job in the command's group, detached from the output pipe, then a hang.
    let out = call(
        &w,
        json!({"command": "sleep 1000 >/dev/null 2>&1 & echo $!; sleep 1000", "timeout_s": 2}),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.content
            .contains("[shell: timed out after 2.0 s; its process group was killed]"),
        "{}",
        out.content
    );
    let background: i32 = out
        .content
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .expect("the command printed its job's pid");
    assert!(
        wait_dead(background),
        "background job {background} outlived its call's timeout"
    );
    // The worker goes on serving.
    assert_ok(&call(&w, json!({"command": "true"})).await);
}

#[tokio::test]
async fn a_finished_call_leaves_no_background_job_of_its_group() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    let w = spawn("shell", &[("/r", &root, true)]);
    let out = call(
        &w,
        json!({"command": "sleep 1000 >/dev/null 2>&1 & echo $!"}),
    )
    .await;
    let background: i32 = assert_ok(&out)
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_dead(background),
        "background job {background} outlived its call"
    );
}
