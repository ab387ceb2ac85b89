//! The link on loopback, without the rest of warren: a server whose backend echoes the 9P
//! stream back, real handshakes, and the attacks the server must refuse while it keeps serving.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use warren_exportfs::keys::HostKey;
use warren_exportfs::peers::{Peer, Peers};
use warren_exportfs::server::{
    self, Backend, MAX_FAILURES, MAX_PENDING, MAX_PENDING_PER_SOURCE, PRESSED_DEADLINE,
};
use warren_exportfs::wire::{self, DialError};

/// Echoes whatever the peer sends (stands in for a 9P server).
struct Echo;

impl Backend for Echo {
    fn connect(&self, _peer: &Peer, _tree: &str) -> Result<UnixStream, String> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
        std::thread::spawn(move || {
            let mut r = theirs.try_clone().unwrap();
            let mut w = theirs;
            let _ = std::io::copy(&mut r, &mut w);
        });
        Ok(ours)
    }
}

struct Host {
    _dir: tempfile::TempDir,
    key: PathBuf,
    peers: PathBuf,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("host.key");
        HostKey::create(&key).unwrap();
        let peers = dir.path().join("peers");
        std::fs::write(&peers, "").unwrap();
        Host {
            key,
            peers,
            _dir: dir,
        }
    }
    fn key(&self) -> HostKey {
        HostKey::load(&self.key).unwrap()
    }
    fn entry(&self, name: &str, grants: &str) -> String {
        format!("{name} {} {grants}\n", self.key().public())
    }
    fn trust(&self, lines: &str) {
        std::fs::write(&self.peers, lines).unwrap();
    }
    fn peer(&self, name: &str) -> Peer {
        Peers::load(&self.peers)
            .unwrap()
            .by_name(name)
            .unwrap()
            .clone()
    }
}

/// Starts a server for `host`; returns its port.
fn serve(host: &Host, deadline: Duration) -> u16 {
    let listener = server::listen("tcp!127.0.0.1!0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = server::Config {
        key: host.key(),
        peers: host.peers.clone(),
        auth_deadline: deadline,
        recheck: Duration::from_millis(100),
        backend: Arc::new(Echo),
    };
    std::thread::spawn(move || server::serve(listener, config));
    port
}

fn dial(port: u16, me: &HostKey, them: &Peer, tree: &str) -> Result<wire::Link, DialError> {
    wire::dial(
        TcpStream::connect(("127.0.0.1", port)).unwrap(),
        me,
        them,
        tree,
    )
}

/// A round trip through a link: what is written comes back (the backend echoes it).
fn round_trip(link: wire::Link, payload: &[u8]) -> Vec<u8> {
    let (ours, theirs) = UnixStream::pair().unwrap();
    std::thread::spawn(move || link.relay(theirs));
    let mut w = ours.try_clone().unwrap();
    w.write_all(payload).unwrap();
    let mut got = vec![0u8; payload.len()];
    (&ours).read_exact(&mut got).unwrap();
    got
}

/// Two hosts that know each other: a (the dialler) and b (the server, granting a `tool`).
fn pair() -> (Host, Host, u16) {
    let (a, b) = (Host::new(), Host::new());
    b.trust(&a.entry("a", "tool:echo"));
    a.trust(&b.entry("b", ""));
    let port = serve(&b, Duration::from_secs(30));
    (a, b, port)
}

#[test]
fn a_known_peer_gets_its_tree_and_large_writes_cross_intact() {
    let (a, _b, port) = pair();
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    // Bigger than one frame: chunked and reassembled in order.
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(link, &payload), payload);
}

#[test]
fn an_unknown_key_is_refused_by_name_and_the_server_keeps_serving() {
    let (a, _b, port) = pair();
    let stranger = Host::new();
    let err = dial(port, &stranger.key(), &a.peer("b"), "tool")
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(matches!(err, DialError::Refused(_)), "{text}");
    assert!(text.contains("unknown key SHA256:"), "{text}");
    assert!(
        text.contains(&stranger.key().public().fingerprint()),
        "{text}"
    );
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"still here"), b"still here");
}

