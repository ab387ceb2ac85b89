//! A proxy session: one policy, one decision hook and its cache of allows, one records sink,
//! serving any number of client connections, each of which is one proxied TCP connection.
//!
//! A client connection speaks SOCKS5 (its first byte is 5) or HTTP/1.x: `CONNECT host:port`
//! (a tunnel) or a request with an absolute `http://` URI (forwarded as one request on a
//! connection of its own, `Connection: close`). The stream may be anything that reads and
//! writes: a TCP or Unix connection, or one half of a socketpair handed over by nsd.
//!
//! Why one file: the two client protocols (SOCKS5, HTTP) share one decision path (`Session`), one
//! refusal type and one byte-counting tunnel; each protocol is one function here.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fast_socks5::server::Socks5ServerProtocol;
use fast_socks5::util::target_addr::TargetAddr;
use fast_socks5::{ReplyError, Socks5Command};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::decide::{AllowListed, Decide, Decision};
use crate::policy::{
    Host, Listed, Policy, canonical, own_addresses, split_authority, unpinned_refusal,
};
use crate::record::{Outcome, Record, Records};
use crate::resolve::Resolver;

/// Bounds on one client connection before its tunnel is up.
#[derive(Debug, Clone)]
pub struct Limits {
    /// An HTTP request head larger than this is refused (431).
    pub max_head_bytes: usize,
    /// Time to send the request head or the SOCKS handshake.
    pub handshake_timeout: Duration,
    pub resolve_timeout: Duration,
    /// Per address tried.
    pub connect_timeout: Duration,
    /// Client connections served at once by [`Session::serve_tcp`] and
    /// [`Session::serve_unix`]; the next accept waits for one to end.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_head_bytes: 16 * 1024,
            handshake_timeout: Duration::from_secs(30),
            resolve_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_connections: 512,
        }
    }
}

/// Tunnel copy buffers, each way. tokio's default of 8 KiB costs throughput on bulk transfers;
/// 256 KiB measured 0.76x direct against 0.51-0.58x for 64 KiB (scripts/bench-netproxy), at
/// 512 KiB per open tunnel.
const COPY_BUF: usize = 256 * 1024;

/// Set once the hook allowed a destination; its one ask's waiters wait on it.
type Allowed = Arc<tokio::sync::OnceCell<()>>;

pub struct Session {
    pub name: String,
    pub policy: Policy,
    pub resolver: Resolver,
    pub records: Records,
    pub limits: Limits,
    decide: Arc<dyn Decide>,
    /// Per `(host, port)`: set once the hook allowed it in this session. Its first uses wait on
    /// one ask (concurrent connections to a new destination ask the hook once, not each).
    allowed: Mutex<HashMap<(Host, u16), Allowed>>,
    slots: Arc<Semaphore>,
}

/// Why no connection was made.
#[derive(Debug)]
struct Refusal {
    outcome: Outcome,
    reason: String,
}

impl Refusal {
    fn refused(reason: String) -> Refusal {
        Refusal {
            outcome: Outcome::Refused,
            reason,
        }
    }
    fn unreachable(reason: String) -> Refusal {
        Refusal {
            outcome: Outcome::Unreachable,
            reason,
        }
    }
    fn bad(reason: impl Into<String>) -> Refusal {
        Refusal {
            outcome: Outcome::BadRequest,
            reason: reason.into(),
        }
    }
}

impl Session {
    /// A session with the default hook ([`AllowListed`]) and limits.
    pub fn new(
        name: impl Into<String>,
        policy: Policy,
        resolver: Resolver,
        records: Records,
    ) -> Session {
        Session::with_decide(name, policy, resolver, records, Arc::new(AllowListed))
    }

    pub fn with_decide(
        name: impl Into<String>,
        policy: Policy,
        resolver: Resolver,
        records: Records,
        decide: Arc<dyn Decide>,
    ) -> Session {
        let limits = Limits::default();
        Session {
            name: name.into(),
            policy,
            resolver,
            records,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            decide,
            allowed: Mutex::new(HashMap::new()),
        }
    }

    pub fn with_limits(mut self, limits: Limits) -> Session {
        self.slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
        self.limits = limits;
        self
    }

