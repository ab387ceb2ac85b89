//! A length-prefixed frame sent by an unprivileged peer (uid and gid 65534, no groups), for the
//! tests that a root-only control socket turns such a peer away.

use std::path::Path;
use std::process::Command;

/// Connects to `socket` as nobody (setpriv + python3), sends `frame` with its 4-byte
/// little-endian length, and says what came back: `answer` (bytes) or `closed`.
pub fn frame_as_nobody(socket: &Path, frame: &str) -> String {
    let socket = socket.to_str().expect("a UTF-8 socket path");
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_UNIX)\ns.connect({socket:?})\nr={frame:?}.encode()\n\
         try:\n  s.sendall(len(r).to_bytes(4,'little')+r)\n  print('answer' if s.recv(100) else 'closed')\n\
         except (BrokenPipeError, ConnectionResetError):\n  print('closed')\n"
    );
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", &script])
        .output()
        .expect("run setpriv");
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        said == "answer" || said == "closed",
        "{said:?}, stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}
