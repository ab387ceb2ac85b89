//! The daemon as a real process, driven by curl and by raw SOCKS5/HTTP clients, against a test
//! server on 127.0.0.1. `api.test` is allowed with a pin to 127.0.0.1 (a loopback address is
//! only ever reached when a pattern names it); `rebind.test` is allowed without a pin, and
//! resolves to 127.0.0.1 too.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use serde_json::Value;

fn proxy_for(server: &HttpServer) -> Proxy {
    let port = server.port();
    Proxy::start(&[
        format!("api.test:{port}=127.0.0.1"),
        format!("rebind.test:{port}"),
    ])
}

fn api_url(server: &HttpServer, path: &str) -> String {
    format!("http://api.test:{}{path}", server.port())
}

#[test]
fn a_listed_host_is_reached_through_connect_plain_http_and_socks5h() {
    let server = HttpServer::start();
    let proxy = proxy_for(&server);
    let http = format!("http://{}", proxy.addr);
    let socks = format!("socks5h://{}", proxy.addr);
    let url = api_url(&server, "/hello");
    for args in [
        vec!["--proxy", &http, &url],
        vec!["--proxytunnel", "--proxy", &http, &url],
        vec!["--proxy", &socks, &url],
    ] {
        let out = curl(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), HELLO, "{args:?}");
    }
    let records = proxy.records(3);
    let protocols: Vec<&str> = records
        .iter()
        .map(|r| r["protocol"].as_str().unwrap())
        .collect();
    let mut sorted = protocols.clone();
    sorted.sort();
    assert_eq!(sorted, ["http", "http-connect", "socks5"]);
    for r in &records {
        assert_eq!(r["outcome"], "closed", "{r}");
        assert_eq!(r["host"], "api.test");
        assert_eq!(r["port"], server.port());
        assert_eq!(r["session"], "test-session");
        assert_eq!(r["address"], format!("127.0.0.1:{}", server.port()));
        assert_eq!(r["reason"], Value::Null);
    }
}