#[test]
fn a_known_name_with_the_wrong_key_is_refused_naming_both_fingerprints() {
    let (a, b, _port) = pair();
    // Someone else answers at b's address: a's peers file names b's real key.
    let mitm = Host::new();
    mitm.trust(&a.entry("a", "tool:echo"));
    let port = serve(&mitm, Duration::from_secs(30));
    let err = dial(port, &a.key(), &a.peer("b"), "tool")
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(matches!(err, DialError::WrongKey { .. }), "{text}");
    assert!(text.contains(&b.key().public().fingerprint()), "{text}");
    assert!(text.contains(&mitm.key().public().fingerprint()), "{text}");
}

#[test]
fn a_tree_the_entry_does_not_grant_is_refused() {
    let (a, b, port) = pair();
    let err = dial(port, &a.key(), &a.peer("b"), "dir")
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(text.contains("not granted tree `dir`"), "{text}");
    // An entry with no grant at all: not even `tool`.
    b.trust(&a.entry("a", ""));
    let err = dial(port, &a.key(), &a.peer("b"), "tool")
        .err()
        .expect("refused");
    assert!(err.to_string().contains("grants nothing"), "{err}");
}

#[test]
fn garbage_before_the_handshake_closes_that_connection_only() {
    let (a, _b, port) = pair();
    let mut junk = TcpStream::connect(("127.0.0.1", port)).unwrap();
    junk.write_all(b"\x00\x05hello, this is not noise at all")
        .unwrap();
    let mut buf = [0u8; 64];
    // The server answers nothing a handshake cannot parse: it closes.
    junk.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    // Closed without an answer (end of stream, or a reset for the bytes it never read).
    assert_eq!(junk.read(&mut buf).unwrap_or(0), 0);
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"ok"), b"ok");
}

#[test]
fn garbage_after_the_handshake_ends_the_link_and_the_server_keeps_serving() {
    let (a, _b, port) = pair();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut raw = tcp.try_clone().unwrap();
    let link = wire::dial(tcp, &a.key(), &a.peer("b"), "tool").unwrap();
    // A frame that is not the next encrypted message: the server drops the link.
    raw.write_all(b"\x00\x20not an encrypted frame, just text")
        .unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(raw.read(&mut buf).unwrap(), 0, "the server closed the link");
    drop(link);
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"again"), b"again");
}

#[test]
fn a_connection_that_never_authenticates_is_dropped_at_the_deadline() {
    let (a, b) = (Host::new(), Host::new());
    b.trust(&a.entry("a", "tool:echo"));
    a.trust(&b.entry("b", ""));
    let port = serve(&b, Duration::from_millis(500));
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // Half a length prefix, then silence: the server must not wait for the rest.
    slow.write_all(b"\x00").unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(slow.read(&mut buf).unwrap(), 0, "dropped, not held open");
    // The server goes on serving.
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"served"), b"served");
}

/// A stranger's failed handshakes from the peer's own address (another process on the
/// peer's host): each is still told why, and the peer's next handshake from that address, which
/// proves its key, is served at once.
#[test]
fn failures_from_an_address_do_not_keep_a_known_key_from_it_out() {
    let (a, _b, port) = pair();
    let stranger = Host::new();
    for _ in 0..MAX_FAILURES + 2 {
        let err = dial(port, &stranger.key(), &a.peer("b"), "tool").err();
        assert!(
            matches!(&err, Some(DialError::Refused(why)) if why.contains("unknown key")),
            "{err:?}"
        );
    }
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"mine"), b"mine");
}

/// A TCP connection to the server at `port` on loopback from `ip` (any of 127.0.0.0/8):
/// several "hosts" on one machine.
fn connect_from(ip: Ipv4Addr, port: u16) -> TcpStream {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, socket};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(ip, 0))).unwrap();
    connect(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
    )
    .unwrap();
    TcpStream::from(fd)
}

/// `per_source` silent connections from each of `sources` addresses (127.0.0.10 on), in that
/// order, each address's in turn.
fn silent_connections(port: u16, sources: u8, per_source: usize) -> Vec<Vec<TcpStream>> {
    (0..sources)
        .map(|s| {
            (0..per_source)
                .map(|_| connect_from(Ipv4Addr::new(127, 0, 0, 10 + s), port))
                .collect()
        })
        .collect()
}

