//! Streamable HTTP, served from inside the namespace on a listening socket `warren mcp serve`
//! made outside and handed in as stdin (a TCP socket keeps the network namespace it was made
//! in; the namespace itself may have no network). Every request must carry the listener's
//! bearer token (minted here at start, printed once on stderr); `Host` and `Origin` are checked by `rmcp` against loopback names (plus the
//! operator's remote names); sessions (`Mcp-Session-Id`) are `rmcp`'s.

use std::convert::Infallible;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use nix::sys::socket::{AddressFamily, SockaddrLike, SockaddrStorage, getsockname};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

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

/// Serves until the listener fails.
pub async fn serve(namespace: crate::Namespace, remote_hosts: &[String]) -> anyhow::Result<()> {
    let listener = listener()?;
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
    loop {
        let (io, token, service) = (
            match &listener {
                Listener::Tcp(l) => Conn::Tcp(l.accept().await?.0),
                Listener::Unix(l) => Conn::Unix(l.accept().await?.0),
            },
            token.clone(),
            service.clone(),
        );
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (token, service) = (token.clone(), service.clone());
                async move {
                    if !authorized(&request, &token) {
                        return Ok::<_, Infallible>(unauthorized());
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
                    builder
                        .serve_connection(TokioIo::new(s), handler)
                        .with_upgrades()
                        .await
                }
                Conn::Unix(s) => {
                    builder
                        .serve_connection(TokioIo::new(s), handler)
                        .with_upgrades()
                        .await
                }
            };
            if let Err(e) = served {
                tracing::debug!("http connection: {e}");
            }
        });
    }
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
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
}
