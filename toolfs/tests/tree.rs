//! The tree a connection sees is exactly its grant: listings, walks, static files, refusals.

mod common;

use common::*;
use warren_9p::{Errno, oflags};
use warren_test_support::wire::frame_as_nobody;

/// Every tool name toolfs knows, as the operator socket lists them.
async fn all_tool_names(d: &Daemon) -> Vec<String> {
    let (_c, root) = d.operator().await;
    tools_file_names(&root).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_equals_the_grant_both_ways() {
    let d = Daemon::start();
    let all = all_tool_names(&d).await;
    assert!(all.contains(&"echo".to_owned()), "{all:?}");
    // Every single-tool grant, and every grant of all-but-one tool.
    let mut grants: Vec<Vec<&str>> = all.iter().map(|n| vec![n.as_str()]).collect();
    for skip in &all {
        grants.push(
            all.iter()
                .filter(|n| *n != skip)
                .map(String::as_str)
                .collect(),
        );
    }
    for grant in grants {
        let (_c, root) = d.granted(&record(&grant), &[]).await;
        let mut want: Vec<String> = grant.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(
            tools_file_names(&root).await,
            want,
            "tools file for grant {grant:?}"
        );
        let mut want_root = want.clone();
        want_root.push("tools".into());
        want_root.sort();
        assert_eq!(
            list(&root, "").await,
            want_root,
            "root listing for grant {grant:?}"
        );
        for name in &all {
            let walked = root.walk(&[name]).await;
            if grant.contains(&name.as_str()) {
                assert!(walked.is_ok(), "{name} granted but not walkable");
                assert_eq!(list(&root, name).await, ["call", "doc", "schema"]);
            } else {
                assert_eq!(walked.err(), Some(Errno::ENOENT), "{name} not granted");
                assert_eq!(root.walk(&[name, "call"]).await.err(), Some(Errno::ENOENT));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_grant_shows_nothing() {
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&[]), &[]).await;
    assert!(list(&root, "").await.is_empty());
    assert_eq!(root.walk(&["tools"]).await.err(), Some(Errno::ENOENT));
    assert_eq!(root.walk(&["echo"]).await.err(), Some(Errno::ENOENT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_files_have_real_sizes_and_stable_qids() {
    let d = Daemon::start();
    let (_c1, root1) = d.granted(&record(&["echo"]), &[]).await;
    let (_c2, root2) = d.operator().await;
    for path in ["tools", "echo/doc", "echo/schema"] {
        let fid = root1.walk_path(path).await.unwrap();
        let (qid, stat) = fid.getattr().await.unwrap();
        let body = read_file(&root1, path).await;
        assert!(!body.is_empty(), "{path} is empty");
        assert_eq!(
            stat.size,
            body.len() as u64,
            "{path}: size in getattr vs bytes read"
        );
        assert_eq!(stat.mode & libc::S_IFMT, libc::S_IFREG);
        // The same path has the same qid on another connection.
        let (qid2, _) = root2
            .walk_path(path)
            .await
            .unwrap()
            .getattr()
            .await
            .unwrap();
        assert_eq!(qid.path, qid2.path, "{path}");
        // The version follows the content: the operator's `tools` lists more than this grant's.
        if path == "tools" {
            assert_ne!(qid.version, qid2.version, "tools of different grants");
        } else {
            assert_eq!(qid.version, qid2.version, "{path}");
        }
        // Static files are read-only.
        assert_eq!(
            root1
                .walk_path(path)
                .await
                .unwrap()
                .open(oflags::RDWR)
                .await
                .err(),
            Some(Errno::EACCES)
        );
    }
    let (_, call) = root1
        .walk_path("echo/call")
        .await
        .unwrap()
        .getattr()
        .await
        .unwrap();
    assert_eq!(call.size, 0);
    let schema: serde_json::Value =
        serde_json::from_slice(&read_file(&root1, "echo/schema").await).unwrap();
    assert_eq!(schema["type"], "object");
    let tools = String::from_utf8(read_file(&root1, "tools").await).unwrap();
    assert_eq!(tools.lines().count(), 1);
    let fields: Vec<&str> = tools.trim_end().split('\t').collect();
    assert_eq!(fields[..2], ["echo", "read"]);
    assert_eq!(fields.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotdot_stays_inside_the_tree() {
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let up = root
        .walk(&["..", "..", "echo", "..", "tools"])
        .await
        .unwrap();
    up.open(oflags::RDONLY).await.unwrap();
    assert!(up.read_to_end(0).await.unwrap().starts_with(b"echo\t"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grants_are_refused_whole() {
    let d = Daemon::start();
    let mut unknown = record(&["echo", "no_such_tool"]);
    let err = d.hand_over(&unknown, &[]).unwrap_err().to_string();
    assert!(err.contains("unknown tool(s): no_such_tool"), "{err}");

    unknown.tools.pop();
    unknown.worker_uid = 0;
    let err = d.hand_over(&unknown, &[]).unwrap_err().to_string();
    assert!(err.contains("uid or gid 0"), "{err}");

    let mut bad_session = record(&["echo"]);
    bad_session.session = "not-hex".into();
    assert!(d.hand_over(&bad_session, &[]).is_err());

    // A root fd that the record does not name.
    let dir = std::fs::File::open("/tmp").unwrap();
    use std::os::fd::AsFd;
    let err = d
        .hand_over(&record(&["echo"]), &[dir.as_fd()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("root fd"), "{err}");

    // echo takes no authority.
    let mut echo_root = record(&["echo"]);
    echo_root.tools[0].roots.push(warren_toolfs::RootGrant {
        path: "/tmp".into(),
        writable: false,
    });
    let err = d
        .hand_over(&echo_root, &[dir.as_fd()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("takes no roots"), "{err}");

    // A lineage must start with the record's own session and namespace.
    let mut foreign = record(&["echo"]);
    foreign.lineage = Some(warren_proto::lineage::Lineage(vec![
        warren_proto::lineage::Member {
            session: "f".repeat(32),
            namespace: foreign.namespace.clone(),
            ..Default::default()
        },
    ]));
    let err = d.hand_over(&foreign, &[]).unwrap_err().to_string();
    assert!(err.contains("lineage"), "{err}");

    // The daemon is still there and still grants.
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    assert_eq!(tools_file_names(&root).await, ["echo"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_sees_every_tool_but_holds_no_host_path() {
    let d = Daemon::start();
    let (_c, root) = d.operator().await;
    let names = tools_file_names(&root).await;
    let mut want_root = names.clone();
    want_root.push("tools".into());
    want_root.sort();
    assert_eq!(list(&root, "").await, want_root);
    let env = call_envelope(&root, "echo", br#"{"x":1}"#).await;
    assert_eq!(env.status, warren_toolfs::Status::Ok);
    for tool in ["fs_read", "fs_list", "fs_write", "fs_edit", "shell"] {
        assert!(
            names.contains(&tool.to_owned()),
            "{tool} missing from {names:?}"
        );
    }
    let env = call_envelope(&root, "fs_read", br#"{"path":"/etc/hostname"}"#).await;
    assert_eq!(env.status, warren_toolfs::Status::Error);
    assert!(
        env.content.contains("grants fs_read no host path"),
        "{}",
        env.content
    );
    assert_eq!(env.taint, warren_toolfs::Taint::Trusted);
    let env = call_envelope(&root, "shell", br#"{"command":"id"}"#).await;
    assert!(
        env.content.contains("grants shell no host path"),
        "{}",
        env.content
    );
    assert!(
        d.workers().is_empty(),
        "no worker was spawned for the operator"
    );
}

/// Threat model H1/N3: only root in our pid namespace may hand over grants. The socket is 0600;
/// even opened wide, a non-root peer is refused by toolfs's own check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_socket_takes_grants_from_root_only() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    let mode = std::fs::metadata(d.ctl()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");
    std::fs::set_permissions(d.ctl(), std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        d.dir.path().join("run"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    // The handoff frame (length, record); toolfs must hang up without an answer.
    let frame = serde_json::to_string(&record(&["echo"])).unwrap();
    assert_eq!(frame_as_nobody(&d.ctl(), &frame), "closed");
    assert!(
        d.log()
            .contains("control socket: refused a peer: uid 65534 is not root"),
        "{}",
        d.log()
    );
    // Root still can.
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    assert_eq!(tools_file_names(&root).await, ["echo"]);
}
