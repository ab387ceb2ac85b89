//! Two warren "hosts" on one machine, joined by a veth pair: host A is the root network
//! namespace, host B's exportfs listens inside a network namespace of its own (`ip netns`), each
//! with its own runtime, data, secrets and config dirs. From `warren run` on A, `mount -k b
//! tcp!IP!PORT /n/b/tool` shows exactly what B's peers entry grants A, B's gate decides every
//! call (an exec-tier call waits for B's operator) and B's receiptd keeps the receipts, under
//! the session A's key names.
//!
//! Why one file: one test binary around one two-host setup (veth pair, two runtimes); its
//! tests share it.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::netns::Link;
use common::*;
use warren_exportfs::keys::PublicKey;

fn write_peers(config: &Path, text: &str) {
    let path = config.join("peers");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn up(base_config: &str) -> Warren {
    Warren::up_with(&[("WARREN_CONFIG_DIR", base_config)])
}

/// `warren keys init` → the public key.
fn keys_init(w: &Warren) -> PublicKey {
    let out = w.run_ok(&["keys", "init"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let shown = w.run_ok(&["keys", "show"]);
    assert_eq!(shown.stdout, out.stdout, "show prints what init made");
    PublicKey::parse(text.lines().next().unwrap()).unwrap()
}

/// B's `warren export`, inside `netns`, with a pre-auth deadline of `deadline`; returns the
/// child and the port it listens on.
fn export(w: &Warren, config: &Path, netns: &str, ip: &str, deadline: &str) -> (Child, u16) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, env!("CARGO_BIN_EXE_warren")])
        .args([
            "export",
            "--listen",
            &format!("tcp!{ip}!0"),
            "--auth-deadline",
            deadline,
        ])
        .env("WARREN_RUNTIME_DIR", w.runtime())
        .env("WARREN_DATA_DIR", w.base.path().join("data"))
        .env("WARREN_SECRETS_DIR", w.base.path().join("secrets"))
        .env("WARREN_CONFIG_DIR", config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(w.base.path().join("exportfs.log")).unwrap());
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "warren export printed `{line}`: {}",
                std::fs::read_to_string(w.base.path().join("exportfs.log")).unwrap_or_default()
            )
        });
    (child, port)
}

struct Hosts {
    a: Warren,
    b: Warren,
    a_key: PublicKey,
    b_key: PublicKey,
    a_config: PathBuf,
    b_config: PathBuf,
    exportfs: Child,
    addr: String,
    link: Link,
    _configs: tempfile::TempDir,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.exportfs.kill();
        let _ = self.exportfs.wait();
    }
}

/// A and B up, keys made, each in the other's peers file (B grants A `b_grants`), B exporting.
fn hosts(b_grants: &str) -> Hosts {
    hosts_with_deadline(b_grants, "2s")
}

/// [`hosts`], B's exportfs giving a connection `deadline` to authenticate.
fn hosts_with_deadline(b_grants: &str, deadline: &str) -> Hosts {
    let link = Link::new();
    let configs = tempfile::Builder::new()
        .prefix("wexp")
        .tempdir_in("/tmp")
        .unwrap();
    let (a_config, b_config) = (configs.path().join("a"), configs.path().join("b"));
    for d in [configs.path(), &a_config, &b_config] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let a = up(a_config.to_str().unwrap());
    let b = up(b_config.to_str().unwrap());
    let a_key = keys_init(&a);
    let b_key = keys_init(&b);
    write_peers(&b_config, &format!("a {a_key} {b_grants}\n"));
    let (exportfs, port) = export(&b, &b_config, &link.netns, &link.inside_ip, deadline);
    let addr = format!("tcp!{}!{port}", link.inside_ip);
    write_peers(&a_config, &format!("b {b_key} addr:{addr}\n"));
    Hosts {
        a,
        b,
        a_key,
        b_key,
        a_config,
        b_config,
        exportfs,
        addr,
        link,
        _configs: configs,
    }
}

/// Every `remote` receipt on `w`, in any session.
fn remote_receipts(w: &Warren) -> Vec<serde_json::Value> {
    let listed = w.run(&["ls", "/receipts"]);
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| l.trim_end_matches('/'))
        .filter(|s| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .flat_map(|s| w.receipts(s))
        .filter(|b| b["kind"] == "remote")
        .collect()
}

