//! `net proxy`: the network as a grant, end to end through the real daemons. "The world" is a
//! server on the host's 127.0.0.1: the proxy (outside every namespace) reaches it, the payload
//! (in a network namespace of its own) does not, except through the proxy, for the listed name.
//! `api.test` and `other.test` are names only the proxy knows (`WARREN_NETPROXY_HOSTS`).
//! Needs root, /dev/fuse, curl, openssl, the workspace's binaries and (for the MCP server's
//! test) the Python peers (`scripts/install-test-deps`).
//!
//! Why one file: one test binary, so the hosts file, the test CA and "the world" server are set up
//! one way for its seven tests.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::netns::answer_dns;
use common::{Warren, all_receipts, approve_every_ask, field, scopes};

const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

const BODY: &str = "hello from api.test\n";

/// The world: an HTTP server on the host's loopback answering every request with [`BODY`], and
/// the bytes it received and sent on each connection.
struct World {
    port: u16,
    conns: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl World {
    fn start() -> World {
        World::serve(TcpListener::bind("127.0.0.1:0").unwrap())
    }

    fn serve(listener: TcpListener) -> World {
        let port = listener.local_addr().unwrap().port();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let seen = conns.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || {
                    if let Some(counts) = serve(stream) {
                        seen.lock().unwrap().push(counts);
                    }
                });
            }
        });
        World { port, conns }
    }
}

/// One request's head, the answer, then whatever else comes until the peer closes.
fn serve(mut s: TcpStream) -> Option<(u64, u64)> {
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    s.write_all(answer.as_bytes()).ok()?;
    s.shutdown(std::net::Shutdown::Write).ok()?;
    let mut received = head.len() as u64;
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        received += n as u64;
    }
    Some((received, answer.len() as u64))
}

/// warren up with the proxy answering `api.test` and `other.test` from a hosts file (kept with
/// the warren: a restarted proxy reads it again), and every first use of a destination asked.
fn up_with_hosts() -> (tempfile::TempDir, Warren) {
    up_with_hosts_and("")
}

