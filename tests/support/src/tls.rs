//! A test CA made by rcgen, and a TLS server for `api.test` with it: `openssl s_server` serving a
//! file. netproxy's HTTPS test, warren's network-grant tests and its coding-agent tests (their
//! scripted model API's certificate).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub const BODY: &str = "hello over tls\n";

pub struct TlsServer {
    child: Child,
    pub port: u16,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a test CA (`ca.pem`) and a certificate it signed for `names` (`leaf.pem`, its key
/// `leaf.key`) into `dir`. A client trusting `ca.pem` accepts a server holding the leaf.
pub fn test_ca(dir: &std::path::Path, names: &[&str]) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "warren netproxy test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("leaf.key"), leaf_key.serialize_pem()).unwrap();
}

/// Writes `ca.pem` into `dir` and starts a TLS server for `api.test` at `accept` (`IP:PORT`)
/// serving `dir/www` (its file `hello` is [`BODY`]). Started from a thread in another network
/// namespace, the server is that namespace's.
pub fn tls_server(dir: &std::path::Path, accept: &str) -> TlsServer {
    test_ca(dir, &["api.test"]);
    let www = dir.join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("hello"), BODY).unwrap();
    let mut child = Command::new("openssl")
        .args(["s_server", "-accept", accept, "-WWW", "-cert"])
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
        // `ACCEPT host:port` for port 0 (the port chosen); a bare `ACCEPT` for a given one.
        if let Some(addr) = line.trim().strip_prefix("ACCEPT") {
            let addr = Some(addr.trim())
                .filter(|a| !a.is_empty())
                .unwrap_or(accept);
            break addr.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    // s_server logs each connection on stdout: keep reading it so it never blocks.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    TlsServer { child, port }
}
