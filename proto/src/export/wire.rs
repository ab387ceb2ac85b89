//! The link: a Noise XX handshake between two host keys, then the 9P byte stream in encrypted
//! frames over TCP.
//!
//! Every frame is a 2-byte big-endian length and a Noise message (at most 65535 bytes, the
//! Noise limit). Handshake, `Noise_XX_25519_ChaChaPoly_BLAKE2s`, prologue `warren-exportfs 1`:
//!
//! 1. dialler → `e`
//! 2. server → `e, ee, s, es`, payload: the server's [`Identity`] (its Ed25519 key)
//! 3. dialler → `s, se`, payload: a [`Hello`] (its Ed25519 key and the tree it asks for) — sent
//!    only once the server's key matched the dialler's peers entry, so a stranger never learns
//!    who dials
//! 4. server → the first transport frame, a [`Welcome`]: `ok`, or why not (then it closes)
//!
//! Each side checks that the Ed25519 key in the other's payload is the one whose X25519 image
//! the handshake proved (its static), so a key in a peers file names exactly one handshake key.
//! After the welcome, each direction's frames carry the 9P stream in chunks; a frame that does
//! not decrypt ends the link.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use snow::{HandshakeState, StatelessTransportState};

use super::keys::{HostKey, PublicKey};
use super::peers::Peer;

pub const NOISE_PARAMS: &str = "Noise_XX_25519_ChaChaPoly_BLAKE2s";
pub const PROLOGUE: &[u8] = b"warren-exportfs 1";
/// The protocol version in [`Identity`] and [`Hello`].
pub const VERSION: u32 = 1;
const MAX_FRAME: usize = 65535;
const TAG: usize = 16;
/// The most plaintext one frame carries.
const MAX_CHUNK: usize = MAX_FRAME - TAG;

/// The server's handshake payload.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub version: u32,
    pub key: String,
}

/// The dialler's handshake payload.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub version: u32,
    pub key: String,
    pub tree: String,
}

/// The server's first transport frame.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Welcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn proto(m: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.to_string())
}

pub fn write_frame(w: &mut impl Write, data: &[u8]) -> io::Result<()> {
    let len = u16::try_from(data.len()).map_err(|_| proto("frame over 65535 bytes"))?;
    let mut out = Vec::with_capacity(2 + data.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
    w.write_all(&out)
}

/// Reads one frame into `buf`; end of stream between frames is `UnexpectedEof`.
pub fn read_frame<'a>(r: &mut impl Read, buf: &'a mut [u8]) -> io::Result<&'a [u8]> {
    let mut len = [0u8; 2];
    r.read_exact(&mut len)?;
    let len = u16::from_be_bytes(len) as usize;
    r.read_exact(&mut buf[..len])?;
    Ok(&buf[..len])
}

fn handshake(key: &HostKey, initiator: bool) -> io::Result<HandshakeState> {
    let secret = key.x25519_secret();
    let params = NOISE_PARAMS.parse().map_err(proto)?;
    let b = snow::Builder::new(params)
        .prologue(PROLOGUE)
        .and_then(|b| b.local_private_key(&secret))
        .map_err(proto)?;
    if initiator {
        b.build_initiator()
    } else {
        b.build_responder()
    }
    .map_err(proto)
}

/// The Ed25519 key in a payload, checked against the static key the handshake proved.
fn proven_key(hs: &HandshakeState, claimed: &str) -> io::Result<PublicKey> {
    let key = PublicKey::parse(claimed).map_err(proto)?;
    match hs.get_remote_static() {
        Some(s) if s == key.x25519() => Ok(key),
        _ => Err(proto(format!(
            "the key the peer names ({}) is not the key it proved in the handshake",
            key.fingerprint()
        ))),
    }
}

/// An authenticated, encrypted link, ready to relay.
pub struct Link {
    tcp: TcpStream,
    transport: StatelessTransportState,
    /// The next nonce of each direction.
    send_nonce: u64,
    recv_nonce: u64,
}

impl Link {
    fn send(&mut self, plain: &[u8]) -> io::Result<()> {
        let mut buf = vec![0u8; plain.len() + TAG];
        let n = self
            .transport
            .write_message(self.send_nonce, plain, &mut buf)
            .map_err(proto)?;
        self.send_nonce += 1;
        write_frame(&mut self.tcp, &buf[..n])
    }

    fn recv(&mut self) -> io::Result<Vec<u8>> {
        let mut frame = vec![0u8; MAX_FRAME];
        let ct = read_frame(&mut self.tcp, &mut frame)?;
        let mut plain = vec![0u8; ct.len()];
        let n = self
            .transport
            .read_message(self.recv_nonce, ct, &mut plain)
            .map_err(|_| proto("a frame that does not decrypt"))?;
        self.recv_nonce += 1;
        plain.truncate(n);
        Ok(plain)
    }