/// The record's byte counts are what the destination read and wrote, each way, for a bulk
/// upload and download in one connection.
#[test]
fn the_record_counts_the_bytes_the_server_received_and_sent() {
    let server = HttpServer::start();
    let proxy = proxy_for(&server);
    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("upload");
    std::fs::write(&upload, vec![7u8; 300_001]).unwrap();
    let data = format!("@{}", upload.display());
    let http = format!("http://{}", proxy.addr);
    let socks = format!("socks5h://{}", proxy.addr);
    let up = api_url(&server, "/echo-length");
    let down = api_url(&server, "/bytes/1048577");
    let runs: [Vec<&str>; 4] = [
        vec![
            "--proxytunnel",
            "--proxy",
            &http,
            "--data-binary",
            &data,
            &up,
        ],
        vec!["--proxy", &http, "--data-binary", &data, &up],
        vec!["--proxy", &socks, &down],
        vec!["--proxy", &http, &down],
    ];
    for args in &runs {
        let out = curl(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        if args.contains(&up.as_str()) {
            assert_eq!(stdout(&out), "300001\n");
        } else {
            assert_eq!(out.stdout.len(), 1_048_577);
        }
    }
    let records = proxy.records(runs.len());
    let mut counted: Vec<Exchange> = records
        .iter()
        .map(|r| Exchange {
            received: r["bytes_client_to_server"].as_u64().unwrap(),
            sent: r["bytes_server_to_client"].as_u64().unwrap(),
        })
        .collect();
    let mut seen = server.wait_exchanges(runs.len());
    counted.sort();
    seen.sort();
    assert_eq!(counted, seen);
    assert!(
        seen.iter()
            .all(|x| x.received > 300_000 || x.sent > 1_048_577)
    );
}

#[test]
fn an_unlisted_host_is_refused_with_403_and_socks_code_2() {
    let server = HttpServer::start();
    let proxy = proxy_for(&server);
    let http = format!("http://{}", proxy.addr);
    let socks = format!("socks5h://{}", proxy.addr);
    let url = format!("http://other.test:{}/hello", server.port());

    let plain = curl(&["--proxy", &http, "-w", "%{http_code}", &url]);
    assert_eq!(
        stdout(&plain),
        format!(
            "other.test:{} is not on this session's list\n403",
            server.port()
        )
    );
    let tunnel = curl(&["--proxytunnel", "--proxy", &http, &url]);
    assert!(!tunnel.status.success());
    assert!(stderr(&tunnel).contains("403"), "{}", stderr(&tunnel));
    let socks_out = curl(&["--proxy", &socks, &url]);
    assert!(!socks_out.status.success());
    assert_eq!(
        socks5_request(proxy.addr, 1, &socks_domain("other.test"), server.port()),
        2
    );
    // A listed name on a port the pattern does not name is not listed either.
    assert_eq!(
        socks5_request(proxy.addr, 1, &socks_domain("api.test"), 443),
        2
    );

    let records = proxy.records(5);
    for r in &records {
        assert_eq!(r["outcome"], "refused", "{r}");
        assert_eq!(r["address"], Value::Null);
        assert_eq!(r["bytes_client_to_server"], 0);
    }
    assert!(server.exchanges().is_empty(), "the server was reached");
}

/// `rebind.test` is on the list but resolves to a loopback address its pattern does not name:
/// refused, and nothing is connected.
#[test]
fn a_listed_name_resolving_to_loopback_is_refused_unless_pinned() {
    let server = HttpServer::start();
    let proxy = proxy_for(&server);
    let http = format!("http://{}", proxy.addr);
    let socks = format!("socks5h://{}", proxy.addr);
    let url = format!("http://rebind.test:{}/hello", server.port());
    let plain = curl(&["--proxy", &http, "-w", "%{http_code}", &url]);
    let body = stdout(&plain);
    assert!(body.ends_with("403"), "{body}");
    assert!(
        body.starts_with("rebind.test resolved to 127.0.0.1, a loopback address"),
        "{body}"
    );
    assert!(!curl(&["--proxy", &socks, &url]).status.success());
    assert_eq!(
        socks5_request(proxy.addr, 1, &socks_domain("rebind.test"), server.port()),
        2
    );
    let records = proxy.records(3);
    assert!(records.iter().all(|r| r["outcome"] == "refused"));
    assert!(server.exchanges().is_empty(), "the server was reached");
}

#[test]
fn a_raw_ip_is_refused_unless_a_pattern_names_it() {
    let server = HttpServer::start();
    let proxy = proxy_for(&server);
    let http = format!("http://{}", proxy.addr);
    let url = format!("http://127.0.0.1:{}/hello", server.port());
    let plain = curl(&["--proxy", &http, "-w", "%{http_code}", &url]);
    assert!(stdout(&plain).ends_with("403"), "{}", stdout(&plain));
    let ipv4 = [1, 127, 0, 0, 1];
    assert_eq!(socks5_request(proxy.addr, 1, &ipv4, server.port()), 2);
    let mut ipv6 = vec![4];
    ipv6.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    assert_eq!(socks5_request(proxy.addr, 1, &ipv6, server.port()), 2);
    // The IPv4-mapped spelling of the same address is the same address.
    let mut mapped = vec![4];
    mapped.extend_from_slice(
        &"::ffff:127.0.0.1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    assert_eq!(socks5_request(proxy.addr, 1, &mapped, server.port()), 2);
    assert!(server.exchanges().is_empty(), "the server was reached");
    drop(proxy);

    // Named literally, the same address is reached.
    let named = Proxy::start(&[format!("127.0.0.1:{}", server.port())]);
    let http = format!("http://{}", named.addr);
    let out = curl(&["--proxytunnel", "--proxy", &http, &url]);
    assert_eq!(stdout(&out), HELLO, "{}", stderr(&out));
    assert_eq!(socks5_request(named.addr, 1, &mapped, server.port()), 0);
}

#[test]
fn socks5_udp_associate_and_bind_are_refused_with_command_not_supported() {
    let server = HttpServer::start();
    let proxy = proxy_for(&server);
    let api = socks_domain("api.test");
    assert_eq!(socks5_request(proxy.addr, 3, &[1, 0, 0, 0, 0], 0), 7);
    assert_eq!(socks5_request(proxy.addr, 2, &api, server.port()), 7);
    // CONNECT to the same destination succeeds.
    assert_eq!(socks5_request(proxy.addr, 1, &api, server.port()), 0);
    let records = proxy.records(3);
    let reasons: Vec<&str> = records
        .iter()
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"SOCKS5 UDP ASSOCIATE is not supported (CONNECT only)"));
    assert!(reasons.contains(&"SOCKS5 BIND is not supported (CONNECT only)"));
}