/// The kinds of a session's receipts on `w` so far (none while it has no log yet).
fn receipt_kinds(w: &Warren, session: &str) -> Vec<String> {
    let listed = w.run(&["ls", "/receipts"]);
    if !String::from_utf8_lossy(&listed.stdout).contains(session) {
        return Vec::new();
    }
    w.receipts(session)
        .iter()
        .map(|b| b["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

impl Hosts {
    /// A spec mounting B's `asks` tree (what `asks:remote` grants) at `/n/b/asks`.
    fn asks_spec(&self) -> String {
        let path = self.a.base.path().join("asks.ns");
        std::fs::write(&path, format!("mount -k b {} /n/b/asks asks\n", self.addr)).unwrap();
        path.to_str().unwrap().to_owned()
    }

    fn spec(&self, extra: &str) -> String {
        let path = self.a.base.path().join("import.ns");
        std::fs::write(
            &path,
            format!("mount -k b {} /n/b/tool{extra}\n", self.addr),
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// A directory under /tmp that B's `shell` and `fs_write` workers may write (a root grant).
fn shell_work_dir() -> tempfile::TempDir {
    let work = tempfile::Builder::new()
        .prefix("wexpw")
        .tempdir_in("/tmp")
        .unwrap();
    common::open_to_shell_workers(work.path());
    work
}

#[test]
fn a_peer_sees_exactly_its_grant_and_b_decides_and_receipts_its_calls() {
    let work = shell_work_dir();
    let dir = work.path().to_str().unwrap();
    let h = hosts(&format!("tool:echo,shell root:shell:{dir}"));
    let spec = h.spec("");
    let (code, out, err) = h.a.sh(
        &["--ns", &spec],
        r#"cat /n/b/tool/tools; echo ---;
           exec 3<>/n/b/tool/echo/call; printf '{"text":"across"}' >&3; cat <&3; echo"#,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let (tools, call) = out.split_once("---\n").unwrap();
    let names: Vec<&str> = tools
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["echo", "shell"], "{tools}");
    let envelope: serde_json::Value = serde_json::from_str(call.trim()).unwrap();
    assert_eq!(envelope["status"], "ok", "{call}");
    assert!(call.contains("across"), "{call}");

    // B's receipts, under the session A's key names: the decision and the run.
    let session = h.a_key.session();
    wait_until("B's receipts of A's echo call", || {
        receipt_kinds(&h.b, &session).iter().any(|k| k == "query")
    });
    let kinds = receipt_kinds(&h.b, &session);
    assert!(kinds.iter().any(|k| k == "decision"), "{kinds:?}");

    // A's own receipt of the call, in the calling namespace's session: the tool, the digest of
    // the arguments written, B's key, and the decision receipt B's envelope named; that entry
    // is in B's chain (B's next entry names its hash as `prev`).
    let remote = remote_receipts(&h.a);
    assert_eq!(
        remote.len(),
        1,
        "{remote:?}\n{}",
        std::fs::read_to_string(h.a.runtime().join("warren.log")).unwrap_or_default()
    );
    let (subject, digests) = (&remote[0]["subject"], &remote[0]["digests"]);
    assert_eq!(subject["tool"], "echo", "{subject}");
    assert_eq!(subject["peer"], "b", "{subject}");
    assert_eq!(subject["key"], h.b_key.fingerprint(), "{subject}");
    assert_eq!(subject["status"], "ok", "{subject}");
    let args = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(
        br#"{"text":"across"}"#,
    ));
    assert_eq!(
        digests["args"],
        format!("sha256:{}", hex::encode(args)),
        "{digests}"
    );
    assert_eq!(remote[0]["appender"], "operator:0", "{:?}", remote[0]);
    let decision = &subject["remote"]["decision"];
    let (seq, hash) = (decision["seq"].as_u64().unwrap(), &decision["hash"]);
    let b_chain = h.b.receipts(&session);
    let at = |n: u64| {
        b_chain
            .iter()
            .find(|b| b["seq"] == n)
            .unwrap_or_else(|| panic!("no entry {n} in B's chain: {b_chain:?}"))
    };
    assert_eq!(at(seq)["kind"], "decision", "{b_chain:?}");
    assert_eq!(&at(seq + 1)["prev"], hash, "{b_chain:?}");

    // An exec-tier call asks on B's gate, and runs once B's operator allows it.
    let agent = call_on_b(
        &h.a,
        &spec,
        "shell",
        &format!(r#"{{"command":"true","cwd":"{dir}"}}"#),
    );
    let (id, request) = next_ask(&h.b, 0);
    assert!(request.contains("tool shell"), "{request}");
    assert_eq!(field(&request, "session"), session, "{request}");
    let fp = fingerprint(&request).to_string();
    h.b.run_ok(&[
        "write",
        &format!("/gate/pending/{id}/ctl"),
        &format!("allow once {fp}"),
    ]);
    let out = agent.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(r#""status":"ok""#), "{stdout}");
}

#[test]
fn a_tool_the_entry_does_not_grant_is_absent_and_a_tree_it_does_not_grant_is_refused() {
    let h = hosts("tool:echo");
    let spec = h.spec("");
    let (code, out, err) = h.a.sh(
        &["--ns", &spec],
        "cat /n/b/tool/tools; test -e /n/b/tool/shell && echo SHELL",
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(!out.contains("SHELL") && !out.contains("shell"), "{out}");
    // The same through `warren run --import`, the address from A's peers entry for b.
    let out =
        h.a.cmd(&[
            "run",
            "--import",
            "b:tool:/n/b/tool",
            "--",
            "/bin/cat",
            "/n/b/tool/tools",
        ])
        .env("WARREN_CONFIG_DIR", &h.a_config)
        .output()
        .unwrap();
    let (code, out, err) = (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.starts_with("echo") && !out.contains("shell"), "{out}");
    let spec = h.spec(" dir");
    let (code, out, err) = h.a.sh(&["--ns", &spec], "true");
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("not granted tree `dir`"), "{err}");
    // Without `asks:remote` there is no asks tree: B's operator alone answers A's asks.
    let (code, out, err) = h.a.sh(&["--ns", &h.asks_spec()], "true");
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("not granted tree `asks`"), "{err}");
}

/// `asks:remote` in B's entry for A: A's operator, through `mount -k b … /n/b/asks asks`, sees
/// the asks A's own calls raised on B and answers a write-tier one (`allow once`): the call goes
/// through and B's receipt names the channel `peer:<A's fingerprint>`. An exec-tier ask is
/// refused on that channel and waits for B's operator, who still answers it; a second peer, C,
/// also with `asks:remote`, neither sees nor answers it.
#[test]
fn with_asks_remote_a_answers_its_write_tier_ask_but_an_exec_tier_one_stays_with_b() {
    let work = shell_work_dir();
    let dir = work.path().to_str().unwrap();
    let h = hosts(&format!(
        "tool:fs_write,shell root:fs_write:{dir} root:shell:{dir} asks:remote"
    ));
    let (spec, asks) = (h.spec(""), h.asks_spec());
    let session = h.a_key.session();
    let channel = format!("peer:{}", h.a_key.fingerprint());

    // A write-tier call asks on B; A answers it.
    let agent = call_on_b(
        &h.a,
        &spec,
        "fs_write",
        &format!(r#"{{"path":"{dir}/x","content":"y"}}"#),
    );
    let (id, request) = next_ask(&h.b, 0);
    assert_eq!(field(&request, "tier"), "write", "{request}");
    let fp = fingerprint(&request).to_string();
    let (code, out, err) = h.a.sh(
        &["--ns", &asks],
        &format!(
            "ls /n/b/asks/pending; cat /n/b/asks/pending/{id}/request; \
             echo 'allow once {fp}' > /n/b/asks/pending/{id}/ctl && echo ANSWERED"
        ),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with(&format!("{id}\n")), "{out}");
    assert!(
        out.contains(&format!("answer allow once {fp} | deny")),
        "{out}"
    );
    assert!(out.contains("ANSWERED"), "{out}\n{err}");
    let done = agent.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout);
    // Past the gate, the tool ran: a peer's roots are read-only, so fs_write refuses there.
    assert!(!stdout.contains(r#""status":"denied""#), "{stdout}");
    assert!(stdout.contains("read-only"), "{stdout}");
    let answered: Vec<_> =
        h.b.decisions(&session)
            .into_iter()
            .filter(|d| d["pending"] == id && d["basis"] == "answer:allow_once")
            .collect();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["answered_by"], channel.as_str(), "{answered:?}");
    assert_eq!(answered[0]["verdict"], "allow", "{answered:?}");

    // An exec-tier call: A's `allow once` is refused, the ask stays open for B's operator.
    let agent = call_on_b(
        &h.a,
        &spec,
        "shell",
        &format!(r#"{{"command":"true","cwd":"{dir}"}}"#),
    );
    let (id, request) = next_ask(&h.b, id);
    assert_eq!(field(&request, "tier"), "exec", "{request}");
    let fp = fingerprint(&request).to_string();
    let (code, out, err) = h.a.sh(
        &["--ns", &asks],
        &format!(
            "cat /n/b/asks/pending/{id}/request; \
             echo 'allow once {fp}' > /n/b/asks/pending/{id}/ctl && echo ANSWERED || echo REFUSED"
        ),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("answer deny (allowing it is this host's operator's)"),
        "{out}"
    );
    assert!(
        out.contains("REFUSED") && !out.contains("ANSWERED"),
        "{out}\n{err}"
    );
    let still = h.b.run_ok(&["cat", &format!("/gate/pending/{id}/request")]);
    assert_eq!(
        field(&String::from_utf8_lossy(&still.stdout), "state"),
        "open"
    );
    // A second peer, C, with `asks:remote` too, sees none of A's asks and cannot answer them.
    let c_config = h._configs.path().join("c");
    std::fs::create_dir_all(&c_config).unwrap();
    std::fs::set_permissions(&c_config, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = up(c_config.to_str().unwrap());
    let c_key = keys_init(&c);
    write_peers(&c_config, &format!("b {} addr:{}\n", h.b_key, h.addr));
    write_peers(
        &h.b_config,
        &format!(
            "a {} tool:fs_write,shell root:fs_write:{dir} root:shell:{dir} asks:remote\n\
             c {c_key} asks:remote\n",
            h.a_key
        ),
    );
    let c_spec = c.base.path().join("asks.ns");
    std::fs::write(&c_spec, format!("mount -k b {} /n/b/asks asks\n", h.addr)).unwrap();
    let (code, out, err) = c.sh(
        &["--ns", c_spec.to_str().unwrap()],
        &format!(
            "echo LISTED; ls /n/b/asks/pending; echo END; \
             cat /n/b/asks/pending/{id}/request || echo UNSEEN; \
             echo deny > /n/b/asks/pending/{id}/ctl || echo UNANSWERED"
        ),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("LISTED\nEND\n"), "{out}\n{err}");
    assert!(
        out.contains("UNSEEN") && out.contains("UNANSWERED"),
        "{out}\n{err}"
    );
    let still = h.b.run_ok(&["cat", &format!("/gate/pending/{id}/request")]);
    assert_eq!(
        field(&String::from_utf8_lossy(&still.stdout), "state"),
        "open"
    );
    h.b.run_ok(&[
        "write",
        &format!("/gate/pending/{id}/ctl"),
        &format!("allow once {fp}"),
    ]);
    let done = agent.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(stdout.contains(r#""status":"ok""#), "{stdout}");
    let answered: Vec<_> =
        h.b.decisions(&session)
            .into_iter()
            .filter(|d| d["pending"] == id && d["basis"] == "answer:allow_once")
            .collect();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_ne!(answered[0]["answered_by"], channel.as_str(), "{answered:?}");
}

#[test]
fn a_server_with_another_key_is_refused_naming_both_fingerprints() {
    let h = hosts("tool:echo");
    // B's entry on A now names some other key: whoever answers at B's address is not b.
    let other = tempfile::tempdir().unwrap();
    let other_key = warren_exportfs::keys::HostKey::create(&other.path().join("k")).unwrap();
    write_peers(&h.a_config, &format!("b {}\n", other_key.public()));
    let spec = h.spec("");
    let (code, _out, err) = h.a.sh(&["--ns", &spec], "true");
    assert_ne!(code, 0);
    assert!(err.contains(&other_key.public().fingerprint()), "{err}");
    let b_key =
        warren_exportfs::keys::HostKey::load(&h.b.base.path().join("secrets").join("host.key"))
            .unwrap();
    assert!(err.contains(&b_key.public().fingerprint()), "{err}");
}

#[test]
fn a_dropped_link_fails_the_call_in_flight_instead_of_hanging() {
    let work = shell_work_dir();
    let dir = work.path().to_str().unwrap();
    let mut h = hosts(&format!("tool:shell root:shell:{dir}"));
    let spec = h.spec("");
    // An exec-tier call waits on B's gate for an answer that never comes.
    let agent = h.a.spawn_run(&[
        "--ns",
        &spec,
        "--",
        "/bin/sh",
        "-c",
        &format!(
            r#"exec 3<>/n/b/tool/shell/call; printf '{{"command":"true","cwd":"{dir}"}}' >&3; cat <&3; echo "exit=$?""#
        ),
    ]);
    next_ask(&h.b, 0);
    let _ = h.exportfs.kill();
    let _ = h.exportfs.wait();
    let out = agent.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("exit=1") && !stdout.contains("status"),
        "the read failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The next line of an agent's output, waiting at most a generous bound: a line that never
/// comes (a call that hangs) fails the test instead of hanging it.
fn next_line(lines: &std::sync::mpsc::Receiver<String>, what: &str) -> String {
    lines
        .recv_timeout(std::time::Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("no line for {what} ({e}): a call hung"))
}

/// The cable pulled while a call waits on B's gate: the call fails with EIO once the link's
/// keepalives give up (never a hang), a later call fails with EIO while the cable is out, B
/// withdraws the ask of the call whose connection died, and once the cable is back the same
/// mount works again: nsd dials B again, a new handshake, B's key checked again (while A's
/// entry names another key, the re-dial is refused).
#[test]
fn pulling_the_cable_mid_call_gives_eio_and_the_mount_works_again_once_it_is_back() {
    let work = shell_work_dir();
    let dir = work.path().to_str().unwrap();
    let h = hosts(&format!("tool:echo,shell root:shell:{dir}"));
    let spec = h.spec("");
    // Each step prints one line; `read` waits for the test between the steps.
    let mut agent =
        h.a.cmd(&[
            "run",
            "--ns",
            &spec,
            "--",
            "/bin/sh",
            "-c",
            &format!(
                r#"exec 3<>/n/b/tool/shell/call; printf '{{"command":"true","cwd":"{dir}"}}' >&3
                   out=$(cat <&3 2>&1); echo "in-flight: $out exit=$?"
                   exec 3<&-
                   out=$(cat /n/b/tool/tools 2>&1); echo "while-down: $out exit=$?"
                   read back
                   n=0
                   until out=$(exec 4<>/n/b/tool/echo/call; printf '{{"text":"again"}}' >&4; cat <&4 2>&1); do
                     n=$((n+1)); [ $n -lt 120 ] || break; sleep 1
                   done
                   echo "after: $out""#
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = agent.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let (id, _) = next_ask(&h.b, 0);
    h.link.set_up(false);

    let in_flight = next_line(&lines, "the call in flight");
    assert!(
        in_flight.contains("Input/output error") && in_flight.ends_with("exit=1"),
        "{in_flight}"
    );
    let while_down = next_line(&lines, "a call while the cable is out");
    assert!(
        while_down.contains("Input/output error") && while_down.ends_with("exit=1"),
        "{while_down}"
    );
    // B: the call never started, its connection is gone, so its ask is withdrawn.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    loop {
        let out = h.b.run(&["cat", &format!("/gate/pending/{id}/request")]);
        if field(&String::from_utf8_lossy(&out.stdout), "state") == "orphaned" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B never withdrew the ask of the dropped call"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // The cable back, but A's entry for b now names another key: nsd's re-dial checks the
    // key again, and refuses the host that answers.
    let b_key =
        warren_exportfs::keys::HostKey::load(&h.b.base.path().join("secrets").join("host.key"))
            .unwrap()
            .public();
    let other = tempfile::tempdir().unwrap();
    let other_key = warren_exportfs::keys::HostKey::create(&other.path().join("k")).unwrap();
    write_peers(
        &h.a_config,
        &format!("b {} addr:{}\n", other_key.public(), h.addr),
    );
    h.link.set_up(true);
    {
        use std::io::Write;
        let mut stdin = agent.stdin.take().unwrap();
        stdin.write_all(b"back\n").unwrap();
    }
    let log = h.a.runtime().join("warren.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let presented = format!("the server presented {}", b_key.fingerprint());
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains(&presented)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no re-dial refused b's key while A's entry named another"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    write_peers(&h.a_config, &format!("b {b_key} addr:{}\n", h.addr));
    let after = next_line(&lines, "a call once the cable is back");
    assert!(
        after.contains(r#""status":"ok""#) && after.contains("again"),
        "{after}"
    );
    let status = agent.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// diod, a peer: missing is a failure (scripts/install-test-deps installs it).
fn diod() -> &'static str {
    ["/usr/sbin/diod", "/usr/bin/diod"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("diod is not installed (scripts/install-test-deps installs it)")
}

/// Plain 9P interop across the cable: a diod export served in B's network namespace is mounted
/// on A with `mount --insecure-plain tcp!…`, and the same line without the flag is refused
/// (neither authenticated nor encrypted, and not on this host).
#[test]
fn a_diod_export_across_the_cable_mounts_only_with_insecure_plain() {
    let link = Link::new();
    let a = Warren::up();
    let export = tempfile::Builder::new()
        .prefix("wexpx")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(export.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(export.path().join("small"), "through diod on b\n").unwrap();
    // diod names each client with getnameinfo, which fails (and drops the client) where B's
    // namespace has no resolver: `ip netns exec` shows B this hosts file instead of /etc/hosts.
    let etc = Path::new("/etc/netns").join(&link.netns);
    std::fs::create_dir_all(&etc).unwrap();
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _etc = Remove(etc.clone());
    std::fs::write(
        etc.join("hosts"),
        format!("127.0.0.1 localhost\n{} host-a\n", link.outside_ip),
    )
    .unwrap();
    let listen = format!("{}:564", link.inside_ip);
    let mut diod = Command::new("ip")
        .args(["netns", "exec", &link.netns, diod()])
        .args(["-f", "-n", "-L", "stderr", "-l", &listen, "-e"])
        .arg(export.path())
        .stderr(std::fs::File::create(a.base.path().join("diod.log")).unwrap())
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _reap = Reap(&mut diod);
    wait_until("diod listens in B's namespace", || {
        std::net::TcpStream::connect(&listen).is_ok()
    });
    let server = format!("tcp!{}!564", link.inside_ip);
    let spec = |flag: &str| {
        let path = a.base.path().join(format!("diod{}.ns", flag.len()));
        std::fs::write(
            &path,
            format!("mount {flag}{server} /n/d {}\n", export.path().display()),
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    };

    let (code, out, err) = a.sh(&["--ns", &spec("")], "cat /n/d/small");
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("neither authenticated nor encrypted") && err.contains("--insecure-plain"),
        "{err}"
    );
    let (code, out, err) = a.sh(
        &["--ns", &spec("--insecure-plain ")],
        "cat /n/d/small; ls /n/d",
    );
    assert_eq!(
        code,
        0,
        "{out}\n{err}\ndiod: {}\nwarren: {}",
        std::fs::read_to_string(a.base.path().join("diod.log")).unwrap_or_default(),
        std::fs::read_to_string(a.runtime().join("warren.log")).unwrap_or_default()
    );
    assert_eq!(out, "through diod on b\nsmall\n");
}

/// The shipped exportfs unit runs `warren export` with flags that parse, with the directories
/// the code reads, and passes `systemd-analyze verify` beside warren's own unit.
#[test]
fn the_exportfs_unit_runs_warren_export_and_passes_systemd_analyze() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/systemd");
    let unit = std::fs::read_to_string(units.join("warren-exportfs.service")).unwrap();
    let exec: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .collect();
    assert_eq!(exec.len(), 1, "{exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(words[..3], ["/usr/local/bin/warren", "export", "--listen"]);
    let help = Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["export", "--listen", "tcp!127.0.0.1!1", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success(), "{help:?}");
    for var in [
        "WARREN_RUNTIME_DIR=/run/warren",
        "WARREN_DATA_DIR=/var/lib/warren",
        "WARREN_SECRETS_DIR=/etc/warren/secrets",
        "WARREN_CONFIG_DIR=/etc/warren",
    ] {
        assert!(unit.contains(&format!("Environment={var}\n")), "{var}");
    }
    let dir = tempfile::tempdir().unwrap();
    for name in ["warren.service", "warren-exportfs.service"] {
        let text = std::fs::read_to_string(units.join(name)).unwrap();
        std::fs::write(
            dir.path().join(name),
            text.replace("/usr/local/bin/warren", env!("CARGO_BIN_EXE_warren")),
        )
        .unwrap();
    }
    let man1 = dir.path().join("man/man1");
    let man = Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["man", "--dir"])
        .arg(&man1)
        .output()
        .unwrap();
    assert!(man.status.success(), "{man:?}");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("warren-exportfs.service"))
        .env("MANPATH", dir.path().join("man"))
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.path().display()))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dir:docs:/PATH` in B's entry for A: A mounts B's directory read-only and reads it; writes
/// fail, and what B's others may not read stays unread.
#[test]
fn a_peer_reads_a_granted_directory_and_cannot_write_it() {
    let shared = tempfile::Builder::new()
        .prefix("wexpd")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(shared.path().join("notes.md"), "from b\n").unwrap();
    std::fs::set_permissions(
        shared.path().join("notes.md"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::write(shared.path().join("private"), "b only\n").unwrap();
    std::fs::set_permissions(
        shared.path().join("private"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let h = hosts(&format!("dir:docs:{}", shared.path().display()));
    let path = h.a.base.path().join("docs.ns");
    std::fs::write(&path, format!("mount -k b {} /n/b/docs docs\n", h.addr)).unwrap();
    let (code, out, err) = h.a.sh(
        &["--ns", path.to_str().unwrap()],
        "ls /n/b/docs; cat /n/b/docs/notes.md; \
         cat /n/b/docs/private || echo PRIVATE-REFUSED; \
         echo x > /n/b/docs/notes.md || echo WRITE-REFUSED; \
         echo x > /n/b/docs/new || echo CREATE-REFUSED",
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("notes.md\nprivate\nfrom b\n"), "{out}");
    for refused in ["PRIVATE-REFUSED", "WRITE-REFUSED", "CREATE-REFUSED"] {
        assert!(out.contains(refused), "{refused}: {out}\n{err}");
    }
    assert_eq!(
        std::fs::read_to_string(shared.path().join("notes.md")).unwrap(),
        "from b\n"
    );
    assert!(!shared.path().join("new").exists());
}

/// A spec mounting B's `tool` tree and B's `receipts` tree (what a `tool` grant brings).
fn tool_and_receipts_spec(w: &Warren, addr: &str) -> String {
    let path = w.base.path().join("receipts.ns");
    std::fs::write(
        &path,
        format!("mount -k b {addr} /n/b/tool\nmount -k b {addr} /n/b/receipts receipts\n"),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// One echo call on B from `w`'s namespace; the call's envelope is `ok`.
fn echo_on_b(w: &Warren, spec: &str) {
    let (code, out, err) = w.sh(
        &["--ns", spec],
        r#"exec 3<>/n/b/tool/echo/call; printf '{"text":"x"}' >&3; cat <&3"#,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(r#""status":"ok""#), "{out}");
}

/// The size a signed checkpoint (C2SP note) names: its second line.
fn checkpoint_size(note: &str) -> Option<u64> {
    note.lines().nth(1)?.parse().ok()
}

/// The calling host's `remote` receipt cross-references the serving host's signed chain: A reads
/// its own session's log, head and key registry on B through the link (`receipts`, granted with
/// `tool`), and `warren verify --head --entry SEQ:HASH` checks, offline on A, that B's signed
/// checkpoint covers an entry with exactly the `{seq, hash}` A's receipt names, and A's own chain
/// (holding that receipt) verifies. A tampered log, a wrong hash or an entry past B's checkpoint
/// is refused. The view is A's session alone: B's own scopes, its `append` and
/// `ctl`, and a second peer's session are absent (ENOENT) for A, and A's for that peer.
#[test]
fn a_remote_receipt_is_checked_against_bs_signed_checkpoint_read_through_the_link() {
    let h = hosts("tool:echo");
    let spec = tool_and_receipts_spec(&h.a, &h.addr);
    echo_on_b(&h.a, &spec);
    let remote = remote_receipts(&h.a);
    assert_eq!(remote.len(), 1, "{remote:?}");
    let decision = &remote[0]["subject"]["remote"]["decision"];
    let (seq, hash) = (
        decision["seq"].as_u64().unwrap(),
        decision["hash"].as_str().unwrap().to_owned(),
    );
    let session = h.a_key.session();
    let read = |path: &str| {
        let (code, out, err) = h.a.sh(&["--ns", &spec], &format!("cat {path}"));
        assert_eq!(code, 0, "{path}: {err}");
        out
    };
    // B signs a checkpoint of the session within its interval; A reads it through the link.
    let mut head = String::new();
    wait_until("B's checkpoint covering the decision, read by A", || {
        head = read(&format!("/n/b/receipts/{session}/head"));
        checkpoint_size(&head).is_some_and(|n| n > seq)
    });
    let size = checkpoint_size(&head).unwrap() as usize;
    let log = read(&format!("/n/b/receipts/{session}/log"));
    let keys = read("/n/b/receipts/keys");
    let mut export: String = log.lines().take(size).map(|l| format!("{l}\n")).collect();
    assert_eq!(export.lines().count(), size, "{log}");
    export.push_str(&serde_json::json!({ "checkpoint": head }).to_string());
    export.push('\n');
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (export_path, keys_path, head_path) = (
        file("export", &export),
        file("keys", &keys),
        file("head", &head),
    );
    let verify = |export: &str, entry: &str| {
        let out = h.a.run(&[
            "verify", export, "--keys", &keys_path, "--head", &head_path, "--entry", entry,
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, said) = verify(&export_path, &format!("{seq}:{hash}"));
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!("entry {seq} has hash {hash}")),
        "{said}"
    );

    // A's own chain verifies too: the calling namespace's session, holding the signed `remote`
    // receipt that names B's `{seq, hash}`.
    let a_scope = remote[0]["scope"].as_str().unwrap();
    let a_export = h.a.run_ok(&["receipts", "export", a_scope]).stdout;
    let a_export = file("a-export", &String::from_utf8(a_export).unwrap());
    let remote_seq = remote[0]["seq"].as_u64().unwrap();
    let out =
        h.a.run(&["verify", &a_export, "--size", &(remote_seq + 1).to_string()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");

    // Planted: a hash B's chain does not hold at that seq; an entry past the checkpoint; and a
    // log whose decision entry was changed by a byte.
    let wrong = format!("{seq}:{}", "0".repeat(64));
    let (code, said) = verify(&export_path, &wrong);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("not 0000"), "{said}");
    let (code, said) = verify(&export_path, &format!("{size}:{hash}"));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("is not under the checkpoint"), "{said}");
    let line = export.lines().nth(seq as usize).unwrap().to_owned();
    let tampered = export.replacen(&line, &line.replacen("\"sig\":\"", "\"sig\":\"A", 1), 1);
    assert_ne!(tampered, export);
    let (code, said) = verify(&file("tampered", &tampered), &format!("{seq}:{hash}"));
    assert_eq!(code, Some(1), "{said}");

    // A second peer, C, granted echo too, calls on B: neither reads the other's session, and
    // neither reads B's own scope (`receiptd`) nor its `append` or `ctl`.
    let c_config = h._configs.path().join("c");
    std::fs::create_dir_all(&c_config).unwrap();
    std::fs::set_permissions(&c_config, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = up(c_config.to_str().unwrap());
    let c_key = keys_init(&c);
    write_peers(&c_config, &format!("b {} addr:{}\n", h.b_key, h.addr));
    write_peers(
        &h.b_config,
        &format!("a {} tool:echo\nc {c_key} tool:echo\n", h.a_key),
    );
    let c_spec = tool_and_receipts_spec(&c, &h.addr);
    echo_on_b(&c, &c_spec);
    let c_session = c_key.session();
    wait_until("C's session on B", || {
        receipt_kinds(&h.b, &c_session).iter().any(|k| k == "query")
    });
    for (w, spec, other) in [(&h.a, &spec, &c_session), (&c, &c_spec, &session)] {
        let (code, out, err) = w.sh(
            &["--ns", spec],
            &format!(
                "for p in {other}/log {other}/head receiptd/log receiptd append ctl; do \
                   cat /n/b/receipts/$p 2>&1 || echo REFUSED; done"
            ),
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert_eq!(out.matches("REFUSED").count(), 6, "{out}");
        assert_eq!(out.matches("No such file or directory").count(), 6, "{out}");
    }
    for (w, spec, own, other) in [
        (&h.a, &spec, &session, &c_session),
        (&c, &c_spec, &c_session, &session),
    ] {
        let (_, listed, _) = w.sh(&["--ns", spec], "ls /n/b/receipts");
        let mut names: Vec<&str> = listed.split_whitespace().collect();
        let mut want = vec!["keys", own.as_str()];
        names.sort_unstable();
        want.sort_unstable();
        assert_eq!(names, want, "{listed}");
        assert!(!listed.contains(other.as_str()), "{listed}");
    }
}

/// An agent on A calling `tool` on B's `/n/b` with `args` (its reply on stdout).
fn call_on_b(a: &Warren, spec: &str, tool: &str, args: &str) -> Child {
    a.spawn_run(&[
        "--ns",
        spec,
        "--",
        "/bin/sh",
        "-c",
        &format!("exec 3<>/n/b/tool/{tool}/call; printf '{args}' >&3; cat <&3"),
    ])
}

/// `per_source` silent TCP connections to B's exportfs from each of `sources` addresses of B's
/// network namespace (strangers on B's side of the cable, `10.77.0.1` on), each address's in
/// turn: they never say a word.
fn silent_strangers(h: &Hosts, port: u16, sources: u8, per_source: usize) -> Vec<TcpStream> {
    let ips: Vec<Ipv4Addr> = (1..=sources).map(|s| Ipv4Addr::new(10, 77, 0, s)).collect();
    for ip in &ips {
        let out = Command::new("ip")
            .args([
                "-n",
                &h.link.netns,
                "addr",
                "add",
                &format!("{ip}/32"),
                "dev",
                "lo",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let server = SocketAddrV4::new(h.link.inside_ip.parse().unwrap(), port);
    h.link.inside(move || {
        use nix::sys::socket::{
            AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, socket,
        };
        let mut conns = Vec::new();
        for ip in ips {
            for _ in 0..per_source {
                let fd = socket(
                    AddressFamily::Inet,
                    SockType::Stream,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .unwrap();
                bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(ip, 0))).unwrap();
                connect(fd.as_raw_fd(), &SockaddrIn::from(server)).unwrap();
                conns.push(TcpStream::from(fd));
            }
        }
        conns
    })
}

/// More silent connections than B has pre-auth slots, from six addresses, held under a long
/// deadline: A's import is still served, and its tools are listed.
#[test]
fn silent_connections_from_several_addresses_leave_a_peers_import_working() {
    let h = hosts_with_deadline("tool:echo", "10m");
    let port: u16 = h.addr.rsplit('!').next().unwrap().parse().unwrap();
    let per_source = warren_exportfs::server::MAX_PENDING / 6 + 2;
    let _silent = silent_strangers(&h, port, 6, per_source);
    let (code, out, err) = h.a.sh(&["--ns", &h.spec("")], "cat /n/b/tool/tools");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("echo"), "{out}");
}

/// Another process on A makes failed handshakes from A's address (an unknown key): A's own
/// nsd, whose handshake proves A's key, is still served at once.
#[test]
fn failed_handshakes_from_as_address_leave_as_import_working_at_once() {
    let h = hosts("tool:echo");
    let stranger = tempfile::tempdir().unwrap();
    let stranger = warren_exportfs::keys::HostKey::create(&stranger.path().join("k")).unwrap();
    let b = warren_exportfs::peers::Peers::load(&h.a_config.join("peers")).unwrap();
    let b = b.by_name("b").unwrap();
    let port: u16 = h.addr.rsplit('!').next().unwrap().parse().unwrap();
    let failed: Vec<String> = (0..warren_exportfs::server::MAX_FAILURES + 2)
        .map(|_| {
            let tcp = TcpStream::connect((h.link.inside_ip.as_str(), port)).unwrap();
            match warren_exportfs::wire::dial(tcp, &stranger, b, "tool") {
                Ok(_) => panic!("a stranger's key was served"),
                Err(e) => e.to_string(),
            }
        })
        .collect();
    let (code, out, err) = h.a.sh(&["--ns", &h.spec("")], "cat /n/b/tool/tools");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("echo"), "{out}");
    // The stranger was told why each time, never closed unanswered.
    assert!(
        failed.iter().all(|e| e.contains("unknown key")),
        "{failed:?}"
    );
}

/// When the peer drops the connection during the handshake, or refuses it, the operator's
/// error says so, naming the mount, instead of that the launcher did not serve the mounts.
#[test]
fn an_import_the_peer_drops_or_refuses_tells_the_operator_why() {
    let mut h = hosts("tool:echo");
    // At B's address, something that closes every connection at once.
    let listener = h.link.inside({
        let ip = h.link.inside_ip.clone();
        move || std::net::TcpListener::bind((ip.as_str(), 0)).unwrap()
    });
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let spec = h.a.base.path().join("dropped.ns");
    std::fs::write(
        &spec,
        format!("mount -k b tcp!{}!{port} /n/b/tool\n", h.link.inside_ip),
    )
    .unwrap();
    let (code, out, err) = h.a.sh(&["--ns", spec.to_str().unwrap()], "true");
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("closed the connection during the handshake") && err.contains("/n/b/tool"),
        "{err}"
    );
    assert!(!err.contains("did not serve"), "{err}");
    // B's exportfs gone: nothing listens at its address.
    let _ = h.exportfs.kill();
    let _ = h.exportfs.wait();
    let (code, out, err) = h.a.sh(&["--ns", &h.spec("")], "true");
    assert_ne!(code, 0, "{out}");
    assert!(err.to_lowercase().contains("refused"), "{err}");
    assert!(!err.contains("did not serve"), "{err}");
}

/// Attack (another user rewrites who may call this host): the peers file is trusted only as
/// warren's own directories are. A config dir others may write to (0777: anyone could put their
/// own peers file in its place), or a peers file that is a symlink, makes `warren export`
/// refuse to start, saying why — where it used to serve the peers that file named.
#[test]
fn export_refuses_a_peers_file_in_a_shared_dir_or_behind_a_symlink() {
    warren_test_support::kernel::require_root();
    let base = tempfile::Builder::new()
        .prefix("wpeers")
        .tempdir_in("/tmp")
        .unwrap();
    let w = Warren { base };
    let a = keys_init(&w);
    let export = |config: &Path| {
        let mut child = w
            .cmd(&["export", "--listen", "tcp!127.0.0.1!0"])
            .env("WARREN_CONFIG_DIR", config)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.is_empty() {
            child.kill().unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (
            line,
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let entry = format!("a {a} tool:echo\n");

    let shared = w.base.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    write_peers(&shared, &entry);
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (listening, status, err) = export(&shared);
    assert_eq!(
        listening, "",
        "exportfs served a peers file in a 0777 dir: {err}"
    );
    assert!(!status.success());
    assert!(
        err.contains(&shared.display().to_string()) && err.contains("others may write to"),
        "{err}"
    );

    let linked = w.base.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    let elsewhere = w.base.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    write_peers(&elsewhere, &entry);
    std::os::unix::fs::symlink(elsewhere.join("peers"), linked.join("peers")).unwrap();
    let (listening, status, err) = export(&linked);
    assert_eq!(
        listening, "",
        "exportfs read the peers file through a symlink: {err}"
    );
    assert!(!status.success());
    assert!(err.contains("is a symlink"), "{err}");

    // The same file in a directory of root's, not a symlink: served.
    std::fs::remove_file(linked.join("peers")).unwrap();
    write_peers(&linked, &entry);
    let (listening, _, err) = export(&linked);
    assert!(listening.starts_with("listening "), "{listening}: {err}");
}
