//! Streamable HTTP, served from inside the namespace on a listening socket `warren mcp serve`
//! made outside and handed in as stdin (a TCP socket keeps the network namespace it was made
//! in; the namespace itself may have no network). Every request must carry the listener's
//! bearer token (minted here at start, printed once on stderr); `Host` and `Origin` are checked by `rmcp` against loopback names (plus the
//! operator's remote names); sessions (`Mcp-Session-Id`) are `rmcp`'s. A connection that has not
//! shown the token within [`PROOF_DEADLINE`] is closed, and such connections are capped per peer
//! and in all ([`Unproven`]), so a stranger who can reach the port cannot use up the server's
//! descriptors; no accept error ends the server.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockaddrLike, SockaddrStorage, getsockname};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::sync::Notify;

use crate::lines::MAX_MESSAGE;

/// A fresh bearer token for this listener: 32 random bytes, hex.
fn mint_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("getrandom: {e}"))?;
    Ok(hex::encode(bytes))
}

/// Hosts a request's `Host` may name, and origins its `Origin` may be (a request with no
/// `Origin`, i.e. not from a browser, passes).
fn config(remote_hosts: &[String]) -> StreamableHttpServerConfig {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "[::1]"]
        .into_iter()
        .map(String::from)
        .collect();
    hosts.extend(remote_hosts.iter().cloned());
    let mut origins: Vec<String> = Vec::new();
    for host in &hosts {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        origins.push(format!("http://{host}:*"));
        origins.push(format!("https://{host}:*"));
    }
    StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
}

/// Whether `request` carries `Authorization: Bearer <token>` (compared in constant time).
fn authorized(request: &Request<Incoming>, token: &[u8]) -> bool {
    let Some(value) = request.headers().get(hyper::header::AUTHORIZATION) else {
        return false;
    };
    let Some(given) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    bool::from(subtle::ConstantTimeEq::ct_eq(given, token))
}

fn unauthorized() -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(
            b"a bearer token is required: the one `warren mcp serve` printed for this listener\n",
        ))
        .boxed(),
    );
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    response
}

/// A request's `Content-Length`, if it has a valid one.
fn declared_length(request: &Request<Incoming>) -> Option<u64> {
    request
        .headers()
        .get(hyper::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// 413, with a JSON-RPC error saying why (the request's id is not read: it is in the body).
fn too_large() -> Response<BoxBody<Bytes, Infallible>> {
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32600, "message": format!(
            "Invalid Request: a message is at most {MAX_MESSAGE} bytes"
        )},
    });
    let mut response = Response::new(Full::new(Bytes::from(error.to_string())).boxed());
    *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// The listening socket that is our stdin.
fn listener() -> anyhow::Result<Listener> {
    let fd: OwnedFd = std::io::stdin().as_fd().try_clone_to_owned()?;
    let family = getsockname::<SockaddrStorage>(std::os::fd::AsRawFd::as_raw_fd(&fd))
        .map_err(|e| anyhow::anyhow!("stdin is no listening socket: {e}"))?
        .family();
    Ok(match family {
        Some(AddressFamily::Inet | AddressFamily::Inet6) => {
            let std = std::net::TcpListener::from(fd);
            std.set_nonblocking(true)?;
            Listener::Tcp(tokio::net::TcpListener::from_std(std)?)
        }
        Some(AddressFamily::Unix) => {
            let std = std::os::unix::net::UnixListener::from(fd);
            std.set_nonblocking(true)?;
            Listener::Unix(tokio::net::UnixListener::from_std(std)?)
        }
        other => anyhow::bail!("stdin is a socket of family {other:?}, not TCP or Unix"),
    })
}

impl Listener {
    /// The next connection and the peer it counts against. A TCP stream has Nagle off: a
    /// response goes out as more than one small write, and the last would otherwise wait for
    /// the client's delayed ACK (about 40 ms a call for a plain HTTP client).
    async fn accept(&self) -> std::io::Result<(Conn, Peer)> {
        match self {
            Listener::Tcp(l) => {
                let (stream, addr) = l.accept().await?;
                stream.set_nodelay(true)?;
                Ok((Conn::Tcp(stream), Peer::of_ip(addr.ip())))
            }
            Listener::Unix(l) => {
                let (stream, _) = l.accept().await?;
                let uid = stream.peer_cred()?.uid();
                Ok((Conn::Unix(stream), Peer::Uid(uid)))
            }
        }
    }
}

/// How long a connection has to send a request bearing the listener's token; one that has not
/// by then is closed. An MCP client sends its first request as soon as it connects.
pub const PROOF_DEADLINE: Duration = Duration::from_secs(10);
/// The most connections one peer may hold that have not yet shown the token.
pub const UNPROVEN_PER_PEER: usize = 32;
/// The most connections all peers together may hold that have not yet shown the token.
pub const UNPROVEN_TOTAL: usize = 256;
/// How long the accept loop pauses when the process is out of descriptors (after closing the
/// oldest unproven connection, if there is one), so that it does not spin.
const OUT_OF_FDS_PAUSE: Duration = Duration::from_millis(50);