/// [`up_with_hosts`] with `more` hosts-file lines.
fn up_with_hosts_and(more: &str) -> (tempfile::TempDir, Warren) {
    // In /tmp, readable by the proxy's uid (a test's temp dirs are 0700 root).
    let dir = tempfile::Builder::new()
        .prefix("wnet")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("hosts");
    std::fs::write(&path, format!("127.0.0.1 api.test other.test\n{more}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let w = up_asking(&[("WARREN_NETPROXY_HOSTS", path.to_str().unwrap())]);
    (dir, w)
}

/// warren up with `env`, every first use of a destination asked (the network tier's default
/// is allow).
fn up_asking(env: &[(&str, &str)]) -> Warren {
    let w = Warren::up_with(env);
    w.run_ok(&["write", "/gate/rules", "ask tier:network"]);
    w
}

fn effects_for(receipts: &[serde_json::Value], host: &str) -> Vec<serde_json::Value> {
    receipts
        .iter()
        .filter(|r| r["kind"] == "effect" && r["subject"]["host"] == host)
        .map(|r| r["subject"].clone())
        .collect()
}

/// A payload reaches the listed name through the proxy (HTTP and SOCKS5) once the gate allows
/// it; another name, a raw IP and a direct connection do not get out; each connection is an
/// `effect` receipt whose byte counts are the world's own.
#[test]
fn a_payload_reaches_exactly_the_listed_host_through_the_proxy() {
    let world = World::start();
    let port = world.port;
    let (_hosts, w) = up_with_hosts();
    let _approver = approve_every_ask(&w);
    let spec = w.base.path().join("net.ns");
    std::fs::write(
        &spec,
        format!("{SYSTEM}net proxy api.test:{port}=127.0.0.1\n"),
    )
    .unwrap();
    let script = format!(
        "echo \"env $HTTP_PROXY $https_proxy $ALL_PROXY $NO_PROXY\"\n\
         echo \"http:$(curl -sS -m 30 http://api.test:{port}/hello 2>&1)\"\n\
         echo \"socks:$(curl -sS -m 30 --proxy socks5h://127.0.0.1:3128 http://api.test:{port}/s 2>&1)\"\n\
         echo \"other:$(curl -sS -m 30 -o /dev/null -w '%{{http_code}}' http://other.test:{port}/ 2>&1)\"\n\
         echo \"rawip:$(curl -sS -m 30 --noproxy '' -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/ 2>&1)\"\n\
         curl -sS -m 10 --noproxy '*' http://127.0.0.1:{port}/ >/dev/null 2>&1; echo \"direct:$?\"\n\
         python3 -c 'import socket; socket.socket().bind((\"127.0.0.1\", 8000))' 2>&1 | tail -1 | sed 's/^/bind:/'\n"
    );
    let (code, out, err) = w.sh(
        &["--asks", "operator", "--ns", spec.to_str().unwrap()],
        &script,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let line = |p: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(p))
            .unwrap_or_else(|| panic!("no {p} line in:\n{out}\n{err}"))
            .to_string()
    };
    assert_eq!(
        line("env "),
        "http://127.0.0.1:3128 http://127.0.0.1:3128 socks5h://127.0.0.1:3128 localhost,127.0.0.1"
    );
    assert_eq!(line("http:"), BODY.trim_end(), "{out}\n{err}");
    assert_eq!(line("socks:"), BODY.trim_end(), "{out}\n{err}");
    assert_eq!(line("other:"), "403", "{out}\n{err}");
    assert_eq!(line("rawip:"), "403", "{out}\n{err}");
    // curl's 7: could not connect (no listener in the namespace's own network namespace, and
    // Landlock allows connect to the proxy's port only).
    assert_eq!(line("direct:"), "7", "{out}\n{err}");
    // Landlock handles TCP under `net proxy`: connect to the proxy's port only, and no bind (a
    // payload cannot stand up a listener of its own).
    assert_eq!(
        line("bind:"),
        "PermissionError: [Errno 13] Permission denied",
        "{out}\n{err}"
    );

    // The world saw exactly the two proxied requests (each is counted once its connection has
    // closed, which may be just after curl has its answer).
    common::wait_until("the world's two connections to close", || {
        world.conns.lock().unwrap().len() >= 2
    });
    let mut seen = world.conns.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");

    // Each connection's receipt: signed `effect`, the name, the pinned address, the world's own
    // byte counts; the refusals too, and the gate's decision for the listed destination.
    // A connection's receipt is queued when it ends and written by netproxy's writer: wait
    // for all four.
    common::wait_until("the four connections' receipts", || {
        all_receipts(&w)
            .iter()
            .filter(|r| r["kind"] == "effect")
            .count()
            >= 4
    });
    let receipts = all_receipts(&w);
    let tool = format!("net:api.test:{port}");
    assert!(
        receipts.iter().any(|r| r["kind"] == "decision"
            && r["subject"]["tool"] == tool.as_str()
            && r["subject"]["verdict"] == "allow"),
        "no allow decision for {tool}: {receipts:#?}"
    );
    let api = effects_for(&receipts, "api.test");
    assert_eq!(api.len(), 2, "{api:#?}");
    let mut counted: Vec<(u64, u64)> = api
        .iter()
        .map(|s| {
            assert_eq!(s["outcome"], "closed", "{s}");
            assert_eq!(s["address"], format!("127.0.0.1:{port}").as_str(), "{s}");
            assert_eq!(s["tool"], tool.as_str(), "{s}");
            (
                s["bytes_client_to_server"].as_u64().unwrap(),
                s["bytes_server_to_client"].as_u64().unwrap(),
            )
        })
        .collect();
    counted.sort();
    seen.sort();
    assert_eq!(counted, seen);
    let other = effects_for(&receipts, "other.test");
    assert_eq!(other.len(), 1, "{other:#?}");
    assert_eq!(other[0]["outcome"], "refused");
    assert!(other[0]["address"].is_null());
    let raw = effects_for(&receipts, "127.0.0.1");
    assert_eq!(raw.len(), 1, "{raw:#?}");
    assert_eq!(raw[0]["outcome"], "refused");

    // `warren log` says in words what each `effect` says: a served connection's address and
    // bytes, a refused one's outcome and reason.
    let log = String::from_utf8_lossy(&w.run_ok(&["log"]).stdout).into_owned();
    let effect_lines = |host: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains(" effect ") && l.contains(&format!("net:{host}:")))
            .map(str::to_string)
            .collect()
    };
    let mut served: Vec<String> = effect_lines("api.test")
        .iter()
        .filter_map(|l| l.split_once("closed ").map(|(_, words)| words))
        // Up to a digest's `  args …`, when the receipt has one.
        .map(|words| format!("closed {}", words.split("  args ").next().unwrap_or(words)))
        .collect();
    served.sort();
    let mut expected: Vec<String> = counted
        .iter()
        .map(|(up, down)| format!("closed 127.0.0.1:{port}, {up} bytes sent, {down} received"))
        .collect();
    expected.sort();
    assert_eq!(served, expected, "{log}");
    let refused = effect_lines("other.test");
    assert_eq!(refused.len(), 1, "{log}");
    assert!(
        refused[0].contains("refused (nothing connected), 0 bytes sent, 0 received: other.test"),
        "{log}"
    );
}

