//! nsd builds every namespace and hands each daemon its connections; it must not link the
//! daemons it hands them to. Its crates (and this one, which every side shares) reach the
//! daemons' records through `warren-proto` alone: a normal dependency, direct or transitive, on
//! a server crate fails this test. Dev-dependencies are allowed (a test may read a record the
//! way its daemon does).

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use serde_json::Value;

/// The daemons' crates.
const SERVERS: &[&str] = &[
    "warren-gate",
    "warren-toolfs",
    "warren-receiptd",
    "warren-mcpfs",
    "warren-netproxy",
    "warren-exportfs",
    "warren-llmfs",
    "warren-mcpserve",
];

/// The crates that must link none of them (each one that is a workspace member).
const CLIENTS: &[&str] = &["warren-proto", "warren-ns", "warren-nsd"];

/// `cargo metadata` for the workspace this crate is in.
fn metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON")
}

/// The packages `root` reaches through normal (not dev, not build) dependencies, by name, each
/// with the path by which it is reached.
fn normal_closure(meta: &Value, root: &str) -> HashMap<String, Vec<String>> {
    let name_of: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root_id = *name_of
        .iter()
        .find(|(_, n)| **n == root)
        .map(|(id, _)| id)
        .unwrap();
    let mut reached: HashMap<String, Vec<String>> = HashMap::new();
    let mut todo = vec![(root_id, vec![root.to_owned()])];
    while let Some((id, path)) = todo.pop() {
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            let dep_id = dep["pkg"].as_str().unwrap();
            let name = name_of[dep_id].to_owned();
            if normal && !reached.contains_key(&name) {
                let mut via = path.clone();
                via.push(name.clone());
                reached.insert(name, via.clone());
                todo.push((dep_id, via));
            }
        }
    }
    reached
}

#[test]
fn nsd_and_the_protocol_crate_link_no_server() {
    let meta = metadata();
    let members: BTreeSet<&str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["source"].is_null())
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        members.contains("warren-proto") && SERVERS.iter().all(|s| members.contains(s)),
        "the workspace's crates changed names: {members:?}"
    );
    let checked: Vec<&str> = CLIENTS
        .iter()
        .copied()
        .filter(|c| members.contains(c))
        .collect();
    assert!(
        checked.len() >= 2,
        "nsd's crate is missing from the workspace: {members:?}"
    );
    let mut found = Vec::new();
    for client in checked {
        let reached = normal_closure(&meta, client);
        for server in SERVERS {
            if let Some(path) = reached.get(*server) {
                found.push(path.join(" -> "));
            }
        }
    }
    assert!(
        found.is_empty(),
        "nsd links server crates (move the record into warren-proto):\n{}",
        found.join("\n")
    );
}