    /// Serves every connection `listener` accepts, until it fails for good.
    pub async fn serve_tcp(self: Arc<Self>, listener: tokio::net::TcpListener) {
        loop {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let session = self.clone();
                    tokio::spawn(async move {
                        serve_connection(stream, session).await;
                        drop(slot);
                    });
                }
                Err(e) => accept_failed(e).await,
            }
        }
    }

    pub async fn serve_unix(self: Arc<Self>, listener: tokio::net::UnixListener) {
        loop {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((stream, _)) => {
                    let session = self.clone();
                    tokio::spawn(async move {
                        serve_connection(stream, session).await;
                        drop(slot);
                    });
                }
                Err(e) => accept_failed(e).await,
            }
        }
    }

    /// Checks `host:port` against the list, the hook (once per session), and the address rules,
    /// then connects to the first address that answers. Never connects to an address it has not
    /// checked, and resolves once.
    async fn open(&self, host: &Host, port: u16) -> Result<(TcpStream, SocketAddr), Refusal> {
        let Some(listed) = self.policy.lookup(host, port) else {
            return Err(Refusal::refused(format!(
                "{host}:{port} is not on this session's list"
            )));
        };
        let allowed = self
            .allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((host.clone(), port))
            .or_default()
            .clone();
        // A deny leaves the cell unset: the next use asks again (the gate remembers its deny).
        allowed
            .get_or_try_init(|| async {
                match self.decide.decide(&host.to_string(), port).await {
                    Decision::Allow => Ok(()),
                    Decision::Deny(reason) => {
                        Err(Refusal::refused(format!("{host}:{port} denied: {reason}")))
                    }
                }
            })
            .await?;
        let addrs = match (&listed, host) {
            (Listed::Ip, Host::Ip(ip)) => vec![*ip],
            (Listed::Name { pin }, Host::Name(name)) => {
                let addrs =
                    tokio::time::timeout(self.limits.resolve_timeout, self.resolver.resolve(name))
                        .await
                        .map_err(|_| Refusal::unreachable(format!("resolving {name} timed out")))?
                        .map_err(|e| Refusal::unreachable(format!("cannot resolve {name}: {e}")))?;
                check_addresses(name, pin, &addrs, &own_addresses()).map_err(Refusal::refused)?;
                addrs
            }
            _ => unreachable!("the policy lists a name as a name and an IP as an IP"),
        };
        let mut last = None;
        let mut all_refused = true;
        for ip in addrs {
            let to = SocketAddr::new(ip, port);
            match tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(to)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, to));
                }
                Ok(Err(e)) => {
                    all_refused &= e.kind() == io::ErrorKind::ConnectionRefused;
                    last = Some(format!("connecting to {to}: {e}"));
                }
                Err(_) => {
                    all_refused = false;
                    last = Some(format!("connecting to {to} timed out"));
                }
            }
        }
        Err(match last {
            Some(reason) if all_refused => Refusal {
                outcome: Outcome::ConnectionRefused,
                reason,
            },
            Some(reason) => Refusal::unreachable(reason),
            None => Refusal::unreachable("no address".into()),
        })
    }
}