    /// The link's TCP socket (to shut it down from elsewhere).
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Relays the 9P stream between this link and `plain` until either side ends, on two
    /// threads; then shuts both down, so a call waiting on the other side fails at once.
    pub fn relay(self, plain: UnixStream) -> io::Result<()> {
        let Link {
            tcp,
            transport,
            send_nonce,
            recv_nonce,
        } = self;
        let transport = Arc::new(transport);
        let (tcp_in, plain_out) = (tcp.try_clone()?, plain.try_clone()?);
        let (t_in, p_in) = (transport.clone(), (tcp.try_clone()?, plain.try_clone()?));
        let inbound = std::thread::Builder::new()
            .name("exportfs-in".into())
            .spawn(move || {
                let r = pump_in(tcp_in, &t_in, recv_nonce, plain_out);
                let _ = p_in.0.shutdown(Shutdown::Both);
                let _ = p_in.1.shutdown(Shutdown::Both);
                r
            })?;
        let out = pump_out(&plain, &transport, send_nonce, &tcp);
        let _ = tcp.shutdown(Shutdown::Both);
        let _ = plain.shutdown(Shutdown::Both);
        let inn = inbound
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("relay thread panicked")));
        match (out, inn) {
            (Err(e), _) | (_, Err(e)) if e.kind() != io::ErrorKind::UnexpectedEof => Err(e),
            _ => Ok(()),
        }
    }
}

fn pump_in(
    mut tcp: TcpStream,
    t: &StatelessTransportState,
    mut nonce: u64,
    mut plain: UnixStream,
) -> io::Result<()> {
    let mut frame = vec![0u8; MAX_FRAME];
    let mut out = vec![0u8; MAX_FRAME];
    loop {
        let ct = read_frame(&mut tcp, &mut frame)?;
        let n = t
            .read_message(nonce, ct, &mut out)
            .map_err(|_| proto("a frame that does not decrypt"))?;
        nonce += 1;
        plain.write_all(&out[..n])?;
    }
}

fn pump_out(
    mut plain: &UnixStream,
    t: &StatelessTransportState,
    mut nonce: u64,
    mut tcp: &TcpStream,
) -> io::Result<()> {
    let mut chunk = vec![0u8; MAX_CHUNK];
    let mut frame = vec![0u8; 2 + MAX_FRAME];
    loop {
        let n = plain.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        let len = t
            .write_message(nonce, &chunk[..n], &mut frame[2..])
            .map_err(proto)?;
        nonce += 1;
        frame[..2].copy_from_slice(&(len as u16).to_be_bytes());
        tcp.write_all(&frame[..2 + len])?;
    }
}