#[test]
fn a_client_sending_garbage_gets_an_error_and_others_are_still_served() {
    let server = HttpServer::start();
    let mut proxy = proxy_for(&server);
    // One client holds a connection open and silent meanwhile.
    let silent = TcpStream::connect(proxy.addr).unwrap();

    let answer = |bytes: &[u8]| -> Vec<u8> {
        let mut s = TcpStream::connect(proxy.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    };
    let tls_hello = answer(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n");
    assert!(
        tls_hello.starts_with(b"HTTP/1.1 400 Bad Request\r\n"),
        "{tls_hello:?}"
    );
    let origin_form = answer(b"GET /hello HTTP/1.1\r\nHost: api.test\r\n\r\n");
    assert!(origin_form.starts_with(b"HTTP/1.1 400 "));
    assert!(String::from_utf8_lossy(&origin_form).contains("not an absolute http:// URL"));
    let no_port = answer(b"CONNECT api.test HTTP/1.1\r\n\r\n");
    assert!(no_port.starts_with(b"HTTP/1.1 400 "));
    let huge = answer(&[b'A'; 20_000]);
    assert!(
        huge.starts_with(b"HTTP/1.1 4"),
        "{:?}",
        &huge[..huge.len().min(40)]
    );
    // SOCKS5 with no method the proxy takes: 0xff, then closed.
    assert_eq!(answer(&[5, 1, 2]), [5, 0xff]);
    // A SOCKS5 request with a bad address type.
    let bad_atyp = answer(&[5, 1, 0, 5, 1, 0, 9]);
    assert_eq!(&bad_atyp[..2], [5, 0]);
    assert_eq!(bad_atyp.get(3), Some(&8), "address type not supported");
    // An unknown SOCKS5 command.
    let bad_cmd = answer(&[5, 1, 0, 5, 9, 0, 1, 127, 0, 0, 1, 0, 80]);
    assert_eq!(bad_cmd.get(3), Some(&7), "command not supported");

    assert!(proxy.is_running());
    let http = format!("http://{}", proxy.addr);
    let out = curl(&["--proxy", &http, &api_url(&server, "/hello")]);
    assert_eq!(stdout(&out), HELLO, "{}", stderr(&out));
    drop(silent);
    let records = proxy.records(9);
    let bad = records
        .iter()
        .filter(|r| r["outcome"] == "bad_request")
        .count();
    assert!(bad >= 7, "{records:?}");
}

/// A Unix socket listener serves the same protocols (the shape nsd will hand the proxy).
#[test]
fn a_unix_socket_listener_serves_http_and_socks5() {
    use std::os::unix::net::UnixStream;
    let server = HttpServer::start();
    let port = server.port();
    let proxy = Proxy::start_with(&[format!("api.test:{port}=127.0.0.1")], |dir| {
        vec![
            "--listen".into(),
            format!("unix:{}", dir.join("proxy.sock").display()),
        ]
    });
    let sock = proxy.records.with_file_name("proxy.sock");
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(format!("GET http://api.test:{port}/hello HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with(HELLO),
        "{out}"
    );

    // The tunnel (and so its record) ends when both sides have closed.
    drop(s);
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).unwrap();
    let mut req = vec![5, 3, 0];
    req.extend_from_slice(&socks_domain("api.test"));
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[1], 7, "UDP ASSOCIATE over the Unix socket");
    assert_eq!(proxy.records(2).len(), 2);
}

/// A listed destination with nothing listening: 502 with the reason, SOCKS `0x05`.
#[test]
fn a_destination_refusing_the_connection_gets_502_and_socks_code_5() {
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let proxy = Proxy::start(&[format!("api.test:{closed_port}=127.0.0.1")]);
    let http = format!("http://{}", proxy.addr);
    let url = format!("http://api.test:{closed_port}/hello");
    let out = curl(&["--proxy", &http, "-w", "%{http_code}", &url]);
    let body = stdout(&out);
    assert!(
        body.starts_with(&format!("connecting to 127.0.0.1:{closed_port}: "))
            && body.ends_with("502"),
        "{body}"
    );
    assert_eq!(
        socks5_request(proxy.addr, 1, &socks_domain("api.test"), closed_port),
        5
    );
    for r in proxy.records(2) {
        assert_eq!(r["outcome"], "connection_refused", "{r}");
    }
}