async fn accept_failed(e: io::Error) {
    // EMFILE and the like: wait a moment rather than spin.
    tracing::error!("accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The address rules for a name: with a pin, every address must be pinned; without one, every
/// address must be public and none may be this host's. Any address failing refuses the whole
/// name (a mix of public and private answers is how rebinding is attempted).
fn check_addresses(
    name: &str,
    pin: &[IpAddr],
    addrs: &[IpAddr],
    own: &HashSet<IpAddr>,
) -> Result<(), String> {
    for &a in addrs {
        let c = canonical(a);
        if !pin.is_empty() {
            if !pin.iter().any(|p| canonical(*p) == c) {
                return Err(format!(
                    "{name} resolved to {a}, which is not among the addresses its pattern pins"
                ));
            }
            continue;
        }
        if let Some(why) = unpinned_refusal(a, own) {
            return Err(format!(
                "{name} resolved to {a}, {why} (name it in the pattern to allow it)"
            ));
        }
    }
    Ok(())
}

/// One client connection, served to its end; its record is written when it ends.
pub async fn serve_connection<S>(stream: S, session: Arc<Session>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let start = Instant::now();
    let start_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut rec = Record {
        start_ms,
        duration_ms: 0,
        session: session.name.clone(),
        protocol: None,
        host: None,
        port: None,
        address: None,
        bytes_client_to_server: 0,
        bytes_server_to_client: 0,
        outcome: Outcome::Closed,
        reason: None,
    };
    let slot = match session.records.reserve() {
        Ok(slot) => slot,
        Err(why) => {
            // Nothing is read or answered: the client sees its connection closed.
            tracing::error!(session = %session.name, "a connection refused: {why}");
            rec.outcome = Outcome::Refused;
            rec.reason = Some(why);
            session.records.write(&rec);
            return;
        }
    };
    let mut client = BufReader::with_capacity(session.limits.max_head_bytes, stream);
    // The first byte tells SOCKS5 (5) from HTTP; it stays in the buffer for the parser.
    let first = async {
        use tokio::io::AsyncBufReadExt;
        client.fill_buf().await.map(|b| b.first().copied())
    };
    let result = match tokio::time::timeout(session.limits.handshake_timeout, first).await {
        Err(_) => Err(Refusal::bad("no request before the handshake timeout")),
        Ok(Err(e)) => Err(Refusal::bad(format!("reading the request: {e}"))),
        Ok(Ok(None)) => Err(Refusal::bad("closed before a request")),
        Ok(Ok(Some(5))) => {
            rec.protocol = Some("socks5".into());
            socks5(client, &session, &mut rec).await
        }
        Ok(Ok(Some(_))) => http(client, &session, &mut rec).await,
    };
    if let Err(r) = result {
        let host = rec.host.as_deref().unwrap_or("-");
        let port = rec.port.unwrap_or(0);
        if r.outcome == Outcome::Refused {
            tracing::warn!(session = %session.name, host, port, "refused: {}", r.reason);
        } else {
            tracing::info!(session = %session.name, host, port, "{:?}: {}", r.outcome, r.reason);
        }
        rec.outcome = r.outcome;
        rec.reason = Some(r.reason);
    }
    rec.duration_ms = start.elapsed().as_millis() as u64;
    slot.write(&rec);
}

async fn socks5<S>(client: BufReader<S>, session: &Session, rec: &mut Record) -> Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let handshake = async {
        let proto = Socks5ServerProtocol::accept_no_auth(client).await?;
        proto.read_command().await
    };
    let (proto, cmd, target) = tokio::time::timeout(session.limits.handshake_timeout, handshake)
        .await
        .map_err(|_| Refusal::bad("SOCKS5 handshake timed out"))?
        .map_err(|e| Refusal::bad(format!("SOCKS5 handshake: {e}")))?;
    let (host, port) = match &target {
        TargetAddr::Ip(sa) => (Ok(Host::Ip(canonical(sa.ip()))), sa.port()),
        TargetAddr::Domain(d, port) => (Host::parse(d), *port),
    };
    rec.port = Some(port);
    rec.host = Some(match &host {
        Ok(h) => h.to_string(),
        Err(_) => target.to_string(),
    });
    let command = match cmd {
        Socks5Command::TCPConnect => None,
        Socks5Command::TCPBind => Some("BIND"),
        Socks5Command::UDPAssociate => Some("UDP ASSOCIATE"),
    };
    if let Some(command) = command {
        let _ = proto.reply_error(&ReplyError::CommandNotSupported).await;
        return Err(Refusal::refused(format!(
            "SOCKS5 {command} is not supported (CONNECT only)"
        )));
    }
    let host = match host {
        Ok(h) => h,
        Err(e) => {
            let _ = proto.reply_error(&ReplyError::ConnectionNotAllowed).await;
            return Err(Refusal::refused(e.0));
        }
    };
    let (server, to) = match session.open(&host, port).await {
        Ok(c) => c,
        Err(r) => {
            let code = match r.outcome {
                Outcome::Refused => ReplyError::ConnectionNotAllowed,
                Outcome::ConnectionRefused => ReplyError::ConnectionRefused,
                _ => ReplyError::HostUnreachable,
            };
            let _ = proto.reply_error(&code).await;
            return Err(r);
        }
    };
    rec.address = Some(to.to_string());
    // The bound address is not the client's business (it would tell a namespace the host's
    // addresses); clients ignore it for CONNECT.
    let client = proto
        .reply_success(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
        .await
        .map_err(|e| Refusal::bad(format!("SOCKS5 reply: {e}")))?;
    tunnel(client, server, &[], rec).await
}

/// An HTTP request head: CONNECT, or an absolute-URI request to forward.
async fn http<S>(
    mut client: BufReader<S>,
    session: &Session,
    rec: &mut Record,
) -> Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut head = Vec::with_capacity(1024);
    let read_head = async {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&head) {
                Ok(httparse::Status::Complete(n)) => return Ok(n),
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Err((400, format!("not an HTTP request: {e}"))),
            }
            if head.len() >= session.limits.max_head_bytes {
                return Err((431, "request head too large".into()));
            }
            let mut chunk = [0u8; 4096];
            let want = chunk.len().min(session.limits.max_head_bytes - head.len());
            match client.read(&mut chunk[..want]).await {
                Ok(0) => return Err((400, "closed inside the request head".into())),
                Ok(n) => head.extend_from_slice(&chunk[..n]),
                Err(e) => return Err((400, format!("reading the request: {e}"))),
            }
        }
    };
    let head_len = match tokio::time::timeout(session.limits.handshake_timeout, read_head).await {
        Ok(Ok(n)) => n,
        Ok(Err((status, why))) => {
            respond(&mut client, status, &why).await;
            return Err(Refusal::bad(why));
        }
        Err(_) => {
            respond(&mut client, 408, "no request head before the timeout").await;
            return Err(Refusal::bad("request head timed out"));
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(&head[..head_len]).expect("parsed once already");
    let method = req.method.unwrap_or_default().to_owned();
    let target = req.path.unwrap_or_default().to_owned();
    let early = head[head_len..].to_vec();

    let request = if method == "CONNECT" {
        rec.protocol = Some("http-connect".into());
        parse_connect(&target)
    } else {
        rec.protocol = Some("http".into());
        parse_absolute(&target, &method, req.version.unwrap_or(1), req.headers)
    };
    let (host, port, forward) = match request {
        Ok(r) => r,
        Err(why) => {
            respond(&mut client, 400, &why).await;
            return Err(Refusal::bad(why));
        }
    };
    rec.host = Some(host.to_string());
    rec.port = Some(port);
    let (mut server, to) = match session.open(&host, port).await {
        Ok(c) => c,
        Err(r) => {
            let status = if r.outcome == Outcome::Refused {
                403
            } else {
                502
            };
            respond(&mut client, status, &r.reason).await;
            return Err(r);
        }
    };
    rec.address = Some(to.to_string());
    match forward {
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .map_err(|e| Refusal::bad(format!("writing to the client: {e}")))?;
            tunnel(client, server, &early, rec).await
        }
        Some(head) => {
            let mut counted = Counted::new(&mut server);
            let wrote = counted.write_all(&head).await;
            rec.bytes_client_to_server += counted.written;
            if let Err(e) = wrote {
                return Err(Refusal {
                    outcome: Outcome::Error,
                    reason: format!("writing to {to}: {e}"),
                });
            }
            tunnel(client, server, &early, rec).await
        }
    }
}

