//! HTTPS end to end through the proxy: a test CA made by rcgen, a certificate for `api.test`
//! signed by it, `openssl s_server` serving a file with it on 127.0.0.1, and curl checking the
//! certificate against the CA through a CONNECT tunnel and through SOCKS5. The proxy never sees
//! inside the TLS; the client's certificate check is of the name it asked for.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::{Proxy, curl, stderr, stdout};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

const BODY: &str = "hello over tls\n";

struct TlsServer {
    child: Child,
    port: u16,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `ca.pem` into `dir` and starts a TLS server for `api.test` serving `dir/www`.
fn tls_server(dir: &std::path::Path) -> TlsServer {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "warren netproxy test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["api.test".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("leaf.key"), leaf_key.serialize_pem()).unwrap();
    let www = dir.join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("hello"), BODY).unwrap();
    let mut child = Command::new("openssl")
        .args(["s_server", "-accept", "127.0.0.1:0", "-WWW", "-cert"])
        .arg(dir.join("leaf.pem"))
        .arg("-key")
        .arg(dir.join("leaf.key"))
        .current_dir(&www)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl runs");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let port = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "openssl s_server ended"
        );
        if let Some(addr) = line.trim().strip_prefix("ACCEPT ") {
            break addr.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    // s_server logs each connection on stdout: keep reading it so it never blocks.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    TlsServer { child, port }
}

#[test]
fn https_through_connect_and_socks5h_checks_the_servers_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let server = tls_server(dir.path());
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