/// A connection the server closed: end of stream (or a reset), waiting at most a generous bound
/// so that one held open fails the test instead of hanging it.
fn closed(conn: &mut TcpStream) -> bool {
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut buf = [0u8; 8];
    match conn.read(&mut buf) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// More silent connections than there are pre-auth slots, from six addresses, under a long
/// deadline: each address keeps only its share (its oldest connections beyond it are closed),
/// and a peer from another address is served at once.
#[test]
fn silent_connections_from_several_addresses_do_not_keep_a_peer_out() {
    let (a, b) = (Host::new(), Host::new());
    b.trust(&a.entry("a", "tool:echo"));
    a.trust(&b.entry("b", ""));
    let port = serve(&b, Duration::from_secs(600));
    let per_source = MAX_PENDING / 6 + 2;
    let mut silent = silent_connections(port, 6, per_source);
    assert!(6 * per_source > MAX_PENDING);
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"served"), b"served");
    for conns in &mut silent {
        assert!(
            closed(&mut conns[0]),
            "an address's oldest connection beyond its share was closed"
        );
    }
}

/// The same flood from the peer's own address (another process on its host): the newest
/// connection takes that address's oldest slot, so the peer's handshake is served.
#[test]
fn silent_connections_from_the_peers_own_address_do_not_keep_it_out() {
    let (a, b) = (Host::new(), Host::new());
    b.trust(&a.entry("a", "tool:echo"));
    a.trust(&b.entry("b", ""));
    let port = serve(&b, Duration::from_secs(600));
    let _silent: Vec<TcpStream> = (0..MAX_PENDING + 6)
        .map(|_| connect_from(Ipv4Addr::new(127, 0, 0, 10), port))
        .collect();
    let link = wire::dial(
        connect_from(Ipv4Addr::new(127, 0, 0, 10), port),
        &a.key(),
        &a.peer("b"),
        "tool",
    )
    .unwrap();
    assert_eq!(round_trip(link, b"mine"), b"mine");
}

/// With half the slots or more taken, a new connection gets the short pre-auth deadline, not
/// the configured ten minutes: a silent one is closed.
#[test]
fn under_pressure_a_silent_connection_gets_the_short_deadline() {
    let (_a, b) = (Host::new(), Host::new());
    let port = serve(&b, Duration::from_secs(600));
    // Half the slots, each address holding its share.
    let sources = (MAX_PENDING / 2).div_ceil(MAX_PENDING_PER_SOURCE) as u8;
    let _held = silent_connections(port, sources, MAX_PENDING_PER_SOURCE);
    let mut late = connect_from(Ipv4Addr::new(127, 0, 0, 30), port);
    assert!(closed(&mut late), "held open past {PRESSED_DEADLINE:?}");
}

#[test]
fn a_dropped_link_ends_the_local_side_at_once() {
    let (a, _b, port) = pair();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let raw = tcp.try_clone().unwrap();
    let link = wire::dial(tcp, &a.key(), &a.peer("b"), "tool").unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let relay = std::thread::spawn(move || link.relay(theirs));
    raw.shutdown(Shutdown::Both).unwrap();
    let mut buf = [0u8; 8];
    // The 9P side sees the end (the bridge's client then fails calls in flight).
    assert_eq!((&ours).read(&mut buf).unwrap_or(0), 0);
    relay.join().unwrap().ok();
}

#[test]
fn removing_a_peers_line_cuts_its_live_link() {
    let (a, b, port) = pair();
    live_link_ends_when(&a, port, || b.trust(""));
    let err = dial(port, &a.key(), &a.peer("b"), "tool")
        .err()
        .expect("refused");
    assert!(err.to_string().contains("unknown key"), "{err}");
}

/// A narrowed entry that still grants the tree (one tool of two taken away) cuts the live link
/// too: its backend holds the old grant. The next link is made from the entry as it is now.
#[test]
fn narrowing_a_peers_grant_cuts_its_live_link() {
    let (a, b) = (Host::new(), Host::new());
    b.trust(&a.entry("a", "tool:echo,shell"));
    a.trust(&b.entry("b", ""));
    let port = serve(&b, Duration::from_secs(30));
    live_link_ends_when(&a, port, || b.trust(&a.entry("a", "tool:echo")));
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"after"), b"after");
}

/// A live `tool` link from `a` carries a round trip, then ends (the 9P side sees the end) once
/// `change` rewrote the server's peers file.
fn live_link_ends_when(a: &Host, port: u16, change: impl FnOnce()) {
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    std::thread::spawn(move || link.relay(theirs));
    let mut w = ours.try_clone().unwrap();
    w.write_all(b"before").unwrap();
    let mut got = [0u8; 6];
    (&ours).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"before");
    change();
    // Bounded so that a link left alive fails here instead of hanging the test.
    ours.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    (&ours)
        .read_to_end(&mut rest)
        .expect("the live link was not cut");
    assert!(rest.is_empty(), "{rest:?}");
}