type Parsed = (Host, u16, Option<Vec<u8>>);

/// `CONNECT host:port`: the port is required.
fn parse_connect(target: &str) -> Result<Parsed, String> {
    let (host, port) =
        split_authority(target).ok_or_else(|| format!("bad CONNECT target `{target}`"))?;
    let port = port.ok_or_else(|| format!("CONNECT target `{target}` has no port"))?;
    let host = Host::parse(host).map_err(|e| e.0)?;
    Ok((host, port, None))
}

/// `METHOD http://host[:port]/path HTTP/1.x`: the request as the origin server gets it
/// (origin-form target, `Host` from the URI, hop-by-hop headers dropped, `Connection: close`).
fn parse_absolute(
    target: &str,
    method: &str,
    version: u8,
    headers: &[httparse::Header<'_>],
) -> Result<Parsed, String> {
    let rest = match target.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &target[7..],
        _ if target.len() > 8 && target[..8].eq_ignore_ascii_case("https://") => {
            return Err("an https:// URL goes through CONNECT".into());
        }
        _ => return Err(format!("`{target}` is not an absolute http:// URL")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err("user info in a proxied URL is refused".into());
    }
    let (host, port) =
        split_authority(authority).ok_or_else(|| format!("bad authority `{authority}`"))?;
    let host = Host::parse(host).map_err(|e| e.0)?;
    let port = port.unwrap_or(80);
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('/') => p.split('#').next().unwrap_or("/").to_owned(),
        p => format!("/{}", p.split('#').next().unwrap_or("")),
    };
    let mut out = format!("{method} {path} HTTP/1.{version}\r\n").into_bytes();
    let authority = if port == 80 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    const HOP: [&str; 7] = [
        "host",
        "connection",
        "proxy-connection",
        "proxy-authorization",
        "keep-alive",
        "te",
        "upgrade",
    ];
    for h in headers {
        if HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok((host, port, Some(out)))
}

/// A one-line plain-text answer, then the connection is closed.
async fn respond<S: AsyncRead + AsyncWrite + Unpin>(client: &mut S, status: u16, reason: &str) {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    // The reason is the proxy's own text, but it quotes what the client sent: one line only.
    let line: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let body = format!("{line}\n");
    let msg = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(msg.as_bytes()).await;
    let _ = client.shutdown().await;
    // Closing with unread input would reset the connection, and a reset can reach the client
    // before it has read the answer: read what it still sends, for a bounded time and amount.
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left = 256 * 1024usize;
        while left > 0 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Copies both ways until both sides have closed, counting what crosses the destination.
async fn tunnel<C>(
    mut client: C,
    mut server: TcpStream,
    early: &[u8],
    rec: &mut Record,
) -> Result<(), Refusal>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let mut counted = Counted::new(&mut server);
    let mut result = counted.write_all(early).await;
    if result.is_ok() {
        result =
            tokio::io::copy_bidirectional_with_sizes(&mut client, &mut counted, COPY_BUF, COPY_BUF)
                .await
                .map(|_| ());
    }
    rec.bytes_client_to_server += counted.written;
    rec.bytes_server_to_client += counted.read;
    result.map_err(|e| Refusal {
        outcome: Outcome::Error,
        reason: format!("tunnel: {e}"),
    })
}

/// A stream that counts the bytes read from and written to it.
struct Counted<'a, S> {
    inner: &'a mut S,
    read: u64,
    written: u64,
}

