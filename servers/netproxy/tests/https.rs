//! HTTPS end to end through the proxy: a test CA made by rcgen, a certificate for `api.test`
//! signed by it, `openssl s_server` serving a file with it on 127.0.0.1, and curl checking the
//! certificate against the CA through a CONNECT tunnel and through SOCKS5. The proxy never sees
//! inside the TLS; the client's certificate check is of the name it asked for.

mod common;

use common::{Proxy, curl, stderr, stdout};
use warren_test_support::tls::{BODY, tls_server};

#[test]
fn https_through_connect_and_socks5h_checks_the_servers_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let server = tls_server(dir.path(), "127.0.0.1:0");
    let proxy = Proxy::start(&[format!("api.test:{}=127.0.0.1", server.port)]);
    let ca = dir.path().join("ca.pem");
    let ca = ca.to_str().unwrap();
    let url = format!("https://api.test:{}/hello", server.port);
    let http = format!("http://{}", proxy.addr);
    let socks = format!("socks5h://{}", proxy.addr);
    for p in [&http, &socks] {
        let out = curl(&["--cacert", ca, "--proxy", p, &url]);
        assert!(out.status.success(), "{p}: {}", stderr(&out));
        assert_eq!(stdout(&out), BODY);
    }
    // Without the test CA the same tunnel fails the client's certificate check.
    let out = curl(&["--proxy", &http, &url]);
    assert!(!out.status.success());
    let records = proxy.records(3);
    for r in &records[..2] {
        assert_eq!(r["outcome"], "closed", "{r}");
        assert_eq!(r["host"], "api.test");
        assert!(r["bytes_client_to_server"].as_u64().unwrap() > 0);
        assert!(r["bytes_server_to_client"].as_u64().unwrap() > BODY.len() as u64);
    }
}