/// A server's refusal reaches the operator's terminal: its control characters are escaped.
#[test]
fn a_servers_refusal_is_escaped_and_a_bad_tree_name_is_refused_unechoed() {
    let (a, _b, port) = pair();
    let err = dial(port, &a.key(), &a.peer("b"), "tool\u{1b}[2J")
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(text.contains("a tree with a bad name"), "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    let refused = DialError::Refused("evil\u{1b}[2Jtext".into()).to_string();
    assert!(!refused.contains('\u{1b}'), "{refused:?}");
}

/// A dialler that completes the handshake with its own key but names another in its hello
/// (a known peer's, to borrow its grant), or sends a hello that is not one: both refused, and
/// the server goes on serving.
#[test]
fn a_hello_naming_a_key_the_dialler_did_not_prove_is_refused() {
    let (a, b, port) = pair();
    let stranger = Host::new();
    let b_public = b.key().public();
    for payload in [
        serde_json::to_vec(&wire::Hello {
            version: wire::VERSION,
            key: a.key().public().to_string(),
            tree: "tool".into(),
        })
        .unwrap(),
        b"{not json".to_vec(),
    ] {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let secret = stranger.key().x25519_secret();
        let mut hs = snow::Builder::new(wire::NOISE_PARAMS.parse().unwrap())
            .prologue(wire::PROLOGUE)
            .unwrap()
            .local_private_key(&secret)
            .unwrap()
            .build_initiator()
            .unwrap();
        let (mut buf, mut frame) = (vec![0u8; 65535], vec![0u8; 65535]);
        let n = hs.write_message(&[], &mut buf).unwrap();
        wire::write_frame(&mut tcp, &buf[..n]).unwrap();
        let msg = wire::read_frame(&mut tcp, &mut frame).unwrap().to_vec();
        hs.read_message(&msg, &mut buf).unwrap();
        assert_eq!(hs.get_remote_static().unwrap(), b_public.x25519());
        let n = hs.write_message(&payload, &mut buf).unwrap();
        wire::write_frame(&mut tcp, &buf[..n]).unwrap();
        // No welcome: the server closes without serving anything.
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut rest = [0u8; 64];
        assert_eq!(tcp.read(&mut rest).unwrap_or(0), 0, "{payload:?}");
    }
    let link = dial(port, &a.key(), &a.peer("b"), "tool").unwrap();
    assert_eq!(round_trip(link, b"fine"), b"fine");
}

/// A server that proves its own key but names the peer's in its identity (a man in the middle
/// claiming to be b): the dialler refuses before it says who it is.
#[test]
fn a_server_naming_a_key_it_did_not_prove_is_refused() {
    let (a, b) = (Host::new(), Host::new());
    a.trust(&b.entry("b", ""));
    let mitm = Host::new();
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let claimed = b.key().public().to_string();
    let secret = mitm.key().x25519_secret();
    let server = std::thread::spawn(move || {
        let (mut tcp, _) = listener.accept().unwrap();
        let mut hs = snow::Builder::new(wire::NOISE_PARAMS.parse().unwrap())
            .prologue(wire::PROLOGUE)
            .unwrap()
            .local_private_key(&secret)
            .unwrap()
            .build_responder()
            .unwrap();
        let (mut buf, mut frame) = (vec![0u8; 65535], vec![0u8; 65535]);
        let msg = wire::read_frame(&mut tcp, &mut frame).unwrap().to_vec();
        hs.read_message(&msg, &mut buf).unwrap();
        let identity = serde_json::to_vec(&wire::Identity {
            version: wire::VERSION,
            key: claimed,
        })
        .unwrap();
        let n = hs.write_message(&identity, &mut buf).unwrap();
        wire::write_frame(&mut tcp, &buf[..n]).unwrap();
        // Whatever comes next: the dialler must have sent no identity of its own.
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        rest
    });
    let err = dial(port, &a.key(), &a.peer("b"), "tool")
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("is not the key it proved"),
        "{err}"
    );
    assert!(server.join().unwrap().is_empty(), "the dialler said more");
}