impl<'a, S> Counted<'a, S> {
    fn new(inner: &'a mut S) -> Self {
        Counted {
            inner,
            read: 0,
            written: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut *this.inner).poll_read(cx, buf);
        this.read += (buf.filled().len() - before) as u64;
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut *this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.written += n as u64;
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebinding_answers_are_refused_and_pins_are_exact() {
        let own: HashSet<IpAddr> = ["198.51.100.1".parse().unwrap()].into();
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        // Unpinned: every answer must be public, and not this host's.
        assert!(check_addresses("a.test", &[], &[ip("1.1.1.1")], &own).is_ok());
        let mixed = check_addresses("a.test", &[], &[ip("1.1.1.1"), ip("127.0.0.1")], &own);
        assert!(mixed.unwrap_err().contains("loopback"));
        assert!(check_addresses("a.test", &[], &[ip("::ffff:10.0.0.1")], &own).is_err());
        let own_public: HashSet<IpAddr> = [ip("1.1.1.1")].into();
        assert!(
            check_addresses("a.test", &[], &[ip("1.1.1.1")], &own_public)
                .unwrap_err()
                .contains("this host")
        );
        // Pinned: exactly the pin, private or not.
        let pin = [ip("127.0.0.1")];
        assert!(check_addresses("a.test", &pin, &[ip("127.0.0.1")], &own).is_ok());
        assert!(check_addresses("a.test", &pin, &[ip("::ffff:127.0.0.1")], &own).is_ok());
        assert!(check_addresses("a.test", &pin, &[ip("127.0.0.2")], &own).is_err());
        assert!(check_addresses("a.test", &pin, &[ip("1.1.1.1")], &own).is_err());
    }

    #[test]
    fn an_absolute_request_is_rewritten_for_the_origin() {
        let headers = [
            httparse::Header {
                name: "Host",
                value: b"evil.test",
            },
            httparse::Header {
                name: "Proxy-Authorization",
                value: b"Basic x",
            },
            httparse::Header {
                name: "Accept",
                value: b"*/*",
            },
        ];
        let (host, port, out) =
            parse_absolute("http://API.test:8080/a?b#frag", "GET", 1, &headers).unwrap();
        assert_eq!(host, Host::Name("api.test".into()));
        assert_eq!(port, 8080);
        assert_eq!(
            String::from_utf8(out.unwrap()).unwrap(),
            "GET /a?b HTTP/1.1\r\nHost: api.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let (_, port, out) = parse_absolute("http://api.test", "GET", 0, &[]).unwrap();
        assert_eq!(port, 80);
        assert!(
            String::from_utf8(out.unwrap())
                .unwrap()
                .starts_with("GET / HTTP/1.0\r\nHost: api.test\r\n")
        );
        for bad in [
            "/path",
            "https://api.test/",
            "http://u@api.test/",
            "http://a b/",
            "http://api.test:x/",
        ] {
            assert!(parse_absolute(bad, "GET", 1, &[]).is_err(), "{bad}");
        }
        assert!(parse_connect("api.test").is_err());
        assert_eq!(parse_connect("[::1]:443").unwrap().1, 443);
    }
}
