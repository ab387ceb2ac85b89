//! A TLS server for `api.test` with a test CA made by rcgen: `openssl s_server` serving a file.
//! netproxy's HTTPS test and warren's network-grant tests.

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

/// Writes `ca.pem` into `dir` and starts a TLS server for `api.test` at `accept` (`IP:PORT`)
/// serving `dir/www` (its file `hello` is [`BODY`]). Started from a thread in another network
/// namespace, the server is that namespace's.
pub fn tls_server(dir: &std::path::Path, accept: &str) -> TlsServer {
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