/// A namespace's clone cannot widen its host list (refused, the widening named), and a clone
/// within it reaches the listed host through a grant of its own, its ask its subtree's.
#[test]
fn a_clone_cannot_widen_the_host_list() {
    let world = World::start();
    let port = world.port;
    let (_hosts, w) = up_with_hosts();
    let share = tempfile::Builder::new()
        .prefix("wnets")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = share.path().to_str().unwrap();
    std::fs::write(
        share.path().join("child.sh"),
        format!("curl -sS -m 30 http://api.test:{port}/child > {s}/child.out 2>&1\n"),
    )
    .unwrap();
    let grant = format!("net proxy api.test:{port}=127.0.0.1\n");
    let spec = w.base.path().join("parent.ns");
    std::fs::write(
        &spec,
        format!("{SYSTEM}{grant}mount ns /ns\nbind -w {s} {s}\n"),
    )
    .unwrap();
    let wide = format!("{SYSTEM}net proxy api.test:{port}=127.0.0.1 other.test:{port}=127.0.0.1\n");
    let narrow = format!("{SYSTEM}{grant}bind -w {s} {s}\n");
    let script = format!(
        "clone() {{ exec 4<>/ns/clone; printf '%s' \"$1\" >&4; cat <&4 2>/dev/null || {{ echo refused; cat <&4; }}; exec 4<&-; }}\n\
         echo \"wide:$(clone '{wide}' | tr '\\n' ' ')\"\n\
         id=$(clone '{narrow}')\n\
         echo \"run /bin/sh {s}/child.sh\" > /ns/$id/ctl\n\
         echo \"child:$(cat /ns/$id/wait)\"\n"
    );
    let parent = w.spawn_sh(
        &["--asks", "operator", "--ns", spec.to_str().unwrap()],
        &script,
    );
    // The clone's first use of api.test is asked as its subtree's (the lineage nsd gave the
    // proxy): its parent is named, and the subtree is the parent's session, not its own.
    let (id, request) = common::next_ask(&w, 0);
    assert_eq!(
        field(&request, "tool"),
        format!("net:api.test:{port}"),
        "{request}"
    );
    assert_ne!(field(&request, "parents"), "-", "{request}");
    assert_ne!(
        field(&request, "subtree"),
        field(&request, "session"),
        "{request}"
    );
    w.run_ok(&[
        "write",
        &format!("/gate/pending/{id}/ctl"),
        &format!("allow once {}", common::fingerprint(&request)),
    ]);
    let done = parent.wait_with_output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&done.stdout).into_owned(),
        String::from_utf8_lossy(&done.stderr).into_owned(),
    );
    assert!(done.status.success(), "{out}\n{err}");
    let wide_line = out
        .lines()
        .find_map(|l| l.strip_prefix("wide:"))
        .unwrap_or_else(|| panic!("{out}\n{err}"));
    assert!(
        wide_line.starts_with("refused")
            && wide_line.contains(&format!(
                "net proxy other.test:{port}=127.0.0.1: other.test:{port} is not in the parent's list"
            )),
        "{out}\n{err}"
    );
    assert!(out.contains("child:exited 0"), "{out}\n{err}");
    assert_eq!(
        std::fs::read_to_string(share.path().join("child.out")).unwrap(),
        BODY
    );
}

