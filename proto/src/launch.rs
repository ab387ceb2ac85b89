//! nsd's run socket protocol: how a launcher (`warren run`, `warren attach`) asks nsd to build a
//! namespace and run a command in it, and how mcpfs asks nsd to start an operator-defined MCP
//! server (the same exchange, opened by a [`StartServer`] on nsd's MCP socket).
//!
//! One connection per namespace. Frames are `warren_daemon::handoff` records (4-byte length,
//! JSON) with fds as SCM_RIGHTS:
//!
//! 1. launcher → nsd: [`Request`], with fds: the payload's stdin, stdout, stderr (only when no
//!    pty is asked for), then one connected socket per name in `connections`, in order. (Or an
//!    [`AttachRequest`]; or, on the MCP socket, a [`StartServer`] with the server's stdio.)
//! 2. nsd → launcher: [`Reply::Started`] (with the pty master when a pty was asked for) once
//!    the command has exec'd, or [`Reply::Failed`] (nothing runs).
//! 3. launcher → nsd: any number of [`Control`] messages (forwarded signals).
//! 4. nsd → launcher: [`Reply::Exited`] when the command has ended; then nsd closes.
//!
//! If the launcher's connection closes before the end, nsd kills the namespace (like ssh).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The protocol version a [`Request`] carries.
pub const VERSION: u32 = 1;

/// The run socket's file name in the runtime dir. Not `*.sock`: it speaks this protocol, not 9P.
pub const SOCKET_NAME: &str = "ns.run";

/// Where the payload of a namespace launched with [`Request::client_asks`] finds its own asks:
/// beneath `/dev`, which the confinement builds itself and no spec line may bind or mount into,
/// so no spec can place anything there or see this mount in its own paths.
pub const CLIENT_ASKS_PATH: &str = "/dev/warren-asks";

/// What the launcher asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub version: u32,
    /// The namespace spec, as text (specs/namespace.md); nsd parses it.
    pub spec: String,
    pub argv: Vec<String>,
    /// Values for TERM, LANG and the spec's `env` names (others are ignored).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A pty of the namespace's own devpts with this window size (rows, cols, xpixel, ypixel).
    #[serde(default)]
    pub pty: Option<[u16; 4]>,
    /// Accept a Landlock ruleset that is not fully enforced (loudly named on purpose).
    #[serde(default)]
    pub weaker_landlock: bool,
    /// The payload's uid (root operators only; a non-root operator's is always their own).
    #[serde(default)]
    pub uid: Option<u32>,
    /// Root operators only, without `uid`: the payload runs as the owner of the source of the
    /// bind whose target is this path, taken with fstat on the handle nsd opened for that bind
    /// (the same open file it binds), never from a name looked up again. Refused if that owner
    /// is root or one of warren's daemon uids.
    #[serde(default)]
    pub uid_from_bind: Option<String>,
    /// No host /etc files.
    #[serde(default)]
    pub bare: bool,
    /// The payload's working directory inside the namespace (absolute); `None`: its HOME. A
    /// directory that is not there fails the run before the command starts.
    #[serde(default)]
    pub cwd: Option<String>,
    /// An operator namespace: `mount gate|receipts|ns` take the launcher's own connections to
    /// the daemons' operator sockets (the operator's authority) — see `ServedMounts::operator`.
    #[serde(default)]
    pub operator: bool,
    /// The mount targets whose connections the launcher made, in fd order after stdio.
    #[serde(default)]
    pub connections: Vec<String>,
    /// `warren mcp serve --elicit`: nsd mounts at [`CLIENT_ASKS_PATH`] a gate tree of a capped
    /// channel named `mcp-client:<namespace id>` that sees the namespace's own session's asks
    /// only and may answer `allow once` up to the `write` tier, or `deny` (docs/mcp.md). The
    /// mount is in no spec: a clone's spec cannot name it.
    #[serde(default)]
    pub client_asks: bool,
}

/// What an attaching launcher asks for: `argv` inside the live namespace `/ns/<attach>`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub version: u32,
    /// The namespace's id.
    pub attach: u64,
    pub argv: Vec<String>,
    /// Values for TERM, LANG and the namespace's `env` names (others are ignored).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A pty of the namespace's own devpts with this window size; else stdio fds come along.
    #[serde(default)]
    pub pty: Option<[u16; 4]>,
}

/// The first message on a connection: a namespace to build, or one to attach to (a record
/// with an `attach` field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opening {
    Run(Request),
    Attach(AttachRequest),
}

impl<'de> Deserialize<'de> for Opening {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        let attach = value.get("attach").is_some();
        let opening = if attach {
            AttachRequest::deserialize(value).map(Opening::Attach)
        } else {
            Request::deserialize(value).map(Opening::Run)
        };
        opening.map_err(serde::de::Error::custom)
    }
}

/// `Dirs::control(MCP_CONTROL)` is nsd's MCP server socket.
pub const MCP_CONTROL: &str = "nsd-mcp";

/// mcpfs → nsd, on the MCP server socket: start the operator's server `server` (nsd reads its
/// definition itself). Followed by three fds: the server's stdin, stdout and stderr.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartServer {
    pub version: u32,
    pub server: String,
}

/// What nsd answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// The command has exec'd; the namespace is `/ns/<id>`.
    Started { id: u64, session: String },
    /// Nothing runs: why.
    Failed { message: String },
    /// The command ended: its status (128+N for signal N).
    Exited { code: i32 },
}