/// Whom a connection counts against: an IPv4 address, an IPv6 /64 (what one host is commonly
/// given), or, on a Unix listener, the peer's uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Peer {
    Ip(IpAddr),
    Uid(u32),
}

impl Peer {
    fn of_ip(ip: IpAddr) -> Peer {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Peer::Ip(IpAddr::V6(Ipv6Addr::from(prefix)))
            }
            v4 => Peer::Ip(v4),
        }
    }
}

/// The connections that have not yet shown the token, oldest first. A new one is always let in:
/// to stay within [`UNPROVEN_PER_PEER`] and [`UNPROVEN_TOTAL`] the oldest unproven connection
/// of the same peer (else of anyone) is closed instead. So a stranger's flood costs at most the
/// caps' descriptors and does not keep out the token's holder, whose connection shows the token
/// at once (one faster than that first request could displace it: docs/gaps.md).
#[derive(Default)]
struct Unproven {
    next_id: u64,
    waiting: VecDeque<Waiting>,
}

struct Waiting {
    id: u64,
    peer: Peer,
    ticket: Arc<Ticket>,
}

/// What a connection's task and its request handler share.
#[derive(Default)]
struct Ticket {
    /// Told when the connection is closed to make room.
    evict: Notify,
    /// Set once a request bore the token.
    proven: AtomicBool,
}

impl Unproven {
    /// Lets a connection from `peer` in, closing an older one if a cap is reached; its id and
    /// ticket.
    fn admit(&mut self, peer: Peer) -> (u64, Arc<Ticket>) {
        let of_peer = self.waiting.iter().filter(|w| w.peer == peer).count();
        if of_peer >= UNPROVEN_PER_PEER {
            let oldest = self.waiting.iter().position(|w| w.peer == peer);
            self.evict_at(oldest);
        } else if self.waiting.len() >= UNPROVEN_TOTAL {
            self.evict_at(Some(0));
        }
        let (id, ticket) = (self.next_id, Arc::<Ticket>::default());
        self.next_id += 1;
        self.waiting.push_back(Waiting {
            id,
            peer,
            ticket: ticket.clone(),
        });
        (id, ticket)
    }

    /// Connection `id` showed the token (or ended): it no longer counts, and is never evicted.
    fn forget(&mut self, id: u64) {
        self.waiting.retain(|w| w.id != id);
    }

    /// Closes the oldest unproven connection; whether there was one.
    fn evict_oldest(&mut self) -> bool {
        self.evict_at((!self.waiting.is_empty()).then_some(0))
    }

    fn evict_at(&mut self, at: Option<usize>) -> bool {
        let Some(w) = at.and_then(|i| self.waiting.remove(i)) else {
            return false;
        };
        // A permit is stored if the connection's task is not waiting yet.
        w.ticket.evict.notify_one();
        true
    }
}

/// Whether an accept error means this process is out of descriptors (or kernel memory), which
/// closing connections relieves.
fn out_of_fds(e: &std::io::Error) -> bool {
    e.raw_os_error().map(Errno::from_raw).is_some_and(|n| {
        matches!(
            n,
            Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM
        )
    })
}

/// Serves until the process is ended. No accept error ends it: a connection that fails is that
/// connection's end, and running out of descriptors closes the oldest unproven connection.
pub async fn serve(namespace: crate::Namespace, remote_hosts: &[String]) -> anyhow::Result<()> {
    let listener = listener()?;
    match warren_daemon::raise_fd_limit() {
        Ok(limit) => tracing::debug!("descriptors: up to {limit}"),
        Err(e) => tracing::warn!("cannot raise the descriptor limit: {e}"),
    }
    // Minted here, inside the namespace, and said once on stderr (the operator's terminal):
    // it never crosses an argv or an environment.
    let token = mint_token()?;
    eprintln!("warren-mcp-server: bearer token for this listener: {token}");
    let token: Arc<[u8]> = token.into_bytes().into();
    let service = StreamableHttpService::new(
        move || Ok(namespace.for_session()),
        Arc::new(LocalSessionManager::default()),
        config(remote_hosts),
    );
    let unproven: Arc<Mutex<Unproven>> = Arc::default();
    loop {
        let (io, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if out_of_fds(&e) => {
                let evicted = lock(&unproven).evict_oldest();
                tracing::warn!(
                    "accept: {e} (closed the oldest connection without the token: {evicted})"
                );
                tokio::time::sleep(OUT_OF_FDS_PAUSE).await;
                continue;
            }
            Err(e) => {
                tracing::debug!("accept: {e}");
                continue;
            }
        };
        let (id, ticket) = lock(&unproven).admit(peer);
        let (token, service, unproven) = (token.clone(), service.clone(), unproven.clone());
        tokio::spawn(async move {
            let (proof, shown) = (unproven.clone(), ticket.clone());
            let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (token, service) = (token.clone(), service.clone());
                let (proof, shown) = (proof.clone(), shown.clone());
                async move {
                    if !authorized(&request, &token) {
                        return Ok::<_, Infallible>(unauthorized());
                    }
                    if !shown.proven.swap(true, Ordering::AcqRel) {
                        lock(&proof).forget(id);
                    }
                    if declared_length(&request).is_some_and(|n| n > MAX_MESSAGE as u64) {
                        return Ok(too_large());
                    }
                    // A body that grows past the limit without saying so in advance ends
                    // there: rmcp gets an error instead of the rest.
                    let request =
                        request.map(|body| http_body_util::Limited::new(body, MAX_MESSAGE));
                    Ok(service.handle(request).await)
                }
            });
            let builder = hyper::server::conn::http1::Builder::new();
            let served = match io {
                Conn::Tcp(s) => {
                    let conn = builder
                        .serve_connection(TokioIo::new(s), handler)
                        .with_upgrades();
                    until_proven(conn, &ticket).await
                }
                Conn::Unix(s) => {
                    let conn = builder
                        .serve_connection(TokioIo::new(s), handler)
                        .with_upgrades();
                    until_proven(conn, &ticket).await
                }
            };
            lock(&unproven).forget(id);
            match served {
                Some(Err(e)) => tracing::debug!("http connection: {e}"),
                Some(Ok(())) => {}
                None => tracing::debug!("closed a connection that did not show the token"),
            }
        });
    }
}

