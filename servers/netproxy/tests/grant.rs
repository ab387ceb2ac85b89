//! The control socket (`grant`): a listener handed over with a policy is served with exactly
//! that policy until the control connection closes. Needs root (the control socket takes root
//! peers only) and curl.

mod common;

use std::os::fd::AsFd;
use std::sync::Arc;

use common::{HttpServer, curl, stdout};
use warren_netproxy::grant::{GrantRecord, Grants, hand_over};
use warren_netproxy::{Records, Resolver};

/// Sends a grant frame with no listener as uid 65534 (the socket and its directory opened wide
/// first, so only the proxy's own peer check stands): `closed` when the proxy hangs up without
/// reading it, `answer` when it answers (a root peer gets `error: 0 fds …`).
fn frame_as_nobody(ctl: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let wide = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    wide(ctl.parent().unwrap(), 0o755);
    wide(ctl, 0o666);
    warren_test_support::wire::frame_as_nobody(ctl, "{}")
}

#[test]
fn a_handed_over_listener_is_served_with_the_records_policy_until_the_grant_closes() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the control socket takes root peers: run as root"
    );
    let world = HttpServer::start();
    let port = world.port();
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("netproxy.ctl");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 api.test other.test\n").unwrap();
    let grants = Arc::new(Grants {
        resolver: Resolver::from_hosts_file(&hosts).unwrap(),
        gate: None,
        receipts: None,
        records: Records::none(),
    });
    let listener = {
        let _guard = rt.enter();
        warren_daemon::operator::listen(&ctl).unwrap()
    };
    rt.spawn(grants.serve_control(listener));
    assert_eq!(
        frame_as_nobody(&ctl),
        "closed",
        "a non-root peer's grant was read"
    );

    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = tcp.local_addr().unwrap();
    let record = GrantRecord {
        version: 1,
        session: "s1".into(),
        namespace: "1".into(),
        patterns: vec![format!("api.test:{port}=127.0.0.1")],
        lineage: None,
    };
    let control = hand_over(&ctl, &record, tcp.as_fd()).unwrap();
    drop(tcp);
    let via = format!("http://{proxy}");
    let ok = curl(&[
        "-sS",
        "-m",
        "20",
        "--proxy",
        &via,
        &format!("http://api.test:{port}/x"),
    ]);
    assert!(ok.status.success(), "{ok:?}");
    assert!(!stdout(&ok).is_empty());
    let refused = curl(&[
        "-sS",
        "-m",
        "20",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--proxy",
        &via,
        &format!("http://other.test:{port}/"),
    ]);
    assert_eq!(stdout(&refused), "403");

    // A record that is not one, or a grant with no listener, is refused with the reason.
    let bad = GrantRecord {
        patterns: vec!["api.test:0".into()],
        ..record.clone()
    };
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = hand_over(&ctl, &bad, other.as_fd()).unwrap_err();
    assert!(e.to_string().contains("port 0"), "{e}");
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let e = hand_over(&ctl, &record, a.as_fd()).unwrap_err();
    assert!(e.to_string().contains("not a listening TCP"), "{e}");

    // The grant ends with its control connection: the listener is closed.
    drop(control);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(proxy).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener was never closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