/// What the launcher may say while the command runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    /// Forward this signal (SIGINT, SIGTERM, SIGHUP or SIGQUIT) to the command.
    Signal { number: i32 },
}

/// The signals a launcher may forward.
pub const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

pub fn send<T: Serialize>(
    sock: &UnixStream,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let bytes = serde_json::to_vec(message).map_err(io::Error::other)?;
    warren_daemon::handoff::send(sock, &bytes, fds)
}

pub fn recv<T: for<'de> Deserialize<'de>>(sock: &UnixStream) -> io::Result<(T, Vec<OwnedFd>)> {
    let (bytes, fds) = warren_daemon::handoff::recv(sock)?;
    let message = serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("run socket: bad message: {e}"),
        )
    })?;
    Ok((message, fds))
}

/// A command nsd has started for us.
pub struct Launched {
    sock: UnixStream,
    /// The namespace's id in nsd's `/ns` tree.
    pub id: u64,
    /// The namespace's session id.
    pub session: String,
    /// The pty's master (with `LaunchOptions::pty`), for the launcher to relay.
    pub pty_master: Option<OwnedFd>,
}

impl Launched {
    /// Forwards `signal` (SIGINT, SIGTERM, SIGHUP or SIGQUIT) to the command.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        send(&self.sock, &Control::Signal { number: signal }, &[])
    }

    /// Waits for the command's exit status (128+N for signal N). Call once.
    pub fn wait(&self) -> io::Result<i32> {
        let reply = recv::<Reply>(&self.sock).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => io::Error::new(
                e.kind(),
                "nsd ended (see `warren status`); the namespace ended with it",
            ),
            _ => e,
        })?;
        match reply {
            (Reply::Exited { code }, _) => Ok(code),
            (Reply::Failed { message }, _) => Err(io::Error::other(message)),
            (other, _) => Err(io::Error::other(format!("nsd said {other:?}"))),
        }
    }
}

/// Connects to nsd's socket at `path`, sends the opening message with `fds`, and reads
/// `started` (waiting at most `patience`: nsd's own setup deadline and a margin).
pub fn open_at<T: Serialize>(
    path: &Path,
    opening: &T,
    fds: &[BorrowedFd<'_>],
    pty: bool,
    patience: std::time::Duration,
) -> io::Result<Launched> {
    let sock = UnixStream::connect(path)
        .map_err(|e| io::Error::new(e.kind(), format!("nsd's socket {}: {e}", path.display())))?;
    // nsd drops a peer that is no operator without a word: a closed or reset connection.
    let refused = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "nsd closed the connection without an answer ({e}): only an operator may use \
                 it (root or the warren group, in nsd's pid namespace)"
            ),
        ),
        _ => e,
    };
    send(&sock, opening, fds).map_err(refused)?;
    // Bounded: nsd gives a namespace's setup SETUP_DEADLINE, then answers either way.
    sock.set_read_timeout(Some(patience))?;
    let (reply, mut got) = recv::<Reply>(&sock).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "nsd did not answer within {} s (see `warren status`)",
                patience.as_secs()
            ),
        ),
        _ => refused(e),
    })?;
    sock.set_read_timeout(None)?;
    match reply {
        Reply::Started { id, session } => {
            let pty_master = match (pty, got.len()) {
                (false, 0) => None,
                (true, 1) => got.pop(),
                _ => return Err(io::Error::other("nsd's reply carried the wrong fds")),
            };
            Ok(Launched {
                sock,
                id,
                session,
                pty_master,
            })
        }
        Reply::Failed { message } => Err(io::Error::other(message)),
        Reply::Exited { code } => Err(io::Error::other(format!(
            "nsd said the command exited ({code}) before it started"
        ))),
    }
}
/// Asks nsd (on `control`) to start server `name` with `stdio` as its stdin, stdout and stderr;
/// returns once it runs. Keep the returned connection: dropping it ends the server's namespace.
pub fn start_server(
    control: &Path,
    name: &str,
    stdio: [BorrowedFd<'_>; 3],
    patience: std::time::Duration,
) -> io::Result<Launched> {
    let request = StartServer {
        version: VERSION,
        server: name.to_string(),
    };
    open_at(control, &request, &stdio, false, patience)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_unknown_fields_are_refused() {
        let r = Reply::Started {
            id: 3,
            session: "ab".into(),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"kind":"started","id":3,"session":"ab"}"#);
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), r);
        let bad = r#"{"version":1,"spec":"","argv":["x"],"privileged":true}"#;
        assert!(serde_json::from_str::<Request>(bad).is_err());
        let a = r#"{"version":1,"attach":4,"argv":["sh"],"pty":null}"#;
        match serde_json::from_str::<Opening>(a).unwrap() {
            Opening::Attach(req) => assert_eq!((req.attach, req.argv), (4, vec!["sh".into()])),
            other => panic!("{other:?}"),
        }
        let run = r#"{"version":1,"spec":"","argv":["x"]}"#;
        assert!(matches!(
            serde_json::from_str(run).unwrap(),
            Opening::Run(_)
        ));
        let bad = r#"{"version":1,"attach":4,"argv":["sh"],"spec":"bind -w / /"}"#;
        assert!(serde_json::from_str::<Opening>(bad).is_err());
        let c: Control = serde_json::from_str(r#"{"kind":"signal","number":2}"#).unwrap();
        assert_eq!(c, Control::Signal { number: 2 });
    }
}