/// Why a dial failed.
#[derive(Debug)]
pub enum DialError {
    /// The server's key is not the one the peers entry names (a different host, or a
    /// man in the middle).
    WrongKey {
        expected: String,
        presented: String,
    },
    /// The server refused (its reason).
    Refused(String),
    Io(io::Error),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::WrongKey {
                expected,
                presented,
            } => write!(
                f,
                "the server's key is not the peer's: the peers file names {expected}, the \
                 server presented {presented} (a different host, or someone in between)"
            ),
            // The server's words, escaped: a hostile server must not write to the operator's
            // terminal.
            DialError::Refused(why) => write!(
                f,
                "the server refused: {}",
                warren_daemon::escape::escape(why)
            ),
            DialError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DialError {}

impl From<io::Error> for DialError {
    fn from(e: io::Error) -> DialError {
        DialError::Io(e)
    }
}

/// How long the dialler waits for each step of the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A link whose peer stops acknowledging (or answering keepalives) for this long is dropped,
/// so calls waiting on it fail instead of hanging.
pub const LINK_TIMEOUT: Duration = Duration::from_secs(30);

/// Keepalives and an unacknowledged-data limit: a peer that vanishes without a FIN or RST (a
/// cable pulled, a host frozen) ends the link within [`LINK_TIMEOUT`].
fn keep_alive(tcp: &TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let _ = tcp.set_nodelay(true);
    let _ = setsockopt(tcp, sockopt::KeepAlive, &true);
    let _ = setsockopt(tcp, sockopt::TcpKeepIdle, &10);
    let _ = setsockopt(tcp, sockopt::TcpKeepInterval, &5);
    let _ = setsockopt(tcp, sockopt::TcpKeepCount, &4);
    let _ = setsockopt(
        tcp,
        sockopt::TcpUserTimeout,
        &(LINK_TIMEOUT.as_millis() as u32),
    );
}

/// Dials side: runs the handshake on `tcp` as `key`, requires the server to be `peer`, and asks
/// for `tree`.
pub fn dial(tcp: TcpStream, key: &HostKey, peer: &Peer, tree: &str) -> Result<Link, DialError> {
    let during = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => io::Error::new(
            e.kind(),
            "the server closed the connection during the handshake (not an exportfs, or it \
             dropped this connection before it authenticated: its pre-auth deadline passed, or \
             newer connections from this address took its slot)",
        ),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the server did not answer the handshake within {HANDSHAKE_TIMEOUT:?}"),
        ),
        _ => e,
    };
    keep_alive(&tcp);
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut tcp = tcp;
    let mut hs = handshake(key, true)?;
    let mut buf = vec![0u8; MAX_FRAME];
    let mut frame = vec![0u8; MAX_FRAME];
    let n = hs.write_message(&[], &mut buf).map_err(proto)?;
    write_frame(&mut tcp, &buf[..n]).map_err(during)?;
    let msg = read_frame(&mut tcp, &mut frame).map_err(during)?;
    let n = hs
        .read_message(msg, &mut buf)
        .map_err(|e| proto(format!("handshake: {e}")))?;
    let identity: Identity =
        serde_json::from_slice(&buf[..n]).map_err(|e| proto(format!("server identity: {e}")))?;
    let presented = proven_key(&hs, &identity.key)?;
    if presented != peer.key {
        return Err(DialError::WrongKey {
            expected: peer.key.fingerprint(),
            presented: presented.fingerprint(),
        });
    }
    let hello = serde_json::to_vec(&Hello {
        version: VERSION,
        key: key.public().to_string(),
        tree: tree.to_owned(),
    })
    .map_err(proto)?;
    let n = hs.write_message(&hello, &mut buf).map_err(proto)?;
    write_frame(&mut tcp, &buf[..n]).map_err(during)?;
    let transport = hs.into_stateless_transport_mode().map_err(proto)?;
    let mut link = Link {
        tcp,
        transport,
        send_nonce: 0,
        recv_nonce: 0,
    };
    let welcome: Welcome = serde_json::from_slice(&link.recv().map_err(during)?)
        .map_err(|e| proto(format!("server welcome: {e}")))?;
    match welcome.error {
        Some(why) => Err(DialError::Refused(why)),
        None => {
            link.tcp.set_read_timeout(None)?;
            link.tcp.set_write_timeout(None)?;
            Ok(link)
        }
    }
}

/// The server's side up to the dialler's [`Hello`]: who it is (its key, proven) and what it
/// asks for. Then [`Accepted::welcome`] or [`Accepted::refuse`].
pub struct Accepted {
    pub key: PublicKey,
    pub tree: String,
    link: Link,
}

pub fn accept(tcp: TcpStream, key: &HostKey) -> io::Result<Accepted> {
    keep_alive(&tcp);
    let mut tcp = tcp;
    let mut hs = handshake(key, false)?;
    let mut buf = vec![0u8; MAX_FRAME];
    let mut frame = vec![0u8; MAX_FRAME];
    let msg = read_frame(&mut tcp, &mut frame)?;
    hs.read_message(msg, &mut buf)
        .map_err(|e| proto(format!("handshake message 1: {e}")))?;
    let identity = serde_json::to_vec(&Identity {
        version: VERSION,
        key: key.public().to_string(),
    })
    .map_err(proto)?;
    let n = hs.write_message(&identity, &mut buf).map_err(proto)?;
    write_frame(&mut tcp, &buf[..n])?;
    let msg = read_frame(&mut tcp, &mut frame)?;
    let n = hs
        .read_message(msg, &mut buf)
        .map_err(|e| proto(format!("handshake message 3: {e}")))?;
    let hello: Hello =
        serde_json::from_slice(&buf[..n]).map_err(|e| proto(format!("hello: {e}")))?;
    if hello.version != VERSION {
        return Err(proto(format!("protocol version {}", hello.version)));
    }
    let peer_key = proven_key(&hs, &hello.key)?;
    let transport = hs.into_stateless_transport_mode().map_err(proto)?;
    Ok(Accepted {
        key: peer_key,
        tree: hello.tree,
        link: Link {
            tcp,
            transport,
            send_nonce: 0,
            recv_nonce: 0,
        },
    })
}

impl Accepted {
    pub fn welcome(mut self) -> io::Result<Link> {
        self.link
            .send(&serde_json::to_vec(&Welcome { error: None }).map_err(proto)?)?;
        Ok(self.link)
    }

    /// Tells the dialler why, and closes.
    pub fn refuse(mut self, why: &str) {
        if let Ok(msg) = serde_json::to_vec(&Welcome {
            error: Some(why.to_owned()),
        }) {
            let _ = self.link.send(&msg);
        }
        let _ = self.link.tcp.shutdown(Shutdown::Both);
    }

    /// A second handle on the TCP socket (the server's deadline shuts it down).
    pub fn tcp(&self) -> &TcpStream {
        &self.link.tcp
    }
}