/// A name the parent lists without a pin may not resolve to an address of this host (the
/// proxy's rule for every unpinned name), so neither a clone's pattern nor a clone's `tool shell
/// net proxy` line may pin it there: both are refused at `/ns/clone` with the words the proxy
/// refuses the parent's own connection with. The address is a public-range one on a veth end
/// of this host's, with a listener behind it.
#[test]
fn a_clone_cannot_pin_a_name_to_an_address_of_this_host() {
    let link = common::netns::Link::in_prefix("11.231");
    let own = link.outside_ip.clone();
    let world = World::serve(TcpListener::bind(format!("{own}:0")).unwrap());
    let port = world.port;
    let (_hosts, w) = up_with_hosts_and(&format!("{own} own.test\n"));
    let _approver = approve_every_ask(&w);
    let root = common::tempdir_with_mode("wnetown", 0o777);
    let tool = format!(
        "mount tool /tool shell\ntool shell -w {}\n",
        root.path().display()
    );
    let spec = w.base.path().join("parent.ns");
    std::fs::write(
        &spec,
        format!("{SYSTEM}net proxy own.test:{port}\nmount ns /ns\n{tool}"),
    )
    .unwrap();
    let pinned = format!("{SYSTEM}net proxy own.test:{port}={own}\n");
    let tool_pinned = format!(
        "{SYSTEM}net proxy own.test:{port}\n{tool}tool shell net proxy own.test:{port}={own}\n"
    );
    // The same address carried in IPv6: NAT64 (64:ff9b::/96) and 6to4 (2002::/16).
    let [a, b, c, d] = own.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
    let nat64 = std::net::Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo);
    let six_to_four = std::net::Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1);
    let embedded = |v6| format!("{SYSTEM}net proxy own.test:{port}=[{v6}]\n");
    let script = format!(
        "clone() {{ exec 4<>/ns/clone; printf '%s' \"$1\" >&4; cat <&4 2>/dev/null || {{ echo refused; cat <&4; }}; exec 4<&-; }}\n\
         echo \"parent:$(curl -sS -m 30 http://own.test:{port}/ 2>&1)\"\n\
         echo \"pinned:$(clone '{pinned}' | tr '\\n' ' ')\"\n\
         echo \"tool:$(clone '{tool_pinned}' | tr '\\n' ' ')\"\n\
         echo \"nat64:$(clone '{}' | tr '\\n' ' ')\"\n\
         echo \"6to4:$(clone '{}' | tr '\\n' ' ')\"\n",
        embedded(nat64),
        embedded(six_to_four),
    );
    let (code, out, err) = w.sh(
        &["--asks", "operator", "--ns", spec.to_str().unwrap()],
        &script,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let words = "an address of this host";
    // The parent's own connection: the proxy's refusal (403, its body the reason).
    assert_eq!(
        line_of(&out, "parent:"),
        format!("own.test resolved to {own}, {words} (name it in the pattern to allow it)"),
        "{out}\n{err}"
    );
    let pinned = line_of(&out, "pinned:");
    assert!(
        pinned.starts_with("refused")
            && pinned.contains(&format!(
                "net proxy own.test:{port}={own}: own.test:{port} is pinned to {own}, {words}, \
                 which the parent does not allow for it"
            )),
        "{out}\n{err}"
    );
    let tool_line = line_of(&out, "tool:");
    assert!(
        tool_line.starts_with("refused")
            && tool_line.contains(&format!(
                "tool `shell` net proxy own.test:{port}={own}: own.test:{port} is pinned to \
                 {own}, {words}, which the parent does not allow for it"
            )),
        "{out}\n{err}"
    );
    for (form, v6) in [("nat64:", nat64), ("6to4:", six_to_four)] {
        let got = line_of(&out, form);
        assert!(
            got.starts_with("refused")
                && got.contains(&format!("own.test:{port} is pinned to {v6}, {words}")),
            "{form} {got}\n{out}\n{err}"
        );
    }
    // Nothing reached the listener behind the address.
    assert!(world.conns.lock().unwrap().is_empty());
}

/// The proxy killed while a `net proxy` namespace runs: the supervisor restarts it, nsd hands
/// the namespace's listener over again, and the payload's next request gets through.
#[test]
fn a_restarted_proxy_gets_the_running_namespaces_grant_again() {
    let world = World::start();
    let port = world.port;
    let (_hosts, w) = up_with_hosts();
    let _approver = approve_every_ask(&w);
    let share = tempfile::Builder::new()
        .prefix("wnetr")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = share.path().to_str().unwrap();
    // The grant from the command line: `--net-proxy` is the spec's `net proxy` line.
    let pattern = format!("api.test:{port}=127.0.0.1");
    let url = format!("http://api.test:{port}/");
    let script = format!(
        "curl -sS -m 30 {url} > {s}/first 2>&1\n\
         while [ ! -e {s}/go ]; do sleep 0.05; done\n\
         curl -sS -m 30 {url} > {s}/second 2>&1\n"
    );
    let launcher = w.spawn_sh(
        &["--asks", "operator", "--net-proxy", &pattern, "--rw", s],
        &script,
    );
    let first = share.path().join("first");
    common::wait_until("the first request's answer", || {
        std::fs::read_to_string(&first).is_ok_and(|t| !t.is_empty())
    });
    assert_eq!(std::fs::read_to_string(&first).unwrap(), BODY);
    let old = w.daemon_pid("warren-netproxy");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    common::wait_until("a new netproxy", || {
        let pids = w.daemon_pids("warren-netproxy");
        pids.len() == 1 && pids[0] != old
    });
    std::fs::write(share.path().join("go"), "").unwrap();
    let out = launcher.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(share.path().join("second")).unwrap(),
        BODY
    );
}

/// The namespace's script: one `shell` call per argument, each envelope on a line of its own.
const CALL_SHELL: &str = r#"for a in "$@"; do exec 3<>/tool/shell/call; printf '%s' "$a" >&3; cat <&3; exec 3<&-; echo; done"#;