/// Serves `conn` to its end, unless it is evicted or has not shown the token by
/// [`PROOF_DEADLINE`] (then `None`: dropping it closes the connection).
async fn until_proven<F: std::future::Future>(conn: F, ticket: &Ticket) -> Option<F::Output> {
    tokio::pin!(conn);
    tokio::select! {
        served = &mut conn => return Some(served),
        () = ticket.evict.notified() => return None,
        () = tokio::time::sleep(PROOF_DEADLINE) => {}
    }
    if !ticket.proven.load(Ordering::Acquire) {
        return None;
    }
    Some(conn.await)
}

fn lock(unproven: &Mutex<Unproven>) -> std::sync::MutexGuard<'_, Unproven> {
    unproven.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins_are_allowed_with_any_port() {
        let config = config(&[]);
        assert!(
            config
                .allowed_origins
                .contains(&"http://127.0.0.1:*".to_string())
        );
        assert!(
            config
                .allowed_origins
                .contains(&"http://[::1]:*".to_string())
        );
        assert!(config.allowed_hosts.contains(&"localhost".to_string()));
    }

    #[tokio::test]
    async fn an_accepted_tcp_stream_has_nagle_off_and_counts_against_its_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = Listener::Tcp(listener);
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let (conn, peer) = listener.accept().await.unwrap();
        let Conn::Tcp(stream) = conn else {
            panic!("a TCP listener gave a Unix stream")
        };
        assert!(stream.nodelay().unwrap(), "TCP_NODELAY is not set");
        assert_eq!(peer, Peer::Ip("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_a_mapped_ipv4_one_its_address() {
        let a = Peer::of_ip("2001:db8:1:2:aaaa::1".parse().unwrap());
        let b = Peer::of_ip("2001:db8:1:2:bbbb::9".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, Peer::of_ip("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(
            Peer::of_ip("::ffff:10.0.0.1".parse().unwrap()),
            Peer::Ip("10.0.0.1".parse().unwrap())
        );
    }

    fn evicted(ticket: &Ticket) -> bool {
        let notified = ticket.evict.notified();
        tokio::pin!(notified);
        notified.enable()
    }

    #[test]
    fn a_peer_over_its_cap_loses_its_own_oldest_unproven_connection() {
        let mut unproven = Unproven::default();
        let (stranger, other) = (Peer::Uid(65534), Peer::Uid(1000));
        let (_, others) = unproven.admit(other);
        let tickets: Vec<_> = (0..UNPROVEN_PER_PEER)
            .map(|_| unproven.admit(stranger).1)
            .collect();
        assert!(tickets.iter().all(|t| !evicted(t)));
        unproven.admit(stranger);
        assert!(evicted(&tickets[0]), "the peer's oldest is closed");
        assert!(tickets[1..].iter().all(|t| !evicted(t)));
        assert!(!evicted(&others), "another peer's connection stays");
        assert_eq!(unproven.waiting.len(), UNPROVEN_PER_PEER + 1);
    }

    #[test]
    fn past_the_total_cap_the_oldest_unproven_connection_is_closed_and_a_proven_one_never() {
        let mut unproven = Unproven::default();
        let (proven_id, proven) = unproven.admit(Peer::Uid(0));
        unproven.forget(proven_id);
        let mut tickets = Vec::new();
        for i in 0..UNPROVEN_TOTAL {
            tickets.push(unproven.admit(Peer::Uid(i as u32 + 1)).1);
        }
        unproven.admit(Peer::Uid(u32::MAX));
        assert!(evicted(&tickets[0]));
        assert!(tickets[1..].iter().all(|t| !evicted(t)));
        assert_eq!(unproven.waiting.len(), UNPROVEN_TOTAL);
        while unproven.evict_oldest() {}
        assert!(!evicted(&proven));
        // (`evicted` takes the permit: the first's was taken above.)
        assert!(tickets[1..].iter().all(|t| evicted(t)));
    }
}