/// One `shell` call in a namespace of `spec`'s text (its tool rooted at `root`): the call's
/// output, once it succeeded.
fn shell_call(w: &Warren, name: &str, spec: &str, command: &str) -> String {
    let path = w.base.path().join(name);
    std::fs::write(&path, spec).unwrap();
    let call = serde_json::json!({ "command": command }).to_string();
    let out = w
        .cmd(&[
            "run",
            "--asks",
            "operator",
            "--ns",
            path.to_str().unwrap(),
            "--",
            "/bin/sh",
            "-c",
            CALL_SHELL,
            "sh",
            &call,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let got = common::envelopes(&stdout);
    assert_eq!(
        got.len(),
        1,
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(got[0]["status"], "ok", "{stdout}");
    got[0]["content"].as_str().unwrap().to_string()
}

/// The value after `prefix` on a line of `out`.
fn line_of(out: &str, prefix: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in:\n{out}"))
        .to_string()
}

/// A `shell` tool the spec gives the network (`tool shell net proxy …`) fetches from the listed
/// host through a proxy listener of its worker's own, asked of the gate and receipted in its
/// namespace's session, for the tool's hosts only (a host the namespace lists but the tool's
/// line does not gets 403); the same namespace's `shell` without that line has no way out.
#[test]
fn a_shell_tool_given_the_network_fetches_through_the_proxy_and_one_without_cannot() {
    let world = World::start();
    let port = world.port;
    let (_hosts, w) = up_with_hosts();
    let _approver = approve_every_ask(&w);
    let root = common::tempdir_with_mode("wnett", 0o777);
    let base = format!(
        "{SYSTEM}net proxy api.test:{port}=127.0.0.1 other.test:{port}=127.0.0.1\n\
         mount tool /tool shell\ntool shell -w {}\n",
        root.path().display()
    );
    let command = format!(
        "echo \"env $HTTPS_PROXY $ALL_PROXY\"\n\
         echo \"api:$(curl -sS -m 30 http://api.test:{port}/tool 2>&1)\"\n\
         echo \"other:$(curl -sS -m 30 -o /dev/null -w '%{{http_code}}' http://other.test:{port}/ 2>&1)\"\n\
         curl -sS -m 10 --noproxy '*' http://127.0.0.1:{port}/ >/dev/null 2>&1; echo \"direct:$?\"\n"
    );

    let given = shell_call(
        &w,
        "given.ns",
        &format!("{base}tool shell net proxy api.test:{port}=127.0.0.1\n"),
        &command,
    );
    assert_eq!(
        line_of(&given, "env "),
        "http://127.0.0.1:3128 socks5h://127.0.0.1:3128"
    );
    assert_eq!(line_of(&given, "api:"), BODY.trim_end(), "{given}");
    // The tool's line names api.test only, though the namespace's names other.test too.
    assert_eq!(line_of(&given, "other:"), "403", "{given}");
    // curl's 7: nothing but the proxy's listener in the worker's network namespace.
    assert_eq!(line_of(&given, "direct:"), "7", "{given}");

    // The fetch is the world's one connection, and its receipt is an `effect` in the
    // namespace's session (the scope its `shell` call's receipts are in), with the world's own
    // byte counts; the gate decided `net:api.test:PORT` in that session.
    common::wait_until("the world's connection to close", || {
        !world.conns.lock().unwrap().is_empty()
    });
    let seen = world.conns.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    common::wait_until("the fetch's receipt", || {
        !effects_for(&all_receipts(&w), "api.test").is_empty()
    });
    let tool = format!("net:api.test:{port}");
    let scope = scopes(&w)
        .into_iter()
        .find(|s| !effects_for(&w.receipts(s), "api.test").is_empty())
        .unwrap();
    let receipts = w.receipts(&scope);
    assert!(
        receipts
            .iter()
            .any(|r| r["appender"] == "toolfs" && r["subject"]["tool"] == "shell"),
        "the fetch's receipt is not in the shell call's scope: {receipts:#?}"
    );
    assert!(
        receipts.iter().any(|r| r["kind"] == "decision"
            && r["subject"]["tool"] == tool.as_str()
            && r["subject"]["verdict"] == "allow"),
        "no allow decision for {tool} in the namespace's scope: {receipts:#?}"
    );
    let api = effects_for(&receipts, "api.test");
    assert_eq!(api.len(), 1, "{api:#?}");
    assert_eq!(api[0]["outcome"], "closed");
    assert_eq!(api[0]["tool"], tool.as_str());
    let counted = (
        api[0]["bytes_client_to_server"].as_u64().unwrap(),
        api[0]["bytes_server_to_client"].as_u64().unwrap(),
    );
    assert_eq!(counted, seen[0]);

    // Without the line, the same namespace's `shell` has no proxy and no route.
    let command = format!(
        "echo \"env $HTTPS_PROXY\"\n\
         curl -sS -m 10 http://api.test:{port}/ >/dev/null 2>&1; echo \"named:$?\"\n\
         curl -sS -m 10 --proxy http://127.0.0.1:3128 http://api.test:{port}/ >/dev/null 2>&1; echo \"proxy:$?\"\n"
    );
    let denied = shell_call(&w, "denied.ns", &base, &command);
    assert_eq!(line_of(&denied, "env "), "", "{denied}");
    // 6: the name does not resolve (no resolver reachable); 7: no listener at the proxy's port.
    assert_eq!(line_of(&denied, "named:"), "6", "{denied}");
    assert_eq!(line_of(&denied, "proxy:"), "7", "{denied}");
    assert_eq!(world.conns.lock().unwrap().len(), 1);
}

/// "The internet": a network namespace of its own, joined to the host (where the proxy runs) by
/// a veth pair, at an address no special range holds (`11.231.N.2`), so the proxy takes it for a
/// public one. In it: `openssl s_server` for `api.test` on 443 with a test CA's certificate, the
/// counting HTTP server for `other.test` on 80, and a DNS server on 53 answering `api.test` and
/// `other.test` with that address and `rebind.test` with 127.0.0.1. The proxy asks that DNS
/// server (`WARREN_NETPROXY_DNS`), and no hosts file.
struct Internet {
    ip: String,
    _tls: warren_test_support::tls::TlsServer,
    http: World,
    /// `ca.pem` (readable by a payload) and the server's key and files.
    dir: tempfile::TempDir,
    /// Last: the servers end before their network namespace goes.
    _link: common::netns::Link,
}

impl Internet {
    fn start() -> Internet {
        let link = common::netns::Link::in_prefix("11.231");
        let ip = link.inside_ip.clone();
        let dir = common::tempdir_with_mode("wnetw", 0o755);
        let (path, at) = (dir.path().to_path_buf(), ip.clone());
        let tls =
            link.inside(move || warren_test_support::tls::tls_server(&path, &format!("{at}:443")));
        let at = ip.clone();
        let (http, dns) = link.inside(move || {
            (
                TcpListener::bind(format!("{at}:80")).unwrap(),
                std::net::UdpSocket::bind(format!("{at}:53")).unwrap(),
            )
        });
        let addr: std::net::Ipv4Addr = ip.parse().unwrap();
        let names = [
            ("api.test", addr),
            ("other.test", addr),
            ("rebind.test", std::net::Ipv4Addr::LOCALHOST),
        ];
        std::thread::spawn(move || answer_dns(&dns, &names));
        Internet {
            ip,
            _tls: tls,
            http: World::serve(http),
            dir,
            _link: link,
        }
    }
}

/// The world as a network namespace of its own: a payload granted `net proxy api.test
/// rebind.test` reaches `https://api.test` by name (the proxy asks the world's DNS, the gate
/// allows, curl checks the test CA's certificate end to end); `other.test` (unlisted),
/// `rebind.test` (listed, resolving to 127.0.0.1) and the world's raw IP are refused; a direct
/// TCP connection and a UDP datagram to the world do not leave the namespace.
#[test]
fn the_internet_is_reached_by_name_over_https_and_nothing_else_gets_out() {
    let net = Internet::start();
    let ip = &net.ip;
    let w = up_asking(&[("WARREN_NETPROXY_DNS", &format!("{ip}:53"))]);
    let _approver = approve_every_ask(&w);
    let d = net.dir.path().display();
    let spec = w.base.path().join("internet.ns");
    std::fs::write(
        &spec,
        format!("{SYSTEM}bind -r {d} {d}\nnet proxy api.test rebind.test\n"),
    )
    .unwrap();
    let code = |url: &str, extra: &str| {
        format!("$(curl -sS -m 30 {extra} -o /dev/null -w '%{{http_code}}' {url} 2>&1)")
    };
    let script = format!(
        "echo \"https:$(curl -sS -m 30 --cacert {d}/ca.pem https://api.test/hello 2>&1)\"\n\
         echo \"other:{}\"\n\
         echo \"rebind:{}\"\n\
         echo \"rawip:{}\"\n\
         curl -sS -m 10 --noproxy '*' http://{ip}/ >/dev/null 2>&1; echo \"direct:$?\"\n\
         python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"x\", (\"{ip}\", 53))' 2>&1 | tail -1 | sed 's/^/udp:/'\n",
        code("http://other.test/", ""),
        code("http://rebind.test/", ""),
        code(&format!("http://{ip}/"), "--noproxy ''"),
    );
    let (status, out, err) = w.sh(
        &["--asks", "operator", "--ns", spec.to_str().unwrap()],
        &script,
    );
    assert_eq!(status, 0, "{out}\n{err}");
    assert_eq!(
        line_of(&out, "https:"),
        warren_test_support::tls::BODY.trim_end(),
        "{out}\n{err}"
    );
    assert_eq!(line_of(&out, "other:"), "403", "{out}\n{err}");
    assert_eq!(line_of(&out, "rebind:"), "403", "{out}\n{err}");
    assert_eq!(line_of(&out, "rawip:"), "403", "{out}\n{err}");
    assert_eq!(line_of(&out, "direct:"), "7", "{out}\n{err}");
    assert_eq!(
        line_of(&out, "udp:"),
        "OSError: [Errno 101] Network is unreachable",
        "{out}\n{err}"
    );
    // The world's HTTP server was never reached: by name, by address or directly.
    assert!(net.http.conns.lock().unwrap().is_empty());

    common::wait_until("the four connections' receipts", || {
        all_receipts(&w)
            .iter()
            .filter(|r| r["kind"] == "effect")
            .count()
            >= 4
    });
    let receipts = all_receipts(&w);
    assert!(
        receipts.iter().any(|r| r["kind"] == "decision"
            && r["subject"]["tool"] == "net:api.test:443"
            && r["subject"]["verdict"] == "allow"),
        "no allow decision for net:api.test:443: {receipts:#?}"
    );
    let api = effects_for(&receipts, "api.test");
    assert_eq!(api.len(), 1, "{api:#?}");
    assert_eq!(api[0]["outcome"], "closed");
    assert_eq!(api[0]["address"], format!("{ip}:443").as_str());
    let rebind = effects_for(&receipts, "rebind.test");
    assert_eq!(rebind.len(), 1, "{rebind:#?}");
    assert_eq!(rebind[0]["outcome"], "refused");
    assert!(
        rebind[0]["reason"]
            .as_str()
            .unwrap()
            .contains("resolved to 127.0.0.1, a loopback address"),
        "{rebind:#?}"
    );
    for host in ["other.test", ip.as_str()] {
        let refused = effects_for(&receipts, host);
        assert_eq!(refused.len(), 1, "{host}: {refused:#?}");
        assert_eq!(refused[0]["outcome"], "refused");
        assert!(refused[0]["address"].is_null());
    }
}

/// The `fetching` MCP server (`servers/mcpfs/tests/servers/fetching.py`, the Python SDK) defined
/// as `NAME` with `net` as its spec's network line, the test CA as its `SSL_CERT_FILE`, `fetch`
/// at the read tier, and accepted.
fn define_fetching(w: &Warren, config: &std::path::Path, name: &str, net: &str, ca: &str) {
    let venv = common::repo().join("target/peers/mcp-python");
    assert!(
        venv.join("bin/python").exists(),
        "{}: run scripts/install-test-deps",
        venv.display()
    );
    let server = common::repo().join("servers/mcpfs/tests/servers");
    let ca_dir = std::path::Path::new(ca).parent().unwrap().display();
    std::fs::write(
        config.join(format!("mcp/{name}.toml")),
        format!(
            "command = [\"{py}\", \"{s}/fetching.py\"]\nenv = [\"SSL_CERT_FILE\"]\nspec = \"\"\"\n{SYSTEM}bind -r {v} {v}\nbind -r {s} {s}\nbind -r {ca_dir} {ca_dir}\n{net}\n\"\"\"\n[tiers]\nfetch = \"read\"\n",
            py = venv.join("bin/python").display(),
            v = venv.display(),
            s = server.display(),
        ),
    )
    .unwrap();
    let secret = w
        .base
        .path()
        .join(format!("secrets/mcp/{name}/SSL_CERT_FILE"));
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    std::fs::write(&secret, ca).unwrap();
    let (ok, out, err) = common::check_then_accept(w, config, name, &[]);
    assert!(ok && out.contains("accepted fetch\t"), "{out}\n{err}");
}

/// An MCP server whose definition's spec grants `net proxy api.test` reaches exactly that host:
/// its `fetch` of `https://api.test/hello` (the proxy resolving the name, the gate allowing
/// `net:api.test:443`, the test CA checked end to end) returns the world's content to the agent
/// that called it; `http://other.test/` is refused by the proxy. The connection is decided and
/// receipted in the server's own session (the namespace nsd started for mcpfs), not the calling
/// agent's. The same server defined with `net none` cannot fetch at all.
#[test]
fn an_mcp_server_given_the_network_fetches_its_listed_host_and_one_without_cannot() {
    let net = Internet::start();
    let ip = &net.ip;
    let (w, config) = common::up_with_config_and(&[("WARREN_NETPROXY_DNS", &format!("{ip}:53"))]);
    w.run_ok(&["write", "/gate/rules", "ask tier:network"]);
    let _approver = approve_every_ask(&w);
    let ca = net.dir.path().join("ca.pem");
    let ca = ca.to_str().unwrap();
    define_fetching(&w, config.path(), "fetcher", "net proxy api.test", ca);
    define_fetching(&w, config.path(), "offline", "net none", ca);

    let spec = w.base.path().join("agent.ns");
    std::fs::write(
        &spec,
        "mount mcp:fetcher /mnt/mcp/fetcher\nmount mcp:offline /mnt/mcp/offline\n",
    )
    .unwrap();
    let call = |server: &str, url: &str| {
        format!(
            "exec 3<>/mnt/mcp/{server}/fetch/call; printf '%s' '{{\"url\":\"{url}\"}}' >&3; cat <&3; exec 3<&-; echo"
        )
    };
    let script = [
        call("fetcher", "https://api.test/hello"),
        call("fetcher", "http://other.test/"),
        call("offline", "https://api.test/hello"),
    ]
    .join("\n");
    let (status, out, err) = w.sh(
        &["--asks", "operator", "--ns", spec.to_str().unwrap()],
        &script,
    );
    assert_eq!(status, 0, "{out}\n{err}");
    let got = common::envelopes(&out);
    assert_eq!(got.len(), 3, "{out}\n{err}");
    for env in &got {
        assert_eq!(env["status"], "ok", "{env}");
    }
    let content = |i: usize| got[i]["content"].as_str().unwrap().to_string();
    assert_eq!(
        content(0),
        format!("body:{}", warren_test_support::tls::BODY),
        "{out}"
    );
    assert_eq!(content(1), "status:403", "{out}");
    // No proxy variables and only `lo`: the name does not even resolve.
    assert!(content(2).starts_with("failed:"), "{out}");
    assert!(net.http.conns.lock().unwrap().is_empty());

    // The connection's receipt and the gate's decision are in one scope: the server
    // namespace's session, not the agent's (where mcpfs receipts the `fetch` calls).
    common::wait_until("the two connections' receipts", || {
        let receipts = all_receipts(&w);
        !effects_for(&receipts, "api.test").is_empty()
            && !effects_for(&receipts, "other.test").is_empty()
    });
    let scope = scopes(&w)
        .into_iter()
        .find(|s| !effects_for(&w.receipts(s), "api.test").is_empty())
        .unwrap();
    let receipts = w.receipts(&scope);
    assert!(
        receipts.iter().any(|r| r["kind"] == "decision"
            && r["subject"]["tool"] == "net:api.test:443"
            && r["subject"]["verdict"] == "allow"),
        "no allow decision for net:api.test:443 in the connection's scope: {receipts:#?}"
    );
    assert!(
        !receipts
            .iter()
            .any(|r| r["subject"]["tool"] == "mcp:fetcher:fetch"),
        "the server's connection is in the calling agent's scope: {receipts:#?}"
    );
    let api = effects_for(&receipts, "api.test");
    assert_eq!(api.len(), 1, "{api:#?}");
    assert_eq!(api[0]["outcome"], "closed");
    assert_eq!(api[0]["address"], format!("{ip}:443").as_str());
    assert_eq!(api[0]["tool"], "net:api.test:443");
    let other = effects_for(&receipts, "other.test");
    assert_eq!(other.len(), 1, "{other:#?}");
    assert_eq!(other[0]["outcome"], "refused");
    // That session is the server's namespace's own (`origin mcp`, its argv the server's):
    // mcpfs keeps one server per name for every namespace that mounts it.
    let server_sessions: Vec<String> = common::ns_ids(&w)
        .iter()
        .map(|id| {
            let info = w.run_ok(&["cat", &format!("/ns/{id}/info")]).stdout;
            String::from_utf8_lossy(&info).into_owned()
        })
        .filter(|info| info.starts_with("origin mcp\n") && info.contains("fetching.py"))
        .filter_map(|info| {
            let session = info.lines().find_map(|l| l.strip_prefix("session "));
            session.map(str::to_string)
        })
        .collect();
    assert!(
        server_sessions.contains(&scope),
        "{scope} is not an MCP server's session: {server_sessions:?}"
    );
    // The `net none` server made no connection anyone receipted.
    assert_eq!(effects_for(&all_receipts(&w), "api.test").len(), 1);
}
